// test_quant.c: compressed optimizer state (nn/quant.h, Kernels.optim_step_packed) and
// compressed activations (Kernels.act_pack and act_unpack).
//
// The maps against the paper's definition (bitsandbytes' create_dynamic_map: its first,
// middle and last values, 127 of each sign, ascending); the nearest-code search against a
// scan of all 256 codes; bf16 rounding against a reference written out bit by bit; the
// packed step of each rule and format against the fp32 kernel run on the read-back state,
// then rounded by the scan (the parameters bit for bit, the codes and absmax equal): what
// the kernel must do, and nothing else; the plan's bytes; a network trained with int8 state
// ending near the fp32 one, and bf16 nearer; a checkpoint of one format refused by a run of
// another, naming the key. The fused update and checkpoints with compressed state are
// test_optim's (fused against unfused, resumed against uninterrupted, bit for bit).
//
// Activations: the CPU kernel's records (vectorised on whole groups) are quant.h's group
// function's, byte for byte, on ReLU outputs, signed values, constant groups, signed zeros,
// a NaN and short groups; zeros and signs survive; the quantizer is unbiased (the mean of
// many roundings converges to each value at the rate its predicted variance gives); and a
// network's gradient with compressed activations is the exact one in expectation over
// seeds, within the variance measured: 2-bit with convolutions and linear layers, 8-, 4- and
// 2-bit with batchnorm + ReLU (whose mask must come from the output, not from the codes of
// its input: from those it was biased by 100 times the noise of the mean at 8 bits). That
// checkpointed and plain runs round the same way is test_segments's.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/quant.h"
#include "testutil.h"

static float map[QUANT_MAP_FLOATS];

static int setup(void **state) {
    quant_map_fill(map);
    return 0;
}

// The paper's maps: bitsandbytes' create_dynamic_map(signed) with 7 exponent bits.
static void test_maps(void **state) {
    const float *sm = map + QUANT_SIGNED, *um = map + QUANT_UNSIGNED;
    for (int c = 1; c < 256; c++) {
        if (!(sm[c - 1] < sm[c])) fail_msg("signed map not ascending at %d: %g, %g", c, sm[c - 1], sm[c]);
        if (!(um[c - 1] < um[c])) fail_msg("unsigned map not ascending at %d: %g, %g", c, um[c - 1], um[c]);
    }
    assert_true(sm[QUANT_SIGNED_ZERO] == 0.0f && um[0] == 0.0f);
    assert_true(sm[255] == 1.0f && um[255] == 1.0f);
    // Their values as create_dynamic_map gives them.
    assert_true(fabsf(sm[0] - -0.99296875f) < 1e-7f && fabsf(sm[254] - 0.99296875f) < 1e-7f);
    assert_true(fabsf(sm[128] - 5.5e-7f) < 1e-12f && fabsf(sm[126] - -5.5e-7f) < 1e-12f);
    assert_true(fabsf(um[1] - 3.25e-7f) < 1e-12f && fabsf(um[2] - 7.75e-7f) < 1e-12f);
    assert_true(fabsf(um[254] - 0.996484375f) < 1e-7f);
    // Symmetric but for 1.0: code c and 254 - c are a value and its negative.
    for (int c = 0; c < QUANT_SIGNED_ZERO; c++) assert_true(sm[c] == -sm[254 - c]);
    for (int c = 0; c < 256; c++)
        assert_true(map[QUANT_SIGNED + c] == quant_map_value(1, c) && um[c] == quant_map_value(0, c));
}

// The nearest code by a scan of all 256 (ties to the lower).
static int scan_nearest(const float *m, float x) {
    int best = 0;
    for (int c = 1; c < 256; c++)
        if (fabsf(x - m[c]) < fabsf(x - m[best])) best = c;
    return best;
}

#define SUB(a, b) ((a) - (b))

static int search(const float *m, float x) {
    int c;
    QUANT_NEAREST(m, x, SUB, c);
    return c;
}

