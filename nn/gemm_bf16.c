// gemm_bf16.c: the bf16 GEMM for CPUs with AVX512-BF16 (see gemm_bf16.h). Its functions
// alone are compiled for AVX512-BF16 (BF16 below, whatever the build's -march); cpu_gemm
// calls them only where gemm_bf16_available() says the CPU has it.
//
// gemm_avx512.c's blocking with both operands packed, since both must be rounded to bf16
// anyway: a KC x NC block of op(B) into panels of NR columns and an MC x KC block of op(A)
// into panels of MR rows, each holding k in pairs (a 32-bit word: k = 2p in the low half,
// 2p + 1 in the high half, VDPBF16PS's order). The micro-kernel broadcasts one row's pair
// of A and multiplies it by a panel row of B's pairs into an MR x NR tile of C in
// registers: each VDPBF16PS does 32 products where an FMA does 16. Tiles 12 x 32, 8 x 32
// where it pads fewer rows, 24 x 16 for products of at most 16 columns, as in the fp32
// GEMM. Edges are zeros in the panels and masked when C is written. On AMX, the same
// tiles also run 3x3 convolutions from the input itself (conv_amx_*, at the end).
#include "gemm_bf16.h"

#include "gemm_avx512.h"
#include "kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KC GEMM_BF16_KC  // k values a block (KC / 2 pairs)
#define KC_MAX 512       // the larger of KC and KC_AMX
#define MC 144           // rows of A a block, a multiple of every MR
#define NC 1024  // columns of B a block: KC x NC x 2 bytes = 512 KB

#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

static inline int imin(int a, int b) { return a < b ? a : b; }

// The packing buffers (A's block, then B's) in gemm_avx512's thread buffer.
_Static_assert(((size_t)MC * KC / 2 + (size_t)KC / 2 * NC) * sizeof(uint32_t) <= GEMM_THREAD_BUFFER_BYTES,
               "the bf16 blocks fit the thread's packing buffer");

// AVX-512 F and BW, AVX512_BF16 (cpuid leaf 7, subleaf 1), and the OS saving the opmask and
// ZMM registers (XCR0 bits 1, 2, 5, 6, 7). From cpuid itself, as nn/cpu.c's checks: clang's
// __builtin_cpu_supports (the fuzz build) may not know avx512bf16.
static bool bf16_usable, amx_usable;

// AMX-BF16 and AMX-TILE (cpuid leaf 7 EDX bits 22 and 24), the OS's tile state in XCR0
// (bits 17, 18), and Linux's leave to use it (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16
// and later).
static void probe_amx(void) {
#if defined(__linux__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (5u << 22)) != (5u << 22)) return;
    unsigned xcr0, xcr0_high;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    if ((xcr0 & (3u << 17)) != (3u << 17)) return;
    amx_usable = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#endif
}

static void probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return;
    unsigned xcr0, xcr0_high;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    if ((xcr0 & 0xe6) != 0xe6) return;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return;
    const unsigned need = bit_AVX512F | bit_AVX512BW;
    if ((b & need) != need) return;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return;
    bf16_usable = (a & (1u << 5)) != 0;
    if (bf16_usable) probe_amx();
}
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

bool gemm_bf16_available(void) {
    pthread_once(&probe_once, probe);
    return bf16_usable && cpu_avx512_allowed();
}

static bool amx_allowed = true;
void gemm_bf16_allow_amx(bool allow) { amx_allowed = allow; }
static bool use_amx(void) { return amx_usable && amx_allowed; }

const char *gemm_bf16_name(void) {
    return !gemm_bf16_available() ? NULL : use_amx() ? "AMX-BF16" : "AVX512-BF16";
}

// 16 words of pairs from two rows of 16 floats: word i = (bf16(lo[i]), bf16(hi[i])).
BF16 static inline __m512i pair_rows(__m512 lo, __m512 hi) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

static inline __mmask16 first(int n) { return (__mmask16)(n >= 16 ? 0xffff : n > 0 ? (1u << n) - 1 : 0); }

// Pairs along a run of contiguous k: src[0, kc) (NULL: zeros) to d[0, kpad), zeros past kc.
BF16 static void pack_run(uint32_t *d, const float *src, int kc, int kpad) {
    for (int p0 = 0; p0 < kpad; p0 += 16) {
        const int k = 2 * p0;
        __m512i w = _mm512_setzero_si512();
        if (src && k < kc) {
            const __m512 x = _mm512_maskz_loadu_ps(first(kc - k), src + k);
            const __m512 y = _mm512_maskz_loadu_ps(first(kc - k - 16), src + k + 16);
            w = (__m512i)_mm512_cvtne2ps_pbh(y, x);  // already in pairs
        }
        _mm512_mask_storeu_epi32(d + p0, first(kpad - p0), w);
    }
}

// The 16 x 16 words of r transposed: r[j] (word i) = r[i] (word j) before.
BF16 static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // u[4 g + c], 128-bit lane L: word 4 L + c of rows 4 g to 4 g + 3
    for (int c = 0; c < 4; c++) {
        const __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        const __m512i e = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd), f = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(a, b, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(a, b, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(e, f, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(e, f, 0xdd);
    }
}

// d[j * ld + i] = s[i * lds + j] for i < m (at most 16) and j < n, 16 x 16 at a time in
// registers: the panels whose pairs do not lie along the packing's runs (AMX's A panels of
// a transposed A, a weight gradient's dy; B's panels of a B whose k runs along its rows, a
// convolution's weight), which a word at a time took a store apiece.
BF16 static void transpose_words(uint32_t *d, int64_t ld, const uint32_t *s, int64_t lds, int m, int n) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        const __mmask16 mj = first(n - j0);
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < m ? _mm512_maskz_loadu_epi32(mj, s + (int64_t)i * lds + j0) : _mm512_setzero_si512();
        transpose16(r);
        for (int j = 0; j < 16 && j0 + j < n; j++) _mm512_mask_storeu_epi32(d + (int64_t)(j0 + j) * ld, first(m), r[j]);
    }
}

// An operand as the packing reads it: x(r, k) of op(X) for its rows r and its k, from the
// view v: a stored matrix (X[r * ld + k] when k runs along its rows, else X[k * ld + r]),
// im2col's columns (their row and column: r and k when k_runs, else k and r) or a weight
// (its row r, its column k: k_runs always).
typedef struct ColsPixels ColsPixels;
typedef struct Operand {
    const GemmView *v;
    bool k_runs;
    ColsPixels *pixels;  // columns with k along their rows: the k-block's pixels (cols_k_block)
} Operand;

