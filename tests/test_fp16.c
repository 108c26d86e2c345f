// test_fp16.c: fp16 activation storage, dynamic loss scaling and gradient accumulation
// (issue 5; DESIGN.md decisions 4 and 5).
//
//   - conversion: nn/half.h against the kernel table's f32_to_f16/f16_to_f32 (F16C where
//     the build targets it) over all 65,536 halves, across every rounding edge, at the
//     overflow and underflow thresholds and on 2^20 random float bit patterns;
//   - the loss scaler: GradScaler's growth/backoff/skip sequence on planted infs and NaNs,
//     a fixed scale, and the unscale_check kernel's contract;
//   - accumulate = 4 against accumulate = 1 on one batch, without and with dropout, in
//     fp32 and in fp16;
//   - fp16 forward/backward against fp32 (with and without a loss scale), fp16 storage
//     really being halves, a planted overflow caught by unscale_check, and the seed network
//     run over several fp16 chunks;
//   - a short training run: fp16 with the dynamic scaler ends like fp32;
//   - the memory plan of the seed network in fp16, exactly.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../data/dataset.h"
#include "../nn/cfg.h"
#include "../nn/half.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/rng.h"
#include "testutil.h"
#include "../nn/scaler.h"

static char g_root[PATH_MAX] = ".";  // the repository, for models/mnist.cfg
static char g_dir[PATH_MAX];         // a temporary directory for the IDX files

// ---- helpers ------------------------------------------------------------------------------


static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool half_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

static Cfg parse(const char *text) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text, "t.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    return cfg;
}

// The optimizer of the suite's training runs (PyTorch's Adadelta defaults).
static const Optimizer adadelta = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};

// The GEMMs' arithmetic of the networks make_net builds (NetOptions.matmul).
static Matmul g_matmul;

// bytes: the input holds bytes, as the trainer's (NetOptions.input_bytes).
static void make_net_as(Net *net, const char *text, Shape input, int classes, int batch, DType precision,
                        bool bytes) {
    Cfg cfg = parse(text);
    Error err = {{0}};
    NetOptions opt = {.batch = batch, .precision = precision, .input_bytes = bytes, .matmul = g_matmul};
    optim_plan(&adadelta, &opt);
    if (net_create(net, &cfg, input, classes, &opt, cpu_kernels(), &err))
        fail_msg("net_create: %s", err.msg);
    cfg_free(&cfg);  // the network keeps what it needs
}

static void make_net(Net *net, const char *text, Shape input, int classes, int batch, DType precision) {
    make_net_as(net, text, input, classes, batch, precision, false);
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// ||a - b|| / ||b|| over n floats; *maxabs = max |b|, *maxdiff = max |a - b|.
static double rel_norm_diff(const float *a, const float *b, int64_t n, double *maxabs, double *maxdiff) {
    double d2 = 0, b2 = 0, mb = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        d2 += d * d, b2 += (double)b[i] * b[i];
        mb = fmax(mb, fabs(b[i])), md = fmax(md, fabs(d));
    }
    if (maxabs) *maxabs = mb;
    if (maxdiff) *maxdiff = md;
    return b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
}

static bool all_finite(const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(g[i])) return false;
    return true;
}

// ---- 1. conversion ---------------------------------------------------------------------------

// half -> float: the reference and the kernel agree bitwise on all 65,536 halves (NaNs
// included: both give the quiet NaN with the payload in the top bits), and the results
// are the values IEEE binary16 says.
static void test_half_to_float_all(void **state) {
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *kv = malloc(N * sizeof *kv), *kt = malloc(N * sizeof *kt);
    assert_true(h && kv && kt);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    cpu_kernels()->f16_to_f32(kv, h, N);  // 8 at a time (F16C in the AVX2 table)
    // Odd lengths: every value also goes through the kernel's scalar tail.
    for (int i = 0, len = 1; i < N; i += len, len = len % 13 + 1)
        cpu_kernels()->f16_to_f32(kt + i, h + i, i + len <= N ? len : N - i);
#ifdef __F16C__
    print_message("the kernels convert with F16C (8 a call to vcvtph2ps/vcvtps2ph)\n");
#else
    print_message("this build has no F16C: the kernels use nn/half.h throughout\n");
#endif
    int nans = 0;
    for (int i = 0; i < N; i++) {
        const float r = half_to_float((uint16_t)i);
        if (f2u(kv[i]) != f2u(r) || f2u(kt[i]) != f2u(r))
            fail_msg("half 0x%04x: half_to_float 0x%08x, kernel 0x%08x (tail 0x%08x)", i, f2u(r),
                     f2u(kv[i]), f2u(kt[i]));
        const int e = (i >> 10) & 0x1f, m = i & 0x3ff;
        const double sign = (i & 0x8000) ? -1 : 1;
        if (e == 0x1f && m) {
            nans++;
            // A quiet NaN, the sign kept, the payload in the top mantissa bits.
            assert_true(isnan(r));
            assert_int_equal(f2u(r), (uint32_t)(i & 0x8000) << 16 | 0x7fc00000u | (uint32_t)m << 13);
        } else if (e == 0x1f) {
            assert_true(isinf(r) && !!signbit(r) == (sign < 0));
        } else {
            const double v = e ? sign * ldexp(1024 + m, e - 25) : sign * ldexp(m, -24);
            if ((double)r != v || !!signbit(r) != (sign < 0)) fail_msg("half 0x%04x: %.9g, want %.9g", i, r, v);
        }
    }
    assert_int_equal(nans, 2 * 1023);
    free(h), free(kv), free(kt);
}

// float -> half -> float round trip: every non-NaN half comes back; a NaN stays a NaN (its
// quiet bit set). With the scalar reference and with the kernel, vectorised and in its tail.
static void test_half_round_trip_all(void **state) {
    enum { N = 65536 };
    float *f = malloc(N * sizeof *f);
    uint16_t *kv = malloc(N * sizeof *kv), *kt = malloc(N * sizeof *kt), *k1 = malloc(N * sizeof *k1);
    assert_true(f && kv && kt && k1);
    for (int i = 0; i < N; i++) f[i] = half_to_float((uint16_t)i);
    cpu_kernels()->f32_to_f16(kv, f, N);
    for (int i = 0, len = 1; i < N; i += len, len = len % 13 + 1)
        cpu_kernels()->f32_to_f16(kt + i, f + i, i + len <= N ? len : N - i);
    cpu_kernels()->f32_to_f16(k1, f + 1, N - 1);  // misaligned by one: the last 7 in the tail
    for (int i = 0; i < N; i++) {
        const uint16_t s = half_from_float(f[i]);
        const uint16_t want = half_is_nan((uint16_t)i) ? (uint16_t)(i | 0x200) : (uint16_t)i;
        if (s != want || kv[i] != want || kt[i] != want || (i > 0 && k1[i - 1] != want))
            fail_msg("half 0x%04x -> %.9g -> scalar 0x%04x, kernel 0x%04x, tail 0x%04x, "
                     "shifted 0x%04x; want 0x%04x", i, f[i], s, kv[i], kt[i], i ? k1[i - 1] : 0, want);
        if (half_is_nan((uint16_t)i)) assert_true(half_is_nan(s));
    }
    free(f), free(kv), free(kt), free(k1);
}

