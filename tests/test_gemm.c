// test_gemm.c: the CPU GEMM (cpu_kernels()->gemm, with the project's AVX-512 kernels where
// the CPU has them, nn/gemm_avx512.h) against a double-precision reference: every
// transpose, alpha and beta, shapes on both sides of the tiles' and blocks' edges, and
// row strides wider than the matrices.
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "../nn/gemm_avx512.h"
#include "../nn/gemm_bf16.h"
#include "../nn/kernels.h"
#include "testutil.h"

static float *random_floats(size_t n) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(test_urand() * 2 - 1);
    return p;
}

// A copy of n floats that ends (at_end) or starts where a page that can be neither read nor
// written begins, with such a page on its other side too: AMX's tile loads and stores,
// which AddressSanitizer does not see, fault past either end of their tensor.
typedef struct Guarded {
    char *map;
    size_t bytes;
    float *p;
} Guarded;

static Guarded guarded_copy(const float *x, size_t n, bool at_end) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (n * sizeof(float) + page - 1) / page * page;
    char *map = mmap(NULL, data + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mprotect(map, page, PROT_NONE), 0);
    assert_int_equal(mprotect(map + page + data, page, PROT_NONE), 0);
    float *p = at_end ? (float *)(map + page + data) - n : (float *)(map + page);
    memcpy(p, x, n * sizeof(float));
    return (Guarded){map, data + 2 * page, p};
}

typedef void GemmFn(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

// Random operands of an M x N x K product with leading dimensions `pad` past the shape,
// one float more in each past the last row, and C0, C's values before the product.
typedef struct Operands {
    int lda, ldb, ldc;
    float *A, *B, *C, *C0;
} Operands;

static Operands operands(int M, int N, int K, bool ta, bool tb, int pad) {
    Operands o = {.lda = (ta ? M : K) + pad, .ldb = (tb ? K : N) + pad, .ldc = N + pad};
    o.A = random_floats((size_t)(ta ? K : M) * o.lda + 1);
    o.B = random_floats((size_t)(tb ? N : K) * o.ldb + 1);
    o.C = random_floats((size_t)M * o.ldc + 1);
    o.C0 = malloc(((size_t)M * o.ldc + 1) * sizeof *o.C0);
    assert_non_null(o.C0);
    memcpy(o.C0, o.C, ((size_t)M * o.ldc + 1) * sizeof *o.C0);
    return o;
}

// Nothing outside the M x N part of C was touched; frees the operands.
static void expect_only_c_written(Operands *o, int M, int N) {
    for (int i = 0; i < M; i++)
        for (int j = N; j < o->ldc; j++) assert_true(o->C[(size_t)i * o->ldc + j] == o->C0[(size_t)i * o->ldc + j]);
    assert_true(o->C[(size_t)M * o->ldc] == o->C0[(size_t)M * o->ldc]);
    free(o->A), free(o->B), free(o->C), free(o->C0);
}

// C = alpha op(A) op(B) + beta C through fn, checked element by element against double
// sums: within 1e-5 of the sum of the absolute terms (float rounding over K terms).
static void check(GemmFn *fn, int M, int N, int K, bool ta, bool tb, float alpha, float beta,
                  int pad) {
    Operands o = operands(M, N, K, ta, tb, pad);
    const int lda = o.lda, ldb = o.ldb, ldc = o.ldc;
    const float *A = o.A, *B = o.B, *C0 = o.C0;
    float *C = o.C;
    fn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                const double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                sum += a * b, mag += fabs(a * b);
            }
            const double c0 = C0[(size_t)i * ldc + j];
            const double want = alpha * sum + (beta != 0.0f ? beta * c0 : 0.0);
            const double tol = 1e-5 * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            const double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= tol))
                fail_msg("%dx%dx%d ta=%d tb=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, expected %.9g",
                         M, N, K, ta, tb, alpha, beta, pad, i, j, got, want);
        }
    expect_only_c_written(&o, M, N);
}

static void avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    assert_int_equal(gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), 0);
}

// cpu_kernels()->gemm has no strides: called only with pad 0.
static void table(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    cpu_kernels()->gemm(C, A, B, M, N, K, ta, tb, alpha, beta);
}