// dst[0, n) = the columns' row `row`, columns [col, col + n), both from the view's origin:
// runs of C channels of one input pixel, or zeros in the padding.
static void cols_segment(float *dst, const GemmView *v, int64_t row, int col, int n) {
    row += v->row0, col += v->col0;
    const int ow = (int)(row % v->OW), oh = (int)(row / v->OW % v->OH);
    const int64_t image = row / ((int64_t)v->OW * v->OH);
    while (n > 0) {
        const int tap = col / v->C, c = col % v->C, run = imin(v->C - c, n);
        const int ih = oh * v->stride - v->pad + tap / v->K, iw = ow * v->stride - v->pad + tap % v->K;
        if (ih >= 0 && ih < v->H && iw >= 0 && iw < v->W)
            memcpy(dst, v->in + ((image * v->H + ih) * v->W + iw) * v->C + c, (size_t)run * sizeof(float));
        else
            memset(dst, 0, (size_t)run * sizeof(float));
        dst += run, col += run, n -= run;
    }
}

// Where C is a multiple of 32 and a packing's first column too, every group of 32 columns
// lies in one tap: 32 floats of one input pixel, read where they are, or zeros. An output
// pixel (a row: its patch's first input row and column, and its image's first row) and a
// column (its tap and channel), each stepped without dividing.
typedef struct ColsPixel {
    int64_t image_row;  // image * H
    int ih0, iw0, ow;
} ColsPixel;
typedef struct ColsTap {
    int kh, kw, c;
} ColsTap;

static bool cols_in_groups(const GemmView *v, int col) { return v->C % 32 == 0 && (v->col0 + col) % 32 == 0; }

static ColsPixel cols_pixel(const GemmView *v, int64_t row) {
    row += v->row0;
    const int ow = (int)(row % v->OW), oh = (int)(row / v->OW % v->OH);
    return (ColsPixel){row / ((int64_t)v->OW * v->OH) * v->H, oh * v->stride - v->pad, ow * v->stride - v->pad, ow};
}
static void pixel_next(ColsPixel *p, const GemmView *v) {
    p->iw0 += v->stride;
    if (++p->ow < v->OW) return;
    p->ow = 0, p->iw0 = -v->pad, p->ih0 += v->stride;
    if (p->ih0 < v->OH * v->stride - v->pad) return;
    p->ih0 = -v->pad, p->image_row += v->H;
}
static ColsTap cols_tap(const GemmView *v, int col) {
    col += v->col0;
    return (ColsTap){col / v->C / v->K, col / v->C % v->K, col % v->C};
}
static void tap_next32(ColsTap *t, const GemmView *v) {
    if ((t->c += 32) < v->C) return;
    t->c = 0;
    if (++t->kw < v->K) return;
    t->kw = 0, t->kh++;
}
// The group's 32 floats, NULL in the padding.
static inline const float *cols_group(const GemmView *v, ColsPixel p, ColsTap t) {
    const int ih = p.ih0 + t.kh, iw = p.iw0 + t.kw;
    if ((unsigned)ih >= (unsigned)v->H || (unsigned)iw >= (unsigned)v->W) return NULL;
    return v->in + ((p.image_row + ih) * v->W + iw) * v->C + t.c;
}

// The pixels of a k-block of columns whose k runs along their rows (a weight gradient's
// op(B)): for each, its patch's first input row and column and where that lies in the
// input, for every panel of the block to read its tap's groups from.
struct ColsPixels {
    int ih0[KC_MAX], iw0[KC_MAX];
    int64_t at[KC_MAX];
};

static void cols_k_block(const Operand *X, int k0, int kc) {
    const GemmView *v = X->v;
    if (!X->pixels) return;
    ColsPixel px = cols_pixel(v, k0);
    for (int k = 0; k < kc; k++, pixel_next(&px, v)) {
        X->pixels->ih0[k] = px.ih0, X->pixels->iw0[k] = px.iw0;
        X->pixels->at[k] = ((px.image_row + px.ih0) * v->W + px.iw0) * v->C;
    }
}

BF16 static inline __m512 load16(const float *p, __mmask16 m) {
    return p ? _mm512_maskz_loadu_ps(m, p) : _mm512_setzero_ps();
}

// dst[0, n) = the weight's row `row`, columns [col, col + n) from the view's origin: the
// channels of one tap at a time, 16 at a time gathered from c * cstride + tap0 + t * tstride.
BF16 static void weight_segment(float *dst, const GemmView *v, int row, int col, int n) {
    const float *w = v->x + (int64_t)row * v->ld;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    col += v->col0;
    for (int j = 0; j < n;) {
        const int t = (col + j) / v->C, c = (col + j) % v->C;
        const __mmask16 m = first(imin(n - j, v->C - c));
        const __m512i at = _mm512_add_epi32(
            _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(c)), _mm512_set1_epi32(v->cstride)),
            _mm512_set1_epi32(v->tap0 + t * v->tstride));
        _mm512_mask_storeu_ps(dst + j, m, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, w, 4));
        j += __builtin_popcount(m);
    }
}

// Pairs along a row of the columns from pixel px's column at tap t on, kc of them, as
// pack_run, its groups of 32 read where they are.
BF16 static void pack_cols_run(uint32_t *d, const GemmView *v, ColsPixel px, ColsTap t, int kc, int kpad) {
    for (int p0 = 0; p0 < kpad; p0 += 16) {
        const int k = 2 * p0;
        __m512 x = _mm512_setzero_ps(), y = _mm512_setzero_ps();
        if (k < kc) {
            const float *g = cols_group(v, px, t);
            if (g) x = _mm512_maskz_loadu_ps(first(kc - k), g), y = _mm512_maskz_loadu_ps(first(kc - k - 16), g + 16);
            tap_next32(&t, v);
        }
        _mm512_mask_storeu_epi32(d + p0, first(kpad - p0), (__m512i)_mm512_cvtne2ps_pbh(y, x));
    }
}

