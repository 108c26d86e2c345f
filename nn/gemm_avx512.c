// gemm_avx512.c: the project's own single-threaded SGEMM for CPUs with AVX-512 (see
// gemm_avx512.h). Its functions alone are compiled for AVX-512 (AVX512 below, whatever the
// build's -march); cpu_gemm calls them only where the CPU has AVX-512, so the binaries
// still run on AVX2 machines.
//
// The classic blocking (Goto's): a KC x NC block of op(B) is packed into panels of NR
// columns, an MC x KC block of op(A) into panels of MR rows, and a micro-kernel
// multiplies one A panel by one B panel into an MR x NR tile of C held in registers
// (MR x NR / 16 of the 32 zmm registers). Three tile shapes: 12 x 32; 8 x 32 where it
// pads fewer rows; and 24 x 16 for products with at most 16 columns (a ResNet's 16-channel
// layers), where the wide tile would multiply zeros half the time. Edges are padded with
// zeros in the packed panels and masked when C is written. Each element of C sums its K
// products in k order, in blocks of KC added to C, whatever the tile or the slab of rows
// or columns it lies in.
#include "gemm_avx512.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

#define KC 256   // k-block: an A panel (MR x KC) and a B panel (KC x NR) stay in L1/L2
#define MC 144   // rows of A packed at a time (a multiple of every MR), 144 KB
#define NC 1024  // columns of B packed at a time, KC x NC x 4 = 1 MB (L2); 4096 was no faster

// The packing buffers of each thread (MC x KC floats for A, then KC x NC for B), allocated
// at its first product and freed when the thread ends (a thread-specific value with a
// destructor: OpenMP's threads come and go with the thread count).
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static void pack_key_make(void) { pthread_key_create(&pack_key, free); }

static float *pack_buffers(void) {
    pthread_once(&pack_once, pack_key_make);
    float *p = pthread_getspecific(pack_key);
    if (!p) {
        if (posix_memalign((void **)&p, 64, ((size_t)MC * KC + (size_t)KC * NC) * sizeof(float))) return NULL;
        if (pthread_setspecific(pack_key, p)) {
            free(p);
            return NULL;
        }
    }
    return p;
}

#define AVX512 __attribute__((target("avx512f")))

static inline int imin(int a, int b) { return a < b ? a : b; }

// Rows src[0..3] (row stride lda), k 0..15, to dst[k * MR + r]: each k's four values are
// one 16-byte store. Measured (one thread, GFLOP/s) against a scalar loop: 4096 x 16 over
// K = 144 (a 16-channel 3x3 convolution) 67 -> 96-132, 4096 x 32 over K = 288 113 -> 160.
AVX512 static inline void pack_4x16(float *dst, int MR, const float *src, int lda) {
    const __m512 a0 = _mm512_loadu_ps(src), a1 = _mm512_loadu_ps(src + lda);
    const __m512 a2 = _mm512_loadu_ps(src + 2 * lda), a3 = _mm512_loadu_ps(src + 3 * lda);
    const __m512 t0 = _mm512_unpacklo_ps(a0, a1), t1 = _mm512_unpackhi_ps(a0, a1);
    const __m512 t2 = _mm512_unpacklo_ps(a2, a3), t3 = _mm512_unpackhi_ps(a2, a3);
    // u[m], 128-bit lane l: the four rows at k = 4 l + m
    const __m512 u[4] = {_mm512_shuffle_ps(t0, t2, 0x44), _mm512_shuffle_ps(t0, t2, 0xee),
                         _mm512_shuffle_ps(t1, t3, 0x44), _mm512_shuffle_ps(t1, t3, 0xee)};
    for (int m = 0; m < 4; m++) {
        _mm_storeu_ps(dst + (int64_t)m * MR, _mm512_castps512_ps128(u[m]));
        _mm_storeu_ps(dst + (int64_t)(4 + m) * MR, _mm512_extractf32x4_ps(u[m], 1));
        _mm_storeu_ps(dst + (int64_t)(8 + m) * MR, _mm512_extractf32x4_ps(u[m], 2));
        _mm_storeu_ps(dst + (int64_t)(12 + m) * MR, _mm512_extractf32x4_ps(u[m], 3));
    }
}