// Around the micro-tiles (12 x 32 and 24 x 16), the k-block (256), the row block (144)
// and the column block (4096); a ResNet's narrow layers; a short K.
static const int shapes[][3] = {{1, 1, 1},     {11, 31, 3},   {13, 33, 17},  {25, 16, 5},
                                {24, 15, 40},  {12, 32, 256}, {37, 47, 257}, {145, 65, 300},
                                {300, 16, 144}, {20, 4100, 9}, {64, 10, 600}, {7, 144, 16}};

static void test_avx512_kernels(void **state) {
    (void)state;
    if (!gemm_avx512_available()) {
        printf("this CPU has no AVX-512: gemm_avx512 is not used here, nothing to test\n");
        return;
    }
    test_rng_seed(1);
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 3; j++)
                check(avx512, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, ab[j][0],
                      ab[j][1], s % 3 == 0 ? 0 : (int)s);
}

// x rounded to bf16 (quant.h's bf16_from_float: to nearest, ties to even), as the GEMM's
// packing rounds its operands (the random values are normal floats).
static float bf16(float x) { return bf16_to_float(bf16_from_float(x)); }

// gemm_bf16 against the fp64 product of the unrounded operands: within 2^-7 of the sum of
// |a b| (each operand within 2^-8 of its value); against that of the bf16 operands within
// fp32's rounding of the sum; and the same bits from two more calls on
// copies against faulting pages (guarded_copy), at the operands' ends and starts. On
// the VDPBF16PS path (exact_order) also against its contract (gemm_bf16.h) replayed in
// scalar code: the operands rounded by quant.h's bf16_from_float (the random values are
// normal floats, where the two roundings agree), each pair's products added odd k first
// with fmaf (a product of two bf16 is exact in fp32, so one fmaf is VDPBF16PS's one
// rounding), blocks of KC added to C: the bits must be equal.
static void check_bf16(int M, int N, int K, bool ta, bool tb, float alpha, float beta, int pad,
                       bool exact_order) {
    Operands o = operands(M, N, K, ta, tb, pad);
    const int lda = o.lda, ldb = o.ldb, ldc = o.ldc;
    const float *A = o.A, *B = o.B, *C0 = o.C0;
    float *C = o.C;
    assert_int_equal(gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), 0);
    // Again on copies against faulting pages, at their end, then at their start: the same C.
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    for (int at_end = 1; at_end >= 0; at_end--) {
        const Guarded ga = guarded_copy(A, na, at_end), gb = guarded_copy(B, nb, at_end),
                      gc = guarded_copy(C0, nc, at_end);
        assert_int_equal(gemm_bf16(ta, tb, M, N, K, alpha, ga.p, lda, gb.p, ldb, beta, gc.p, ldc), 0);
        assert_memory_equal(gc.p, C, nc * sizeof *C);
        munmap(ga.map, ga.bytes), munmap(gb.map, gb.bytes), munmap(gc.map, gc.bytes);
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float c0 = C0[(size_t)i * ldc + j];
            float want = c0;
            double exact = 0, mag = 0, rounded = 0, rmag = 0;  // rounded: of the bf16 operands
            for (int k0 = 0; k0 < K; k0 += GEMM_BF16_KC) {
                const int kc = K - k0 < GEMM_BF16_KC ? K - k0 : GEMM_BF16_KC;
                float acc = 0.0f;
                for (int p = 0; p < kc; p += 2)
                    for (int k = k0 + p + 1; k >= k0 + p; k--) {  // odd, then even
                        if (k >= k0 + kc) continue;
                        const float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                        const float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                        const float ra = bf16(a), rb = bf16(b);
                        acc = fmaf(ra, rb, acc);
                        exact += (double)a * b, mag += fabs((double)a * b);
                        rounded += (double)ra * rb, rmag += fabs((double)ra * rb);
                    }
                const float v = alpha == 1.0f ? acc : acc * alpha;
                want = k0 > 0 ? want + v : beta != 0.0f ? fmaf(beta, c0, v) : v;
            }
            const float got = C[(size_t)i * ldc + j];
            if (exact_order && memcmp(&got, &want, sizeof got) != 0)
                fail_msg("%dx%dx%d ta=%d tb=%d alpha=%g beta=%g pad=%d: C[%d][%d] = %.9g, the contract's %.9g",
                         M, N, K, ta, tb, alpha, beta, pad, i, j, got, want);
            const double expect = alpha * exact + (beta != 0.0f ? beta * (double)c0 : 0.0);
            const double tol = 0x1p-7 * (fabs(alpha) * mag) + 1e-5 * fabs(beta * c0) + 1e-30;
            if (!(fabs(got - expect) <= tol))
                fail_msg("%dx%dx%d: C[%d][%d] = %.9g, %.9g in fp64 (tolerance %.3g)", M, N, K, i, j, got, expect, tol);
            // Every path, AMX's too, against the fp64 sum of the rounded operands: within fp32's
            // rounding of a sum of K terms (and of the blocks' alpha and beta): the right terms,
            // each once (a stale or doubled term passes the bound above).
            const double sum = alpha * rounded + (beta != 0.0f ? beta * (double)c0 : 0.0);
            const double bound = (K + 8) * 0x1p-24 * fabs(alpha) * rmag + 0x1p-22 * fabs(beta * c0) + 1e-30;
            if (!(fabs(got - sum) <= bound))
                fail_msg("%dx%dx%d ta=%d tb=%d alpha=%g beta=%g: C[%d][%d] = %.9g, %.9g in fp64 of the bf16 "
                         "operands (bound %.3g)", M, N, K, ta, tb, alpha, beta, i, j, got, sum, bound);
        }
    expect_only_c_written(&o, M, N);
}

