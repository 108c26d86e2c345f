// cpu_kernels.c: the kernel table on the CPU: GEMMs on the project's AVX-512 kernels
// where the CPU has them (nn/gemm_avx512.h) and on OpenBLAS elsewhere, OpenMP loops for
// the rest. This file is compiled once for each set of instructions a table may use, each
// object defining the table that CPU_KERNEL_SET names (the Makefile: cpu_kernels_portable
// with the build's baseline flags, cpu_kernels_avx2 with -mavx2 -mfma -mf16c, where the
// AVX2/FMA/F16C paths below are compiled); nn/cpu.c chooses one at run time. Every loop
// that runs in parallel writes disjoint outputs, and every reduction sums in an order that
// does not depend on the thread count; a GEMM is cut into one slab per thread, so its bits
// depend on the thread count. Results are bitwise reproducible for a given number of
// threads (DESIGN.md decision 10).
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_avx512.h"
#include "gemm_bf16.h"
#include "half.h"
#include "kernels.h"
#include "rng.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

// Below this many elements a loop runs on one thread: waking threads costs more.
#define PAR_MIN 32768

// Whether the AVX2 table runs its AVX-512 variants (the direct kernels' blocks of 16
// channels, batchnorm's sums), compiled for AVX-512 in functions of their own: on a CPU
// with AVX-512, unless CNN_CPU_KERNELS=avx2 (gemm_avx512_available). The portable table has
// none.
#ifdef __AVX2__
static bool cpu_wide(void) { return gemm_avx512_available(); }
#else
static bool cpu_wide(void) { return false; }
#endif

// ---- memory ------------------------------------------------------------------------------

static void *cpu_alloc(size_t bytes) {
    // 64-byte alignment for AVX-512 loads in OpenBLAS and our loops.
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0) return NULL;
    return p;
}
static void cpu_release(void *p) { free(p); }
// Copies and zeroing of at least COPY_PAR_MIN bytes in one contiguous part per thread:
// one core does not reach the memory's bandwidth (a convolution's weight permuted through
// its scratch: "memory" 1.3 -> 1.0 ms a fashion-resnet step).
#define COPY_PAR_MIN (256 << 10)
// Thread t's part [*lo, *hi) of `bytes` cut into `parts`, at cache-line bounds.
static void byte_part(size_t bytes, int t, int parts, size_t *lo, size_t *hi) {
    *lo = bytes * t / parts / 64 * 64;
    *hi = t + 1 == parts ? bytes : bytes * (t + 1) / parts / 64 * 64;
}
static int byte_parts(size_t bytes) {
    return bytes >= COPY_PAR_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
}
static void cpu_memcpy(void *dst, const void *src, size_t bytes) {
    const int parts = byte_parts(bytes);
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int t = 0; t < parts; t++) {
        size_t lo, hi;
        byte_part(bytes, t, parts, &lo, &hi);
        memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}
static void cpu_zero(void *p, size_t bytes) {
    const int parts = byte_parts(bytes);
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int t = 0; t < parts; t++) {
        size_t lo, hi;
        byte_part(bytes, t, parts, &lo, &hi);
        memset((char *)p + lo, 0, hi - lo);
    }
}
static void cpu_sync(void) {}

// ---- dense algebra ---------------------------------------------------------------------------

// gemm_arith's setting: GEMM_BF16 takes nn/gemm_bf16.c where the CPU has AVX512-BF16; the
// rest is fp32. Set between products by the calling thread, read inside them.
static GemmArith cpu_arith = GEMM_FP32;

// The project's own GEMMs (AVX-512, bf16) belong to the fast table: the baseline's (a CPU
// without AVX2, or CNN_CPU_KERNELS=portable anywhere) multiplies on OpenBLAS alone, as
// such a CPU does, so that a forced baseline run gives that CPU's bits (tests/arch.sh).
#ifdef __AVX2__
enum { OWN_GEMMS = 1 };
#else
enum { OWN_GEMMS = 0 };
#endif

// An operand or the result of cpu_gemm (nn/gemm_bf16.h's GemmView): a stored matrix, or
// for the bf16 GEMM alone a convolution's im2col columns (never written) or its weight in
// PyTorch's layout (not permuted), which its packing reads where they lie
// (cpu_conv_gemm_* say when).
static GemmView stored(const float *x, int ld, bool trans) {
    return (GemmView){.kind = VIEW_STORED, .x = (float *)x, .ld = ld, .trans = trans};
}

// The view from row `row` and column `col` of its matrix as stored on.
static GemmView view_from(GemmView v, int64_t row, int64_t col) {
    if (v.kind == VIEW_COLS) v.row0 += row, v.col0 += (int)col;
    else if (v.kind == VIEW_WEIGHT) v.x += row * v.ld, v.col0 += (int)col;
    else v.x += row * v.ld + col;
    return v;
}

// The bf16 GEMM and AMX's convolutions have nothing to fall back on without it.
static void no_packing_buffer(void) {
    fprintf(stderr, "error: out of memory for the GEMM's packing buffer (%zu bytes a thread)\n",
            GEMM_THREAD_BUFFER_BYTES);
    exit(1);
}

// One thread's product (cblas_sgemm's arguments, row-major): nn/gemm_bf16.c under
// GEMM_BF16 where the CPU has AVX512-BF16, else the project's AVX-512 kernels where the
// CPU has them (nn/gemm_avx512.h), else OpenBLAS. Measured on one thread against
// OpenBLAS's AVX2 kernels (OPENBLAS_CORETYPE=Haswell), GFLOP/s: ours 1.1-2x faster on
// every shape of the seed network and of a ResNet, even on a 64 x 9216 product over
// K = 10. Columns and weights go to the bf16 GEMM alone. bf16: whether stored operands go
// to the bf16 GEMM (bf16_product).
static void sgemm(int M, int N, int K, float alpha, const GemmView *A, const GemmView *B, float beta,
                  const GemmView *C, bool bf16) {
    if (A->kind != VIEW_STORED || B->kind != VIEW_STORED) {
        if (gemm_bf16_views(M, N, K, alpha, A, B, beta, C) != 0) no_packing_buffer();
        return;
    }
    const bool ta = A->trans, tb = B->trans;
    const int lda = (int)A->ld, ldb = (int)B->ld, ldc = (int)C->ld;
    if (OWN_GEMMS && bf16 &&
        gemm_bf16(ta, tb, M, N, K, alpha, A->x, lda, B->x, ldb, beta, C->x, ldc) == 0)
        return;
    if (OWN_GEMMS && gemm_avx512_available() &&
        gemm_avx512(ta, tb, M, N, K, alpha, A->x, lda, B->x, ldb, beta, C->x, ldc) == 0)
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A->x, lda, B->x, ldb, beta, C->x, ldc);
}

// Whether a product of stored operands, (M, N) over K, runs on the bf16 GEMM: under GEMM_BF16,
// where neither N nor K is under BF16_MIN_SIDE. AMX pads k to 32 and VDPBF16PS's narrow tile
// is 16 columns, so the bf16 GEMM ran thinner products slower than the fp32 kernels
// (models/resnet-small.cfg's 16-channel Winograd layers, products 25,088 x 16 over 16:
// layer1.0 forward 9.2 -> 7.0 ms, backward 16.1 -> 13.2, the step 87.6 -> 77.4). Decided on
// the whole product, not on the threads' slabs (one arithmetic for all its elements), and
// not on M, a forward's rows: an output's bits do not depend on the images of its call.
#define BF16_MIN_SIDE 32
static bool bf16_product(int N, int K) {
    return cpu_arith == GEMM_BF16 && N >= BF16_MIN_SIDE && K >= BF16_MIN_SIDE;
}

// The GEMMs run single-threaded inside our OpenMP threads: OpenBLAS's own pthreads would
// spin against OpenMP's between calls and halve the speed on a 2-core machine. The product
// is cut into one slab of rows (or of columns, when C is wider than tall) per thread, each
// one sgemm call over the full K. One slab per thread, not more: every slab packs the
// operand it shares with the others again, and the per-element rounding depends on the
// cut, so the bits depend on the thread count (not on anything else). Measured
// (bench/sgemm, 2 threads, OpenBLAS): the conv2 weight gradient 166 -> 187 GFLOP/s and fc1
// forward 125 -> 147 GFLOP/s against 8 slabs.
// split_k: whether a small C over a long K may be summed in the threads' shares of K (below);
// without it each element of C is one call's sum over K, whatever M and N are.
static void gemm_views(GemmView C, GemmView A, GemmView B, int M, int N, int K, float alpha, float beta,
                       bool split_k) {
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();  // 1 inside a shard
    const bool bf16 = bf16_product(N, K);
    // A small C over a long K (a convolution's weight gradient: 32 x 9 over 43,264 rows for
    // the seed's first layer, 32 x 288 over 1,764 for deep.cfg's): slabs of C would each
    // pack the long operand again (and cut 288 columns into slabs of 144, 4.5 tiles); instead
    // each thread sums its share of K into its own copy of C, and the copies are added in
    // thread order. (C up to 4096 -> 9216 values: deep.cfg's conv weight gradient in place
    // 253-265 -> 294-305 GFLOP/s; deep.cfg 0.96-1.16x (mean 1.07), resnet-small
    // 1.01-1.06x img/s in four alternating pairs.)
    enum { SPLIT_K_MAX_C = 9216, SPLIT_K_MAX_THREADS = 16 };
    if (split_k && threads > 1 && (int64_t)M * N <= SPLIT_K_MAX_C && K >= 256 * threads) {
        const int T = threads < SPLIT_K_MAX_THREADS ? threads : SPLIT_K_MAX_THREADS;
        const int kslab = (K + T - 1) / T, mn = M * N;
        float part[T][mn];  // at most 16 x 9216 floats on the stack
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++) {
            const int k0 = t * kslab, kn = K - k0 < kslab ? K - k0 : kslab;
            if (kn <= 0) {
                memset(part[t], 0, (size_t)mn * sizeof(float));
                continue;
            }
            const GemmView a = A.trans ? view_from(A, k0, 0) : view_from(A, 0, k0);
            const GemmView b = B.trans ? view_from(B, 0, k0) : view_from(B, k0, 0), c = stored(part[t], N, false);
            sgemm(M, N, kn, 1.0f, &a, &b, 0.0f, &c, bf16);
        }
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float sum = part[0][i * N + j], *c = C.x + i * C.ld + j;
                for (int t = 1; t < T; t++) sum += part[t][i * N + j];
                *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;
            }
        return;
    }
    const bool by_rows = M >= N;
    const int len = by_rows ? M : N;
    // Small products run as one call; slabs are multiples of 16 rows or columns, of 32 where
    // the bf16 GEMM reads columns (its groups of 32 columns in one tap, nn/gemm_bf16.c). A
    // slab's elements are the same bits wherever it is cut.
    const int align = A.kind == VIEW_COLS || B.kind == VIEW_COLS ? 32 : 16;
    int slab = (int64_t)M * N * K < (1 << 18) ? len : (len + threads - 1) / threads;
    slab = (slab + align - 1) / align * align;
    const int nslabs = (len + slab - 1) / slab;
#pragma omp parallel for schedule(static) if (nslabs > 1)
    for (int t = 0; t < nslabs; t++) {
        const int i0 = t * slab, n = len - i0 < slab ? len - i0 : slab;
        if (by_rows) {
            const GemmView a = A.trans ? view_from(A, 0, i0) : view_from(A, i0, 0), c = view_from(C, i0, 0);
            sgemm(n, N, K, alpha, &a, &B, beta, &c, bf16);
        } else {
            const GemmView b = B.trans ? view_from(B, i0, 0) : view_from(B, 0, i0), c = view_from(C, 0, i0);
            sgemm(M, n, K, alpha, &A, &b, beta, &c, bf16);
        }
    }
}

static void cpu_gemm(float *C, const float *A, const float *B, int M, int N, int K, bool transA,
                     bool transB, float alpha, float beta) {
    gemm_views(stored(C, N, false), stored(A, transA ? M : K, transA), stored(B, transB ? K : N, transB), M, N, K,
               alpha, beta, true);
}

// A convolution's GEMMs on the bf16 GEMM's views (under GEMM_BF16 on a CPU with
// AVX512-BF16): its packing reads the im2col columns from the input (or from dout, for a
// stride-1 input gradient), and the weight where PyTorch's layout keeps it. The forward
// and the weight gradient are the products and bits of im2col into a workspace and
// cpu_gemm with the weight permuted, without writing 9 floats for every input float of a
// 3 x 3 convolution or permuting the weight for the forward (models/fashion-resnet.cfg:
// im2col 6.9 and the permutes 4.5 ms of a 67.6-ms step). The weight gradient stays in the
// columns' order: added where PyTorch's layout keeps it (scattered 16 floats at a time, at
// every k-block of every chunk), the step took 2.3x as long.
// Channels a multiple of 32: the packing reads a tap's 32 at a time where they lie; fewer
// go through a row copied run by run, slower than im2col (resnet18's stem, C = 3: the
// step 0.96 -> 1.08-1.14 s).
static bool conv_views(ConvGeometry g) { return g.C % 32 == 0 && g.OC % 32 == 0 && gemm_bf16_available(); }

// Where the views cannot read a 3x3 layer's channels (multiples of 16 alone), AMX's
// convolution from the input itself (nn/gemm_bf16.h): models/resnet-small.cfg's 16-channel
// stage, which ran in fp32 Winograd under matmul = bf16.
static bool conv_amx(ConvGeometry g) { return !conv_views(g) && conv_amx_usable(g); }

static bool cpu_conv_gemm_usable(ConvGeometry g) {
    return OWN_GEMMS && cpu_arith == GEMM_BF16 && (conv_views(g) || conv_amx(g));
}

static GemmView cols_view(const float *in, ConvGeometry g) {
    return (GemmView){.kind = VIEW_COLS, .in = in, .H = g.H, .W = g.W, .C = g.C, .K = g.K, .stride = g.stride,
                      .pad = g.pad, .OH = g.OH, .OW = g.OW};
}

static GemmView weight_view(const float *w, ConvGeometry g) {
    const int taps = g.K * g.K;
    return (GemmView){.kind = VIEW_WEIGHT, .x = (float *)w, .ld = (int64_t)g.C * taps, .trans = true, .C = g.C,
                      .taps = taps, .cstride = taps, .tstride = 1};
}

// Never split over K: an output pixel's sum is the same bits whatever images the call has.
static void cpu_conv_gemm_forward(float *out, const float *in, const float *w, ConvGeometry g) {
    if (conv_amx(g)) {
        if (conv_amx_forward(out, in, w, g)) no_packing_buffer();
        return;
    }
    gemm_views(stored(out, g.OC, false), cols_view(in, g), weight_view(w, g), g.N * g.OH * g.OW, g.OC,
               g.C * g.K * g.K, 1.0f, 0.0f, false);
}

// din = the convolution of dout, padded by K - 1 - pad, with the weight turned half a turn
// and its filters and channels swapped (stride 1): one product for the call's images,
// never split over K.
static void cpu_conv_gemm_data_grad(float *din, const float *dout, const float *w, ConvGeometry g) {
    if (conv_amx(g)) {
        if (conv_amx_data_grad(din, dout, w, g)) no_packing_buffer();
        return;
    }
    const int taps = g.K * g.K;
    const ConvGeometry t = {g.N, g.OH, g.OW, g.OC, g.K, 1, g.K - 1 - g.pad, g.H, g.W, g.C};
    const GemmView wt = {.kind = VIEW_WEIGHT, .x = (float *)w, .ld = taps, .trans = true, .C = g.OC, .taps = taps,
                         .cstride = g.C * taps, .tap0 = taps - 1, .tstride = -1};
    gemm_views(stored(din, g.C, false), cols_view(dout, t), wt, g.N * g.H * g.W, g.C, taps * g.OC, 1.0f, 0.0f,
               false);
}

static void cpu_conv_gemm_weight_grad(float *dw, const float *dy, const float *in, ConvGeometry g) {
    if (conv_amx(g)) {
        if (conv_amx_weight_grad(dw, dy, in, g)) no_packing_buffer();
        return;
    }
    const int ckk = g.C * g.K * g.K;
    gemm_views(stored(dw, ckk, false), stored(dy, g.OC, true), cols_view(in, g), g.OC, ckk, g.N * g.OH * g.OW,
               1.0f, 1.0f, true);
}

// ---- convolution lowering ---------------------------------------------------------------------

// dst[0, n) = src[0, n) for the runs of im2col (K * C floats): runs of 8 floats and more
// inline, where a memcpy call per run of a few hundred bytes costs as much as the copy
// (conv2 of the seed network: im2col 0.88 -> 0.64 ms per step); shorter ones (conv1's 3)
// by a plain loop.
static inline void copy_floats(float *dst, const float *src, int64_t n) {
#ifdef __AVX2__
    if (n >= 8) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
        if (i < n) _mm256_storeu_ps(dst + n - 8, _mm256_loadu_ps(src + n - 8));  // the tail
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

// Columns are (kh, kw, c): with channel-last input, each (kh, kw) of a patch is C
// contiguous floats of the input, and a patch row inside the image is K * C of them.
static void cpu_im2col(float *col, const float *in, int N, int H, int W, int C, int K, int stride,
                       int pad, int OH, int OW) {
    const int64_t rows = (int64_t)N * OH * OW, kc = (int64_t)K * C, ckk = K * kc;
#pragma omp parallel for schedule(static) if (rows * ckk > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int ow = (int)(r % OW), oh = (int)(r / OW % OH), n = (int)(r / ((int64_t)OW * OH));
        const int iw0 = ow * stride - pad;
        float *dst = col + r * ckk;
        // At a row's start, prefetch the input row that the next output row adds (conv2
        // forward: 0.72 -> 0.60 ms a step).
        if (ow == 0) {
            const int ih = oh * stride - pad + K;
            if (ih >= 0 && ih < H)
                for (int64_t i = 0; i < (int64_t)W * C; i += 16)
                    __builtin_prefetch(in + ((int64_t)n * H + ih) * W * C + i);
        }
        for (int kh = 0; kh < K; kh++, dst += kc) {
            const int ih = oh * stride - pad + kh;
            if (ih < 0 || ih >= H) {
                memset(dst, 0, (size_t)kc * sizeof(float));
                continue;
            }
            const float *src = in + ((int64_t)n * H + ih) * W * C;
            if (iw0 >= 0 && iw0 + K <= W) {
                copy_floats(dst, src + (int64_t)iw0 * C, kc);
                continue;
            }
            for (int kw = 0; kw < K; kw++) {
                const int iw = iw0 + kw;
                if (iw < 0 || iw >= W) memset(dst + kw * C, 0, (size_t)C * sizeof(float));
                else copy_floats(dst + kw * C, src + (int64_t)iw * C, C);
            }
        }
    }
}

