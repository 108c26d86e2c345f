// gemm_avx512.c: the project's own single-threaded SGEMM for CPUs with AVX-512 (see
// gemm_avx512.h). Its functions alone are compiled for AVX-512 (AVX512 below, whatever the
// build's -march); cpu_gemm calls them only where the CPU has AVX-512, so the binaries
// still run on AVX2 machines.
//
// Goto's blocking, half of it: a KC x NC block of op(B) is packed into panels of NR
// columns, and a micro-kernel multiplies MR rows of op(A), read in place (a broadcast from
// each row, the rows a stride apart), by one B panel into an MR x NR tile of C held in
// registers (MR x NR / 16 of the 32 zmm registers); A is walked in blocks of MC rows,
// which stay in L2 across the B panels. Only the last rows, short of a tile, are packed,
// with zero rows. Packing A as well (the textbook's panels) cost more than it saved:
// one thread, GFLOP/s, packed -> in place: 490 x 32 over K = 32 (a Winograd product)
// 166-175 -> 223-240, 12544 x 32 over K = 288 (deep.cfg's im2col forward) 106-137 ->
// 215-222, 1568 x 512 over 4608 (ResNet-18's widest) 200-206 -> 211-215, 32 x 32 over K =
// 490 transposed (a Winograd weight gradient) 170-172 -> 214-218. Three tile shapes:
// 12 x 32; 8 x 32 where it pads fewer rows; and 24 x 16 for products with at most 16
// columns (a ResNet's 16-channel layers), where the wide tile would multiply zeros half
// the time. Edges are padded with zeros in the packed panels and masked when C is
// written. Each element of C sums its K products in k order, in blocks of KC added to
// C, whatever the tile or the slab of rows or columns it lies in.
#include "gemm_avx512.h"
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

#define KC 256   // k-block: an A panel (MR x KC) and a B panel (KC x NR) stay in L1/L2
#define MC 144   // rows of A a block (a multiple of every MR): 144 KB at KC, in L2
#define MR_MAX 24  // the tallest tile: the edge panel of A packed
#define NC 1024  // columns of B packed at a time, KC x NC x 4 = 1 MB (L2); 4096 was no faster

// The packing buffers of each thread: MR_MAX x KC floats for A's edge, then KC x NC for B.
_Static_assert(((size_t)MR_MAX * KC + (size_t)KC * NC) * sizeof(float) == GEMM_THREAD_BUFFER_BYTES,
               "gemm_avx512.h's GEMM_THREAD_BUFFER_BYTES is this file's blocking");
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static void pack_key_make(void) { pthread_key_create(&pack_key, free); }

void *gemm_thread_buffer(void) {
    pthread_once(&pack_once, pack_key_make);
    void *p = pthread_getspecific(pack_key);
    if (!p) {
        if (posix_memalign(&p, 64, GEMM_THREAD_BUFFER_BYTES)) return NULL;
        if (pthread_setspecific(pack_key, p)) {
            free(p);
            return NULL;
        }
    }
    return p;
}

#define AVX512 __attribute__((target("avx512f")))

static inline int imin(int a, int b) { return a < b ? a : b; }

// kc values of src (zeros for NULL: a row or column past the edge) to d[k * step]: one
// row of a panel.
static inline void pack_strided(float *d, int step, const float *src, int kc) {
    for (int k = 0; k < kc; k++) d[(int64_t)k * step] = src ? src[k] : 0.0f;
}

