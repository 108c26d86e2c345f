// test_checkpoint.c: checkpoints (nn/checkpoint.c) and, where it is built, the ckpt tool.
//
//   - save and load round trips: parameters, optimizer state and every TrainState field
//     come back bit for bit; the cfg text and the class names come back as written;
//   - the file itself: PyTorch's names and shapes, the optimizer prefix, the metadata;
//   - strict loading: a renamed layer (missing and unexpected keys and the exact
//     `./ckpt rename` command), two renamed layers (one rule renames both), a wider layer
//     (the shapes), no optimizer state, not a checkpoint, another format, a missing
//     file, broken metadata; on every error the network is left untouched;
//   - F16 parameters are converted on load;
//   - renaming: keys, optimizer keys and the stored cfg's layer names; the result loads
//     strictly into a network built from its own stored cfg; the input stays byte for
//     byte the same; duplicates, invalid names and out == in are refused; substring,
//     prefix and whole-name rules; rules apply in order;
//   - the ckpt binary's exit codes and output, if ./ckpt exists (skipped otherwise).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../nn/cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/safetensors.h"
#include "testutil.h"

static char g_root[PATH_MAX] = ".";  // the repository, for ./ckpt
static char g_dir[64];               // a fresh temporary folder for the whole suite

static const Shape INPUT = {.c = 1, .h = 8, .w = 8};
static const Optimizer ADADELTA = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};

// The suite's networks: batch 4, fp32, Adadelta's state planned.
static NetOptions net_options(void) {
    NetOptions o = {.batch = 4, .precision = DT_F32};
    optim_plan(&ADADELTA, &o);
    return o;
}
#define CLASSES 5

// ---- helpers ------------------------------------------------------------------------------

static uint64_t g_rng = 1;

static float frand(void) {  // [-1, 1), any bits in the mantissa
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

// A path in the suite's folder (one of 4 rotating buffers, so a call may use several).
static const char *path(const char *name) { return test_path(g_dir, name); }

// The test network's cfg: conv (filters) 8x8 -> 6x6, conv 4 -> 4x4, maxpool -> 2x2,
// flatten 16, linear 5, log_softmax. conv1 == NULL leaves the first conv its default name
// ("conv1"), so renaming must add a name key to its section.
static char *cfg_text(char *buf, size_t cap, const char *conv1, const char *conv2, int filters) {
    char name1[96] = "";
    if (conv1) snprintf(name1, sizeof name1, "name = %s\n", conv1);
    snprintf(buf, cap,
             "[train]\nbatch = 4\nseed = 7\n\n"
             "[conv]\n%sfilters = %d\nsize = 3\nactivation = relu\n\n"
             "[conv]\nname = %s\nfilters = 4\nsize = 3\nactivation = relu\n\n"
             "[maxpool]\nsize = 2\n\n[flatten]\n\n[linear]\nname = fc1\noutputs = %d\n\n"
             "[log_softmax]\n",
             name1, filters, conv2, CLASSES);
    return buf;
}

static void make_net_text(Net *net, const char *text) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text, "t.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    const NetOptions opts = net_options();
    if (net_create(net, &cfg, INPUT, CLASSES, &opts, cpu_kernels(), &err))
        fail_msg("net_create: %s", err.msg);
    cfg_free(&cfg);
}

static void make_net(Net *net, const char *conv1, const char *conv2, int filters) {
    char text[1024];
    make_net_text(net, cfg_text(text, sizeof text, conv1, conv2, filters));
}

// Random parameters and optimizer state, through the device interface (Adadelta's state
// averages squares: never negative).
static void fill_random(Net *net, uint64_t seed) {
    g_rng = seed;
    size_t n = (size_t)net->nparams;
    float *h = malloc(3 * n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < 3 * n; i++) h[i] = i < n ? frand() : fabsf(frand());
    net->k->upload(net->params, h, n * sizeof *h);
    net->k->upload(net->optimizer, h + n, 2 * n * sizeof *h);
    free(h);
}

// A host copy of the parameters and the optimizer state (3 * nparams floats; free it).
static float *snapshot(const Net *net) {
    size_t n = (size_t)net->nparams;
    float *h = malloc(3 * n * sizeof *h);
    assert_non_null(h);
    net->k->download(h, net->params, n * sizeof *h);
    net->k->download(h + n, net->optimizer, 2 * n * sizeof *h);
    return h;
}

static const char *const class_names[CLASSES] = {"T-shirt/top", "Trouser", "Ankle boot", "É", "4"};

static TrainState sample_state(void) {
    return (TrainState){.epoch = 3,
                        .batch = 17,
                        .step = 12345678901ULL,
                        .seed = 0xfedcba9876543210ULL,
                        .best_val_acc = 0.1,
                        .epoch_loss = 1.0 / 3,
                        .epoch_correct = 2.0 / 7,
                        .epoch_seen = 1088,
                        .loss_scale = 32768,
                        .scaler_good_steps = 5,
                        .scaler_skipped = 2,
                        .plateau = {.best = 0.1 + 0.2, .bad_epochs = 2, .reductions = 1},
                        .best_val_loss = 0.1 + 0.2,
                        .best_val_loss_epoch = 1};
}

// Saves net with sample_state() and the cfg text to `file` in the suite's folder.
static void save(const char *file, const Net *net, const char *text) {
    TrainState st = sample_state();
    CheckpointInfo info = {
        .cfg_text = (char *)text, .class_names = (char **)class_names, .classes = CLASSES};
    Error err = {{0}};
    if (checkpoint_save(path(file), net, &st, &info, &err))
        fail_msg("checkpoint_save: %s", err.msg);
}

// Writes a standard checkpoint of a random network (conv1 default-named, conv2, fc1) to
// `file`; its cfg text goes to text (1024 bytes) if non-NULL.
static void save_standard(const char *file, uint64_t seed, char *text_out) {
    char text[1024];
    cfg_text(text, sizeof text, NULL, "conv2", 4);
    Net net;
    make_net_text(&net, text);
    fill_random(&net, seed);
    save(file, &net, text);
    if (text_out) strcpy(text_out, text);
    net_free(&net);
}

// Copies checkpoint in to out, dropping tensors whose name starts with drop (if
// non-NULL), setting metadata key to value (value NULL removes the key), and storing the
// tensors named in f16 (if non-NULL, a prefix) as F16.
static void rewrite(const char *in, const char *out, const char *drop, const char *key,
                    const char *value, const char *f16);

static uint16_t f32_to_f16_exact(float x) {  // for values that F16 holds exactly
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffff) == 0) return (uint16_t)(b >> 16);
    int e = (int)((b >> 23) & 0xff) - 127 + 15;
    assert_true(e > 0 && e < 31 && (b & 0x1fff) == 0);
    return (uint16_t)(((b >> 16) & 0x8000) | (uint32_t)e << 10 | ((b >> 13) & 0x3ff));
}

static void rewrite(const char *in, const char *out, const char *drop, const char *key,
                    const char *value, const char *f16) {
    StFile f;
    Error err = {{0}};
    if (st_open(&f, in, &err)) fail_msg("%s", err.msg);
    Tensor *t = calloc((size_t)f.count, sizeof *t);
    uint16_t **halves = calloc((size_t)f.count, sizeof *halves);
    const char **keys = calloc((size_t)f.nmeta + 1, sizeof *keys);
    const char **values = calloc((size_t)f.nmeta + 1, sizeof *values);
    assert_true(t && halves && keys && values);
    int n = 0, nm = 0;
    for (int i = 0; i < f.count; i++) {
        const StEntry *e = &f.entries[i];
        if (drop && !strncmp(e->name, drop, strlen(drop))) continue;
        if (st_as_tensor(&f, e, &t[n], &err)) fail_msg("%s", err.msg);
        if (f16 && !strncmp(e->name, f16, strlen(f16))) {
            int64_t m = st_numel(e);
            halves[n] = malloc((size_t)m * 2 + 2);
            assert_non_null(halves[n]);
            for (int64_t j = 0; j < m; j++)
                halves[n][j] = f32_to_f16_exact(((const float *)e->data)[j]);
            t[n].dtype = DT_F16;
            t[n].data = halves[n];
        }
        n++;
    }
    bool set = false;
    for (int i = 0; i < f.nmeta; i++) {
        bool hit = key && !strcmp(f.meta[i].key, key);
        if (hit && !value) continue;
        keys[nm] = f.meta[i].key;
        values[nm++] = hit ? value : f.meta[i].value;
        set |= hit;
    }
    if (key && value && !set) keys[nm] = key, values[nm++] = value;
    if (st_write(out, t, n, keys, values, nm, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < f.count; i++) free(halves[i]);
    free(halves);
    free(t);
    free(keys);
    free(values);
    st_close(&f);
}

static bool exists(const char *p) { return access(p, F_OK) == 0; }

static void assert_contains(const char *s, const char *sub) {
    if (!strstr(s, sub)) fail_msg("expected \"%s\" in:\n%s", sub, s);
}

static void assert_states_equal(const TrainState *a, const TrainState *b) {
    assert_int_equal(a->epoch, b->epoch);
    assert_int_equal(a->batch, b->batch);
    assert_true(a->step == b->step);
    assert_true(a->seed == b->seed);
    assert_memory_equal(&a->best_val_acc, &b->best_val_acc, sizeof(double));
    assert_memory_equal(&a->epoch_loss, &b->epoch_loss, sizeof(double));
    assert_memory_equal(&a->epoch_correct, &b->epoch_correct, sizeof(double));
    assert_int_equal(a->epoch_seen, b->epoch_seen);
    assert_memory_equal(&a->plateau.best, &b->plateau.best, sizeof(double));
    assert_int_equal(a->plateau.bad_epochs, b->plateau.bad_epochs);
    assert_int_equal(a->plateau.reductions, b->plateau.reductions);
    assert_memory_equal(&a->best_val_loss, &b->best_val_loss, sizeof(double));
    assert_int_equal(a->best_val_loss_epoch, b->best_val_loss_epoch);
}

// ---- round trips ----------------------------------------------------------------------------

static void test_round_trip(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, "conv1", "conv2", 4);
    Net a, b;
    make_net_text(&a, text);
    make_net_text(&b, text);
    fill_random(&a, 1);
    fill_random(&b, 2);  // different, so every value must be overwritten
    save("rt.safetensors", &a, text);

    TrainState st;
    memset(&st, 0xab, sizeof st);
    Error err = {{0}};
    if (checkpoint_load_all(path("rt.safetensors"), &b, &st, &err)) fail_msg("%s", err.msg);
    float *ha = snapshot(&a), *hb = snapshot(&b);
    assert_memory_equal(ha, hb, 3 * (size_t)a.nparams * sizeof(float));
    TrainState want = sample_state();
    assert_states_equal(&st, &want);

    CheckpointInfo info;
    TrainState st2;
    if (checkpoint_read_info(path("rt.safetensors"), &info, &st2, &err)) fail_msg("%s", err.msg);
    assert_string_equal(info.cfg_text, text);
    assert_int_equal(info.classes, CLASSES);
    for (int i = 0; i < CLASSES; i++) assert_string_equal(info.class_names[i], class_names[i]);
    assert_states_equal(&st2, &want);
    checkpoint_info_free(&info);
    assert_null(info.cfg_text);
    // Without a TrainState, only the info.
    if (checkpoint_read_info(path("rt.safetensors"), &info, NULL, &err)) fail_msg("%s", err.msg);
    checkpoint_info_free(&info);

    free(ha);
    free(hb);
    net_free(&a);
    net_free(&b);
}