static void test_bf16_kernels(void **state) {
    (void)state;
    if (!gemm_bf16_available()) {
        printf("this CPU has no AVX512-BF16: gemm_bf16 is not used here, nothing to test\n");
        float c = 1.0f, a = 1.0f;
        assert_int_equal(gemm_bf16(false, false, 1, 1, 1, 1.0f, &a, 1, &a, 1, 0.0f, &c, 1), -1);
        return;
    }
    test_rng_seed(4);
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}};
    for (int amx = 0; amx < 2; amx++) {
        gemm_bf16_allow_amx(amx);
        const bool vdpbf16ps = strcmp(gemm_bf16_name(), "AVX512-BF16") == 0;
        if (amx && vdpbf16ps) break;  // no AMX here: the first pass was all
        printf("gemm_bf16 on %s\n", gemm_bf16_name());
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 3; j++)
                    check_bf16(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, ab[j][0], ab[j][1],
                               s % 3 == 0 ? 0 : (int)s, vdpbf16ps);
    }
    // The table's product under GEMM_BF16 (threads' slabs and split K): each slab's bits
    // as gemm_bf16's own, so within the fp64 bounds (also that of the bf16 operands, with
    // the split's partial sums); GEMM_FP32 is the fp32 kernel again.
    // Products of fewer than 32 columns or over fewer than 32 k are fp32's under GEMM_BF16
    // too, bit for bit.
    cpu_set_threads(2);
    static const int more[][3] = {{32, 40, 5000}, {64, 288, 576}, {1000, 40, 32}, {8, 64, 64},
                                  {3, 9, 5000},   {1000, 40, 30}, {1000, 16, 64}};
    for (size_t s = 0; s < sizeof more / sizeof more[0]; s++) {
        const int M = more[s][0], N = more[s][1], K = more[s][2];
        const bool on_bf16 = N >= 32 && K >= 32;
        float *A = random_floats((size_t)M * K), *B = random_floats((size_t)K * N);
        float *C16 = malloc((size_t)M * N * sizeof *C16), *C32 = malloc((size_t)M * N * sizeof *C32);
        assert_non_null(C16), assert_non_null(C32);
        cpu_kernels()->gemm_arith(GEMM_BF16);
        cpu_kernels()->gemm(C16, A, B, M, N, K, false, false, 1.0f, 0.0f);
        cpu_kernels()->gemm_arith(GEMM_FP32);
        cpu_kernels()->gemm(C32, A, B, M, N, K, false, false, 1.0f, 0.0f);
        int differ = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double mag = 0, rounded = 0, rmag = 0;
                for (int k = 0; k < K; k++) {
                    const float a = A[(size_t)i * K + k], b = B[(size_t)k * N + j];
                    const double r = (double)bf16(a) * bf16(b);
                    mag += fabs((double)a * b), rounded += r, rmag += fabs(r);
                }
                const double d = fabs((double)C16[(size_t)i * N + j] - C32[(size_t)i * N + j]);
                if (!(d <= 0x1p-7 * mag + 1e-30)) fail_msg("%dx%dx%d: C[%d][%d] bf16 %.9g, fp32 %.9g", M, N, K, i, j, C16[(size_t)i * N + j], C32[(size_t)i * N + j]);
                if (on_bf16 && !(fabs(C16[(size_t)i * N + j] - rounded) <= (K + 16) * 0x1p-24 * rmag + 1e-30))
                    fail_msg("%dx%dx%d: C[%d][%d] bf16 %.9g, %.9g in fp64 of the bf16 operands", M, N, K, i, j,
                             C16[(size_t)i * N + j], rounded);
                differ += C16[(size_t)i * N + j] != C32[(size_t)i * N + j];
            }
        if (on_bf16) assert_true(differ > 0);  // the bf16 path ran: its rounding shows
        else if (differ) fail_msg("%dx%dx%d under GEMM_BF16: %d values are not fp32's", M, N, K, differ);
        free(A), free(B), free(C16), free(C32);
    }
}

