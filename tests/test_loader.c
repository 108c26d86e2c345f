// test_loader.c: the loader's worker threads, ring and statistics, bad-sample skipping,
// and augmentation (data/loader.c), on image folders and IDX sets written here.
//
// The central property: the batches (order, contents, labels, skipped counts) are the
// same bytes for any number of workers and any ring size. These tests are also the ones
// to run under -fsanitize=thread (see the lead's notes in data/loader.c).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <stb/stb_image_write.h>

#include "../data/dataset.h"
#include "../nn/rng.h"
#include "testutil.h"

static char g_dir[512];  // the suite's temporary directory

// ---- data written for the tests ----------------------------------------------------------

static void mkdirs_for(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *s = dir + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(dir, 0777);
            *s = '/';
        }
}

static uint8_t pix(int id, int64_t p) {
    if (p == 0) return (uint8_t)(id & 0xff);
    if (p == 1) return (uint8_t)((id >> 8) & 0xff);
    return (uint8_t)((id * 31 + p * 7 + (p * p) % 13) & 0xff);
}

static void put_png(const char *root, const char *rel, int w, int h, int c, int id) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/%s", g_dir, root, rel);
    mkdirs_for(p);
    uint8_t *b = malloc((size_t)w * h * c);
    assert_non_null(b);
    for (int64_t i = 0; i < (int64_t)w * h * c; i++) b[i] = pix(id, i);
    assert_true(stbi_write_png(p, w, h, c, b, w * c));
    free(b);
}

static void put_text(const char *root, const char *rel, const char *text) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/%s", g_dir, root, rel);
    mkdirs_for(p);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

// A folder of n images in 3 classes, with the images listed in bad[] corrupt. Image i
// is class i % 3, file "%03d.png" % i; w x h x c, or with w = 0 of varying sizes and
// channels (so they are resized and converted).
static void make_tree(const char *root, int n, const int *bad, int nbad, int w, int h, int c) {
    for (int i = 0; i < n; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "c%d/%03d.png", i % 3, i);
        int is_bad = 0;
        for (int k = 0; k < nbad; k++) is_bad |= bad[k] == i;
        if (is_bad)
            put_text(root, rel, "corrupt PNG");
        else if (w)
            put_png(root, rel, w, h, c, i);
        else
            put_png(root, rel, 10 + i % 5, 9 + i % 4, i % 4 == 0 ? 1 : 3, i);
    }
}

// torchvision's RandomResizedCrop ranges with area fractions from `smallest` to 1.
static ResizedCrop crop_range(double smallest) {
    return (ResizedCrop){.scale = {smallest, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};
}

static Dataset *open_tree(const char *root, int w, int h, int c) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, root);
    FolderOptions o = {.fit = {.channels = c, .width = w, .height = h}};
    Dataset *ds;
    Error err = {{0}};
    if (folder_dataset_open(&ds, p, &o, &err)) fail_msg("%s", err.msg);
    return ds;
}

// An IDX set of count images rows x cols of pix, labels i % 10.
static Dataset *open_idx(const char *name, uint32_t count, uint32_t rows, uint32_t cols) {
    char ip[PATH_MAX], lp[PATH_MAX];
    snprintf(ip, sizeof ip, "%s/%s-images", g_dir, name);
    snprintf(lp, sizeof lp, "%s/%s-labels", g_dir, name);
    FILE *f = fopen(ip, "wb");
    assert_non_null(f);
    uint8_t h[16];
    put_be32(h, 0x803), put_be32(h + 4, count), put_be32(h + 8, rows), put_be32(h + 12, cols);
    fwrite(h, 1, 16, f);
    for (uint32_t i = 0; i < count; i++)
        for (uint32_t p = 0; p < rows * cols; p++) fputc(pix((int)i, p), f);
    assert_int_equal(fclose(f), 0);
    f = fopen(lp, "wb");
    assert_non_null(f);
    put_be32(h, 0x801), put_be32(h + 4, count);
    fwrite(h, 1, 8, f);
    for (uint32_t i = 0; i < count; i++) fputc((int)(i % 10), f);
    assert_int_equal(fclose(f), 0);
    Dataset *ds;
    Error err = {{0}};
    if (idx_dataset_open(&ds, ip, lp, &err)) fail_msg("%s", err.msg);
    return ds;
}