// Rows [r0, r0 + rows) of operand X, k [k0, k0 + kc), in pairs: pair p of row r to
// d[r * rs + p * ps] for r < rpad (at most 32: a panel's) and p < kpad, zeros past rows and
// past kc; rs or ps is 1 (A's panels [r][p] on AMX, else [p][r]). Rows of columns or of a
// weight that are not read where they lie go through `row` on the stack; pairs that do not
// lie along the runs the packing makes go through `runs` or `pairs`, transposed into d.
BF16 static void pack_pairs(uint32_t *d, int rs, int ps, const Operand *X, int r0, int rows, int rpad, int k0,
                            int kc, int kpad) {
    const GemmView *v = X->v;
    const bool cols = v->kind == VIEW_COLS;
    if (X->k_runs) {  // runs along each row: in d where ps is 1, else 16 rows' in `runs`
        const bool groups = cols && cols_in_groups(v, k0);
        ColsPixel px = groups ? cols_pixel(v, r0) : (ColsPixel){0};
        const ColsTap tap = groups ? cols_tap(v, k0) : (ColsTap){0};
        float row[KC_MAX];
        uint32_t runs[16][KC_MAX / 2];
        for (int r = 0; r < rpad; r++) {
            uint32_t *const dr = ps == 1 ? d + (int64_t)r * rs : runs[r % 16];
            if (r >= rows) pack_run(dr, NULL, kc, kpad);
            else if (v->kind == VIEW_STORED) pack_run(dr, v->x + (int64_t)(r0 + r) * v->ld + k0, kc, kpad);
            else if (groups) pack_cols_run(dr, v, px, tap, kc, kpad), pixel_next(&px, v);
            else if (cols) cols_segment(row, v, r0 + r, k0, kc), pack_run(dr, row, kc, kpad);
            else weight_segment(row, v, r0 + r, k0, kc), pack_run(dr, row, kc, kpad);
            if (ps != 1 && (r % 16 == 15 || r == rpad - 1))
                transpose_words(d + r / 16 * 16, ps, runs[0], KC_MAX / 2, r % 16 + 1, kpad);
        }
        return;
    }
    // k along the stored rows (or the columns' rows): each pair of them gives the 16-value
    // groups lo[g] and hi[g] of its rows' [r0 + 16 g, r0 + 16 g + 16) (NULL: zeros); a
    // panel's 32 columns in one tap are read where they lie.
    const bool groups = cols && cols_in_groups(v, r0);
    const ColsTap tap = groups ? cols_tap(v, r0) : (ColsTap){0};
    const int64_t tap_at = ((int64_t)tap.kh * v->W + tap.kw) * v->C + tap.c;
    float row[2][32];
    uint32_t pairs[16][32];  // rs != 1: 16 pairs' words of the rows
    for (int p = 0; p < kpad; p++) {
        const int k = 2 * p;
        const float *lo[2] = {NULL, NULL}, *hi[2] = {NULL, NULL};
        for (int h = 0; h < 2 && k + h < kc; h++) {
            const float **g = h ? hi : lo;
            if (groups) {
                const ColsPixels *px = X->pixels;
                if ((unsigned)(px->ih0[k + h] + tap.kh) < (unsigned)v->H &&
                    (unsigned)(px->iw0[k + h] + tap.kw) < (unsigned)v->W)
                    g[0] = v->in + px->at[k + h] + tap_at, g[1] = g[0] + 16;
            } else {
                const float *base = row[h];
                if (cols) cols_segment(row[h], v, k0 + k + h, r0, rows);
                else base = v->x + (int64_t)(k0 + k + h) * v->ld + r0;
                g[0] = base, g[1] = base + 16;
            }
        }
        for (int r = 0; r < rpad; r += 16) {
            const __mmask16 m = first(rows - r);
            const __m512i w = pair_rows(load16(lo[r / 16], m), load16(hi[r / 16], m));
            if (rs == 1) _mm512_mask_storeu_epi32(d + (int64_t)p * ps + r, first(rpad - r), w);
            else _mm512_storeu_si512(pairs[p % 16] + r, w);
        }
        if (rs != 1 && (p % 16 == 15 || p == kpad - 1)) transpose_words(d + p / 16 * 16, rs, pairs[0], 32, p % 16 + 1, rpad);
    }
}

// C's row `row`, columns [col, col + 16) under mask m = alpha * acc + beta * C.
BF16 static inline void store_row(const GemmView *C, int64_t row, int col, __m512 acc, __mmask16 m, float alpha,
                                  float beta) {
    float *const c = C->x + row * C->ld + col;
    __m512 v = alpha == 1.0f ? acc : _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
    if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c), v);
    _mm512_mask_storeu_ps(c, m, v);
}

// The MR x (16 * NV) micro-kernel over kp pairs: the tile of C at (i, j) (mr x nr of it) =
// alpha * a @ b + beta * C.
#define MICRO_KERNEL(NAME, MR, NV)                                                              \
    BF16 static void NAME(int kp, const uint32_t *a, const uint32_t *b, const GemmView *C, int64_t i, int j, \
                          int mr, int nr, float alpha, float beta) {                            \
        __m512 acc[MR][NV];                                                                     \
        _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++)                                   \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(); \
        for (int p = 0; p < kp; p++) {                                                          \
            __m512bh bv[NV];                                                                    \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                                \
                bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);                                \
            _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++) {                             \
                const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);                     \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                            \
                    acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);                         \
            }                                                                                   \
            a += MR, b += 16 * NV;                                                              \
        }                                                                                       \
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) {                                  \
            const __mmask16 m = first(nr - 16 * v);                                             \
            if (!m) break;                                                                      \
            for (int r = 0; r < mr; r++)                                                        \
                store_row(C, i + r, j + 16 * v, acc[r][v], m, alpha, beta);                     \
        }                                                                                       \
    }

MICRO_KERNEL(kernel_12x32, 12, 2)
MICRO_KERNEL(kernel_8x32, 8, 2)
MICRO_KERNEL(kernel_24x16, 24, 1)

BF16 static void gemm_blocks(int M, int N, int K, float alpha, const Operand *A, const Operand *B, float beta,
                             const GemmView *C, uint32_t *pa) {
    uint32_t *const pb = pa + (size_t)MC * KC / 2;  // 64-byte aligned: MC * KC * 2 bytes
    const bool narrow = N <= 16;
    const int MR = narrow ? 24 : (M + 7) / 8 * 8 < (M + 11) / 12 * 12 ? 8 : 12, NR = narrow ? 16 : 32;
    for (int j0 = 0; j0 < N; j0 += NC) {
        const int nc = imin(NC, N - j0);
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = imin(KC, K - k0), kp = (kc + 1) / 2;
            const float b_beta = k0 == 0 ? beta : 1.0f;  // later k-blocks add to C
            cols_k_block(B, k0, kc);
            for (int c0 = 0; c0 < nc; c0 += NR)  // panels [p][j]: column j of op(B) is a row
                pack_pairs(pb + (int64_t)(c0 / NR) * kp * NR, 1, NR, B, j0 + c0, imin(NR, nc - c0), NR, k0, kc,
                           kp);
            for (int i0 = 0; i0 < M; i0 += MC) {
                const int mc = imin(MC, M - i0);
                for (int r0 = 0; r0 < mc; r0 += MR)  // panels [p][r]
                    pack_pairs(pa + (int64_t)(r0 / MR) * kp * MR, 1, MR, A, i0 + r0, imin(MR, mc - r0), MR, k0,
                               kc, kp);
                for (int jr = 0; jr < nc; jr += NR) {
                    const uint32_t *bp = pb + (int64_t)(jr / NR) * kp * NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        const uint32_t *ap = pa + (int64_t)(ir / MR) * kp * MR;
                        const int64_t i = i0 + ir;
                        const int j = j0 + jr, mr = imin(MR, mc - ir), nr = imin(NR, nc - jr);
                        if (narrow)
                            kernel_24x16(kp, ap, bp, C, i, j, mr, nr, alpha, b_beta);
                        else if (MR == 8)
                            kernel_8x32(kp, ap, bp, C, i, j, mr, nr, alpha, b_beta);
                        else
                            kernel_12x32(kp, ap, bp, C, i, j, mr, nr, alpha, b_beta);
                    }
                }
            }
        }
    }
}