// Converts n floats with the scalar reference and with the kernel (one call of n and
// calls of 1..7 for the tail) and checks both give want[] (if non-NULL) and agree.
static void expect_to_half(const float *in, const uint16_t *want, int64_t n, const char *what) {
    uint16_t *kv = malloc((size_t)n * 2), *kt = malloc((size_t)n * 2);
    assert_true(kv && kt);
    cpu_kernels()->f32_to_f16(kv, in, n);
    for (int64_t i = 0, len = 1; i < n; i += len, len = len % 7 + 1)
        cpu_kernels()->f32_to_f16(kt + i, in + i, i + len <= n ? len : n - i);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t s = half_from_float(in[i]);
        const uint16_t w = want ? want[i] : s;
        if (s != w || kv[i] != w || kt[i] != w)
            fail_msg("%s: float 0x%08x (%.9g): scalar 0x%04x, kernel 0x%04x, tail 0x%04x; want "
                     "0x%04x", what, f2u(in[i]), in[i], s, kv[i], kt[i], w);
    }
    free(kv), free(kt);
}

// For every pair of adjacent finite halves a < b (both signs), the midpoint (exact in
// float: 12 significant bits) rounds to the one with the even mantissa, and one float ulp
// either side of it to the nearer one. The pair (0, 2^-24) covers underflow and
// (65504, 65536) overflow: 65520 is the midpoint and rounds away, to inf.
static void test_half_rounding_edges(void **state) {
    enum { PAIRS = 0x7c00 };  // lower ends 0x0000 .. 0x7bff (0x7bff: the overflow edge)
    const int64_t n = 2 * 3 * PAIRS;
    float *in = malloc((size_t)n * sizeof *in);
    uint16_t *want = malloc((size_t)n * sizeof *want);
    assert_true(in && want);
    int64_t k = 0;
    for (int sgn = 0; sgn < 2; sgn++)
        for (uint32_t h = 0; h < PAIRS; h++) {
            const uint16_t lo = (uint16_t)h, hi = (uint16_t)(h + 1);  // 0x7c00 = inf above 65504
            const double a = half_to_float(lo);
            const double b = h + 1 == 0x7c00 ? 65536.0 : half_to_float(hi);
            const float mid = (float)((a + b) / 2);
            assert_true((double)mid == (a + b) / 2);  // exact
            const uint16_t s = sgn ? 0x8000 : 0;
            const float m = sgn ? -mid : mid;
            in[k] = m, want[k++] = (uint16_t)(s | ((lo & 1) ? hi : lo));
            in[k] = nextafterf(m, 0.0f), want[k++] = (uint16_t)(s | lo);
            in[k] = nextafterf(m, sgn ? -INFINITY : INFINITY), want[k++] = (uint16_t)(s | hi);
        }
    assert_int_equal(k, n);
    expect_to_half(in, want, n, "rounding edge");
    free(in), free(want);

    // The named thresholds, for the record.
    const float f[] = {65519.996f, 65520.0f, -65520.0f, 65504.0f, 1e9f, INFINITY, -INFINITY,
                       0x1p-24f, 0x1p-25f, nextafterf(0x1p-25f, 1.0f), -0x1p-25f, 0x1.8p-24f,
                       0x1p-26f, 0x1p-149f, 0.0f, -0.0f, 0x1p-14f, nextafterf(0x1p-14f, 0.0f),
                       1.0f, nextafterf(1.0f + 0x1p-11f, 0.0f), 1.0f + 0x1p-11f, 1.0f + 0x3p-11f};
    const uint16_t w[] = {0x7bff, 0x7c00, 0xfc00, 0x7bff, 0x7c00, 0x7c00, 0xfc00,
                          0x0001, 0x0000, 0x0001, 0x8000, 0x0002,  // 1.5 * 2^-24: tie to even 2
                          0x0000, 0x0000, 0x0000, 0x8000, 0x0400, 0x0400,
                          0x3c00, 0x3c00, 0x3c00, 0x3c02};
    static_assert(sizeof f / sizeof f[0] == sizeof w / sizeof w[0], "one want per input");
    assert_true(65519.996f < 65520.0f);  // the literal is the float just below
    expect_to_half(f, w, (int64_t)(sizeof f / sizeof f[0]), "threshold");
}

// The scalar reference and the kernel agree on 2^20 random float bit patterns (NaNs,
// infs, subnormals and all), and on 2^20 more drawn from the range halves cover.
static void test_half_random_floats(void **state) {
    enum { N = 1 << 20 };
    float *in = malloc(N * sizeof *in);
    assert_non_null(in);
    test_rng_seed(16);
    for (int i = 0; i < N; i++) in[i] = u2f((uint32_t)test_urand64());
    expect_to_half(in, NULL, N, "random bits");
    for (int i = 0; i < N; i++) {  // exponents 2^-27 .. 2^17
        const uint32_t e = 100 + (uint32_t)(test_urand() * 45), bits = (uint32_t)test_urand64();
        in[i] = u2f((bits & 0x807fffffu) | e << 23);
    }
    expect_to_half(in, NULL, N, "half range");
    free(in);
}

// ---- 2. the loss scaler -------------------------------------------------------------------------

// One step of optim_step's fp16 tail on planted gradients: `grads` hold values times the
// scale (with an inf or NaN if planted); unscale_check unscales and flags them; the
// optimizer's gate decides, and scaler_update applies the rules. Returns whether the
// optimizer stepped.
static bool scaler_step(ScalerState *s, ScalerRules r, float plant) {
    enum { N = 40000 };  // > the kernel's parallel threshold
    static float g[N];
    for (int i = 0; i < N; i++) g[i] = (float)(((i % 7) - 3) * 0.25 * s->scale);
    if (plant != 0) g[N - 3] = plant;  // in the second thread's half
    cpu_kernels()->unscale_check(g, N, s);
    if (plant == 0) {
        assert_true(s->found == 0.0f);
        for (int i = 0; i < N; i++) assert_true(g[i] == (float)(((i % 7) - 3) * 0.25));
    } else {
        assert_true(s->found == 1.0f);
    }
    int64_t taken;
    const bool stepped = scaler_gate(s, 100, &taken);
    if (stepped) assert_int_equal(taken, 100 - s->skipped);
    cpu_kernels()->scaler_update(s, r);
    assert_true(s->found == 0.0f);  // cleared for the next step
    return stepped;
}

static void test_scaler_sequence(void **state) {
    const ScalerRules r = scaler_rules(true, 3);
    ScalerState s = {.scale = 65536};
    assert_true(r.dynamic);
    assert_true(r.growth == 2 && r.backoff == 0.5);
    // clean, clean, clean: grows after the third.
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 65536);
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 65536);
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 131072);
    assert_int_equal(s.good_steps, 0);
    // inf: skipped, backed off.
    assert_false(scaler_step(&s, r, INFINITY));
    assert_true(s.scale == 65536);
    assert_int_equal(s.skipped, 1);
    // clean x2, then NaN: backed off again, the growth count reset.
    assert_true(scaler_step(&s, r, 0)), assert_true(scaler_step(&s, r, 0));
    assert_int_equal(s.good_steps, 2);
    assert_true(s.scale == 65536);
    assert_false(scaler_step(&s, r, NAN));
    assert_true(s.scale == 32768);
    assert_int_equal(s.skipped, 2);
    assert_int_equal(s.good_steps, 0);
    // clean x3 from zero: the first two do not grow it (they would without the reset).
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 32768);
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 32768);
    assert_true(scaler_step(&s, r, 0)), assert_true(s.scale == 65536);
    assert_int_equal(s.skipped, 2);
    // -inf counts too.
    assert_false(scaler_step(&s, r, -INFINITY));
    assert_true(s.scale == 32768);
    assert_int_equal(s.skipped, 3);

    // A fixed scale never changes, but a non-finite step is still skipped and counted.
    const ScalerRules fixed = scaler_rules(false, 3);
    ScalerState f = {.scale = 1024};
    assert_false(fixed.dynamic);
    for (int i = 0; i < 7; i++) assert_true(scaler_step(&f, fixed, 0));
    assert_true(f.scale == 1024);
    assert_false(scaler_step(&f, fixed, INFINITY));
    assert_false(scaler_step(&f, fixed, NAN));
    assert_true(f.scale == 1024);
    assert_int_equal(f.skipped, 2);
    assert_true(scaler_step(&f, fixed, 0));
    assert_true(f.scale == 1024);

    // PyTorch's defaults, as train.c makes them: 2000 clean steps to grow.
    const ScalerRules torch = scaler_rules(true, 2000);
    ScalerState d = {.scale = 65536};
    for (int i = 0; i < 1999; i++) cpu_kernels()->scaler_update(&d, torch);
    assert_true(d.scale == 65536);
    cpu_kernels()->scaler_update(&d, torch);
    assert_true(d.scale == 131072);
    assert_int_equal(d.skipped, 0);
}