// ---- running a loader ---------------------------------------------------------------------

// Everything an epoch hands out, concatenated: per batch its index, n, labels and x.
typedef struct Run {
    uint8_t *bytes;
    size_t len, cap;
    int64_t batches, samples, skipped;
} Run;

static void run_put(Run *r, const void *p, size_t n) {
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2;
        r->bytes = realloc(r->bytes, r->cap);
        assert_non_null(r->bytes);
    }
    memcpy(r->bytes + r->len, p, n);
    r->len += n;
}

static Loader *make_loader(Dataset *ds, LoaderConfig cfg) {
    Loader *l;
    Error err = {{0}};
    if (loader_create(&l, ds, &cfg, &err)) fail_msg("%s", err.msg);
    return l;
}

// Runs epochs [e0, e1) of l (from batch `first` in the first), appending to r.
static void run_epochs(Loader *l, const Dataset *ds, int e0, int e1, int64_t first, Run *r) {
    Error err = {{0}};
    for (int e = e0; e < e1; e++) {
        if (loader_start_epoch(l, e, e == e0 ? first : 0, &err)) fail_msg("%s", err.msg);
        const Batch *b;
        for (;;) {
            if (loader_next(l, &b, &err)) fail_msg("%s", err.msg);
            if (!b) break;
            run_put(r, &b->index, sizeof b->index);
            run_put(r, &b->n, sizeof b->n);
            run_put(r, b->y, (size_t)b->n * sizeof *b->y);
            run_put(r, b->px, (size_t)b->n * (size_t)shape_numel(ds->shape));
            r->batches++;
            r->samples += b->n;
        }
        LoaderStats st;
        loader_stats(l, &st);
        assert_true(st.wait_seconds >= 0);
        run_put(r, &st.skipped, sizeof st.skipped);
        r->skipped += st.skipped;
    }
}

static Run run_config(Dataset *ds, LoaderConfig cfg, int epochs) {
    Run r = {0};
    Loader *l = make_loader(ds, cfg);
    run_epochs(l, ds, 0, epochs, 0, &r);
    loader_destroy(l);
    return r;
}

static void assert_runs_equal(const Run *a, const Run *b, const char *what) {
    if (a->len != b->len || memcmp(a->bytes, b->bytes, a->len) != 0)
        fail_msg("%s: the batches differ (%zu vs %zu bytes)", what, a->len, b->len);
}

// ---- worker-count independence ---------------------------------------------------------------

// Workers 0, 1, 2, 3 and 4 with rings of 1 to 8 batches: the same bytes, over three epochs
// of a shuffled, augmented folder with bad files skipped (full batches and short ones).
static void test_workers_identical_folder(void **state) {
    const int bad[] = {4, 5, 17, 40};
    make_tree("wi", 47, bad, 4, 0, 0, 0);
    Dataset *ds = open_tree("wi", 8, 6, 3);
    const LoaderConfig base = {.batch = 7, .shuffle = 1, .seed = 11, .mean = {0.5f, 0.4f, 0.3f},
                               .std = {0.2f, 0.3f, 0.25f}, .skip_bad = 1, .fill_bad = 1,
                               .crop_pad = 2, .flip = 1};
    const int workers[] = {0, 1, 2, 3, 4, 2, 4}, prefetch[] = {0, 1, 2, 3, 8, 1, 0};
    for (int variant = 0; variant < 3; variant++) {
        LoaderConfig cfg = base;
        if (variant == 1) cfg.fill_bad = 0;                  // short batches
        if (variant == 2) {  // the files' random resized crops, colour jitter
            cfg.crop_pad = 0, cfg.crop = crop_range(0.3);
            cfg.jitter[0] = cfg.jitter[1] = cfg.jitter[2] = 0.4f;
        }
        Run ref = run_config(ds, cfg, 3);
        assert_int_equal(ref.skipped, 3 * 4);
        assert_int_equal(ref.samples, cfg.fill_bad ? 3 * 47 : 3 * 43);
        for (size_t k = 1; k < sizeof workers / sizeof workers[0]; k++) {
            cfg.workers = workers[k], cfg.prefetch = prefetch[k];
            Run r = run_config(ds, cfg, 3);
            char what[96];
            snprintf(what, sizeof what, "variant %d, workers %d, prefetch %d", variant,
                     workers[k], prefetch[k]);
            assert_runs_equal(&ref, &r, what);
            free(r.bytes);
        }
        free(ref.bytes);
    }
    dataset_close(ds);
}