// ---- AMX: tiles of 16 x 16 fp32 ----------------------------------------------------------
//
// TDPBF16PS multiplies a tile of 16 rows x 32 k of A (bf16, 64 bytes a row) by a tile of
// 16 pairs of k x 16 columns of B (the pair-major panels above) into a 16 x 16 fp32 tile
// of C: 8,192 products an instruction. The micro-kernel holds a 32 x 32 block of C in 4
// tiles (A in 2, B in 2: all 8), over the k-block in steps of 32; A's panels are row-major
// in pairs ([r][p]) for the tile loads. Blocks of MC_AMX rows of A (a multiple of 32),
// KC_AMX values of k and NC_AMX columns of B: a column panel's k-block is 32 KB, in L1
// while A's panels go by. Every k-block loads and stores C's tiles, so the k-blocks are
// twice the VDPBF16PS kernel's (fashion-resnet bf16, alternating rounds: GEMMs 29.2-30.4 ms
// a step, against 30.9-33.7 with blocks of 256 k and 128 rows and 33.2-34.4 with 1,024 k,
// 32 rows and 256 columns).
#define AMX __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))
#define MC_AMX 64
#define KC_AMX 512
#define NC_AMX 512
_Static_assert(KC_AMX <= KC_MAX && KC <= KC_MAX, "ColsPixels and the packing's row hold a k-block");
_Static_assert(MC_AMX * KC_AMX <= MC * KC, "A's AMX block fits where the VDPBF16PS kernel packs A");

typedef struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

// The configuration of the GEMM's tiles and of the convolutions' (below): 8 tiles of 16 rows
// of 64 bytes; released by amx_release.
AMX static void amx_configure(void) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.bytes_per_row[t] = 64, cfg.rows[t] = 16;
    // GCC 12 does not see that LDTILECFG reads the 64 bytes: it dropped the stores above.
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

AMX static void amx_release(void) { _tile_release(); }

// Tiles 0-3 from and to the 32 x 32 block of floats at c, rows ld floats apart: its four
// 16 x 16 quarters in row-major order.
AMX static void tiles_load(const float *c, int64_t ld) {
    _tile_loadd(0, c, ld * 4);
    _tile_loadd(1, c + 16, ld * 4);
    _tile_loadd(2, c + 16 * ld, ld * 4);
    _tile_loadd(3, c + 16 * ld + 16, ld * 4);
}
AMX static void tiles_store(float *c, int64_t ld) {
    _tile_stored(0, c, ld * 4);
    _tile_stored(1, c + 16, ld * 4);
    _tile_stored(2, c + 16 * ld, ld * 4);
    _tile_stored(3, c + 16 * ld + 16, ld * 4);
}