// Convolutions whose im2col columns the bf16 GEMM reads itself: channels in groups of 32
// (a tap's run read where it lies), 16 and 3 (through a row copy), strides, padding, a 1x1
// downsample, and 2,304 columns (several k-blocks). {N, H, W, C, K, stride, pad, OC}.
static const int conv_shapes[][8] = {{2, 7, 7, 32, 3, 1, 1, 40}, {3, 9, 8, 64, 3, 2, 1, 33},
                                     {2, 5, 6, 16, 3, 1, 1, 20}, {2, 6, 6, 3, 5, 1, 2, 8},
                                     {4, 8, 8, 32, 1, 2, 0, 64}, {1, 4, 4, 256, 3, 1, 1, 24}};

static ConvGeometry conv_shape(const int *s) {
    const int OH = (s[1] + 2 * s[6] - s[4]) / s[5] + 1, OW = (s[2] + 2 * s[6] - s[4]) / s[5] + 1;
    return (ConvGeometry){s[0], s[1], s[2], s[3], s[4], s[5], s[6], OH, OW, s[7]};
}

// Bitwise equal C's, M x N with row stride ldc.
static void expect_same_bits(const float *got, const float *want, int M, int N, int ldc, const char *what) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            if (memcmp(got + (size_t)i * ldc + j, want + (size_t)i * ldc + j, sizeof(float)))
                fail_msg("%s: C[%d][%d] = %.9g, over the written columns %.9g", what, i, j, got[(size_t)i * ldc + j],
                         want[(size_t)i * ldc + j]);
}

// w (OC, C, taps) in PyTorch's layout to wp (OC, taps, C), im2col's column order.
static void permute_weight(float *wp, const float *w, ConvGeometry g) {
    const int taps = g.K * g.K;
    for (int o = 0; o < g.OC; o++)
        for (int c = 0; c < g.C; c++)
            for (int t = 0; t < taps; t++)
                wp[((size_t)o * taps + t) * g.C + c] = w[((size_t)o * g.C + c) * taps + t];
}

// conv_gemm_data_grad (stride 1) against din summed in double over bf16 operands: within
// fp32's rounding of the sum (1e-5 of the sum of the absolute terms); din (N, H, W, C)
// into out.
static void check_data_grad(const Kernels *k, ConvGeometry g, const float *dy, const float *w, float *out) {
    k->conv_gemm_data_grad(out, dy, w, g);
    for (int n = 0; n < g.N; n++)
        for (int ih = 0; ih < g.H; ih++)
            for (int iw = 0; iw < g.W; iw++)
                for (int c = 0; c < g.C; c++) {
                    double sum = 0, mag = 0;
                    for (int kh = 0; kh < g.K; kh++)
                        for (int kw = 0; kw < g.K; kw++) {
                            const int oh = ih + g.pad - kh, ow = iw + g.pad - kw;
                            if (oh < 0 || oh >= g.OH || ow < 0 || ow >= g.OW) continue;
                            for (int o = 0; o < g.OC; o++) {
                                const double t = bf16(dy[(((size_t)n * g.OH + oh) * g.OW + ow) * g.OC + o]) *
                                                 bf16(w[(((size_t)o * g.C + c) * g.K + kh) * g.K + kw]);
                                sum += t, mag += fabs(t);
                            }
                        }
                    const double got = out[(((size_t)n * g.H + ih) * g.W + iw) * g.C + c];
                    if (!(fabs(got - sum) <= 1e-5 * mag + 1e-30))
                        fail_msg("conv_gemm_data_grad %dx%dx%dx%d K %d pad %d: din[%d][%d][%d][%d] = %.9g, %.9g in fp64",
                                 g.N, g.H, g.W, g.C, g.K, g.pad, n, ih, iw, c, got, sum);
                }
}