// unscale_check with a state whose scale is 1 / factor (exact for the powers of two used
// here), the flag carried in and out through *flag.
static void unscale_by(float *g, int64_t n, float factor, float *flag) {
    ScalerState s = {.scale = 1.0 / factor, .found = *flag};
    cpu_kernels()->unscale_check(g, n, &s);
    *flag = s.found;
}

// unscale_check: g *= 1 / scale exactly; the flag is set by inf, -inf and NaN (in the input or
// made by the scaling), not by large finite values, and left as it was on a clean call.
static void test_unscale_check(void **state) {
    enum { N = 70001 };  // parallel, with an odd tail
    float *g = malloc(N * sizeof *g), *want = malloc(N * sizeof *want);
    assert_true(g && want);
    test_rng_seed(5);
    for (int i = 0; i < N; i++) g[i] = (float)((test_urand() * 2 - 1) * 1e4);
    g[17] = 3.0e38f, g[N - 1] = -3.0e38f, g[100] = 0x1p-149f;  // large and tiny finite values
    const float scale = 0x1p-16f;
    for (int i = 0; i < N; i++) want[i] = g[i] * scale;
    float flag = 0;
    unscale_by(g, N, scale, &flag);
    assert_true(flag == 0.0f);
    assert_memory_equal(g, want, N * sizeof *g);
    // A set flag is not cleared by a clean call: one flag covers several calls.
    flag = 1;
    unscale_by(g, N, 1.0f, &flag);
    assert_true(flag == 1.0f);
    assert_memory_equal(g, want, N * sizeof *g);
    // Large finite values with scale 1 are fine.
    float big[9] = {65504, 1e30f, -1e30f, 3.4e38f, -3.4e38f, FLT_MAX, -FLT_MAX, 0, -0.0f};
    flag = 0;
    unscale_by(big, 9, 1.0f, &flag);
    assert_true(flag == 0.0f);
    // inf, -inf, NaN at the start, the middle and the end (short and long arrays).
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    const int at[] = {0, N / 2, N - 1};
    for (int b = 0; b < 4; b++)
        for (int a = 0; a < 3; a++) {
            for (int i = 0; i < N; i++) g[i] = 1.0f;
            g[at[a]] = bad[b];
            flag = 0;
            unscale_by(g, N, 0.5f, &flag);
            if (flag != 1.0f) fail_msg("%g at %d: flag %g", bad[b], at[a], flag);
            assert_true(g[at[a] ? 0 : 1] == 0.5f);
            flag = 0;
            unscale_by(g + at[a], 1, 0.5f, &flag);
            assert_true(flag == 1.0f);
        }
    // Overflow made by the scaling is flagged.
    float o[3] = {1, 3.0e38f, 1};
    flag = 0;
    unscale_by(o, 3, 4.0f, &flag);
    assert_true(flag == 1.0f && isinf(o[1]));
    free(g), free(want);
}

// ---- 3. accumulation --------------------------------------------------------------------------

// conv 1->4 3x3 relu, maxpool 2, flatten, linear 10, log_softmax on 1x10x10.
static const char *acc_net =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[flatten]\n"
    "[linear]\nname = fc\noutputs = 10\n"
    "[log_softmax]\n";

// The same with two dropouts (one on a conv map, one on a vector) and a hidden layer.
static const char *acc_dropout_net =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[dropout]\np = 0.25\n"
    "[flatten]\n"
    "[linear]\nname = fc1\noutputs = 32\nactivation = relu\n"
    "[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 10\n"
    "[log_softmax]\n";

// A small ResNet on the same images: batchnorm normalises each micro-batch by its own
// statistics, as PyTorch's does.
static const char *acc_resnet =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nfilters = 6\nstride = 2\n"
    "[global_avgpool]\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 10\n"
    "[log_softmax]\n";

// Depthwise convolutions (nn/conv_grouped.c): one with batchnorm and ReLU, as MobileNetV2
// has them, and one with two filters per channel, a bias and a ReLU of its own.
static const char *acc_mobile =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[conv]\nname = dw\nfilters = 4\nsize = 3\nstride = 2\npad = 1\ngroups = 4\nbias = 0\n"
    "[batchnorm]\nname = dw_bn\nactivation = relu\n"
    "[global_avgpool]\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 10\n"
    "[log_softmax]\n";
static const char *acc_depthwise =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nactivation = relu\n"
    "[conv]\nname = dw\nfilters = 8\nsize = 3\nstride = 2\npad = 1\ngroups = 4\nactivation = relu\n"
    "[flatten]\n"
    "[linear]\nname = fc\noutputs = 10\n"
    "[log_softmax]\n";

enum { ACC_B = 16, ACC_K = 4, ACC_PIX = 100 };
static const Shape acc_shape = {.c = 1, .h = 10, .w = 10};

static void acc_data(float *x, int32_t *y) {
    test_rng_seed(77);
    for (int i = 0; i < ACC_B * ACC_PIX; i++) x[i] = (float)(test_urand() * 3 - 1);
    for (int i = 0; i < ACC_B; i++) y[i] = (int32_t)(test_urand() * 10);
}

// Gradients (malloc'd) of the batch of ACC_B on a net of micro-batch `micro`: ACC_B/micro
// micro-batches with the loss averaged over the batch, like train_step. sample0_zero
// passes 0 for every micro-batch (wrong on purpose: other dropout masks). *loss = the
// summed loss from metrics.
static float *acc_grads(const char *text, DType precision, int micro, bool sample0_zero,
                        int64_t *nparams, double *loss) {
    Net net;
    make_net(&net, text, acc_shape, 10, micro, precision);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 3, &err), 0);
    float x[ACC_B * ACC_PIX];
    int32_t y[ACC_B];
    acc_data(x, y);
    const uint64_t seed = 11, step = 5;
    net_zero_grads(&net);
    net.metrics[NET_LOSS] = net.metrics[NET_CORRECT] = 0;
    for (int m0 = 0; m0 < ACC_B; m0 += micro) {
        net.k->upload(net.input_buf, x + m0 * ACC_PIX, (size_t)micro * ACC_PIX * sizeof(float));
        net.k->upload(net.labels, y + m0, (size_t)micro * sizeof(int32_t));
        const int64_t s0 = sample0_zero ? 0 : m0;
        net_forward(&net, micro, true, seed, step, s0);
        net_loss(&net, micro, ACC_B, true);
        net_backward(&net, micro, seed, step, s0);
    }
    *nparams = net.nparams;
    *loss = net.metrics[NET_LOSS];
    float *g = malloc((size_t)net.nparams * sizeof *g);
    assert_non_null(g);
    memcpy(g, net.grads, (size_t)net.nparams * sizeof *g);
    net_free(&net);
    return g;
}

