// testutil.c: see testutil.h.
#include "testutil.h"
#include "../nn/kernels.h"

#include <stdarg.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../nn/rng.h"

void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

int test_tmpdir_make(char *dir, size_t size, const char *name) {
    const char *tmp = getenv("TMPDIR");
    const int n = snprintf(dir, size, "%s/%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (n < 0 || (size_t)n >= size) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int test_remove_tree(const char *path) { return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0; }

const char *test_path(const char *dir, const char *name) {
    static char buf[4][PATH_MAX];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

void *test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    const long len = ftell(f);
    assert_true(len >= 0);
    rewind(f);
    char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    b[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return b;
}

void test_find_root(char *root, size_t size, const char *argv0, const char *probe) {
    if (access(probe, R_OK) == 0) return;
    char real[PATH_MAX];
    if (!realpath(argv0, real)) return;
    char *b = NULL;
    for (char *s = strstr(real, "/build/"); s; s = strstr(s + 1, "/build/")) b = s;
    if (!b) return;
    *b = '\0';
    snprintf(root, size, "%s", real);
}

static uint64_t g_rng = 1;

void test_rng_seed(uint64_t seed) { g_rng = seed * 0x9e3779b97f4a7c15ULL + 777; }

uint64_t test_urand64(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng_mix64(g_rng);
}

double test_urand(void) { return (double)(test_urand64() >> 11) * (1.0 / 9007199254740992.0); }

static void write_file(const char *path, const uint8_t *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

void write_squares(const char *dir, const char *name, int count, uint64_t seed, char *images,
                   char *labels) {
    const int n1 = snprintf(images, PATH_MAX, "%s/%s-images", dir, name);
    const int n2 = snprintf(labels, PATH_MAX, "%s/%s-labels", dir, name);
    assert_true(n1 < PATH_MAX && n2 < PATH_MAX);
    uint8_t *im = malloc(16 + (size_t)count * 64), *lb = malloc(8 + (size_t)count);
    assert_true(im && lb);
    put_be32(im, 0x803), put_be32(im + 4, (uint32_t)count), put_be32(im + 8, 8), put_be32(im + 12, 8);
    put_be32(lb, 0x801), put_be32(lb + 4, (uint32_t)count);
    test_rng_seed(seed);
    for (int i = 0; i < count; i++) {
        const int k = (int)(test_urand() * 4);
        uint8_t *px = im + 16 + (size_t)i * 64;
        for (int p = 0; p < 64; p++) px[p] = (uint8_t)(test_urand() * 80);
        const int r0 = (k / 2) * 4 + (int)(test_urand() * 2), c0 = (k % 2) * 4 + (int)(test_urand() * 2);
        for (int r = r0; r < r0 + 3; r++)
            for (int c = c0; c < c0 + 3; c++) px[r * 8 + c] = (uint8_t)(180 + test_urand() * 75);
        lb[8 + i] = (uint8_t)k;
    }
    write_file(images, im, 16 + (size_t)count * 64);
    write_file(labels, lb, 8 + (size_t)count);
    free(im);
    free(lb);
}

int write_squares_cfg(const char *path, const char *dir, int batch, const char *layers) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "[train]\nepochs = 1\nbatch = %d\nseed = 3\nthreads = 1\n"
            "[data]\ntrain = %s/train-images\ntrain_labels = %s/train-labels\n"
            "test = %s/test-images\ntest_labels = %s/test-labels\nmean = 0.25\nstd = 0.35\n%s",
            batch, dir, dir, dir, dir, layers);
    return fclose(f) ? -1 : 0;
}

Loader *open_squares_loader(const char *images, const char *labels, Dataset **ds, int shuffle) {
    Error err = {{0}};
    if (idx_dataset_open(ds, images, labels, &err)) fail_msg("%s", err.msg);
    assert_int_equal((*ds)->classes, 4);
    LoaderConfig lc = {.batch = SQUARES_BATCH, .shuffle = shuffle, .drop_last = 0, .seed = 4,
                       .mean = {0.25f}, .std = {0.35f}};
    Loader *l = NULL;
    if (loader_create(&l, *ds, &lc, &err)) fail_msg("%s", err.msg);
    return l;
}

int test_sh(const char *dir, const char *fmt, ...) {
    char cmd[4 * PATH_MAX], full[5 * PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s > %s/out.txt 2>&1", cmd, dir);
    const int rc = system(full);
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

const char *test_sh_output(const char *dir) {
    static char buf[1 << 16];
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

size_t expect_activation_layout(const Net *net) {
    size_t end_to_end = 0, most_live = 0;
    for (int x = 0; x < net->nbufs; x++) {
        const ActBuffer *a = &net->bufs[x];
        if (!a->bytes) continue;
        end_to_end += a->bytes;
        assert_true(a->nspans > 0);
        assert_true(a->offset + a->bytes <= net->plan.activations);
        assert_int_equal(a->offset % 64, 0);
        for (int y = 0; y < x; y++) {
            const ActBuffer *c = &net->bufs[y];
            if (!c->bytes || a->offset >= c->offset + c->bytes || c->offset >= a->offset + a->bytes)
                continue;
            for (int t = 0; t <= net->nevents; t++)
                if (net_buffer_live(net, x, t) && net_buffer_live(net, y, t) &&
                    !((net_handoff(net, x, y, t) || net_handoff(net, y, x, t)) && a->offset == c->offset))
                    fail_msg("activation buffers %d and %d overlap and are both live at event %d", x, y, t);
        }
    }
    for (int t = 0; t <= net->nevents; t++) {  // a buffer handed over at t counted once
        size_t live = 0;
        for (int x = 0; x < net->nbufs; x++) {
            bool taken = false;
            for (int y = 0; y < net->nbufs && !taken; y++)
                taken = net_handoff(net, y, x, t) && net->bufs[y].offset == net->bufs[x].offset;
            if (net->bufs[x].bytes && net_buffer_live(net, x, t) && !taken) live += net->bufs[x].bytes;
        }
        if (live > most_live) most_live = live;
    }
    assert_true(most_live <= net->plan.activations && net->plan.activations < end_to_end);
    // Each pointer is a buffer's start, and those read after the step are live then.
    const void *after[] = {net->input_bytes ? (const void *)net->input_lut : net->input_buf, net->labels,
                           net->metrics, net_output(net)};
    for (size_t k = 0; k < sizeof after / sizeof after[0]; k++) {
        bool found = false;
        for (int x = 0; x < net->nbufs && !found; x++)
            found = net->bufs[x].bytes && (const char *)net->activations + net->bufs[x].offset == after[k] &&
                    net_buffer_live(net, x, net->nevents);
        assert_true(found);
    }
    return most_live;
}

static size_t winograd_chunk_bytes(int n, int OH, int OW, int C, int OC) {
    const int64_t tiles = (int64_t)n * ((OH + 1) / 2) * ((OW + 1) / 2);
    return (size_t)16 * (winograd_stride(tiles, C) + winograd_stride(tiles, OC)) * sizeof(float);
}

size_t winograd_workspace(int B, int OH, int OW, int C, int OC) {
    const int shards = cpu_kernels()->shard_count(), share = (B + shards - 1) / shards;
    const size_t budget = shards > 1 ? (size_t)1 << 20 : (size_t)2 << 20;  // 2 MB chunk_bytes
    int n = 1;
    while (n < share && winograd_chunk_bytes(n + 1, OH, OW, C, OC) <= budget) n++;
    // U, then each shard's chunk and its dU (and dbias, when there are several shards)
    const size_t parts = (shards > 1 ? ((size_t)16 * OC * C + OC + 15) / 16 * 16 : (size_t)16 * OC * C) * sizeof(float);
    return (size_t)16 * OC * C * sizeof(float) + shards * (winograd_chunk_bytes(n, OH, OW, C, OC) + parts);
}

typedef struct StepHook {
    Net *net;
    const Optimizer *o;
    double lr;
    uint64_t step;
    int updated;
} StepHook;

static int step_hook_ready(void *arg, Layer *m) {
    StepHook *h = arg;
    assert_true(layer_trains(m));
    optim_step_module(h->net, h->o, m, h->lr, h->step);
    h->updated++;
    return 0;
}

int test_train_step(Net *net, const Optimizer *o, int N, double lr, uint64_t seed, uint64_t step) {
    StepHook h = {net, o, lr, step, 0};
    assert_null(net->hook.ready);
    if (net->fused_update) net->hook = (GradHook){.ready = step_hook_ready, .arg = &h};
    else net_zero_grads(net);
    net_forward(net, N, true, seed, step, 0);
    net_loss(net, N, N, true);
    net_backward(net, N, seed, step, 0);
    assert_false(net->hook.failed);
    net->hook = (GradHook){0};
    if (!net->fused_update) optim_step(net, o, NULL, lr, step);
    return h.updated;
}