static void test_workers_identical_idx(void **state) {
    Dataset *ds = open_idx("wi_idx", 203, 6, 5);
    LoaderConfig cfg = {.batch = 16, .shuffle = 1, .seed = 3, .mean = {0.1307f}, .std = {0.3081f}};
    for (int aug = 0; aug < 2; aug++) {
        cfg.flip = aug;
        cfg.workers = 0;
        Run ref = run_config(ds, cfg, 2);
        assert_int_equal(ref.samples, 2 * 203);
        for (int w = 1; w <= 4; w++) {
            cfg.workers = w, cfg.prefetch = w + 1;
            Run r = run_config(ds, cfg, 2);
            assert_runs_equal(&ref, &r, "IDX");
            free(r.bytes);
        }
        free(ref.bytes);
    }
    dataset_close(ds);
}

// ---- one ring for the training and the test set (loader_create_shared) ------------------

// Three training epochs with an evaluation of the test set after each, both appended to r:
// over loaders of their own (shared NULL), or with the test loader on the training one's
// ring. Each batch's table of values is checked against normalise_table's.
static void train_and_evaluate(Dataset *tr, Dataset *te, LoaderConfig ct, LoaderConfig ce, bool shared, Run *r) {
    Loader *train = make_loader(tr, ct), *test;
    Error err = {{0}};
    if (!shared) test = make_loader(te, ce);
    else if (loader_create_shared(&test, te, &ce, train, &err)) fail_msg("%s", err.msg);
    // The shared loader allocates its order alone.
    assert_int_equal(loader_size(test), shared ? (size_t)te->count * 8 : loader_bytes(te, &ce));
    if (shared) assert_int_equal(loader_size_at(test, 1), (size_t)te->count * 8);  // no ring of its own
    for (int e = 0; e < 3; e++) {
        run_epochs(train, tr, e, e + 1, 0, r);
        run_epochs(test, te, 0, 1, 0, r);
    }
    loader_destroy(train);  // either order: the ring lives until both are gone
    loader_destroy(test);
}