// kc values of src (zeros for NULL: a row or column past the edge) to d[k * step]: one
// row of a panel.
static inline void pack_strided(float *d, int step, const float *src, int kc) {
    for (int k = 0; k < kc; k++) d[(int64_t)k * step] = src ? src[k] : 0.0f;
}

// op(A)(i, k) for rows [i0, i0 + mc) and k [k0, k0 + kc) into panels of MR rows:
// dst[panel][k][r], zero rows past the edge.
AVX512 static void pack_a_block(float *dst, const float *A, int lda, bool ta, int i0, int mc, int k0,
                         int kc, int MR) {
    for (int p = 0; p < mc; p += MR) {
        const int mr = imin(MR, mc - p);
        if (ta) {  // A stored (K, M): a k's rows lie together, MR of them a masked copy
            for (int k = 0; k < kc; k++) {
                const float *src = A + (int64_t)(k0 + k) * lda + i0 + p;
                float *d = dst + (int64_t)k * MR;
                for (int r0 = 0; r0 < MR; r0 += 16) {
                    const int left = mr - r0, width = imin(16, MR - r0);
                    const __mmask16 lm = (__mmask16)(left >= 16 ? 0xffff : left > 0 ? (1u << left) - 1 : 0);
                    const __mmask16 sm = (__mmask16)(width >= 16 ? 0xffff : (1u << width) - 1);
                    _mm512_mask_storeu_ps(d + r0, sm, _mm512_maskz_loadu_ps(lm, src + r0));
                }
            }
        } else {  // A stored (M, K): a row's k lie together
            int r0 = 0;
            if (mr == MR)  // four rows and 16 k at a time, transposed in registers
                for (; r0 + 4 <= MR; r0 += 4) {
                    const float *src = A + (int64_t)(i0 + p + r0) * lda + k0;
                    int k = 0;
                    for (; k + 16 <= kc; k += 16) pack_4x16(dst + (int64_t)k * MR + r0, MR, src + k, lda);
                    for (; k < kc; k++)
                        for (int r = 0; r < 4; r++) dst[(int64_t)k * MR + r0 + r] = src[(int64_t)r * lda + k];
                }
            for (int r = r0; r < MR; r++)
                pack_strided(dst + r, MR, r < mr ? A + (int64_t)(i0 + p + r) * lda + k0 : NULL, kc);
        }
        dst += (int64_t)kc * MR;
    }
}

// op(B)(k, j) for k [k0, k0 + kc) and columns [j0, j0 + nc) into panels of NR columns:
// dst[panel][k][j], zero columns past the edge.
AVX512 static void pack_b_block(float *dst, const float *B, int ldb, bool tb, int k0, int kc, int j0,
                         int nc, int NR) {
    for (int p = 0; p < nc; p += NR) {
        const int nr = imin(NR, nc - p);
        if (!tb) {  // B stored (K, N)
            const __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
            const __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
            for (int k = 0; k < kc; k++) {
                const float *src = B + (int64_t)(k0 + k) * ldb + j0 + p;
                float *d = dst + (int64_t)k * NR;
                _mm512_store_ps(d, _mm512_maskz_loadu_ps(m0, src));
                if (NR == 32) _mm512_store_ps(d + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        } else {  // B stored (N, K)
            for (int j = 0; j < NR; j++)
                pack_strided(dst + j, NR, j < nr ? B + (int64_t)(j0 + p + j) * ldb + k0 : NULL, kc);
        }
        dst += (int64_t)kc * NR;
    }
}

// Writes tile row r: C = alpha * acc + beta * C over the columns in mask m.
AVX512 static inline void store_row(float *c, __m512 acc, __mmask16 m, float alpha, float beta) {
    __m512 v = alpha == 1.0f ? acc : _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
    if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c), v);
    if (m == 0xffff)
        _mm512_storeu_ps(c, v);
    else
        _mm512_mask_storeu_ps(c, m, v);
}