// accumulate = 4 (micro-batch 4) against accumulate = 1 (batch 16): relative norm of the
// gradient difference <= tol, and the summed losses agree.
static double expect_accumulation(const char *text, DType precision, double tol, const char *what) {
    int64_t n1, n4;
    double l1, l4;
    float *g1 = acc_grads(text, precision, ACC_B, false, &n1, &l1);
    float *g4 = acc_grads(text, precision, ACC_B / ACC_K, false, &n4, &l4);
    assert_int_equal(n1, n4);
    double big, maxdiff;
    const double rel = rel_norm_diff(g4, g1, n1, &big, &maxdiff);
    print_message("%s: ||g4 - g1|| / ||g1|| = %.3g, max |g4 - g1| = %.3g (max |g1| %.3g); "
                  "losses %.7g %.7g\n", what, rel, maxdiff, big, l1, l4);
    assert_true(big > 1e-3);
    if (!(rel <= tol)) fail_msg("%s: relative gradient difference %.3g > %.3g", what, rel, tol);
    assert_true(fabs(l1 - l4) <= 1e-5 * fabs(l1));
    free(g1), free(g4);
    return rel;
}

// Issue 5's criterion: without dropout, relative 1e-5 (fp32 sums in another order: ~1e-7).
static void test_accumulate_fp32(void **state) {
    expect_accumulation(acc_net, DT_F32, 1e-5, "fp32, no dropout");
    expect_accumulation(acc_depthwise, DT_F32, 1e-5, "fp32, depthwise");
}

// With dropout the masks are keyed by each sample's place in the batch (sample0), so the
// micro-batches see the batch's masks: the same tolerance. Without sample0 they would not.
static void test_accumulate_fp32_dropout(void **state) {
    expect_accumulation(acc_dropout_net, DT_F32, 1e-5, "fp32, dropout");
    int64_t n1, n4;
    double l1, l4;
    float *g1 = acc_grads(acc_dropout_net, DT_F32, ACC_B, false, &n1, &l1);
    float *g4 = acc_grads(acc_dropout_net, DT_F32, ACC_B / ACC_K, true, &n4, &l4);
    const double rel = rel_norm_diff(g4, g1, n1, NULL, NULL);
    print_message("fp32, dropout, sample0 = 0 for every micro-batch: relative difference %.3g "
                  "(must be large)\n", rel);
    assert_true(rel > 1e-2);
    free(g1), free(g4);
}

// fp16: each sample's activations are rounded to halves the same way in both runs; what
// differs is the order of fp32 sums, which could move a value across a half rounding edge
// (2^-11 relative for that one value). Tolerance: relative norm 1e-4 (measured ~1e-7,
// like fp32: so far no value has crossed an edge).
static void test_accumulate_fp16(void **state) {
    expect_accumulation(acc_net, DT_F16, 1e-4, "fp16, no dropout");
    expect_accumulation(acc_dropout_net, DT_F16, 1e-4, "fp16, dropout");
    expect_accumulation(acc_depthwise, DT_F16, 1e-4, "fp16, depthwise");
}

// bf16: the same, with bf16's rounding edges (2^-8 relative) and, where the CPU has BF16
// instructions, GEMMs whose micro-batches' rows fall in other tiles: tolerance 1e-4 as
// for fp16 (measured on AMX: 2e-8 to 8e-8).
static void test_accumulate_bf16(void **state) {
    expect_accumulation(acc_net, DT_BF16, 1e-4, "bf16, no dropout");
    expect_accumulation(acc_dropout_net, DT_BF16, 1e-4, "bf16, dropout");
    expect_accumulation(acc_depthwise, DT_BF16, 1e-4, "bf16, depthwise");
}

// Batchnorm under accumulation: each micro-batch is normalised by its own statistics (as in
// PyTorch, and unlike one big batch), so accumulate = 4 is the sum of 4 batches of 4 run
// separately, with the loss averaged over all 16; the running statistics move once per
// micro-batch (num_batches_tracked 4). On the small ResNet and on the depthwise net.
static void expect_accumulation_batchnorm(const char *text, const char *what) {
    int64_t n1, n4;
    double l1, l4;
    float *g16 = acc_grads(text, DT_F32, ACC_B, false, &n1, &l1);
    float *g4 = acc_grads(text, DT_F32, ACC_B / ACC_K, false, &n4, &l4);
    float *sum = calloc((size_t)n1, sizeof *sum);
    assert_non_null(sum);
    float x[ACC_B * ACC_PIX];
    int32_t y[ACC_B];
    acc_data(x, y);
    enum { M = ACC_B / ACC_K };
    int64_t tracked = -1;
    for (int m0 = 0; m0 < ACC_B; m0 += M) {  // each micro-batch on a fresh network
        Net net;
        make_net(&net, text, acc_shape, 10, M, DT_F32);
        Error err = {{0}};
        assert_int_equal(net_init_params(&net, 3, &err), 0);
        memcpy(net.input_buf, x + m0 * ACC_PIX, (size_t)M * ACC_PIX * sizeof(float));
        memcpy(net.labels, y + m0, (size_t)M * sizeof(int32_t));
        net_zero_grads(&net);
        net_forward(&net, M, true, 11, 5, m0);
        net_loss(&net, M, ACC_B, true);
        net_backward(&net, M, 11, 5, m0);
        for (int64_t i = 0; i < n1; i++) sum[i] += net.grads[i];
        net_free(&net);
    }
    const double rel_sum = rel_norm_diff(g4, sum, n1, NULL, NULL);
    const double rel_big = rel_norm_diff(g4, g16, n1, NULL, NULL);
    print_message("%s: batchnorm, accumulate 4 vs 4 separate micro-batches: relative %.3g; vs one "
                  "batch of 16: %.3g (different statistics)\n", what, rel_sum, rel_big);
    assert_true(rel_sum <= 1e-5);
    assert_true(rel_big > 1e-3);

    // The running statistics of accumulate = 4: 4 updates.
    Net net;
    make_net(&net, text, acc_shape, 10, M, DT_F32);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 3, &err), 0);
    for (int m0 = 0; m0 < ACC_B; m0 += M) {
        memcpy(net.input_buf, x + m0 * ACC_PIX, (size_t)M * ACC_PIX * sizeof(float));
        net_forward(&net, M, true, 11, 5, m0);
    }
    tracked = *(int64_t *)net.layers[1]->buffers[2].data;
    assert_int_equal(tracked, ACC_K);
    net_free(&net);
    free(g16), free(g4), free(sum);
}

// The same with torchvision's other blocks: a Bottleneck with its downsample and an
// InvertedResidual (expansion, depthwise 3x3, ReLU6, linear projection, the identity added).
static const char *acc_blocks =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nblock = bottleneck\nfilters = 2\nstride = 2\n"
    "[residual]\nname = features.2\nblock = inverted\nexpand = 3\nfilters = 8\n"
    "[global_avgpool]\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 10\n"
    "[log_softmax]\n";

static void test_accumulate_batchnorm(void **state) {
    expect_accumulation_batchnorm(acc_resnet, "resnet");
    expect_accumulation_batchnorm(acc_blocks, "bottleneck and inverted residual");
    expect_accumulation_batchnorm(acc_mobile, "depthwise + batchnorm + relu");
}

// ---- 4. fp16 against fp32 ---------------------------------------------------------------------

typedef struct RunOut {
    float *out;    // (N, classes) log-probabilities
    float *grads;  // (nparams), as left in net->grads (scaled by loss_scale)
    float *act0;   // (N, layers[0]->out) the first layer's output as floats
    uint16_t *act0_half;  // fp16 and bf16: its stored halves
    int64_t nparams, nout, nact0;
    bool flag;     // fp16 tail: scale_check(grads, 1/loss_scale) found inf or NaN
    double loss;
} RunOut;

static void run_free(RunOut *r) { free(r->out), free(r->grads), free(r->act0), free(r->act0_half); }