// The batches of both sets are the same whether the test loader shares the ring or not,
// for workers 0, 1 and 3 (and the same across them); the training set, interrupted by an
// evaluation mid-epoch, resumes where it was; a set whose batches do not fit is refused.
static void test_shared_ring(void **state) {
    Dataset *tr = open_idx("ring_tr", 53, 4, 4), *te = open_idx("ring_te", 17, 4, 4);
    const LoaderConfig ct = {.batch = 8, .shuffle = 1, .seed = 21, .mean = {0.2f}, .std = {0.3f},
                             .flip = 1, .prefetch = 3},
                       ce = {.batch = 8, .seed = 21, .mean = {0.2f}, .std = {0.3f}, .prefetch = 3};
    Run ref = {0};
    const int workers[] = {0, 1, 3};
    for (size_t w = 0; w < 3; w++) {
        LoaderConfig a = ct, b = ce;
        a.workers = b.workers = workers[w];
        Run own = {0}, one = {0};
        train_and_evaluate(tr, te, a, b, false, &own);
        train_and_evaluate(tr, te, a, b, true, &one);
        char what[64];
        snprintf(what, sizeof what, "shared ring, workers %d", workers[w]);
        assert_runs_equal(&own, &one, what);
        if (w == 0) ref = own;
        else assert_runs_equal(&ref, &one, what), free(own.bytes);
        free(one.bytes);

        // An evaluation in the middle of a training epoch takes the ring: the training
        // loader refuses to go on until it starts (here: resumes) its epoch again.
        Loader *train = make_loader(tr, a), *test;
        Error err = {{0}};
        if (loader_create_shared(&test, te, &b, train, &err)) fail_msg("%s", err.msg);
        Run whole = {0}, head = {0}, evals = {0}, tail = {0};
        run_epochs(train, tr, 1, 2, 0, &whole);
        assert_int_equal(loader_start_epoch(train, 1, 0, &err), 0);
        const Batch *bt;
        for (int k = 0; k < 3; k++) {
            assert_int_equal(loader_next(train, &bt, &err), 0);
            assert_non_null(bt);
            assert_memory_equal(bt->lut, (float[]){(0 / 255.0f - 0.2f) / 0.3f}, sizeof(float));
        }
        run_epochs(test, te, 0, 1, 0, &evals);
        assert_int_equal(loader_next(train, &bt, &err), -1);
        assert_non_null(strstr(err.msg, "sharing its batch buffers"));
        run_epochs(train, tr, 1, 2, 3, &tail);
        run_epochs(train, tr, 1, 2, 0, &head);  // and the whole epoch again
        assert_runs_equal(&whole, &head, "the epoch after an evaluation");
        assert_true(tail.len < whole.len);
        // tail: batches 3.. of the epoch, then its statistics; whole ends the same way.
        assert_memory_equal(tail.bytes, whole.bytes + (whole.len - tail.len), tail.len);
        free(whole.bytes), free(head.bytes), free(evals.bytes), free(tail.bytes);
        loader_destroy(test);
        loader_destroy(train);
    }
    free(ref.bytes);
    // A test loader whose batches need more than the ring holds (3 slots of 8 samples,
    // augmentation scratch for 1 worker).
    LoaderConfig a = ct;
    a.workers = 1;
    Loader *train = make_loader(tr, a), *test = NULL;
    Error err = {{0}};
    LoaderConfig big = ce;
    big.workers = 1, big.batch = 9;
    assert_int_equal(loader_create_shared(&test, te, &big, train, &err), -1);
    assert_non_null(strstr(err.msg, "do not fit"));
    assert_null(test);
    big = ce, big.workers = 1, big.prefetch = 4;  // more slots
    assert_int_equal(loader_create_shared(&test, te, &big, train, &err), -1);
    big = ce, big.flip = 1, big.workers = 2, big.prefetch = 3;  // scratch for 2 workers
    assert_int_equal(loader_create_shared(&test, te, &big, train, &err), -1);
    big = ce, big.workers = 3, big.prefetch = 2;  // fewer slots, no scratch: fits
    assert_int_equal(loader_create_shared(&test, te, &big, train, &err), 0);
    loader_destroy(test);
    loader_destroy(train);
    dataset_close(tr);
    dataset_close(te);
}

// Starting an epoch while workers fill the previous one, or resuming mid-epoch, gives
// the batches of an uninterrupted run.
static void test_epoch_restart_and_resume(void **state) {
    Dataset *ds = open_idx("restart", 500, 4, 4);
    LoaderConfig cfg = {.batch = 10, .shuffle = 1, .seed = 9, .mean = {0}, .std = {1},
                        .workers = 3, .prefetch = 6, .flip = 1};
    Loader *l = make_loader(ds, cfg);
    Error err = {{0}};
    const Batch *b;
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    assert_int_equal(loader_next(l, &b, &err), 0);
    assert_non_null(b);
    Run r = {0};
    run_epochs(l, ds, 1, 2, 0, &r);  // abandons epoch 0 after one batch
    Run ref = {0};
    cfg.workers = 0;
    Loader *l0 = make_loader(ds, cfg);
    run_epochs(l0, ds, 1, 2, 0, &ref);
    assert_runs_equal(&ref, &r, "restart");
    free(r.bytes);
    // Resume epoch 1 at batch 20: the tail of the uninterrupted epoch.
    Run tail = {0};
    run_epochs(l, ds, 1, 2, 20, &tail);
    const size_t per_batch = sizeof(int64_t) + sizeof(int) + 10 * 4 + 10 * 16;
    assert_int_equal(tail.len, ref.len - 20 * per_batch);
    assert_memory_equal(tail.bytes, ref.bytes + 20 * per_batch, tail.len);
    free(tail.bytes);
    free(ref.bytes);
    // Destroying a loader whose workers are busy joins them.
    assert_int_equal(loader_start_epoch(l, 2, 0, &err), 0);
    loader_destroy(l);
    loader_destroy(l0);
    dataset_close(ds);
}