// The MR x (16 * NV) micro-kernel: C tile (mr x nr of it) = alpha * a @ b + beta * C.
#define MICRO_KERNEL(NAME, MR, NV)                                                            \
    AVX512 static void NAME(int kc, const float *a, const float *b, float *c, int ldc, int mr, \
                            int nr, float alpha, float beta) {                                \
        __m512 acc[MR][NV];                                                                   \
        _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++)                                 \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(); \
        for (int k = 0; k < kc; k++) {                                                        \
            __m512 bv[NV];                                                                    \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v); \
            _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++) {                           \
                const __m512 av = _mm512_set1_ps(a[r]);                                       \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                          \
                    acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);                        \
            }                                                                                 \
            a += MR, b += 16 * NV;                                                            \
        }                                                                                     \
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) {                                \
            const int left = nr - 16 * v;                                                     \
            if (left <= 0) break;                                                             \
            const __mmask16 m = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);          \
            for (int r = 0; r < mr; r++)                                                      \
                store_row(c + (int64_t)r * ldc + 16 * v, acc[r][v], m, alpha, beta);          \
        }                                                                                     \
    }

MICRO_KERNEL(kernel_12x32, 12, 2)
MICRO_KERNEL(kernel_8x32, 8, 2)
MICRO_KERNEL(kernel_24x16, 24, 1)

size_t gemm_avx512_scratch_bytes(void) { return ((size_t)MC * KC + (size_t)KC * NC) * sizeof(float); }

// libgcc reads the CPU's features in a constructor: the test is a load, safe from any thread.
bool gemm_avx512_available(void) { return __builtin_cpu_supports("avx512f") != 0; }

AVX512 int gemm_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 0;
    float *const pack_a = pack_buffers();
    if (!pack_a) return -1;
    float *const pack_b = pack_a + (size_t)MC * KC;  // 64-byte aligned, as MC * KC * 4 bytes
    // 12 x 32 tiles, or 8 x 32 where they pad fewer rows (a weight gradient's 16, 32 or 64
    // filters: 12 rows a tile would multiply 11-50% zeros).
    const bool narrow = N <= 16;
    const int MR = narrow ? 24 : (M + 7) / 8 * 8 < (M + 11) / 12 * 12 ? 8 : 12, NR = narrow ? 16 : 32;
    if (K <= 0) {  // C = beta * C
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float *c = C + (int64_t)i * ldc + j;
                *c = beta == 0.0f ? 0.0f : beta * *c;
            }
        return 0;
    }
    for (int j0 = 0; j0 < N; j0 += NC) {
        const int nc = imin(NC, N - j0);
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = imin(KC, K - k0);
            const float b_beta = k0 == 0 ? beta : 1.0f;  // later k-blocks add to C
            pack_b_block(pack_b, B, ldb, tb, k0, kc, j0, nc, NR);
            for (int i0 = 0; i0 < M; i0 += MC) {
                const int mc = imin(MC, M - i0);
                pack_a_block(pack_a, A, lda, ta, i0, mc, k0, kc, MR);
                for (int jr = 0; jr < nc; jr += NR) {
                    const float *bp = pack_b + (int64_t)(jr / NR) * kc * NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        const float *ap = pack_a + (int64_t)(ir / MR) * kc * MR;
                        float *c = C + (int64_t)(i0 + ir) * ldc + j0 + jr;
                        const int mr = imin(MR, mc - ir), nr = imin(NR, nc - jr);
                        if (narrow)
                            kernel_24x16(kc, ap, bp, c, ldc, mr, nr, alpha, b_beta);
                        else if (MR == 8)
                            kernel_8x32(kc, ap, bp, c, ldc, mr, nr, alpha, b_beta);
                        else
                            kernel_12x32(kc, ap, bp, c, ldc, mr, nr, alpha, b_beta);
                    }
                }
            }
        }
    }
    return 0;
}