static void test_nearest(void **state) {
    for (int s = 0; s < 2; s++) {
        const float *m = map + (s ? QUANT_SIGNED : QUANT_UNSIGNED);
        const float lo = s ? -1.0f : 0.0f;
        // Every code, the midpoints between neighbours (ties: the lower), beyond the ends.
        for (int c = 0; c < 256; c++) assert_int_equal(search(m, m[c]), c);
        for (int c = 0; c < 255; c++) {
            const float mid = (m[c] + m[c + 1]) / 2;
            assert_int_equal(search(m, mid), scan_nearest(m, mid));
        }
        assert_int_equal(search(m, lo - 0.5f), scan_nearest(m, lo - 0.5f));
        assert_int_equal(search(m, 1.5f), 255);
        // Random values over the range, and small ones (each decade).
        test_rng_seed(3 + s);
        for (int i = 0; i < 200000; i++) {
            float x = (float)(lo + (1.0 - lo) * test_urand());
            if (i & 1) x *= powf(10.0f, -(float)(test_urand64() % 8));
            if (search(m, x) != scan_nearest(m, x))
                fail_msg("%s map: %.9g -> code %d, the scan says %d", s ? "signed" : "unsigned", x,
                         search(m, x), scan_nearest(m, x));
        }
    }
    // A tiny value of either sign rounds to 0 (a decaying momentum reaches it).
    const float *sm = map + QUANT_SIGNED;
    assert_int_equal(search(sm, 1e-9f), QUANT_SIGNED_ZERO);
    assert_int_equal(search(sm, -1e-9f), QUANT_SIGNED_ZERO);
    assert_int_equal(search(sm, 0.0f), QUANT_SIGNED_ZERO);
}

// bf16 by its definition: the top 16 bits, rounded to nearest even on the 16 below.
static uint16_t bf16_ref(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
    const uint32_t top = x >> 16, rest = x & 0xffff;
    if (rest > 0x8000 || (rest == 0x8000 && (top & 1))) return (uint16_t)(top + 1);
    return (uint16_t)top;
}

static void test_bf16(void **state) {
    test_rng_seed(5);
    for (int i = 0; i < 1000000; i++) {
        uint32_t x = (uint32_t)test_urand64();
        if (i % 4 == 0) x = (x & 0xffff0000u) | 0x8000u;  // exact ties
        float f;
        memcpy(&f, &x, 4);
        const uint16_t h = bf16_from_float(f);
        if (h != bf16_ref(f)) fail_msg("bf16 of 0x%08x: 0x%04x, want 0x%04x", x, h, bf16_ref(f));
        if (!isnan(f)) {
            assert_true(isnan(bf16_to_float(h)) == 0);
            if (isfinite(bf16_to_float(h)))  // within half a unit of bf16's 8 bits
                assert_true(fabsf(bf16_to_float(h) - f) <= fabsf(f) * (1.0f / 256) + 1e-38f);
        }
    }
    const float big = 3.4e38f;  // rounds up to infinity, as the definition says
    assert_true(isinf(bf16_to_float(bf16_from_float(big))));
}

// ---- the packed step ---------------------------------------------------------------------

enum { N = 2 * QUANT_BLOCK + 905 };  // two whole blocks and a partial one

typedef struct Rule {
    const char *name;
    StepScalars r;
    int nstates;
} Rule;

static const Rule rules[] = {
    {"adadelta", {.rule = RULE_ADADELTA, .lr = 1.0f, .rho = 0.9f, .eps = 1e-6f, .weight_decay = 0.01f}, 2},
    {"sgd momentum", {.rule = RULE_SGD, .lr = 0.05f, .momentum = 0.9f, .one_minus_dampening = 1.0f,
                      .weight_decay = 5e-4f}, 1},
    {"sgd nesterov", {.rule = RULE_SGD, .lr = 0.05f, .momentum = 0.9f, .one_minus_dampening = 1.0f,
                      .nesterov = true}, 1},
    {"adamw", {.rule = RULE_ADAMW, .adamw = {.lr = 1e-3, .weight_decay = 0.01, .beta1 = 0.9,
                                             .beta2 = 0.999, .eps = 1e-8}}, 2},
};

// The packed state's values read back (the definition: map[code] * absmax, squared where the
// state holds square roots, or bf16).
static void unpack_ref(float *x, const void *codes, const float *absmax, StateFormat f, const float *m,
                       bool root) {
    for (int i = 0; i < N; i++) {
        x[i] = f == STATE_BF16 ? bf16_to_float(((const uint16_t *)codes)[i])
                               : m[((const uint8_t *)codes)[i]] * absmax[i / QUANT_BLOCK];
        if (root && f == STATE_INT8) x[i] = x[i] * x[i];
    }
}