// One forward/loss/backward of N samples (x, y) on a fresh net of `text`, then (if unscale)
// train_step's scale_check with 1/loss_scale.
static RunOut run_once(const char *text, Shape in, int classes, DType precision, int N,
                       const float *x, const int32_t *y, float loss_scale, bool unscale) {
    Net net;
    make_net(&net, text, in, classes, N, precision);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 7, &err), 0);
    const int64_t pix = shape_numel(in);
    net.k->upload(net.input_buf, x, (size_t)N * pix * sizeof(float));
    net.k->upload(net.labels, y, (size_t)N * sizeof(int32_t));
    *net.scaler = (ScalerState){.scale = loss_scale};
    net_zero_grads(&net);
    net.metrics[NET_LOSS] = net.metrics[NET_CORRECT] = 0;
    net_forward(&net, N, true, 21, 3, 0);
    net_loss(&net, N, N, true);
    net_backward(&net, N, 21, 3, 0);
    RunOut r = {.nparams = net.nparams, .nout = (int64_t)N * classes,
                .nact0 = (int64_t)N * shape_numel(net.layers[0]->out), .loss = net.metrics[NET_LOSS]};
    if (unscale) {
        net.k->unscale_check(net.grads, net.nparams, net.scaler);
        r.flag = net.scaler->found != 0.0f;
    }
    r.out = malloc((size_t)r.nout * sizeof(float));
    r.grads = malloc((size_t)r.nparams * sizeof(float));
    r.act0 = malloc((size_t)r.nact0 * sizeof(float));
    assert_true(r.out && r.grads && r.act0);
    memcpy(r.out, net_output(&net), (size_t)r.nout * sizeof(float));
    memcpy(r.grads, net.grads, (size_t)r.nparams * sizeof(float));
    if (precision_is_half(precision)) {
        r.act0_half = malloc((size_t)r.nact0 * sizeof(uint16_t));
        assert_non_null(r.act0_half);
        memcpy(r.act0_half, net.acts[0], (size_t)r.nact0 * sizeof(uint16_t));
        for (int64_t i = 0; i < r.nact0; i++)
            r.act0[i] = precision == DT_BF16 ? bf16_to_float(r.act0_half[i]) : half_to_float(r.act0_half[i]);
    } else {
        memcpy(r.act0, net.acts[0], (size_t)r.nact0 * sizeof(float));
    }
    net_free(&net);
    return r;
}

// Tolerances for fp16 storage (each stored value within 2^-11 = 4.9e-4 relative of fp32's,
// a few layers deep): log-probabilities within 2e-3 absolute (measured 4.6e-4 on the small
// net, 1.6e-4 on the seed network); the gradients' relative difference norm
// ||g16 - g32|| / ||g32|| within 1e-2 (measured 3.7e-4 and 2.6e-3; printed).
#define FP16_OUT_TOL 2e-3
#define FP16_GRAD_TOL 1e-2

static void expect_close_as(const RunOut *h, const RunOut *f, const char *what, double out_tol,
                            double grad_tol, double loss_tol) {
    double big, maxdiff;
    const double out_diff = rel_norm_diff(h->out, f->out, f->nout, &big, &maxdiff);
    const double out_max = maxdiff;
    const double g_rel = rel_norm_diff(h->grads, f->grads, f->nparams, &big, &maxdiff);
    print_message("%s: log-probs max |half - fp32| = %.3g (relative norm %.3g); gradients "
                  "||half - fp32|| / ||fp32|| = %.3g, max diff %.3g of max %.3g; loss %.6g vs %.6g\n",
                  what, out_max, out_diff, g_rel, maxdiff, big, h->loss, f->loss);
    if (!(out_max <= out_tol)) fail_msg("%s: log-probs differ by %.3g", what, out_max);
    if (!(g_rel <= grad_tol)) fail_msg("%s: gradients differ by %.3g (relative)", what, g_rel);
    if (!(fabs(h->loss - f->loss) <= loss_tol * fabs(f->loss))) fail_msg("%s: loss %.6g against %.6g", what, h->loss, f->loss);
}

static void expect_close_to_fp32(const RunOut *h, const RunOut *f, const char *what) {
    expect_close_as(h, f, what, FP16_OUT_TOL, FP16_GRAD_TOL, 1e-2);
}

static void test_fp16_against_fp32(void **state) {
    enum { N = 16 };
    float x[N * ACC_PIX];
    int32_t y[N];
    acc_data(x, y);
    RunOut f = run_once(acc_dropout_net, acc_shape, 10, DT_F32, N, x, y, 1.0f, false);
    RunOut h = run_once(acc_dropout_net, acc_shape, 10, DT_F16, N, x, y, 1.0f, false);
    assert_true(all_finite(f.grads, f.nparams) && all_finite(h.grads, h.nparams));
    // The stored activations are halves: the first layer's output is exactly fp32's
    // output rounded (its input and weights are the same fp32 values).
    for (int64_t i = 0; i < f.nact0; i++)
        if (h.act0_half[i] != half_from_float(f.act0[i]))
            fail_msg("act0[%lld]: stored 0x%04x, fp32 %.9g rounds to 0x%04x", (long long)i,
                     h.act0_half[i], f.act0[i], half_from_float(f.act0[i]));
    expect_close_to_fp32(&h, &f, "fp16 vs fp32, loss_scale 1");

    // loss_scale 1024, unscaled by scale_check: matches fp32 just as well, and fp16 with
    // scale 1 almost bit for bit (a power of two commutes with rounding except where
    // scale 1 underflowed).
    RunOut hs = run_once(acc_dropout_net, acc_shape, 10, DT_F16, N, x, y, 1024.0f, true);
    assert_false(hs.flag);
    expect_close_to_fp32(&hs, &f, "fp16, loss_scale 1024, unscaled, vs fp32");
    const double self = rel_norm_diff(hs.grads, h.grads, h.nparams, NULL, NULL);
    print_message("fp16 scale 1024 unscaled vs fp16 scale 1: relative %.3g\n", self);
    assert_true(self <= 1e-4);
    // fp32 with the same scale, unscaled: the fp32 gradients to float rounding.
    RunOut fs = run_once(acc_dropout_net, acc_shape, 10, DT_F32, N, x, y, 1024.0f, true);
    assert_false(fs.flag);
    assert_true(rel_norm_diff(fs.grads, f.grads, f.nparams, NULL, NULL) <= 1e-6);
    run_free(&f), run_free(&h), run_free(&hs), run_free(&fs);
    // Depthwise convolutions with batchnorm, and with two filters per channel.
    const char *dw_nets[] = {acc_mobile, acc_depthwise};
    for (int i = 0; i < 2; i++) {
        f = run_once(dw_nets[i], acc_shape, 10, DT_F32, N, x, y, 1.0f, false);
        h = run_once(dw_nets[i], acc_shape, 10, DT_F16, N, x, y, 1.0f, false);
        assert_true(all_finite(h.grads, h.nparams));
        expect_close_to_fp32(&h, &f, i ? "fp16 vs fp32, depthwise x2 + relu" : "fp16 vs fp32, depthwise + batchnorm");
        run_free(&f), run_free(&h);
    }
}

// bf16 storage (8 significant bits: each stored value within 2^-9 = 2.0e-3 relative of
// fp32's) and, where the CPU has BF16 instructions, GEMMs on bf16 operands (each within
// 2^-9 too), a few layers deep: log-probabilities within 1.5e-2 absolute, the gradients'
// relative difference norm within 4e-2, the loss within 1% (measured on AMX: 3.7e-3,
// 1.0e-2 and 7e-5, about 4x below; printed). Without BF16 instructions the first layer's
// stored output is fp32's, rounded. The same bounds hold the GEMMs on bf16 operands alone,
// on fp32 activations (matmul = bf16).
#define BF16_OUT_TOL 1.5e-2
#define BF16_GRAD_TOL 4e-2