// The block of C at (i, j) over a k-block of kpad pairs, mr x nr of it inside C. Where
// alpha = 1 and beta is 0 or 1 (every product of the layers), C += a @ b (beta = 0: C =
// a @ b) in the tiles: C is loaded into them and stored back, so over the k-blocks each
// element accumulates in the tiles alone (where C was read and written again through the
// vector registers a k-block at a time, fashion-resnet's GEMMs took 4% longer). At C's
// edges the block goes through `edge` (C's part of it, zeros beyond), so each element sums
// as it would inside. Else alpha * (a @ b) + beta * C, the k-block's sum rounded on its
// own before it is added.
AMX static void amx_tile(int kpad, const uint32_t *a, const uint32_t *b, const GemmView *C, int64_t i, int j,
                         int mr, int nr, float alpha, float beta) {
    const int64_t ld = C->ld;
    float *const c = C->x + i * ld + j;
    float edge[32 * 32];
    const bool in_c = alpha == 1.0f && (beta == 0.0f || beta == 1.0f), whole = mr == 32 && nr == 32;
    const __mmask16 m0 = first(nr), m1 = first(nr - 16);
    if (in_c && beta == 1.0f && whole) {
        tiles_load(c, ld);
    } else if (in_c && beta == 1.0f) {
        for (int r = 0; r < 32; r++) {
            _mm512_storeu_ps(edge + 32 * r, r < mr ? _mm512_maskz_loadu_ps(m0, c + r * ld) : _mm512_setzero_ps());
            _mm512_storeu_ps(edge + 32 * r + 16, r < mr ? _mm512_maskz_loadu_ps(m1, c + r * ld + 16) : _mm512_setzero_ps());
        }
        tiles_load(edge, 32);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    const int astride = kpad * 4, bstride = 32 * 4;
    for (int p = 0; p < kpad; p += 16) {
        _tile_loadd(4, a + p, astride);
        _tile_loadd(5, a + (int64_t)16 * kpad + p, astride);
        _tile_loadd(6, b + (int64_t)p * 32, bstride);
        _tile_loadd(7, b + (int64_t)p * 32 + 16, bstride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (in_c && whole) {
        tiles_store(c, ld);
        return;
    }
    tiles_store(edge, 32);
    for (int r = 0; r < mr; r++)
        if (in_c) {
            _mm512_mask_storeu_ps(c + r * ld, m0, _mm512_loadu_ps(edge + 32 * r));
            if (m1) _mm512_mask_storeu_ps(c + r * ld + 16, m1, _mm512_loadu_ps(edge + 32 * r + 16));
        } else {
            store_row(C, i + r, j, _mm512_loadu_ps(edge + 32 * r), m0, alpha, beta);
            if (m1) store_row(C, i + r, j + 16, _mm512_loadu_ps(edge + 32 * r + 16), m1, alpha, beta);
        }
}

// Pairs a k-block of kc values pads to: whole steps of 32 k.
static int amx_kpad(int kc) { return (kc + 31) / 32 * 16; }

// Words of the thread's buffer after A's block: B's panels of every k-block at once where a
// block of columns fits (B_ALL_WORDS), else of one k-block.
#define B_ALL_WORDS (GEMM_THREAD_BUFFER_BYTES / sizeof(uint32_t) - (size_t)MC * KC / 2)
_Static_assert((size_t)NC_AMX * KC_AMX / 2 <= B_ALL_WORDS, "a block of columns' k-block fits the buffer");

// A block of columns' B panels of one k-block, [c0 / 32][p][j], at pb.
AMX static void amx_pack_b(uint32_t *pb, const Operand *B, int j0, int nc, int k0, int kc) {
    const int kpad = amx_kpad(kc);
    cols_k_block(B, k0, kc);
    for (int c0 = 0; c0 < nc; c0 += 32)
        pack_pairs(pb + (int64_t)(c0 / 32) * kpad * 32, 1, 32, B, j0 + c0, imin(32, nc - c0), 32, k0, kc, kpad);
}

// C's rows [i0, i0 + mc) x the columns' block at j0 over one k-block: A's panels [r][p] at
// pa, then the tiles.
AMX static void amx_rows(const Operand *A, const uint32_t *pb, uint32_t *pa, const GemmView *C, int i0, int mc,
                         int j0, int nc, int k0, int kc, float alpha, float beta) {
    const int kpad = amx_kpad(kc);
    for (int r0 = 0; r0 < mc; r0 += 32)
        pack_pairs(pa + (int64_t)(r0 / 32) * 32 * kpad, kpad, 1, A, i0 + r0, imin(32, mc - r0), 32, k0, kc, kpad);
    for (int jr = 0; jr < nc; jr += 32)
        for (int ir = 0; ir < mc; ir += 32)
            amx_tile(kpad, pa + (int64_t)(ir / 32) * 32 * kpad, pb + (int64_t)(jr / 32) * kpad * 32, C, i0 + ir,
                     j0 + jr, imin(32, mc - ir), imin(32, nc - jr), alpha, beta);
}

// Where a block of columns' B panels of every k-block fit the buffer (a convolution's
// weight: fashion-resnet's all but layer3's, 37-590 KB), they are packed once and each
// block of rows runs over all k-blocks before the next: A's source rows (a convolution's
// input, read by every tap) and C's block stay in the caches from one k-block to the next,
// where k-blocks outside streamed both once a k-block (fashion-resnet bf16, profiled in
// alternation: layer2.0's forward 4.4-5.2 against 5.3-5.4 ms, the step within the noise).
// Each element's sums are the same either way: the same k-blocks, in the same order.
AMX static void gemm_blocks_amx(int M, int N, int K, float alpha, const Operand *A, const Operand *B, float beta,
                                const GemmView *C, uint32_t *pa) {
    uint32_t *const pb = pa + (size_t)MC * KC / 2;
    amx_configure();
    int64_t pairs = 0;  // of every k-block
    for (int k0 = 0; k0 < K; k0 += KC_AMX) pairs += amx_kpad(imin(KC_AMX, K - k0));
    for (int j0 = 0; j0 < N; j0 += NC_AMX) {
        const int nc = imin(NC_AMX, N - j0);
        if ((size_t)(nc + 31) / 32 * 32 * pairs <= B_ALL_WORDS) {
            int64_t at = 0;  // k-block's panels at pb + at
            for (int k0 = 0; k0 < K; k0 += KC_AMX) {
                amx_pack_b(pb + at, B, j0, nc, k0, imin(KC_AMX, K - k0));
                at += (int64_t)(nc + 31) / 32 * 32 * amx_kpad(imin(KC_AMX, K - k0));
            }
            for (int i0 = 0; i0 < M; i0 += MC_AMX) {
                at = 0;
                for (int k0 = 0; k0 < K; k0 += KC_AMX) {
                    const int kc = imin(KC_AMX, K - k0);
                    amx_rows(A, pb + at, pa, C, i0, imin(MC_AMX, M - i0), j0, nc, k0, kc, alpha,
                             k0 == 0 ? beta : 1.0f);
                    at += (int64_t)(nc + 31) / 32 * 32 * amx_kpad(kc);
                }
            }
            continue;
        }
        for (int k0 = 0; k0 < K; k0 += KC_AMX) {
            const int kc = imin(KC_AMX, K - k0);
            amx_pack_b(pb, B, j0, nc, k0, kc);
            for (int i0 = 0; i0 < M; i0 += MC_AMX)
                amx_rows(A, pb, pa, C, i0, imin(MC_AMX, M - i0), j0, nc, k0, kc, alpha, k0 == 0 ? beta : 1.0f);
        }
    }
    amx_release();
}

// ---- AMX: 3x3 convolutions from the input itself ----------------------------------------
//
// A 3x3 stride-1 convolution padded by 1 whose channels the columns' views cannot take (a
// multiple of 16, not of 32: models/resnet-small.cfg's first stage, which ran in fp32
// Winograd under matmul = bf16) runs on the tiles without columns: each input value is
// rounded to bf16 once, where the columns' packing rounds it 9 times.
//
// Forward (and the input gradient, the same convolution of dy with the weight turned half
// a turn, filters and channels swapped): a band of output rows of one image at a time. Its
// input rows (one above, one below) go to the thread's buffer in bf16, each padded to
// W + 3 pixels (a zero, the row, two zeros). A tap row kh of output pixel x is then 3 x C
// contiguous values from padded pixel x, taken in steps of 32 (a tile row of A: 64
// bytes), the weight zero past kw = 2: one tile of A holds 16 output pixels of a row (the
// last tile of a row starts at W - 16 and may overlap the one before: the same values),
// rows C values apart. B holds the weight's 32 values of a step for 16 filters. Four tiles
// of outputs (C), one of the weight (B), three of the input (A).
//
// Weight gradient: dw'(o, tap, c) = sum over the pixels q of dy(q, o) x(q + tap, c), k
// along the band's padded pixels (q = row * (W + 3) + column; dy zero in the 3 columns
// past W). A is dy transposed (16 filters x 32 pixels), B the input in pairs of pixels
// (x(2m), x(2m + 1)) or (x(2m + 1), x(2m + 2)) as the tap's offset is even or odd: 6
// tiles of (tap, 16 channels) over the band, one of dy, one of the input. Each thread
// sums its images into its own dw' (a sum over its images' bands in steps of 32 pixels),
// and the threads' sums are added to dw in thread order: the bits depend on the call's
// images and the thread count, as gemm's split over k.

#define CONV_AMX_BAND_BYTES (256 * 1024)  // a band's input in bf16, about (the caches)

static int conv_amx_steps(int cin) { return (3 * cin + 31) / 32; }   // k steps along a tap row
static int64_t conv_amx_taps_words(int cin, int cout) { return (int64_t)3 * conv_amx_steps(cin) * (cout / 16) * 256; }
static int64_t conv_amx_band_halves(int rows, int W, int cin) { return (int64_t)(rows + 2) * (W + 3) * cin; }

// The weight gradient's band: dy transposed, rows ld halves apart (past the band's padded
// pixels, rounded to 32, and the 16 its last row's writes reach beyond them), and the
// input's pairs of pixels, m_count words of pairs of each parity.
typedef struct AmxDwBand {
    int64_t q, ld, m_count;  // q: the band's padded pixels rounded up to 32
} AmxDwBand;
static AmxDwBand amx_dw_band(int rows, int W) {
    const int64_t Wp = W + 3, q = (rows * Wp + 31) / 32 * 32;
    return (AmxDwBand){q, q + 32, (q + 2 * Wp + 2) / 2 + 1};
}
static size_t amx_dw_bytes(int rows, int W, int cin, int cout) {
    const AmxDwBand b = amx_dw_band(rows, W);
    return (size_t)cout * 9 * cin * sizeof(float) + (size_t)cout * b.ld * 2 + (size_t)2 * b.m_count * cin * 4;
}

// Output rows a band: as many as keep its input near CONV_AMX_BAND_BYTES, at least one
// (conv_amx_usable: one row's buffers fit the thread's), and the weight's tiles beside it
// within the thread's buffer.
static int amx_forward_rows(int H, int W, int cin, int cout) {
    const int64_t taps = conv_amx_taps_words(cin, cout) * 4;
    int rows = 1;
    while (rows < H && conv_amx_band_halves(rows + 1, W, cin) * 2 <= CONV_AMX_BAND_BYTES &&
           taps + conv_amx_band_halves(rows + 1, W, cin) * 2 <= (int64_t)GEMM_THREAD_BUFFER_BYTES)
        rows++;
    return rows;
}
static int amx_dw_rows(int H, int W, int cin, int cout) {
    int rows = 1;
    while (rows < H && amx_dw_bytes(rows + 1, W, cin, cout) <= 2 * CONV_AMX_BAND_BYTES) rows++;
    return rows;
}

bool conv_amx_usable(ConvGeometry g) {
    if (!gemm_bf16_available() || !use_amx()) return false;
    if (g.K != 3 || g.stride != 1 || g.pad != 1 || g.OH != g.H || g.OW != g.W || g.W < 16 || g.C % 16 ||
        g.OC % 16)
        return false;
    const size_t buffer = GEMM_THREAD_BUFFER_BYTES;
    return (size_t)conv_amx_taps_words(g.C, g.OC) * 4 + conv_amx_band_halves(1, g.W, g.C) * 2 <= buffer &&
           (size_t)conv_amx_taps_words(g.OC, g.C) * 4 + conv_amx_band_halves(1, g.W, g.OC) * 2 <= buffer &&
           amx_dw_bytes(1, g.W, g.C, g.OC) <= buffer;
}

static inline __mmask32 first32(int n) { return (__mmask32)(n >= 32 ? ~0u : n > 0 ? (1u << n) - 1 : 0); }

// d[0, n) = src[0, n) in bf16 (NULL: zeros).
BF16 static void bf16_run(uint16_t *d, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const int left = (int)(n - i < 32 ? n - i : 32);
        const __m512 x = src ? _mm512_maskz_loadu_ps(first(left), src + i) : _mm512_setzero_ps();
        const __m512 y = src ? _mm512_maskz_loadu_ps(first(left - 16), src + i + 16) : _mm512_setzero_ps();
        _mm512_mask_storeu_epi16(d + i, first32(left), (__m512i)_mm512_cvtne2ps_pbh(y, x));
    }
}

// The weight's B tiles, [kh][step][block of 16 outputs][16 pairs x 16 outputs]: pair p
// of step j is the tap row's values 32 j + 2p and 32 j + 2p + 1, value v = kw * cin + c;
// zeros past kw = 2. The forward's weight (flip false): w(o, c, kh, kw) of w (cout, cin,
// 3, 3); the input gradient's (flip): w(c, o, 2 - kh, 2 - kw) of w (cin, cout, 3, 3).
AMX static void amx_pack_taps(uint32_t *wp, const float *w, int cin, int cout, bool flip) {
    const int steps = conv_amx_steps(cin);
    for (int kh = 0; kh < 3; kh++)
        for (int j = 0; j < steps; j++)
            for (int ob = 0; ob < cout / 16; ob++) {
                uint32_t *t = wp + (((int64_t)kh * steps + j) * (cout / 16) + ob) * 256;
                for (int p = 0; p < 16; p++) {
                    float v[2][16];
                    for (int h = 0; h < 2; h++)
                        for (int n = 0; n < 16; n++) {
                            const int k = 32 * j + 2 * p + h, kw = k / cin, c = k % cin, o = ob * 16 + n;
                            v[h][n] = kw > 2 ? 0.0f
                                      : flip ? w[(((int64_t)c * cout + o) * 3 + 2 - kh) * 3 + 2 - kw]
                                             : w[(((int64_t)o * cin + c) * 3 + kh) * 3 + kw];
                        }
                    _mm512_storeu_si512(t + 16 * p, pair_rows(_mm512_loadu_ps(v[0]), _mm512_loadu_ps(v[1])));
                }
            }
}

// Rows oy0 - 1 to oy0 + rows of image (H, W, cin) in bf16, each W + 3 pixels: a zero, the
// row, two zeros; zeros outside the image.
AMX static void amx_band_rows(uint16_t *xp, const float *image, int oy0, int rows, int H, int W, int cin) {
    const int64_t row = (int64_t)(W + 3) * cin;
    for (int r = 0; r < rows + 2; r++) {
        const int iy = oy0 - 1 + r;
        uint16_t *d = xp + r * row;
        memset(d, 0, (size_t)cin * 2);
        bf16_run(d + cin, iy >= 0 && iy < H ? image + (int64_t)iy * W * cin : NULL, (int64_t)W * cin);
        memset(d + (int64_t)(W + 1) * cin, 0, (size_t)cin * 4);
    }
}

// Output rows oy0 to oy0 + rows - 1 of an image (W pixels a row, cout channels) from its
// band xp and the weight's tiles wp.
AMX static void amx_band_conv(float *out, const uint16_t *xp, const uint32_t *wp, int oy0, int rows, int W, int cin,
                              int cout) {
    const int steps = conv_amx_steps(cin), per_row = (W + 15) / 16, blocks = rows * per_row, astride = cin * 2;
    for (int b0 = 0; b0 < blocks; b0 += 4) {
        const int nb = imin(4, blocks - b0);
        const uint16_t *a[4];  // each tile's first pixel in the band
        float *c[4];
        for (int i = 0; i < nb; i++) {
            const int r = (b0 + i) / per_row, x0 = imin((b0 + i) % per_row * 16, W - 16);
            a[i] = xp + ((int64_t)r * (W + 3) + x0) * cin;
            c[i] = out + ((int64_t)(oy0 + r) * W + x0) * cout;
        }
        for (int ob = 0; ob < cout / 16; ob++) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int kh = 0; kh < 3; kh++)
                for (int j = 0; j < steps; j++) {
                    const int64_t at = (int64_t)kh * (W + 3) * cin + 32 * j;
                    _tile_loadd(4, wp + (((int64_t)kh * steps + j) * (cout / 16) + ob) * 256, 64);
                    _tile_loadd(5, a[0] + at, astride);
                    _tile_dpbf16ps(0, 5, 4);
                    if (nb > 1) {
                        _tile_loadd(6, a[1] + at, astride);
                        _tile_dpbf16ps(1, 6, 4);
                    }
                    if (nb > 2) {
                        _tile_loadd(7, a[2] + at, astride);
                        _tile_dpbf16ps(2, 7, 4);
                    }
                    if (nb > 3) {
                        _tile_loadd(5, a[3] + at, astride);
                        _tile_dpbf16ps(3, 5, 4);
                    }
                }
            const int cstride = cout * 4;
            _tile_stored(0, c[0] + ob * 16, cstride);
            if (nb > 1) _tile_stored(1, c[1] + ob * 16, cstride);
            if (nb > 2) _tile_stored(2, c[2] + ob * 16, cstride);
            if (nb > 3) _tile_stored(3, c[3] + ob * 16, cstride);
        }
    }
}