// gemm_bf16_views with the columns and the forward's weight as they lie against gemm_bf16
// over the columns im2col writes and the weight permuted, from several origins (the threads'
// slabs), on AMX and on VDPBF16PS: the same bits. Then the table's conv_gemm_* under
// GEMM_BF16 on 2 threads against gemm_bf16 in one call (forward), the table's gemm
// (weight gradient) and fp64 sums (input gradient), and that it declines under GEMM_FP32.
static void test_bf16_views(void **state) {
    (void)state;
    const ConvGeometry views32 = {2, 7, 7, 32, 3, 1, 1, 7, 7, 32};
    const Kernels *k = cpu_kernels();
    if (!gemm_bf16_available()) {
        printf("this CPU has no AVX512-BF16: the GEMMs never read columns here\n");
        k->gemm_arith(GEMM_BF16);
        assert_false(k->conv_gemm_usable(views32));
        k->gemm_arith(GEMM_FP32);
        return;
    }
    test_rng_seed(5);
    cpu_set_threads(2);
    for (size_t s = 0; s < sizeof conv_shapes / sizeof conv_shapes[0]; s++) {
        const ConvGeometry g = conv_shape(conv_shapes[s]);
        const int rows = g.N * g.OH * g.OW, ckk = g.C * g.K * g.K;
        float *in = random_floats((size_t)g.N * g.H * g.W * g.C), *cols = random_floats((size_t)rows * ckk);
        float *w = random_floats((size_t)g.OC * ckk), *wp = malloc((size_t)g.OC * ckk * sizeof *wp);
        float *dy = random_floats((size_t)rows * g.OC);
        const size_t cn = (size_t)g.OC * (rows > ckk ? rows : ckk) + 1;  // the larger C, and one more
        float *c1 = random_floats(cn), *c2 = malloc(cn * sizeof *c2);
        assert_non_null(wp), assert_non_null(c2);
        k->im2col(cols, in, g.N, g.H, g.W, g.C, g.K, g.stride, g.pad, g.OH, g.OW);
        permute_weight(wp, w, g);
        const GemmView view = {.kind = VIEW_COLS, .in = in, .H = g.H, .W = g.W, .C = g.C, .K = g.K,
                               .stride = g.stride, .pad = g.pad, .OH = g.OH, .OW = g.OW};
        const GemmView weight = {.kind = VIEW_WEIGHT, .ld = ckk, .C = g.C, .taps = g.K * g.K, .cstride = g.K * g.K,
                                 .tstride = 1};
        static const int origins[][2] = {{0, 0}, {5, 32}, {3, 7}};
        for (int amx = 0; amx < 2; amx++) {
            gemm_bf16_allow_amx(amx);
            for (int o = 0; o < 3; o++) {
                GemmView v = view;
                v.row0 = origins[o][0] < rows ? origins[o][0] : 0, v.col0 = origins[o][1] < ckk ? origins[o][1] : 0;
                const int M = rows - (int)v.row0, K = ckk - v.col0;
                const float *at = cols + v.row0 * ckk + v.col0;
                char what[96];
                // Forward: out (M, OC) = cols (M, K) @ w'^T, w' from column col0 on; beta 0
                // and 0.5.
                GemmView wt = weight;
                wt.x = w, wt.trans = true, wt.col0 = v.col0;
                for (int b = 0; b < 2; b++) {
                    memcpy(c2, c1, cn * sizeof *c2);
                    const GemmView c = {.x = c1, .ld = g.OC};
                    assert_int_equal(gemm_bf16_views(M, g.OC, K, 1.0f, &v, &wt, 0.5f * b, &c), 0);
                    assert_int_equal(gemm_bf16(false, true, M, g.OC, K, 1.0f, at, ckk, wp + v.col0, ckk, 0.5f * b, c2,
                                               g.OC),
                                     0);
                    snprintf(what, sizeof what, "shape %zu origin %d amx %d: cols @ w^T", s, o, amx);
                    expect_same_bits(c1, c2, M, g.OC, g.OC, what);
                }
                // Weight gradient: dw' (OC, K) += dy^T (OC, M rows) @ cols.
                memcpy(c2, c1, cn * sizeof *c2);
                const GemmView dyv = {.x = dy, .ld = g.OC, .trans = true}, c = {.x = c1, .ld = ckk};
                assert_int_equal(gemm_bf16_views(g.OC, K, M, 1.0f, &dyv, &v, 1.0f, &c), 0);
                assert_int_equal(gemm_bf16(true, false, g.OC, K, M, 1.0f, dy, g.OC, at, ckk, 1.0f, c2, ckk), 0);
                snprintf(what, sizeof what, "shape %zu origin %d amx %d: dy^T @ cols", s, o, amx);
                expect_same_bits(c1, c2, g.OC, K, ckk, what);
            }
        }
        gemm_bf16_allow_amx(true);
        // The table, on its threads' slabs (and split K where C is small).
        k->gemm_arith(GEMM_BF16);
        assert_false(conv_amx_usable(g));  // narrower than a tile's 16 pixels
        assert_int_equal(k->conv_gemm_usable(g), g.C % 32 == 0 && g.OC % 32 == 0);
        k->conv_gemm_forward(c1, in, w, g);
        assert_int_equal(gemm_bf16(false, true, rows, g.OC, ckk, 1.0f, cols, ckk, wp, ckk, 0.0f, c2, g.OC), 0);
        expect_same_bits(c1, c2, rows, g.OC, g.OC, "conv_gemm_forward");
        // An image's outputs are the same bits in a call of its own (no split of K).
        ConvGeometry one = g;
        one.N = 1;
        k->conv_gemm_forward(c2, in, w, one);
        expect_same_bits(c2, c1, one.OH * one.OW, g.OC, g.OC, "conv_gemm_forward of one image");
        memcpy(c1, wp, (size_t)g.OC * ckk * sizeof *c1), memcpy(c2, wp, (size_t)g.OC * ckk * sizeof *c2);
        k->conv_gemm_weight_grad(c1, dy, in, g);
        if (rows >= 32)  // the table's gemm in bf16 (over fewer rows it sums in fp32)
            k->gemm(c2, dy, cols, g.OC, ckk, rows, true, false, 1.0f, 1.0f);
        else
            assert_int_equal(gemm_bf16(true, false, g.OC, ckk, rows, 1.0f, dy, g.OC, cols, ckk, 1.0f, c2, ckk), 0);
        expect_same_bits(c1, c2, g.OC, ckk, ckk, "conv_gemm_weight_grad");
        if (g.stride == 1) check_data_grad(k, g, dy, w, c1);
        k->gemm_arith(GEMM_FP32);
        assert_false(k->conv_gemm_usable(views32));
        free(in), free(cols), free(w), free(wp), free(dy), free(c1), free(c2);
    }
}