// Gathered by rows of din, in parallel (a convolution's chunk is often one image): each
// pixel sums the patches that cover it in the order (oh, ow) ascending from 0, as the CUDA
// kernel does. A row's patch rows come in that order, each patch adding its K runs of C
// into the row's pixels, so no tap is tested with a division. (Measured on resnet-small,
// where a chunk is one image: col2im 46-54 -> 35-37 ms a step against one image per
// thread. Without the divisions: fashion-resnet's stride-2 layers 1.66 -> 1.43 ms a step
// with the columns in the caches, the profile's col2im 2.8-2.9 -> 2.4-2.5 ms.)
static void cpu_col2im(float *din, const float *col, int N, int H, int W, int C, int K,
                       int stride, int pad, int OH, int OW) {
    const int64_t kc = (int64_t)K * C, ckk = K * kc;
#pragma omp parallel for schedule(static) if ((int64_t)N * OH * OW * ckk > PAR_MIN)
    for (int64_t r = 0; r < (int64_t)N * H; r++) {
        const int n = (int)(r / H), y = (int)(r % H) + pad;
        float *const drow = din + r * W * C;
        memset(drow, 0, (size_t)W * C * sizeof(float));
        for (int oh = first_window(y, K, stride); oh <= last_window(y, stride, OH); oh++) {
            const float *crow = col + ((int64_t)n * OH + oh) * OW * ckk + (int64_t)(y - oh * stride) * kc;
            for (int ow = 0; ow < OW; ow++, crow += ckk) {
                const int iw0 = ow * stride - pad;
                for (int kw = iw0 < 0 ? -iw0 : 0; kw < K && iw0 + kw < W; kw++) {
                    float *d = drow + (int64_t)(iw0 + kw) * C;
                    const float *sp = crow + (int64_t)kw * C;
                    for (int c = 0; c < C; c++) d[c] += sp[c];
                }
            }
        }
    }
}

// ---- Winograd F(2x2, 3x3) ---------------------------------------------------------------------
//
// Each tile is transformed 8 channels at a time in vectors (GCC's vector extension: AVX
// registers in the AVX2 table, SSE pairs in the baseline's), all 16 points of a tile in
// registers; channels past a multiple of 8 go through a zero-padded copy. The 1-D formulas
// are applied to the rows (the first index), then to the columns, and the CUDA bodies
// (gpu/cuda_kernels.cu) repeat them operation for operation. Measured against arrays
// in memory with a memcpy per 64 bytes: the forward transforms of a deep.cfg layer
// 1.84 -> ... ms a step.
typedef float WgVec __attribute__((vector_size(32)));
#define WG_LANES 8

// Lanes [0, n) of p (n <= WG_LANES), zeros after; NULL: all zeros. And the store of [0, n).
// Each transform calls them from one always-inlined block body, with n = WG_LANES for
// every full block (plain vector loads and stores) and once more for the channels left.
#define WG_INLINE static inline __attribute__((always_inline))
WG_INLINE WgVec wg_load(const float *p, int n) {
    WgVec v = {0};
    if (n == WG_LANES) {
        if (p) memcpy(&v, p, sizeof v);
    } else if (p) {
        for (int i = 0; i < n; i++) v[i] = p[i];
    }
    return v;
}
WG_INLINE void wg_store(float *p, WgVec v, int n) {
    if (n == WG_LANES) memcpy(p, &v, sizeof v);
    else
        for (int i = 0; i < n; i++) p[i] = v[i];
}

// y = B^T x and x = B y (its adjoint) over 4 values s apart; y (2) = A^T x (4) and
// x (4) = A y (2).
static inline void wg_bt(WgVec *y, const WgVec *x, int s) {
    const WgVec x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = x0 - x2, y[s] = x1 + x2, y[2 * s] = x2 - x1, y[3 * s] = x1 - x3;
}
static inline void wg_b(WgVec *y, const WgVec *x, int s) {
    const WgVec x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = x0, y[s] = x1 - x2 + x3, y[2 * s] = x1 - x0 + x2, y[3 * s] = -x3;
}
static inline void wg_at(WgVec *y, const WgVec *x, int s) {
    const WgVec x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = x0 + x1 + x2, y[s] = x1 - x2 - x3;
}
static inline void wg_a(WgVec *x, const WgVec *y, int s) {
    const WgVec y0 = y[0], y1 = y[s];
    x[0] = y0, x[s] = y0 + y1, x[2 * s] = y0 - y1, x[3 * s] = -y1;
}

// Which of a tile's rows (or columns) from y0 lie inside [0, H): bit a for row y0 + a.
static inline unsigned wg_mask(int y0, int rows, int H) {
    unsigned m = 0;
    for (int a = 0; a < rows; a++) m |= (unsigned)(y0 + a >= 0 && y0 + a < H) << a;
    return m;
}

// A tile's channels [c0, c0 + n) of the pixel of point p (a * 4 + b) at in + corner +
// off[p], zeros where row a or column b is outside the image (rows, cols: the masks of
// wg_mask). Called with rows = cols = 15 for the tiles inside the image, which compiles to
// plain loads.
WG_INLINE void wg_input_block(float *V, const float *in, int64_t corner, const int64_t *off,
                              unsigned rows, unsigned cols, int64_t S, int64_t t, int C, int c0, int n) {
    WgVec d[16], u[16];
    for (int p = 0; p < 16; p++)
        d[p] = wg_load((rows >> (p / 4) & cols >> (p % 4) & 1) ? in + (corner + off[p] + c0) : NULL, n);
    for (int b = 0; b < 4; b++) wg_bt(u + b, d + b, 4);          // rows
    for (int a = 0; a < 4; a++) wg_bt(d + 4 * a, u + 4 * a, 1);  // columns
    float *v = V + t * C + c0;
    for (int p = 0; p < 16; p++) wg_store(v + p * S, d[p], n);
}

// The transforms run over rows of tiles (image, tile row ty) in parallel, a row's tiles
// in order.
static void cpu_winograd_input(float *V, const float *in, ConvGeometry g) {
    const int C = g.C, full = C / WG_LANES * WG_LANES, TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, C);
    int64_t off[16];
    for (int p = 0; p < 16; p++) off[p] = ((int64_t)(p / 4) * g.W + p % 4) * C;
#pragma omp parallel for schedule(dynamic, 2) if (T * 16 * C > PAR_MIN)
    for (int64_t r = 0; r < (int64_t)g.N * TH; r++) {
        const int ty = (int)(r % TH), y0 = 2 * ty - g.pad;
        const unsigned rows = wg_mask(y0, 4, g.H);
        for (int tx = 0; tx < TW; tx++) {
            const int64_t t = r * TW + tx;
            const int x0 = 2 * tx - g.pad;
            const unsigned cols = wg_mask(x0, 4, g.W);
            // The tile's corner, possibly outside the image: only its pixels inside are read.
            const int64_t corner = (r / TH * g.H * g.W + (int64_t)y0 * g.W + x0) * C;
            if (rows == 15 && cols == 15) {
                for (int c0 = 0; c0 < full; c0 += WG_LANES)
                    wg_input_block(V, in, corner, off, 15, 15, S, t, C, c0, WG_LANES);
                if (full < C) wg_input_block(V, in, corner, off, 15, 15, S, t, C, full, C - full);
                continue;
            }
            for (int c0 = 0; c0 < full; c0 += WG_LANES)
                wg_input_block(V, in, corner, off, rows, cols, S, t, C, c0, WG_LANES);
            if (full < C) wg_input_block(V, in, corner, off, rows, cols, S, t, C, full, C - full);
        }
    }
}

// One row of tiles (image n, tile row ty), channels [c0, c0 + n): left to right, each
// tile's 4 x 4 plus the right half of the tile before it (carried in registers) gives the
// row's final sums for its left two columns, stored over din (add = false) or added to it.
WG_INLINE void wg_input_backward_row(float *din, const float *dV, int64_t S, int64_t t0, ConvGeometry g,
                                     int ty, int c0, int n, bool add) {
    const int TW = (g.OW + 1) / 2, y0 = 2 * ty - g.pad;
    WgVec carry[8] = {0};  // [4 rows][2 columns]
    for (int tx = 0; tx <= TW; tx++) {
        WgVec d[16] = {0}, u[16];
        if (tx < TW) {
            for (int p = 0; p < 16; p++) d[p] = wg_load(dV + p * S + (t0 + tx) * g.C + c0, n);
            for (int b = 0; b < 4; b++) wg_b(u + b, d + b, 4);
            for (int a = 0; a < 4; a++) wg_b(d + 4 * a, u + 4 * a, 1);
        }
        const int x0 = 2 * tx - g.pad;
        for (int a = 0; a < 4; a++) {
            const int y = y0 + a;
            for (int b = 0; b < 2; b++) {
                const WgVec v = d[4 * a + b] + carry[2 * a + b];
                carry[2 * a + b] = d[4 * a + b + 2];
                const int x = x0 + b;
                if (y < 0 || y >= g.H || x < 0 || x >= g.W) continue;
                float *dst = din + ((int64_t)y * g.W + x) * g.C + c0;
                wg_store(dst, add ? wg_load(dst, n) + v : v, n);
            }
        }
    }
}

// Tile rows of even ty first (their 4 input rows do not overlap, and together they cover
// every row above the last of them: stored, the rows below zeroed), then the odd ones
// (added). Each pixel's value: ((its even row's right tile + left tile) + (its odd row's
// right tile + left tile)), whatever the threads; the CUDA kernel's order too.
static void cpu_winograd_input_backward(float *din, const float *dV, ConvGeometry g) {
    const int C = g.C, full = C / WG_LANES * WG_LANES, TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, C), image = (int64_t)g.H * g.W * C;
    const int covered = 2 * ((TH - 1) / 2 * 2) - g.pad + 4;  // rows the even tile rows reach
    if (covered < g.H)
        for (int64_t i = 0; i < g.N; i++)
            memset(din + i * image + (int64_t)covered * g.W * C, 0,
                   (size_t)(g.H - covered) * g.W * C * sizeof(float));
    for (int odd = 0; odd < 2; odd++) {
        const int rows_per_image = (TH - odd + 1) / 2;
        const int64_t rows = (int64_t)g.N * rows_per_image;
#pragma omp parallel for schedule(dynamic, 2) if (T * 16 * C > PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t n = r / rows_per_image;
            const int ty = odd + 2 * (int)(r % rows_per_image);
            const int64_t t0 = (n * TH + ty) * TW;
            for (int c0 = 0; c0 < full; c0 += WG_LANES)
                wg_input_backward_row(din + n * image, dV, S, t0, g, ty, c0, WG_LANES, odd);
            if (full < C) wg_input_backward_row(din + n * image, dV, S, t0, g, ty, full, C - full, odd);
        }
    }
}

// Output tiles: point p (a * 2 + b) of a tile at corner + off[p] of out or dout, rows and
// cols the masks of the pixels inside the image.
WG_INLINE void wg_output_block(float *out, int64_t corner, const int64_t *off, unsigned rows,
                               unsigned cols, const float *M, int64_t S, int64_t t, int OC, int c0, int n) {
    WgVec m[16], u[8], y[4];
    const float *mt = M + t * OC + c0;
    for (int p = 0; p < 16; p++) m[p] = wg_load(mt + p * S, n);
    for (int b = 0; b < 4; b++) wg_at(u + b, m + b, 4);          // u[2][4]
    for (int a = 0; a < 2; a++) wg_at(y + 2 * a, u + 4 * a, 1);  // y[2][2]
    for (int p = 0; p < 4; p++)
        if (rows >> (p / 2) & cols >> (p % 2) & 1) wg_store(out + (corner + off[p] + c0), y[p], n);
}

WG_INLINE void wg_output_backward_block(float *dM, const float *dout, int64_t corner, const int64_t *off,
                                        unsigned rows, unsigned cols, int64_t S, int64_t t, int OC,
                                        int c0, int n) {
    WgVec y[4], u[8], m[16];
    for (int p = 0; p < 4; p++)
        y[p] = wg_load((rows >> (p / 2) & cols >> (p % 2) & 1) ? dout + (corner + off[p] + c0) : NULL, n);
    for (int b = 0; b < 2; b++) wg_a(u + b, y + b, 2);          // u[4][2]
    for (int a = 0; a < 4; a++) wg_a(m + 4 * a, u + 2 * a, 1);  // m[4][4]
    float *mt = dM + t * OC + c0;
    for (int p = 0; p < 16; p++) wg_store(mt + p * S, m[p], n);
}

// Both directions of the output transform: M -> out (backward = false) or dout -> dM,
// each block call with a constant lane count (a full vector, then the channels left).
WG_INLINE void wg_output_tile(float *image, float *M, int64_t corner, const int64_t *off, unsigned rows,
                              unsigned cols, int64_t S, int64_t t, int OC, int c0, int n, bool backward) {
    if (backward) wg_output_backward_block(M, image, corner, off, rows, cols, S, t, OC, c0, n);
    else wg_output_block(image, corner, off, rows, cols, M, S, t, OC, c0, n);
}

WG_INLINE void wg_output_tiles(float *image, float *M, ConvGeometry g, bool backward) {
    const int OC = g.OC, full = OC / WG_LANES * WG_LANES, TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, OC);
    const int64_t off[4] = {0, OC, (int64_t)g.OW * OC, ((int64_t)g.OW + 1) * OC};
#pragma omp parallel for schedule(dynamic, 2) if (T * 16 * OC > PAR_MIN)
    for (int64_t r = 0; r < (int64_t)g.N * TH; r++) {
        const int ty = (int)(r % TH);
        const unsigned rows = wg_mask(2 * ty, 2, g.OH);
        for (int tx = 0; tx < TW; tx++) {
            const int64_t t = r * TW + tx;
            const unsigned cols = wg_mask(2 * tx, 2, g.OW);
            const int64_t corner = (r / TH * g.OH * g.OW + (int64_t)2 * ty * g.OW + 2 * tx) * OC;
            for (int c0 = 0; c0 < full; c0 += WG_LANES)
                wg_output_tile(image, M, corner, off, rows, cols, S, t, OC, c0, WG_LANES, backward);
            if (full < OC) wg_output_tile(image, M, corner, off, rows, cols, S, t, OC, full, OC - full, backward);
        }
    }
}

static void cpu_winograd_output(float *out, const float *M, ConvGeometry g) {
    wg_output_tiles(out, (float *)M, g, false);
}

static void cpu_winograd_output_backward(float *dM, const float *dout, ConvGeometry g) {
    wg_output_tiles((float *)dout, dM, g, true);
}

// G x (3 values -> 4) and its adjoint G^T y (4 -> 3), s apart; one lane, for the weights.
static inline void wg_g(float *y, const float *x, int s) {
    const float x0 = x[0], x1 = x[s], x2 = x[2 * s];
    y[0] = x0, y[s] = (x0 + x1 + x2) * 0.5f, y[2 * s] = (x0 - x1 + x2) * 0.5f, y[3 * s] = x2;
}
static inline void wg_gt(float *x, const float *y, int s) {
    const float y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
    x[0] = y0 + (y1 + y2) * 0.5f, x[s] = (y1 - y2) * 0.5f, x[2 * s] = (y1 + y2) * 0.5f + y3;
}

static void cpu_winograd_weights(float *U, const float *w, int OC, int C) {
    const int64_t pairs = (int64_t)OC * C;
#pragma omp parallel for schedule(static) if (pairs * 16 > PAR_MIN)
    for (int64_t i = 0; i < pairs; i++) {
        float u[12], v[16];  // u[4][3] = G w, v[4][4] = u G^T
        for (int b = 0; b < 3; b++) wg_g(u + b, w + i * 9 + b, 3);
        for (int a = 0; a < 4; a++) wg_g(v + a * 4, u + a * 3, 1);
        for (int p = 0; p < 16; p++) U[p * pairs + i] = v[p];
    }
}

static void cpu_winograd_weights_backward(float *dw, const float *dU, int OC, int C) {
    const int64_t pairs = (int64_t)OC * C;
#pragma omp parallel for schedule(static) if (pairs * 16 > PAR_MIN)
    for (int64_t i = 0; i < pairs; i++) {
        float v[16], u[12], x[9];
        for (int p = 0; p < 16; p++) v[p] = dU[p * pairs + i];
        for (int b = 0; b < 4; b++) wg_gt(u + b, v + b, 4);  // u[3][4] = G^T v
        for (int a = 0; a < 3; a++) wg_gt(x + a * 3, u + a * 4, 1);
        for (int p = 0; p < 9; p++) dw[i * 9 + p] += x[p];
    }
}

// One product per thread at a time: each sums over its own K in order, so the bits do not
// depend on the thread count.
static void cpu_gemm_batched(float *C, const float *A, const float *B, int count, int M, int N,
                             int K, bool transA, bool transB, float alpha, float beta,
                             int64_t stride_c, int64_t stride_a, int64_t stride_b) {
    const int lda = transA ? M : K, ldb = transB ? K : N;
    const bool bf16 = bf16_product(N, K);
#pragma omp parallel for schedule(dynamic, 1) if (count > 1 && (int64_t)M * N * K * count > PAR_MIN)
    for (int i = 0; i < count; i++) {
        const GemmView a = stored(A + i * stride_a, lda, transA), b = stored(B + i * stride_b, ldb, transB);
        const GemmView c = stored(C + i * stride_c, N, false);
        sgemm(M, N, K, alpha, &a, &b, beta, &c, bf16);
    }
}

// ---- direct convolution ------------------------------------------------------------------------