// out (N, H, W, cout) = the convolution of in (N, H, W, cin) with the weight's tiles
// (packed by each thread from w), in bands of output rows over the threads.
static int amx_conv(float *out, const float *in, const float *w, int N, int H, int W, int cin, int cout, bool flip) {
    const int rows = amx_forward_rows(H, W, cin, cout), bands = (H + rows - 1) / rows;
    bool failed = false;
#pragma omp parallel
    {
        uint32_t *const wp = gemm_thread_buffer();
        if (!wp) failed = true;
#pragma omp barrier
        if (!failed) {
            uint16_t *const xp = (uint16_t *)(wp + conv_amx_taps_words(cin, cout));
            amx_configure();
            amx_pack_taps(wp, w, cin, cout, flip);
#pragma omp for schedule(static)
            for (int64_t u = 0; u < (int64_t)N * bands; u++) {
                const int64_t n = u / bands;
                const int oy0 = (int)(u % bands) * rows, nr = imin(rows, H - oy0);
                amx_band_rows(xp, in + n * H * W * cin, oy0, nr, H, W, cin);
                amx_band_conv(out + n * H * W * cout, xp, wp, oy0, nr, W, cin, cout);
            }
            amx_release();
        }
    }
    return failed ? -1 : 0;
}

int conv_amx_forward(float *out, const float *in, const float *w, ConvGeometry g) {
    return amx_conv(out, in, w, g.N, g.H, g.W, g.C, g.OC, false);
}