// ---- bad files -------------------------------------------------------------------------------

// Without shuffling: a bad sample's place goes to the next good sample after the batch,
// the batch stays full, and the count is per epoch. Without fill_bad the batch is shorter.
static void test_skip_bad_fill(void **state) {
    const int bad[] = {1, 3, 4, 11};
    make_tree("fill", 12, bad, 4, 4, 4, 1);
    Dataset *ds = open_tree("fill", 4, 4, 1);
    // File order: c0/000 c0/003 c0/006 c0/009 c1/001 c1/004 c1/007 c1/010 c2/002 c2/005
    // c2/008 c2/011, i.e. ids 0 3 6 9 1 4 7 10 2 5 8 11; bad: 3, 1, 4, 11 at positions
    // 1, 4, 5, 11.
    LoaderConfig cfg = {.batch = 4, .mean = {0}, .std = {1}, .skip_bad = 1, .fill_bad = 1};
    for (int w = 0; w <= 2; w += 2) {
        cfg.workers = w;
        Loader *l = make_loader(ds, cfg);
        Error err = {{0}};
        assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
        // batch 0: positions 0..3 = ids 0, [3 bad], 6, 9 -> 3's place: position 4 (bad),
        // 5 (bad), 6 = id 7. batch 1: [1 bad], [4 bad], 7, 10 -> positions 8, 9 = ids 2, 5.
        // batch 2: 2, 5, 8, [11 bad] -> wraps around to position 0 = id 0.
        const int want[3][4] = {{0, 7, 6, 9}, {2, 5, 7, 10}, {2, 5, 8, 0}};
        const int wn[3] = {4, 4, 4};
        const int64_t skipped_after[3] = {1, 3, 4};
        const Batch *b;
        for (int k = 0; k < 3; k++) {
            assert_int_equal(loader_next(l, &b, &err), 0);
            assert_non_null(b);
            assert_int_equal(b->n, wn[k]);
            for (int j = 0; j < 4; j++) {
                int id = b->px[j * 16];
                if (id != want[k][j]) fail_msg("batch %d sample %d: id %d, want %d", k, j, id, want[k][j]);
                assert_int_equal(b->y[j], want[k][j] % 3);
            }
            LoaderStats st;
            loader_stats(l, &st);
            assert_int_equal(st.skipped, skipped_after[k]);
        }
        assert_int_equal(loader_next(l, &b, &err), 0);
        assert_null(b);
        loader_destroy(l);
    }
    // Short batches: 4 - 1, 4 - 2, 4 - 1 samples.
    cfg.fill_bad = 0;
    cfg.workers = 1;
    Run r = run_config(ds, cfg, 1);
    assert_int_equal(r.samples, 8);
    assert_int_equal(r.batches, 3);
    assert_int_equal(r.skipped, 4);
    free(r.bytes);
    dataset_close(ds);
}

// Without skip_bad, the first bad file in batch order stops the run with its path and
// reason, after the good batches before it; with workers too.
static void test_bad_file_stops(void **state) {
    const int bad[] = {7};
    make_tree("stop", 12, bad, 1, 0, 0, 0);
    Dataset *ds = open_tree("stop", 4, 4, 3);
    for (int w = 0; w <= 2; w++) {
        LoaderConfig cfg = {.batch = 2, .mean = {0}, .std = {1, 1, 1}, .workers = w};
        Loader *l = make_loader(ds, cfg);
        Error err = {{0}};
        assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
        const Batch *b;
        // Position of id 7 in file order (ids 0 3 6 9 1 4 7 ...): 6, so batch 3.
        for (int k = 0; k < 3; k++) {
            assert_int_equal(loader_next(l, &b, &err), 0);
            assert_non_null(b);
        }
        assert_int_equal(loader_next(l, &b, &err), -1);
        assert_null(b);
        assert_non_null(strstr(err.msg, "stop/c1/007.png"));
        assert_non_null(strstr(err.msg, "not a readable image"));
        assert_non_null(strstr(err.msg, "epoch 1, batch 4 of 6"));  // counted from 1
        assert_non_null(strstr(err.msg, "skip_bad = 1"));
        loader_destroy(l);
    }
    dataset_close(ds);
}