// load_weights takes the parameters only: the optimizer state stays as it was.
static void test_load_weights_only(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, "conv1", "conv2", 4);
    Net a, b;
    make_net_text(&a, text);
    make_net_text(&b, text);
    fill_random(&a, 3);
    fill_random(&b, 4);
    save("w.safetensors", &a, text);
    float *before = snapshot(&b);
    Error err = {{0}};
    if (checkpoint_load_weights(path("w.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    float *ha = snapshot(&a), *hb = snapshot(&b);
    size_t n = (size_t)a.nparams;
    assert_memory_equal(ha, hb, n * sizeof(float));
    assert_memory_equal(before + n, hb + n, 2 * n * sizeof(float));
    free(before);
    free(ha);
    free(hb);
    net_free(&a);
    net_free(&b);
}

// PyTorch's names and shapes, the optimizer keys, the metadata as text.
static void test_file_layout(void **state) {
    char text[1024];
    save_standard("layout.safetensors", 5, text);
    StFile f;
    Error err = {{0}};
    if (st_open(&f, path("layout.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_int_equal(f.count, 18);  // 6 parameters, each with 2 optimizer tensors
    const StEntry *e = st_find(&f, "conv1.weight");
    assert_non_null(e);
    assert_int_equal(e->dtype, ST_F32);
    assert_int_equal(e->ndim, 4);
    const int64_t conv1[4] = {4, 1, 3, 3};
    assert_memory_equal(e->shape, conv1, sizeof conv1);
    e = st_find(&f, "fc1.weight");
    assert_non_null(e);
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], CLASSES);
    assert_int_equal(e->shape[1], 16);
    const char *opt[] = {"optimizer.conv1.weight.square_avg", "optimizer.conv1.weight.acc_delta",
                         "optimizer.fc1.bias.square_avg", "optimizer.conv2.bias.acc_delta"};
    for (int i = 0; i < 4; i++) assert_non_null(st_find(&f, opt[i]));
    assert_int_equal(st_find(&f, "optimizer.fc1.bias.acc_delta")->shape[0], CLASSES);
    assert_string_equal(st_meta(&f, "format"), CHECKPOINT_FORMAT);
    assert_string_equal(st_meta(&f, "cfg"), text);
    assert_string_equal(st_meta(&f, "classes"), "T-shirt/top\nTrouser\nAnkle boot\nÉ\n4");
    assert_string_equal(st_meta(&f, "epoch"), "3");
    assert_string_equal(st_meta(&f, "step"), "12345678901");
    assert_string_equal(st_meta(&f, "seed"), "18364758544493064720");
    assert_string_equal(st_meta(&f, "best_val_acc"), "0.10000000000000001");
    assert_string_equal(st_meta(&f, "epoch_loss"), "0.33333333333333331");
    st_close(&f);
}

// No class names (a checkpoint that could not be read back); a class name that would not
// read back; a folder that is not there.
static void test_save_errors(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, "conv1", "conv2", 4);
    Net a;
    make_net_text(&a, text);
    fill_random(&a, 6);
    TrainState st = sample_state();
    CheckpointInfo info = {.cfg_text = text, .class_names = NULL, .classes = 0};
    Error err = {{0}};
    assert_int_equal(checkpoint_save(path("noclasses.safetensors"), &a, &st, &info, &err), -1);
    assert_contains(err.msg, "1 to 1048576 class names");
    assert_false(exists(path("noclasses.safetensors")));

    char *bad[2] = {"cat", "two\nlines"};
    info.class_names = bad;
    info.classes = 2;
    assert_int_equal(checkpoint_save(path("bad.safetensors"), &a, &st, &info, &err), -1);
    assert_contains(err.msg, "class 1's name is on several lines");
    assert_false(exists(path("bad.safetensors")));

    info.classes = 1;
    assert_int_equal(checkpoint_save(path("no/such/dir/x.safetensors"), &a, &st, &info, &err), -1);
    assert_contains(err.msg, "no/such/dir/x.safetensors");
    net_free(&a);
}

// ---- strict loading -------------------------------------------------------------------------

// Loads file into net and expects failure, with net untouched.
static void expect_load_error(const char *file, Net *net, bool all, char *msg, size_t cap) {
    float *before = snapshot(net);
    Error err = {{0}};
    TrainState st;
    int rc =
        all ? checkpoint_load_all(file, net, &st, &err) : checkpoint_load_weights(file, net, NULL, 0, &err);
    assert_int_equal(rc, -1);
    float *after = snapshot(net);
    assert_memory_equal(before, after, 3 * (size_t)net->nparams * sizeof(float));
    free(before);
    free(after);
    snprintf(msg, cap, "%s", err.msg);
}

static void test_renamed_layer(void **state) {
    save_standard("std.safetensors", 7, NULL);
    Net net;
    make_net(&net, "embed1", "conv2", 4);
    fill_random(&net, 8);
    char msg[1024], want[1024];
    expect_load_error(path("std.safetensors"), &net, false, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%s does not fit this network: missing keys (2): embed1.weight, embed1.bias; "
             "unexpected keys (2): conv1.bias, conv1.weight; if the layers were renamed: "
             "./ckpt rename %s %s conv1=embed1",
             path("std.safetensors"), path("std.safetensors"), path("renamed.safetensors"));
    assert_string_equal(msg, want);
    // load_all: the optimizer keys are missing and unexpected too; the same command fixes it.
    // Their optimizer keys are counted, not listed.
    expect_load_error(path("std.safetensors"), &net, true, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%s does not fit this network: missing keys (2): embed1.weight, embed1.bias; "
             "unexpected keys (2): conv1.bias, conv1.weight; their optimizer state likewise "
             "(8 keys); if the layers were renamed: ./ckpt rename %s %s conv1=embed1",
             path("std.safetensors"), path("std.safetensors"), path("renamed.safetensors"));
    assert_string_equal(msg, want);
    net_free(&net);
}

// conv1, conv2 -> embed1, embed2: one rule renames both.
static void test_renamed_two_layers(void **state) {
    save_standard("std2.safetensors", 9, NULL);
    Net net;
    make_net(&net, "embed1", "embed2", 4);
    char msg[1024];
    expect_load_error(path("std2.safetensors"), &net, false, msg, sizeof msg);
    assert_contains(msg,
                    "missing keys (4): embed1.weight, embed1.bias, embed2.weight, embed2.bias;");
    assert_contains(msg,
                    "unexpected keys (4): conv1.bias, conv1.weight, conv2.bias, conv2.weight;");
    char want[600];
    snprintf(want, sizeof want, "if the layers were renamed: ./ckpt rename %s %s conv=embed",
             path("std2.safetensors"), path("renamed.safetensors"));
    assert_contains(msg, want);
    net_free(&net);

    // A renaming plus a layer that is simply not there: no single rule fits, no command.
    Net other;
    make_net(&other, "embed1", "other", 4);
    expect_load_error(path("std2.safetensors"), &other, false, msg, sizeof msg);
    assert_contains(msg, "missing keys (4)");
    assert_null(strstr(msg, "./ckpt rename"));
    net_free(&other);
}

static void test_shape_mismatch(void **state) {
    save_standard("std3.safetensors", 10, NULL);
    Net net;
    make_net(&net, NULL, "conv2", 8);  // conv1 8 filters instead of 4
    char msg[1024], want[1024];
    expect_load_error(path("std3.safetensors"), &net, false, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%s does not fit this network: conv1.weight is [4, 1, 3, 3] in the file but "
             "[8, 1, 3, 3] in the network; conv1.bias is [4] in the file but [8] in the network; "
             "conv2.weight is [4, 4, 3, 3] in the file but [4, 8, 3, 3] in the network; "
             "with init=, init_skip=conv1,conv2 loads the rest and starts those layers fresh "
             "(a new classifier for your classes, say)",
             path("std3.safetensors"));
    assert_string_equal(msg, want);
    expect_load_error(path("std3.safetensors"), &net, true, msg, sizeof msg);
    assert_contains(msg, "in the network; their optimizer state likewise (6 keys)");
    net_free(&net);
}

static void test_no_optimizer(void **state) {
    save_standard("std4.safetensors", 11, NULL);
    rewrite(path("std4.safetensors"), path("noopt.safetensors"), CHECKPOINT_OPTIMIZER_PREFIX, NULL,
            NULL, NULL);
    Net a, net;
    make_net(&a, NULL, "conv2", 4);
    make_net(&net, NULL, "conv2", 4);
    Error err = {{0}};
    if (checkpoint_load_all(path("std4.safetensors"), &a, &(TrainState){0}, &err))
        fail_msg("%s", err.msg);
    // The weights alone load; a resume is refused, saying what to do instead.
    if (checkpoint_load_weights(path("noopt.safetensors"), &net, NULL, 0, &err)) fail_msg("%s", err.msg);
    float *ha = snapshot(&a), *hb = snapshot(&net);
    assert_memory_equal(ha, hb, (size_t)a.nparams * sizeof(float));
    char msg[1024], want[1024];
    expect_load_error(path("noopt.safetensors"), &net, true, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%s holds no optimizer state (no \"optimizer.\" keys), so it cannot resume training; "
             "start a new run from its weights instead (init=%s)",
             path("noopt.safetensors"), path("noopt.safetensors"));
    assert_string_equal(msg, want);
    // Part of the optimizer state: listed as missing.
    rewrite(path("std4.safetensors"), path("halfopt.safetensors"), "optimizer.fc1.", NULL, NULL,
            NULL);
    expect_load_error(path("halfopt.safetensors"), &net, true, msg, sizeof msg);
    assert_contains(msg,
                    "missing keys (4): optimizer.fc1.weight.square_avg, "
                    "optimizer.fc1.weight.acc_delta, optimizer.fc1.bias.square_avg, "
                    "optimizer.fc1.bias.acc_delta");
    free(ha);
    free(hb);
    net_free(&a);
    net_free(&net);
}

static void test_not_a_checkpoint(void **state) {
    save_standard("std5.safetensors", 12, NULL);
    Net net;
    make_net(&net, NULL, "conv2", 4);
    char msg[1024], want[1024];
    // The same tensors without "format": a plain state_dict, as PyTorch writes it. Its
    // weights load (init=, --eval with a cfg), but it cannot resume nor give its cfg.
    rewrite(path("std5.safetensors"), path("plain.safetensors"), NULL, "format", NULL, NULL);
    Error werr = {{0}};
    if (checkpoint_load_weights(path("plain.safetensors"), &net, NULL, 0, &werr))
        fail_msg("a plain state_dict did not load as weights: %s", werr.msg);
    bool is_checkpoint = true;
    assert_int_equal(checkpoint_probe(path("plain.safetensors"), &is_checkpoint, &werr), 0);
    assert_false(is_checkpoint);
    assert_int_equal(checkpoint_probe(path("std5.safetensors"), &is_checkpoint, &werr), 0);
    assert_true(is_checkpoint);
    expect_load_error(path("plain.safetensors"), &net, true, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%s is not a cnn.c checkpoint: its metadata has no \"format\" (a checkpoint that "
             "./train writes says \"%s\")",
             path("plain.safetensors"), CHECKPOINT_FORMAT);
    assert_string_equal(msg, want);
    CheckpointInfo info;
    Error err = {{0}};
    assert_int_equal(checkpoint_read_info(path("plain.safetensors"), &info, NULL, &err), -1);
    assert_string_equal(err.msg, want);
    assert_null(info.cfg_text);
    // Another format.
    rewrite(path("std5.safetensors"), path("other.safetensors"), NULL, "format",
            "cnn.c-checkpoint-99", NULL);
    expect_load_error(path("other.safetensors"), &net, true, msg, sizeof msg);
    assert_contains(msg, "format \"cnn.c-checkpoint-99\" is not \"cnn.c-checkpoint-1\"");
    // A missing file: st_open's message, naming it.
    expect_load_error(path("nothere.safetensors"), &net, false, msg, sizeof msg);
    assert_contains(msg, path("nothere.safetensors"));
    assert_int_equal(checkpoint_read_info(path("nothere.safetensors"), &info, NULL, &err), -1);
    assert_contains(err.msg, path("nothere.safetensors"));
    // Not a safetensors file at all.
    FILE *f = fopen(path("junk.safetensors"), "wb");
    assert_non_null(f);
    fputs("junk", f);
    fclose(f);
    expect_load_error(path("junk.safetensors"), &net, false, msg, sizeof msg);
    assert_contains(msg, path("junk.safetensors"));
    net_free(&net);
}

static void test_bad_metadata(void **state) {
    save_standard("std6.safetensors", 13, NULL);
    Net net;
    make_net(&net, NULL, "conv2", 4);
    struct {
        const char *key, *value, *msg;
    } cases[] = {
        {"epoch", "abc", "metadata \"epoch\" = \"abc\" is not a non-negative integer"},
        {"epoch", "-1", "metadata \"epoch\" = \"-1\" is not a non-negative integer"},
        {"batch", "12 ", "metadata \"batch\" = \"12 \" is not a non-negative integer"},
        {"step", "99999999999999999999",
         "\"step\" = \"99999999999999999999\" is not an unsigned integer in range"},
        {"seed", "-5", "metadata \"seed\" = \"-5\" is not an unsigned integer"},
        {"best_val_acc", "", "metadata \"best_val_acc\" = \"\" is not a number"},
        {"epoch_loss", "0.5x", "metadata \"epoch_loss\" = \"0.5x\" is not a number"},
        {"seed", NULL, "the checkpoint's metadata has no \"seed\""},
        {"epoch_seen", NULL, "the checkpoint's metadata has no \"epoch_seen\""},
        {"cfg", NULL, "the checkpoint's metadata has no \"cfg\""},
        // Numbers that parse but that no run reaches (a resumed fp16 run skipped every step).
        {"loss_scale", "0", "\"loss_scale\" = \"0\" is not a training state a run can reach"},
        {"loss_scale", "-1", "\"loss_scale\" = \"-1\" is not a training state"},
        {"loss_scale", "inf", "\"loss_scale\" = \"inf\" is not a training state"},
        {"loss_scale", "nan", "\"loss_scale\" = \"nan\" is not a training state"},
        {"step", "18446744073709551615", "\"step\" = \"18446744073709551615\" is not a training state"},
        {"best_val_acc", "18446744073709551616", "\"best_val_acc\" = \"18446744073709551616\" is not a training"},
        {"best_val_acc", "100.5", "\"best_val_acc\" = \"100.5\" is not a training state"},
        {"epoch_correct", "1e9", "\"epoch_correct\" = \"1e9\" is not a training state"},
        {"scaler_skipped", "4611686018427387904", "\"scaler_skipped\" = \"4611686018427387904\" is not"},
        {"plateau_best", "nan", "\"plateau_best\" = \"nan\" is not a training state"},
        {"plateau_best", "-0.5", "\"plateau_best\" = \"-0.5\" is not a training state"},
        {"lr_reductions", "4", "\"lr_reductions\" = \"4\" is not a training state"},  // epoch 3
        {"plateau_bad_epochs", "x", "\"plateau_bad_epochs\" = \"x\" is not a non-negative integer"},
        {"best_val_loss", "-inf", "\"best_val_loss\" = \"-inf\" is not a training state"},
        {"best_val_loss_epoch", "9", "\"best_val_loss_epoch\" = \"9\" is not a training state"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(path("std6.safetensors"), path("meta.safetensors"), NULL, cases[i].key,
                cases[i].value, NULL);
        char msg[1024];
        bool state_key = strcmp(cases[i].key, "cfg") != 0;  // a resume does not need the cfg
        if (state_key) {
            expect_load_error(path("meta.safetensors"), &net, true, msg, sizeof msg);
            assert_contains(msg, path("meta.safetensors"));
            assert_contains(msg, cases[i].msg);
        }
        CheckpointInfo info;
        Error err = {{0}};
        assert_int_equal(
            checkpoint_read_info(path("meta.safetensors"), &info, &(TrainState){0}, &err), -1);
        assert_contains(err.msg, cases[i].msg);
        // The weights alone do not need the TrainState.
        if (checkpoint_load_weights(path("meta.safetensors"), &net, NULL, 0, &err)) fail_msg("%s", err.msg);
    }
    net_free(&net);
}

// The plateau's and early stopping's state came later: a checkpoint without their keys
// loads as a run that has not seen a validation loss yet (inf, 0), the rest as stored.
static void test_state_before_plateau(void **state) {
    char text[1024];
    save_standard("older0.safetensors", 13, text);
    const char *keys[] = {"plateau_best", "plateau_bad_epochs", "lr_reductions", "best_val_loss",
                          "best_val_loss_epoch"};
    for (int i = 0; i < 5; i++) {  // older0 -> older1 -> ... -> older5, a key less each
        char in[32], out[32];
        snprintf(in, sizeof in, "older%d.safetensors", i);
        snprintf(out, sizeof out, "older%d.safetensors", i + 1);
        rewrite(path(in), path(out), NULL, keys[i], NULL, NULL);
    }
    TrainState st, want = sample_state();
    want.plateau = (Plateau){.best = INFINITY};
    want.best_val_loss = INFINITY;
    want.best_val_loss_epoch = 0;
    Error err = {{0}};
    if (checkpoint_read_info(path("older5.safetensors"), NULL, &st, &err)) fail_msg("%s", err.msg);
    assert_states_equal(&st, &want);
    // Written again, the fresh values read back (inf as "inf").
    StFile f;
    Net net;
    make_net(&net, NULL, "conv2", 4);
    CheckpointInfo info = {.cfg_text = text, .class_names = (char **)class_names, .classes = CLASSES};
    if (checkpoint_save(path("again.safetensors"), &net, &st, &info, &err) ||
        st_open(&f, path("again.safetensors"), &err))
        fail_msg("%s", err.msg);
    assert_string_equal(st_meta(&f, "best_val_loss"), "inf");
    st_close(&f);
    net_free(&net);
}

// F16 parameters are converted to F32 on load.
static void test_f16_weights(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, NULL, "conv2", 4);
    Net a, b;
    make_net_text(&a, text);
    make_net_text(&b, text);
    // Values that F16 holds exactly: k/64 for k in [-64, 64).
    size_t n = (size_t)a.nparams;
    float *h = calloc(3 * n, sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = (float)((int)(i * 37 % 128) - 64) / 64.0f;
    a.k->upload(a.params, h, n * sizeof *h);
    save("f32.safetensors", &a, text);
    rewrite(path("f32.safetensors"), path("f16.safetensors"), NULL, NULL, NULL, "conv");
    StFile f;
    Error err = {{0}};
    if (st_open(&f, path("f16.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_int_equal(st_find(&f, "conv2.weight")->dtype, ST_F16);
    assert_int_equal(st_find(&f, "fc1.weight")->dtype, ST_F32);
    st_close(&f);
    if (checkpoint_load_weights(path("f16.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    float *hb = snapshot(&b);
    assert_memory_equal(h, hb, n * sizeof(float));
    free(h);
    free(hb);
    net_free(&a);
    net_free(&b);
}

// ---- renaming ------------------------------------------------------------------------------

static int rename_file(const char *in, const char *out, RenameMode mode, int nrules,
                       const RenameRule *rules, int *renamed, Error *err) {
    return checkpoint_rename(path(in), path(out), rules, nrules, mode, renamed, err);
}

static void test_rename(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, NULL, "conv2", 4);
    Net a;
    make_net_text(&a, text);
    fill_random(&a, 14);
    save("orig.safetensors", &a, text);
    size_t n0, n1;
    char *before = test_read_file(path("orig.safetensors"), &n0);

    RenameRule r = {"conv1", "embed1"};
    int renamed = -1;
    Error err = {{0}};
    if (rename_file("orig.safetensors", "emb.safetensors", RENAME_SUBSTRING, 1, &r, &renamed, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 6);
    char *after = test_read_file(path("orig.safetensors"), &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);

    StFile f;
    if (st_open(&f, path("emb.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_int_equal(f.count, 18);
    const char *keys[] = {"embed1.weight",
                          "embed1.bias",
                          "optimizer.embed1.weight.square_avg",
                          "optimizer.embed1.bias.acc_delta",
                          "conv2.weight",
                          "fc1.bias"};
    for (int i = 0; i < 6; i++) assert_non_null(st_find(&f, keys[i]));
    for (int i = 0; i < f.count; i++) assert_null(strstr(f.entries[i].name, "conv1"));
    assert_string_equal(st_meta(&f, "classes"), "T-shirt/top\nTrouser\nAnkle boot\nÉ\n4");
    assert_string_equal(st_meta(&f, "step"), "12345678901");
    st_close(&f);

    // The stored cfg names the layer embed1 (its section had the default name before).
    CheckpointInfo info;
    if (checkpoint_read_info(path("emb.safetensors"), &info, NULL, &err)) fail_msg("%s", err.msg);
    Cfg cfg;
    if (cfg_parse(&cfg, info.cfg_text, "stored", &err)) fail_msg("%s", err.msg);
    CfgSection *s = layer_find_section(&cfg, "embed1");
    assert_non_null(s);
    assert_string_equal(s->name, "conv");
    assert_string_equal(cfg_entry(s, "name")->value, "embed1");
    assert_null(layer_find_section(&cfg, "conv1"));
    assert_non_null(layer_find_section(&cfg, "conv2"));
    assert_string_equal(cfg_entry(cfg_section(&cfg, "train"), "seed")->value, "7");
    // ... and a network built from that cfg loads the renamed file strictly.
    Net b;
    const NetOptions opts = net_options();
    if (net_create(&b, &cfg, INPUT, CLASSES, &opts, cpu_kernels(), &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    checkpoint_info_free(&info);
    assert_string_equal(b.layers[0]->params[0].name, "embed1.weight");
    fill_random(&b, 15);
    TrainState st;
    if (checkpoint_load_all(path("emb.safetensors"), &b, &st, &err)) fail_msg("%s", err.msg);
    float *ha = snapshot(&a), *hb = snapshot(&b);
    assert_memory_equal(ha, hb, 3 * (size_t)a.nparams * sizeof(float));
    TrainState want = sample_state();
    assert_states_equal(&st, &want);
    // The unrenamed file does not fit the renamed network, and says how to fix that.
    char msg[1024];
    expect_load_error(path("orig.safetensors"), &b, false, msg, sizeof msg);
    assert_contains(msg, "conv1=embed1");
    free(ha);
    free(hb);
    net_free(&a);
    net_free(&b);
}

// Both convolutions with one substring rule, and the suggested command's own rule.
static void test_rename_two_layers(void **state) {
    char text[1024];
    save_standard("orig2.safetensors", 16, text);
    RenameRule r = {"conv", "embed"};
    int renamed = 0;
    Error err = {{0}};
    if (rename_file("orig2.safetensors", "emb2.safetensors", RENAME_SUBSTRING, 1, &r, &renamed,
                    &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 12);
    Net b;
    make_net(&b, "embed1", "embed2", 4);
    if (checkpoint_load_all(path("emb2.safetensors"), &b, &(TrainState){0}, &err))
        fail_msg("%s", err.msg);
    net_free(&b);
    // The section types stay [conv]: only the names change.
    CheckpointInfo info;
    if (checkpoint_read_info(path("emb2.safetensors"), &info, NULL, &err)) fail_msg("%s", err.msg);
    assert_contains(info.cfg_text, "[conv]\nname = embed2\n");
    assert_null(strstr(info.cfg_text, "[embed"));
    checkpoint_info_free(&info);
}

static void test_rename_refusals(void **state) {
    save_standard("orig3.safetensors", 17, NULL);
    size_t n0, n1;
    char *before = test_read_file(path("orig3.safetensors"), &n0);
    Error err = {{0}};
    int renamed = -1;
    struct {
        RenameMode mode;
        RenameRule rules[2];
        int nrules;
        const char *msg;
    } cases[] = {
        {RENAME_SUBSTRING,
         {{"conv1", "conv2"}},
         1,
         "renaming 'conv1.bias' gives 'conv2.bias', which the file already holds; nothing was "
         "written"},
        {RENAME_WHOLE,
         {{"conv1", "x"}, {"conv2", "x"}},
         2,
         "the renaming makes two keys 'x.bias' (from 'conv1.bias' and 'conv2.bias')"},
        {RENAME_SUBSTRING,
         {{"conv1", "a."}},
         1,
         "renaming key 'conv1.bias' gives 'a..bias', whose layer name 'a.' is invalid: a part "
         "between its dots is empty"},
        {RENAME_WHOLE,
         {{"conv1", ""}},
         1,
         "renaming key 'conv1.bias' gives '.bias', whose layer name '' is invalid: it is empty"},
        {RENAME_PREFIX, {{"", "x"}}, 1, "OLD is empty"},
        // fc1 -> flatten1: no key collides, but the cfg's [flatten] layer is flatten1.
        {RENAME_WHOLE,
         {{"fc1", "flatten1"}},
         1,
         "the renaming gives two layers of its cfg the name 'flatten1'"},
        {RENAME_SUBSTRING,
         {{"conv1", "a_very_long_layer_name_that_goes_on_and_on_and_on_and_on_and_on_"}},
         1,
         "is longer than a layer name may be"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(path("refused.safetensors"));
        int rc = rename_file("orig3.safetensors", "refused.safetensors", cases[i].mode,
                             cases[i].nrules, cases[i].rules, &renamed, &err);
        if (rc != -1) fail_msg("case %zu was not refused", i);
        assert_contains(err.msg, cases[i].msg);
        assert_int_equal(renamed, 0);
        assert_false(exists(path("refused.safetensors")));
    }
    // out == in, by the same name or another path to it.
    RenameRule r = {"conv1", "embed1"};
    assert_int_equal(rename_file("orig3.safetensors", "orig3.safetensors", RENAME_SUBSTRING, 1, &r,
                                 &renamed, &err),
                     -1);
    assert_contains(err.msg, "is the input file");
    assert_int_equal(rename_file("orig3.safetensors", "./orig3.safetensors", RENAME_SUBSTRING, 1,
                                 &r, &renamed, &err),
                     -1);
    assert_contains(err.msg, "is the input file");
    // A missing input; an input that is not a checkpoint.
    assert_int_equal(rename_file("nothere.safetensors", "x.safetensors", RENAME_SUBSTRING, 1, &r,
                                 &renamed, &err),
                     -1);
    assert_contains(err.msg, "nothere.safetensors");
    // A plain state_dict (no cnn.c metadata) is renamed too (issue 33, point 9), its keys
    // alone; a file of another format is still refused.
    rewrite(path("orig3.safetensors"), path("plain3.safetensors"), NULL, "format", NULL, NULL);
    assert_int_equal(
        rename_file("plain3.safetensors", "x.safetensors", RENAME_SUBSTRING, 1, &r, &renamed, &err), 0);
    assert_true(renamed > 0 && exists(path("x.safetensors")));
    StFile px;
    if (st_open(&px, path("x.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_null(st_meta(&px, "format"));
    st_close(&px);
    assert_int_equal(remove(path("x.safetensors")), 0);
    // A stored cfg whose blocks nest deeper than a network may (its members' names would not
    // follow them), and one of more sections than a cfg holds.
    char deep[256] = "";
    for (int i = 0; i < BLOCK_MAX_DEPTH + 1; i++) strcat(deep, "[block]\n");
    strcat(deep, "[relu]\n");
    for (int i = 0; i < BLOCK_MAX_DEPTH + 1; i++) strcat(deep, "[end]\n");
    char *many = malloc((size_t)(CFG_MAX_SECTIONS + 1) * 7 + 1);
    assert_non_null(many);
    for (int i = 0; i <= CFG_MAX_SECTIONS; i++) memcpy(many + 7 * i, "[relu]\n", 8);
    const char *stored[][2] = {{deep, "blocks nest deeper than 8"}, {many, "more than 10000 sections"}};
    for (int i = 0; i < 2; i++) {
        rewrite(path("orig3.safetensors"), path("cfg3.safetensors"), NULL, "cfg", stored[i][0], NULL);
        assert_int_equal(
            rename_file("cfg3.safetensors", "x.safetensors", RENAME_SUBSTRING, 1, &r, &renamed, &err), -1);
        assert_contains(err.msg, stored[i][1]);
        assert_false(exists(path("x.safetensors")));
    }
    free(many);

    char *after = test_read_file(path("orig3.safetensors"), &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
}

// Which keys each mode renames, on files.
static void test_rename_modes(void **state) {
    save_standard("orig4.safetensors", 18, NULL);
    Error err = {{0}};
    int renamed = -1;
    RenameRule r = {"c", "k"};
    // Substring: conv1, conv2 and fc1 all hold a 'c'.
    if (rename_file("orig4.safetensors", "sub.safetensors", RENAME_SUBSTRING, 1, &r, &renamed,
                    &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 18);
    // Prefix: conv1 and conv2 only.
    if (rename_file("orig4.safetensors", "pre.safetensors", RENAME_PREFIX, 1, &r, &renamed, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 12);
    StFile f;
    if (st_open(&f, path("pre.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_non_null(st_find(&f, "konv1.weight"));
    assert_non_null(st_find(&f, "optimizer.konv2.bias.square_avg"));
    assert_non_null(st_find(&f, "fc1.weight"));
    st_close(&f);
    // Whole: "conv" is no layer's whole name; nothing renamed, nothing written.
    RenameRule w = {"conv", "embed"};
    if (rename_file("orig4.safetensors", "whole.safetensors", RENAME_WHOLE, 1, &w, &renamed, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 0);
    assert_false(exists(path("whole.safetensors")));
    RenameRule w1 = {"conv1", "embed1"};
    if (rename_file("orig4.safetensors", "whole.safetensors", RENAME_WHOLE, 1, &w1, &renamed, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 6);
    // Rules apply in order: a swap through a temporary name.
    RenameRule swap[3] = {{"conv1", "tmp"}, {"conv2", "conv1"}, {"tmp", "conv2"}};
    if (rename_file("orig4.safetensors", "swap.safetensors", RENAME_WHOLE, 3, swap, &renamed, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(renamed, 12);
    if (st_open(&f, path("swap.safetensors"), &err)) fail_msg("%s", err.msg);
    assert_int_equal(st_find(&f, "conv2.weight")->shape[1], 1);  // was conv1's
    assert_int_equal(st_find(&f, "conv1.weight")->shape[1], 4);
    st_close(&f);
    CheckpointInfo info;
    if (checkpoint_read_info(path("swap.safetensors"), &info, NULL, &err)) fail_msg("%s", err.msg);
    Cfg cfg;
    if (cfg_parse(&cfg, info.cfg_text, "stored", &err)) fail_msg("%s", err.msg);
    assert_ptr_equal(layer_find_section(&cfg, "conv2"), &cfg.sections[1]);
    assert_ptr_equal(layer_find_section(&cfg, "conv1"), &cfg.sections[2]);
    cfg_free(&cfg);
    checkpoint_info_free(&info);
}

// A cfg with a [block]: its members' names follow the block's (a prefix or a whole-name
// rule on the block renames them with it, and the renamed file loads into the network its
// stored cfg makes); a rule that would take a member out of its block is refused.
static void test_rename_block(void **state) {
    static const char *text =
        "[train]\nbatch = 4\n\n[conv]\nname = stem\nfilters = 3\nsize = 3\npad = 1\n"
        "[block]\nname = layer1.0\nactivation = relu\n"
        "[conv]\nname = conv1\nfilters = 3\nsize = 3\npad = 1\nbias = 0\n"
        "[batchnorm]\nactivation = relu6\n[conv]\nfilters = 3\nsize = 3\npad = 1\ngroups = 3\n[end]\n"
        "[global_avgpool]\n[flatten]\n[linear]\nname = fc\noutputs = 5\n[log_softmax]\n";
    Net a;
    make_net_text(&a, text);
    fill_random(&a, 21);
    save("block.safetensors", &a, text);
    float *ha = snapshot(&a);
    const RenameRule r = {"layer1.0", "stage1.0"};
    const RenameMode modes[2] = {RENAME_PREFIX, RENAME_WHOLE};
    for (int m = 0; m < 2; m++) {
        Error err = {{0}};
        int renamed = -1;
        if (rename_file("block.safetensors", "block-r.safetensors", modes[m], 1, &r, &renamed, &err))
            fail_msg("%s", err.msg);
        // conv1's weight, the batchnorm's weight and bias, the depthwise conv's weight and
        // bias, each with Adadelta's 2 states (15), and the batchnorm's 3 buffers.
        assert_int_equal(renamed, 18);
        CheckpointInfo info;
        if (checkpoint_read_info(path("block-r.safetensors"), &info, NULL, &err)) fail_msg("%s", err.msg);
        Cfg cfg;
        if (cfg_parse(&cfg, info.cfg_text, "stored", &err)) fail_msg("%s", err.msg);
        assert_non_null(layer_find_section(&cfg, "stage1.0.conv1"));
        assert_non_null(layer_find_section(&cfg, "stage1.0.2"));
        Net b;
        const NetOptions opts = net_options();
        if (net_create(&b, &cfg, INPUT, CLASSES, &opts, cpu_kernels(), &err) ||
            checkpoint_load_weights(path("block-r.safetensors"), &b, NULL, 0, &err))
            fail_msg("%s", err.msg);
        float *hb = snapshot(&b);
        assert_memory_equal(ha, hb, (size_t)a.nparams * sizeof(float));
        free(hb);
        net_free(&b);
        cfg_free(&cfg);
        checkpoint_info_free(&info);
        remove(path("block-r.safetensors"));
    }
    const RenameRule out = {"layer1.0.conv1", "conv9"};
    Error err = {{0}};
    int renamed = -1;
    assert_int_equal(rename_file("block.safetensors", "block-x.safetensors", RENAME_PREFIX, 1, &out, &renamed, &err), -1);
    assert_non_null(strstr(err.msg, "not under its block's new name 'layer1.0'"));
    assert_false(exists(path("block-x.safetensors")));
    free(ha);
    net_free(&a);
}

// checkpoint_rename_key: the layer part only, every occurrence, rules in order.
static void test_rename_key(void **state) {
    char out[TENSOR_NAME_MAX];
    RenameRule w = {"weight", "w"};
    assert_int_equal(
        checkpoint_rename_key("conv1.weight", &w, 1, RENAME_SUBSTRING, out, sizeof out), 0);
    assert_string_equal(out, "conv1.weight");
    assert_int_equal(checkpoint_rename_key("optimizer.conv1.weight.square_avg", &w, 1,
                                           RENAME_SUBSTRING, out, sizeof out),
                     0);
    RenameRule o = {"optimizer", "x"};
    assert_int_equal(checkpoint_rename_key("optimizer.conv1.weight.square_avg", &o, 1,
                                           RENAME_SUBSTRING, out, sizeof out),
                     0);
    RenameRule x = {"X", "YY"};
    assert_int_equal(checkpoint_rename_key("aXbX.bias", &x, 1, RENAME_SUBSTRING, out, sizeof out),
                     1);
    assert_string_equal(out, "aYYbYY.bias");
    assert_int_equal(checkpoint_rename_key("aXbX.bias", &x, 1, RENAME_PREFIX, out, sizeof out), 0);
    assert_int_equal(checkpoint_rename_key("XbX.bias", &x, 1, RENAME_PREFIX, out, sizeof out), 1);
    assert_string_equal(out, "YYbX.bias");
    assert_int_equal(
        checkpoint_rename_key("optimizer.XbX.bias.acc_delta", &x, 1, RENAME_WHOLE, out, sizeof out),
        0);
    assert_int_equal(
        checkpoint_rename_key("optimizer.X.bias.acc_delta", &x, 1, RENAME_WHOLE, out, sizeof out),
        1);
    assert_string_equal(out, "optimizer.YY.bias.acc_delta");
    RenameRule chain[2] = {{"a", "b"}, {"b", "c"}};
    assert_int_equal(
        checkpoint_rename_key("ab.weight", chain, 2, RENAME_SUBSTRING, out, sizeof out), 1);
    assert_string_equal(out, "cc.weight");
    RenameRule empty = {"", "x"};
    assert_int_equal(
        checkpoint_rename_key("a.weight", &empty, 1, RENAME_SUBSTRING, out, sizeof out), -1);
    assert_int_equal(checkpoint_rename_key("abc.weight", &x, 1, RENAME_SUBSTRING, out, 5), -1);
}

// ---- the ckpt tool -------------------------------------------------------------------------

// Runs `ckpt ARGS > out 2>&1`; returns the exit status and the output in *text (free it).
static int run_ckpt(const char *args, char **text) {
    static char cmd[3 * PATH_MAX];
    int w = snprintf(cmd, sizeof cmd, "'%s/ckpt' %s > '%s' 2>&1", g_root, args, path("ckpt.out"));
    assert_true(w > 0 && (size_t)w < sizeof cmd);
    int rc = system(cmd);
    assert_true(rc != -1 && WIFEXITED(rc));
    size_t n;
    *text = test_read_file(path("ckpt.out"), &n);
    return WEXITSTATUS(rc);
}

static void test_ckpt_tool(void **state) {
    char bin[PATH_MAX + 8];
    snprintf(bin, sizeof bin, "%s/ckpt", g_root);
    if (access(bin, X_OK)) {
        print_message("skipped: %s is not built (make ckpt)\n", bin);
        skip();
    }
    save_standard("t1.safetensors", 19, NULL);
    save_standard("t2.safetensors", 20, NULL);
    char a[1024], *out;
    snprintf(a, sizeof a, "ls %s", path("t1.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 0);
    assert_contains(out, "conv1.weight");
    assert_contains(out, "F32");
    assert_contains(out, "[4, 1, 3, 3]");
    assert_contains(out, "optimizer.fc1.bias.acc_delta");
    assert_contains(out, CHECKPOINT_FORMAT);
    assert_contains(out, "T-shirt/top");
    assert_contains(out, "    [train]");
    free(out);

    snprintf(a, sizeof a, "diff %s %s", path("t1.safetensors"), path("t1.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 0);
    free(out);
    snprintf(a, sizeof a, "diff %s %s", path("t1.safetensors"), path("t2.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 1);
    assert_contains(out, "conv1.weight");
    assert_contains(out, "max abs");
    free(out);

    snprintf(a, sizeof a, "rename %s %s conv1=embed1", path("t1.safetensors"),
             path("t3.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 0);
    assert_contains(out, "conv1.weight -> embed1.weight");
    assert_contains(out, "optimizer.conv1.bias.acc_delta -> optimizer.embed1.bias.acc_delta");
    free(out);
    snprintf(a, sizeof a, "diff %s %s", path("t1.safetensors"), path("t3.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 1);
    assert_contains(out, "only in A");
    assert_contains(out, "only in B");
    free(out);

    snprintf(a, sizeof a, "rename %s %s nomatch=x --whole", path("t1.safetensors"),
             path("t4.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 1);
    assert_contains(out, "no key matched");
    assert_false(exists(path("t4.safetensors")));
    free(out);

    snprintf(a, sizeof a, "rename %s %s conv1=conv2", path("t1.safetensors"),
             path("t4.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 2);
    assert_contains(out, "ckpt: ");
    assert_contains(out, "already holds");
    free(out);

    snprintf(a, sizeof a, "export %s %s", path("t1.safetensors"), path("t1plain.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 0);
    assert_contains(out, "wrote");
    free(out);
    snprintf(a, sizeof a, "ls %s", path("t1plain.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 0);
    assert_contains(out, "conv1.weight");
    assert_true(!strstr(out, "optimizer.") && !strstr(out, CHECKPOINT_FORMAT));
    free(out);
    assert_int_equal(run_ckpt("export onlyone", &out), 2);
    free(out);

    assert_int_equal(run_ckpt("", &out), 2);
    assert_contains(out, "usage");
    free(out);
    assert_int_equal(run_ckpt("--help", &out), 0);
    assert_contains(out, "rename IN OUT OLD=NEW");
    free(out);
    assert_int_equal(run_ckpt("frobnicate x", &out), 2);
    free(out);
    snprintf(a, sizeof a, "ls %s", path("nothere.safetensors"));
    assert_int_equal(run_ckpt(a, &out), 2);
    assert_contains(out, "ckpt: ");
    free(out);
}

// ---- main ----------------------------------------------------------------------------------

static int suite_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_checkpoint"); }

static int suite_teardown(void **state) { return test_remove_tree(g_dir); }

// ---- batchnorm buffers and plain state_dicts -------------------------------------------------

// A small ResNet with torchvision's names: a stem conv without bias and batchnorm, a
// downsampling block, pooling and the classifier fc.
static const char *resnet_text =
    "[train]\nbatch = 4\nseed = 7\n"
    "[conv]\nname = conv1\nfilters = 3\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nfilters = 4\nstride = 2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 5\n[log_softmax]\n";

// Random values in the buffers too: running statistics (positive variances) and counters.
static void fill_random_buffers(Net *net, uint64_t seed) {
    g_rng = seed;
    for (int m = 0; m < net->nmodules; m++) {
        Layer *l = net->modules[m];
        for (int j = 0; j < l->nbuffers; j++) {
            Tensor *t = &l->buffers[j];
            if (t->dtype == DT_I64) {
                *(int64_t *)t->data = (int64_t)(1000 * (frand() + 1));
                continue;
            }
            float v[64];
            const int64_t n = tensor_numel(t);
            assert_true(n <= 64);
            for (int64_t i = 0; i < n; i++) v[i] = j == 1 ? 1.5f + frand() : frand();
            net->k->upload(t->data, v, (size_t)n * sizeof(float));
        }
    }
}

// The buffers' bytes (F32 values, then the counters) of every module, concatenated.
static size_t buffer_snapshot(const Net *net, char *out, size_t cap) {
    size_t n = 0;
    for (int m = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++) {
            const Tensor *t = &net->modules[m]->buffers[j];
            const size_t b = tensor_bytes(t);
            assert_true(n + b <= cap);
            if (t->dtype == DT_I64) memcpy(out + n, t->data, b);
            else net->k->download(out + n, t->data, b);
            n += b;
        }
    return n;
}

// The two networks hold the same bytes: the first `values` floats of their parameter blocks
// (nparams, or 3 x nparams with the optimizer state) and every buffer, counters included.
static void expect_same_model(const Net *a, const Net *b, size_t values) {
    float *ha = snapshot(a), *hb = snapshot(b);
    assert_memory_equal(ha, hb, values * sizeof(float));
    char ba[4096], bb[4096];
    const size_t na = buffer_snapshot(a, ba, sizeof ba);
    assert_int_equal(buffer_snapshot(b, bb, sizeof bb), na);
    assert_memory_equal(ba, bb, na);
    free(ha), free(hb);
}

// Copies checkpoint `in` to `out` as a plain state_dict, as PyTorch's save_file writes it:
// the model's tensors only (no optimizer, no metadata), except `drop` (a name, or NULL);
// `as_f32` (a name, or NULL) is stored as F32 instead of its dtype; `extra` adds a tensor.
static void write_plain(const char *in, const char *out, const char *drop, const char *as_f32,
                        const Tensor *extra) {
    StFile f;
    Error err = {{0}};
    if (st_open(&f, in, &err)) fail_msg("%s", err.msg);
    Tensor *t = calloc((size_t)f.count + 1, sizeof *t);
    assert_non_null(t);
    float one = 1.0f;
    int n = 0;
    for (int i = 0; i < f.count; i++) {
        const StEntry *e = &f.entries[i];
        if (!strncmp(e->name, "optimizer.", 10) || (drop && !strcmp(e->name, drop))) continue;
        if (st_as_tensor(&f, e, &t[n], &err)) fail_msg("%s", err.msg);
        if (as_f32 && !strcmp(e->name, as_f32)) t[n].dtype = DT_F32, t[n].data = &one;
        n++;
    }
    if (extra) t[n++] = *extra;
    if (st_write(out, t, n, NULL, NULL, 0, &err)) fail_msg("%s", err.msg);
    free(t);
    st_close(&f);
}

// Parameters, batchnorm buffers (I64 counters included) and optimizer state round-trip;
// the file holds PyTorch's state_dict keys, and no optimizer state for buffers.
static void test_batchnorm_round_trip(void **state) {
    Net a, b;
    make_net_text(&a, resnet_text);
    make_net_text(&b, resnet_text);
    fill_random(&a, 11);
    fill_random_buffers(&a, 12);
    fill_random(&b, 13);
    fill_random_buffers(&b, 14);
    save("bn.safetensors", &a, resnet_text);
    StFile f;
    Error err = {{0}};
    if (st_open(&f, path("bn.safetensors"), &err)) fail_msg("%s", err.msg);
    const StEntry *e = st_find(&f, "bn1.num_batches_tracked");
    assert_non_null(e);
    assert_int_equal(e->dtype, ST_I64);
    assert_int_equal(e->ndim, 0);
    e = st_find(&f, "layer1.0.downsample.1.running_var");
    assert_non_null(e);
    assert_int_equal(e->dtype, ST_F32);
    assert_int_equal(e->shape[0], 4);
    assert_non_null(st_find(&f, "layer1.0.conv2.weight"));
    assert_null(st_find(&f, "conv1.bias"));  // bias = 0
    assert_null(st_find(&f, "optimizer.bn1.running_mean.square_avg"));
    assert_non_null(st_find(&f, "optimizer.bn1.weight.square_avg"));
    // 14 parameters (with 2 optimizer tensors each) and 4 batchnorms' 3 buffers.
    assert_int_equal(f.count, 14 * 3 + 4 * 3);
    st_close(&f);

    TrainState st;
    if (checkpoint_load_all(path("bn.safetensors"), &b, &st, &err)) fail_msg("%s", err.msg);
    expect_same_model(&a, &b, 3 * (size_t)a.nparams);
    net_free(&a);
    net_free(&b);
}

// A plain state_dict (PyTorch's safetensors.torch.save_file: no metadata) loads as
// weights; num_batches_tracked may be missing (0, as PyTorch does); a counter must be I64;
// it cannot resume.
static void test_plain_state_dict(void **state) {
    Net a, b;
    make_net_text(&a, resnet_text);
    make_net_text(&b, resnet_text);
    fill_random(&a, 21);
    fill_random_buffers(&a, 22);
    fill_random_buffers(&b, 23);
    save("bnsrc.safetensors", &a, resnet_text);
    write_plain(path("bnsrc.safetensors"), path("plain_sd.safetensors"), NULL, NULL, NULL);
    Error err = {{0}};
    if (checkpoint_load_weights(path("plain_sd.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    expect_same_model(&a, &b, (size_t)a.nparams);
    TrainState st;
    assert_int_equal(checkpoint_load_all(path("plain_sd.safetensors"), &b, &st, &err), -1);
    assert_contains(err.msg, "not a cnn.c checkpoint");

    // Without num_batches_tracked: the counter is 0.
    write_plain(path("bnsrc.safetensors"), path("nocount.safetensors"), "bn1.num_batches_tracked",
                NULL, NULL);
    if (checkpoint_load_weights(path("nocount.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    assert_int_equal(*(int64_t *)b.layers[1]->buffers[2].data, 0);
    // A counter stored as F32 is refused; a running_var missing too.
    write_plain(path("bnsrc.safetensors"), path("f32count.safetensors"), NULL,
                "bn1.num_batches_tracked", NULL);
    assert_int_equal(checkpoint_load_weights(path("f32count.safetensors"), &b, NULL, 0, &err), -1);
    assert_contains(err.msg, "bn1.num_batches_tracked is F32 in the file, not I64");
    write_plain(path("bnsrc.safetensors"), path("novar.safetensors"), "layer1.0.bn2.running_var",
                NULL, NULL);
    assert_int_equal(checkpoint_load_weights(path("novar.safetensors"), &b, NULL, 0, &err), -1);
    assert_contains(err.msg, "missing keys (1): layer1.0.bn2.running_var");
    net_free(&a);
    net_free(&b);
}

// ./ckpt export's state_dict: every model tensor of the checkpoint with its bytes (the
// batchnorm buffers and I64 counters included), no optimizer tensor, no metadata; it
// loads as weights to the same values; exporting onto the input is refused.
static void test_export(void **state) {
    Net a, b;
    make_net_text(&a, resnet_text);
    make_net_text(&b, resnet_text);
    fill_random(&a, 31);
    fill_random_buffers(&a, 32);
    fill_random_buffers(&b, 33);
    save("exsrc.safetensors", &a, resnet_text);
    Error err = {{0}};
    int n;
    if (checkpoint_export(path("exsrc.safetensors"), path("exported.safetensors"), &n, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(n, 14 + 4 * 3);  // parameters, batchnorm buffers
    StFile src, out;
    if (st_open(&src, path("exsrc.safetensors"), &err) || st_open(&out, path("exported.safetensors"), &err))
        fail_msg("%s", err.msg);
    assert_int_equal(out.count, n);
    assert_int_equal(out.nmeta, 0);
    for (int i = 0; i < src.count; i++) {
        const StEntry *e = &src.entries[i], *x = st_find(&out, e->name);
        if (!strncmp(e->name, CHECKPOINT_OPTIMIZER_PREFIX, strlen(CHECKPOINT_OPTIMIZER_PREFIX))) {
            assert_null(x);
            continue;
        }
        assert_non_null(x);
        assert_int_equal(x->dtype, e->dtype);
        assert_int_equal(x->bytes, e->bytes);
        assert_memory_equal(x->data, e->data, e->bytes);
    }
    st_close(&src);
    st_close(&out);
    if (checkpoint_load_weights(path("exported.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    expect_same_model(&a, &b, (size_t)a.nparams);
    assert_int_equal(checkpoint_export(path("exsrc.safetensors"), path("exsrc.safetensors"), &n, &err), -1);
    assert_contains(err.msg, "is the input file");
    assert_int_equal(checkpoint_export(path("nothere.safetensors"), path("x.safetensors"), &n, &err), -1);
    assert_contains(err.msg, "nothere.safetensors");
    net_free(&a);
    net_free(&b);
}

// init_skip: the named layers keep their values and the file's tensors under those names
// are neither needed nor checked (a 7-class head loads into a 5-class network).
static void test_init_skip(void **state) {
    char text7[2048];
    snprintf(text7, sizeof text7, "%s", resnet_text);
    char *o = strstr(text7, "outputs = 5");
    assert_non_null(o);
    o[10] = '7';
    Net big, b;
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text7, "t.cfg", &err)) fail_msg("%s", err.msg);
    const NetOptions opts = net_options();
    if (net_create(&big, &cfg, INPUT, 7, &opts, cpu_kernels(), &err)) fail_msg("%s", err.msg);
    cfg_free(&cfg);
    fill_random(&big, 31);
    fill_random_buffers(&big, 32);
    TrainState st = sample_state();
    const char *names7[7] = {"a", "b", "c", "d", "e", "f", "g"};
    CheckpointInfo info = {.cfg_text = text7, .class_names = (char **)names7, .classes = 7};
    if (checkpoint_save(path("big.safetensors"), &big, &st, &info, &err)) fail_msg("%s", err.msg);
    const float extra_v = 3.0f;
    const Tensor extra = {.name = "fc.extra", .dtype = DT_F32, .ndim = 1, .shape = {1},
                          .data = (void *)&extra_v};
    write_plain(path("big.safetensors"), path("big_plain.safetensors"), NULL, NULL, &extra);

    make_net_text(&b, resnet_text);
    fill_random(&b, 33);
    float *before = snapshot(&b);
    // Without the skip: fc's shapes differ and fc.extra is unexpected.
    assert_int_equal(checkpoint_load_weights(path("big_plain.safetensors"), &b, NULL, 0, &err), -1);
    assert_contains(err.msg, "fc.weight is [7, 4] in the file but [5, 4] in the network");
    assert_contains(err.msg, "unexpected keys (1): fc.extra");
    assert_null(strstr(err.msg, "init_skip"));  // an unexpected key: not a pure classifier swap
    // A 7-class head against a 5-class network, nothing else different: init_skip=fc named
    // (issue 33, point 9).
    write_plain(path("big.safetensors"), path("big_head.safetensors"), NULL, NULL, NULL);
    assert_int_equal(checkpoint_load_weights(path("big_head.safetensors"), &b, NULL, 0, &err), -1);
    assert_contains(err.msg, "with init=, init_skip=fc loads the rest and starts those layers fresh");
    const char *skip[] = {"fc"};
    if (checkpoint_load_weights(path("big_plain.safetensors"), &b, skip, 1, &err)) fail_msg("%s", err.msg);
    float *after = snapshot(&b), *src = snapshot(&big);
    // Every parameter but fc's (the last 4 * 5 + 5) came from the file; fc kept its own.
    const size_t nfc = 4 * 5 + 5, nrest = (size_t)b.nparams - nfc;
    assert_memory_equal(after, src, nrest * sizeof(float));
    assert_memory_equal(after + nrest, before + nrest, nfc * sizeof(float));
    // A whole stage can be skipped by its module name.
    const char *skip2[] = {"layer1", "fc"};
    fill_random(&b, 34);
    free(before);
    before = snapshot(&b);
    if (checkpoint_load_weights(path("big_plain.safetensors"), &b, skip2, 2, &err)) fail_msg("%s", err.msg);
    free(after);
    after = snapshot(&b);
    assert_memory_equal(after, src, 27 * sizeof(float) + 6 * sizeof(float));  // conv1, bn1
    assert_memory_equal(after + 33, before + 33, ((size_t)b.nparams - 33) * sizeof(float));
    free(before), free(after), free(src);
    net_free(&b);
    net_free(&big);
}

// Every value of the metadata besides the TrainState is checked where it is read, whoever
// reads it: an input shape that no image decodes to (the forged 2- or 4-channel checkpoint
// that made --predict write past its buffer), class lists that checkpoint_save would not
// write, a stored cfg that does not parse or whose [data] contradicts the input.
static void test_bad_info(void **state) {
    char text[1024];
    cfg_text(text, sizeof text, "conv1", "conv2", 4);
    Net net;
    make_net_text(&net, text);
    fill_random(&net, 8);
    save("info.safetensors", &net, text);
    char bad_cfg[1200], bad_crop[1200], cropped[1200];
    snprintf(bad_cfg, sizeof bad_cfg, "[data]\nchannels = 3\n%s", text);
    snprintf(bad_crop, sizeof bad_crop, "[data]\nwidth = 8\nheight = 8\ncenter_crop = 6\n%s", text);
    snprintf(cropped, sizeof cropped, "[data]\nwidth = 12\nheight = 10\ncenter_crop = 8\n%s", text);
    const struct {
        const char *key, *value, *msg;
    } cases[] = {
        {"input", "2,8,8", "metadata \"input\" = \"2,8,8\" is not an input shape C,H,W that images decode to"},
        {"input", "4,8,8", "\"input\" = \"4,8,8\" is not an input shape"},
        {"input", "0,8,8", "\"input\" = \"0,8,8\" is not an input shape"},
        {"input", "1,16385,8", "\"input\" = \"1,16385,8\" is not an input shape"},
        {"input", "1,8,-8", "\"input\" = \"1,8,-8\" is not an input shape"},
        {"input", "1,8,8,", "\"input\" = \"1,8,8,\" is not an input shape"},
        {"classes", "", "metadata \"classes\" names no classes"},
        {"classes", "a\n\nb", "holds an empty class name"},
        {"classes", "a\nb\n", "holds an empty class name"},
        {"classes", "a\r\nb", "holds a broken class name"},
        {"cfg", "[train\nbatch = 4\n", "(its stored cfg)"},
        {"cfg", bad_cfg, "the stored cfg's [data] channels disagrees with the metadata's input 1,8,8"},
        {"cfg", bad_crop, "the stored cfg's [data] center_crop disagrees with the metadata's input 1,8,8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(path("info.safetensors"), path("meta.safetensors"), NULL, cases[i].key,
                cases[i].value, NULL);
        Error err = {{0}};
        assert_int_equal(checkpoint_read_info(path("meta.safetensors"), NULL, NULL, &err), -1);
        assert_contains(err.msg, path("meta.safetensors"));
        assert_contains(err.msg, cases[i].msg);
    }
    // The centre 8 x 8 of images stretched to 12 x 10: the input.
    rewrite(path("info.safetensors"), path("meta.safetensors"), NULL, "cfg", cropped, NULL);
    CheckpointInfo read = {0};
    Error err = {{0}};
    if (checkpoint_read_info(path("meta.safetensors"), &read, NULL, &err)) fail_msg("%s", err.msg);
    checkpoint_info_free(&read);
    // A network whose input is no image's is not written either.
    Net two;
    Cfg cfg;
    if (cfg_parse(&cfg, text, "t.cfg", &err)) fail_msg("%s", err.msg);
    const NetOptions opts = net_options();
    if (net_create(&two, &cfg, (Shape){.c = 2, .h = 8, .w = 8}, CLASSES, &opts, cpu_kernels(), &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    TrainState st = sample_state();
    CheckpointInfo info = {.cfg_text = text, .class_names = (char **)class_names, .classes = CLASSES};
    assert_int_equal(checkpoint_save(path("two.safetensors"), &two, &st, &info, &err), -1);
    assert_contains(err.msg, "input 2x8x8 is not one that images decode to");
    net_free(&two);
    net_free(&net);
}

// Values no trained network has are refused by every load, naming the tensors, and leave
// the network as it was: NaN and infinite weights (a run that diverged), a negative running
// variance or counter, a counter the next forward would overflow, negative optimizer state
// that averages squares; and an epoch loss that is not finite.
static void test_bad_values(void **state) {
    Net a, b;
    make_net_text(&a, resnet_text);
    make_net_text(&b, resnet_text);
    fill_random(&a, 21);
    fill_random_buffers(&a, 22);
    save("good.safetensors", &a, resnet_text);
    static const struct {
        const char *key;
        float value;
        int64_t counter;
        const char *msg;
    } cases[] = {
        {"conv1.weight", NAN, 0, "conv1.weight (1 of 27 values NaN or infinite)"},
        {"fc.bias", INFINITY, 0, "fc.bias (1 of 5 values NaN or infinite)"},
        {"bn1.running_mean", -INFINITY, 0, "bn1.running_mean (1 of 3 values NaN or infinite)"},
        {"bn1.running_var", -0.5f, 0, "bn1.running_var (1 of 3 values negative)"},
        {"bn1.num_batches_tracked", 0, -3, "bn1.num_batches_tracked (1 of 1 values negative)"},
        {"bn1.num_batches_tracked", 0, INT64_MAX, "bn1.num_batches_tracked (1 of 1 values 2^62 or more)"},
        {"optimizer.fc.weight.square_avg", -1e-3f, 0, "optimizer.fc.weight.square_avg (1 of"},
        {"optimizer.bn1.bias.acc_delta", NAN, 0, "optimizer.bn1.bias.acc_delta (1 of 3 values NaN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        StFile f;
        Error err = {{0}};
        if (st_open(&f, path("good.safetensors"), &err)) fail_msg("%s", err.msg);
        Tensor *t = calloc((size_t)f.count, sizeof *t);
        const char **keys = calloc((size_t)f.nmeta, sizeof *keys), **values = calloc((size_t)f.nmeta, sizeof *values);
        char *data = malloc(f.file_bytes);
        assert_true(t && keys && values && data);
        size_t off = 0;
        for (int k = 0; k < f.count; k++) {
            if (st_as_tensor(&f, &f.entries[k], &t[k], &err)) fail_msg("%s", err.msg);
            const size_t bytes = tensor_bytes(&t[k]);
            memcpy(data + off, t[k].data, bytes);
            t[k].data = data + off;
            if (!strcmp(t[k].name, cases[i].key)) {
                if (t[k].dtype == DT_I64) memcpy(t[k].data, &cases[i].counter, sizeof(int64_t));
                else memcpy(t[k].data, &cases[i].value, sizeof(float));
            }
            off += bytes;
        }
        for (int k = 0; k < f.nmeta; k++) keys[k] = f.meta[k].key, values[k] = f.meta[k].value;
        if (st_write(path("bad.safetensors"), t, f.count, keys, values, f.nmeta, &err)) fail_msg("%s", err.msg);
        st_close(&f);
        free(t), free(keys), free(values), free(data);
        char msg[1024];
        expect_load_error(path("bad.safetensors"), &b, true, msg, sizeof msg);
        assert_contains(msg, cases[i].msg);
        assert_contains(msg, "holds values no trained network has");
        if (strncmp(cases[i].key, "optimizer.", 10)) {  // the weights alone: refused too
            expect_load_error(path("bad.safetensors"), &b, false, msg, sizeof msg);
            assert_contains(msg, cases[i].msg);
        } else if (checkpoint_load_weights(path("bad.safetensors"), &b, NULL, 0, &err)) {
            fail_msg("the weights are good: %s", err.msg);
        }
    }
    rewrite(path("good.safetensors"), path("bad.safetensors"), NULL, "epoch_loss", "nan", NULL);
    char msg[1024];
    expect_load_error(path("bad.safetensors"), &b, true, msg, sizeof msg);
    assert_contains(msg, "\"epoch_loss\" = \"nan\" is not a training state a run can reach");
    net_free(&a);
    net_free(&b);
}

int main(int argc, char **argv) {
    (void)argc;
    test_find_root(g_root, sizeof g_root, argv[0], "nn/checkpoint.h");  // for ./ckpt
    cpu_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_load_weights_only),
        cmocka_unit_test(test_file_layout),       cmocka_unit_test(test_save_errors),
        cmocka_unit_test(test_renamed_layer),     cmocka_unit_test(test_renamed_two_layers),
        cmocka_unit_test(test_shape_mismatch),    cmocka_unit_test(test_no_optimizer),
        cmocka_unit_test(test_not_a_checkpoint),  cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_state_before_plateau),
        cmocka_unit_test(test_bad_info),          cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_f16_weights),       cmocka_unit_test(test_rename),
        cmocka_unit_test(test_rename_two_layers), cmocka_unit_test(test_rename_refusals),
        cmocka_unit_test(test_rename_modes),
        cmocka_unit_test(test_rename_block),      cmocka_unit_test(test_rename_key),
        cmocka_unit_test(test_ckpt_tool),         cmocka_unit_test(test_batchnorm_round_trip),
        cmocka_unit_test(test_plain_state_dict),  cmocka_unit_test(test_init_skip),
        cmocka_unit_test(test_export),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
