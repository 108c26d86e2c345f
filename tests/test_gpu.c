// test_gpu.c: the CUDA kernel table (gpu/) against the CPU table (nn/cpu_kernels.c).
//
// Every kernel runs on both tables over the same fresh random inputs; outputs start
// poisoned (all bits set: NaN) wherever the kernel must write all of them, so an element
// the GPU forgets shows up. Tolerances:
//   exact (bits)  memory ops, im2col, col2im (the GPU sums each pixel's patches in the
//                 CPU's order), the Winograd transforms, the direct convolution (its sums in the CPU's order), bias + activation, ReLU, maxpool (first maximum, NaNs),
//                 dropout masks and values, layout permutes, the NLL gradient and correct
//                 count, fp16 conversions (all 65,536 halves; rounding ties, overflow,
//                 subnormals, NaN payloads) and bf16's (all 65,536; the same floats), unscale_check, scaler_update, and Adadelta,
//                 SGD and AdamW with their gates (the GPU replays the CPU's operations
//                 without FMA contraction);
//   gemm          |gpu - cpu| <= 1e-5 * (|alpha| * sum_k |a_ik b_kj| + |beta c_ij|),
//                 all four transpose combinations, beta 0 and 1; with gemm_arith
//                 TF32 2^-10 + 1e-5 instead of 1e-5, bf16 2^-7 + 1e-5; gemm_batched within 1e-5 * K (operands in
//                 [-1, 1]);
//   bias_act_backward  the activation's gradient exact; the bias gradient
//                 |gpu - cpu| <= 1e-5 * (sum_r |dout_rc| + |dbias_c|);
//   log_softmax   forward 1e-6 * (1 + |y|); backward 1e-6 * (|dy| + |exp(y) sum(dy)|);
//   NLL loss      1e-6 * (|metric| + sum |terms|);
//   a whole step  of a small network (conv, maxpool, relu, dropout, flatten, linear,
//                 log_softmax; one and two micro-batches, with and without activation
//                 checkpointing): log-probabilities within 1e-5,
//                 each gradient tensor within 1e-4 of its norm, each parameter tensor's
//                 Adadelta update within 1e-3 of its norm; fp16 storage within 1e-2;
//   checkpoints   written on one device and loaded on the other: bit-identical;
//   fused update  each module's update launched during backward (NetOptions.fused_update)
//                 against the update after backward, on the device: bit-identical.
//
// Without a usable GPU (a build without CUDA, or no device at run time) cuda_kernels()
// returns NULL and every GPU test prints why and is skipped, so the suite passes in CI.
// `test_gpu --require-gpu` (make test-gpu) fails instead of skipping. Linked with
// gpu/replay/host_replay.cu instead of the real table (make test-gpu-replay), the suite
// checks the CUDA kernels' per-element code replayed on the host, without a GPU.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../data/dataset.h"
#include "../nn/cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/half.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/rng.h"
#include "testutil.h"

static const Kernels *C;   // the CPU table (main)
static const Kernels *G;    // the CUDA table, or NULL
static char g_why[1024];    // why G is NULL
static bool g_require_gpu;  // --require-gpu: a missing GPU fails instead of skipping
static char g_dir[PATH_MAX];

#define NEED_GPU()                                                                  \
    do {                                                                            \
        if (!G) {                                                                   \
            if (g_require_gpu) fail_msg("--require-gpu: %s", g_why);                \
            print_message("[  SKIPPED ] no GPU: %s\n", g_why);                     \
            skip();                                                                 \
        }                                                                           \
    } while (0)

// ---- random test data (independent of the library's RNG) ------------------------------

static uint64_t g_rng = 1;

static void rng_seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ULL + 4242; }

static uint64_t urand64(void) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng_mix64(g_rng);
}

static double urand(void) { return (double)(urand64() >> 11) * (1.0 / 9007199254740992.0); }

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static float *rand_floats(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}

// Values with exact zeros of both signs among them, for comparisons with 0.
static float *rand_floats_zeros(int64_t n) {
    float *p = rand_floats(n, -1, 1);
    for (int64_t i = 0; i < n; i++) {
        const uint64_t r = urand64() % 16;
        if (r == 0) p[i] = 0.0f;
        if (r == 1) p[i] = -0.0f;
    }
    return p;
}

// For ReLU6 (act), values spread over [-8, 8] with exact 6s and their neighbours among them,
// for both sides of the kink at 6; other activations keep [-1, 1].
static void spread_for(Activation act, float *p, int64_t n) {
    if (act != ACT_RELU6) return;
    static const float at6[] = {6.0f, 5.9999995f, 6.0000005f};
    for (int64_t i = 0; i < n; i++) p[i] = i % 61 < 3 ? at6[i % 61] : p[i] * 8.0f;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

// ---- one buffer on both devices --------------------------------------------------------

typedef struct Buf {
    void *cpu, *gpu;
    size_t bytes;
} Buf;

static void *dev_alloc(const Kernels *k, size_t bytes) {
    void *p = k->alloc(bytes);
    if (!p) fail_msg("%s alloc of %zu bytes failed", k->name, bytes);
    return p;
}

// The same bytes on both devices.
static Buf buf_from(const void *host, size_t bytes) {
    Buf b = {dev_alloc(C, bytes), dev_alloc(G, bytes), bytes};
    C->upload(b.cpu, host, bytes);
    G->upload(b.gpu, host, bytes);
    return b;
}

// All bits set (NaN as floats): for outputs that the kernel must write in full.
static Buf buf_poison(size_t bytes) {
    void *h = xmalloc(bytes);
    memset(h, 0xff, bytes);
    Buf b = buf_from(h, bytes);
    free(h);
    return b;
}

static void buf_fetch(Buf b, void *cpu_host, void *gpu_host) {
    C->download(cpu_host, b.cpu, b.bytes);
    G->download(gpu_host, b.gpu, b.bytes);
}

static void buf_free(Buf b) {
    C->release(b.cpu);
    G->release(b.gpu);
}

// Runs `call` once with k = the CPU table and P(buf) its copies, once with the GPU's.
#define P(b) (side_ ? (b).gpu : (b).cpu)
#define BOTH(call)                                        \
    for (int side_ = 0; side_ < 2; side_++) {             \
        const Kernels *k = side_ ? G : C;                 \
        (void)k;                                          \
        call;                                             \
    }

// ---- comparisons ------------------------------------------------------------------------

// Bitwise equality of n 4- or 2-byte values (with nan_matches, a 4-byte NaN matches any
// NaN); the message names the first difference.
static void expect_bits(const void *cpu, const void *gpu, int64_t n, size_t size, bool nan_matches,
                        const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const char *a = (const char *)cpu + i * size, *b = (const char *)gpu + i * size;
        if (memcmp(a, b, size) == 0) continue;
        if (size == 4) {
            float x, y;
            uint32_t xb, yb;
            memcpy(&x, a, 4), memcpy(&y, b, 4), memcpy(&xb, a, 4), memcpy(&yb, b, 4);
            if (nan_matches && isnan(x) && isnan(y)) continue;
            fail_msg("%s: element %lld differs: cpu %.9g (0x%08x), gpu %.9g (0x%08x)", what,
                     (long long)i, x, xb, y, yb);
        } else {
            uint16_t x, y;
            memcpy(&x, a, 2), memcpy(&y, b, 2);
            fail_msg("%s: element %lld differs: cpu 0x%04x, gpu 0x%04x", what, (long long)i, x, y);
        }
    }
}

// Bit for bit, NaN payloads included: for the kernels whose payloads are their own work
// (the fp16 conversions).
static void expect_same_bits(const void *cpu, const void *gpu, int64_t n, size_t size,
                             const char *what) {
    expect_bits(cpu, gpu, n, size, false, what);
}

// The same values: bit for bit, except that a NaN matches any NaN. The payload of a NaN
// that arithmetic makes is the hardware's (x86: the operand's or 0x7fc00000; NVIDIA GPUs:
// 0x7fffffff; seen on an H100), not the kernels'.
static void expect_same_f32(const float *cpu, const float *gpu, int64_t n, const char *what) {
    expect_bits(cpu, gpu, n, 4, true, what);
}

// |gpu - cpu| <= bound[i] for every i, and NaN nowhere.
static void expect_within(const float *cpu, const float *gpu, const double *bound, int64_t n,
                          const char *what) {
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)gpu[i] - cpu[i]);
        if (!(d <= bound[i]))
            fail_msg("%s: element %lld: cpu %.9g, gpu %.9g, |difference| %.3g > bound %.3g",
                     what, (long long)i, cpu[i], gpu[i], d, bound[i]);
    }
}

static double norm_diff(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

static double norm(const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

// ---- the backend itself (runs without a GPU too) ------------------------------------------

static void test_backend(void **state) {
    Error err = {{0}};
    const Kernels *k = cuda_kernels(&err);
    Error err2 = {{0}};
    const Kernels *k2 = kernels_for_device("cuda", &err2);
    assert_ptr_equal(k, k2);  // the same answer every time
    if (!k) {
        // The message says it is about device=cuda and what happened.
        if (strncmp(err.msg, "device=cuda: ", 13) != 0 || strlen(err.msg) < 30)
            fail_msg("cuda_kernels: unhelpful message '%s'", err.msg);
        assert_string_equal(err.msg, err2.msg);
        print_message("[     INFO ] %s\n", err.msg);
        return;
    }
    assert_string_equal(k->name, "cuda");
    const void *fns[] = {
        (void *)k->alloc, (void *)k->release, (void *)k->upload, (void *)k->download,
        (void *)k->zero, (void *)k->copy, (void *)k->sync, (void *)k->shard_count, (void *)k->shards,
        (void *)k->add_parts, (void *)k->gemm, (void *)k->im2col,
        (void *)k->gemm_batched, (void *)k->winograd_input, (void *)k->winograd_input_backward,
        (void *)k->winograd_output, (void *)k->winograd_output_backward,
        (void *)k->winograd_weights, (void *)k->winograd_weights_backward,
        (void *)k->col2im, (void *)k->conv_direct_forward, (void *)k->conv_direct_backward,
        (void *)k->conv_grouped_forward, (void *)k->conv_grouped_backward_data,
        (void *)k->conv_grouped_backward_weight, (void *)k->conv_grouped_scratch_floats,
        (void *)k->bias_act_forward, (void *)k->bias_act_backward, (void *)k->relu_forward, (void *)k->relu_backward,
        (void *)k->maxpool_forward, (void *)k->maxpool_backward, (void *)k->dropout_forward,
        (void *)k->dropout_backward, (void *)k->nhwc_to_nchw, (void *)k->nchw_to_nhwc,
        (void *)k->log_softmax_forward, (void *)k->log_softmax_backward, (void *)k->nll_loss,
        (void *)k->f32_to_f16, (void *)k->f16_to_f32, (void *)k->f32_to_bf16, (void *)k->bf16_to_f32, (void *)k->u8_to_f32, (void *)k->unscale_check, (void *)k->scaler_update,
        (void *)k->device_memory, (void *)k->gemm_arith,
        (void *)k->adadelta_step, (void *)k->add_act, (void *)k->avgpool_forward,
        (void *)k->avgpool_backward, (void *)k->global_avgpool_forward,
        (void *)k->global_avgpool_backward, (void *)k->bn_sums, (void *)k->bn_batch_stats,
        (void *)k->bn_eval_stats, (void *)k->bn_forward, (void *)k->bn_backward_sums,
        (void *)k->bn_backward, (void *)k->bn_param_grads, (void *)k->sgd_step,
        (void *)k->adamw_step, (void *)k->optim_step_packed, (void *)k->sum_squares,
        (void *)k->clip_scale, (void *)k->act_pack, (void *)k->act_unpack,
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (!fns[i]) fail_msg("the CUDA table's entry %zu is NULL", i);
}

// ---- memory ---------------------------------------------------------------------------------

static void test_memory(void **state) {
    NEED_GPU();
    rng_seed(1);
    const int64_t n = 100003;
    float *h = rand_floats(n, -5, 5), *back = xmalloc(n * sizeof *back);
    float *d = dev_alloc(G, n * sizeof *d), *e = dev_alloc(G, n * sizeof *e);
    G->upload(d, h, n * sizeof *h);
    G->download(back, d, n * sizeof *back);
    expect_same_f32(h, back, n, "upload/download");
    // copy, then zero a middle range, then an upload at an offset.
    G->copy(e, d, n * sizeof *d);
    G->zero(e + 1000, 5000 * sizeof *e);
    G->upload(e + 50000, h, 7 * sizeof *h);
    G->sync();
    G->download(back, e, n * sizeof *back);
    for (int64_t i = 0; i < n; i++) {
        float want = h[i];
        if (i >= 1000 && i < 6000) want = 0.0f;
        if (i >= 50000 && i < 50007) want = h[i - 50000];
        if (memcmp(&want, &back[i], 4) != 0)
            fail_msg("copy/zero/upload: element %lld: want %g, got %g", (long long)i, want, back[i]);
    }
    // Zero bytes are allowed everywhere; alloc(0) gives a pointer that can be released.
    G->upload(d, h, 0);
    G->download(back, d, 0);
    G->copy(e, d, 0);
    G->zero(d, 0);
    void *z = G->alloc(0);
    assert_non_null(z);
    G->release(z);
    // Failure is NULL, not an abort, and the table keeps working afterwards.
    assert_null(G->alloc((size_t)1 << 60));
    G->download(back, d, sizeof *back);
    assert_memory_equal(back, h, sizeof *back);
    G->release(d);
    G->release(e);
    G->release(NULL);
    free(h);
    free(back);
}

// Sizes past 2^31 elements: a kernel over 2^31 + 20483 floats (8.6 GB) must reach the end.
static void test_64bit_sizes(void **state) {
    NEED_GPU();
    enum { WIN = 8192 };
    // Three windows that do not overlap: the first elements, the two sides of 2^31, the last.
    const int64_t n = ((int64_t)1 << 31) + 2 * WIN + 4099;
    float *d = G->alloc((size_t)n * sizeof(float));
    if (!d) {
        print_message("[  SKIPPED ] this GPU has no room for %.1f GB\n", n * 4 / 1e9);
        skip();
    }
    G->zero(d, (size_t)n * sizeof(float));
    const int64_t at[] = {0, ((int64_t)1 << 31) - WIN / 2, n - WIN};
    float *h = rand_floats(WIN, -1, 1), *back = xmalloc(WIN * sizeof *back);
    for (int j = 0; j < 3; j++) G->upload(d + at[j], h, WIN * sizeof *h);
    G->relu_forward(d, d, n, ACT_RELU);  // in place
    ScalerState st = {.scale = 0.5}, *dst = dev_alloc(G, sizeof st);
    G->upload(dst, &st, sizeof st);
    G->unscale_check(d, n, dst);
    for (int j = 0; j < 3; j++) {
        G->download(back, d + at[j], WIN * sizeof *back);
        for (int i = 0; i < WIN; i++) {
            const float want = (h[i] > 0 ? h[i] : 0.0f) * 2.0f;
            if (back[i] != want)
                fail_msg("element %lld: want %g, got %g", (long long)(at[j] + i), want, back[i]);
        }
    }
    G->download(&st, dst, sizeof st);
    assert_true(st.found == 0.0f);
    G->release(d);
    G->release(dst);
    free(h);
    free(back);
}

// ---- gemm -------------------------------------------------------------------------------------

// The GPU's gemm against the CPU's: |gpu - cpu| <= rel * (|alpha| sum |a b| + |beta c|),
// with the GPU's inputs rounded as arith says.
static void check_gemm_as(int M, int N, int K, bool ta, bool tb, float alpha, float beta,
                          GemmArith arith, double rel) {
    const float *A = rand_floats((int64_t)M * K, -1, 1), *B = rand_floats((int64_t)K * N, -1, 1);
    float *C0 = rand_floats((int64_t)M * N, -1, 1);
    Buf a = buf_from(A, (size_t)M * K * 4), b = buf_from(B, (size_t)K * N * 4),
        c = buf_from(C0, (size_t)M * N * 4);
    G->gemm_arith(arith);
    BOTH(k->gemm(P(c), P(a), P(b), M, N, K, ta, tb, alpha, beta));
    G->gemm_arith(GEMM_FP32);
    float *hc = xmalloc((size_t)M * N * 4), *hg = xmalloc((size_t)M * N * 4);
    buf_fetch(c, hc, hg);
    double *bound = xmalloc((size_t)M * N * sizeof *bound);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int p = 0; p < K; p++) {
                const float x = ta ? A[(int64_t)p * M + i] : A[(int64_t)i * K + p];
                const float y = tb ? B[(int64_t)j * K + p] : B[(int64_t)p * N + j];
                s += fabs((double)x * y);
            }
            bound[(int64_t)i * N + j] =
                rel * (fabs(alpha) * s + fabs(beta * C0[(int64_t)i * N + j])) + 1e-30;
        }
    char what[128];
    static const char *const arith_names[] = {"", " (tf32)", " (bf16)"};
    snprintf(what, sizeof what, "gemm%s M=%d N=%d K=%d transA=%d transB=%d alpha=%g beta=%g",
             arith_names[arith], M, N, K, ta, tb, alpha, beta);
    expect_within(hc, hg, bound, (int64_t)M * N, what);
    buf_free(a), buf_free(b), buf_free(c);
    free((void *)A), free((void *)B), free(C0), free(hc), free(hg), free(bound);
}

static void check_gemm(int M, int N, int K, bool ta, bool tb, float alpha, float beta) {
    check_gemm_as(M, N, K, ta, tb, alpha, beta, GEMM_FP32, 1e-5);
}

static void test_gemm(void **state) {
    NEED_GPU();
    rng_seed(2);
    // Odd sizes, a vector, the shapes of the seed network's layers (conv1 forward, conv2
    // weight gradient, fc1 forward and its weight gradient).
    static const int shapes[][3] = {{1, 1, 1},    {37, 53, 29},  {3, 1000, 17}, {1, 64, 9216},
                                    {676, 32, 9}, {64, 288, 576}, {64, 64, 9216}, {64, 9216, 64}};
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 1.0f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 3; j++)
                check_gemm(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, ab[j][0],
                           ab[j][1]);
}