// x stored by the definition (its square roots where root): each block's largest magnitude,
// the scan's code of x / it.
static void pack_ref(void *codes, float *absmax, float *x, StateFormat f, const float *m,
                     bool is_signed, bool root) {
    if (root && f == STATE_INT8)
        for (int i = 0; i < N; i++) x[i] = sqrtf(x[i]);
    for (int b = 0; b * QUANT_BLOCK < N; b++) {
        const int i0 = b * QUANT_BLOCK, e = i0 + QUANT_BLOCK < N ? i0 + QUANT_BLOCK : N;
        float amax = 0;
        for (int i = i0; i < e; i++) amax = fmaxf(amax, fabsf(x[i]));
        if (f == STATE_INT8) absmax[b] = amax;
        for (int i = i0; i < e; i++) {
            if (f == STATE_BF16) ((uint16_t *)codes)[i] = bf16_from_float(x[i]);
            else ((uint8_t *)codes)[i] = (uint8_t)(amax == 0 ? (is_signed ? QUANT_SIGNED_ZERO : 0)
                                                             : scan_nearest(m, x[i] / amax));
        }
    }
}

// The fp32 kernel of the rule over the read-back state.
static void fp32_step(const Rule *r, float *p, float *s0, float *s1, const float *g, uint64_t step) {
    const Kernels *k = cpu_kernels();
    switch (r->r.rule) {
    case RULE_ADADELTA:
        k->adadelta_step(p, s0, s1, g, N, r->r.lr, r->r.rho, r->r.eps, r->r.weight_decay, NULL);
        break;
    case RULE_SGD:
        k->sgd_step(p, s0, g, N, r->r.lr, r->r.momentum, r->r.one_minus_dampening,
                    r->r.weight_decay, r->r.nesterov, NULL, step);
        break;
    case RULE_ADAMW: k->adamw_step(p, s0, s1, g, N, r->r.adamw, NULL, step); break;
    }
}

static void test_packed_step(void **state) {
    const size_t cb = N * 2;  // bytes enough for either format's codes
    for (size_t ri = 0; ri < sizeof rules / sizeof rules[0]; ri++)
        for (int f = STATE_BF16; f < STATE_FORMAT_COUNT; f++) {
            const Rule *r = &rules[ri];
            const float *m0 = map + (r->r.rule == RULE_ADADELTA ? QUANT_UNSIGNED : QUANT_SIGNED);
            const float *m1 = map + QUANT_UNSIGNED;
            float *p = malloc(N * 4), *pr = malloc(N * 4), *g = malloc(N * 4);
            float *x0 = malloc(N * 4), *x1 = malloc(N * 4);
            uint8_t *c0 = calloc(cb, 1), *c1 = calloc(cb, 1), *r0 = calloc(cb, 1), *r1 = calloc(cb, 1);
            float a0[3] = {0}, a1[3] = {0}, ra0[3] = {0}, ra1[3] = {0};
            test_rng_seed(40 + ri);
            for (int i = 0; i < N; i++) p[i] = pr[i] = (float)(test_urand() * 2 - 1);
            // Steps 0..3, the gradient's scale growing (new block maxima) and a block of
            // zeros in step 1 (its state decays, its absmax too).
            for (uint64_t step = 0; step < 4; step++) {
                for (int i = 0; i < N; i++)
                    g[i] = step == 1 && i < QUANT_BLOCK ? 0.0f
                                                         : (float)((test_urand() * 2 - 1) * (1 + step));
                const PackedState s0 = {c0, a0}, s1 = {c1, a1};
                cpu_kernels()->optim_step_packed(p, s0, s1, g, N, (StateFormat)f, r->r, NULL, step);
                // int8 state that averages squares holds square roots (PackedPlan): AdamW's
                // exp_avg_sq, both of Adadelta's.
                const bool root0 = r->r.rule == RULE_ADADELTA, root1 = r->r.rule != RULE_SGD;
                unpack_ref(x0, r0, ra0, (StateFormat)f, m0, root0);
                if (r->nstates > 1) unpack_ref(x1, r1, ra1, (StateFormat)f, m1, root1);
                fp32_step(r, pr, x0, x1, g, step);
                pack_ref(r0, ra0, x0, (StateFormat)f, m0, r->r.rule != RULE_ADADELTA, root0);
                if (r->nstates > 1) pack_ref(r1, ra1, x1, (StateFormat)f, m1, false, root1);
                char what[96];
                snprintf(what, sizeof what, "%s, %s, step %d", r->name, state_format_names[f], (int)step);
                if (memcmp(p, pr, N * 4)) fail_msg("%s: the parameters differ from the fp32 kernel's", what);
                if (memcmp(c0, r0, cb) || memcmp(a0, ra0, sizeof a0))
                    fail_msg("%s: the first state differs from its definition", what);
                if (r->nstates > 1 && (memcmp(c1, r1, cb) || memcmp(a1, ra1, sizeof a1)))
                    fail_msg("%s: the second state differs from its definition", what);
            }
            // The state is there: not all zero codes (a kernel that stored nothing fails).
            int used = 0;
            for (int i = 0; i < N; i++) used += f == STATE_BF16 ? ((uint16_t *)c0)[i] != 0 : c0[i] != c0[0];
            assert_true(used > N / 2);
            free(p), free(pr), free(g), free(x0), free(x1);
            free(c0), free(c1), free(r0), free(r1);
        }
}