// An output pixel (n, oh, ow) of a ConvGeometry, stepped in row-major order.
typedef struct Pixel {
    int64_t n;
    int oh, ow;
} Pixel;

static inline Pixel pixel_at(int64_t r, ConvGeometry g) {
    return (Pixel){r / ((int64_t)g.OW * g.OH), (int)(r / g.OW % g.OH), (int)(r % g.OW)};
}

static inline void pixel_next(Pixel *p, ConvGeometry g) {
    if (++p->ow < g.OW) return;
    p->ow = 0;
    if (++p->oh < g.OH) return;
    p->oh = 0, p->n++;
}

// Where the patch of an output pixel lies: base[off[t]] is its element t, in PyTorch's
// weight order (c, kh, kw). Inside the image base points into the input and off holds
// the taps' offsets there; at the border the patch is copied, zeros outside the image,
// and off counts 0, 1, ...
typedef struct Patch {
    const float *base;
    const int *off;
} Patch;

typedef struct PatchOffsets {
    int image[CONV_DIRECT_MAX_TAPS], copy[CONV_DIRECT_MAX_TAPS];
} PatchOffsets;

static void patch_offsets(PatchOffsets *po, ConvGeometry g) {
    for (int c = 0, t = 0; c < g.C; c++)
        for (int kh = 0; kh < g.K; kh++)
            for (int kw = 0; kw < g.K; kw++, t++)
                po->image[t] = (kh * g.W + kw) * g.C + c, po->copy[t] = t;
}

static inline Patch patch_of(Pixel p, const float *in, ConvGeometry g, const PatchOffsets *po,
                             float *copy) {
    const int ih0 = p.oh * g.stride - g.pad, iw0 = p.ow * g.stride - g.pad;
    const float *img = in + p.n * g.H * g.W * g.C;
    if (ih0 >= 0 && ih0 + g.K <= g.H && iw0 >= 0 && iw0 + g.K <= g.W)
        return (Patch){img + ((int64_t)ih0 * g.W + iw0) * g.C, po->image};
    for (int c = 0, t = 0; c < g.C; c++)
        for (int kh = 0; kh < g.K; kh++)
            for (int kw = 0; kw < g.K; kw++, t++) {
                const int ih = ih0 + kh, iw = iw0 + kw;
                copy[t] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W
                              ? img[((int64_t)ih * g.W + iw) * g.C + c]
                              : 0.0f;
            }
    return (Patch){copy, po->copy};
}

#ifdef __AVX2__
// The direct kernels' vector blocks: AVX2's 8 channels at a time, and where the CPU has
// AVX-512 (cpu_wide) 16 at a time in Vec16, GCC's generic vectors: the functions that
// inline them (direct_*_wide, compiled for AVX-512) hold one in a register. Every lane sums
// its channel's products in the same order, a product and an add apiece, so the two widths
// and the scalar remainder give the same bits, and so does the GPU.
typedef float Vec16 __attribute__((vector_size(64)));
typedef int Vec16i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) Vec16 vec16_load(const float *p) {
    Vec16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void vec16_store(float *p, Vec16 v) { memcpy(p, &v, sizeof v); }

// act_apply: max(v, 0), 0 for NaN as its scalar rule, then min(., 6) for ReLU6. (A scalar
// operand stands for all lanes; a vector built from a variable's 16 copies costs 16 loads.)
static inline __attribute__((always_inline)) Vec16 vec16_act(Activation act, Vec16 v) {
    if (act == ACT_NONE) return v;
    v = (Vec16)((Vec16i)v & (v > 0.0f));
    if (act != ACT_RELU6) return v;
    const Vec16i below = v < 6.0f;
    return (Vec16)(((Vec16i)v & below) | ((Vec16i)((Vec16){0} + 6.0f) & ~below));
}

// dy where act_passes(y): NaN > 0 and NaN < 6 are false, 0 as the scalar rule.
static inline __attribute__((always_inline)) Vec16 vec16_pass(Activation act, Vec16 dy, const float *y) {
    if (act == ACT_NONE) return dy;
    const Vec16 yv = vec16_load(y);
    Vec16i pass = yv > 0.0f;
    if (act == ACT_RELU6) pass &= yv < 6.0f;
    return (Vec16)((Vec16i)dy & pass);
}

// o[i] (16 * NV channels) = act(bias + sum over t of patch_i[t] * wt[t, :]) for P output
// pixels at once (P * NV accumulators in registers; the sum of each runs over t in order).
static inline __attribute__((always_inline)) void direct_forward_block16(
    float *const *o, const Patch *pt, const float *wt, const float *bias, int taps, int OC,
    const int P, const int NV, Activation act) {
    Vec16 a[4][2];
    for (int i = 0; i < P; i++)
        for (int j = 0; j < NV; j++) a[i][j] = bias ? vec16_load(bias + 16 * j) : (Vec16){0};
    for (int t = 0; t < taps; t++) {
        Vec16 wv[2];
        for (int j = 0; j < NV; j++) wv[j] = vec16_load(wt + (int64_t)t * OC + 16 * j);
        for (int i = 0; i < P; i++) {
            const float x = pt[i].base[pt[i].off[t]];
            for (int j = 0; j < NV; j++) a[i][j] = a[i][j] + x * wv[j];
        }
    }
    for (int i = 0; i < P; i++)
        for (int j = 0; j < NV; j++) vec16_store(o[i] + 16 * j, vec16_act(act, a[i][j]));
}

// acc (taps, OC) += dy x patch and bacc (OC) += dy over channels [oc0, oc0 + 16 * NV) for P
// output pixels, pixel by pixel in order (direct_backward_pixels).
static inline __attribute__((always_inline)) void direct_backward_block16(
    float *acc, float *bacc, const Patch *pt, const float *const *d, const float *const *y, int taps,
    int OC, int oc0, const int P, const int NV, Activation act) {
    Vec16 dy[4][2];
    for (int i = 0; i < P; i++)
        for (int j = 0; j < NV; j++)
            dy[i][j] = vec16_pass(act, vec16_load(d[i] + oc0 + 16 * j), y[i] ? y[i] + oc0 + 16 * j : NULL);
    for (int j = 0; j < NV; j++) {
        Vec16 b = vec16_load(bacc + oc0 + 16 * j);
        for (int i = 0; i < P; i++) b = b + dy[i][j];
        vec16_store(bacc + oc0 + 16 * j, b);
    }
    for (int t = 0; t < taps; t++) {
        float *at = acc + (int64_t)t * OC + oc0;
        Vec16 a[2];
        for (int j = 0; j < NV; j++) a[j] = vec16_load(at + 16 * j);
        for (int i = 0; i < P; i++) {
            const float x = pt[i].base[pt[i].off[t]];
            for (int j = 0; j < NV; j++) a[j] = a[j] + x * dy[i][j];
        }
        for (int j = 0; j < NV; j++) vec16_store(at + 16 * j, a[j]);
    }
}

// The same over 8 * NV channels in AVX2's registers.
static inline __attribute__((always_inline)) void direct_forward_block(
    float *const *o, const Patch *pt, const float *wt, const float *bias, int taps, int OC,
    const int P, const int NV, Activation act) {
    __m256 a[4][4];
    for (int i = 0; i < P; i++)
        for (int j = 0; j < NV; j++) a[i][j] = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();
    for (int t = 0; t < taps; t++) {
        __m256 wv[4];
        for (int j = 0; j < NV; j++) wv[j] = _mm256_loadu_ps(wt + (int64_t)t * OC + 8 * j);
        for (int i = 0; i < P; i++) {
            const __m256 x = _mm256_broadcast_ss(pt[i].base + pt[i].off[t]);
            for (int j = 0; j < NV; j++) a[i][j] = _mm256_add_ps(a[i][j], _mm256_mul_ps(x, wv[j]));
        }
    }
    // act_apply: max(a, 0) gives 0 for NaN, as its scalar rule does; then min(., 6) for ReLU6
    for (int i = 0; i < P; i++)
        for (int j = 0; j < NV; j++) {
            __m256 v = a[i][j];
            if (act != ACT_NONE) v = _mm256_max_ps(v, _mm256_setzero_ps());
            if (act == ACT_RELU6) v = _mm256_min_ps(v, _mm256_set1_ps(6.0f));
            _mm256_storeu_ps(o[i] + 8 * j, v);
        }
}
#endif

// P (1, 2 or 4) output pixels, all OC channels: in blocks of 32 and 16 channels where wide,
// then of 32 and 8 (AVX2), then one at a time.
static inline __attribute__((always_inline)) void direct_forward_pixels(
    float *const *o, const Patch *pt, const float *wt, const float *bias, int taps, int OC,
    const int P, Activation act, const bool wide) {
    int oc0 = 0;
#ifdef __AVX2__
    float *oo[4];
#define DIRECT_FORWARD_BLOCKS(BLOCK, CHANNELS, NV)                                                  \
    for (; oc0 + (CHANNELS) <= OC; oc0 += (CHANNELS)) {                                             \
        for (int i = 0; i < P; i++) oo[i] = o[i] + oc0;                                             \
        BLOCK(oo, pt, wt + oc0, bias ? bias + oc0 : NULL, taps, OC, P, NV, act);                    \
    }
    if (wide) {
        DIRECT_FORWARD_BLOCKS(direct_forward_block16, 32, 2)
        DIRECT_FORWARD_BLOCKS(direct_forward_block16, 16, 1)
    }
    DIRECT_FORWARD_BLOCKS(direct_forward_block, 32, 4)
    DIRECT_FORWARD_BLOCKS(direct_forward_block, 8, 1)
#endif
#undef DIRECT_FORWARD_BLOCKS
    for (; oc0 < OC; oc0++)
        for (int i = 0; i < P; i++) {
            float a = bias ? bias[oc0] : 0.0f;
            for (int t = 0; t < taps; t++) a += pt[i].base[pt[i].off[t]] * wt[t * OC + oc0];
            o[i][oc0] = act_apply(act, a);
        }
}

// One row of output pixels, P at a time (wide: 4, in AVX-512's blocks; else 2), the rest
// one at a time.
static inline __attribute__((always_inline)) void direct_forward_row(
    float *out, const float *in, const float *wt, const float *bias, ConvGeometry g,
    const PatchOffsets *po, int64_t row, Activation act, const int P, const bool wide) {
    const int taps = g.C * g.K * g.K, OC = g.OC;
    float copy[4][CONV_DIRECT_MAX_TAPS];
    Patch pt[4];
    float *oo[4];
    float *o = out + row * g.OW * OC;
    const Pixel first = {row / g.OH, (int)(row % g.OH), 0};
    int ow = 0;
    for (; ow + P <= g.OW; ow += P) {
        for (int i = 0; i < P; i++) {
            const Pixel p = {first.n, first.oh, ow + i};
            pt[i] = patch_of(p, in, g, po, copy[i]), oo[i] = o + (int64_t)p.ow * OC;
        }
        direct_forward_pixels(oo, pt, wt, bias, taps, OC, P, act, wide);
    }
    for (; ow < g.OW; ow++) {
        const Pixel p = {first.n, first.oh, ow};
        pt[0] = patch_of(p, in, g, po, copy[0]), oo[0] = o + (int64_t)ow * OC;
        direct_forward_pixels(oo, pt, wt, bias, taps, OC, 1, act, wide);
    }
}

typedef void DirectForwardRow(float *out, const float *in, const float *wt, const float *bias,
                              ConvGeometry g, const PatchOffsets *po, int64_t row, Activation act);

static void direct_forward_row_narrow(float *out, const float *in, const float *wt, const float *bias,
                                      ConvGeometry g, const PatchOffsets *po, int64_t row, Activation act) {
    direct_forward_row(out, in, wt, bias, g, po, row, act, 2, false);
}

#ifdef __AVX2__
__attribute__((target("avx512f"))) static void direct_forward_row_wide(
    float *out, const float *in, const float *wt, const float *bias, ConvGeometry g,
    const PatchOffsets *po, int64_t row, Activation act) {
    direct_forward_row(out, in, wt, bias, g, po, row, act, 4, true);
}
#else
#define direct_forward_row_wide direct_forward_row_narrow
#endif

// Output pixels a few at a time: their patches (9 floats each for conv1 of the seed network)
// times the weight transposed to (taps, OC), channels in vector registers. Against im2col
// and a GEMM over K = 9 this writes no columns and reads the input once (bench/PROFILE.md).
static void cpu_conv_direct_forward(float *out, const float *in, const float *w, const float *bias,
                                    ConvGeometry g, Activation act) {
    const int taps = g.C * g.K * g.K, OC = g.OC;
    assert(taps <= CONV_DIRECT_MAX_TAPS && OC <= CONV_DIRECT_MAX_FILTERS);
    float wt[CONV_DIRECT_MAX_TAPS * CONV_DIRECT_MAX_FILTERS];
    for (int oc = 0; oc < OC; oc++)
        for (int t = 0; t < taps; t++) wt[t * OC + oc] = w[oc * taps + t];
    PatchOffsets po;
    patch_offsets(&po, g);
    DirectForwardRow *const row_of = cpu_wide() ? direct_forward_row_wide : direct_forward_row_narrow;
    const int64_t rows = (int64_t)g.N * g.OH;  // of output pixels
#pragma omp parallel for schedule(static) if (rows * g.OW * taps * OC > PAR_MIN)
    for (int64_t row = 0; row < rows; row++) row_of(out, in, wt, bias, g, &po, row, act);
}

// acc (taps, OC) += dy x patch and bacc (OC) += dy for P output pixels, pixel by pixel
// in order (so the sums are those of one pixel at a time): each accumulator is loaded and
// stored once for the P pixels. Where wide, blocks of 32 and 16 channels first.
static inline __attribute__((always_inline)) void direct_backward_pixels(
    float *acc, float *bacc, const Patch *pt, const float *const *d, const float *const *y,
    int taps, int OC, const int P, Activation act, const bool wide) {
    int oc0 = 0;
#ifdef __AVX2__
    if (wide) {
        for (; oc0 + 32 <= OC; oc0 += 32) direct_backward_block16(acc, bacc, pt, d, y, taps, OC, oc0, P, 2, act);
        for (; oc0 + 16 <= OC; oc0 += 16) direct_backward_block16(acc, bacc, pt, d, y, taps, OC, oc0, P, 1, act);
    }
    for (; oc0 + 8 <= OC; oc0 += 8) {
        __m256 dy[4];
        for (int i = 0; i < P; i++) {
            dy[i] = _mm256_loadu_ps(d[i] + oc0);
            if (act != ACT_NONE) {  // act_passes: NaN > 0 and NaN < 6 are false: 0, as the scalar rule
                const __m256 yv = _mm256_loadu_ps(y[i] + oc0);
                __m256 pass = _mm256_cmp_ps(yv, _mm256_setzero_ps(), _CMP_GT_OQ);
                if (act == ACT_RELU6) pass = _mm256_and_ps(pass, _mm256_cmp_ps(yv, _mm256_set1_ps(6.0f), _CMP_LT_OQ));
                dy[i] = _mm256_and_ps(pass, dy[i]);
            }
        }
        __m256 b = _mm256_loadu_ps(bacc + oc0);
        for (int i = 0; i < P; i++) b = _mm256_add_ps(b, dy[i]);
        _mm256_storeu_ps(bacc + oc0, b);
        for (int t = 0; t < taps; t++) {
            float *at = acc + (int64_t)t * OC + oc0;
            __m256 a = _mm256_loadu_ps(at);
            for (int i = 0; i < P; i++)
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_broadcast_ss(pt[i].base + pt[i].off[t]), dy[i]));
            _mm256_storeu_ps(at, a);
        }
    }
#endif
    for (; oc0 < OC; oc0++)
        for (int i = 0; i < P; i++) {
            const float dy = act == ACT_NONE || act_passes(act, y[i][oc0]) ? d[i][oc0] : 0.0f;  // y NULL: none
            bacc[oc0] += dy;
            for (int t = 0; t < taps; t++) acc[t * OC + oc0] += pt[i].base[pt[i].off[t]] * dy;
        }
}

// One block's sums (acc, bacc zeroed) over output pixels [r0, r1), four at a time.
static inline __attribute__((always_inline)) void direct_backward_part(
    float *acc, float *bacc, const float *dout, const float *in, const float *out, ConvGeometry g,
    const PatchOffsets *po, int64_t r0, int64_t r1, Activation act, const bool wide) {
    const int taps = g.C * g.K * g.K, OC = g.OC;
    Pixel p = pixel_at(r0, g);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        float copy[4][CONV_DIRECT_MAX_TAPS];
        Patch pt[4];
        const float *d[4], *y[4];
        for (int i = 0; i < 4; i++, pixel_next(&p, g)) {
            pt[i] = patch_of(p, in, g, po, copy[i]);
            d[i] = dout + (r + i) * OC, y[i] = out ? out + (r + i) * OC : NULL;  // NULL: no ReLU
        }
        direct_backward_pixels(acc, bacc, pt, d, y, taps, OC, 4, act, wide);
    }
    for (; r < r1; r++, pixel_next(&p, g)) {
        float copy[CONV_DIRECT_MAX_TAPS];
        const Patch pt[1] = {patch_of(p, in, g, po, copy)};
        const float *d[1] = {dout + r * OC}, *y[1] = {out ? out + r * OC : NULL};
        direct_backward_pixels(acc, bacc, pt, d, y, taps, OC, 1, act, wide);
    }
}

typedef void DirectBackwardPart(float *acc, float *bacc, const float *dout, const float *in,
                                const float *out, ConvGeometry g, const PatchOffsets *po, int64_t r0,
                                int64_t r1, Activation act);

static void direct_backward_part_narrow(float *acc, float *bacc, const float *dout, const float *in,
                                        const float *out, ConvGeometry g, const PatchOffsets *po,
                                        int64_t r0, int64_t r1, Activation act) {
    direct_backward_part(acc, bacc, dout, in, out, g, po, r0, r1, act, false);
}

#ifdef __AVX2__
__attribute__((target("avx512f"))) static void direct_backward_part_wide(
    float *acc, float *bacc, const float *dout, const float *in, const float *out, ConvGeometry g,
    const PatchOffsets *po, int64_t r0, int64_t r1, Activation act) {
    direct_backward_part(acc, bacc, dout, in, out, g, po, r0, r1, act, true);
}
#else
#define direct_backward_part_wide direct_backward_part_narrow
#endif