// op(A)(i, k) for the rows [i0, i0 + mr), mr < MR, the last of a product, and k [k0, k0 +
// kc) into one panel dst[k][r], zero rows past the edge (the full panels are read in place).
AVX512 static void pack_a_edge(float *dst, const float *A, int lda, bool ta, int i0, int mr, int k0,
                               int kc, int MR) {
    if (ta) {  // A stored (K, M): a k's rows lie together, a masked copy
        for (int k = 0; k < kc; k++) {
            const float *src = A + (int64_t)(k0 + k) * lda + i0;
            float *d = dst + (int64_t)k * MR;
            for (int r0 = 0; r0 < MR; r0 += 16) {
                const int left = mr - r0, width = imin(16, MR - r0);
                const __mmask16 lm = (__mmask16)(left >= 16 ? 0xffff : left > 0 ? (1u << left) - 1 : 0);
                const __mmask16 sm = (__mmask16)(width >= 16 ? 0xffff : (1u << width) - 1);
                _mm512_mask_storeu_ps(d + r0, sm, _mm512_maskz_loadu_ps(lm, src + r0));
            }
        }
        return;
    }
    for (int r = 0; r < MR; r++)  // A stored (M, K): a row's k lie together
        pack_strided(dst + r, MR, r < mr ? A + (int64_t)(i0 + r) * lda + k0 : NULL, kc);
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
// a(r, k) at a[r * ars + k * aks]: a packed panel (ars = 1, aks = MR), or rows of A read in
// place (ars = lda, aks = 1).
#define MICRO_KERNEL(NAME, MR, NV)                                                            \
    AVX512 static void NAME(int kc, const float *a, int ars, int aks, const float *b, float *c, \
                            int ldc, int mr, int nr, float alpha, float beta) {               \
        __m512 acc[MR][NV];                                                                   \
        _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++)                                 \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(); \
        for (int k = 0; k < kc; k++) {                                                        \
            __m512 bv[NV];                                                                    \
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v); \
            _Pragma("GCC unroll 24") for (int r = 0; r < MR; r++) {                           \
                const __m512 av = _mm512_set1_ps(a[(int64_t)r * ars]);                        \
                _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)                          \
                    acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);                        \
            }                                                                                 \
            a += aks, b += 16 * NV;                                                           \
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

size_t gemm_avx512_scratch_bytes(void) { return GEMM_THREAD_BUFFER_BYTES; }

// libgcc reads the CPU's features in a constructor: the test is a load, safe from any thread.
bool gemm_avx512_available(void) { return cpu_avx512_allowed() && __builtin_cpu_supports("avx512f") != 0; }

AVX512 int gemm_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 0;
    float *const pack_a = gemm_thread_buffer();
    if (!pack_a) return -1;
    float *const pack_b = pack_a + (size_t)MR_MAX * KC;  // 64-byte aligned, as MR_MAX * KC * 4 bytes
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
                const int packed_from = mc / MR * MR;  // the rows of full tiles, read in place
                if (packed_from < mc)
                    pack_a_edge(pack_a, A, lda, ta, i0 + packed_from, mc - packed_from, k0, kc, MR);
                for (int jr = 0; jr < nc; jr += NR) {
                    const float *bp = pack_b + (int64_t)(jr / NR) * kc * NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        const bool direct = ir < packed_from;
                        const float *ap = !direct ? pack_a
                                          : ta ? A + (int64_t)k0 * lda + i0 + ir
                                               : A + (int64_t)(i0 + ir) * lda + k0;
                        const int ars = !direct ? 1 : ta ? 1 : lda, aks = !direct ? MR : ta ? lda : 1;
                        float *c = C + (int64_t)(i0 + ir) * ldc + j0 + jr;
                        const int mr = imin(MR, mc - ir), nr = imin(NR, nc - jr);
                        if (narrow)
                            kernel_24x16(kc, ap, ars, aks, bp, c, ldc, mr, nr, alpha, b_beta);
                        else if (MR == 8)
                            kernel_8x32(kc, ap, ars, aks, bp, c, ldc, mr, nr, alpha, b_beta);
                        else
                            kernel_12x32(kc, ap, ars, aks, bp, c, ldc, mr, nr, alpha, b_beta);
                    }
                }
            }
        }
    }
    return 0;
}

#else  // not x86-64 (arm64): no AVX-512, OpenBLAS for every product

bool gemm_avx512_available(void) { return false; }
size_t gemm_avx512_scratch_bytes(void) { return 0; }
void *gemm_thread_buffer(void) { return NULL; }
int gemm_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
    return -1;
}

#endif