// x in fp64 at (n, h, w, c) of a (N, H, W, C) tensor, zero outside its rows and columns.
static double at_nhwc(const float *x, ConvGeometry g, int C, int n, int h, int w, int c) {
    return h < 0 || h >= g.H || w < 0 || w >= g.W ? 0.0 : bf16(x[(((size_t)n * g.H + h) * g.W + w) * C + c]);
}

// |got - want| within fp32's rounding of a sum of `mag` (the sum of the terms' magnitudes)
// over k terms: k * 2^-24 of mag, and of the value added to (base).
static void expect_sum(double got, double want, double mag, int k, double base, const char *what, int i) {
    if (!(fabs(got - want) <= k * 0x1p-24 * mag + 0x1p-23 * fabs(base) + 1e-30))
        fail_msg("%s[%d] = %.9g, %.9g in fp64 (terms' magnitudes %.3g)", what, i, got, want, mag);
}

// got (N, H, W, cout) against the convolution of x (N, H, W, cin) with w (OC, C, 3, 3) in
// fp64 over bf16 operands: the forward (cin = C, cout = OC), or (turned) the input
// gradient of dy (cin = OC, cout = C, the weight turned half a turn).
static void expect_conv(const float *got, const float *x, const float *w, ConvGeometry g, bool turned,
                        const char *what) {
    const int cin = turned ? g.OC : g.C, cout = turned ? g.C : g.OC, sign = turned ? -1 : 1;
    for (int n = 0; n < g.N; n++)
        for (int h = 0; h < g.H; h++)
            for (int px = 0; px < g.W; px++)
                for (int q = 0; q < cout; q++) {
                    double sum = 0, mag = 0;
                    for (int p = 0; p < cin; p++)
                        for (int t = 0; t < 9; t++) {
                            const size_t wi = turned ? ((size_t)p * g.C + q) * 9 + t : ((size_t)q * g.C + p) * 9 + t;
                            const double v = at_nhwc(x, g, cin, n, h + sign * (t / 3 - 1), px + sign * (t % 3 - 1), p) *
                                             bf16(w[wi]);
                            sum += v, mag += fabs(v);
                        }
                    const size_t i = (((size_t)n * g.H + h) * g.W + px) * cout + q;
                    expect_sum(got[i], sum, mag, 9 * cin, 0, what, (int)i);
                }
}