// The parameter gradients over conv_direct_parts blocks of output pixels, four pixels
// at a time within a block; the input gradient (rare: the direct kernels serve first
// layers) one input element at a time.
static void cpu_conv_direct_backward(float *din, float *dw, float *dbias, float *partial,
                                     const float *dout, const float *in, const float *out,
                                     const float *w, ConvGeometry g, Activation act) {
    const int taps = g.C * g.K * g.K, OC = g.OC;
    assert(taps <= CONV_DIRECT_MAX_TAPS && OC <= CONV_DIRECT_MAX_FILTERS);
    const int64_t rows = (int64_t)g.N * g.OH * g.OW, parts = conv_direct_parts(g), per = (rows + parts - 1) / parts;
    const int64_t part_floats = (int64_t)(taps + 1) * OC;  // (taps, OC) weight, then (OC) bias
    PatchOffsets po;
    patch_offsets(&po, g);
    DirectBackwardPart *const part_of = cpu_wide() ? direct_backward_part_wide : direct_backward_part_narrow;
#pragma omp parallel for schedule(static) if (dw && rows * taps * OC > PAR_MIN)
    for (int64_t b = 0; b < (dw ? parts : 0); b++) {
        float *acc = partial + b * part_floats, *bacc = acc + (int64_t)taps * OC;
        memset(acc, 0, (size_t)part_floats * sizeof(float));
        const int64_t r0 = b * per < rows ? b * per : rows, r1 = r0 + per < rows ? r0 + per : rows;
        part_of(acc, bacc, dout, in, out, g, &po, r0, r1, act);
    }
    // The blocks' sums added in block order, then into (OC, taps) and (OC).
    float sum[(CONV_DIRECT_MAX_TAPS + 1) * CONV_DIRECT_MAX_FILTERS] = {0};
    for (int64_t b = 0; b < parts && dw; b++)
        for (int64_t i = 0; i < part_floats; i++) sum[i] += partial[b * part_floats + i];
    for (int oc = 0; oc < OC && dw; oc++) {
        for (int t = 0; t < taps; t++) dw[oc * taps + t] += sum[t * OC + oc];
        if (dbias) dbias[oc] += sum[taps * OC + oc];
    }
    if (!din) return;
    // Each input element sums what its windows send back, over (kh, kw) then oc.
    const int64_t total = (int64_t)g.N * g.H * g.W * g.C;
#pragma omp parallel for schedule(static) if (total * g.K * g.K * OC > PAR_MIN)
    for (int64_t i = 0; i < total; i++) {
        const int c = (int)(i % g.C);
        const int64_t q = i / g.C;
        const int iw = (int)(q % g.W), ih = (int)(q / g.W % g.H);
        const int64_t n = q / ((int64_t)g.W * g.H);
        float acc = 0.0f;
        for (int kh = 0; kh < g.K; kh++) {
            const int y = ih + g.pad - kh, oh = y / g.stride;
            if (y < 0 || y % g.stride || oh >= g.OH) continue;
            for (int kw = 0; kw < g.K; kw++) {
                const int x = iw + g.pad - kw, ow = x / g.stride;
                if (x < 0 || x % g.stride || ow >= g.OW) continue;
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * OC;
                for (int oc = 0; oc < OC; oc++) {
                    const float d = act == ACT_NONE || act_passes(act, out[o + oc]) ? dout[o + oc] : 0.0f;
                    acc += d * w[((oc * g.C + c) * g.K + kh) * g.K + kw];
                }
            }
        }
        din[i] = acc;
    }
}

// ---- grouped and depthwise convolution -------------------------------------------------------
//
// Depthwise with one output channel per input channel (MobileNetV2's: groups = C = OC, 3x3)
// runs channel-last kernels vectorised over channels, the weight of a block of channels
// transposed to (K * K, channels) on the stack; everything else (channel multipliers,
// groups of several channels, kernels over 7x7) plain loops over the same sums. A 3x3
// depthwise convolution does 9 products for each value it reads or writes: memory-bound,
// so a GEMM per channel (9 x 9 x pixels) would only add im2col's traffic.

#define DW_MAX_K 7             // the depthwise kernels' largest window
#define DW_BLOCK_FLOATS 16384  // their transposed weight (or gradient) block: 64 KB
#define DW_ROW_SUMS_CHANNELS 224  // dw_weight_row3's channels: its 9 sums of each, 8 KB, in L1

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

static bool dw_fast(ConvGeometry g, int groups) {
    return groups == g.C && g.OC == g.C && g.K <= DW_MAX_K;
}

// Channels a block of the transposed weight holds: all of them where they fit.
static int dw_block(ConvGeometry g) {
    const int most = DW_BLOCK_FLOATS / (g.K * g.K) / 8 * 8;
    return g.C < most ? g.C : most;
}

// wt (K * K, nb) = w (C, 1, K, K)'s channels [c0, c0 + nb), transposed.
static void dw_transpose(float *wt, const float *w, int c0, int nb, int KK) {
    for (int c = 0; c < nb; c++)
        for (int t = 0; t < KK; t++) wt[t * nb + c] = w[(int64_t)(c0 + c) * KK + t];
}

// Taps (kh or kw) of output position o inside [0, H): [*a, *b).
static inline void dw_taps(int o, int stride, int pad, int K, int H, int *a, int *b) {
    const int i0 = o * stride - pad;
    *a = imax(0, -i0), *b = imin(K, H - i0);
}

// What the next row of a depthwise loop reads that this row did not (its new input rows,
// its output gradient's row), fetched into the caches a slice at a time while this row
// computes: the loops read a row's pixels 8 or 32 channels at a time, C floats apart,
// which the hardware prefetchers follow badly (576 channels 14x14 out of the caches: the
// weight gradient 1.9x faster with it; 32 channels 112x112 1.4x, bench/RESULTS.md). A
// hint: no bit changes.
typedef struct DwAhead {
    const char *p[2];
    int64_t bytes[2], step[2];  // region i: bytes[i] at p[i], step[i] of them a slice
} DwAhead;

// Region i of a: rows [r0, r1) of `row` floats of the tensor t of `rows` rows, clipped, in
// `parts` slices.
static void dw_ahead_rows(DwAhead *a, int i, const float *t, int64_t rows, int64_t row, int64_t r0, int64_t r1,
                          int64_t parts) {
    r0 = r0 < 0 ? 0 : r0, r1 = r1 > rows ? rows : r1;
    a->p[i] = (const char *)(t + (r0 < rows ? r0 : 0) * row);
    a->bytes[i] = r1 > r0 ? (r1 - r0) * row * (int64_t)sizeof(float) : 0;
    a->step[i] = (a->bytes[i] + 64 * parts - 1) / (64 * parts) * 64;
}

// Slice `part` of a's regions.
static inline void dw_ahead(const DwAhead *a, int64_t part) {
    for (int i = 0; i < 2; i++) {
        const int64_t lo = part * a->step[i], hi = lo + a->step[i] < a->bytes[i] ? lo + a->step[i] : a->bytes[i];
        for (int64_t o = lo; o < hi; o += 64) __builtin_prefetch(a->p[i] + o);
    }
}

// The input rows that output row r + 1 (of N * OH) reads and row r did not, in region i.
static void dw_ahead_input(DwAhead *a, int i, const float *in, ConvGeometry g, int64_t r, int64_t parts) {
    const int64_t n = (r + 1) / g.OH, ih0 = (int64_t)((r + 1) % g.OH) * g.stride - g.pad;
    const int64_t lo = ih0 + g.K - g.stride < 0 ? 0 : ih0 + g.K - g.stride, hi = ih0 + g.K < g.H ? ih0 + g.K : g.H;
    dw_ahead_rows(a, i, in, (int64_t)g.N * g.H, (int64_t)g.W * g.C, n * g.H + lo, n * g.H + (hi > lo ? hi : lo),
                  parts);
}

#ifdef __AVX2__
// act_apply on 8 values: max(v, 0) gives 0 for NaN, as its scalar rule does; then
// min(., 6) for ReLU6.
static inline __m256 dw_act(__m256 v, Activation act) {
    if (act == ACT_NONE) return v;
    v = _mm256_max_ps(v, _mm256_setzero_ps());
    return act == ACT_RELU6 ? _mm256_min_ps(v, _mm256_set1_ps(6.0f)) : v;
}
#endif

// One output pixel's nb channels: o = act(bias + the sum over its nh x nw taps inside
// the image, in order, of x[(i * W + j) * C] * wt[(i * K + j) * nb]); x and wt point at
// the first tap inside, `row` = W * C floats.
static inline __attribute__((always_inline)) void dw_forward_pixel(
    float *o, const float *x, const float *wt, const float *bias, int nb, int C, int64_t row, int K,
    int nh, int nw, Activation act) {
    int c = 0;
#ifdef __AVX2__
    for (; c + 32 <= nb; c += 32) {
        __m256 a[4];
        for (int j = 0; j < 4; j++) a[j] = bias ? _mm256_loadu_ps(bias + c + 8 * j) : _mm256_setzero_ps();
        for (int kh = 0; kh < nh; kh++)
            for (int kw = 0; kw < nw; kw++) {
                const float *xp = x + kh * row + (int64_t)kw * C + c, *wp = wt + (kh * K + kw) * nb + c;
                for (int j = 0; j < 4; j++)
                    a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(_mm256_loadu_ps(xp + 8 * j), _mm256_loadu_ps(wp + 8 * j)));
            }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(o + c + 8 * j, dw_act(a[j], act));
    }
    for (; c + 8 <= nb; c += 8) {
        __m256 a = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
        for (int kh = 0; kh < nh; kh++)
            for (int kw = 0; kw < nw; kw++)
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(x + kh * row + (int64_t)kw * C + c),
                                                   _mm256_loadu_ps(wt + (kh * K + kw) * nb + c)));
        _mm256_storeu_ps(o + c, dw_act(a, act));
    }
#endif
    for (; c < nb; c++) {
        float a = bias ? bias[c] : 0.0f;
        for (int kh = 0; kh < nh; kh++)
            for (int kw = 0; kw < nw; kw++) a += x[kh * row + (int64_t)kw * C + c] * wt[(kh * K + kw) * nb + c];
        o[c] = act_apply(act, a);
    }
}

static void dw_forward(float *out, const float *in, const float *w, const float *bias, ConvGeometry g,
                       Activation act) {
    const int C = g.C, K = g.K, KK = K * K, nbm = dw_block(g);
    const int64_t rows = (int64_t)g.N * g.OH, row = (int64_t)g.W * C;
    float wt[DW_BLOCK_FLOATS];
    for (int c0 = 0; c0 < C; c0 += nbm) {
        const int nb = imin(nbm, C - c0);
        dw_transpose(wt, w, c0, nb, KK);
#pragma omp parallel for schedule(static) if (rows * g.OW * nb * KK > PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t n = r / g.OH;
            const int oh = (int)(r % g.OH), ih0 = oh * g.stride - g.pad;
            int kh0, kh1;
            dw_taps(oh, g.stride, g.pad, K, g.H, &kh0, &kh1);
            const float *img = in + n * g.H * row + c0;
            DwAhead ahead = {.bytes = {0, 0}};
            dw_ahead_input(&ahead, 0, in, g, r, g.OW);
            for (int ow = 0; ow < g.OW; ow++) {
                dw_ahead(&ahead, ow);
                const int iw0 = ow * g.stride - g.pad;
                int kw0, kw1;
                dw_taps(ow, g.stride, g.pad, K, g.W, &kw0, &kw1);
                const float *x = img + (int64_t)(ih0 + kh0) * row + (int64_t)(iw0 + kw0) * C;
                dw_forward_pixel(out + (r * g.OW + ow) * C + c0, x, wt + (kh0 * K + kw0) * nb,
                                 bias ? bias + c0 : NULL, nb, C, row, K, kh1 - kh0, kw1 - kw0, act);
            }
        }
    }
}

// The outputs (oh, kh pairs) whose window reaches input position i: *n of them, kh ascending.
static inline int dw_reach(int i, int stride, int pad, int K, int O, int *k, int *o) {
    int n = 0;
    for (int kh = 0; kh < K; kh++) {
        const int y = i + pad - kh;
        if (y < 0 || y % stride || y / stride >= O) continue;
        k[n] = kh, o[n++] = y / stride;
    }
    return n;
}

// Taps (kh or kw) of input position i at stride 1 whose output i + pad - k lies inside
// [0, O): [*a, *b).
static inline void dw_taps_back(int i, int pad, int K, int O, int *a, int *b) {
    *a = imax(0, i + pad - O + 1), *b = imin(K, i + pad + 1);
}

// din = the sum over (kh, kw) of dy * w, one input pixel's nb channels at a time. At
// stride 1 the forward's pixel loop with dy's steps negated: tap (kh, kw) reads dy's pixel
// (ih + pad - kh, iw + pad - kw), so kh and kw ascend as elsewhere (the same sums in the
// same order). Otherwise dy's pixel (oh, ow) of tap (kh, kw) at dy + ohs[i] * orow + ows[j] * C.
static void dw_backward_data(float *din, const float *dy, const float *w, ConvGeometry g) {
    const int C = g.C, K = g.K, KK = K * K, nbm = dw_block(g);
    const int64_t rows = (int64_t)g.N * g.H, orow = (int64_t)g.OW * C;
    float wt[DW_BLOCK_FLOATS];
    for (int c0 = 0; c0 < C; c0 += nbm) {
        const int nb = imin(nbm, C - c0);
        dw_transpose(wt, w, c0, nb, KK);
        if (g.stride == 1) {
#pragma omp parallel for schedule(static) if (rows * g.W * nb * KK > PAR_MIN)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t n = r / g.H;
                const int ih = (int)(r % g.H);
                int kh0, kh1;
                dw_taps_back(ih, g.pad, K, g.OH, &kh0, &kh1);
                const float *img = dy + n * g.OH * orow + c0;
                DwAhead ahead = {.bytes = {0, 0}};  // the dy row that input row ih + 1 reads first
                dw_ahead_rows(&ahead, 0, dy, (int64_t)g.N * g.OH, orow, n * g.OH + ih + 1 + g.pad,
                              n * g.OH + ih + 2 + g.pad, g.W);
                for (int iw = 0; iw < g.W; iw++) {
                    dw_ahead(&ahead, iw);
                    int kw0, kw1;
                    dw_taps_back(iw, g.pad, K, g.OW, &kw0, &kw1);
                    if (kh1 <= kh0 || kw1 <= kw0) {  // no output reaches it
                        memset(din + (r * g.W + iw) * C + c0, 0, (size_t)nb * sizeof(float));
                        continue;
                    }
                    const float *d = img + (int64_t)(ih + g.pad - kh0) * orow + (int64_t)(iw + g.pad - kw0) * C;
                    dw_forward_pixel(din + (r * g.W + iw) * C + c0, d, wt + (kh0 * K + kw0) * nb, NULL, nb, -C,
                                     -orow, K, kh1 - kh0, kw1 - kw0, ACT_NONE);
                }
            }
            continue;
        }
#pragma omp parallel for schedule(static) if (rows * g.W * nb * KK > PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t n = r / g.H;
            const int ih = (int)(r % g.H);
            int khs[DW_MAX_K], ohs[DW_MAX_K], kws[DW_MAX_K], ows[DW_MAX_K];
            const int nh = dw_reach(ih, g.stride, g.pad, K, g.OH, khs, ohs);
            const float *d = dy + n * g.OH * orow + c0;
            DwAhead ahead = {.bytes = {0, 0}};  // the last dy row that input row ih + 1 reaches
            const int64_t oh_next = (ih + 1 + g.pad) / g.stride;
            dw_ahead_rows(&ahead, 0, dy, (int64_t)g.N * g.OH, orow, n * g.OH + oh_next, n * g.OH + oh_next + 1, g.W);
            for (int iw = 0; iw < g.W; iw++) {
                dw_ahead(&ahead, iw);
                const int nw = dw_reach(iw, g.stride, g.pad, K, g.OW, kws, ows);
                float *o = din + (r * g.W + iw) * C + c0;
                int c = 0;
#ifdef __AVX2__
                for (; c + 32 <= nb; c += 32) {
                    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                    for (int i = 0; i < nh; i++)
                        for (int j = 0; j < nw; j++) {
                            const float *dp = d + ohs[i] * orow + (int64_t)ows[j] * C + c;
                            const float *wp = wt + (khs[i] * K + kws[j]) * nb + c;
                            for (int v = 0; v < 4; v++)
                                a[v] = _mm256_add_ps(a[v], _mm256_mul_ps(_mm256_loadu_ps(dp + 8 * v), _mm256_loadu_ps(wp + 8 * v)));
                        }
                    for (int v = 0; v < 4; v++) _mm256_storeu_ps(o + c + 8 * v, a[v]);
                }
                for (; c + 8 <= nb; c += 8) {
                    __m256 a = _mm256_setzero_ps();
                    for (int i = 0; i < nh; i++)
                        for (int j = 0; j < nw; j++)
                            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(d + ohs[i] * orow + (int64_t)ows[j] * C + c),
                                                               _mm256_loadu_ps(wt + (khs[i] * K + kws[j]) * nb + c)));
                    _mm256_storeu_ps(o + c, a);
                }
#endif
                for (; c < nb; c++) {
                    float a = 0.0f;
                    for (int i = 0; i < nh; i++)
                        for (int j = 0; j < nw; j++)
                            a += d[ohs[i] * orow + (int64_t)ows[j] * C + c] * wt[(khs[i] * K + kws[j]) * nb + c];
                    o[c] = a;
                }
            }
        }
    }
}

// Output positions [*a, *b) whose tap k lies inside [0, H): 0 <= o * stride - pad + k < H.
static inline void dw_span(int k, int stride, int pad, int H, int O, int *a, int *b) {
    const int lo = pad - k;  // o * stride >= lo
    *a = lo <= 0 ? 0 : (lo + stride - 1) / stride;
    const int hi = H - 1 + pad - k;  // o * stride <= hi
    *b = hi < 0 ? 0 : imin(O, hi / stride + 1);
    if (*b < *a) *b = *a;
}