static void test_all_bad(void **state) {
    const int bad[] = {0, 1, 2, 3, 4, 5};
    make_tree("allbad", 6, bad, 6, 0, 0, 0);
    Dataset *ds = open_tree("allbad", 4, 4, 3);
    LoaderConfig cfg = {.batch = 4, .mean = {0}, .std = {1, 1, 1}, .skip_bad = 1, .fill_bad = 1,
                        .workers = 2};
    Loader *l = make_loader(ds, cfg);
    Error err = {{0}};
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    const Batch *b;
    assert_int_equal(loader_next(l, &b, &err), -1);
    assert_non_null(strstr(err.msg, "all 6 samples were bad"));
    loader_destroy(l);
    dataset_close(ds);
}

// ---- augmentation ------------------------------------------------------------------------------

// crop_pad: each output is the input shifted by (dx, dy) in [-P, P]^2 with zero fill,
// flipped or not; the shifts and flips vary over samples and epochs; a crop_scale of 1 on
// a square image is the identity.
static void test_augment_crop_pad_flip(void **state) {
    const int H = 6, W = 6, P = 2, N = 64;
    Dataset *ds = open_idx("aug", N, H, W);
    LoaderConfig cfg = {.batch = N, .mean = {0}, .std = {1}, .crop_pad = P, .flip = 1, .seed = 5};
    Loader *l = make_loader(ds, cfg);
    Error err = {{0}};
    int flips = 0, shifts[2 * 2 + 1][2 * 2 + 1] = {{0}}, differ = 0;
    uint8_t first_epoch[64][36];
    for (int e = 0; e < 2; e++) {
        assert_int_equal(loader_start_epoch(l, e, 0, &err), 0);
        const Batch *b;
        assert_int_equal(loader_next(l, &b, &err), 0);
        for (int i = 0; i < N; i++) {
            uint8_t out[36];
            memcpy(out, b->px + i * 36, 36);
            if (e == 0) memcpy(first_epoch[i], out, 36);
            else differ += memcmp(first_epoch[i], out, 36) != 0;
            int found = 0;
            for (int f = 0; f < 2 && !found; f++)
                for (int dy = -P; dy <= P && !found; dy++)
                    for (int dx = -P; dx <= P && !found; dx++) {
                        int ok = 1;
                        for (int y = 0; y < H && ok; y++)
                            for (int x = 0; x < W && ok; x++) {
                                int xx = f ? W - 1 - x : x;  // flip after the crop
                                int sy = y + dy, sx = xx + dx;
                                int v = sy < 0 || sy >= H || sx < 0 || sx >= W
                                            ? 0 : pix(i, sy * W + sx);
                                ok = out[y * W + x] == v;
                            }
                        if (ok) {
                            found = 1;
                            flips += f;
                            shifts[dy + P][dx + P]++;
                        }
                    }
            if (!found) fail_msg("epoch %d sample %d is no shifted copy of the input", e, i);
        }
    }
    assert_true(flips > 32 && flips < 96);  // 128 samples, half flipped
    int used = 0;
    for (int a = 0; a < 5; a++)
        for (int c = 0; c < 5; c++) used += shifts[a][c] > 0;
    assert_true(used >= 15);
    assert_true(differ > 48);  // another epoch, other crops
    loader_destroy(l);

    cfg.crop_pad = 0, cfg.flip = 0, cfg.crop = crop_range(1);
    l = make_loader(ds, cfg);
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    const Batch *b;
    assert_int_equal(loader_next(l, &b, &err), 0);
    for (int i = 0; i < N; i++)
        for (int p = 0; p < 36; p++) assert_int_equal(b->px[i * 36 + p], pix(i, p));
    loader_destroy(l);
    // A smaller crop_scale changes most samples, the same way every time.
    cfg.crop = crop_range(0.25);
    Run a = run_config(ds, cfg, 1), c = run_config(ds, cfg, 1);
    assert_runs_equal(&a, &c, "crop_scale");
    free(a.bytes), free(c.bytes);
    dataset_close(ds);
}