// AMX's 3x3 convolutions (conv_amx_*) against sums in fp64 of the same bf16 operands: the
// forward, the input gradient and the weight gradient added to dw', on 2 threads; widths
// of a tile and not a multiple of one (overlapping tiles), channels 16 and 48 (k steps
// past the tap row's 3 x C values), bands of rows (a wide image); an image's outputs the
// same bits in a call of its own; every tensor against pages that fault, at its end and
// at its start (guarded_copy: the same bits); the table's conv_gemm_* choose them
// where the views cannot read the channels, only under GEMM_BF16 with AMX allowed.
static void test_amx_conv(void **state) {
    (void)state;
    const Kernels *k = cpu_kernels();
    static const int amx_shapes[][5] = {{2, 17, 17, 16, 16}, {3, 16, 20, 16, 48}, {2, 18, 16, 48, 32},
                                        {1, 40, 200, 32, 16}};  // {N, H, W, C, OC}
    if (!conv_amx_usable((ConvGeometry){1, 16, 16, 16, 3, 1, 1, 16, 16, 16})) {
        printf("no AMX here: the 16-channel convolutions stay on Winograd\n");
        k->gemm_arith(GEMM_BF16);
        assert_false(k->conv_gemm_usable((ConvGeometry){1, 16, 16, 16, 3, 1, 1, 16, 16, 16}));
        k->gemm_arith(GEMM_FP32);
        return;
    }
    test_rng_seed(11);
    cpu_set_threads(2);
    for (size_t s = 0; s < sizeof amx_shapes / sizeof amx_shapes[0]; s++) {
        const int *sh = amx_shapes[s];
        const ConvGeometry g = {sh[0], sh[1], sh[2], sh[3], 3, 1, 1, sh[1], sh[2], sh[4]};
        assert_true(conv_amx_usable(g));
        const size_t pixels = (size_t)g.N * g.H * g.W, nw = (size_t)g.OC * g.C * 9;
        float *in = random_floats(pixels * g.C), *dy = random_floats(pixels * g.OC), *w = random_floats(nw);
        float *out = random_floats(pixels * g.OC), *din = random_floats(pixels * g.C), *dw = random_floats(nw);
        float *dw0 = malloc(nw * sizeof *dw0), *one = malloc(pixels * g.OC * sizeof *one);
        assert_non_null(dw0), assert_non_null(one);
        memcpy(dw0, dw, nw * sizeof *dw0);
        char what[96];
        // The kernels on copies of every tensor against faulting pages, at its end (their
        // results to out, din and dw), then at its start (the same bits).
        for (int at_end = 1; at_end >= 0; at_end--) {
            const Guarded gi = guarded_copy(in, pixels * g.C, at_end), gd = guarded_copy(dy, pixels * g.OC, at_end),
                          gw = guarded_copy(w, nw, at_end), go = guarded_copy(out, pixels * g.OC, at_end),
                          gx = guarded_copy(din, pixels * g.C, at_end), gdw = guarded_copy(dw0, nw, at_end);
            conv_amx_forward(go.p, gi.p, gw.p, g);
            conv_amx_data_grad(gx.p, gd.p, gw.p, g);
            conv_amx_weight_grad(gdw.p, gd.p, gi.p, g);
            if (at_end) {
                memcpy(out, go.p, pixels * g.OC * sizeof *out);
                memcpy(din, gx.p, pixels * g.C * sizeof *din);
                memcpy(dw, gdw.p, nw * sizeof *dw);
            } else {
                snprintf(what, sizeof what, "shape %zu: out, tensors at their pages' start", s);
                expect_same_bits(go.p, out, (int)pixels, g.OC, g.OC, what);
                snprintf(what, sizeof what, "shape %zu: din, tensors at their pages' start", s);
                expect_same_bits(gx.p, din, (int)pixels, g.C, g.C, what);
                snprintf(what, sizeof what, "shape %zu: dw', tensors at their pages' start", s);
                expect_same_bits(gdw.p, dw, g.OC, 9 * g.C, 9 * g.C, what);
            }
            const Guarded all[] = {gi, gd, gw, go, gx, gdw};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) munmap(all[i].map, all[i].bytes);
        }
        snprintf(what, sizeof what, "shape %zu: out", s);
        expect_conv(out, in, w, g, false, what);
        snprintf(what, sizeof what, "shape %zu: din", s);
        expect_conv(din, dy, w, g, true, what);
        snprintf(what, sizeof what, "shape %zu: dw'", s);
        for (int o = 0; o < g.OC; o++)
            for (int t = 0; t < 9; t++)
                for (int c = 0; c < g.C; c++) {
                    double sum = 0, mag = 0;
                    for (int n = 0; n < g.N; n++)
                        for (int h = 0; h < g.H; h++)
                            for (int x = 0; x < g.W; x++) {
                                const double v = bf16(dy[(((size_t)n * g.H + h) * g.W + x) * g.OC + o]) *
                                                 at_nhwc(in, g, g.C, n, h + t / 3 - 1, x + t % 3 - 1, c);
                                sum += v, mag += fabs(v);
                            }
                    const size_t i = ((size_t)o * 9 + t) * g.C + c;
                    expect_sum(dw[i], dw0[i] + sum, mag, (int)(pixels / g.N) + g.N, dw0[i], what, (int)i);
                }
        // The last image alone: the same bits.
        ConvGeometry last = g;
        last.N = 1;
        const size_t image = (size_t)g.H * g.W;
        conv_amx_forward(one, in + (g.N - 1) * image * g.C, w, last);
        snprintf(what, sizeof what, "shape %zu: an image's forward alone", s);
        expect_same_bits(one, out + (g.N - 1) * image * g.OC, (int)image, g.OC, g.OC, what);
        // The table: AMX where the views cannot read the channels, under GEMM_BF16 alone.
        k->gemm_arith(GEMM_BF16);
        assert_int_equal(k->conv_gemm_usable(g), 1);
        k->conv_gemm_forward(one, in, w, g);
        snprintf(what, sizeof what, "shape %zu: conv_gemm_forward", s);
        if (g.C % 32 || g.OC % 32) expect_same_bits(one, out, (int)pixels, g.OC, g.OC, what);
        gemm_bf16_allow_amx(false);
        assert_int_equal(k->conv_gemm_usable(g), g.C % 32 == 0 && g.OC % 32 == 0);
        gemm_bf16_allow_amx(true);
        k->gemm_arith(GEMM_FP32);
        assert_false(k->conv_gemm_usable(g));
        free(in), free(dy), free(w), free(out), free(din), free(dw), free(dw0), free(one);
    }
}