#ifdef __AVX2__
// One output pixel's share of a 3x3 row's sums, nv channels (a multiple of 8): r[(kh * 3 +
// kw) * nv + c] += dy[c] * the pixel's tap (kh, kw)[c], for the taps inside the image (kh
// in [kh0, kh1), kw in [kw0, kw1)); tap (kh, kw) at x + kh * row + kw * C. Constant bounds
// fold the tests away.
static inline __attribute__((always_inline)) void dw_weight_pixel3(float *r, const float *dp, const float *x,
                                                                   int64_t row, int C, int nv, int kh0,
                                                                   int kh1, int kw0, int kw1) {
    for (int c = 0; c < nv; c += 8) {
        const __m256 d = _mm256_loadu_ps(dp + c);
        for (int kh = 0; kh < 3; kh++)
            for (int kw = 0; kw < 3; kw++)
                if (kh >= kh0 && kh < kh1 && kw >= kw0 && kw < kw1) {
                    float *rp = r + (kh * 3 + kw) * nv + c;
                    _mm256_storeu_ps(rp, _mm256_add_ps(_mm256_loadu_ps(rp),
                                                       _mm256_mul_ps(d, _mm256_loadu_ps(x + kh * row + (int64_t)kw * C + c))));
                }
    }
}

// A 3x3 output row's sums at stride 1 for the block's channels in multiples of 8 (nv, at
// most DW_ROW_SUMS_CHANNELS): the 9 taps' sums over the row in r (9, nv), each over its
// pixels in ow order from 0 (as dw_backward_weight's loop sums them), then added to s (9,
// nb); returns the channels done (nv). Pixel by pixel, every channel at once, so the input
// and dy are read in the order they lie, and r stays in L1. d: the row's dy at its first
// pixel, x: the input's channel c0 of image n, ih0 = oh - pad.
static int dw_weight_row3(float *s, float *r, const float *d, const float *x, ConvGeometry g, int ih0, int kh0,
                          int kh1, int nb, const DwAhead *ahead) {
    const int C = g.C, nv = nb / 8 * 8;
    const int64_t row = (int64_t)g.W * C;
    const int i0 = imin(g.OW, g.pad), i1 = imax(i0, imin(g.OW, g.W - 2 + g.pad));  // all three kw inside
    const bool rows3 = kh0 == 0 && kh1 == 3;
    memset(r, 0, (size_t)9 * nv * sizeof(float));
    const float *x0 = x + (int64_t)ih0 * row;  // tap (0, 0) of pixel ow at x0 + (ow - pad) * C
    for (int ow = 0; ow < g.OW; ow++) {
        dw_ahead(ahead, ow);
        const float *dp = d + (int64_t)ow * C, *xp = x0 + (int64_t)(ow - g.pad) * C;
        if (ow >= i0 && ow < i1) {
            if (rows3) dw_weight_pixel3(r, dp, xp, row, C, nv, 0, 3, 0, 3);
            else dw_weight_pixel3(r, dp, xp, row, C, nv, kh0, kh1, 0, 3);
        } else {
            int kw0, kw1;
            dw_taps(ow, 1, g.pad, 3, g.W, &kw0, &kw1);
            dw_weight_pixel3(r, dp, xp, row, C, nv, kh0, kh1, kw0, kw1);
        }
    }
    for (int t = 0; t < 9; t++)
        for (int c = 0; c < nv; c += 8)
            _mm256_storeu_ps(s + t * nb + c, _mm256_add_ps(_mm256_loadu_ps(s + t * nb + c), _mm256_loadu_ps(r + t * nv + c)));
    return nv;
}

// One output pixel's share of a 3x3 row's sums, 8 channels: a[kh * 3 + kw] += dy * the
// pixel's tap (kh, kw), for the taps inside the image (kh in [kh0, kh1), kw in [kw0, kw1));
// tap (kh, kw) at x + xo + kh * row + kw * C. Constant bounds fold the tests away.
static inline __attribute__((always_inline)) void dw_weight_pixel3_regs(__m256 a[9], const float *dp, const float *x,
                                                                   int64_t xo, int64_t row, int C, int kh0,
                                                                   int kh1, int kw0, int kw1) {
    const __m256 d = _mm256_loadu_ps(dp);
    for (int kh = 0; kh < 3; kh++)
        for (int kw = 0; kw < 3; kw++)
            if (kh >= kh0 && kh < kh1 && kw >= kw0 && kw < kw1)
                a[kh * 3 + kw] = _mm256_add_ps(a[kh * 3 + kw],
                                               _mm256_mul_ps(d, _mm256_loadu_ps(x + xo + kh * row + (int64_t)kw * C)));
}

// A 3x3 output row's sums for 8 channels at a time, the 9 taps' sums in registers over
// the row, each over its pixels in ow order from 0 (as dw_backward_weight's loop sums them),
// then added to s (9, nb); returns the channels done (a multiple of 8). d: the row's dy at
// its first pixel, x: the input's channel c0 of image n, ih0 = oh * stride - pad.
static int dw_weight_row3_regs(float *s, const float *d, const float *x, ConvGeometry g, int ih0, int kh0, int kh1,
                          int nb, const DwAhead *ahead) {
    const int C = g.C, S = g.stride;
    const int64_t row = (int64_t)g.W * C;
    // Pixels with all three kw inside: [i0, i1); the others at either end.
    const int hi = g.W - 3 + g.pad;  // ow * S <= hi
    const int i0 = imin(g.OW, (g.pad + S - 1) / S), i1 = hi < 0 ? i0 : imax(i0, imin(g.OW, hi / S + 1));
    const bool rows3 = kh0 == 0 && kh1 == 3;
    int c = 0;
    for (; c + 8 <= nb; c += 8) {
        dw_ahead(ahead, c / 8);
        __m256 a[9];
        for (int t = 0; t < 9; t++) a[t] = _mm256_setzero_ps();
        const int64_t x0 = (int64_t)ih0 * row + c;  // tap (0, 0) of pixel ow at x0 + (ow * S - pad) * C
        for (int ow = 0; ow < i0; ow++) {
            int kw0, kw1;
            dw_taps(ow, S, g.pad, 3, g.W, &kw0, &kw1);
            dw_weight_pixel3_regs(a, d + (int64_t)ow * C + c, x, x0 + (int64_t)(ow * S - g.pad) * C, row, C, kh0, kh1, kw0, kw1);
        }
        if (rows3)
            for (int ow = i0; ow < i1; ow++)
                dw_weight_pixel3_regs(a, d + (int64_t)ow * C + c, x, x0 + (int64_t)(ow * S - g.pad) * C, row, C, 0, 3, 0, 3);
        else
            for (int ow = i0; ow < i1; ow++)
                dw_weight_pixel3_regs(a, d + (int64_t)ow * C + c, x, x0 + (int64_t)(ow * S - g.pad) * C, row, C, kh0, kh1, 0, 3);
        for (int ow = i1; ow < g.OW; ow++) {
            int kw0, kw1;
            dw_taps(ow, S, g.pad, 3, g.W, &kw0, &kw1);
            dw_weight_pixel3_regs(a, d + (int64_t)ow * C + c, x, x0 + (int64_t)(ow * S - g.pad) * C, row, C, kh0, kh1, kw0, kw1);
        }
        for (int t = 0; t < 9; t++) _mm256_storeu_ps(s + t * nb + c, _mm256_add_ps(_mm256_loadu_ps(s + t * nb + c), a[t]));
    }
    return c;
}

#endif

// dw += the rows' sums, a block of channels at a time: for each output row, each tap's sum
// over the row's pixels (those whose tap lies inside the image: a span of ow) from 0, added
// to the block's sums s (K * K, nb) from 0. With AVX2 and 3x3 windows: at stride 1 on up
// to DW_ROW_SUMS_CHANNELS channels pixel by pixel, the row's sums in L1 (dw_weight_row3);
// otherwise 8 channels' 9 sums at a time in registers (dw_weight_row3_regs: a row's pixels
// read 8 channels at a time, which stride 2 and wide rows prefer); without, and for the
// channels left over, a tap at a time, 32 channels in 4 vectors at once. All sum in the
// same order: the bits do not depend on the path.
static void dw_backward_weight(float *dw, const float *dy, const float *in, ConvGeometry g) {
    const int C = g.C, K = g.K, KK = K * K, nbm = dw_block(g), blocks = (C + nbm - 1) / nbm;
    const int64_t row = (int64_t)g.W * C;
    int spans[DW_MAX_K][2];
    for (int kw = 0; kw < K; kw++) dw_span(kw, g.stride, g.pad, g.W, g.OW, &spans[kw][0], &spans[kw][1]);
    // Each block's sums are its own, over every row in order: the bits do not depend on
    // the threads that share the blocks out.
#pragma omp parallel for schedule(static) if (blocks > 1 && (int64_t)g.N * g.OH * g.OW * C * KK > PAR_MIN)
    for (int b = 0; b < blocks; b++) {
        const int c0 = b * nbm, nb = imin(nbm, C - c0);
        float s[DW_BLOCK_FLOATS];
        memset(s, 0, (size_t)KK * nb * sizeof(float));
#ifdef __AVX2__
        // dw_weight_row3's path, whose prefetch slices are a row's pixels; the register
        // path's are its blocks of 8 channels
        const bool by_pixel = K == 3 && g.stride == 1 && nb <= DW_ROW_SUMS_CHANNELS;
        const int64_t parts = by_pixel ? g.OW : imax(1, nb / 8);
#endif
        for (int64_t r = 0; r < (int64_t)g.N * g.OH; r++) {
            const int64_t n = r / g.OH;
            const int oh = (int)(r % g.OH);
            int kh0, kh1;
            dw_taps(oh, g.stride, g.pad, K, g.H, &kh0, &kh1);
            const float *d = dy + r * g.OW * C + c0;
            int cv = 0;  // channels done
#ifdef __AVX2__
            DwAhead ahead;
            dw_ahead_input(&ahead, 0, in, g, r, parts);
            dw_ahead_rows(&ahead, 1, dy, (int64_t)g.N * g.OH, (int64_t)g.OW * C, r + 1, r + 2, parts);
            if (by_pixel) {
                float row_sums[9 * DW_ROW_SUMS_CHANNELS];
                cv = dw_weight_row3(s, row_sums, d, in + n * g.H * row + c0, g, oh - g.pad, kh0, kh1, nb, &ahead);
            } else if (K == 3) {
                cv = dw_weight_row3_regs(s, d, in + n * g.H * row + c0, g, oh * g.stride - g.pad, kh0, kh1, nb, &ahead);
            }
#endif
            for (int kh = 0; kh < K && cv < nb; kh++)
                for (int kw = 0; kw < K; kw++) {
                    float *st = s + (kh * K + kw) * nb;
                    const bool inside = kh >= kh0 && kh < kh1;  // this row's tap row is in the image
                    const int a = inside ? spans[kw][0] : 0, e = inside ? spans[kw][1] : 0;
                    // Output ow's tap: x + (ow - a) * xs (x = in where the span is empty).
                    const int64_t xs = (int64_t)g.stride * C;
                    const float *x = a < e ? in + (n * g.H + oh * g.stride - g.pad + kh) * row +
                                                 (int64_t)(a * g.stride - g.pad + kw) * C + c0
                                           : in;
                    int c = cv;
#ifdef __AVX2__
                    for (; c + 32 <= nb; c += 32) {
                        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                        for (int ow = a; ow < e; ow++)
                            for (int v = 0; v < 4; v++)
                                acc[v] = _mm256_add_ps(acc[v], _mm256_mul_ps(_mm256_loadu_ps(d + (int64_t)ow * C + c + 8 * v),
                                                                             _mm256_loadu_ps(x + (ow - a) * xs + c + 8 * v)));
                        for (int v = 0; v < 4; v++)
                            _mm256_storeu_ps(st + c + 8 * v, _mm256_add_ps(_mm256_loadu_ps(st + c + 8 * v), acc[v]));
                    }
                    for (; c + 8 <= nb; c += 8) {
                        __m256 acc = _mm256_setzero_ps();
                        for (int ow = a; ow < e; ow++)
                            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(d + (int64_t)ow * C + c),
                                                                   _mm256_loadu_ps(x + (ow - a) * xs + c)));
                        _mm256_storeu_ps(st + c, _mm256_add_ps(_mm256_loadu_ps(st + c), acc));
                    }
#endif
                    for (; c < nb; c++) {
                        float acc = 0.0f;
                        for (int ow = a; ow < e; ow++) acc += d[(int64_t)ow * C + c] * x[(ow - a) * xs + c];
                        st[c] += acc;
                    }
                }
        }
        for (int c = 0; c < nb; c++)
            for (int t = 0; t < KK; t++) dw[(int64_t)(c0 + c) * KK + t] += s[t * nb + c];
    }
}

// The general case, element by element: output channel oc's group and its first input
// channel.
static void grouped_forward(float *out, const float *in, const float *w, const float *bias, ConvGeometry g,
                            int groups, Activation act) {
    const int Cg = g.C / groups, Mg = g.OC / groups, K = g.K;
    const int64_t rows = (int64_t)g.N * g.OH;
#pragma omp parallel for schedule(static) if (rows * g.OW * g.OC * Cg * K * K > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / g.OH;
        const int oh = (int)(r % g.OH);
        int kh0, kh1;
        dw_taps(oh, g.stride, g.pad, K, g.H, &kh0, &kh1);
        for (int ow = 0; ow < g.OW; ow++) {
            int kw0, kw1;
            dw_taps(ow, g.stride, g.pad, K, g.W, &kw0, &kw1);
            for (int oc = 0; oc < g.OC; oc++) {
                const int cin = oc / Mg * Cg;
                float a = bias ? bias[oc] : 0.0f;
                for (int ci = 0; ci < Cg; ci++)
                    for (int kh = kh0; kh < kh1; kh++)
                        for (int kw = kw0; kw < kw1; kw++) {
                            const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
                            a += in[((n * g.H + ih) * g.W + iw) * g.C + cin + ci] *
                                 w[(((int64_t)oc * Cg + ci) * K + kh) * K + kw];
                        }
                out[(r * g.OW + ow) * g.OC + oc] = act_apply(act, a);
            }
        }
    }
}

static void grouped_backward_data(float *din, const float *dy, const float *w, ConvGeometry g, int groups) {
    const int Cg = g.C / groups, Mg = g.OC / groups, K = g.K;
    const int64_t rows = (int64_t)g.N * g.H;
#pragma omp parallel for schedule(static) if (rows * g.W * g.C * Mg * K * K > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / g.H;
        const int ih = (int)(r % g.H);
        for (int iw = 0; iw < g.W; iw++)
            for (int c = 0; c < g.C; c++) {
                const int oc0 = c / Cg * Mg, ci = c % Cg;
                float a = 0.0f;
                for (int kh = 0; kh < K; kh++) {
                    const int y = ih + g.pad - kh;
                    if (y < 0 || y % g.stride || y / g.stride >= g.OH) continue;
                    for (int kw = 0; kw < K; kw++) {
                        const int x = iw + g.pad - kw;
                        if (x < 0 || x % g.stride || x / g.stride >= g.OW) continue;
                        const int64_t o = ((n * g.OH + y / g.stride) * g.OW + x / g.stride) * g.OC;
                        for (int m = 0; m < Mg; m++)
                            a += dy[o + oc0 + m] * w[(((int64_t)(oc0 + m) * Cg + ci) * K + kh) * K + kw];
                    }
                }
                din[(r * g.W + iw) * g.C + c] = a;
            }
    }
}

// The weight gradient's elements e = (oc, ci, kh, kw) in blocks, each block's row sums
// and their sums on the stack.
static void grouped_backward_weight(float *dw, const float *dy, const float *in, ConvGeometry g, int groups) {
    enum { BLOCK = 4096 };
    const int Cg = g.C / groups, Mg = g.OC / groups, K = g.K, KK = K * K;
    const int64_t E = (int64_t)g.OC * Cg * KK, blocks = (E + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1 && (int64_t)g.N * g.OH * g.OW * E > PAR_MIN)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t e0 = b * BLOCK, ne = E - e0 < BLOCK ? E - e0 : BLOCK;
        float s[BLOCK], rs[BLOCK];
        memset(s, 0, (size_t)ne * sizeof(float));
        for (int64_t r = 0; r < (int64_t)g.N * g.OH; r++) {
            const int64_t n = r / g.OH;
            const int oh = (int)(r % g.OH);
            memset(rs, 0, (size_t)ne * sizeof(float));
            for (int ow = 0; ow < g.OW; ow++)
                for (int64_t j = 0; j < ne; j++) {
                    const int64_t e = e0 + j;
                    const int kw = (int)(e % K), kh = (int)(e / K % K), ci = (int)(e / KK % Cg);
                    const int oc = (int)(e / ((int64_t)KK * Cg));
                    const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
                    if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
                    rs[j] += dy[(r * g.OW + ow) * g.OC + oc] * in[((n * g.H + ih) * g.W + iw) * g.C + oc / Mg * Cg + ci];
                }
            for (int64_t j = 0; j < ne; j++) s[j] += rs[j];
        }
        for (int64_t j = 0; j < ne; j++) dw[e0 + j] += s[j];
    }
}

static void cpu_conv_grouped_forward(float *out, const float *in, const float *w, const float *bias,
                                     ConvGeometry g, int groups, Activation act) {
    if (dw_fast(g, groups)) dw_forward(out, in, w, bias, g, act);
    else grouped_forward(out, in, w, bias, g, groups, act);
}

static void cpu_conv_grouped_backward_data(float *din, const float *dy, const float *w, ConvGeometry g,
                                           int groups) {
    if (dw_fast(g, groups)) dw_backward_data(din, dy, w, g);
    else grouped_backward_data(din, dy, w, g, groups);
}

static void cpu_conv_grouped_backward_weight(float *dw, float *scratch, const float *dy, const float *in,
                                             ConvGeometry g, int groups) {
    if (dw_fast(g, groups)) dw_backward_weight(dw, dy, in, g);
    else grouped_backward_weight(dw, dy, in, g, groups);
}