static void test_bf16_against_fp32(void **state) {
    enum { N = 16 };
    float x[N * ACC_PIX];
    int32_t y[N];
    acc_data(x, y);
    const char *nets[] = {acc_dropout_net, acc_mobile, acc_depthwise};
    const char *names[] = {"bf16 vs fp32, dropout", "bf16 vs fp32, depthwise + batchnorm",
                           "bf16 vs fp32, depthwise x2 + relu"};
    // Whether the net has a product of 32 columns and more over 32 k and more (fc1's
    // forward and input gradient), which the CPU's bf16 GEMM runs (thinner ones it runs in
    // fp32: nn/cpu_kernels.c bf16_product).
    const bool wide[] = {true, false, false};
    for (int i = 0; i < 3; i++) {
        RunOut f = run_once(nets[i], acc_shape, 10, DT_F32, N, x, y, 1.0f, false);
        RunOut h = run_once(nets[i], acc_shape, 10, DT_BF16, N, x, y, 1.0f, false);
        assert_true(all_finite(h.grads, h.nparams));
        if (!cpu_bf16_gemm_name())
            for (int64_t j = 0; j < f.nact0; j++)
                if (h.act0_half[j] != bf16_from_float(f.act0[j]))
                    fail_msg("act0[%lld]: stored 0x%04x, fp32 %.9g rounds to 0x%04x", (long long)j,
                             h.act0_half[j], f.act0[j], bf16_from_float(f.act0[j]));
        expect_close_as(&h, &f, names[i], BF16_OUT_TOL, BF16_GRAD_TOL, 1e-2);
        // matmul = bf16 on fp32 activations: the GEMMs' rounding alone, within the same
        // bounds; not fp32's bits where the CPU has BF16 instructions and the net a wide
        // product, fp32's bits where the GEMMs fall back to fp32.
        g_matmul = MATMUL_BF16;
        RunOut m = run_once(nets[i], acc_shape, 10, DT_F32, N, x, y, 1.0f, false);
        g_matmul = MATMUL_AUTO;
        expect_close_as(&m, &f, names[i], BF16_OUT_TOL, BF16_GRAD_TOL, 1e-2);
        const bool same = !memcmp(m.grads, f.grads, (size_t)f.nparams * sizeof(float));
        const bool bf16 = wide[i] && cpu_bf16_gemm_name();
        if (same == bf16)
            fail_msg("%s, matmul = bf16 on fp32 activations: the gradients are %s fp32's with the GEMMs on %s",
                     names[i], same ? "equal to" : "not", bf16 ? cpu_bf16_gemm_name() : "fp32");
        run_free(&f), run_free(&h), run_free(&m);
    }
}

// A loss scale of 2^30 makes the loss gradient 2^30/16 = 6.7e7: beyond fp16's 65504, so
// the stored activation gradients overflow and scale_check raises the flag (fp32 does not
// overflow). A dynamic scaler starting there backs off until a step is clean.
static void test_fp16_overflow_flagged(void **state) {
    enum { N = 16 };
    float x[N * ACC_PIX];
    int32_t y[N];
    acc_data(x, y);
    RunOut h = run_once(acc_net, acc_shape, 10, DT_F16, N, x, y, 0x1p30f, true);
    assert_true(h.flag);
    assert_false(all_finite(h.grads, h.nparams));
    RunOut f = run_once(acc_net, acc_shape, 10, DT_F32, N, x, y, 0x1p30f, true);
    assert_false(f.flag);
    run_free(&h), run_free(&f);

    // optim_step's fp16 tail with a dynamic scaler from 2^30: skip (the parameters left as
    // they were), back off, until a clean step changes them.
    Net net;
    make_net(&net, acc_net, acc_shape, 10, N, DT_F16);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 7, &err), 0);
    const ScalerRules rules = scaler_rules(true, 2000);
    *net.scaler = (ScalerState){.scale = 0x1p30};
    const ScalerState *s = net.scaler;
    float *before = malloc((size_t)net.nparams * sizeof *before);
    assert_non_null(before);
    int steps = 0;
    for (bool stepped = false; !stepped; steps++) {
        assert_true(steps < 40);
        net.k->upload(net.input_buf, x, sizeof x);
        net.k->upload(net.labels, y, sizeof y);
        net_zero_grads(&net);
        net_forward(&net, N, true, 21, 0, 0);
        net_loss(&net, N, N, true);
        net_backward(&net, N, 21, 0, 0);
        memcpy(before, net.params, (size_t)net.nparams * sizeof *before);
        const int64_t skipped = s->skipped;
        optim_step(&net, &adadelta, &rules, 1.0, (uint64_t)steps);
        stepped = s->skipped == skipped;
        const bool same = !memcmp(before, net.params, (size_t)net.nparams * sizeof *before);
        if (stepped) assert_true(all_finite(net.grads, net.nparams) && !same);
        else assert_true(same);
    }
    free(before);
    print_message("dynamic scaler from 2^30: %d skipped steps, scale %g\n", (int)s->skipped, s->scale);
    assert_true(s->skipped >= 1);
    assert_int_equal(s->skipped, steps - 1);
    assert_true(s->scale == ldexp(1, 30 - (int)s->skipped));
    assert_true(s->scale >= 1024);  // it stopped where fp16 overflowed, not far below
    net_free(&net);
}

// The small ResNet in fp16 against fp32, on inputs large enough that the stem's
// activations run in chunks (batchnorm's statistics gathered over them): 3x180x180 gives
// chunks of 4, so a batch of 9 is 4 + 4 + 1.
static void test_fp16_resnet_against_fp32(void **state) {
    enum { N = 9 };
    const Shape in = {.c = 1, .h = 180, .w = 180};
    const int64_t pix = shape_numel(in);
    float *x = malloc((size_t)N * pix * sizeof *x);
    int32_t y[N];
    assert_non_null(x);
    test_rng_seed(12);
    for (int64_t i = 0; i < N * pix; i++) x[i] = (float)(test_urand() * 2 - 1);
    for (int i = 0; i < N; i++) y[i] = (int32_t)(test_urand() * 10);
    Net probe;
    make_net(&probe, acc_resnet, in, 10, N, DT_F16);
    assert_int_equal(exec_chunk(&probe.exec, probe.layers[0], N), 4);
    net_free(&probe);
    RunOut f = run_once(acc_resnet, in, 10, DT_F32, N, x, y, 1.0f, false);
    RunOut h = run_once(acc_resnet, in, 10, DT_F16, N, x, y, 1024.0f, true);
    assert_false(h.flag);
    expect_close_to_fp32(&h, &f, "ResNet, fp16 (loss_scale 1024, unscaled) vs fp32");
    run_free(&f), run_free(&h);
    free(x);
}

static void load_mnist_cfg(Cfg *cfg) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/models/mnist.cfg", g_root);
    Error err = {{0}};
    if (cfg_load(cfg, path, &err)) fail_msg("%s", err.msg);
}

static char *mnist_cfg_text(void) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/models/mnist.cfg", g_root);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    char *text = calloc(1, 1 << 16);
    assert_non_null(text);
    const size_t n = fread(text, 1, (1 << 16) - 1, f);
    assert_true(n > 0);
    fclose(f);
    return text;
}