int conv_amx_data_grad(float *din, const float *dy, const float *w, ConvGeometry g) {
    return amx_conv(din, dy, w, g.N, g.H, g.W, g.OC, g.C, true);
}

// dyt[o][q] = dy's band (rows oy0 to oy0 + rows - 1 of an image, W pixels, cout channels)
// in bf16 at q = row * (W + 3) + x, zeros for x >= W and from rows * (W + 3) to ld.
AMX static void amx_band_dyt(uint16_t *dyt, int64_t ld, const float *dy, int oy0, int rows, int W, int cout) {
    const int Wp = W + 3;
    for (int ob = 0; ob < cout; ob += 16)
        for (int r = 0; r < rows; r++)
            for (int x0 = 0; x0 < Wp; x0 += 16) {  // a row's last block writes zeros past it
                __m512i v[16];
                for (int i = 0; i < 16; i++)
                    v[i] = x0 + i < W ? _mm512_loadu_si512(dy + ((int64_t)(oy0 + r) * W + x0 + i) * cout + ob)
                                      : _mm512_setzero_si512();
                transpose16(v);  // v[o]: pixels x0 to x0 + 15 of filter ob + o
                for (int o = 0; o < 16; o++)
                    _mm256_storeu_si256((__m256i *)(dyt + (ob + o) * ld + (int64_t)r * Wp + x0),
                                        (__m256i)_mm512_cvtneps_pbh((__m512)v[o]));
            }
    for (int o = 0; o < cout; o++) memset(dyt + o * ld + (int64_t)rows * Wp, 0, (size_t)(ld - rows * Wp) * 2);
}

// x[m][c] = the band's padded pixels 2m + par and 2m + 1 + par of channel c in a word (the
// first in its low half), m < count: padded pixel P = pr * (W + 3) + px is the input's row
// oy0 - 1 + pr, column px - 1, zeros outside the image and past the band's rows + 2 rows.
AMX static void amx_band_pairs(uint32_t *x, int par, int64_t count, const float *image, int oy0, int rows, int H,
                               int W, int cin) {
    const int Wp = W + 3;
    for (int64_t m = 0; m < count; m++) {
        const float *p[2];
        for (int h = 0; h < 2; h++) {
            const int64_t P = 2 * m + par + h;
            const int pr = (int)(P / Wp), iy = oy0 - 1 + pr, ix = (int)(P % Wp) - 1;
            const bool inside = pr < rows + 2 && iy >= 0 && iy < H && ix >= 0 && ix < W;
            p[h] = inside ? image + ((int64_t)iy * W + ix) * cin : NULL;
        }
        for (int c = 0; c < cin; c += 16)
            _mm512_storeu_si512(x + m * cin + c, pair_rows(p[0] ? _mm512_loadu_ps(p[0] + c) : _mm512_setzero_ps(),
                                                           p[1] ? _mm512_loadu_ps(p[1] + c) : _mm512_setzero_ps()));
    }
}