// beta = 0 does not read C (the network's buffers start as whatever was there): NaN in C
// must not reach the result.
static void test_beta_zero_ignores_c(void **state) {
    (void)state;
    test_rng_seed(3);
    static const int sizes[][3] = {{13, 33, 17}, {30, 16, 40}, {64, 288, 300}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
        float *A = random_floats((size_t)M * K), *B = random_floats((size_t)K * N);
        float *C = malloc((size_t)M * N * sizeof *C);
        assert_non_null(C);
        for (int i = 0; i < M * N; i++) C[i] = NAN;
        cpu_kernels()->gemm(C, A, B, M, N, K, false, false, 1.0f, 0.0f);
        for (int i = 0; i < M * N; i++)
            if (!isfinite(C[i])) fail_msg("%dx%dx%d: C[%d] = %g with beta = 0", M, N, K, i, C[i]);
        free(A), free(B), free(C);
    }
}

// The table's GEMM over threads' slabs and its split-K path (a small C over a long K).
static void test_cpu_gemm(void **state) {
    (void)state;
    test_rng_seed(2);
    static const int more[][3] = {{3, 9, 5000}, {64, 288, 576}, {1000, 40, 30}, {40, 1000, 30}};
    cpu_set_threads(2);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) check(table, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, 1.0f, 0.0f, 0);
    for (size_t s = 0; s < sizeof more / sizeof more[0]; s++)
        for (int t = 0; t < 4; t++) check(table, more[s][0], more[s][1], more[s][2], t & 1, t >> 1, -0.5f, 1.0f, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx512_kernels),
        cmocka_unit_test(test_bf16_kernels),
        cmocka_unit_test(test_cpu_gemm),
        cmocka_unit_test(test_bf16_views),
        cmocka_unit_test(test_amx_conv),
        cmocka_unit_test(test_beta_zero_ignores_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