// A folder's random resized crops are of its files, at their own size (image_load_crop,
// keyed by seed, epoch and sample as transform.h says), then flipped; an IDX set's, of its
// samples. Colour jitter changes colours, and keeps the crop.
static void test_augment_crops_of_files(void **state) {
    make_tree("rrc", 9, NULL, 0, 0, 0, 0);  // 10 to 14 x 9 to 12 pixels, gray and RGB
    Dataset *ds = open_tree("rrc", 8, 6, 3);
    LoaderConfig cfg = {.batch = 9, .mean = {0}, .std = {1, 1, 1}, .seed = 4, .crop = crop_range(0.2),
                        .flip = 1};
    for (int epoch = 0; epoch < 2; epoch++) {
        Loader *l = make_loader(ds, cfg);
        Error err = {{0}};
        assert_int_equal(loader_start_epoch(l, epoch, 0, &err), 0);
        const Batch *b;
        assert_int_equal(loader_next(l, &b, &err), 0);
        for (int i = 0; i < 9; i++) {  // sample i: class i / 3, its (i % 3)-th file
            char file[PATH_MAX];
            snprintf(file, sizeof file, "%s/rrc/c%d/%03d.png", g_dir, i / 3, i % 3 * 3 + i / 3);
            const uint64_t key = rng_key(cfg.seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
            const ImageFit fit = {.channels = 3, .width = 8, .height = 6};
            uint8_t want[8 * 6 * 3];
            if (image_load_crop(file, &fit, &cfg.crop, key, want, &err)) fail_msg("%s", err.msg);
            const bool flipped = rng_u64(key, AUG_FLIP) >> 63;
            assert_int_equal(b->y[i], i / 3);
            for (int y = 0; y < 6; y++)
                for (int x = 0; x < 8; x++)
                    for (int c = 0; c < 3; c++)
                        assert_int_equal(b->px[((size_t)i * 48 + y * 8 + x) * 3 + c],
                                         want[(y * 8 + (flipped ? 7 - x : x)) * 3 + c]);
        }
        loader_destroy(l);
    }
    cfg.jitter[0] = cfg.jitter[2] = 0.5f;
    Run plain = run_config(ds, (LoaderConfig){.batch = 9, .mean = {0}, .std = {1, 1, 1}, .seed = 4,
                                              .crop = crop_range(0.2), .flip = 1}, 1);
    Run jittered = run_config(ds, cfg, 1);
    assert_int_equal(plain.len, jittered.len);
    assert_memory_not_equal(plain.bytes, jittered.bytes, plain.len);
    free(plain.bytes), free(jittered.bytes);
    dataset_close(ds);
}

// ---- the cache under workers -------------------------------------------------------------------

static void test_cache_with_workers(void **state) {
    const int bad[] = {9};
    make_tree("cw", 40, bad, 1, 0, 0, 0);
    char root[600], cache[600];
    snprintf(root, sizeof root, "%s/cw", g_dir);
    snprintf(cache, sizeof cache, "%s/cw_cache", g_dir);
    FolderOptions o = {.fit = {.channels = 3, .width = 7, .height = 5}, .cache_dir = cache,
                       .cache_name = "train.cache"};
    LoaderConfig cfg = {.batch = 6, .shuffle = 1, .seed = 2, .mean = {0}, .std = {1, 1, 1},
                        .skip_bad = 1, .fill_bad = 1, .flip = 1};
    Dataset *plain = open_tree("cw", 7, 5, 3);
    Run ref = run_config(plain, cfg, 3);
    dataset_close(plain);
    for (int pass = 0; pass < 2; pass++) {
        Dataset *ds;
        Error err = {{0}};
        if (folder_dataset_open(&ds, root, &o, &err)) fail_msg("%s", err.msg);
        assert_non_null(strstr(ds->info, pass ? "up to date" : "being written"));
        cfg.workers = 2 + pass;
        Run r = run_config(ds, cfg, 3);  // epoch 0 writes the cache, 1 and 2 read it
        assert_runs_equal(&ref, &r, "cache");
        free(r.bytes);
        dataset_close(ds);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/train.cache", cache);
        assert_int_equal(access(p, F_OK), 0);
    }
    free(ref.bytes);
}

// ---- statistics and the memory plan -------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void test_stats_wait(void **state) {
    make_tree("wait", 30, NULL, 0, 0, 0, 0);
    Dataset *ds = open_tree("wait", 32, 32, 3);
    LoaderConfig cfg = {.batch = 5, .mean = {0}, .std = {1, 1, 1}};
    // Synchronous: the whole read is waiting.
    Loader *l = make_loader(ds, cfg);
    Error err = {{0}};
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    const Batch *b;
    double t0 = now_s();
    while (!loader_next(l, &b, &err) && b) {}
    double total = now_s() - t0;
    LoaderStats st;
    loader_stats(l, &st);
    assert_true(st.wait_seconds > 0 && st.wait_seconds <= total + 1e-6);
    loader_destroy(l);
    // Workers with room for the whole epoch, and a trainer that computes first: no wait.
    cfg.workers = 2, cfg.prefetch = 6;
    l = make_loader(ds, cfg);
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    usleep(300000);
    while (!loader_next(l, &b, &err) && b) {}
    loader_stats(l, &st);
    assert_true(st.wait_seconds < 0.05);
    // A new epoch starts the statistics again.
    assert_int_equal(loader_start_epoch(l, 1, 0, &err), 0);
    loader_stats(l, &st);
    assert_true(st.wait_seconds == 0 && st.skipped == 0);
    loader_destroy(l);
    dataset_close(ds);
}