static int64_t cpu_conv_grouped_scratch_floats(ConvGeometry g, int groups) { return 0; }

// ---- elementwise and reductions -------------------------------------------------------------

static void cpu_bias_act_forward(float *out, const float *bias, int64_t rows, int cols,
                                 Activation act) {
#pragma omp parallel for schedule(static) if (rows * cols > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * cols;
        if (bias)
            for (int c = 0; c < cols; c++) o[c] += bias[c];
        if (act != ACT_NONE)
            for (int c = 0; c < cols; c++) o[c] = act_apply(act, o[c]);
    }
}

static void cpu_relu_forward(float *out, const float *in, int64_t n, Activation act) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = act_apply(act, in[i]);
}

// ReLU's loop with act a constant: gcc does not unswitch this one, and the general loop's
// masks cost ReLU 20-40% (4M values: 2.8 -> 3.8 ms).
static void cpu_relu_backward(float *din, const float *dout, const float *out, int64_t n, Activation act) {
    if (act == ACT_RELU) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) din[i] = act_passes(ACT_RELU, out[i]) ? dout[i] : 0.0f;
        return;
    }
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) din[i] = act_passes(act, out[i]) ? dout[i] : 0.0f;
}

static void cpu_add_act(float *out, const float *a, const float *b, int64_t n, Activation act) {
    if (act != ACT_NONE) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) out[i] = act_apply(act, a[i] + b[i]);
        return;
    }
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// The activation's gradient and the column sums in one pass over dout (the conv2 of the
// seed network: 0.42 -> 0.31 ms a step against two passes). Column sums over
// BIAS_ROW_BLOCKS blocks of rows whose bounds depend on `rows` only, summed in parallel,
// then added to dbias in block order: the same bits whatever the number of threads.
#define BIAS_ROW_BLOCKS 16
static void cpu_bias_act_backward(float *dbias, float *dout, const float *y, int64_t rows, int cols,
                                  Activation act) {
    enum { COLS_BLOCK = 256 };
    if (!dbias) {
        if (act != ACT_NONE) cpu_relu_backward(dout, dout, y, rows * cols, act);
        return;
    }
    const int64_t per_block = (rows + BIAS_ROW_BLOCKS - 1) / BIAS_ROW_BLOCKS;
    for (int c0 = 0; c0 < cols; c0 += COLS_BLOCK) {
        const int nc = cols - c0 < COLS_BLOCK ? cols - c0 : COLS_BLOCK;
        float part[BIAS_ROW_BLOCKS][COLS_BLOCK];
#pragma omp parallel for schedule(static) if (rows * nc > PAR_MIN)
        for (int b = 0; b < BIAS_ROW_BLOCKS; b++) {
            float *acc = part[b];
            for (int c = 0; c < nc; c++) acc[c] = 0.0f;
            const int64_t r1 = (b + 1) * per_block < rows ? (b + 1) * per_block : rows;
            for (int64_t r = b * per_block; r < r1; r++) {
                float *d = dout + r * cols + c0;
                const float *yr = y + r * cols + c0;
                if (act != ACT_NONE)
                    for (int c = 0; c < nc; c++) d[c] = act_passes(act, yr[c]) ? d[c] : 0.0f;
                for (int c = 0; c < nc; c++) acc[c] += d[c];
            }
        }
        for (int b = 0; b < BIAS_ROW_BLOCKS; b++)
            for (int c = 0; c < nc; c++) dbias[c0 + c] += part[b][c];
    }
}

// ---- pooling --------------------------------------------------------------------------------

// The window of output row (or column) o: input rows [*a, *b) inside the image.
static inline void window_range(int o, int stride, int pad, int K, int H, int *a, int *b) {
    const int lo = o * stride - pad;
    *a = lo < 0 ? 0 : lo;
    *b = lo + K < H ? lo + K : H;
}

static void cpu_maxpool_forward(float *out, uint8_t *argmax, const float *in, int N, int H, int W,
                                int C, int K, int stride, int pad, int OH, int OW) {
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)N * OH * OW * C * K * K > PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                const int64_t at = (((int64_t)n * OH + oh) * OW + ow) * C;
                float *o = out + at;
                uint8_t *a = argmax + at;
                int h0, h1, w0, w1;
                window_range(oh, stride, pad, K, H, &h0, &h1);
                window_range(ow, stride, pad, K, W, &w0, &w1);
                // A window of -inf alone: its first pixel inside the image, as PyTorch.
                const uint8_t first = (uint8_t)((h0 - (oh * stride - pad)) * K + w0 - (ow * stride - pad));
                for (int c = 0; c < C; c++) o[c] = -INFINITY, a[c] = first;
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++) {
                        const float *s = in + (((int64_t)n * H + ih) * W + iw) * C;
                        const uint8_t k = (uint8_t)((ih - (oh * stride - pad)) * K + iw - (ow * stride - pad));
                        for (int c = 0; c < C; c++) {
                            const bool win = s[c] > o[c] || s[c] != s[c];
                            o[c] = win ? s[c] : o[c];
                            a[c] = win ? k : a[c];
                        }
                    }
            }
}

static void cpu_maxpool_backward(float *din, const float *dout, const uint8_t *argmax, int N, int H,
                                 int W, int C, int K, int stride, int pad, int OH, int OW) {
#pragma omp parallel for schedule(static) if ((int64_t)N * OH * OW * C > PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *dimg = din + (int64_t)n * H * W * C;
        memset(dimg, 0, sizeof(float) * (size_t)H * W * C);
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                const int64_t o = (((int64_t)n * OH + oh) * OW + ow) * C;
                const int top = oh * stride - pad, left = ow * stride - pad;
                for (int c = 0; c < C; c++) {
                    const int ih = top + argmax[o + c] / K, iw = left + argmax[o + c] % K;
                    dimg[((int64_t)ih * W + iw) * C + c] += dout[o + c];
                }
            }
    }
}

// Each output sums its window's pixels in (kh, kw) order, then divides by K * K.
static void cpu_avgpool_forward(float *out, const float *in, int N, int H, int W, int C, int K,
                                int stride, int pad, int OH, int OW) {
    const float div = (float)(K * K);
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)N * OH * OW * C * K * K > PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                float *o = out + (((int64_t)n * OH + oh) * OW + ow) * C;
                for (int c = 0; c < C; c++) o[c] = 0.0f;
                int h0, h1, w0, w1;
                window_range(oh, stride, pad, K, H, &h0, &h1);
                window_range(ow, stride, pad, K, W, &w0, &w1);
                for (int ih = h0; ih < h1; ih++)
                    for (int iw = w0; iw < w1; iw++) {
                        const float *s = in + (((int64_t)n * H + ih) * W + iw) * C;
                        for (int c = 0; c < C; c++) o[c] += s[c];
                    }
                for (int c = 0; c < C; c++) o[c] /= div;
            }
}

// Each input pixel gathers dout / (K * K) from the windows that hold it, in (oh, ow) order
// (as the CUDA kernel does): images write disjoint parts of din.
static void cpu_avgpool_backward(float *din, const float *dout, int N, int H, int W, int C, int K,
                                 int stride, int pad, int OH, int OW) {
    const float div = (float)(K * K);
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)N * H * W * C * K * K > PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int ih = 0; ih < H; ih++) {
            // Windows oh with oh * stride - pad <= ih < oh * stride - pad + K.
            const int y = ih + pad, oh0 = y - K + 1 <= 0 ? 0 : (y - K + stride) / stride;
            const int oh1 = y / stride < OH - 1 ? y / stride : OH - 1;
            for (int iw = 0; iw < W; iw++) {
                const int x = iw + pad, ow0 = x - K + 1 <= 0 ? 0 : (x - K + stride) / stride;
                const int ow1 = x / stride < OW - 1 ? x / stride : OW - 1;
                float *d = din + (((int64_t)n * H + ih) * W + iw) * C;
                for (int c = 0; c < C; c++) d[c] = 0.0f;
                for (int oh = oh0; oh <= oh1; oh++)
                    for (int ow = ow0; ow <= ow1; ow++) {
                        const float *g = dout + (((int64_t)n * OH + oh) * OW + ow) * C;
                        for (int c = 0; c < C; c++) d[c] += g[c] / div;
                    }
            }
        }
}

// Sums in pixel order, then divides by HW.
static void cpu_global_avgpool_forward(float *out, const float *in, int N, int64_t HW, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)N * HW * C > PAR_MIN)
    for (int n = 0; n < N; n++) {
        float *o = out + (int64_t)n * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int64_t p = 0; p < HW; p++) {
            const float *s = in + ((int64_t)n * HW + p) * C;
            for (int c = 0; c < C; c++) o[c] += s[c];
        }
        for (int c = 0; c < C; c++) o[c] /= (float)HW;
    }
}

static void cpu_global_avgpool_backward(float *din, const float *dout, int N, int64_t HW, int C) {
#pragma omp parallel for schedule(static) if ((int64_t)N * HW * C > PAR_MIN)
    for (int n = 0; n < N; n++)
        for (int64_t p = 0; p < HW; p++) {
            float *d = din + ((int64_t)n * HW + p) * C;
            const float *g = dout + (int64_t)n * C;
            for (int c = 0; c < C; c++) d[c] = g[c] / (float)HW;
        }
}

// ---- batch normalisation ------------------------------------------------------------------
// The sums go sample after sample: each sample's rows in bn_sample_blocks fixed blocks (a
// function of the sample's size alone), summed in parallel in double, a block of channels at
// a time; the blocks' sums are added to acc in sample and block order: the same bits for any
// number of threads, and for a batch in one call or in chunks of samples.

#define BN_BLOCK_ROWS 2048  // rows a block of a sample at most
#define BN_COLS_BLOCK 1024  // channels a pass over the rows at most
#define BN_PART_SUMS 32768  // a round's partial sums: BN_PART_SUMS / (2 * channels) sample
                            // blocks summed in parallel before they are added (16 at 1,024)

// What batchnorm's backward reads per channel: the statistics, gamma and beta; and where
// it reads its activation's mask from the forward's output, that output (else NULL).
typedef struct BnChannels {
    const float *mean, *invstd, *gamma, *beta;
    const float *out;
} BnChannels;

// Rows are taken in groups: a layer of up to BN_FLAT / 2 channels runs over groups of
// BN_FLAT / C rows as one contiguous run of values (a 16-channel layer's rows alone are
// too short for the vector loops); wider layers one row of a block of up to BN_COLS_BLOCK
// channels at a time: all of a row's channels where they fit, so that the rows are read
// once, in the order they lie (in blocks of 128 channels, a 576-channel layer's backward
// ran at 19% of the memory bandwidth, bench/depthwise.c; a channel's sums and their order
// do not depend on the block).
#define BN_FLAT 256

// Where a run's per-value arrays lie in one buffer: the k-th at k * bn_stride(n). They lie
// next to each other, a cache line apart, not BN_COLS_BLOCK apart: arrays 4 KB apart
// (and the tensors, page-aligned) make loads wait on stores to the same address bits
// (narrow layers' backward 1.5x slower).
#define BN_STRIDE_PAD 16
static inline int bn_stride(int n) { return n + BN_STRIDE_PAD; }

// The per-channel numbers of a block of nc channels, repeated for the rows of a group and
// copied to the stack, so that the loops below vectorise: mean, invstd, invstd * gamma (as
// bn_forward computes it), beta.
typedef struct BnBlock {
    int nc, rows;  // channels, and rows a group: the run is nc * rows values
    float *mean, *invstd, *scale, *beta;  // in v
    float v[4 * (BN_COLS_BLOCK + BN_STRIDE_PAD)];
} BnBlock;

static void bn_block(BnBlock *blk, const BnChannels *s, int C, int c0, int nc) {
    blk->nc = nc;
    blk->rows = nc == C && BN_FLAT / C > 1 ? BN_FLAT / C : 1;
    const int n = bn_stride(nc * blk->rows);
    blk->mean = blk->v, blk->invstd = blk->v + n, blk->scale = blk->v + 2 * n, blk->beta = blk->v + 3 * n;
    if (!s) return;  // plain sums need no statistics
    for (int t = 0; t < nc * blk->rows; t++) {
        const int c = c0 + t % nc;
        blk->mean[t] = s->mean[c];
        blk->invstd[t] = s->invstd[c];
        blk->scale[t] = s->invstd[c] * s->gamma[c];
        blk->beta[t] = s->beta[c];
    }
}

// Adds a run of n values' terms to the partial sums: with dy NULL, x and x^2; else dy
// (times the activation's mask: act_passes(o) where the run's output o is given, else
// act_passes(z), z = (x - mean) * scale + beta) and dy * xhat, xhat = (x - mean) * invstd.
// Products and sums in double.
static inline __attribute__((always_inline)) void bn_run_terms(double *s1, double *s2, const float *x,
                                                               const float *dy, const float *o,
                                                               const BnBlock *blk, Activation act, int n) {
    if (!dy) {
#pragma omp simd
        for (int t = 0; t < n; t++) {
            s1[t] += x[t];
            s2[t] += (double)x[t] * x[t];
        }
    } else if (act != ACT_NONE) {  // the masked dy and xhat first: a loop of floats, then one of doubles
        float gx[2 * (BN_COLS_BLOCK + BN_STRIDE_PAD)];
        float *g = gx, *xhat = gx + bn_stride(n);
        if (o) {
#pragma omp simd
            for (int t = 0; t < n; t++) {
                g[t] = act_passes(act, o[t]) ? dy[t] : 0.0f;
                xhat[t] = (x[t] - blk->mean[t]) * blk->invstd[t];
            }
        } else {
#pragma omp simd
            for (int t = 0; t < n; t++) {
                const float d = x[t] - blk->mean[t];
                g[t] = act_passes(act, d * blk->scale[t] + blk->beta[t]) ? dy[t] : 0.0f;
                xhat[t] = d * blk->invstd[t];
            }
        }
#pragma omp simd
        for (int t = 0; t < n; t++) {
            s1[t] += g[t];
            s2[t] += (double)g[t] * xhat[t];
        }
    } else {
#pragma omp simd
        for (int t = 0; t < n; t++) {
            s1[t] += dy[t];
            s2[t] += (double)dy[t] * ((x[t] - blk->mean[t]) * blk->invstd[t]);
        }
    }
}

// Blocks a sample of `sample_rows` rows is summed in.
static int64_t bn_sample_blocks(int64_t sample_rows) { return (sample_rows + BN_BLOCK_ROWS - 1) / BN_BLOCK_ROWS; }

// The sums of rows [r0, r1) (a block of a sample) over the block's channels: each value of
// a group its own partial sums (a group's rows are independent chains of adds), then each
// channel's partial sums added in row order, to pu[0, nc) and pu[nc, 2 nc). x, dout and
// out (either may be NULL) as bn_run_terms reads them, from channel c0 of rows C apart.
static inline __attribute__((always_inline)) void bn_block_sums(double *pu, const float *x, const float *dout,
                                                                const float *out, int64_t r0, int64_t r1, int C,
                                                                int c0, const BnBlock *blk, Activation act) {
    const int nc = blk->nc, R = blk->rows;
    double s[2 * (BN_COLS_BLOCK + BN_STRIDE_PAD)];
    double *s1 = s, *s2 = s + bn_stride(nc * R);
    for (int t = 0; t < nc * R; t++) s1[t] = s2[t] = 0.0;
    for (int64_t r = r0; r < r1; r += R) {
        const int n = (int)(r1 - r < R ? r1 - r : R) * nc;
        const int64_t e0 = r * C + c0;
        bn_run_terms(s1, s2, x + e0, dout ? dout + e0 : NULL, out ? out + e0 : NULL, blk, act, n);
    }
    for (int j = 0; j < nc; j++) {
        double a = 0.0, q = 0.0;
        for (int g = 0; g < R; g++) a += s1[g * nc + j], q += s2[g * nc + j];
        pu[j] = a, pu[nc + j] = q;
    }
}

// bn_block_sums in the table's vectors, and in AVX-512's where the CPU has them (cpu_wide):
// every value's terms are its own lanes' chains, so both give the same bits. (Sums in
// double, 8 to a register against AVX2's 4: fashion-resnet's batch sums and backward sums
// 4.4 -> 3.7 ms a step, with their tensors in the caches.)
typedef void BnBlockSums(double *pu, const float *x, const float *dout, const float *out, int64_t r0, int64_t r1,
                         int C, int c0, const BnBlock *blk, Activation act);
static void bn_block_sums_narrow(double *pu, const float *x, const float *dout, const float *out, int64_t r0,
                                 int64_t r1, int C, int c0, const BnBlock *blk, Activation act) {
    bn_block_sums(pu, x, dout, out, r0, r1, C, c0, blk, act);
}
#ifdef __AVX2__
__attribute__((target("avx512f"))) static void bn_block_sums_wide(double *pu, const float *x, const float *dout,
                                                                  const float *out, int64_t r0, int64_t r1, int C,
                                                                  int c0, const BnBlock *blk, Activation act) {
    bn_block_sums(pu, x, dout, out, r0, r1, C, c0, blk, act);
}
#else
#define bn_block_sums_wide bn_block_sums_narrow
#endif