// gemm_arith: TF32 inputs (each within 2^-11 of the fp32 value, a product within 2^-10) or
// bf16 inputs (2^-8, a product within 2^-7) with fp32 accumulation; afterwards the GEMMs
// are fp32 again (test_gemm's bound).
static void test_gemm_arith(void **state) {
    NEED_GPU();
    rng_seed(3);
    static const int shapes[][3] = {{37, 53, 29}, {64, 288, 576}, {256, 64, 1152}, {64, 9216, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            check_gemm_as(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 1.0f, GEMM_TF32,
                          0x1p-10 + 1e-5);
            check_gemm_as(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 1.0f, GEMM_BF16,
                          0x1p-7 + 1e-5);
            check_gemm(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 0.0f);
        }
}

// ---- convolution lowering ----------------------------------------------------------------

typedef struct ConvGeom {
    int N, H, W, C, K, stride, pad;
} ConvGeom;

static const ConvGeom conv_geoms[] = {
    {2, 7, 7, 1, 3, 1, 0},  {3, 8, 6, 3, 3, 1, 1},  {2, 9, 11, 4, 3, 2, 1}, {1, 10, 10, 2, 5, 2, 2},
    {2, 5, 5, 6, 1, 1, 0},  {1, 6, 7, 3, 2, 3, 0},  {1, 4, 4, 2, 3, 1, 3},  {4, 28, 28, 32, 3, 1, 0},
};

static void test_im2col_col2im(void **state) {
    NEED_GPU();
    rng_seed(3);
    for (size_t t = 0; t < sizeof conv_geoms / sizeof conv_geoms[0]; t++) {
        const ConvGeom g = conv_geoms[t];
        const int OH = (g.H + 2 * g.pad - g.K) / g.stride + 1, OW = (g.W + 2 * g.pad - g.K) / g.stride + 1;
        const int64_t nin = (int64_t)g.N * g.H * g.W * g.C, ncol = (int64_t)g.N * OH * OW * g.C * g.K * g.K;
        float *x = rand_floats(nin, -1, 1), *dcol = rand_floats(ncol, -1, 1);
        Buf in = buf_from(x, nin * 4), col = buf_poison(ncol * 4), dc = buf_from(dcol, ncol * 4),
            din = buf_poison(nin * 4);
        BOTH(k->im2col(P(col), P(in), g.N, g.H, g.W, g.C, g.K, g.stride, g.pad, OH, OW));
        BOTH(k->col2im(P(din), P(dc), g.N, g.H, g.W, g.C, g.K, g.stride, g.pad, OH, OW));
        const int64_t most = ncol > nin ? ncol : nin;
        float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
        char what[128];
        snprintf(what, sizeof what, "im2col N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d", g.N, g.H,
                 g.W, g.C, g.K, g.stride, g.pad);
        buf_fetch(col, hc, hg);
        expect_same_f32(hc, hg, ncol, what);
        buf_fetch(din, hc, hg);
        memcpy(what, "col2im", 6);
        expect_same_f32(hc, hg, nin, what);
        buf_free(in), buf_free(col), buf_free(dc), buf_free(din);
        free(x), free(dcol), free(hc), free(hg);
    }
}

// Winograd F(2x2, 3x3): every transform bit-exact (the GPU repeats the CPU's operations
// and its order of sums), over odd and even extents, paddings 0-2 and channel counts that
// are not multiples of the CPU's vectors of 8; the batched GEMM as gemm's bound.
static void test_winograd(void **state) {
    NEED_GPU();
    rng_seed(17);
    static const ConvGeometry geoms[] = {
        {2, 7, 6, 5, 3, 1, 1, 7, 6, 3},
        {3, 14, 14, 32, 3, 1, 1, 14, 14, 16},
        {1, 6, 9, 17, 3, 1, 0, 4, 7, 9},
        {2, 4, 5, 2, 3, 1, 2, 6, 7, 11},
        {1, 8, 8, 3, 3, 1, 1, 8, 8, 2},  // an even number of tile rows: the last row zeroed
    };
    for (size_t t = 0; t < sizeof geoms / sizeof geoms[0]; t++) {
        const ConvGeometry g = geoms[t];
        const int64_t T = winograd_tiles(g), sv = winograd_stride(T, g.C), sm = winograd_stride(T, g.OC);
        const int64_t nin = (int64_t)g.N * g.H * g.W * g.C, nout = (int64_t)g.N * g.OH * g.OW * g.OC;
        const int64_t nw = (int64_t)g.OC * g.C * 9, nu = 16 * (int64_t)g.OC * g.C;
        float *x = rand_floats(nin, -1, 1), *dy = rand_floats(nout, -1, 1), *w = rand_floats(nw, -1, 1);
        float *dw0 = rand_floats(nw, -1, 1), *vm = rand_floats(16 * sv, -1, 1), *mm = rand_floats(16 * sm, -1, 1);
        float *um = rand_floats(nu, -1, 1);
        Buf in = buf_from(x, nin * 4), dout = buf_from(dy, nout * 4), wt = buf_from(w, nw * 4);
        Buf dw = buf_from(dw0, nw * 4), V = buf_poison(16 * sv * 4), M = buf_poison(16 * sm * 4);
        Buf U = buf_poison(nu * 4), dV = buf_from(vm, 16 * sv * 4), Mi = buf_from(mm, 16 * sm * 4);
        Buf out = buf_poison(nout * 4), din = buf_poison(nin * 4), Ub = buf_from(um, nu * 4);
        Buf P1 = buf_poison(16 * sm * 4), dU = buf_poison(nu * 4);
        BOTH(k->winograd_input(P(V), P(in), g));
        BOTH(k->winograd_input_backward(P(din), P(dV), g));
        BOTH(k->winograd_output(P(out), P(Mi), g));
        BOTH(k->winograd_output_backward(P(M), P(dout), g));
        BOTH(k->winograd_weights(P(U), P(wt), g.OC, g.C));
        BOTH(k->winograd_weights_backward(P(dw), P(Ub), g.OC, g.C));
        BOTH(k->gemm_batched(P(P1), P(dV), P(Ub), 16, (int)T, g.OC, g.C, false, true, 1.0f, 0.0f, sm, sv,
                             (int64_t)g.OC * g.C));
        BOTH(k->zero(P(dU), nu * 4));
        BOTH(k->gemm_batched(P(dU), P(Mi), P(dV), 16, g.OC, g.C, (int)T, true, false, 1.0f, 1.0f,
                             (int64_t)g.OC * g.C, sm, sv));
        const int64_t most = 16 * (sv > sm ? sv : sm) + nin + nout + nu;
        float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
        char what[160];
        const struct { Buf b; int64_t n, stride, cols; const char *name; } exact[] = {
            {V, 16 * sv, sv, T * g.C, "winograd_input"},
            {din, nin, nin, nin, "winograd_input_backward"},
            {out, nout, nout, nout, "winograd_output"},
            {M, 16 * sm, sm, T * g.OC, "winograd_output_backward"},
            {U, nu, nu, nu, "winograd_weights"},
            {dw, nw, nw, nw, "winograd_weights_backward"},
        };
        for (size_t e = 0; e < sizeof exact / sizeof exact[0]; e++) {
            buf_fetch(exact[e].b, hc, hg);
            // Only the matrices' rows: the padding between them is never written.
            for (int64_t m = 0; m < exact[e].n; m += exact[e].stride) {
                snprintf(what, sizeof what, "%s (matrix at %lld) N=%d H=%d W=%d C=%d pad=%d OC=%d",
                         exact[e].name, (long long)m, g.N, g.H, g.W, g.C, g.pad, g.OC);
                expect_same_f32(hc + m, hg + m, exact[e].cols, what);
            }
        }
        // The products: within gemm's bound, 1e-5 of the sum of |terms| (<= K at |x| <= 1).
        const struct { Buf b; int64_t stride, rows, cols, K; const char *name; } products[] = {
            {P1, sm, T, g.OC, g.C, "gemm_batched (V U^T)"},
            {dU, (int64_t)g.OC * g.C, g.OC, g.C, T, "gemm_batched (M^T V, accumulated)"},
        };
        for (size_t e = 0; e < 2; e++) {
            buf_fetch(products[e].b, hc, hg);
            for (int m = 0; m < 16; m++)
                for (int64_t i = 0; i < products[e].rows * products[e].cols; i++) {
                    const float a = hc[m * products[e].stride + i], b = hg[m * products[e].stride + i];
                    if (!(fabs((double)a - b) <= 1e-5 * products[e].K))
                        fail_msg("%s matrix %d element %lld: cpu %.9g gpu %.9g", products[e].name, m,
                                 (long long)i, a, b);
                }
        }
        buf_free(in), buf_free(dout), buf_free(wt), buf_free(dw), buf_free(V), buf_free(M);
        buf_free(U), buf_free(dV), buf_free(Mi), buf_free(out), buf_free(din), buf_free(Ub);
        buf_free(P1), buf_free(dU);
        free(x), free(dy), free(w), free(dw0), free(vm), free(mm), free(um), free(hc), free(hg);
    }
}

// The direct convolution: forward, and backward with and without the input gradient,
// bit-exact (the GPU sums in the CPU's order). Channel counts cover the CPU's vector
// blocks (AVX-512's of 32 and 16, AVX2's of 32 and 8) and its scalar remainder; pixel
// counts are not multiples of the CPU's groups of 4 or of CONV_DIRECT_PART_ROWS.
static void test_conv_direct(void **state) {
    NEED_GPU();
    rng_seed(13);
    static const ConvGeometry geoms[] = {
        {3, 28, 28, 1, 3, 1, 0, 26, 26, 32},  // the seed network's conv1
        {2, 7, 6, 2, 3, 2, 1, 4, 3, 13},
        {2, 5, 9, 3, 3, 1, 1, 5, 9, 40},
        {2, 5, 7, 1, 3, 1, 1, 5, 7, 59},  // 32 + 16 + 8 + 3
        {5, 11, 10, 1, 5, 2, 2, 6, 5, 8},
        {1, 2, 3, 3, 1, 2, 1, 2, 3, 5},  // 1x1 strided and padded
    };
    for (size_t gi = 0; gi < sizeof geoms / sizeof geoms[0]; gi++)
        for (int act = 0; act < ACT_COUNT; act++) {
            const ConvGeometry g = geoms[gi];
            const int taps = g.C * g.K * g.K;
            const int64_t nin = (int64_t)g.N * g.H * g.W * g.C, nout = (int64_t)g.N * g.OH * g.OW * g.OC;
            float *x = rand_floats_zeros(nin), *wt = rand_floats(g.OC * taps, -0.5f, 0.5f),
                  *b = rand_floats(g.OC, -0.5f, 0.5f), *dy = rand_floats_zeros(nout),
                  *dw0 = rand_floats(g.OC * taps, -1, 1), *db0 = rand_floats(g.OC, -1, 1);
            spread_for((Activation)act, x, nin);
            Buf in = buf_from(x, nin * 4), w = buf_from(wt, g.OC * taps * 4), bias = buf_from(b, g.OC * 4),
                out = buf_poison(nout * 4), dout = buf_from(dy, nout * 4), din = buf_poison(nin * 4),
                dw = buf_from(dw0, g.OC * taps * 4), db = buf_from(db0, g.OC * 4),
                partial = buf_poison(conv_direct_partial_floats(g) * 4);
            const int64_t most = nout > nin ? nout : nin;
            float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
            char what[160];
            snprintf(what, sizeof what, "N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d OC=%d act=%s", g.N,
                     g.H, g.W, g.C, g.K, g.stride, g.pad, g.OC, activation_names[act]);
            char msg[200];
            // Without a bias first, then with: out is the layer's output for backward.
            BOTH(k->conv_direct_forward(P(out), P(in), P(w), NULL, g, (Activation)act));
            buf_fetch(out, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_forward no bias %s", what);
            expect_same_f32(hc, hg, nout, msg);
            BOTH(k->conv_direct_forward(P(out), P(in), P(w), P(bias), g, (Activation)act));
            buf_fetch(out, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_forward %s", what);
            expect_same_f32(hc, hg, nout, msg);
            // The parameter gradients accumulate: twice, the second time with din.
            BOTH(k->conv_direct_backward(NULL, P(dw), P(db), P(partial), P(dout), P(in), P(out), P(w), g,
                                         (Activation)act));
            BOTH(k->conv_direct_backward(P(din), P(dw), P(db), P(partial), P(dout), P(in), P(out), P(w),
                                         g, (Activation)act));
            buf_fetch(dw, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_backward dw %s", what);
            expect_same_f32(hc, hg, g.OC * taps, msg);
            buf_fetch(db, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_backward dbias %s", what);
            expect_same_f32(hc, hg, g.OC, msg);
            buf_fetch(din, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_backward din %s", what);
            expect_same_f32(hc, hg, nin, msg);
            // A layer without bias: dbias NULL, the weight gradient as before.
            BOTH(k->conv_direct_backward(NULL, P(dw), NULL, P(partial), P(dout), P(in), P(out), P(w), g,
                                         (Activation)act));
            buf_fetch(dw, hc, hg);
            snprintf(msg, sizeof msg, "conv_direct_backward without bias, dw %s", what);
            expect_same_f32(hc, hg, g.OC * taps, msg);
            buf_free(in), buf_free(w), buf_free(bias), buf_free(out), buf_free(dout), buf_free(din);
            buf_free(dw), buf_free(db), buf_free(partial);
            free(x), free(wt), free(b), free(dy), free(dw0), free(db0), free(hc), free(hg);
        }
}

// The grouped convolution, bit-exact: forward (with and without bias, each activation),
// the input gradient, and the weight gradient accumulated twice (the GPU's row sums added in
// the CPU's order). Depthwise with one filter per channel takes the CPU's vector kernels
// (43 channels: vectors of 32 and 8 and 3 left; 264 and 1,900: the wide layers' paths), the
// rest its plain loops.
static void test_conv_grouped(void **state) {
    NEED_GPU();
    rng_seed(19);
    static const struct { ConvGeometry g; int groups; } cases[] = {
        {{2, 7, 6, 43, 3, 1, 1, 7, 6, 43}, 43},
        {{3, 9, 8, 43, 3, 2, 1, 5, 4, 43}, 43},
        {{2, 8, 7, 16, 3, 2, 0, 3, 3, 16}, 16},
        {{1, 7, 7, 9, 5, 1, 2, 7, 7, 9}, 9},
        {{2, 6, 5, 5, 3, 1, 1, 6, 5, 10}, 5},   // a multiplier of 2
        {{2, 6, 6, 8, 3, 2, 1, 3, 3, 12}, 4},   // 4 groups of 2 channels, 3 filters each
        {{1, 5, 5, 8, 1, 1, 0, 5, 5, 8}, 2},
        {{2, 5, 4, 264, 3, 1, 1, 5, 4, 264}, 264},      // wide: 8 channels' sums in registers, rows fetched ahead
        {{2, 7, 6, 264, 3, 2, 1, 4, 3, 264}, 264},
        {{1, 3, 3, 1900, 3, 1, 1, 3, 3, 1900}, 1900},  // two blocks of transposed weights
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
        for (int act = 0; act < ACT_COUNT; act++) {
            const ConvGeometry g = cases[t].g;
            const int groups = cases[t].groups;
            const int64_t nin = (int64_t)g.N * g.H * g.W * g.C, nout = (int64_t)g.N * g.OH * g.OW * g.OC;
            const int64_t nw = (int64_t)g.OC * (g.C / groups) * g.K * g.K;
            float *x = rand_floats_zeros(nin), *wt = rand_floats(nw, -0.5f, 0.5f), *b = rand_floats(g.OC, -0.5f, 0.5f),
                  *dy = rand_floats_zeros(nout), *dw0 = rand_floats(nw, -1, 1);
            const int64_t scratch_c = C->conv_grouped_scratch_floats(g, groups),
                          scratch_g = G->conv_grouped_scratch_floats(g, groups);
            Buf in = buf_from(x, nin * 4), w = buf_from(wt, nw * 4), bias = buf_from(b, g.OC * 4),
                out = buf_poison(nout * 4), dout = buf_from(dy, nout * 4), din = buf_poison(nin * 4),
                dw = buf_from(dw0, nw * 4),
                scratch = {dev_alloc(C, (scratch_c + 1) * 4), dev_alloc(G, (scratch_g + 1) * 4), 0};
            const int64_t most = nout > nin ? nout : nin;
            float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
            char what[160], msg[200];
            snprintf(what, sizeof what, "N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d OC=%d groups=%d act=%s", g.N,
                     g.H, g.W, g.C, g.K, g.stride, g.pad, g.OC, groups, activation_names[act]);
            BOTH(k->conv_grouped_forward(P(out), P(in), P(w), NULL, g, groups, (Activation)act));
            buf_fetch(out, hc, hg);
            snprintf(msg, sizeof msg, "conv_grouped_forward no bias %s", what);
            expect_same_f32(hc, hg, nout, msg);
            BOTH(k->conv_grouped_forward(P(out), P(in), P(w), P(bias), g, groups, (Activation)act));
            buf_fetch(out, hc, hg);
            snprintf(msg, sizeof msg, "conv_grouped_forward %s", what);
            expect_same_f32(hc, hg, nout, msg);
            BOTH(k->conv_grouped_backward_data(P(din), P(dout), P(w), g, groups));
            buf_fetch(din, hc, hg);
            snprintf(msg, sizeof msg, "conv_grouped_backward_data %s", what);
            expect_same_f32(hc, hg, nin, msg);
            for (int twice = 0; twice < 2; twice++)
                BOTH(k->conv_grouped_backward_weight(P(dw), P(scratch), P(dout), P(in), g, groups));
            buf_fetch(dw, hc, hg);
            snprintf(msg, sizeof msg, "conv_grouped_backward_weight %s", what);
            expect_same_f32(hc, hg, nw, msg);
            buf_free(in), buf_free(w), buf_free(bias), buf_free(out), buf_free(dout), buf_free(din);
            buf_free(dw), buf_free(scratch);
            free(x), free(wt), free(b), free(dy), free(dw0), free(hc), free(hg);
        }
}

// ---- elementwise and reductions ------------------------------------------------------------

static void test_bias_act(void **state) {
    NEED_GPU();
    rng_seed(4);
    static const int shapes[][2] = {{1, 1}, {43264, 32}, {64, 64}, {7, 1000}, {3, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int act = 0; act < ACT_COUNT; act++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
                float *x = rand_floats_zeros(n), *b = rand_floats(cols, -0.5f, 0.5f);
                spread_for((Activation)act, x, n);
                Buf out = buf_from(x, n * 4), bias = buf_from(b, cols * 4);
                BOTH(k->bias_act_forward(P(out), with_bias ? P(bias) : NULL, rows, (int)cols,
                                         (Activation)act));
                float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
                buf_fetch(out, hc, hg);
                char what[96];
                snprintf(what, sizeof what, "bias_act_forward %lldx%lld act=%s bias=%d",
                         (long long)rows, (long long)cols, activation_names[act], with_bias);
                expect_same_f32(hc, hg, n, what);
                buf_free(out), buf_free(bias);
                free(x), free(b), free(hc), free(hg);
            }
}

static void test_relu(void **state) {
    NEED_GPU();
    rng_seed(5);
    const int64_t n = 300007;
    for (int act = ACT_RELU; act < ACT_COUNT; act++) {
        float *x = rand_floats_zeros(n), *dy = rand_floats(n, -1, 1);
        spread_for((Activation)act, x, n);
        x[5] = NAN, x[6] = -NAN, x[7] = INFINITY, x[8] = -INFINITY;
        Buf in = buf_from(x, n * 4), out = buf_poison(n * 4), dout = buf_from(dy, n * 4),
            din = buf_poison(n * 4);
        BOTH(k->relu_forward(P(out), P(in), n, (Activation)act));
        BOTH(k->relu_backward(P(din), P(dout), P(out), n, (Activation)act));
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        char what[64];
        buf_fetch(out, hc, hg);
        snprintf(what, sizeof what, "relu_forward %s", activation_names[act]);
        expect_same_f32(hc, hg, n, what);
        buf_fetch(din, hc, hg);
        snprintf(what, sizeof what, "relu_backward %s", activation_names[act]);
        expect_same_f32(hc, hg, n, what);
        buf_free(in), buf_free(out), buf_free(dout), buf_free(din);
        free(x), free(dy), free(hc), free(hg);
    }
}

// add_parts: the same order of additions on both, so the same bits; 1 to 5 parts apart
// by more than n (a shard's dU and dbias, then padding).
static void test_add_parts(void **state) {
    NEED_GPU();
    rng_seed(17);
    const int64_t n = 70001, stride = 70016;
    for (int count = 1; count <= 5; count++) {
        float *parts = rand_floats(stride * count, -1, 1), *dst = rand_floats(n, -1, 1);
        Buf p = buf_from(parts, stride * count * 4), d = buf_from(dst, n * 4);
        BOTH(k->add_parts(P(d), P(p), count, n, stride));
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        buf_fetch(d, hc, hg);
        expect_same_f32(hc, hg, n, "add_parts");
        buf_free(p), buf_free(d);
        free(parts), free(dst), free(hc), free(hg);
    }
}

static void test_bias_act_backward(void **state) {
    NEED_GPU();
    rng_seed(6);
    static const int shapes[][2] = {{1, 1}, {43264, 32}, {36864, 64}, {64, 64}, {7, 1000}, {1000, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int act = 0; act < ACT_COUNT; act++) {
            const int64_t rows = shapes[s][0], n = rows * shapes[s][1];
            const int cols = shapes[s][1];
            float *dy = rand_floats(n, -1, 1), *y = rand_floats_zeros(n), *db0 = rand_floats(cols, -1, 1);
            spread_for((Activation)act, y, n);
            y[0] = NAN;
            Buf dout = buf_from(dy, n * 4), out = buf_from(y, n * 4), db = buf_from(db0, cols * 4);
            BOTH(k->bias_act_backward(P(db), P(dout), P(out), rows, cols, (Activation)act));  // accumulates
            float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
            char what[96];
            snprintf(what, sizeof what, "bias_act_backward %lldx%d act=%s", (long long)rows, cols,
                     activation_names[act]);
            buf_fetch(dout, hc, hg);
            expect_same_f32(hc, hg, n, what);  // the activation's gradient, exact
            double *bound = xmalloc(cols * sizeof *bound);
            for (int c = 0; c < cols; c++) {
                double sum = fabs(db0[c]);
                for (int64_t r = 0; r < rows; r++) sum += fabs(hc[r * cols + c]);
                bound[c] = 1e-5 * sum;
            }
            buf_fetch(db, hc, hg);
            expect_within(hc, hg, bound, cols, what);
            // Without a bias (dbias NULL): the activation's gradient alone.
            Buf d2 = buf_from(dy, n * 4);
            BOTH(k->bias_act_backward(NULL, P(d2), P(out), rows, cols, (Activation)act));
            buf_fetch(d2, hc, hg);
            expect_same_f32(hc, hg, n, what);
            buf_free(d2);
            buf_free(dout), buf_free(out), buf_free(db);
            free(dy), free(y), free(db0), free(hc), free(hg), free(bound);
        }
}

// ---- pooling ----------------------------------------------------------------------------------

static void test_maxpool(void **state) {
    NEED_GPU();
    rng_seed(7);
    // Non-overlapping, overlapping (stride < K), leftover rows and columns, K = 1, padded
    // (the ResNet stem's 3x3 stride 2 pad 1); inputs drawn from a few values so that windows
    // have ties (the first maximum takes the gradient), one with a channel of -inf, one with NaNs.
    static const int geoms[][7] = {  // N, H, W, C, K, stride, pad
        {2, 24, 24, 64, 2, 2, 0}, {3, 7, 9, 5, 3, 2, 0}, {2, 6, 6, 3, 3, 1, 0},
        {1, 5, 7, 2, 2, 3, 0},    {2, 4, 4, 3, 1, 1, 0}, {2, 12, 11, 6, 3, 2, 1},
        {2, 5, 5, 3, 2, 1, 1},    {1, 5, 5, 2, 3, 2, 1}, {2, 8, 8, 4, 2, 2, 0}};
    for (size_t t = 0; t < sizeof geoms / sizeof geoms[0]; t++) {
        const int N = geoms[t][0], H = geoms[t][1], W = geoms[t][2], Cc = geoms[t][3],
                  K = geoms[t][4], S = geoms[t][5], pad = geoms[t][6];
        const int OH = (H + 2 * pad - K) / S + 1, OW = (W + 2 * pad - K) / S + 1;
        const int64_t nin = (int64_t)N * H * W * Cc, nout = (int64_t)N * OH * OW * Cc;
        float *x = xmalloc(nin * 4), *dy = rand_floats(nout, -1, 1);
        for (int64_t i = 0; i < nin; i++) x[i] = (float)(urand64() % 4) - 1.5f;
        if (t == sizeof geoms / sizeof geoms[0] - 2)  // channel 1 all -inf: padded windows of -inf
            for (int64_t i = 1; i < nin; i += 2) x[i] = -INFINITY;
        if (t == sizeof geoms / sizeof geoms[0] - 1)
            for (int64_t i = 0; i < nin; i += 7) x[i] = NAN;
        Buf in = buf_from(x, nin * 4), out = buf_poison(nout * 4), dout = buf_from(dy, nout * 4),
            din = buf_poison(nin * 4), arg = buf_poison(nout);
        BOTH(k->maxpool_forward(P(out), P(arg), P(in), N, H, W, Cc, K, S, pad, OH, OW));
        BOTH(k->maxpool_backward(P(din), P(dout), P(arg), N, H, W, Cc, K, S, pad, OH, OW));
        const int64_t most = nin > nout ? nin : nout;  // padding: the output may be the larger
        float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
        char what[112];
        snprintf(what, sizeof what, "maxpool_forward N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d", N,
                 H, W, Cc, K, S, pad);
        buf_fetch(out, hc, hg);
        expect_same_f32(hc, hg, nout, what);
        buf_fetch(arg, hc, hg);
        if (memcmp(hc, hg, (size_t)nout)) fail_msg("%s: the argmax differs", what);
        snprintf(what, sizeof what, "maxpool_backward N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d", N,
                 H, W, Cc, K, S, pad);
        buf_fetch(din, hc, hg);
        expect_same_f32(hc, hg, nin, what);
        buf_free(in), buf_free(out), buf_free(dout), buf_free(din), buf_free(arg);
        free(x), free(dy), free(hc), free(hg);
    }
}

static void test_add_act(void **state) {
    NEED_GPU();
    rng_seed(8);
    const int64_t n = 100003;
    float *a = rand_floats_zeros(n), *b = rand_floats_zeros(n);
    spread_for(ACT_RELU6, a, n);  // sums on both sides of 6 (and of 0) for every activation
    a[3] = NAN, b[4] = INFINITY;
    for (int act = 0; act < ACT_COUNT; act++) {
        Buf ba = buf_from(a, n * 4), bb = buf_from(b, n * 4), out = buf_poison(n * 4);
        BOTH(k->add_act(P(out), P(ba), P(bb), n, (Activation)act));
        BOTH(k->add_act(P(ba), P(ba), P(bb), n, (Activation)act));  // in place
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        buf_fetch(out, hc, hg);
        char what[64];
        snprintf(what, sizeof what, "add_act %s", activation_names[act]);
        expect_same_f32(hc, hg, n, what);
        buf_fetch(ba, hc, hg);
        snprintf(what, sizeof what, "add_act %s in place", activation_names[act]);
        expect_same_f32(hc, hg, n, what);
        buf_free(ba), buf_free(bb), buf_free(out);
        free(hc), free(hg);
    }
    free(a), free(b);
}

static void test_avgpool(void **state) {
    NEED_GPU();
    rng_seed(9);
    static const int geoms[][7] = {  // N, H, W, C, K, stride, pad
        {2, 7, 6, 5, 3, 2, 1}, {2, 8, 8, 64, 2, 2, 0}, {1, 5, 7, 3, 3, 1, 1}, {3, 4, 5, 2, 2, 3, 1}};
    for (size_t t = 0; t < sizeof geoms / sizeof geoms[0]; t++) {
        const int N = geoms[t][0], H = geoms[t][1], W = geoms[t][2], Cc = geoms[t][3],
                  K = geoms[t][4], S = geoms[t][5], pad = geoms[t][6];
        const int OH = (H + 2 * pad - K) / S + 1, OW = (W + 2 * pad - K) / S + 1;
        const int64_t nin = (int64_t)N * H * W * Cc, nout = (int64_t)N * OH * OW * Cc;
        float *x = rand_floats(nin, -1, 1), *dy = rand_floats(nout, -1, 1);
        Buf in = buf_from(x, nin * 4), out = buf_poison(nout * 4), dout = buf_from(dy, nout * 4),
            din = buf_poison(nin * 4);
        BOTH(k->avgpool_forward(P(out), P(in), N, H, W, Cc, K, S, pad, OH, OW));
        BOTH(k->avgpool_backward(P(din), P(dout), N, H, W, Cc, K, S, pad, OH, OW));
        const int64_t most = nin > nout ? nin : nout;
        float *hc = xmalloc(most * 4), *hg = xmalloc(most * 4);
        char what[112];
        snprintf(what, sizeof what, "avgpool_forward N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d", N,
                 H, W, Cc, K, S, pad);
        buf_fetch(out, hc, hg);
        expect_same_f32(hc, hg, nout, what);
        snprintf(what, sizeof what, "avgpool_backward N=%d H=%d W=%d C=%d K=%d stride=%d pad=%d", N,
                 H, W, Cc, K, S, pad);
        buf_fetch(din, hc, hg);
        expect_same_f32(hc, hg, nin, what);
        buf_free(in), buf_free(out), buf_free(dout), buf_free(din);
        free(x), free(dy), free(hc), free(hg);
    }
    // Global: the mean over each image's pixels, and its gradient spread back.
    const int N = 3, Cc = 70;
    const int64_t HW = 49, nin = N * HW * Cc, nout = N * Cc;
    float *x = rand_floats(nin, -1, 1), *dy = rand_floats(nout, -1, 1);
    Buf in = buf_from(x, nin * 4), out = buf_poison(nout * 4), dout = buf_from(dy, nout * 4),
        din = buf_poison(nin * 4);
    BOTH(k->global_avgpool_forward(P(out), P(in), N, HW, Cc));
    BOTH(k->global_avgpool_backward(P(din), P(dout), N, HW, Cc));
    float *hc = xmalloc(nin * 4), *hg = xmalloc(nin * 4);
    buf_fetch(out, hc, hg);
    expect_same_f32(hc, hg, nout, "global_avgpool_forward");
    buf_fetch(din, hc, hg);
    expect_same_f32(hc, hg, nin, "global_avgpool_backward");
    buf_free(in), buf_free(out), buf_free(dout), buf_free(din);
    free(x), free(dy), free(hc), free(hg);
}

// Batch normalisation's kernels: the sums (double, in another order: within 1e-12 of the
// CPU's, relative to the sum of magnitudes); given the same sums, the statistics, the
// normalisation, its gradient and the parameter gradients bit for bit.
// bn_sums (dout.cpu NULL) or bn_backward_sums over consecutive chunks of 1, 3 and the rest
// of the samples (of sample_rows rows) give, on each backend, the bits of its one call (ac:
// the CPU's, ag: the GPU's): a sweep's batchnorm, chunk by chunk, normalises as the whole
// batch would.
static void expect_chunked_sums(const char *what, Buf acc, Buf bx, Buf dout, Buf mean,
                                Buf invstd, Buf g, Buf b, int64_t rows, int64_t sample_rows, int ch,
                                Activation act, const double *ac, const double *ag) {
    const int64_t samples = rows / sample_rows;
    if (samples < 2) return;
    double *hc = xmalloc(16 * (size_t)ch), *hg = xmalloc(16 * (size_t)ch);
    BOTH(k->zero(P(acc), 16 * (size_t)ch));
    const int64_t chunks[] = {1, 3, samples};
    for (int64_t s0 = 0, i = 0; s0 < samples; s0 += chunks[i < 2 ? i++ : 2]) {
        int64_t n = chunks[i < 2 ? i : 2];
        if (s0 + n > samples) n = samples - s0;
        const int64_t off = s0 * sample_rows * ch * (int64_t)sizeof(float);
        if (!dout.cpu) {
            C->bn_sums(acc.cpu, (const float *)((char *)bx.cpu + off), n * sample_rows, sample_rows, ch);
            G->bn_sums(acc.gpu, (const float *)((char *)bx.gpu + off), n * sample_rows, sample_rows, ch);
        } else {
            C->bn_backward_sums(acc.cpu, (const float *)((char *)dout.cpu + off), (const float *)((char *)bx.cpu + off),
                                NULL, mean.cpu, invstd.cpu, g.cpu, b.cpu, n * sample_rows, sample_rows, ch, act);
            G->bn_backward_sums(acc.gpu, (const float *)((char *)dout.gpu + off), (const float *)((char *)bx.gpu + off),
                                NULL, mean.gpu, invstd.gpu, g.gpu, b.gpu, n * sample_rows, sample_rows, ch, act);
        }
    }
    buf_fetch(acc, hc, hg);
    if (memcmp(hc, ac, 16 * (size_t)ch)) fail_msg("%s: the CPU's sums in chunks differ from one call's", what);
    if (memcmp(hg, ag, 16 * (size_t)ch)) fail_msg("%s: the GPU's sums in chunks differ from one call's", what);
    free(hc), free(hg);
}

static void test_batchnorm(void **state) {
    NEED_GPU();
    rng_seed(10);
    // rows, C, rows a sample: a sample of 10,000 rows is 10 units of the column sums, the
    // 70,000 rows of a sample of 70,000 are 69; 576 channels a row at once on the CPU, 1,100
    // in two blocks
    static const int shapes[][3] = {{1568, 128, 49}, {3, 5, 1}, {401, 70, 401}, {2, 1, 1},
                                    {40000, 24, 10000}, {70000, 3, 70000}, {392, 576, 196}, {98, 1100, 49}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int act = 0; act < ACT_COUNT; act++) {
            const int64_t rows = shapes[t][0], n = rows * shapes[t][1], sr = shapes[t][2];
            const int Cc = shapes[t][1];
            float *x = rand_floats(n, -2, 3), *dy = rand_floats_zeros(n);
            float *gamma = rand_floats(Cc, 0.5f, 1.5f), *beta = rand_floats(Cc, -0.5f, 0.5f);
            for (int c = 0; c < Cc && act == ACT_RELU6; c++) gamma[c] *= 4;  // z = xhat * gamma + beta past 6
            float *rm = rand_floats(Cc, -0.1f, 0.1f), *rv = rand_floats(Cc, 0.5f, 1.5f);
            float *dg0 = rand_floats(Cc, -1, 1), *db0 = rand_floats(Cc, -1, 1);
            char what[112];
            snprintf(what, sizeof what, "batchnorm rows=%lld C=%d act=%s", (long long)rows, Cc,
                     activation_names[act]);
            double *acc0 = calloc(2 * (size_t)Cc, sizeof *acc0), *ac = xmalloc(16 * (size_t)Cc),
                   *ag = xmalloc(16 * (size_t)Cc);
            Buf bx = buf_from(x, n * 4), acc = buf_from(acc0, 16 * (size_t)Cc);
            // The sums of x and x^2.
            BOTH(k->bn_sums(P(acc), P(bx), rows, sr, Cc));
            buf_fetch(acc, ac, ag);
            for (int c = 0; c < 2 * Cc; c++) {
                double mag = 0;
                for (int64_t r = 0; r < rows; r++) {
                    const double v = x[r * Cc + c % Cc];
                    mag += c < Cc ? fabs(v) : v * v;
                }
                if (!(fabs(ac[c] - ag[c]) <= 1e-12 * mag))
                    fail_msg("%s: bn_sums[%d] cpu %.17g gpu %.17g", what, c, ac[c], ag[c]);
            }
            // In chunks of 1, 3 and the rest of the samples, each backend sums to its own bits.
            expect_chunked_sums(what, acc, bx, (Buf){0}, (Buf){0}, (Buf){0}, (Buf){0}, (Buf){0}, rows, sr,
                                Cc, ACT_NONE, ac, ag);
            // The statistics from the CPU's sums, on both.
            Buf csum = buf_from(ac, 16 * (size_t)Cc), mean = buf_poison(Cc * 4), invstd = buf_poison(Cc * 4),
                brm = buf_from(rm, Cc * 4), brv = buf_from(rv, Cc * 4), g = buf_from(gamma, Cc * 4),
                b = buf_from(beta, Cc * 4), out = buf_poison(n * 4), dout = buf_from(dy, n * 4),
                din = buf_poison(n * 4), dg = buf_from(dg0, Cc * 4), db = buf_from(db0, Cc * 4);
            BOTH(k->bn_batch_stats(P(mean), P(invstd), P(brm), P(brv), P(csum), Cc, rows, 1e-5, 0.1));
            float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
            const char *names[] = {"mean", "invstd", "running_mean", "running_var"};
            const Buf stats[] = {mean, invstd, brm, brv};
            for (int i = 0; i < 4; i++) {
                char m[160];
                snprintf(m, sizeof m, "%s: bn_batch_stats %s", what, names[i]);
                buf_fetch(stats[i], hc, hg);
                expect_same_f32(hc, hg, Cc, m);
            }
            BOTH(k->bn_forward(P(out), P(bx), P(mean), P(invstd), P(g), P(b), rows, Cc, (Activation)act));
            buf_fetch(out, hc, hg);
            expect_same_f32(hc, hg, n, what);
            // The backward sums, then the gradients from the CPU's sums.
            BOTH(k->zero(P(acc), 16 * (size_t)Cc));
            BOTH(k->bn_backward_sums(P(acc), P(dout), P(bx), NULL, P(mean), P(invstd), P(g), P(b), rows, sr,
                                     Cc, (Activation)act));
            buf_fetch(acc, ac, ag);
            expect_chunked_sums(what, acc, bx, dout, mean, invstd, g, b, rows, sr, Cc, (Activation)act, ac, ag);
            for (int c = 0; c < 2 * Cc; c++) {
                double mag = 0;
                for (int64_t r = 0; r < rows; r++) mag += fabs(dy[r * Cc + c % Cc]) * (c < Cc ? 1 : 10);
                if (!(fabs(ac[c] - ag[c]) <= 1e-12 * mag + 1e-300))
                    fail_msg("%s: bn_backward_sums[%d] cpu %.17g gpu %.17g", what, c, ac[c], ag[c]);
            }
            C->upload(csum.cpu, ac, 16 * (size_t)Cc);
            G->upload(csum.gpu, ac, 16 * (size_t)Cc);
            BOTH(k->bn_backward(P(din), P(dout), P(bx), NULL, P(mean), P(invstd), P(g), P(b), P(csum),
                                rows, Cc, rows, (Activation)act));
            buf_fetch(din, hc, hg);
            expect_same_f32(hc, hg, n, what);
            // The mask read from the forward's output (the network's way where x is read back
            // from compressed codes): the same mask, so each backend's own bits.
            {
                double *oc = xmalloc(16 * (size_t)Cc), *og = xmalloc(16 * (size_t)Cc);
                float *mc = xmalloc(n * 4), *mg = xmalloc(n * 4);
                BOTH(k->zero(P(acc), 16 * (size_t)Cc));
                BOTH(k->bn_backward_sums(P(acc), P(dout), P(bx), P(out), P(mean), P(invstd), P(g), P(b), rows,
                                         sr, Cc, (Activation)act));
                buf_fetch(acc, oc, og);
                if (memcmp(oc, ac, 16 * (size_t)Cc) || memcmp(og, ag, 16 * (size_t)Cc))
                    fail_msg("%s: bn_backward_sums with the mask from the output differ", what);
                BOTH(k->bn_backward(P(din), P(dout), P(bx), P(out), P(mean), P(invstd), P(g), P(b), P(csum),
                                    rows, Cc, rows, (Activation)act));
                buf_fetch(din, mc, mg);
                if (memcmp(mc, hc, n * 4) || memcmp(mg, hg, n * 4))
                    fail_msg("%s: bn_backward with the mask from the output differs", what);
                free(oc), free(og), free(mc), free(mg);
            }
            BOTH(k->bn_backward(P(dout), P(dout), P(bx), NULL, P(mean), P(invstd), P(g), P(b), P(csum),
                                rows, Cc, rows, (Activation)act));  // in place
            buf_fetch(dout, hc, hg);
            expect_same_f32(hc, hg, n, what);
            BOTH(k->bn_param_grads(P(dg), P(db), P(csum), Cc));
            buf_fetch(dg, hc, hg);
            expect_same_f32(hc, hg, Cc, what);
            buf_fetch(db, hc, hg);
            expect_same_f32(hc, hg, Cc, what);
            // Evaluation statistics.
            BOTH(k->bn_eval_stats(P(mean), P(invstd), P(brm), P(brv), Cc, 1e-5));
            buf_fetch(invstd, hc, hg);
            expect_same_f32(hc, hg, Cc, what);
            const Buf all[] = {bx, acc, csum, mean, invstd, brm, brv, g, b, out, dout, din, dg, db};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) buf_free(all[i]);
            free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(dg0), free(db0);
            free(acc0), free(ac), free(ag), free(hc), free(hg);
        }
}

// ---- dropout ----------------------------------------------------------------------------------

static void test_dropout(void **state) {
    NEED_GPU();
    rng_seed(8);
    const int64_t n = 1000003;
    float *x = rand_floats(n, -2, 2);
    Buf in = buf_from(x, n * 4), out = buf_poison(n * 4), din = buf_poison(n * 4);
    float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
    static const float ps[] = {0.25f, 0.5f, 0.1f, 0.999f};
    for (int j = 0; j < 4; j++) {
        const uint64_t key = rng_key(1234 + j, RNG_STREAM_DROPOUT, 77, j);
        const uint64_t offset = j == 2 ? ((uint64_t)1 << 33) + 5 : (uint64_t)j * 9216;
        BOTH(k->dropout_forward(P(out), P(in), n, ps[j], key, offset));
        BOTH(k->dropout_backward(P(din), P(in), n, ps[j], key, offset));
        char what[64];
        snprintf(what, sizeof what, "dropout_forward p=%g", ps[j]);
        buf_fetch(out, hc, hg);
        expect_same_f32(hc, hg, n, what);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++) kept += hg[i] != 0.0f;
        if (ps[j] < 0.9f && fabs((double)kept / n - (1 - ps[j])) > 0.01)
            fail_msg("%s: kept %lld of %lld", what, (long long)kept, (long long)n);
        snprintf(what, sizeof what, "dropout_backward p=%g", ps[j]);
        buf_fetch(din, hc, hg);
        expect_same_f32(hc, hg, n, what);
    }
    buf_free(in), buf_free(out), buf_free(din);
    free(x), free(hc), free(hg);
}

// ---- layout ------------------------------------------------------------------------------------

static void test_layout(void **state) {
    NEED_GPU();
    rng_seed(9);
    static const int shapes[][4] = {{2, 3, 5, 7}, {64, 12, 12, 64}, {1, 1, 1, 9}, {3, 4, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], H = shapes[s][1], W = shapes[s][2], Cc = shapes[s][3];
        const int64_t n = (int64_t)N * H * W * Cc;
        float *x = rand_floats(n, -1, 1);
        Buf in = buf_from(x, n * 4), a = buf_poison(n * 4), b = buf_poison(n * 4);
        BOTH(k->nhwc_to_nchw(P(a), P(in), N, H, W, Cc));
        BOTH(k->nchw_to_nhwc(P(b), P(in), N, H, W, Cc));
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        char what[64];
        snprintf(what, sizeof what, "nhwc_to_nchw %dx%dx%dx%d", N, H, W, Cc);
        buf_fetch(a, hc, hg);
        expect_same_f32(hc, hg, n, what);
        snprintf(what, sizeof what, "nchw_to_nhwc %dx%dx%dx%d", N, H, W, Cc);
        buf_fetch(b, hc, hg);
        expect_same_f32(hc, hg, n, what);
        buf_free(in), buf_free(a), buf_free(b);
        free(x), free(hc), free(hg);
    }
}

// ---- output and loss ----------------------------------------------------------------------------

static void test_log_softmax(void **state) {
    NEED_GPU();
    rng_seed(10);
    static const int shapes[][2] = {{64, 10}, {5, 1000}, {1, 1}, {513, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], Cc = shapes[s][1];
        const int64_t n = (int64_t)N * Cc;
        float *x = rand_floats(n, -8, 8), *dy = rand_floats(n, -1, 1);
        Buf in = buf_from(x, n * 4), out = buf_poison(n * 4), dout = buf_from(dy, n * 4),
            din = buf_poison(n * 4);
        BOTH(k->log_softmax_forward(P(out), P(in), N, Cc));
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        double *bound = xmalloc(n * sizeof *bound);
        buf_fetch(out, hc, hg);
        for (int64_t i = 0; i < n; i++) bound[i] = 1e-6 * (1 + fabs(hc[i]));
        char what[64];
        snprintf(what, sizeof what, "log_softmax_forward %dx%d", N, Cc);
        expect_within(hc, hg, bound, n, what);
        // Backward from the same y on both (the CPU's), so that only the kernel differs.
        G->upload(out.gpu, hc, n * 4);
        BOTH(k->log_softmax_backward(P(din), P(dout), P(out), N, Cc));
        for (int r = 0; r < N; r++) {
            double sum = 0;
            for (int c = 0; c < Cc; c++) sum += dy[(int64_t)r * Cc + c];
            for (int c = 0; c < Cc; c++) {
                const int64_t i = (int64_t)r * Cc + c;
                bound[i] = 1e-6 * (fabs(dy[i]) + fabs(exp(hc[i]) * sum)) + 1e-30;
            }
        }
        buf_fetch(din, hc, hg);
        snprintf(what, sizeof what, "log_softmax_backward %dx%d", N, Cc);
        expect_within(hc, hg, bound, n, what);
        buf_free(in), buf_free(out), buf_free(dout), buf_free(din);
        free(x), free(dy), free(hc), free(hg), free(bound);
    }
}

static void test_nll_loss(void **state) {
    NEED_GPU();
    rng_seed(11);
    static const int shapes[][2] = {{64, 10}, {1000, 7}, {1, 1}, {300, 100}, {64, 10}, {300, 100}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], Cc = shapes[s][1];
        const float smoothing = s >= 4 ? 0.1f : 0.0f;  // label smoothing: the last two
        const int64_t n = (int64_t)N * Cc;
        float *logp = rand_floats(n, -6, 0);
        int32_t *lab = xmalloc(N * sizeof *lab);
        for (int r = 0; r < N; r++) {
            lab[r] = (int32_t)(urand64() % Cc);
            if (r % 5 == 0 && Cc > 2) {  // a tie for the maximum: the first one counts
                float *y = logp + (int64_t)r * Cc;
                y[0] = y[Cc - 1] = 0.5f;
                lab[r] = r % 10 == 0 ? 0 : Cc - 1;
            }
        }
        const float m0[2] = {3.25f, 17.0f};
        const ScalerState st = {.scale = s % 2 ? 65536.0 : 1000.5};  // the scale read on the device
        Buf lp = buf_from(logp, n * 4), labels = buf_from(lab, N * 4), met = buf_from(m0, 8),
            dl = buf_poison(n * 4), met2 = buf_from(m0, 8), scaler = buf_from(&st, sizeof st);
        const float scale = 1.0f / N;
        BOTH(k->nll_loss(P(dl), P(met), P(lp), P(labels), N, Cc, scale, smoothing, P(scaler)));
        BOTH(k->nll_loss(NULL, P(met2), P(lp), P(labels), N, Cc, scale, smoothing, NULL));
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        char what[64];
        snprintf(what, sizeof what, "nll_loss dlogp %dx%d", N, Cc);
        buf_fetch(dl, hc, hg);
        expect_same_f32(hc, hg, n, what);
        double terms = fabs(m0[0]);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < Cc; c++)
                terms += c == lab[r] || smoothing ? fabs(logp[(int64_t)r * Cc + c]) : 0.0;
        const double bound[2] = {1e-6 * terms, 0};
        float mc[2], mg[2];
        buf_fetch(met, mc, mg);
        snprintf(what, sizeof what, "nll_loss metrics %dx%d", N, Cc);
        expect_within(mc, mg, bound, 2, what);
        buf_fetch(met2, mc, mg);
        snprintf(what, sizeof what, "nll_loss metrics, no gradient, %dx%d", N, Cc);
        expect_within(mc, mg, bound, 2, what);
        // The label's entry is -scale times the loss scale times its target.
        const float on = (float)(1.0 - smoothing + (double)smoothing / Cc);
        for (int r = 0; r < N; r++)
            if (hc[(int64_t)r * Cc + lab[r]] != -(scale * (float)st.scale * on))
                fail_msg("nll_loss dlogp row %d: %g, want %g", r, hc[(int64_t)r * Cc + lab[r]],
                         -(scale * (float)st.scale * on));
        buf_free(lp), buf_free(labels), buf_free(met), buf_free(dl), buf_free(met2), buf_free(scaler);
        free(logp), free(lab), free(hc), free(hg);
    }
}

// ---- precision ----------------------------------------------------------------------------------

static float bits_f32(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void test_f16(void **state) {
    NEED_GPU();
    rng_seed(12);
    // Every half to float.
    enum { NH = 65536 };
    uint16_t *h = xmalloc(NH * 2);
    for (int i = 0; i < NH; i++) h[i] = (uint16_t)i;
    Buf hin = buf_from(h, NH * 2), fout = buf_poison(NH * 4);
    BOTH(k->f16_to_f32(P(fout), P(hin), NH));
    float *fc = xmalloc(NH * 4), *fg = xmalloc(NH * 4);
    buf_fetch(fout, fc, fg);
    expect_same_bits(fc, fg, NH, 4, "f16_to_f32 (all halves)");
    // Floats to half: for every finite half, the float tie halfway to the next half and
    // its float neighbours (round to nearest even), the half's own value; the overflow
    // threshold; specials (zeros, infinities, NaN payloads); random bit patterns.
    const int64_t nf = 4 * NH + 64 + (1 << 20);
    float *f = xmalloc(nf * 4);
    int64_t m = 0;
    for (int i = 0; i < NH; i++) {
        if ((i & 0x7c00) == 0x7c00) continue;
        const float a = half_to_float((uint16_t)i), b = half_to_float((uint16_t)(i + 1));
        if ((i & 0x7fff) == 0x7bff) continue;  // the largest half: its tie is the overflow
        const float tie = (float)(((double)a + b) / 2);
        uint32_t tb;
        memcpy(&tb, &tie, 4);
        f[m++] = a, f[m++] = tie, f[m++] = bits_f32(tb + 1), f[m++] = bits_f32(tb - 1);
    }
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.996f, 65520.0f,
                              -65520.0f, 1e10f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                              1e-45f, -1e-45f, 1.1754944e-38f, 6.1035156e-5f, 6.1035152e-5f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) f[m++] = specials[i];
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff812345u,
                             0x7fffffffu, 0x7fa00000u, 0xffffe000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) f[m++] = bits_f32(nans[i]);
    while (m < nf) f[m++] = bits_f32((uint32_t)urand64());
    Buf fin = buf_from(f, nf * 4), hout = buf_poison(nf * 2);
    BOTH(k->f32_to_f16(P(hout), P(fin), nf));
    uint16_t *hc = xmalloc(nf * 2), *hg = xmalloc(nf * 2);
    buf_fetch(hout, hc, hg);
    expect_same_bits(hc, hg, nf, 2, "f32_to_f16");
    // bf16 (precision = bf16): every bf16 to float, and the same floats to bf16.
    BOTH(k->bf16_to_f32(P(fout), P(hin), NH));
    buf_fetch(fout, fc, fg);
    expect_same_bits(fc, fg, NH, 4, "bf16_to_f32 (all bf16)");
    BOTH(k->f32_to_bf16(P(hout), P(fin), nf));
    buf_fetch(hout, hc, hg);
    expect_same_bits(hc, hg, nf, 2, "f32_to_bf16");
    buf_free(hin), buf_free(fout), buf_free(fin), buf_free(hout);
    free(h), free(fc), free(fg), free(f), free(hc), free(hg);
}

// The byte input's read (u8_to_f32): every byte value in every channel, 1 to 4 channels,
// through tables of arbitrary floats (negative zero, large values): the table's bits.
static void test_u8_to_f32(void **state) {
    NEED_GPU();
    rng_seed(13);
    for (int nc = 1; nc <= 4; nc++) {  // channels (C is the CPU's table)
        const int64_t n = (int64_t)256 * nc * 5;
        float *lut = rand_floats(nc * 256, -3, 3);
        lut[0] = -0.0f, lut[nc * 256 - 1] = 3e38f;
        uint8_t *px = xmalloc((size_t)n);
        for (int64_t i = 0; i < n; i++) px[i] = (uint8_t)(i / nc * 7 + i % nc * 85);
        Buf in = buf_from(px, (size_t)n), tab = buf_from(lut, (size_t)nc * 256 * 4), out = buf_poison((size_t)n * 4);
        BOTH(k->u8_to_f32(P(out), P(in), n, nc, P(tab)));
        float *fc = xmalloc((size_t)n * 4), *fg = xmalloc((size_t)n * 4);
        buf_fetch(out, fc, fg);
        char what[48];
        snprintf(what, sizeof what, "u8_to_f32, %d channels", nc);
        expect_same_f32(fc, fg, n, what);
        for (int64_t i = 0; i < n; i++) assert_memory_equal(&fc[i], &lut[(i % nc) * 256 + px[i]], 4);
        buf_free(in), buf_free(tab), buf_free(out);
        free(lut), free(px), free(fc), free(fg);
    }
}

// Compressed activations (act_pack, act_unpack): the same records and values read back on
// both devices, for each width, on ReLU outputs (zeros kept apart), signed values with
// signed zeros, constant groups and short groups (values not a multiple of the group).
static void test_act_pack(void **state) {
    NEED_GPU();
    rng_seed(14);
    const int widths[] = {2, 4, 8};
    const int64_t values = 3 * ACT_GROUP + 45;
    const int n = 5;
    for (int w = 0; w < 3; w++)
        for (int pattern = 0; pattern < 3; pattern++) {
            const int bits = widths[w];
            float *x = rand_floats(values * n, -2, 2);
            for (int64_t i = 0; i < values * n; i++)
                x[i] = pattern == 0 ? (x[i] > 0 ? x[i] : 0.0f) : pattern == 2 && i / ACT_GROUP % 2 ? 1.5f : x[i];
            const size_t bytes = (size_t)(n * act_sample_bytes(values, bits));
            Buf in = buf_from(x, (size_t)(values * n) * 4), rec = buf_poison(bytes), out = buf_poison((size_t)(values * n) * 4);
            BOTH(k->act_pack(P(rec), P(in), values, n, bits, rng_key(3, RNG_STREAM_ACTIVATIONS, 7, 2), 11));
            BOTH(k->act_unpack(P(out), P(rec), values, n, bits));
            unsigned char *rc = xmalloc(bytes), *rg = xmalloc(bytes);
            float *fc = xmalloc((size_t)(values * n) * 4), *fg = xmalloc((size_t)(values * n) * 4);
            buf_fetch(rec, rc, rg);
            buf_fetch(out, fc, fg);
            for (size_t i = 0; i < bytes; i++)
                if (rc[i] != rg[i])
                    fail_msg("act_pack, %d bits, pattern %d: record byte %zu differs: cpu 0x%02x, gpu 0x%02x",
                             bits, pattern, i, rc[i], rg[i]);
            char what[64];
            snprintf(what, sizeof what, "act_unpack, %d bits, pattern %d", bits, pattern);
            expect_same_f32(fc, fg, values * n, what);
            buf_free(in), buf_free(rec), buf_free(out);
            free(x), free(rc), free(rg), free(fc), free(fg);
        }
}

static void expect_same_state(Buf st, const char *what) {
    ScalerState c, g;
    buf_fetch(st, &c, &g);
    if (c.scale != g.scale || c.good_steps != g.good_steps || c.skipped != g.skipped || c.found != g.found)
        fail_msg("%s: cpu {scale %g, good %lld, skipped %lld, found %g}, gpu {%g, %lld, %lld, %g}", what,
                 c.scale, (long long)c.good_steps, (long long)c.skipped, c.found, g.scale,
                 (long long)g.good_steps, (long long)g.skipped, g.found);
}

static void test_unscale_check(void **state) {
    NEED_GPU();
    rng_seed(13);
    const int64_t n = 200003;
    float *g = rand_floats(n, -1e3f, 1e3f), *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
    // Finite results leave the flag as it was (0, or 1 from an earlier call).
    const ScalerState clean = {.scale = 65536}, flagged = {.scale = 1 / 3.0, .found = 1};
    Buf grad = buf_from(g, n * 4), st = buf_from(&clean, sizeof clean),
        st1 = buf_from(&flagged, sizeof flagged);
    BOTH(k->unscale_check(P(grad), n, P(st)));
    BOTH(k->unscale_check(P(grad), n, P(st1)));
    buf_fetch(grad, hc, hg);
    expect_same_f32(hc, hg, n, "unscale_check values");
    expect_same_state(st, "unscale_check, clean");
    expect_same_state(st1, "unscale_check, flag set before");
    ScalerState c, d;
    buf_fetch(st, &c, &d);
    assert_true(c.found == 0.0f);
    buf_fetch(st1, &c, &d);
    assert_true(c.found == 1.0f);
    // Overflow, an inf and a NaN each set it.
    for (int j = 0; j < 3; j++) {
        const float bad[] = {3e38f, INFINITY, NAN};
        float *h = rand_floats(n, -1, 1);
        h[(j + 1) * 54321] = bad[j];
        const ScalerState half = {.scale = 0.5};
        Buf b = buf_from(h, n * 4), fl = buf_from(&half, sizeof half);
        BOTH(k->unscale_check(P(b), n, P(fl)));
        buf_fetch(fl, &c, &d);
        if (!(c.found == 1.0f && d.found == 1.0f))
            fail_msg("unscale_check case %d: flag cpu %g gpu %g", j, c.found, d.found);
        buf_fetch(b, hc, hg);
        expect_same_f32(hc, hg, n, "unscale_check values with a non-finite one");
        buf_free(b), buf_free(fl);
        free(h);
    }
    buf_free(grad), buf_free(st), buf_free(st1);
    free(g), free(hc), free(hg);
}

// scaler_update on the device: a run of clean and flagged steps under dynamic and fixed
// rules, the state the same as the CPU's after each.
static void test_scaler_update(void **state) {
    NEED_GPU();
    const ScalerRules rules[] = {scaler_rules(true, 3), scaler_rules(false, 3)};
    for (int r = 0; r < 2; r++) {
        const ScalerState s0 = {.scale = 65536, .good_steps = 1, .skipped = 4};
        Buf st = buf_from(&s0, sizeof s0);
        float g[2] = {1, 2};
        Buf grad = buf_from(g, sizeof g);
        for (int step = 0; step < 12; step++) {
            g[1] = step % 5 == 3 ? INFINITY : 2.0f;
            C->upload(grad.cpu, g, sizeof g), G->upload(grad.gpu, g, sizeof g);
            BOTH(k->unscale_check(P(grad), 2, P(st)));
            BOTH(k->scaler_update(P(st), rules[r]));
            char what[64];
            snprintf(what, sizeof what, "scaler_update, %s rules, step %d",
                     rules[r].dynamic ? "dynamic" : "fixed", step);
            expect_same_state(st, what);
        }
        ScalerState c, d;
        buf_fetch(st, &c, &d);
        // Steps 3 and 8 skipped; dynamic: x2 at steps 1, 6 and 11, x0.5 at 3 and 8.
        assert_int_equal(c.skipped, 4 + 2);
        assert_true(c.scale == (rules[r].dynamic ? 131072.0 : 65536.0));
        buf_free(st), buf_free(grad);
    }
}

// ---- optimizer ------------------------------------------------------------------------------------

static void test_adadelta(void **state) {
    NEED_GPU();
    rng_seed(14);
    const int64_t n = 500009;
    for (int j = 0; j < 2; j++) {
        float *p = rand_floats(n, -1, 1), *g = rand_floats(n, -1, 1);
        float *sq = rand_floats(n, 0, 1e-2f), *acc = rand_floats(n, 0, 1e-4f);
        for (int64_t i = 0; i < n; i += 3) g[i] *= 1e-4f;  // small gradients too
        Buf bp = buf_from(p, n * 4), bg = buf_from(g, n * 4), bs = buf_from(sq, n * 4),
            ba = buf_from(acc, n * 4);
        const float wd = j ? 0.01f : 0.0f;
        // A gate whose flag is set skips the step on both: the results are those of 3 steps.
        const ScalerState open = {.scale = 1}, shut = {.scale = 1, .found = 1};
        Buf gate = buf_from(&open, sizeof open), skip = buf_from(&shut, sizeof shut);
        for (int step = 0; step < 4; step++)
            BOTH(k->adadelta_step(P(bp), P(bs), P(ba), P(bg), n, 0.7f, 0.9f, 1e-6f, wd,
                                  step == 2 ? P(skip) : j ? P(gate) : NULL));
        buf_free(gate), buf_free(skip);
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        const Buf bufs[] = {bp, bs, ba};
        const char *names[] = {"adadelta params", "adadelta square_avg", "adadelta acc_delta"};
        for (int b = 0; b < 3; b++) {
            buf_fetch(bufs[b], hc, hg);
            char what[64];
            snprintf(what, sizeof what, "%s (weight_decay %g)", names[b], wd);
            expect_same_f32(hc, hg, n, what);
        }
        buf_free(bp), buf_free(bg), buf_free(bs), buf_free(ba);
        free(p), free(g), free(sq), free(acc), free(hc), free(hg);
    }
}

// SGD (with and without momentum, nesterov, weight decay, the first step's buffer) and
// AdamW, bit for bit.
static void test_sgd_adamw(void **state) {
    NEED_GPU();
    rng_seed(16);
    const int64_t n = 300007;
    for (int j = 0; j < 3; j++) {
        float *p = rand_floats(n, -1, 1), *g = rand_floats(n, -1, 1), *buf = rand_floats(n, -1, 1);
        Buf bp = buf_from(p, n * 4), bg = buf_from(g, n * 4), bb = buf_from(buf, n * 4);
        const bool nesterov = j == 1;
        const float momentum = j ? 0.9f : 0.0f, wd = j == 2 ? 0.0f : 5e-4f;
        // Steps 5, 6 and 7 of a run whose first 5 were skipped (the gate's count): step 5 is
        // the first one taken (the momentum buffer starts as the gradient); step 6 is skipped
        // by the flag, then its flag is cleared as scaler_update would.
        ScalerState gs = {.scale = 1, .skipped = 5};
        Buf gate = buf_from(&gs, sizeof gs);
        for (int step = 5; step < 8; step++) {
            gs.found = step == 6;
            C->upload(gate.cpu, &gs, sizeof gs), G->upload(gate.gpu, &gs, sizeof gs);
            BOTH(k->sgd_step(P(bp), j ? P(bb) : NULL, P(bg), n, 0.05f, momentum, 0.9f, wd, nesterov,
                             P(gate), (uint64_t)step));
        }
        buf_free(gate);
        float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
        char what[64];
        snprintf(what, sizeof what, "sgd params (case %d)", j);
        buf_fetch(bp, hc, hg);
        expect_same_f32(hc, hg, n, what);
        snprintf(what, sizeof what, "sgd momentum buffer (case %d)", j);
        buf_fetch(bb, hc, hg);
        expect_same_f32(hc, hg, n, what);
        buf_free(bp), buf_free(bg), buf_free(bb);
        free(p), free(g), free(buf), free(hc), free(hg);
    }
    float *p = rand_floats(n, -1, 1), *g = rand_floats(n, -1, 1), *m = rand_floats(n, -0.1f, 0.1f),
          *v = rand_floats(n, 0, 1e-2f);
    Buf bp = buf_from(p, n * 4), bg = buf_from(g, n * 4), bm = buf_from(m, n * 4), bv = buf_from(v, n * 4);
    // Steps 0-2 without a gate, then 7-9 of a run that skipped 4 (bias corrections of
    // steps 4-6 taken), then one skipped.
    const AdamWHyper h = {.lr = 1e-3, .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    const ScalerState four = {.scale = 1, .skipped = 4}, shut = {.scale = 1, .skipped = 4, .found = 1};
    Buf gate = buf_from(&four, sizeof four), skip = buf_from(&shut, sizeof shut);
    for (int step = 0; step < 3; step++) BOTH(k->adamw_step(P(bp), P(bm), P(bv), P(bg), n, h, NULL, (uint64_t)step));
    for (int step = 7; step < 10; step++) BOTH(k->adamw_step(P(bp), P(bm), P(bv), P(bg), n, h, P(gate), (uint64_t)step));
    BOTH(k->adamw_step(P(bp), P(bm), P(bv), P(bg), n, h, P(skip), 10));
    buf_free(gate), buf_free(skip);
    float *hc = xmalloc(n * 4), *hg = xmalloc(n * 4);
    const Buf bufs[] = {bp, bm, bv};
    const char *names[] = {"adamw params", "adamw exp_avg", "adamw exp_avg_sq"};
    for (int b = 0; b < 3; b++) {
        buf_fetch(bufs[b], hc, hg);
        expect_same_f32(hc, hg, n, names[b]);
    }
    buf_free(bp), buf_free(bg), buf_free(bm), buf_free(bv);
    free(p), free(g), free(m), free(v), free(hc), free(hg);
}

// ---- a whole training step ---------------------------------------------------------------------

// conv (pad) + relu, maxpool, a Winograd conv, a strided conv, relu, dropout, flatten,
// linear + relu, dropout, linear, log_softmax: every kernel of the table.
static const char *step_cfg =
    "[conv]\nname = conv1\nfilters = 6\nsize = 3\npad = 1\nactivation = relu\n"
    "[maxpool]\nsize = 3\nstride = 2\n"
    "[conv]\nname = conv_w\nfilters = 7\nsize = 3\npad = 1\nalgorithm = winograd\n"
    "[conv]\nname = conv2\nfilters = 8\nsize = 3\nstride = 2\n"
    "[relu]\n"
    "[dropout]\np = 0.25\n"
    "[flatten]\n"
    "[linear]\nname = fc1\noutputs = 16\nactivation = relu\n"
    "[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 5\n"
    "[log_softmax]\n";
// A small ResNet: stem, an identity block, a depthwise convolution with its batchnorm
// (MobileNet's; not right after the stem's batchnorm, whose weight it would leave without a
// gradient: batchnorm undoes a channel's scale), a downsampling block, pooling.
static const char *step_resnet_cfg =
    "[conv]\nname = conv1\nfilters = 6\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[maxpool]\nname = maxpool\nsize = 3\nstride = 2\npad = 1\n"
    "[residual]\nname = layer1.0\nfilters = 6\n"
    "[conv]\nname = dw\nfilters = 6\nsize = 3\npad = 1\ngroups = 6\nbias = 0\n"
    "[batchnorm]\nname = dw_bn\nactivation = relu\n"
    "[residual]\nname = layer2.0\nfilters = 8\nstride = 2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 5\n"
    "[log_softmax]\n";
enum { STEP_B = 16, STEP_CLASSES = 5 };
static const Shape step_input = {.c = 3, .h = 13, .w = 13};
static const char *g_step_cfg;  // the network check_step trains: step_cfg or step_resnet_cfg
static const Optimizer adadelta = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};

static void make_net(Net *net, const Kernels *k, DType precision, int batch, int segments) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, g_step_cfg, "step.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    NetOptions opt = {.batch = batch, .precision = precision, .segments = segments, .sweep = segments != 0};
    optim_plan(&adadelta, &opt);
    if (net_create(net, &cfg, step_input, STEP_CLASSES, &opt, k, &err))
        fail_msg("net_create on %s: %s", k->name, err.msg);
    // fp32 GEMMs in fp16 too: the steps are compared value by value, and TF32's rounding
    // flips max-pool and ReLU decisions near ties (test_gemm_arith checks those GEMMs).
    net->gemm_arith = GEMM_FP32;
    cfg_free(&cfg);
    if (net_init_params(net, 7, &err)) fail_msg("net_init_params: %s", err.msg);
}

typedef struct StepResult {
    int64_t nparams;
    float *before, *grads, *after, *logp;  // host copies
    float metrics[2];
} StepResult;

// One optimizer step over a batch of STEP_B split into `micro` micro-batches: forward,
// loss, backward for each, then Adadelta.
static StepResult run_step(const Kernels *k, DType precision, int micro, int segments,
                           const float *x, const int32_t *y) {
    Net net;
    const int mb = STEP_B / micro;
    make_net(&net, k, precision, mb, segments);
    // fp16: the loss scaled by 1024 and unscaled by the scaler's kernels (a clean step).
    const ScalerRules rules = scaler_rules(true, 2000);
    const ScalerState scaled = {.scale = 1024};
    if (precision == DT_F16) k->upload(net.scaler, &scaled, sizeof scaled);
    StepResult r = {.nparams = net.nparams};
    const size_t pbytes = (size_t)net.nparams * 4, numel = (size_t)shape_numel(step_input);
    r.before = xmalloc(pbytes), r.grads = xmalloc(pbytes), r.after = xmalloc(pbytes);
    r.logp = xmalloc((size_t)STEP_B * STEP_CLASSES * 4);
    k->download(r.before, net.params, pbytes);
    net_zero_grads(&net);
    const uint64_t seed = 99, step = 5;
    for (int m = 0; m < micro; m++) {
        k->upload(net.input_buf, x + (size_t)m * mb * numel, (size_t)mb * numel * 4);
        k->upload(net.labels, y + m * mb, (size_t)mb * 4);
        net_forward(&net, mb, true, seed, step, (int64_t)m * mb);
        net_loss(&net, mb, STEP_B, true);
        net_backward(&net, mb, seed, step, (int64_t)m * mb);
        k->download(r.logp + (size_t)m * mb * STEP_CLASSES, net_output(&net),
                    (size_t)mb * STEP_CLASSES * 4);
    }
    k->download(r.grads, net.grads, pbytes);
    k->download(r.metrics, net.metrics, sizeof r.metrics);
    optim_step(&net, &adadelta, precision == DT_F16 ? &rules : NULL, 1.0, 0);
    k->download(r.after, net.params, pbytes);
    ScalerState after;
    k->download(&after, net.scaler, sizeof after);
    if (precision == DT_F16 && !(after.scale == 1024 && after.good_steps == 1 && after.skipped == 0))
        fail_msg("%s: the loss scaler after a clean step: scale %g, good %lld, skipped %lld", k->name,
                 after.scale, (long long)after.good_steps, (long long)after.skipped);
    net_free(&net);
    return r;
}

static void free_step(StepResult *r) {
    free(r->before), free(r->grads), free(r->after), free(r->logp);
}

static void check_step(DType precision, int micro, int segments, double tol_logp,
                       double tol_grad, double tol_update) {
    rng_seed(15 + micro);
    const int64_t nx = (int64_t)STEP_B * shape_numel(step_input);
    float *x = rand_floats(nx, -2, 2);
    int32_t y[STEP_B];
    for (int i = 0; i < STEP_B; i++) y[i] = (int32_t)(urand64() % STEP_CLASSES);
    StepResult c = run_step(C, precision, micro, segments, x, y),
               g = run_step(G, precision, micro, segments, x, y);
    char what[160];
    char prec[48];
    snprintf(prec, sizeof prec, "%s step (segments %d)", precision_name(precision), segments);
    snprintf(what, sizeof what, "%s, %d micro-batch(es): initial parameters", prec, micro);
    expect_same_f32(c.before, g.before, c.nparams, what);
    double *bound = xmalloc(STEP_B * STEP_CLASSES * sizeof *bound);
    for (int i = 0; i < STEP_B * STEP_CLASSES; i++) bound[i] = tol_logp * (1 + fabs(c.logp[i]));
    snprintf(what, sizeof what, "%s, %d micro-batch(es): log-probabilities", prec, micro);
    expect_within(c.logp, g.logp, bound, STEP_B * STEP_CLASSES, what);
    if (fabs(c.metrics[0] - g.metrics[0]) > tol_logp * (1 + fabs(c.metrics[0])))
        fail_msg("%s: loss cpu %.9g gpu %.9g", prec, c.metrics[0], g.metrics[0]);
    // Per parameter tensor: gradients and updates relative to their norms.
    Net shape;
    make_net(&shape, C, DT_F32, 1, 0);
    int64_t off = 0;
    for (int i = 0; i < shape.nmodules; i++)
        for (int j = 0; j < shape.modules[i]->nparams; j++) {
            const char *name = shape.modules[i]->params[j].name;
            const int64_t n = tensor_numel(&shape.modules[i]->params[j]);
            const double eg = norm_diff(c.grads + off, g.grads + off, n), ng = norm(c.grads + off, n);
            if (!(eg <= tol_grad * ng))
                fail_msg("%s, %d micro-batch(es): %s gradient: |gpu - cpu| = %.3g, |cpu| = %.3g",
                         prec, micro, name, eg, ng);
            float *dc = xmalloc(n * 4), *dg = xmalloc(n * 4);
            for (int64_t e = 0; e < n; e++)
                dc[e] = c.after[off + e] - c.before[off + e], dg[e] = g.after[off + e] - g.before[off + e];
            const double eu = norm_diff(dc, dg, n), nu = norm(dc, n);
            if (!(eu <= tol_update * nu))
                fail_msg("%s, %d micro-batch(es): %s update: |gpu - cpu| = %.3g, |cpu| = %.3g",
                         prec, micro, name, eu, nu);
            free(dc), free(dg);
            off += n;
        }
    assert_int_equal(off, c.nparams);
    net_free(&shape);
    free_step(&c), free_step(&g);
    free(x), free(bound);
}

static void test_net_step_fp32(void **state) {
    NEED_GPU();
    for (int r = 0; r < 2; r++) {
        g_step_cfg = r ? step_resnet_cfg : step_cfg;
        check_step(DT_F32, 1, 0, 1e-5, 1e-4, 1e-3);
        check_step(DT_F32, 2, 0, 1e-5, 1e-4, 1e-3);
        check_step(DT_F32, 1, 3, 1e-5, 1e-4, 1e-3);  // activation checkpointing: recomputation
    }
}

// fp16 within 1e-2; bf16 storage (the GEMMs fp32 on both, as above: the conversions and
// the executor's halves on the device against the CPU's) within 3e-2: bf16 rounds 8 times
// coarser than fp16, and a value the two devices sum in another order may round to a
// neighbouring bf16 (the replay: bn1.bias's Adadelta update 1.07e-2 apart).
static void test_net_step_halves(void **state) {
    NEED_GPU();
    const DType precisions[] = {DT_F16, DT_BF16};
    const double tols[] = {1e-2, 3e-2};
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 2; r++) {
            g_step_cfg = r ? step_resnet_cfg : step_cfg;
            const double t = tols[p];
            check_step(precisions[p], 1, 0, t, t, t);
            check_step(precisions[p], 2, NET_SEGMENTS_SQRT, t, t, t);
        }
}

// ---- the byte input (NetOptions.input_bytes) on the device ---------------------------------

// A first layer that reads the bytes a chunk at a time where the table's chunk_bytes makes
// one image's im2col (13 x 13 x 75 floats, 51 KB) a fraction of it: a 5x5 GEMM conv
// without bias.
static const char *step_gemm_cfg =
    "[conv]\nname = conv1\nfilters = 6\nsize = 5\npad = 2\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[maxpool]\nsize = 3\nstride = 2\n"
    "[conv]\nname = conv2\nfilters = 8\nsize = 3\nstride = 2\n[relu]\n"
    "[flatten]\n[linear]\nname = fc\noutputs = 5\n[log_softmax]\n";

typedef struct ByteRun {
    float *grads, *logp;
    float metrics[2];
    int chunk;
    int64_t nparams;
} ByteRun;

// A training step of STEP_B samples on k, the input as the bytes px read through lut, or as
// the floats lut gives them; then an evaluation forward.
static ByteRun byte_run(const Kernels *k, const char *text, DType precision, int segments, bool bytes,
                        const uint8_t *px, const float *lut, const int32_t *y) {
    Cfg cfg;
    Error err = {{0}};
    Net net;
    if (cfg_parse(&cfg, text, "step.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    NetOptions opt = {.batch = STEP_B, .precision = precision, .segments = segments, .input_bytes = bytes};
    optim_plan(&adadelta, &opt);
    if (net_create(&net, &cfg, step_input, STEP_CLASSES, &opt, k, &err) || net_init_params(&net, 7, &err))
        fail_msg("%s: %s", k->name, err.msg);
    cfg_free(&cfg);
    net.gemm_arith = GEMM_FP32;
    const int64_t nx = (int64_t)STEP_B * shape_numel(step_input);
    if (bytes) {
        net_put_input(&net, px, lut, STEP_B);
    } else {
        float *x = xmalloc((size_t)nx * 4);
        for (int64_t i = 0; i < nx; i++) x[i] = lut[(i % 3) * 256 + px[i]];
        k->upload(net.input_buf, x, (size_t)nx * 4);
        free(x);
    }
    k->upload(net.labels, y, STEP_B * 4);
    k->zero(net.metrics, 2 * sizeof(float));
    net_zero_grads(&net);
    net_forward(&net, STEP_B, true, 3, 1, 0);
    net_loss(&net, STEP_B, STEP_B, true);
    net_backward(&net, STEP_B, 3, 1, 0);
    ByteRun r = {.nparams = net.ntrain, .chunk = net.exec.input_chunk};
    r.grads = xmalloc((size_t)net.ntrain * 4), r.logp = xmalloc(STEP_B * STEP_CLASSES * 4);
    k->download(r.grads, net.grads, (size_t)net.ntrain * 4);
    k->download(r.metrics, net.metrics, sizeof r.metrics);
    net_forward(&net, STEP_B, false, 0, 0, 0);
    k->download(r.logp, net_output(&net), STEP_B * STEP_CLASSES * 4);
    net_free(&net);
    return r;
}

// On the GPU (and the CPU) the byte input gives the fp32 input's bits: the whole batch
// expanded (a direct conv, a conv with bias), or chunks of the first layer's sample quantum
// (a table whose chunk_bytes holds 2 images' im2col), in fp32 and fp16.
static void test_net_step_bytes(void **state) {
    NEED_GPU();
    rng_seed(31);
    const int64_t nx = (int64_t)STEP_B * shape_numel(step_input);
    uint8_t *px = xmalloc((size_t)nx);
    for (int64_t i = 0; i < nx; i++) px[i] = (uint8_t)urand64();
    int32_t y[STEP_B];
    for (int i = 0; i < STEP_B; i++) y[i] = (int32_t)(urand64() % STEP_CLASSES);
    float lut[3 * 256];
    normalise_table(lut, 3, (const float[]){0.485f, 0.456f, 0.406f}, (const float[]){0.229f, 0.224f, 0.225f});
    static Kernels small_cpu, small_gpu;  // chunk_bytes of 2 images of the GEMM stem's im2col
    small_cpu = *C, small_gpu = *G;
    small_cpu.chunk_bytes = small_gpu.chunk_bytes = (size_t)2 * 13 * 13 * 75 * 4;
    const Kernels *tables[] = {G, &small_gpu, C, &small_cpu};
    const char *cfgs[] = {step_cfg, step_resnet_cfg, step_gemm_cfg};
    for (size_t t = 0; t < 4; t++)
        for (size_t c = 0; c < 3; c++)
            for (int p = 0; p < 2; p++) {
                const DType precision = p ? DT_F16 : DT_F32;
                const int segments = c == 2 ? 3 : 0;
                ByteRun f = byte_run(tables[t], cfgs[c], precision, segments, false, px, lut, y),
                        b = byte_run(tables[t], cfgs[c], precision, segments, true, px, lut, y);
                char what[96];
                snprintf(what, sizeof what, "%s%s, net %zu, %s: byte input", tables[t]->name,
                         t % 2 ? " (small chunks)" : "", c, p ? "fp16" : "fp32");
                if (!p) assert_int_equal(b.chunk, c == 2 && t % 2 ? 2 : STEP_B);
                expect_same_f32(f.grads, b.grads, f.nparams, what);
                expect_same_f32(f.logp, b.logp, STEP_B * STEP_CLASSES, what);
                expect_same_f32(f.metrics, b.metrics, 2, what);
                free(f.grads), free(f.logp), free(b.grads), free(b.logp);
            }
    free(px);
}

// Gradient clipping's kernels: the sum of squares within double rounding of the CPU's (the
// order within a block differs), several blocks and a partial one; the scaling from a sum on
// the device bit for bit, and none where the norm is within the limit.
static void test_clip_kernels(void **state) {
    NEED_GPU();
    rng_seed(44);
    const int64_t ns[] = {0, 1, 4095, 4096, 3 * SUMSQ_BLOCK + 17};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const int64_t n = ns[t];
        float *x = rand_floats(n ? n : 1, -2, 2);
        const double poison = NAN;
        Buf bx = buf_from(x, (size_t)(n ? n : 1) * 4), out = buf_from(&poison, sizeof poison);
        BOTH(k->sum_squares(P(out), P(bx), n));
        double c, g, ref = 0;
        C->download(&c, out.cpu, sizeof c), G->download(&g, out.gpu, sizeof g);
        for (int64_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
        if (!(fabs(c - ref) <= 1e-12 * ref && fabs(g - ref) <= 1e-12 * ref))
            fail_msg("sum_squares of %lld values: cpu %.17g, gpu %.17g, reference %.17g", (long long)n, c, g, ref);
        const double hundred = 100.0;  // a norm of 10
        Buf sq = buf_from(&hundred, sizeof hundred);
        BOTH(k->clip_scale(P(bx), n, P(sq), 20.0f));  // within the limit: as it was
        BOTH(k->clip_scale(P(bx), n, P(sq), 3.0f));
        const float coef = 3.0f / (10.0f + 1e-6f);
        float *hc = xmalloc((size_t)(n ? n : 1) * 4), *hg = xmalloc((size_t)(n ? n : 1) * 4);
        buf_fetch(bx, hc, hg);
        expect_same_f32(hc, hg, n, "clip_scale");
        for (int64_t i = 0; i < n; i++) assert_true(hc[i] == x[i] * coef);
        buf_free(bx), buf_free(out), buf_free(sq);
        free(x), free(hc), free(hg);
    }
}

// Compressed optimizer state (nn/quant.h): each rule in bf16 and int8 over three blocks
// and a partial one, 4 steps (the last gated shut, one block of zero gradients), the
// parameters, codes and absmax bit for bit on both devices.
static void test_optim_packed(void **state) {
    NEED_GPU();
    const int64_t n = 3 * QUANT_BLOCK + 777;
    const StepScalars rules[] = {
        {.rule = RULE_ADADELTA, .lr = 1.0f, .rho = 0.9f, .eps = 1e-6f, .weight_decay = 0.01f},
        {.rule = RULE_SGD, .lr = 0.05f, .momentum = 0.9f, .one_minus_dampening = 0.9f, .weight_decay = 5e-4f},
        {.rule = RULE_SGD, .lr = 0.05f, .momentum = 0.9f, .one_minus_dampening = 1.0f, .nesterov = true},
        {.rule = RULE_ADAMW, .adamw = {.lr = 1e-3, .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
    };
    for (size_t ri = 0; ri < sizeof rules / sizeof rules[0]; ri++)
        for (int f = STATE_BF16; f < STATE_FORMAT_COUNT; f++) {
            rng_seed(30 + ri);
            float *p = rand_floats(n, -1, 1), *g = rand_floats(n, -1, 1);
            for (int64_t i = 0; i < QUANT_BLOCK; i++) g[i] = 0.0f;
            const size_t cb = (size_t)n * 2, ab = (size_t)quant_blocks(n) * 4;
            void *zero = calloc(cb, 1);
            Buf bp = buf_from(p, (size_t)n * 4), bg = buf_from(g, (size_t)n * 4);
            Buf c0 = buf_from(zero, cb), c1 = buf_from(zero, cb), a0 = buf_from(zero, ab), a1 = buf_from(zero, ab);
            const ScalerState open = {.scale = 1}, shut = {.scale = 1, .found = 1};
            Buf gate = buf_from(&open, sizeof open), skip = buf_from(&shut, sizeof shut);
            for (uint64_t step = 0; step < 4; step++) {
                if (step == 1) {  // new gradients, larger: new block maxima
                    float *g2 = rand_floats(n, -3, 3);
                    C->upload(bg.cpu, g2, (size_t)n * 4), G->upload(bg.gpu, g2, (size_t)n * 4);
                    free(g2);
                }
                BOTH(k->optim_step_packed(P(bp), (PackedState){P(c0), P(a0)}, (PackedState){P(c1), P(a1)},
                                          P(bg), n, (StateFormat)f, rules[ri],
                                          step == 3 ? P(skip) : step == 2 ? P(gate) : NULL, step));
            }
            char what[96];
            float *hc = xmalloc(cb > (size_t)n * 4 ? cb : (size_t)n * 4), *hg = xmalloc(cb > (size_t)n * 4 ? cb : (size_t)n * 4);
            snprintf(what, sizeof what, "packed rule %zu %s: params", ri, f == STATE_BF16 ? "bf16" : "int8");
            buf_fetch(bp, hc, hg);
            expect_same_f32(hc, hg, n, what);
            const Buf states[] = {c0, c1, a0, a1};
            for (int b = 0; b < 4; b++) {
                if (rules[ri].rule == RULE_SGD && (b & 1)) continue;  // one state
                if (f == STATE_BF16 && b >= 2) continue;               // no absmax
                snprintf(what, sizeof what, "packed rule %zu %s: %s %d", ri, f == STATE_BF16 ? "bf16" : "int8",
                         b < 2 ? "codes" : "absmax", b & 1);
                buf_fetch(states[b], hc, hg);
                if (memcmp(hc, hg, states[b].bytes)) {
                    size_t i = 0;
                    while (((char *)hc)[i] == ((char *)hg)[i]) i++;
                    fail_msg("%s: byte %zu differs: cpu 0x%02x, gpu 0x%02x", what, i,
                             ((unsigned char *)hc)[i], ((unsigned char *)hg)[i]);
                }
            }
            buf_free(bp), buf_free(bg), buf_free(c0), buf_free(c1), buf_free(a0), buf_free(a1);
            buf_free(gate), buf_free(skip);
            free(p), free(g), free(zero), free(hc), free(hg);
        }
}

// Parameters and optimizer state of a network of g_step_cfg on G after 2 steps of o (on
// batches drawn from seed 21), the update fused or not: host copies, nparams floats then
// nstates x ntrain.
static float *fused_run(const Optimizer *o, int segments, bool fused, size_t *n) {
    // (o->state_format: how the state is stored; the whole block is compared)
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, g_step_cfg, "step.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    NetOptions opt = {.batch = STEP_B, .precision = DT_F32, .segments = segments, .sweep = segments != 0,
                      .fused_update = fused};
    optim_plan(o, &opt);
    Net net;
    if (net_create(&net, &cfg, step_input, STEP_CLASSES, &opt, G, &err))
        fail_msg("net_create on %s: %s", G->name, err.msg);
    cfg_free(&cfg);
    if (net_init_params(&net, 7, &err)) fail_msg("net_init_params: %s", err.msg);
    if (fused) assert_true(net.plan.grads < net.plan.grads_unfused);
    rng_seed(21);
    const int64_t nx = (int64_t)STEP_B * shape_numel(step_input);
    for (uint64_t step = 0; step < 2; step++) {
        float *x = rand_floats(nx, -2, 2);
        int32_t y[STEP_B];
        for (int i = 0; i < STEP_B; i++) y[i] = (int32_t)(urand64() % STEP_CLASSES);
        G->upload(net.input_buf, x, (size_t)nx * 4);
        G->upload(net.labels, y, sizeof y);
        const int updated = test_train_step(&net, o, STEP_B, o->lr, 3, step);
        assert_int_equal(updated, fused ? net.ntrained_modules : 0);
        free(x);
    }
    const size_t np = (size_t)net.nparams, ns = (net.plan.optimizer + 3) / 4;
    *n = np + ns;
    float *h = calloc(*n ? *n : 1, 4);
    assert_non_null(h);
    G->download(h, net.params, np * 4);
    if (ns) G->download(h + np, net.optimizer, net.plan.optimizer);
    net_free(&net);
    return h;
}

static void test_net_step_fused(void **state) {
    NEED_GPU();
    const Optimizer opts[] = {
        adadelta,
        {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .decay_skip_norm_bias = true},
        {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01},
    };
    for (int r = 0; r < 2; r++)
        for (int seg = 0; seg < 2; seg++)
            for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
                for (int f = 0; f < STATE_FORMAT_COUNT; f += seg ? STATE_FORMAT_COUNT : 1) {
                    g_step_cfg = r ? step_resnet_cfg : step_cfg;
                    Optimizer o = opts[i];
                    o.state_format = (StateFormat)f;
                    size_t na, nb;
                    float *a = fused_run(&o, seg ? NET_SEGMENTS_SQRT : 0, false, &na);
                    float *b = fused_run(&o, seg ? NET_SEGMENTS_SQRT : 0, true, &nb);
                    assert_int_equal(na, nb);
                    if (memcmp(a, b, na * 4))
                        fail_msg("%s, %s%s, optimizer_state %s: the fused update's parameters or "
                                 "state differ on %s", r ? "resnet" : "plain", optim_names[o.kind],
                                 seg ? ", checkpoint = sqrt" : "", state_format_names[f], G->name);
                    free(a), free(b);
                }
}

// One training step of B samples (x, y) on a fresh network of g_step_cfg on G; the network
// is left allocated.
static void plan_step(Net *net, DType precision, int segments, int B, const float *x,
                      const int32_t *y) {
    const ScalerRules rules = scaler_rules(true, 2000);
    make_net(net, G, precision, B, segments);
    G->upload(net->input_buf, x, (size_t)B * shape_numel(step_input) * 4);
    G->upload(net->labels, y, (size_t)B * 4);
    net_zero_grads(net);
    net_forward(net, B, true, 1, 0, 0);
    net_loss(net, B, B, true);
    net_backward(net, B, 1, 0, 0);
    optim_step(net, &adadelta, precision == DT_F16 ? &rules : NULL, 1.0, 0);
    G->sync();
}

// The memory plan against the device memory a network takes after a training step (its
// blocks, and anything the step allocated on its own, such as a cuBLAS workspace): at
// least the plan's blocks, and at most 10% more plus the allocator's rounding (2 MiB a
// block). A first step on a network of the same shape comes before the measured one, so
// that kernels loaded on first use (CUDA_MODULE_LOADING=LAZY) are not counted. The host
// replay counts the bytes allocated: there the two are equal.
static void test_plan_against_device_memory(void **state) {
    NEED_GPU();
    static const struct {
        DType precision;
        int segments;
    } runs[] = {{DT_F32, 0}, {DT_F16, 0}, {DT_F32, NET_SEGMENTS_SQRT}, {DT_F16, NET_SEGMENTS_SQRT}};
    const int B = 512;
    const int64_t nx = (int64_t)B * shape_numel(step_input);
    float *x = rand_floats(nx, -2, 2);
    int32_t *y = xmalloc(B * sizeof *y);
    for (int i = 0; i < B; i++) y[i] = (int32_t)(urand64() % STEP_CLASSES);
    for (int c = 0; c < 2; c++)
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            g_step_cfg = c ? step_resnet_cfg : step_cfg;
            Net net;
            plan_step(&net, runs[r].precision, runs[r].segments, B, x, y);  // the warm-up
            net_free(&net);
            size_t avail, before, after, baseline;
            G->device_memory(&avail, &before, &baseline);
            plan_step(&net, runs[r].precision, runs[r].segments, B, x, y);
            G->device_memory(&avail, &after, &baseline);
            const size_t plan = mem_plan_blocks(&net.plan), taken = after - before;
            print_message("%s, %s, segments %d, batch %d: plan %.2f MB, device %.2f MB (baseline %.0f MB)\n",
                          c ? "resnet" : "plain", runs[r].precision == DT_F16 ? "fp16" : "fp32",
                          runs[r].segments, B, plan / 1e6, taken / 1e6, baseline / 1e6);
            if (taken < plan || taken > plan + plan / 10 + 6 * ((size_t)2 << 20))
                fail_msg("the plan's %zu bytes against %zu taken on the device", plan, taken);
            net_free(&net);
        }
    free(x), free(y);
}

// ---- checkpoints across devices ----------------------------------------------------------------

// Parameters and optimizer state of net, on the host.
static float *snapshot(const Net *net) {
    const size_t n = (size_t)net->nparams;
    float *h = xmalloc(3 * n * 4);
    net->k->download(h, net->params, n * 4);
    net->k->download(h + n, net->optimizer, 2 * n * 4);
    return h;
}

// Gives net non-trivial optimizer state: one step on a random batch.
static void train_once(Net *net, uint64_t seed) {
    rng_seed(seed);
    const int64_t nx = (int64_t)net->batch * shape_numel(step_input);
    float *x = rand_floats(nx, -2, 2);
    int32_t *y = xmalloc(net->batch * sizeof *y);
    for (int i = 0; i < net->batch; i++) y[i] = (int32_t)(urand64() % STEP_CLASSES);
    net->k->upload(net->input_buf, x, nx * 4);
    net->k->upload(net->labels, y, net->batch * sizeof *y);
    net_zero_grads(net);
    net_forward(net, net->batch, true, seed, 1, 0);
    net_loss(net, net->batch, net->batch, true);
    net_backward(net, net->batch, seed, 1, 0);
    optim_step(net, &adadelta, NULL, 1.0, 0);
    free(x), free(y);
}

static void save_and_load(Net *from, Net *to, const char *file) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", g_dir, file);
    const TrainState st = {.epoch = 2, .batch = 5, .step = 123, .seed = 7, .best_val_acc = -1,
                           .loss_scale = 65536};
    static char *names[STEP_CLASSES] = {"a", "b", "c", "d", "e"};  // checkpoint_save needs them (issue 29)
    CheckpointInfo info = {.cfg_text = (char *)g_step_cfg, .class_names = names, .classes = STEP_CLASSES};
    Error err = {{0}};
    if (checkpoint_save(path, from, &st, &info, &err))
        fail_msg("checkpoint_save on %s: %s", from->k->name, err.msg);
    TrainState back;
    if (checkpoint_load_all(path, to, &back, &err))
        fail_msg("checkpoint_load_all on %s: %s", to->k->name, err.msg);
    assert_true(back.step == st.step && back.epoch == st.epoch);
    float *a = snapshot(from), *b = snapshot(to);
    char what[96];
    snprintf(what, sizeof what, "checkpoint %s -> %s", from->k->name, to->k->name);
    expect_same_f32(a, b, 3 * from->nparams, what);
    free(a), free(b);
}

// The batchnorm buffers of every module (F32 values, then the counters), on the host.
static size_t buffers_snapshot(const Net *net, char *out, size_t cap) {
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

static void test_checkpoint_across_devices(void **state) {
    NEED_GPU();
    for (int r = 0; r < 2; r++) {
        g_step_cfg = r ? step_resnet_cfg : step_cfg;
        Net gpu, cpu;
        make_net(&gpu, G, DT_F32, 8, 0);
        make_net(&cpu, C, DT_F32, 8, 0);
        train_once(&gpu, 21);
        save_and_load(&gpu, &cpu, "from_gpu.safetensors");
        char a[8192], b[8192];
        size_t na = buffers_snapshot(&gpu, a, sizeof a);
        assert_int_equal(buffers_snapshot(&cpu, b, sizeof b), na);
        assert_memory_equal(a, b, na);  // running statistics and counters too
        train_once(&cpu, 22);
        save_and_load(&cpu, &gpu, "from_cpu.safetensors");
        na = buffers_snapshot(&cpu, a, sizeof a);
        assert_int_equal(buffers_snapshot(&gpu, b, sizeof b), na);
        assert_memory_equal(a, b, na);
        net_free(&gpu);
        net_free(&cpu);
    }
}

// ---- main ---------------------------------------------------------------------------------------

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_gpu"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--require-gpu") == 0) {
            g_require_gpu = true;
        } else {
            fprintf(stderr, "usage: %s [--require-gpu]\n", argv[0]);
            return 2;
        }
    }
    cpu_set_threads(2);
    C = cpu_kernels();
    g_step_cfg = step_cfg;
    Error err = {{0}};
    G = cuda_kernels(&err);
    if (!G) {
        snprintf(g_why, sizeof g_why, "%s", err.msg);
        printf("test_gpu: %s: %s\n",
               g_require_gpu ? "no GPU, and --require-gpu was given" : "skipping the GPU tests",
               g_why);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_64bit_sizes),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_arith),
        cmocka_unit_test(test_im2col_col2im),
        cmocka_unit_test(test_conv_direct),
        cmocka_unit_test(test_conv_grouped),
        cmocka_unit_test(test_winograd),
        cmocka_unit_test(test_bias_act),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_add_parts),
        cmocka_unit_test(test_bias_act_backward),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_add_act),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_nll_loss),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_u8_to_f32),
        cmocka_unit_test(test_act_pack),
        cmocka_unit_test(test_unscale_check),
        cmocka_unit_test(test_scaler_update),
        cmocka_unit_test(test_adadelta),
        cmocka_unit_test(test_sgd_adamw),
        cmocka_unit_test(test_optim_packed),
        cmocka_unit_test(test_clip_kernels),
        cmocka_unit_test(test_net_step_fp32),
        cmocka_unit_test(test_net_step_halves),
        cmocka_unit_test(test_net_step_bytes),
        cmocka_unit_test(test_net_step_fused),
        cmocka_unit_test(test_plan_against_device_memory),
        cmocka_unit_test(test_checkpoint_across_devices),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