static void test_loader_bytes_ring(void **state) {
    Dataset *ds = open_idx("bytes", 1000, 4, 3);
    LoaderConfig cfg = {.batch = 64, .mean = {0}, .std = {1}};
    // Per slot of the ring the labels and the bytes (the batch handed out is a slot's: no
    // float copy of it).
    const size_t x = 0, slot = 64 * 4 + 64 * 12, order = 1000 * 8;
    assert_int_equal(loader_bytes(ds, &cfg), x + slot + order);
    cfg.workers = 2;  // prefetch 0: 2 * workers slots
    assert_int_equal(loader_bytes(ds, &cfg), x + 4 * slot + order);
    cfg.prefetch = 3;
    assert_int_equal(loader_bytes(ds, &cfg), x + 3 * slot + order);
    cfg.flip = 1;  // one sample of scratch per worker
    assert_int_equal(loader_bytes(ds, &cfg), x + 3 * slot + order + 2 * 12);
    cfg.workers = 0;
    assert_int_equal(loader_bytes(ds, &cfg), x + slot + order + 12);
    Loader *l = make_loader(ds, cfg);
    assert_int_equal(loader_size(l), x + slot + order + 12);
    loader_destroy(l);
    cfg.workers = 2;  // what the same loader would take with another prefetch
    l = make_loader(ds, cfg);
    assert_int_equal(loader_size(l), x + 3 * slot + order + 2 * 12);
    assert_int_equal(loader_size_at(l, 3), loader_size(l));
    assert_int_equal(loader_size_at(l, 1), x + slot + order + 2 * 12);
    loader_destroy(l);
    cfg.workers = 0;
    cfg.workers = -1;
    assert_int_equal(loader_bytes(ds, &cfg), 0);
    Error err = {{0}};
    assert_int_equal(loader_create(&l, ds, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "workers = -1"));
    cfg.workers = 0, cfg.crop_pad = 1, cfg.crop = crop_range(0.5);
    assert_int_equal(loader_create(&l, ds, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "choose one crop"));
    dataset_close(ds);
}

// ---- main -------------------------------------------------------------------------------------

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_loader"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workers_identical_folder),
        cmocka_unit_test(test_workers_identical_idx),
        cmocka_unit_test(test_epoch_restart_and_resume),
        cmocka_unit_test(test_skip_bad_fill),
        cmocka_unit_test(test_bad_file_stops),
        cmocka_unit_test(test_all_bad),
        cmocka_unit_test(test_augment_crop_pad_flip),
        cmocka_unit_test(test_augment_crops_of_files),
        cmocka_unit_test(test_cache_with_workers),
        cmocka_unit_test(test_stats_wait),
        cmocka_unit_test(test_loader_bytes_ring),
        cmocka_unit_test(test_shared_ring),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