// A skipped step (fp16's gate) leaves everything as it was.
static void test_packed_gate(void **state) {
    float p[100], g[100];
    uint8_t c[100];
    float a[1] = {0.5f};
    for (int i = 0; i < 100; i++) p[i] = (float)i, g[i] = 1, c[i] = (uint8_t)(i + 50);
    const ScalerState skip = {.scale = 1, .found = 1};
    cpu_kernels()->optim_step_packed(p, (PackedState){c, a}, (PackedState){0}, g, 100, STATE_INT8,
                                  rules[1].r, &skip, 3);
    for (int i = 0; i < 100; i++) assert_true(p[i] == (float)i && c[i] == i + 50);
    assert_true(a[0] == 0.5f);
}

// ---- networks -----------------------------------------------------------------------------

static const char net_cfg[] = "[conv]\nname = conv1\nfilters = 8\nsize = 3\nactivation = relu\n"
                              "[maxpool]\nsize = 2\n[flatten]\n"
                              "[linear]\nname = fc1\noutputs = 4\n[log_softmax]\n";
static const Shape net_in = {.c = 1, .h = 12, .w = 12};

static void build_seeded(Net *net, const Optimizer *o, bool plan_only, uint64_t seed) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, net_cfg, "q.cfg", &err)) fail_msg("%s", err.msg);
    NetOptions opt = {.batch = 16, .precision = DT_F32, .plan_only = plan_only};
    optim_plan(o, &opt);
    if (net_create(net, &cfg, net_in, 4, &opt, cpu_kernels(), &err)) fail_msg("%s", err.msg);
    cfg_free(&cfg);
    if (!plan_only && net_init_params(net, seed, &err)) fail_msg("%s", err.msg);
}

static void build(Net *net, const Optimizer *o, bool plan_only) { build_seeded(net, o, plan_only, 3); }

// Each format's bytes: 4, 2 or 1 a value, int8 a float per block of each tensor besides.
static void test_plan(void **state) {
    const OptimKind kinds[] = {OPTIM_ADAMW, OPTIM_SGD};
    for (int k = 0; k < 2; k++)
        for (int f = 0; f < STATE_FORMAT_COUNT; f++) {
            Optimizer o = {.kind = kinds[k], .momentum = 0.9, .state_format = (StateFormat)f};
            Net net;
            build(&net, &o, true);
            const size_t S = k ? 1 : 2, n = (size_t)net.ntrain;
            // conv1 weight 72, bias 8; fc1 weight 4 x 200 = 800, bias 4: one block each
            assert_int_equal(net.ntrain, 72 + 8 + 800 + 4);
            assert_int_equal(net.nblocks, 4);
            const size_t want = f == STATE_F32 ? S * n * 4 : f == STATE_BF16 ? S * n * 2
                                : (S * n + 255) / 256 * 256 + S * 4 * 4;
            assert_int_equal(net.plan.optimizer, want);
            net_free(&net);
        }
}

// B samples of the task: 4 classes, each a faint bright quadrant under strong noise.
static void draw_batch(Net *net, int B) {
    for (int i = 0; i < B; i++) {
        const int y = (int)(test_urand64() % 4);
        net->labels[i] = y;
        for (int px = 0; px < 144; px++) {
            const bool on = (px / 12 < 6) == (y < 2) && (px % 12 < 6) == (y % 2 == 0);
            net->input_buf[i * 144 + px] = (float)(on * 0.25 + test_urand() * 2.0 - 1.0);
        }
    }
}