// Adds to acc[c] and acc[C + c] the column sums of bn_run_terms over the rows, samples of
// sample_rows rows. Each block of a sample sums its groups into one partial sum per value
// of a group (a group's rows are independent chains of adds), then adds a channel's partial
// sums in row order; the blocks' sums are added to acc in order, a round of them computed
// at a time in parallel. (With the runs as one vector loop: a 16-channel layer's backward
// sums over 4.2M values with ReLU 2.6 -> 1.85 ms, a 64-channel layer's over 1M 0.67 -> 0.24 ms.)
static void bn_column_sums(double *acc, int64_t rows, int64_t sample_rows, int C, const float *x,
                           const float *dout, const BnChannels *s, Activation act) {
    const int64_t P = bn_sample_blocks(sample_rows), per = (sample_rows + P - 1) / P;
    const int64_t units = rows / sample_rows * P;
    double part[BN_PART_SUMS];  // per unit of a round: its nc sums, then its nc sums of squares
    BnBlockSums *const block_sums = cpu_wide() ? bn_block_sums_wide : bn_block_sums_narrow;
    for (int c0 = 0; c0 < C; c0 += BN_COLS_BLOCK) {
        const int nc = C - c0 < BN_COLS_BLOCK ? C - c0 : BN_COLS_BLOCK, round = BN_PART_SUMS / (2 * nc);
        BnBlock blk;
        bn_block(&blk, dout ? s : NULL, C, c0, nc);
        const float *out = s ? s->out : NULL;  // the mask's source (bn_run_terms), or NULL
        for (int64_t u0 = 0; u0 < units; u0 += round) {
            const int nu = (int)(units - u0 < round ? units - u0 : round);
#pragma omp parallel for schedule(static) if ((int64_t)nu * per * nc > PAR_MIN)
            for (int u = 0; u < nu; u++) {
                const int64_t sample = (u0 + u) / P, b = (u0 + u) % P;
                const int64_t lo = b * per < sample_rows ? b * per : sample_rows;
                const int64_t hi = (b + 1) * per < sample_rows ? (b + 1) * per : sample_rows;
                block_sums(part + (size_t)u * 2 * nc, x, dout, out, sample * sample_rows + lo,
                           sample * sample_rows + hi, C, c0, &blk, act);
            }
            for (int u = 0; u < nu; u++)
                for (int j = 0; j < nc; j++) {
                    acc[c0 + j] += part[(size_t)u * 2 * nc + j];
                    acc[C + c0 + j] += part[(size_t)u * 2 * nc + nc + j];
                }
        }
    }
}

static void cpu_bn_sums(double *acc, const float *x, int64_t rows, int64_t sample_rows, int C) {
    bn_column_sums(acc, rows, sample_rows, C, x, NULL, NULL, ACT_NONE);
}

static void cpu_bn_batch_stats(float *mean, float *invstd, float *running_mean, float *running_var,
                               const double *acc, int C, int64_t count, double eps, double momentum) {
    for (int c = 0; c < C; c++) {
        const double m = acc[c] / (double)count;
        double var = acc[C + c] / (double)count - m * m;
        if (var < 0) var = 0;  // rounding: the sums of a constant channel
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + eps));
        running_mean[c] = (float)(momentum * m + (1.0 - momentum) * running_mean[c]);
        if (count > 1)
            running_var[c] = (float)(momentum * (var * (double)count / (double)(count - 1)) +
                                     (1.0 - momentum) * running_var[c]);
    }
}

static void cpu_bn_eval_stats(float *mean, float *invstd, const float *running_mean,
                              const float *running_var, int C, double eps) {
    for (int c = 0; c < C; c++) {
        mean[c] = running_mean[c];
        invstd[c] = (float)(1.0 / sqrt((double)running_var[c] + eps));
    }
}

static void cpu_bn_forward(float *out, const float *x, const float *mean, const float *invstd,
                           const float *gamma, const float *beta, int64_t rows, int C,
                           Activation act) {
#pragma omp parallel for schedule(static) if (rows * C > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *o = out + r * C;
        for (int c = 0; c < C; c++) {
            const float v = (xr[c] - mean[c]) * (invstd[c] * gamma[c]) + beta[c];
            o[c] = act_apply(act, v);
        }
    }
}

static void cpu_bn_backward_sums(double *acc, const float *dout, const float *x, const float *out,
                                 const float *mean, const float *invstd, const float *gamma,
                                 const float *beta, int64_t rows, int64_t sample_rows, int C,
                                 Activation act) {
    const BnChannels s = {mean, invstd, gamma, beta, out};
    bn_column_sums(acc, rows, sample_rows, C, x, dout, &s, act);
}

static void cpu_bn_backward(float *din, const float *dout, const float *x, const float *out,
                            const float *mean, const float *invstd, const float *gamma,
                            const float *beta, const double *acc, int64_t rows, int C,
                            int64_t count, Activation act) {
    const BnChannels s = {mean, invstd, gamma, beta, out};
    for (int c0 = 0; c0 < C; c0 += BN_COLS_BLOCK) {
        const int nc = C - c0 < BN_COLS_BLOCK ? C - c0 : BN_COLS_BLOCK;
        BnBlock blk;
        bn_block(&blk, &s, C, c0, nc);
        const int R = blk.rows;
        // per value of a group: its channel's mean of dy, mean of dy * xhat, gamma * invstd
        float abk[3 * (BN_COLS_BLOCK + BN_STRIDE_PAD)];
        float *a = abk, *b = abk + bn_stride(nc * R), *k = abk + 2 * bn_stride(nc * R);
        for (int t = 0; t < nc * R; t++) {
            const int c = c0 + t % nc;
            a[t] = (float)(acc[c] / (double)count);
            b[t] = (float)(acc[C + c] / (double)count);
            k[t] = gamma[c] * invstd[c];
        }
        // din may be dout: each value is read before it is written. (One vector loop a group:
        // 16 channels x 4.2M values with ReLU 3.3 -> 1.7 ms, 64 x 1M 0.88 -> 0.16 ms.)
#pragma omp parallel for schedule(static) if (rows * nc > PAR_MIN)
        for (int64_t r = 0; r < rows; r += R) {
            const int n = (int)(rows - r < R ? rows - r : R) * nc;
            const float *xr = x + r * C + c0, *dyr = dout + r * C + c0;
            float *dr = din + r * C + c0;
            if (out) {  // the mask from the output (bn_run_terms)
                const float *o = out + r * C + c0;
#pragma omp simd
                for (int t = 0; t < n; t++) {
                    const float d = xr[t] - blk.mean[t];
                    const float dy = act_passes(act, o[t]) ? dyr[t] : 0.0f;
                    dr[t] = (dy - a[t] - d * blk.invstd[t] * b[t]) * k[t];
                }
                continue;
            }
#pragma omp simd
            for (int t = 0; t < n; t++) {
                const float d = xr[t] - blk.mean[t];
                const float dy = act_passes(act, d * blk.scale[t] + blk.beta[t]) ? dyr[t] : 0.0f;
                dr[t] = (dy - a[t] - d * blk.invstd[t] * b[t]) * k[t];
            }
        }
    }
}

static void cpu_bn_param_grads(float *dgamma, float *dbeta, const double *acc, int C) {
    for (int c = 0; c < C; c++) {
        dgamma[c] += (float)acc[C + c];
        dbeta[c] += (float)acc[c];
    }
}

// ---- dropout --------------------------------------------------------------------------------

#ifdef __AVX2__
// x * c mod 2^64 in four lanes (AVX2 has no 64-bit multiply): lo(x) lo(c) plus the cross
// terms shifted up; hi(x) hi(c) falls outside 64 bits.
static inline __m256i mul64_const(__m256i x, uint64_t c) {
    const __m256i clo = _mm256_set1_epi64x((int64_t)(uint32_t)c);
    const __m256i chi = _mm256_set1_epi64x((int64_t)(c >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), clo),
                                           _mm256_mul_epu32(x, chi));
    return _mm256_add_epi64(_mm256_mul_epu32(x, clo), _mm256_slli_epi64(cross, 32));
}

// rng_mix64 (nn/rng.h) in four lanes.
static inline __m256i mix64_x4(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
    x = mul64_const(x, 0xbf58476d1ce4e5b9ULL);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
    x = mul64_const(x, 0x94d049bb133111ebULL);
    return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}
#endif

// Element i is kept iff rng_uniform(key, offset + i) >= p, i.e. iff its top 24 bits
// (u >> 40) >= p * 2^24 (exact: the uniform is (u >> 40) * 2^-24). The AVX2 path computes
// the same rng_u64 values eight at a time: the counters' states key + (c + 1) * gamma step
// by gamma, so they are added rather than multiplied.
static void cpu_dropout_forward(float *out, const float *in, int64_t n, float p, uint64_t key,
                                uint64_t offset) {
    const float scale = 1.0f / (1.0f - p);
    enum { BLOCK = 4096 };  // elements per parallel iteration (a multiple of 8)
    const int64_t nblocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t b = 0; b < nblocks; b++) {
        const int64_t i0 = b * BLOCK, i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
        int64_t i = i0;
#ifdef __AVX2__
        const uint64_t gamma = 0x9e3779b97f4a7c15ULL;
        const __m256i threshold = _mm256_set1_epi64x((int64_t)ceil((double)p * 16777216.0) - 1);
        const __m256i step = _mm256_set1_epi64x((int64_t)(8 * gamma));
        const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        const __m256 vscale = _mm256_set1_ps(scale);
        const uint64_t s0 = key + (offset + (uint64_t)i + 1) * gamma;
        __m256i sa = _mm256_setr_epi64x((int64_t)s0, (int64_t)(s0 + gamma), (int64_t)(s0 + 2 * gamma),
                                        (int64_t)(s0 + 3 * gamma));
        __m256i sb = _mm256_add_epi64(sa, _mm256_set1_epi64x((int64_t)(4 * gamma)));
        for (; i + 8 <= i1; i += 8) {
            // Lanes whose top 24 bits reach the threshold: all ones (64-bit), then their
            // low halves gathered into eight 32-bit masks.
            const __m256i ka = _mm256_cmpgt_epi64(_mm256_srli_epi64(mix64_x4(sa), 40), threshold);
            const __m256i kb = _mm256_cmpgt_epi64(_mm256_srli_epi64(mix64_x4(sb), 40), threshold);
            const __m256i keep = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(ka, pick),
                                                           _mm256_permutevar8x32_epi32(kb, pick), 0x20);
            const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(in + i), vscale);
            _mm256_storeu_ps(out + i, _mm256_and_ps(_mm256_castsi256_ps(keep), y));
            sa = _mm256_add_epi64(sa, step), sb = _mm256_add_epi64(sb, step);
        }
#endif
        for (; i < i1; i++)
            out[i] = rng_uniform(key, offset + (uint64_t)i) >= p ? in[i] * scale : 0.0f;
    }
}

static void cpu_dropout_backward(float *din, const float *dout, int64_t n, float p,
                                 uint64_t key, uint64_t offset) {
    cpu_dropout_forward(din, dout, n, p, key, offset);  // the same mask and scale
}

// ---- layout ---------------------------------------------------------------------------------

// out[c * ldo + r] = in[r * ldi + c] for r < rows, c < cols: in 8 x 8 blocks through
// registers where the table has AVX2, the edges element by element (a convolution's
// weight permuted between PyTorch's (C, K*K) rows and im2col's (K*K, C), bound by memory
// more than by the moves: fashion-resnet's layout 1.66 -> 1.48-1.52 ms a step).
static void transpose(float *out, int64_t ldo, const float *in, int64_t ldi, int rows, int cols) {
    int r0 = 0;
#ifdef __AVX2__
    for (; r0 + 8 <= rows; r0 += 8) {
        int c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) {
            __m256 v[8], t[8];
            for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(in + (r0 + i) * ldi + c0);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                v[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                v[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
                v[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                v[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(out + (c0 + i) * ldo + r0, _mm256_permute2f128_ps(v[i], v[i + 4], 0x20));
                _mm256_storeu_ps(out + (c0 + i + 4) * ldo + r0, _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
            }
        }
        for (int c = c0; c < cols; c++)
            for (int r = r0; r < r0 + 8; r++) out[c * ldo + r] = in[r * ldi + c];
    }
#endif
    for (int r = r0; r < rows; r++)
        for (int c = 0; c < cols; c++) out[c * ldo + r] = in[r * ldi + c];
}

static void cpu_nhwc_to_nchw(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W;
#pragma omp parallel for schedule(static) if ((int64_t)N * hw * C > PAR_MIN)
    for (int n = 0; n < N; n++) transpose(out + n * hw * C, hw, in + n * hw * C, C, (int)hw, C);
}

static void cpu_nchw_to_nhwc(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W;
#pragma omp parallel for schedule(static) if ((int64_t)N * hw * C > PAR_MIN)
    for (int n = 0; n < N; n++) transpose(out + n * hw * C, C, in + n * hw * C, hw, C, (int)hw);
}

// ---- output and loss ------------------------------------------------------------------------

static void cpu_log_softmax_forward(float *out, const float *in, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = in + (int64_t)n * C;
        float *y = out + (int64_t)n * C;
        float m = -INFINITY;
        for (int c = 0; c < C; c++) m = x[c] > m ? x[c] : m;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += exp((double)x[c] - m);
        const float lse = m + (float)log(s);
        for (int c = 0; c < C; c++) y[c] = x[c] - lse;
    }
}

static void cpu_log_softmax_backward(float *din, const float *dout, const float *out, int N,
                                     int C) {
    for (int n = 0; n < N; n++) {
        const float *dy = dout + (int64_t)n * C, *y = out + (int64_t)n * C;
        float *dx = din + (int64_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) s += dy[c];
        for (int c = 0; c < C; c++) dx[c] = dy[c] - expf(y[c]) * (float)s;
    }
}

static void cpu_nll_loss(float *dlogp, float *metrics, const float *logp, const int32_t *labels,
                         int N, int C, float scale, float smoothing, const ScalerState *scaler) {
    if (scaler) scale *= (float)scaler->scale;
    const double e = smoothing, off = e / C;
    float on_f, off_f;
    nll_targets(smoothing, C, &on_f, &off_f);
    double loss = 0.0;
    int correct = 0;
    for (int n = 0; n < N; n++) {
        const float *y = logp + (int64_t)n * C;
        int best = 0;
        for (int c = 1; c < C; c++)
            if (y[c] > y[best]) best = c;
        correct += best == labels[n];
        if (smoothing == 0.0f) {
            loss -= y[labels[n]];
        } else {
            double sum = 0.0;
            for (int c = 0; c < C; c++) sum += y[c];
            loss -= (1.0 - e) * y[labels[n]] + off * sum;
        }
        if (dlogp) {
            float *d = dlogp + (int64_t)n * C;
            for (int c = 0; c < C; c++) d[c] = off_f != 0.0f ? -(scale * off_f) : 0.0f;
            d[labels[n]] = -(scale * on_f);
        }
    }
    metrics[0] += (float)loss;
    metrics[1] += (float)correct;
}

// ---- precision ------------------------------------------------------------------------------

// F16C converts 8 values an instruction where the object targets it (the AVX2 table's does);
// the scalar functions of half.h give the same bits elsewhere and for the tail.
static void cpu_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t b = 0; b < (n + 7) / 8; b++) {
        const int64_t i = b * 8;
#ifdef __F16C__
        if (i + 8 <= n) {
            _mm_storeu_si128((__m128i *)(out + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
            continue;
        }
#elif defined(__aarch64__)
        if (i + 8 <= n) {  // FCVTN: the same bits (nearest even; NaNs quieted, payload kept)
            const float16x8_t h = vcombine_f16(vcvt_f16_f32(vld1q_f32(in + i)), vcvt_f16_f32(vld1q_f32(in + i + 4)));
            vst1q_u16(out + i, vreinterpretq_u16_f16(h));
            continue;
        }
#endif
        for (int64_t j = i; j < n && j < i + 8; j++) out[j] = half_from_float(in[j]);
    }
}

static void cpu_f16_to_f32(float *out, const uint16_t *in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t b = 0; b < (n + 7) / 8; b++) {
        const int64_t i = b * 8;
#ifdef __F16C__
        if (i + 8 <= n) {
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
            continue;
        }
#elif defined(__aarch64__)
        if (i + 8 <= n) {  // FCVTL: exact
            const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(in + i));
            vst1q_f32(out + i, vcvt_f32_f16(vget_low_f16(h)));
            vst1q_f32(out + i + 4, vcvt_high_f32_f16(h));
            continue;
        }
#endif
        for (int64_t j = i; j < n && j < i + 8; j++) out[j] = half_to_float(in[j]);
    }
}

// bf16: integer arithmetic on the bits, which the compiler vectorises.
static void cpu_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = bf16_from_float(in[i]);
}

static void cpu_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_float(in[i]);
}

// A group a call: groups are independent, their records aligned to 4 bytes. Each width
// has its own inlined copy of the group's loops (a constant `bits` unrolls the shifts).
#define ACT_GROUPS_(call)                                                                      \
    do {                                                                                       \
        const int64_t groups = (values + ACT_GROUP - 1) / ACT_GROUP, rec = act_group_bytes(bits); \
        _Pragma("omp parallel for schedule(static) if (n * values > PAR_MIN)")                 \
        for (int64_t q = 0; q < n * groups; q++) {                                             \
            const int64_t s = q / groups, i = q % groups * ACT_GROUP;                          \
            const int count = values - i < ACT_GROUP ? (int)(values - i) : ACT_GROUP;          \
            switch (bits) {                                                                    \
            case 2: call(2); break;                                                            \
            case 4: call(4); break;                                                            \
            default: call(8); break;                                                           \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#ifdef __AVX2__
// act_pack_group on a whole group, 8 values a vector: the same IEEE operations on each value
// in the same order (min and max as minps and maxps: v < lo ? v : lo; the base's sign of
// zero does not depend on the order: -0 + 0 = +0 on both paths), so the same record.
static inline __attribute__((always_inline)) void act_pack_group_avx2(unsigned char *rec, const float *x, int bits, uint64_t key, uint64_t c0) {
    __m256 lo = _mm256_set1_ps(x[0]), hi = lo, pos = _mm256_set1_ps(INFINITY);
    const __m256 zero = _mm256_setzero_ps();
    for (int i = 0; i < ACT_GROUP; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo), hi = _mm256_max_ps(v, hi);
        pos = _mm256_min_ps(_mm256_blendv_ps(pos, v, _mm256_cmp_ps(v, zero, _CMP_GT_OQ)), pos);
    }
    float l[8], h[8], p[8];
    _mm256_storeu_ps(l, lo), _mm256_storeu_ps(h, hi), _mm256_storeu_ps(p, pos);
    float lo1 = l[0], hi1 = h[0], pos1 = p[0];
    for (int k = 1; k < 8; k++) {
        lo1 = l[k] < lo1 ? l[k] : lo1, hi1 = h[k] > hi1 ? h[k] : hi1;
        pos1 = p[k] < pos1 ? p[k] : pos1;
    }
    const int top = (1 << bits) - 1;
    const int zeros = lo1 == 0.0f && hi1 > 0.0f;
    const float base = (zeros ? pos1 : lo1) + 0.0f, cap = (float)(top - zeros);
    const float step = (hi1 - base) * (1.0f / cap);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    const float head[2] = {base, zeros ? -step : step};
    memcpy(rec, head, sizeof head);
    uint16_t r16[ACT_GROUP];
    for (int k = 0; k < ACT_GROUP / 4; k++) {
        const uint64_t r = rng_u64(key, c0 + (uint64_t)k);
        memcpy(r16 + 4 * k, &r, sizeof r);  // little-endian: the j-th 16 bits at r16[4k + j]
    }
    const __m256 vb = _mm256_set1_ps(base), vinv = _mm256_set1_ps(inv), vcap = _mm256_set1_ps(cap);
    const __m256 half = _mm256_set1_ps(0.5f), scale = _mm256_set1_ps(1.0f / 65536.0f), one = _mm256_set1_ps(1.0f);
    for (int i = 0; i < ACT_GROUP; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i r = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r16 + i)));
        const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(r), half), scale);
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, vb), vinv), u);
        __m256 q = _mm256_blendv_ps(zero, _mm256_floor_ps(t), _mm256_cmp_ps(t, zero, _CMP_GT_OQ));
        q = _mm256_blendv_ps(q, vcap, _mm256_cmp_ps(t, vcap, _CMP_GE_OQ));
        if (zeros) q = _mm256_blendv_ps(zero, _mm256_add_ps(q, one), _mm256_cmp_ps(v, zero, _CMP_GT_OQ));
        int32_t qi[8];
        _mm256_storeu_si256((__m256i *)qi, _mm256_cvttps_epi32(q));
        for (int h = 0; h < 2; h++)
            act_put_quad(rec + 8, i / 4 + h, (uint32_t)qi[4 * h] | (uint32_t)qi[4 * h + 1] << bits |
                         (uint32_t)qi[4 * h + 2] << (2 * bits) | (uint32_t)qi[4 * h + 3] << (3 * bits), bits);
    }
}
#endif