// part (cout, 9, cin) += the band's dw': for each 16 filters, the (tap, 16 channels) tiles
// six at a time over the band's pixels in steps of 32.
#define DW_TILE(g)                                                         \
    if (ng > g) {                                                          \
        _tile_loadd(7, x[g] + q0 / 2 * cin, cin * 4);                      \
        _tile_dpbf16ps(g, 6, 7);                                           \
    }
#define DW_C(op, g) \
    if (ng > g) op(g, c[g], cstride);
AMX static void amx_band_dw(float *part, const uint16_t *dyt, AmxDwBand b, const uint32_t *x0, const uint32_t *x1,
                            int W, int cin, int cout) {
    const int Wp = W + 3, blocks = cin / 16, tiles = 9 * blocks, cstride = 9 * cin * 4;
    for (int ob = 0; ob < cout / 16; ob++)
        for (int g0 = 0; g0 < tiles; g0 += 6) {
            const int ng = imin(6, tiles - g0);
            float *c[6];
            const uint32_t *x[6];  // the tile's pairs at q = 0
            for (int g = 0; g < ng; g++) {
                const int t = (g0 + g) / blocks, cb = (g0 + g) % blocks, s = t / 3 * Wp + t % 3;
                c[g] = part + (int64_t)ob * 16 * 9 * cin + t * cin + cb * 16;
                x[g] = (s & 1 ? x1 + (int64_t)(s - 1) / 2 * cin : x0 + (int64_t)s / 2 * cin) + cb * 16;
            }
            DW_C(_tile_loadd, 0) DW_C(_tile_loadd, 1) DW_C(_tile_loadd, 2)
            DW_C(_tile_loadd, 3) DW_C(_tile_loadd, 4) DW_C(_tile_loadd, 5)
            for (int64_t q0 = 0; q0 < b.q; q0 += 32) {
                _tile_loadd(6, dyt + (int64_t)ob * 16 * b.ld + q0, b.ld * 2);
                DW_TILE(0) DW_TILE(1) DW_TILE(2) DW_TILE(3) DW_TILE(4) DW_TILE(5)
            }
            DW_C(_tile_stored, 0) DW_C(_tile_stored, 1) DW_C(_tile_stored, 2)
            DW_C(_tile_stored, 3) DW_C(_tile_stored, 4) DW_C(_tile_stored, 5)
        }
}
#undef DW_TILE
#undef DW_C

int conv_amx_weight_grad(float *dw, const float *dy, const float *in, ConvGeometry g) {
    const int H = g.H, W = g.W, cin = g.C, cout = g.OC, rows = amx_dw_rows(H, W, cin, cout);
    const int bands = (H + rows - 1) / rows, threads = omp_get_max_threads();
    const AmxDwBand b = amx_dw_band(rows, W);
    const int64_t size = (int64_t)cout * 9 * cin;
    float *parts[threads];
    int used = 0;
    bool failed = false;
#pragma omp parallel num_threads(threads)
    {
        float *const part = gemm_thread_buffer();
        parts[omp_get_thread_num()] = part;
        if (!part) failed = true;
#pragma omp single
        used = omp_get_num_threads();
        if (!failed) {
            uint16_t *const dyt = (uint16_t *)(part + size);
            uint32_t *const x0 = (uint32_t *)(dyt + cout * b.ld), *const x1 = x0 + b.m_count * cin;
            memset(part, 0, (size_t)size * sizeof(float));
            amx_configure();
#pragma omp for schedule(static)
            for (int n = 0; n < g.N; n++)
                for (int band = 0; band < bands; band++) {
                    const int oy0 = band * rows, nr = imin(rows, H - oy0);
                    const float *image = in + (int64_t)n * H * W * cin;
                    amx_band_dyt(dyt, b.ld, dy + (int64_t)n * H * W * cout, oy0, nr, W, cout);
                    amx_band_pairs(x0, 0, b.m_count, image, oy0, nr, H, W, cin);
                    amx_band_pairs(x1, 1, b.m_count, image, oy0, nr, H, W, cin);
                    amx_band_dw(part, dyt, b, x0, x1, W, cin, cout);
                }
            amx_release();
        }
    }
    if (failed) return -1;
    for (int64_t i = 0; i < size; i++) {
        float sum = parts[0][i];
        for (int t = 1; t < used; t++) sum += parts[t][i];
        dw[i] += sum;
    }
    return 0;
}

// C = beta * C where K = 0.
BF16 static void scale_c(int M, int N, float beta, const GemmView *C) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j += 16) store_row(C, i, j, _mm512_setzero_ps(), first(N - j), 1.0f, beta);
}

int gemm_bf16_views(int M, int N, int K, float alpha, const GemmView *A, const GemmView *B, float beta,
                    const GemmView *C) {
    if (!gemm_bf16_available()) return -1;
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        scale_c(M, N, beta, C);
        return 0;
    }
    uint32_t *const pa = gemm_thread_buffer();
    if (!pa) return -1;
    // op(A)'s rows run along k unless A is stored transposed; op(B)'s columns (the
    // packing's rows) run along k when B is.
    ColsPixels pixels;
    const Operand a = {A, !A->trans, NULL}, b = {B, B->trans, B->kind == VIEW_COLS ? &pixels : NULL};
    if (use_amx())
        gemm_blocks_amx(M, N, K, alpha, &a, &b, beta, C, pa);
    else
        gemm_blocks(M, N, K, alpha, &a, &b, beta, C, pa);
    return 0;
}

int gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    const GemmView a = {.x = (float *)A, .ld = lda, .trans = ta}, b = {.x = (float *)B, .ld = ldb, .trans = tb};
    const GemmView c = {.x = C, .ld = ldc};
    return gemm_bf16_views(M, N, K, alpha, &a, &b, beta, &c);
}

#else  // not x86-64: no AVX512-BF16

bool conv_amx_usable(ConvGeometry g) { return false; }
int conv_amx_forward(float *out, const float *in, const float *w, ConvGeometry g) { return -1; }
int conv_amx_data_grad(float *din, const float *dy, const float *w, ConvGeometry g) { return -1; }
int conv_amx_weight_grad(float *dw, const float *dy, const float *in, ConvGeometry g) { return -1; }

bool gemm_bf16_available(void) { return false; }
void gemm_bf16_allow_amx(bool allow) { (void)allow; }
const char *gemm_bf16_name(void) { return NULL; }
int gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    return -1;
}
int gemm_bf16_views(int M, int N, int K, float alpha, const GemmView *A, const GemmView *B, float beta,
                    const GemmView *C) {
    return -1;
}

#endif