// 200 steps of the task from the weights of `seed`, then the mean loss on 512 held-out
// samples.
static double trained_loss(StateFormat f, OptimKind kind, uint64_t seed) {
    Optimizer o = kind == OPTIM_ADAMW
                      ? (Optimizer){.kind = kind, .lr = 3e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .state_format = f}
                      : (Optimizer){.kind = kind, .lr = 0.05, .momentum = 0.9, .state_format = f};
    Net net;
    build_seeded(&net, &o, false, seed);
    enum { B = 16 };
    test_rng_seed(9);
    for (int s = 0; s < 200; s++) {
        draw_batch(&net, B);
        test_train_step(&net, &o, B, o.lr, 1, (uint64_t)s);
    }
    memset(net.metrics, 0, NET_METRICS * sizeof(float));  // nll_loss adds to them
    for (int s = 0; s < 512 / B; s++) {
        draw_batch(&net, B);
        net_forward(&net, B, false, 1, 0, 0);
        net_loss(&net, B, B, false);
    }
    const double loss = net.metrics[NET_LOSS] / 512;
    net_free(&net);
    return loss;
}

// Trained with compressed state, the network learns the task as the fp32 run does: over
// 4 initial weights, its mean held-out loss within a quarter of fp32's (the spread between
// seeds of fp32 alone is about a third), which is far below chance (ln 4 = 1.39); and the
// state was compressed (the losses differ). The accuracy over seeds on real data sets is
// bench/optimizer_state.sh's.
static void test_training(void **state) {
    const OptimKind kinds[] = {OPTIM_SGD, OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        double mean[STATE_FORMAT_COUNT] = {0};
        for (int f = 0; f < STATE_FORMAT_COUNT; f++)
            for (uint64_t seed = 3; seed < 7; seed++) mean[f] += trained_loss((StateFormat)f, kinds[k], seed) / 4;
        print_message("%s: mean held-out loss after 200 steps, 4 seeds: fp32 %.4f, bf16 %.4f, "
                      "int8 %.4f\n", optim_names[kinds[k]], mean[0], mean[1], mean[2]);
        assert_true(mean[STATE_F32] < 0.5);
        for (int f = STATE_BF16; f < STATE_FORMAT_COUNT; f++) {
            assert_true(mean[f] != mean[STATE_F32]);
            assert_true(fabs(mean[f] - mean[STATE_F32]) <= mean[STATE_F32] / 4);
        }
    }
}