// The seed network, with both dropouts, on a batch of 40: fp16 runs each layer over chunks
// of 14 samples (its scratch holds 14 of the largest activation), so this covers a full
// and a partial chunk, and dropout masks keyed by the chunk's sample0. Against fp32 on the
// whole batch at once.
static void test_fp16_chunks_seed_network(void **state) {
    enum { N = 40 };
    char *text = mnist_cfg_text();
    const Shape in = {.c = 1, .h = 28, .w = 28};
    float *x = malloc(N * 784 * sizeof *x);
    int32_t y[N];
    assert_non_null(x);
    // A pre-activation within fp16's rounding of ReLU's kink is on in one run and off in
    // the other, which moves every gradient below it by ~3% (one of 40 x 64 fc1 units).
    // These data have none there; test_rng_seed(9) with PyTorch's seed-7 init had one (3.6e-5).
    test_rng_seed(10);
    for (int i = 0; i < N * 784; i++) x[i] = (float)(test_urand() * 3 - 0.4);
    for (int i = 0; i < N; i++) y[i] = (int32_t)(test_urand() * 10);
    Net probe;
    make_net(&probe, text, in, 10, N, DT_F16);
    assert_string_equal(probe.layers[1]->name, "conv2");
    assert_int_equal(exec_chunk(&probe.exec, probe.layers[1], N), 14);
    net_free(&probe);
    RunOut f = run_once(text, in, 10, DT_F32, N, x, y, 1.0f, false);
    RunOut h = run_once(text, in, 10, DT_F16, N, x, y, 256.0f, true);
    assert_false(h.flag);
    expect_close_to_fp32(&h, &f, "seed network, fp16 (chunks of 14, scale 256) vs fp32");
    run_free(&f), run_free(&h);
    free(x), free(text);
}

// ---- 5. training ------------------------------------------------------------------------------


// A dropout keeps the masks in play; fp16 and accumulation must handle them.
static const char *train_net =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[dropout]\np = 0.1\n"
    "[flatten]\n"
    "[linear]\nname = fc\noutputs = 4\n"
    "[log_softmax]\n";

enum { TRAIN_BATCH = SQUARES_BATCH };

// train.c's train_step, replicated: micro-batches of net->batch with the loss averaged
// over the batch; in fp16 optim_step unscales, checks and updates the scaler.
static void train_step(Net *net, const Batch *b, uint64_t seed, uint64_t step, const Optimizer *opt,
                       double lr) {
    const ScalerRules torch = scaler_rules(true, 2000);
    const int64_t pix = shape_numel(net->input);
    net_zero_grads(net);
    for (int m0 = 0; m0 < b->n; m0 += net->batch) {
        const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
        net_put_input(net, b->px + m0 * pix, b->lut, n);
        net->k->upload(net->labels, b->y + m0, (size_t)n * sizeof(int32_t));
        net_forward(net, n, true, seed, step, m0);
        net_loss(net, n, b->n, true);
        net_backward(net, n, seed, step, m0);
    }
    optim_step(net, opt, net->precision == DT_F16 ? &torch : NULL, lr, step);
}

// One epoch: trains if opt, else evaluates. Returns the mean loss, *acc the fraction right.
static double run_epoch(Net *net, Loader *loader, int epoch, const Optimizer *opt,
                        double *acc) {
    Error err = {{0}};
    if (loader_start_epoch(loader, epoch, 0, &err)) fail_msg("%s", err.msg);
    const int64_t pix = shape_numel(net->input);
    net->metrics[NET_LOSS] = net->metrics[NET_CORRECT] = 0;
    int64_t seen = 0;
    const Batch *b;
    for (;;) {
        if (loader_next(loader, &b, &err)) fail_msg("%s", err.msg);
        if (!b) break;
        if (opt) {
            const Schedule steplr = {.kind = SCHEDULE_STEP, .gamma = 0.7};
            train_step(net, b, 9, (uint64_t)(epoch * 1000 + b->index), opt,
                       schedule_lr(&steplr, opt->lr, 0, epoch, 0));
        } else {
            for (int m0 = 0; m0 < b->n; m0 += net->batch) {
                const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
                net_put_input(net, b->px + m0 * pix, b->lut, n);
                net->k->upload(net->labels, b->y + m0, (size_t)n * sizeof(int32_t));
                net_forward(net, n, false, 0, 0, 0);
                net_loss(net, n, n, false);
            }
        }
        seen += b->n;
    }
    *acc = net->metrics[NET_CORRECT] / (double)seen;
    return net->metrics[NET_LOSS] / (double)seen;
}

typedef struct TrainResult {
    double loss[4], acc[4], test_loss, test_acc, scale;
    int64_t skipped;
} TrainResult;

static TrainResult train_run(DType precision, int micro, Loader *loader, Loader *tloader) {
    Net net;
    make_net_as(&net, train_net, (Shape){.c = 1, .h = 8, .w = 8}, 4, micro, precision, true);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 1, &err), 0);
    const Optimizer opt = adadelta;
    if (precision == DT_F16) *net.scaler = (ScalerState){.scale = 65536};
    TrainResult r = {0};
    for (int e = 0; e < 4; e++) r.loss[e] = run_epoch(&net, loader, e, &opt, &r.acc[e]);
    r.test_loss = run_epoch(&net, tloader, 0, NULL, &r.test_acc);
    r.scale = net.scaler->scale, r.skipped = net.scaler->skipped;
    print_message("%s micro-batch %d: epoch losses %.4f %.4f %.4f %.4f, accuracy %.3f; held out "
                  "%.4f, %.3f; loss scale %g, %lld skipped\n",
                  precision == DT_F16 ? "fp16" : "fp32", micro, r.loss[0], r.loss[1], r.loss[2],
                  r.loss[3], r.acc[3], r.test_loss, r.test_acc, r.scale, (long long)r.skipped);
    net_free(&net);
    return r;
}

// Four epochs of the squares data set (512 images, batch 30) in fp32, in fp16 with the
// dynamic scaler, and in fp16 with accumulate = 3 (micro-batches of 10). Both fall well
// below the first epoch's loss, and fp16 ends within 10% (or 0.02) of fp32's final loss.
static void test_fp16_training_loss_falls(void **state) {
    char images[PATH_MAX], labels[PATH_MAX], timages[PATH_MAX], tlabels[PATH_MAX];
    write_squares(g_dir, "train", 512, 1, images, labels);
    write_squares(g_dir, "test", 200, 2, timages, tlabels);
    Dataset *ds, *tds;
    Loader *loader = open_squares_loader(images, labels, &ds, 1);
    Loader *tloader = open_squares_loader(timages, tlabels, &tds, 0);
    const TrainResult f = train_run(DT_F32, TRAIN_BATCH, loader, tloader);
    const TrainResult h = train_run(DT_F16, TRAIN_BATCH, loader, tloader);
    const TrainResult ha = train_run(DT_F16, TRAIN_BATCH / 3, loader, tloader);
    const TrainResult *runs[] = {&f, &h, &ha};
    for (int i = 0; i < 3; i++) {
        const TrainResult *r = runs[i];
        assert_true(r->loss[0] < 1.6);  // chance: log 4 = 1.39
        assert_true(r->loss[3] < 0.5 * r->loss[0]);
        assert_true(r->acc[3] > 0.9 && r->test_acc > 0.9);
        if (i) {
            // The default scale 65536 never overflows this net: no step skipped.
            assert_int_equal(r->skipped, 0);
            if (!(fabs(r->loss[3] - f.loss[3]) <= fmax(0.1 * f.loss[3], 0.02)))
                fail_msg("run %d: final loss %.4f, fp32 %.4f", i, r->loss[3], f.loss[3]);
            assert_true(fabs(r->test_acc - f.test_acc) <= 0.03);
        }
    }
    loader_destroy(loader);
    loader_destroy(tloader);
    dataset_close(ds);
    dataset_close(tds);
}

// ---- 6. the memory plan ------------------------------------------------------------------------

// The seed network's layer outputs (values per sample), models/mnist.cfg on 1x28x28.
static const size_t mnist_out[] = {32 * 26 * 26, 64 * 24 * 24, 64 * 12 * 12, 64 * 12 * 12,
                                   9216, 64, 64, 10, 10};
#define MNIST_NLAYERS ((int)(sizeof mnist_out / sizeof mnist_out[0]))