// A whole group through the vector path where there is one, a short one through quant.h's.
static inline __attribute__((always_inline)) void act_pack_one(unsigned char *rec, const float *x, int count, int bits, uint64_t key, uint64_t c0) {
#ifdef __AVX2__
    if (count == ACT_GROUP) {
        act_pack_group_avx2(rec, x, bits, key, c0);
        return;
    }
#endif
    act_pack_group(rec, x, count, bits, key, c0);
}

static void cpu_act_pack(void *dst, const float *x, int64_t values, int n, int bits, uint64_t key,
                         int64_t sample0) {
#define PACK_(b)                                                                                 \
    act_pack_one((unsigned char *)dst + q * rec, x + s * values + i, count, b, key,                \
                 ((uint64_t)(sample0 + s) << 32) + (uint64_t)(i / 4))
    ACT_GROUPS_(PACK_);
#undef PACK_
}

#ifdef __AVX2__
// act_unpack_group on a whole group, 8 values a vector: each code shifted out of the 16, 32
// or 64 bits that hold 8 of them, read back with the same fused multiply-add.
static inline __attribute__((always_inline)) void act_unpack_group_avx2(float *x, const unsigned char *rec, int bits) {
    float head[2];
    memcpy(head, rec, sizeof head);
    const int zeros = signbit(head[1]) != 0;
    const __m256 base = _mm256_set1_ps(head[0]), step = _mm256_set1_ps(fabsf(head[1]));
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1), shift = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits));
    const __m256i off = _mm256_set1_epi32(zeros);
    const unsigned char *codes = rec + 8;
    for (int i = 0; i < ACT_GROUP; i += 8) {
        __m256i q;
        if (bits == 8) {
            q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
        } else {
            uint32_t w = 0;
            memcpy(&w, codes + i * bits / 8, (size_t)bits);  // 8 codes: 2 or 4 bytes
            q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), shift), mask);
        }
        __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, off)), step, base);
        if (zeros) v = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(q, _mm256_setzero_si256())), v);
        _mm256_storeu_ps(x + i, v);
    }
}
#endif

static inline __attribute__((always_inline)) void act_unpack_one(float *x, const unsigned char *rec, int count, int bits) {
#ifdef __AVX2__
    if (count == ACT_GROUP) {
        act_unpack_group_avx2(x, rec, bits);
        return;
    }
#endif
    act_unpack_group(x, rec, count, bits);
}

static void cpu_act_unpack(float *x, const void *src, int64_t values, int n, int bits) {
#define UNPACK_(b) act_unpack_one(x + s * values + i, (const unsigned char *)src + q * rec, count, b)
    ACT_GROUPS_(UNPACK_);
#undef UNPACK_
}
#undef ACT_GROUPS_

static void cpu_u8_to_f32(float *out, const uint8_t *in, int64_t n, int C, const float *lut) {
    if (C == 1) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) out[i] = lut[in[i]];
        return;
    }
    // Channel-last: pixel p holds values p * C .. p * C + C - 1, channel c of them from lut's row c.
    const int64_t pixels = n / C;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t p = 0; p < pixels; p++)
        for (int c = 0; c < C; c++) out[p * C + c] = lut[c * 256 + in[p * C + c]];
    for (int64_t i = pixels * C; i < n; i++) out[i] = lut[(i % C) * 256 + in[i]];
}

static void cpu_unscale_check(float *g, int64_t n, ScalerState *s) {
    const float scale = (float)(1.0 / s->scale);
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        g[i] *= scale;
        bad |= !isfinite(g[i]);
    }
    if (bad) s->found = 1.0f;
}

static void cpu_scaler_update(ScalerState *s, ScalerRules r) { scaler_advance(s, r); }

static void cpu_sum_squares(double *out, const float *x, int64_t n) {
    const int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double total = 0.0;
#pragma omp parallel for schedule(static) ordered if (n > PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t e = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0.0;
        for (int64_t i = b * SUMSQ_BLOCK; i < e; i++) s += (double)x[i] * x[i];
#pragma omp ordered
        total += s;
    }
    *out = total;
}

static void cpu_clip_scale(float *x, int64_t n, const double *sumsq, float max_norm) {
    const float s = clip_coef(*sumsq, max_norm);
    if (!(s < 1.0f)) return;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

// ---- optimizer ------------------------------------------------------------------------------

// One element of each rule, kernels.h's expressions: the fp32 kernels and the packed one
// run these. Every operand is loaded whatever the branch, so that the branches become
// selects and the loops vectorise; the values are the same.
static inline void adadelta_elem(float *p, float *square_avg, float *acc_delta, float g, float lr,
                                 float rho, float eps, float weight_decay) {
    const float pv = *p, acc = *acc_delta;
    const float gi = weight_decay != 0.0f ? g + weight_decay * pv : g;
    const float sq = rho * *square_avg + (1.0f - rho) * gi * gi;
    const float std = sqrtf(sq + eps);
    const float delta = sqrtf(acc + eps) / std * gi;
    *square_avg = sq;
    *acc_delta = rho * acc + (1.0f - rho) * delta * delta;
    *p = pv - lr * delta;
}

// SGD with momentum (buf: its momentum buffer); without, sgd_plain_elem.
static inline void sgd_elem(float *p, float *buf, float g, float lr, float momentum,
                            float one_minus_dampening, float weight_decay, bool nesterov,
                            bool first) {
    const float pv = *p, bv = *buf;
    const float d = weight_decay != 0.0f ? g + weight_decay * pv : g;
    const float b = first ? d : bv * momentum + one_minus_dampening * d;
    *buf = b;
    *p = pv + -lr * (nesterov ? d + momentum * b : b);
}

static inline void sgd_plain_elem(float *p, float g, float lr, float weight_decay) {
    const float pv = *p;
    *p = pv + -lr * (weight_decay != 0.0f ? g + weight_decay * pv : g);
}

static inline void adamw_elem(float *p, float *m, float *v, float g, AdamWScalars a) {
    const float pi = *p * a.decay;
    const float mi = *m * a.beta1 + a.one_minus_beta1 * g;
    const float vi = *v * a.beta2 + a.one_minus_beta2 * g * g;
    *m = mi;
    *v = vi;
    *p = pi + -a.step_size * mi / (sqrtf(vi) / a.bc2_sqrt + a.eps);
}

static void cpu_adadelta_step(float *p, float *square_avg, float *acc_delta, const float *g,
                              int64_t n, float lr, float rho, float eps, float weight_decay,
                              const ScalerState *gate) {
    int64_t taken;
    if (!scaler_gate(gate, 0, &taken)) return;
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        adadelta_elem(&p[i], &square_avg[i], &acc_delta[i], g[i], lr, rho, eps, weight_decay);
}

static void cpu_sgd_step(float *p, float *buf, const float *g, int64_t n, float lr, float momentum,
                         float one_minus_dampening, float weight_decay, bool nesterov,
                         const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    const bool first = taken == 0;
    if (!buf) {
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) sgd_plain_elem(&p[i], g[i], lr, weight_decay);
        return;
    }
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        sgd_elem(&p[i], &buf[i], g[i], lr, momentum, one_minus_dampening, weight_decay, nesterov, first);
}

static void cpu_adamw_step(float *p, float *m, float *v, const float *g, int64_t n, AdamWHyper h,
                           const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    const AdamWScalars a = adamw_scalars(h, taken);
#pragma omp parallel for simd schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) adamw_elem(&p[i], &m[i], &v[i], g[i], a);
}

#define SUB(a, b) ((a) - (b))

// Block b's m values of packed state s (its first at i0) read back into x (root: stored as
// their square roots).
static void unpack_block(float *x, PackedState s, StateFormat f, int map, bool root, int64_t b,
                         int64_t i0, int m) {
    if (f == STATE_BF16) {
        const uint16_t *c = (const uint16_t *)s.codes + i0;
#pragma omp simd
        for (int i = 0; i < m; i++) x[i] = bf16_to_float(c[i]);
        return;
    }
    const uint8_t *c = (const uint8_t *)s.codes + i0;
    const float *q = cpu_quant_map + map, amax = s.absmax[b];
#pragma omp simd
    for (int i = 0; i < m; i++) x[i] = q[c[i]] * amax;
    if (root)
#pragma omp simd
        for (int i = 0; i < m; i++) x[i] = x[i] * x[i];
}

// x's m values stored back as block b of s (root: their square roots, x overwritten): its
// absmax, then each value's code.
static void pack_block(PackedState s, float *x, StateFormat f, int map, bool root, int64_t b,
                       int64_t i0, int m) {
    if (f == STATE_BF16) {
        uint16_t *c = (uint16_t *)s.codes + i0;
#pragma omp simd
        for (int i = 0; i < m; i++) c[i] = bf16_from_float(x[i]);
        return;
    }
    uint8_t *c = (uint8_t *)s.codes + i0;
    if (root)
#pragma omp simd
        for (int i = 0; i < m; i++) x[i] = sqrtf(x[i]);
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[i]));
    s.absmax[b] = amax;
    const float *q = cpu_quant_map + map;
    if (amax == 0.0f) {
        memset(c, map == QUANT_SIGNED ? QUANT_SIGNED_ZERO : 0, (size_t)m);
        return;
    }
#pragma omp simd
    for (int i = 0; i < m; i++) {
        const float v = x[i] / amax;
        int code;
        QUANT_NEAREST(q, v, SUB, code);
        c[i] = (uint8_t)code;
    }
}

// The rule's update of m parameters pb and their state, read back into x0 and x1.
static void step_block(float *restrict pb, float *restrict x0, float *restrict x1,
                       const float *restrict gb, int m, StepScalars r, AdamWScalars a, bool first) {
    const float lr = r.lr, rho = r.rho, eps = r.eps, wd = r.weight_decay, mom = r.momentum,
                omd = r.one_minus_dampening;
    const bool nesterov = r.nesterov;
    switch (r.rule) {
    case RULE_ADADELTA:
#pragma omp simd
        for (int i = 0; i < m; i++) adadelta_elem(&pb[i], &x0[i], &x1[i], gb[i], lr, rho, eps, wd);
        break;
    case RULE_SGD:
#pragma omp simd
        for (int i = 0; i < m; i++) sgd_elem(&pb[i], &x0[i], gb[i], lr, mom, omd, wd, nesterov, first);
        break;
    case RULE_ADAMW:
#pragma omp simd
        for (int i = 0; i < m; i++) adamw_elem(&pb[i], &x0[i], &x1[i], gb[i], a);
        break;
    }
}

static void cpu_optim_step_packed(float *p, PackedState s0, PackedState s1, const float *g,
                                  int64_t n, StateFormat f, StepScalars r,
                                  const ScalerState *gate, uint64_t step) {
    PackedPlan pp;
    if (!packed_plan(r, f, gate, step, &pp)) return;
    const int64_t nb = quant_blocks(n);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        float x0[QUANT_BLOCK], x1[QUANT_BLOCK];
        const int64_t i0 = b * QUANT_BLOCK;
        const int m = n - i0 < QUANT_BLOCK ? (int)(n - i0) : QUANT_BLOCK;
        float *pb = p + i0;
        const float *gb = g + i0;
        unpack_block(x0, s0, f, pp.map0, pp.root0, b, i0, m);
        if (pp.two) unpack_block(x1, s1, f, pp.map1, pp.root1, b, i0, m);
        step_block(pb, x0, x1, gb, m, r, pp.a, pp.first);
        pack_block(s0, x0, f, pp.map0, pp.root0, b, i0, m);
        if (pp.two) pack_block(s1, x1, f, pp.map1, pp.root1, b, i0, m);
    }
}

// TF32 stays fp32 on the CPU (kernels.h allows the rounding, it does not ask for it).
static void cpu_gemm_arith(GemmArith arith) { cpu_arith = arith; }

// The project's GEMMs' packing buffer, one per thread (gemm_thread_buffer: the AVX-512 and
// the bf16 GEMM share it), outside the plan's blocks.
static size_t cpu_thread_scratch(void) {
    return OWN_GEMMS && gemm_avx512_available() ? (size_t)omp_get_max_threads() * gemm_avx512_scratch_bytes() : 0;
}

static int cpu_shard_count(void) { return omp_get_max_threads(); }

// Shard s on the team's thread s, whatever the call.
static void cpu_shards(int64_t n, void (*fn)(void *arg, int s, int64_t lo, int64_t hi), void *arg) {
    const int count = cpu_shard_count();
#pragma omp parallel for schedule(static, 1) num_threads(count)
    for (int s = 0; s < count; s++) fn(arg, s, n * s / count, n * (s + 1) / count);
}

static void cpu_add_parts(float *dst, const float *parts, int count, int64_t n, int64_t stride) {
#pragma omp parallel for schedule(static) if (n * count > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float sum = parts[i];
        for (int p = 1; p < count; p++) sum += parts[p * stride + i];
        dst[i] += sum;
    }
}

#ifndef CPU_KERNEL_SET
#error "CPU_KERNEL_SET names the table this object defines (the Makefile sets it)"
#endif
const Kernels CPU_KERNEL_SET = {
    .name = "cpu",
    .host_memory = true,
    .fp16_scratch_bytes = (size_t)8 << 20,
    .chunk_bytes = (size_t)2 << 20,
    .thread_scratch = cpu_thread_scratch,
    .shard_count = cpu_shard_count,
    .shards = cpu_shards,
    .add_parts = cpu_add_parts,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .zero = cpu_zero,
    .copy = cpu_memcpy,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .gemm_arith = cpu_gemm_arith,
    .im2col = cpu_im2col,
    .winograd_input = cpu_winograd_input,
    .winograd_input_backward = cpu_winograd_input_backward,
    .winograd_output = cpu_winograd_output,
    .winograd_output_backward = cpu_winograd_output_backward,
    .winograd_weights = cpu_winograd_weights,
    .winograd_weights_backward = cpu_winograd_weights_backward,
    .gemm_batched = cpu_gemm_batched,
    .col2im = cpu_col2im,
    .conv_gemm_usable = cpu_conv_gemm_usable,
    .conv_gemm_forward = cpu_conv_gemm_forward,
    .conv_gemm_weight_grad = cpu_conv_gemm_weight_grad,
    .conv_gemm_data_grad = cpu_conv_gemm_data_grad,
    .conv_direct_forward = cpu_conv_direct_forward,
    .conv_direct_backward = cpu_conv_direct_backward,
    .conv_grouped_forward = cpu_conv_grouped_forward,
    .conv_grouped_backward_data = cpu_conv_grouped_backward_data,
    .conv_grouped_backward_weight = cpu_conv_grouped_backward_weight,
    .conv_grouped_scratch_floats = cpu_conv_grouped_scratch_floats,
    .bias_act_forward = cpu_bias_act_forward,
    .bias_act_backward = cpu_bias_act_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .add_act = cpu_add_act,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .global_avgpool_forward = cpu_global_avgpool_forward,
    .global_avgpool_backward = cpu_global_avgpool_backward,
    .bn_sums = cpu_bn_sums,
    .bn_batch_stats = cpu_bn_batch_stats,
    .bn_eval_stats = cpu_bn_eval_stats,
    .bn_forward = cpu_bn_forward,
    .bn_backward_sums = cpu_bn_backward_sums,
    .bn_backward = cpu_bn_backward,
    .bn_param_grads = cpu_bn_param_grads,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .nhwc_to_nchw = cpu_nhwc_to_nchw,
    .nchw_to_nhwc = cpu_nchw_to_nhwc,
    .log_softmax_forward = cpu_log_softmax_forward,
    .log_softmax_backward = cpu_log_softmax_backward,
    .nll_loss = cpu_nll_loss,
    .f32_to_f16 = cpu_f32_to_f16,
    .f16_to_f32 = cpu_f16_to_f32,
    .f32_to_bf16 = cpu_f32_to_bf16,
    .bf16_to_f32 = cpu_bf16_to_f32,
    .u8_to_f32 = cpu_u8_to_f32,
    .act_pack = cpu_act_pack,
    .act_unpack = cpu_act_unpack,
    .unscale_check = cpu_unscale_check,
    .scaler_update = cpu_scaler_update,
    .adadelta_step = cpu_adadelta_step,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
    .optim_step_packed = cpu_optim_step_packed,
    .sum_squares = cpu_sum_squares,
    .clip_scale = cpu_clip_scale,
};