// A checkpoint whose state has another format: refused, naming the key that resumes it.
static void test_checkpoint_format(void **state) {
    char dir[512];
    assert_int_equal(test_tmpdir_make(dir, sizeof dir, "test_quant"), 0);
    static char *classes[4] = {"a", "b", "c", "d"};
    const CheckpointInfo info = {.cfg_text = (char *)net_cfg, .class_names = classes, .classes = 4};
    const TrainState st = {.epoch = 0, .batch = 1, .step = 1, .seed = 1, .best_val_acc = -1, .loss_scale = 1};
    Error err = {{0}};
    Optimizer o = {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .state_format = STATE_INT8};
    Net a, b;
    build(&a, &o, false);
    for (int i = 0; i < 16; i++) a.labels[i] = i % 4;
    test_train_step(&a, &o, 16, o.lr, 1, 0);
    if (checkpoint_save(test_path(dir, "q8.safetensors"), &a, &st, &info, &err)) fail_msg("%s", err.msg);
    o.state_format = STATE_F32;
    build(&b, &o, false);
    TrainState got;
    assert_int_equal(checkpoint_load_all(test_path(dir, "q8.safetensors"), &b, &got, &err), -1);
    if (!strstr(err.msg, "stored as int8") || !strstr(err.msg, "optimizer_state = int8"))
        fail_msg("%s", err.msg);
    // The weights alone load into any run.
    if (checkpoint_load_weights(test_path(dir, "q8.safetensors"), &b, NULL, 0, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(a.params, b.params, a.plan.params);
    net_free(&a), net_free(&b);
    assert_int_equal(test_remove_tree(dir), 0);
}

// Renames the metadata key `from` to `to` (the same length) in the file's header: a file
// as a build that did not write the key would have written it.
static void rename_meta_key(const char *path, const char *from, const char *to) {
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    uint64_t hlen = 0;
    assert_int_equal(fread(&hlen, 8, 1, fp), 1);
    char *h = malloc(hlen + 1);
    assert_non_null(h);
    assert_int_equal(fread(h, 1, hlen, fp), hlen);
    h[hlen] = '\0';
    char *at = strstr(h, from);
    assert_non_null(at);
    memcpy(at, to, strlen(to));
    assert_int_equal(fseek(fp, 8, SEEK_SET), 0);
    assert_int_equal(fwrite(h, 1, hlen, fp), hlen);
    fclose(fp);
    free(h);
}

// int8 state stored as square roots is recorded ("int8_roots"); a checkpoint written
// before Adadelta's averages were (no such key) is refused with Adadelta, not misread, and
// resumes with AdamW, whose exp_avg_sq was a square root already.
static void test_checkpoint_roots(void **state) {
    char dir[512];
    assert_int_equal(test_tmpdir_make(dir, sizeof dir, "test_quant"), 0);
    static char *classes[4] = {"a", "b", "c", "d"};
    const CheckpointInfo info = {.cfg_text = (char *)net_cfg, .class_names = classes, .classes = 4};
    const TrainState st = {.epoch = 0, .batch = 1, .step = 1, .seed = 1, .best_val_acc = -1, .loss_scale = 1};
    const Optimizer rules[] = {{.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6, .state_format = STATE_INT8},
                               {.kind = OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                .state_format = STATE_INT8}};
    for (int r = 0; r < 2; r++) {
        Error err = {{0}};
        Net a, b;
        build(&a, &rules[r], false);
        for (int i = 0; i < 16; i++) a.labels[i] = i % 4;
        test_train_step(&a, &rules[r], 16, rules[r].lr, 1, 0);
        const char *path = test_path(dir, "roots.safetensors");
        if (checkpoint_save(path, &a, &st, &info, &err)) fail_msg("%s", err.msg);
        build(&b, &rules[r], false);
        TrainState got;
        if (checkpoint_load_all(path, &b, &got, &err)) fail_msg("%s", err.msg);  // its own build's
        rename_meta_key(path, "int8_roots", "int8_rooXs");
        const int rc = checkpoint_load_all(path, &b, &got, &err);
        if (r == 0 && (rc != -1 || !strstr(err.msg, "[] as square roots") || !strstr(err.msg, "another version")))
            fail_msg("an Adadelta checkpoint without int8_roots: rc %d, '%s'", rc, err.msg);
        if (r == 1 && rc) fail_msg("an AdamW checkpoint without int8_roots: %s", err.msg);
        net_free(&a), net_free(&b);
    }
    assert_int_equal(test_remove_tree(dir), 0);
}

// ---- compressed activations -------------------------------------------------------------

enum { ACT_VALUES = 2 * ACT_GROUP + 37, ACT_SAMPLES = 3 };

// Fills x (ACT_SAMPLES x ACT_VALUES) with pattern p: ReLU outputs, signed values, constant
// groups with signed zeros, negatives with a NaN, all zeros.
static void act_pattern(float *x, int p) {
    for (int i = 0; i < ACT_SAMPLES * ACT_VALUES; i++) {
        const float g = (float)(test_urand() * 2.0 - 1.0);
        x[i] = p == 0 ? (g > 0 ? g : 0.0f) : p == 1 ? g * 3.0f : p == 2 ? (i % 2 ? 0.0f : -0.0f) + 0.0f * g
               : p == 3 ? -fabsf(g) - 1.0f : 0.0f;
    }
    if (p == 2) for (int i = ACT_GROUP; i < 2 * ACT_GROUP; i++) x[i] = 0.75f;
    if (p == 3) x[5] = NAN;
}

// The records as quant.h's group function writes them.
static void act_pack_ref(unsigned char *dst, const float *x, int bits, uint64_t key, int64_t sample0) {
    const int64_t groups = (ACT_VALUES + ACT_GROUP - 1) / ACT_GROUP;
    for (int s = 0; s < ACT_SAMPLES; s++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t i = g * ACT_GROUP;
            const int count = ACT_VALUES - i < ACT_GROUP ? (int)(ACT_VALUES - i) : ACT_GROUP;
            act_pack_group(dst + (s * groups + g) * act_group_bytes(bits), x + s * ACT_VALUES + i, count,
                           bits, key, ((uint64_t)(sample0 + s) << 32) + (uint64_t)(i / 4));
        }
}

static void test_act_records(void **state) {
    static float x[ACT_SAMPLES * ACT_VALUES], y[ACT_SAMPLES * ACT_VALUES];
    static unsigned char got[ACT_SAMPLES * 3 * 264], want[ACT_SAMPLES * 3 * 264];
    test_rng_seed(5);
    const int widths[] = {2, 4, 8};
    for (int w = 0; w < 3; w++)
        for (int p = 0; p < 5; p++) {
            const int bits = widths[w];
            const size_t bytes = (size_t)(ACT_SAMPLES * act_sample_bytes(ACT_VALUES, bits));
            assert_true(bytes <= sizeof got);
            act_pattern(x, p);
            memset(got, 0xa5, sizeof got), memset(want, 0x5a, sizeof want);
            cpu_kernels()->act_pack(got, x, ACT_VALUES, ACT_SAMPLES, bits, 77, 5);
            act_pack_ref(want, x, bits, 77, 5);
            if (memcmp(got, want, bytes)) fail_msg("%d bits, pattern %d: the CPU's records differ", bits, p);
            cpu_kernels()->act_unpack(y, got, ACT_VALUES, ACT_SAMPLES, bits);
            static float yref[ACT_SAMPLES * ACT_VALUES];
            const int64_t groups = (ACT_VALUES + ACT_GROUP - 1) / ACT_GROUP;
            for (int s = 0; s < ACT_SAMPLES; s++)
                for (int64_t g = 0; g < groups; g++) {
                    const int64_t i = g * ACT_GROUP;
                    act_unpack_group(yref + s * ACT_VALUES + i, want + (s * groups + g) * act_group_bytes(bits),
                                     ACT_VALUES - i < ACT_GROUP ? (int)(ACT_VALUES - i) : ACT_GROUP, bits);
                }
            if (memcmp(y, yref, sizeof y)) fail_msg("%d bits, pattern %d: the CPU reads back other values", bits, p);
            for (int i = 0; i < ACT_SAMPLES * ACT_VALUES; i++) {
                if (isnan(x[i])) continue;
                if (x[i] == 0.0f && p != 1) assert_true(y[i] == 0.0f);  // zeros kept (a ReLU's mask)
                if (x[i] > 0.0f && p == 0) assert_true(y[i] > 0.0f);  // and positive values
                if (p == 2) assert_true(y[i] == x[i]);  // constant groups are exact
                if (p == 3) assert_true(y[i] < 0.0f);
            }
        }
}

// Over K keys the mean of the values read back converges to x: each value within 4.5
// standard deviations of its predicted spread, step^2 f (1 - f) / K (f: its fraction of a
// step above the code below), and the squared deviations over all values average to the
// prediction (their sum over the predicted variances, a chi-squared of ACT_VALUES degrees,
// within 20%).
static void test_act_unbiased(void **state) {
    enum { K = 4000 };
    static float x[ACT_VALUES], y[ACT_VALUES];
    static double mean[ACT_VALUES];
    static unsigned char rec[3 * 264];
    test_rng_seed(6);
    const int widths[] = {2, 4, 8};
    for (int w = 0; w < 3; w++) {
        const int bits = widths[w];
        for (int i = 0; i < ACT_VALUES; i++) {
            const float g = (float)(test_urand() * 2.0 - 1.0);
            x[i] = i < ACT_GROUP ? (g > 0 ? g : 0.0f) : g;  // a ReLU group, then signed ones
            mean[i] = 0;
        }
        for (int k = 0; k < K; k++) {
            cpu_kernels()->act_pack(rec, x, ACT_VALUES, 1, bits, rng_key(1, RNG_STREAM_ACTIVATIONS, (uint64_t)k, 0), 0);
            cpu_kernels()->act_unpack(y, rec, ACT_VALUES, 1, bits);
            for (int i = 0; i < ACT_VALUES; i++) mean[i] += y[i] / (double)K;
        }
        double chi2 = 0;
        int terms = 0;
        for (int i = 0; i < ACT_VALUES; i++) {
            float head[2];
            memcpy(head, rec + i / ACT_GROUP * act_group_bytes(bits), sizeof head);
            const bool zeros = signbit(head[1]);
            const double step = fabs(head[1]);
            if (zeros && x[i] == 0.0f) {
                assert_true(mean[i] == 0.0);
                continue;
            }
            const double t = ((double)x[i] - head[0]) / step, f = t - floor(t);
            const double var = step * step * f * (1 - f) / K;
            const double dev = mean[i] - x[i];
            if (fabs(dev) > 4.5 * sqrt(var) + step * 0x1p-16 + 1e-6)
                fail_msg("%d bits: value %d (%g) read back as %g on average over %d roundings, "
                         "predicted spread %g", bits, i, x[i], mean[i], K, sqrt(var));
            if (var > 0) chi2 += dev * dev / var, terms++;
        }
        print_message("%d bits: mean squared deviation / predicted variance %.3f over %d values\n",
                      bits, chi2 / terms, terms);
        assert_true(chi2 / terms > 0.8 && chi2 / terms < 1.2);
    }
}

// With `bits`-wide activations the gradient of the network in `text` over K seeds averages
// to the exact one: the mean's squared error within [0.25, 2] of the measured variance of
// one over K. Returns nothing; fails the test otherwise.
static void expect_act_gradient_unbiased(const char *text, int bits, const char *what) {
    enum { K = 200, B = 8 };
    Net nets[2];
    for (int c = 0; c < 2; c++) {
        Cfg cfg;
        Error err = {{0}};
        if (cfg_parse(&cfg, text, "act.cfg", &err)) fail_msg("%s", err.msg);
        const NetOptions opt = {.batch = B, .precision = DT_F32, .compress = c ? bits : 0};
        if (net_create(&nets[c], &cfg, net_in, 4, &opt, cpu_kernels(), &err) ||
            net_init_params(&nets[c], 3, &err))
            fail_msg("%s", err.msg);
        cfg_free(&cfg);
        test_rng_seed(8);
        draw_batch(&nets[c], B);
    }
    const size_t n = (size_t)nets[0].ntrain;
    double *exact = calloc(n, sizeof *exact), *mean = calloc(n, sizeof *mean);
    assert_non_null(exact), assert_non_null(mean);
    double var = 0;  // the mean over seeds of one gradient's squared distance from the exact
    for (int k = 0; k <= K; k++) {
        Net *net = &nets[k > 0];
        net_zero_grads(net);
        net_forward(net, B, true, (uint64_t)k, 0, 0);
        net_loss(net, B, B, true);
        net_backward(net, B, (uint64_t)k, 0, 0);
        double d2 = 0;
        for (size_t i = 0; i < n; i++) {
            if (k == 0) exact[i] = net->grads[i];
            else mean[i] += net->grads[i] / K, d2 += (net->grads[i] - exact[i]) * (net->grads[i] - exact[i]);
        }
        var += d2 / K;
    }
    double err2 = 0, norm2 = 0;
    for (size_t i = 0; i < n; i++) err2 += (mean[i] - exact[i]) * (mean[i] - exact[i]), norm2 += exact[i] * exact[i];
    print_message("%d-bit activations, %s: one seed's gradient off by %.3g of the exact norm, the "
                  "mean of %d by %.3g (predicted %.3g)\n", bits, what, sqrt(var / norm2), K,
                  sqrt(err2 / norm2), sqrt(var / K / norm2));
    assert_true(var > 0);
    assert_true(err2 < 2.0 * var / K && err2 > 0.25 * var / K);
    free(exact), free(mean);
    net_free(&nets[0]), net_free(&nets[1]);
}

// Convolutions and linear layers with ReLU, max pooling: gradients linear in what backward
// reads.
static void test_act_gradient_expectation(void **state) {
    (void)state;
    static const char text[] = "[conv]\nname = conv1\nfilters = 6\nsize = 3\nactivation = relu\n"
                               "[conv]\nname = conv2\nfilters = 8\nsize = 3\nactivation = relu\n"
                               "[maxpool]\nsize = 2\n[flatten]\n"
                               "[linear]\nname = fc1\noutputs = 16\nactivation = relu\n"
                               "[linear]\nname = fc2\noutputs = 4\n[log_softmax]\n";
    expect_act_gradient_unbiased(text, 2, "conv, linear");
}

// Batchnorm followed by ReLU (its mask comes from batchnorm's input in backward).
static void test_act_gradient_expectation_bn(void **state) {
    (void)state;
    static const char text[] = "[conv]\nname = conv1\nfilters = 6\nsize = 3\nbias = 0\n"
                               "[batchnorm]\nname = bn1\nactivation = relu\n"
                               "[conv]\nname = conv2\nfilters = 8\nsize = 3\nbias = 0\n"
                               "[batchnorm]\nname = bn2\nactivation = relu\n"
                               "[maxpool]\nsize = 2\n[flatten]\n"
                               "[linear]\nname = fc2\noutputs = 4\n[log_softmax]\n";
    for (int bits = 8; bits >= 2; bits /= 2) expect_act_gradient_unbiased(text, bits, "batchnorm + ReLU");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_nearest),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_packed_step),
        cmocka_unit_test(test_packed_gate),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_checkpoint_format),
        cmocka_unit_test(test_checkpoint_roots),
        cmocka_unit_test(test_act_records),
        cmocka_unit_test(test_act_unbiased),
        cmocka_unit_test(test_act_gradient_expectation),
        cmocka_unit_test(test_act_gradient_expectation_bn),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
