// gemm_avx512.h: the project's own SGEMM for CPUs with AVX-512 (nn/gemm_avx512.c).
//
// OpenBLAS picks its kernels for the CPU when it loads, and the environment can pin them
// (OPENBLAS_CORETYPE=Haswell runs its AVX2 kernels on an AVX-512 CPU, at half the peak).
// cpu_gemm uses this one where the CPU has AVX-512, OpenBLAS elsewhere (bench/PROFILE.md
// measures the two). Row-major, single-threaded: cpu_gemm cuts the threads' slabs.
#ifndef NN_GEMM_AVX512_H
#define NN_GEMM_AVX512_H

#include <stdbool.h>
#include <stddef.h>

// Whether this CPU runs gemm_avx512 (and cpu_avx512_allowed: not under CNN_CPU_KERNELS=avx2).
bool gemm_avx512_available(void);

// Bytes of the packing buffers that each thread allocates at its first product and keeps
// (1.02 MB: a 1 MB block of B and the edge rows of A); 0 off x86-64.
#define GEMM_THREAD_BUFFER_BYTES (((size_t)24 * 256 + (size_t)256 * 1024) * sizeof(float))
size_t gemm_avx512_scratch_bytes(void);

// This thread's packing buffer, GEMM_THREAD_BUFFER_BYTES long and 64-byte aligned,
// allocated at its first call and freed when the thread ends (a thread-specific value with
// a destructor: OpenMP's threads come and go with the thread count). nn/gemm_bf16.c packs
// into it too: a product runs on one of the two. NULL when it cannot be allocated.
void *gemm_thread_buffer(void);

// C (M, N; row stride ldc) = alpha * op(A) @ op(B) + beta * C, as cblas_sgemm with
// CblasRowMajor: op(A) is (M, K), stored (K, M) when ta; op(B) is (K, N), stored (N, K)
// when tb. Returns -1 when this thread's packing buffers cannot be allocated.
int gemm_avx512(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);

#endif