// The activations kept from forward for backward (live at the loss):
//   align64(B * 784 * 4)                                  the input batch (F32)
//   + align64(B * numel(out) * es) for conv1, conv2, flatten, fc1 and the second dropout
//     (the outputs a backward reads; test_net.c)
//   + align64(B * 9,216)                                  maxpool's argmax (bytes)
//   + 2 * align64(B * 10 * 4)                             log-probabilities, dlogp (F32)
//   + align64(B * 4) + align64(2 * 4) + align64(32)       labels, metrics, the loss scaler
// with es = 2 in fp16 and 4 in fp32.
static size_t mnist_kept(int B, size_t es) {
    size_t kept = align64((size_t)B * 784 * 4);
    const int read_back[] = {0, 1, 4, 5, 6};
    for (int k = 0; k < 5; k++) kept += align64((size_t)B * mnist_out[read_back[k]] * es);
    return kept + align64((size_t)B * 9216) + 2 * align64((size_t)B * 10 * 4) + align64((size_t)B * 4) + align64(NET_METRICS * 4) +
           align64(sizeof(ScalerState));
}

// workspace: fp16's four fp32 scratch buffers of `chunk` samples of the largest activation,
// chunk = min(B, 8 MB / (4 * 36,864 * 4)) = min(B, 14); then the largest conv workspace
// for a batch of `chunk`: conv1's (the direct kernels' partial sums, 64 blocks x (9 taps +
// 1) x 32 filters x 4 = 81,920 bytes) or conv2's Winograd workspace (testutil.c).
// The workspace of models/mnist.cfg at batch B: in fp16 the scratch's four slots of `chunk`
// samples of conv2's output (the largest activation), each layer running on as many
// samples as a slot holds of its own largest (conv1: 21,632 values), then the largest
// layer workspace (conv1's im2col chunk, or conv2's permuted weight and im2col chunk).
static size_t mnist_workspace(int B, bool fp16, int *chunk_out) {
    const size_t mb8 = (size_t)8 << 20, largest = 36864;
    size_t chunk = (size_t)B, scratch = 0;
    if (fp16) {
        chunk = mb8 / (4 * largest * 4) < chunk ? mb8 / (4 * largest * 4) : chunk;
        scratch = 4 * align64(chunk * largest * 4);
    }
    const size_t conv1 = 81920, conv2 = winograd_workspace((int)chunk, 24, 24, 32, 64);
    if (chunk_out) *chunk_out = (int)chunk;
    return scratch + (conv1 > conv2 ? conv1 : conv2);
}

static void test_memory_plan_fp16(void **state) {
    // The formula, pinned at the seed's batch of 64: fp16 9,479,552 bytes = 200,704 input
    // + 8,683,520 layer outputs + 589,824 argmax + 5,120 log-probabilities and dlogp + 256
    // labels + 64 metrics + 64 the loss scaler; fp32 18,163,072.
    assert_int_equal(sizeof(ScalerState), 32);
    assert_int_equal(mnist_kept(64, 2), 9479552);
    assert_int_equal(mnist_kept(64, 4), 18163072);
    Cfg cfg;
    load_mnist_cfg(&cfg);
    const Shape in = {.c = 1, .h = 28, .w = 28};
    const int batches[] = {64, 160, 3};  // the chunk stays 14 above 14
    for (int k = 0; k < 3; k++) {
        const int B = batches[k];
        Net h, f, ha;
        Error err = {{0}};
        if (net_create(&h, &cfg, in, 10, &(NetOptions){.batch = B, .precision = DT_F16}, cpu_kernels(), &err) ||
            net_create(&f, &cfg, in, 10, &(NetOptions){.batch = B, .precision = DT_F32}, cpu_kernels(), &err) ||
            net_create(&ha, &cfg, in, 10, &(NetOptions){.batch = B, .precision = DT_F16, .plan_only = true, .apart = true},
                       cpu_kernels(), &err))
            fail_msg("%s", err.msg);
        assert_int_equal(h.precision, DT_F16);
        assert_int_equal(f.plan.act_kept, mnist_kept(B, 4));
        assert_int_equal(h.plan.act_kept, mnist_kept(B, 2));
        const double ratio = (double)ha.plan.activations / f.plan.activations;
        print_message("batch %d: activations fp16 %zu bytes (every buffer apart %zu), fp32 %zu bytes (ratio %.4f); "
                      "workspace fp16 %zu (chunk %d), fp32 %zu\n", B, h.plan.activations, ha.plan.activations,
                      f.plan.activations, ratio, h.plan.workspace, exec_chunk(&h.exec, h.layers[1], B), f.plan.workspace);
        // About half: only the input, the output, dlogp, labels and metrics stay 4 bytes;
        // fp16's handoffs (every layer runs in chunks) take that lower still.
        assert_true(ratio > 0.5 && ratio < (B >= 64 ? 0.52 : 0.55));
        assert_true(h.plan.activations + h.plan.workspace <= ha.plan.activations + ha.plan.workspace);
        int chunk;  // the layers' workspace in the activation block or beside the scratch
        assert_int_equal(h.plan.workspace + h.plan.act_workspace, mnist_workspace(B, true, &chunk));
        assert_true(!h.plan.act_workspace || h.plan.workspace == h.scratch_bytes);
        assert_int_equal(exec_chunk(&h.exec, h.layers[1], B), chunk);
        assert_int_equal(chunk, B < 14 ? B : 14);
        assert_int_equal(h.scratch_bytes, 4 * align64((size_t)chunk * 36864 * 4));
        assert_int_equal(f.plan.workspace + f.plan.act_workspace, mnist_workspace(B, false, NULL));
        // Parameters, gradients and optimizer state stay fp32.
        assert_int_equal(h.plan.params, 609354 * 4);
        assert_int_equal(h.plan.grads, f.plan.grads);
        assert_int_equal(h.plan.optimizer, f.plan.optimizer);
        expect_activation_layout(&h);
        expect_activation_layout(&f);
        // The scratch buffers at the start of the workspace, the layers' after them (where
        // they are not in the activation block).
        for (int i = 0; i < 4; i++)
            assert_ptr_equal(h.exec.scratch[i], (char *)h.workspace + i * h.scratch_bytes / 4);
        assert_ptr_equal(h.layer_workspace, (char *)h.workspace + h.scratch_bytes);
        // The blocks are as large as the plan (ASan reports a short one).
        memset(h.activations, 0x44, h.plan.activations);
        memset(h.workspace, 0x55, h.plan.workspace);
        net_free(&h);
        net_free(&ha);
        net_free(&f);
    }
    cfg_free(&cfg);
}

// ---- main -----------------------------------------------------------------------------------

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_fp16"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    (void)argc;
    test_find_root(g_root, sizeof g_root, argv[0], "models/mnist.cfg");
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_to_float_all),
        cmocka_unit_test(test_half_round_trip_all),
        cmocka_unit_test(test_half_rounding_edges),
        cmocka_unit_test(test_half_random_floats),
        cmocka_unit_test(test_scaler_sequence),
        cmocka_unit_test(test_unscale_check),
        cmocka_unit_test(test_accumulate_fp32),
        cmocka_unit_test(test_accumulate_fp32_dropout),
        cmocka_unit_test(test_accumulate_fp16),
        cmocka_unit_test(test_accumulate_bf16),
        cmocka_unit_test(test_accumulate_batchnorm),
        cmocka_unit_test(test_fp16_against_fp32),
        cmocka_unit_test(test_bf16_against_fp32),
        cmocka_unit_test(test_fp16_resnet_against_fp32),
        cmocka_unit_test(test_fp16_overflow_flagged),
        cmocka_unit_test(test_fp16_chunks_seed_network),
        cmocka_unit_test(test_fp16_training_loss_falls),
        cmocka_unit_test(test_memory_plan_fp16),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
