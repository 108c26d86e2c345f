// cuda_kernels.cu: the kernel table of nn/kernels.h in CUDA (DESIGN.md decision 1).
//
// The second implementation of the table that nn/cpu_kernels.c implements on OpenBLAS;
// layers and the network are the same code on both. GEMMs go through cuBLAS, the rest are
// the project's own kernels. tests/test_gpu.c checks every entry against the CPU table.
//
// Contracts, beyond nn/kernels.h:
//   - One stream for everything (created by cuda_kernels() on first use); the cuBLAS
//     handle is bound to it, so the table's calls run in the order they are made.
//   - upload returns when the host buffer may be reused, without waiting for the stream
//     (it copies through page-locked staging: cuda_upload); download returns when the
//     data is on the host (it waits for the stream); sync waits for the stream. A
//     training step waits for nothing: the loss scaler's decisions stay on the GPU too.
//   - Every CUDA and cuBLAS call is checked: kernels cannot return errors through the
//     table, so a failure prints "cuda error at FILE:LINE: <reason>" and aborts. Only
//     alloc fails softly (NULL), because the network reports out-of-memory itself.
//   - Results match the CPU bit for bit wherever the CPU's arithmetic can be replayed in
//     the same order: im2col, col2im (each pixel sums its patches in the CPU's order),
//     the direct convolution (the CPU's sums in its order, block sums included), the grouped
//     convolution (its forward, input gradient and row-summed weight gradient),
//     bias + activation, ReLU, maxpool (first maximum, argmax), dropout (the counter RNG of
//     nn/rng.h), layout permutes, the NLL gradient, fp16 conversion (nn/half.h's bits,
//     NaN payloads included; a NaN that arithmetic makes has the hardware's payload, which
//     differs from the CPU's), the byte input's table lookup (u8_to_f32), unscale_check, the loss scaler, Adadelta, SGD and AdamW (explicit _rn intrinsics, so that
//     nvcc does not contract a*b+c into an FMA; gcc -std=c11 does not either), the
//     pooling layers, add_act and batchnorm's per-element arithmetic and statistics. GEMM,
//     bias_act_backward's sums, batchnorm's sums (double) and the log-softmax/NLL sums
//     differ by rounding only.
//   - Reductions are deterministic: a fixed launch shape and a fixed summation tree, no
//     atomics, so the same inputs give the same bits run after run on one GPU (the column
//     sums' slabs depend on the shape alone: on every GPU).
//   - GEMMs are plain fp32 (CUBLAS_DEFAULT_MATH), TF32 on tensor cores under
//     gemm_arith(GEMM_TF32) (CUBLAS_TF32_TENSOR_OP_MATH: precision = fp16, matmul = tf32), or
//     bf16 on tensor cores under GEMM_BF16 (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_16BF).
//   - The per-element work of every kernel is a __host__ __device__ function of the element
//     index, so that a host build can replay the kernels element by element against the
//     CPU table where no GPU is available; the kernels are grid-stride loops around them.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../nn/kernels.h"
#include "../nn/rng.h"
}

// ---- error checks ------------------------------------------------------------------------

#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__)
// After a kernel launch: launch errors (bad configuration, no kernel image for this GPU).
// Errors while a kernel runs (an illegal address) surface at the next synchronising call
// (download, sync) with that call's line; run with CUDA_LAUNCH_BLOCKING=1 to have them
// reported at the launch that caused them.
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "cuda error at %s:%d: %s\n", file, line, cudaGetErrorString(e));
    fflush(stderr);
    abort();
}

static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "cuda error at %s:%d: cuBLAS: %s\n", file, line, cublasGetStatusString(s));
    fflush(stderr);
    abort();
}

// ---- state ---------------------------------------------------------------------------------

// A page-locked staging buffer of cuda_upload, and the event of its last copy.
#define STAGES 4
typedef struct Stage {
    void *host;
    size_t bytes;
    cudaEvent_t done;
} Stage;

static struct {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace;  // CUBLAS_WORKSPACE_BYTES, ours: allocated before used_at_init
    void *slab_scratch;    // SLAB_SCRATCH_BYTES: the column sums' slabs (bias, batchnorm)
    size_t used_at_init;   // the device's memory in use once set up (device_memory's baseline)
    GemmArith arith;  // gemm_arith's setting: TF32 is the handle's math mode, BF16 cublasGemmEx's
    int sms;  // multiprocessors: caps grid-stride grids
    Stage stage[STAGES];  // cuda_upload's
    int next_stage;
} g;

// cuBLAS's workspace, given to it at set-up so that it never allocates one later (32 MiB:
// NVIDIA's recommendation for Hopper; more than the 4 MiB older GPUs need).
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

#define THREADS 256

// Blocks for a grid-stride loop over n items: enough to fill the GPU, no more.
static unsigned blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS, cap = (int64_t)g.sms * 32;
    if (b > cap) b = cap;
    return b < 1 ? 1u : (unsigned)b;
}

// Grid-stride loop with 64-bit indices: sizes may exceed 2^31.
#define GRID_LOOP(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);             \
         i += (int64_t)gridDim.x * blockDim.x)

// ---- memory ----------------------------------------------------------------------------------

static void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    // cudaMalloc(0) may give NULL, which the caller would take for a failure.
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it so later checks do not see it
        return NULL;
    }
    return p;
}

static void cuda_release(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

// Uploads go through page-locked staging buffers, so that the host never waits for the
// stream: a copy from pageable memory may wait for everything queued before it (CUDA
// says it "might be" synchronous), which would stall the host at every batch until the
// previous step had finished. The host copies into the next of STAGES buffers and queues
// the copy to the device; a buffer is reused once its last copy is done (its event), STAGES
// uploads later: a batch's input and labels take two, so the wait is for the copies of the
// step before last, long done. A buffer grows to the largest upload it has taken (the
// batch, in host memory beside the loader's); larger uploads than STAGE_MAX_BYTES (weights
// at the start) are copied directly and waited for.
#define STAGE_MAX_BYTES ((size_t)256 << 20)

static void cuda_upload(void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    Stage *st = &g.stage[g.next_stage];
    if (bytes <= STAGE_MAX_BYTES) {
        if (!st->done) CUDA_CHECK(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventSynchronize(st->done));  // its last copy (none yet: returns at once)
        if (st->bytes < bytes) {
            if (st->host) CUDA_CHECK(cudaFreeHost(st->host));
            st->host = NULL, st->bytes = 0;
            if (cudaHostAlloc(&st->host, bytes, cudaHostAllocDefault) == cudaSuccess) st->bytes = bytes;
            else (void)cudaGetLastError(), st->host = NULL;  // no page-locked memory: copy directly
        }
    }
    if (bytes > st->bytes) {
        CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, g.stream));
        CUDA_CHECK(cudaStreamSynchronize(g.stream));  // the caller may reuse its buffer at once
        return;
    }
    memcpy(st->host, host_src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, st->host, bytes, cudaMemcpyHostToDevice, g.stream));
    CUDA_CHECK(cudaEventRecord(st->done, g.stream));
    g.next_stage = (g.next_stage + 1) % STAGES;
}

static void cuda_download(void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, g.stream));
    CUDA_CHECK(cudaStreamSynchronize(g.stream));
}

static void cuda_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g.stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
}

static void cuda_sync(void) { CUDA_CHECK(cudaStreamSynchronize(g.stream)); }

static void cuda_device_memory(size_t *avail, size_t *taken, size_t *baseline) {
    size_t total = 0;
    CUDA_CHECK(cudaMemGetInfo(avail, &total));
    const size_t used = total - *avail;
    *taken = used > g.used_at_init ? used - g.used_at_init : 0;
    *baseline = g.used_at_init;
}

// ---- dense algebra -------------------------------------------------------------------------

// cuBLAS is column-major. A row-major (r, c) matrix with leading dimension c is the
// column-major (c, r) matrix of its transpose, so the row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T: swap the operands and the dimensions M and N, keep
// each operand's own transpose flag and the row-major leading dimensions.
struct ColumnMajorGemm {
    cublasOperation_t op1, op2;  // of the first and second cuBLAS operands
    int m, n, k;
    const float *a1, *a2;  // the first and second cuBLAS operands
    int ld1, ld2;
    float *c;
    int ldc;
};

static ColumnMajorGemm gemm_for_cublas(float *C, const float *A, const float *B, int M, int N,
                                       int K, bool transA, bool transB) {
    const int lda = transA ? M : K, ldb = transB ? K : N;
    ColumnMajorGemm g;
    g.op1 = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.op2 = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.m = N, g.n = M, g.k = K;
    g.a1 = B, g.ld1 = ldb > 1 ? ldb : 1;  // cuBLAS wants leading dimensions >= 1 even
    g.a2 = A, g.ld2 = lda > 1 ? lda : 1;  // when K == 0
    g.c = C, g.ldc = N;
    return g;
}

static void cuda_gemm(float *C, const float *A, const float *B, int M, int N, int K,
                      bool transA, bool transB, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    const ColumnMajorGemm c = gemm_for_cublas(C, A, B, M, N, K, transA, transB);
    if (g.arith == GEMM_BF16)
        CUBLAS_CHECK(cublasGemmEx(g.blas, c.op1, c.op2, c.m, c.n, c.k, &alpha, c.a1, CUDA_R_32F, c.ld1,
                                  c.a2, CUDA_R_32F, c.ld2, &beta, c.c, CUDA_R_32F, c.ldc,
                                  CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasSgemm(g.blas, c.op1, c.op2, c.m, c.n, c.k, &alpha, c.a1, c.ld1, c.a2,
                                 c.ld2, &beta, c.c, c.ldc));
}

static void cuda_gemm_arith(GemmArith arith) {
    if (arith == g.arith) return;
    CUBLAS_CHECK(cublasSetMathMode(g.blas, arith == GEMM_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    g.arith = arith;
}

static void cuda_gemm_batched(float *C, const float *A, const float *B, int count, int M, int N, int K,
                              bool transA, bool transB, float alpha, float beta, int64_t stride_c,
                              int64_t stride_a, int64_t stride_b) {
    if (M <= 0 || N <= 0 || count <= 0) return;
    const ColumnMajorGemm c = gemm_for_cublas(C, A, B, M, N, K, transA, transB);
    if (g.arith == GEMM_BF16)
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(g.blas, c.op1, c.op2, c.m, c.n, c.k, &alpha, c.a1, CUDA_R_32F,
                                                c.ld1, stride_b, c.a2, CUDA_R_32F, c.ld2, stride_a, &beta,
                                                c.c, CUDA_R_32F, c.ldc, stride_c, count,
                                                CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasSgemmStridedBatched(g.blas, c.op1, c.op2, c.m, c.n, c.k, &alpha, c.a1, c.ld1,
                                               stride_b, c.a2, c.ld2, stride_a, &beta, c.c, c.ldc,
                                               stride_c, count));
}

// ---- per-element bodies ------------------------------------------------------------------
//
// Each kernel below is a grid-stride loop around one of these functions of the element
// index (see the contracts at the top for why they are __host__ __device__).

// Explicitly rounded operations: nvcc would otherwise contract a*b+c into an FMA, which
// the CPU build (gcc -std=c11: -ffp-contract=off) does not do.
__host__ __device__ static inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ static inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
__host__ __device__ static inline float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
__host__ __device__ static inline float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
__host__ __device__ static inline float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}

// The same for doubles (batchnorm's statistics).
__host__ __device__ static inline double dmul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ static inline double dadd_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

// The geometry of a convolution or pooling window over (N, H, W, C) images.
struct Window {
    int H, W, C, K, stride, pad, OH, OW;
};

// col element i = (row (n, oh, ow), column (kh, kw, c)); zero outside the image.
__host__ __device__ static inline void im2col_at(int64_t i, float *col, const float *in, Window w) {
    const int64_t kc = (int64_t)w.K * w.C, ckk = w.K * kc;
    const int64_t r = i / ckk, j = i - r * ckk;
    const int kh = (int)(j / kc), kw = (int)((j - kh * kc) / w.C), c = (int)(j % w.C);
    const int ow = (int)(r % w.OW), oh = (int)(r / w.OW % w.OH);
    const int64_t n = r / ((int64_t)w.OW * w.OH);
    const int ih = oh * w.stride - w.pad + kh, iw = ow * w.stride - w.pad + kw;
    col[i] = ih >= 0 && ih < w.H && iw >= 0 && iw < w.W
                 ? in[((n * w.H + ih) * w.W + iw) * w.C + c]
                 : 0.0f;
}

// din element i = (n, ih, iw, c): the sum of the col entries of the patches that hold
// this pixel, in the CPU's order (oh, then ow, ascending) from 0: the CPU's bits, and no
// atomics.
__host__ __device__ static inline void col2im_at(int64_t i, float *din, const float *col, Window w) {
    const int64_t ckk = (int64_t)w.C * w.K * w.K;
    const int c = (int)(i % w.C);
    const int64_t t = i / w.C;
    const int iw = (int)(t % w.W), ih = (int)(t / w.W % w.H);
    const int64_t n = t / ((int64_t)w.W * w.H);
    const int y = ih + w.pad, x = iw + w.pad;  // in padded coordinates
    const int oh0 = first_window(y, w.K, w.stride), oh1 = last_window(y, w.stride, w.OH);
    const int ow0 = first_window(x, w.K, w.stride), ow1 = last_window(x, w.stride, w.OW);
    float acc = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++) {
        const int kh = y - oh * w.stride;
        for (int ow = ow0; ow <= ow1; ow++) {
            const int kw = x - ow * w.stride;
            acc += col[((n * w.OH + oh) * w.OW + ow) * ckk + ((int64_t)kh * w.K + kw) * w.C + c];
        }
    }
    din[i] = acc;
}

// ---- direct convolution: the CPU's sums, in the CPU's order ----

// Element t, in (c, kh, kw) order, of the patch of output pixel r; zero outside the image.
__host__ __device__ static inline float conv_direct_tap(const float *in, int64_t r, int t,
                                                        ConvGeometry g) {
    const int kw = t % g.K, kh = t / g.K % g.K, c = t / (g.K * g.K);
    const int ow = (int)(r % g.OW), oh = (int)(r / g.OW % g.OH);
    const int64_t n = r / ((int64_t)g.OW * g.OH);
    const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
    return ih >= 0 && ih < g.H && iw >= 0 && iw < g.W ? in[((n * g.H + ih) * g.W + iw) * g.C + c]
                                                      : 0.0f;
}

// dout * act'(out) at element e of the output.
__host__ __device__ static inline float conv_direct_dy(const float *dout, const float *out,
                                                       int64_t e, Activation act) {
    return act == ACT_NONE || act_passes(act, out[e]) ? dout[e] : 0.0f;  // out NULL: none
}

// out element i = (pixel r, oc): act(bias + the sum over the patch of in * w).
__host__ __device__ static inline void conv_direct_forward_at(int64_t i, float *out, const float *in,
                                                              const float *w, const float *bias,
                                                              ConvGeometry g, Activation act) {
    const int taps = g.C * g.K * g.K, oc = (int)(i % g.OC);
    const int64_t r = i / g.OC;
    float a = bias ? bias[oc] : 0.0f;
    for (int t = 0; t < taps; t++) a = add_rn(a, mul_rn(conv_direct_tap(in, r, t, g), w[oc * taps + t]));
    out[i] = act_apply(act, a);
}

// partial element j = (block b, t, oc), t = taps standing for the bias: the sum over the
// block's output pixels, in order, of dy (times the patch's element t).
__host__ __device__ static inline void conv_direct_partial_at(int64_t j, float *partial,
                                                              const float *dout, const float *in,
                                                              const float *out, ConvGeometry g,
                                                              Activation act) {
    const int taps = g.C * g.K * g.K;
    const int64_t part_floats = (int64_t)(taps + 1) * g.OC, e = j % part_floats;
    const int64_t b = j / part_floats;
    const int t = (int)(e / g.OC), oc = (int)(e % g.OC);
    const int64_t rows = (int64_t)g.N * g.OH * g.OW, parts = conv_direct_parts(g), per = (rows + parts - 1) / parts;
    const int64_t r0 = b * per < rows ? b * per : rows, r1 = r0 + per < rows ? r0 + per : rows;
    float a = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float dy = conv_direct_dy(dout, out, r * g.OC + oc, act);
        a = add_rn(a, t < taps ? mul_rn(conv_direct_tap(in, r, t, g), dy) : dy);
    }
    partial[j] = a;
}

// (t, oc) element e of a block: the blocks' sums added in block order into dw or dbias.
__host__ __device__ static inline void conv_direct_reduce_at(int64_t e, float *dw, float *dbias,
                                                             const float *partial, ConvGeometry g) {
    const int taps = g.C * g.K * g.K, t = (int)(e / g.OC), oc = (int)(e % g.OC);
    const int64_t part_floats = (int64_t)(taps + 1) * g.OC;
    float sum = 0.0f;
    for (int64_t b = 0, parts = conv_direct_parts(g); b < parts; b++) sum = add_rn(sum, partial[b * part_floats + e]);
    if (t < taps) dw[oc * taps + t] = add_rn(dw[oc * taps + t], sum);
    else if (dbias) dbias[oc] = add_rn(dbias[oc], sum);
}

// din element i = (n, ih, iw, c): what its windows send back, over (kh, kw) then oc.
__host__ __device__ static inline void conv_direct_din_at(int64_t i, float *din, const float *dout,
                                                          const float *out, const float *w,
                                                          ConvGeometry g, Activation act) {
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
            const int64_t o = ((n * g.OH + oh) * g.OW + ow) * g.OC;
            for (int oc = 0; oc < g.OC; oc++)
                acc = add_rn(acc, mul_rn(conv_direct_dy(dout, out, o + oc, act),
                                         w[((oc * g.C + c) * g.K + kh) * g.K + kw]));
        }
    }
    din[i] = acc;
}

// ---- grouped convolution: the CPU's sums, in the CPU's order ----

// The taps [*a, *b) of output position o that lie inside [0, H).
__host__ __device__ static inline void grouped_taps(int o, int stride, int pad, int K, int H, int *a, int *b) {
    const int i0 = o * stride - pad;
    *a = i0 < 0 ? -i0 : 0;
    *b = H - i0 < K ? H - i0 : K;
}

// out element i = (pixel r, oc): act(bias + the sum over (ci, kh, kw) inside the image of
// in * w).
__host__ __device__ static inline void conv_grouped_forward_at(int64_t i, float *out, const float *in,
                                                               const float *w, const float *bias,
                                                               ConvGeometry g, int groups, Activation act) {
    const int Cg = g.C / groups, Mg = g.OC / groups, oc = (int)(i % g.OC), cin = oc / Mg * Cg;
    const int64_t r = i / g.OC;
    const int ow = (int)(r % g.OW), oh = (int)(r / g.OW % g.OH);
    const int64_t n = r / ((int64_t)g.OW * g.OH);
    int kh0, kh1, kw0, kw1;
    grouped_taps(oh, g.stride, g.pad, g.K, g.H, &kh0, &kh1);
    grouped_taps(ow, g.stride, g.pad, g.K, g.W, &kw0, &kw1);
    float a = bias ? bias[oc] : 0.0f;
    for (int ci = 0; ci < Cg; ci++)
        for (int kh = kh0; kh < kh1; kh++)
            for (int kw = kw0; kw < kw1; kw++) {
                const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
                a = add_rn(a, mul_rn(in[((n * g.H + ih) * g.W + iw) * g.C + cin + ci],
                                     w[(((int64_t)oc * Cg + ci) * g.K + kh) * g.K + kw]));
            }
    out[i] = act_apply(act, a);
}

// din element i = (n, ih, iw, c): over (kh, kw), then the group's output channels, dy * w.
__host__ __device__ static inline void conv_grouped_din_at(int64_t i, float *din, const float *dy,
                                                           const float *w, ConvGeometry g, int groups) {
    const int Cg = g.C / groups, Mg = g.OC / groups, c = (int)(i % g.C), oc0 = c / Cg * Mg, ci = c % Cg;
    const int64_t q = i / g.C;
    const int iw = (int)(q % g.W), ih = (int)(q / g.W % g.H);
    const int64_t n = q / ((int64_t)g.W * g.H);
    float a = 0.0f;
    for (int kh = 0; kh < g.K; kh++) {
        const int y = ih + g.pad - kh;
        if (y < 0 || y % g.stride || y / g.stride >= g.OH) continue;
        for (int kw = 0; kw < g.K; kw++) {
            const int x = iw + g.pad - kw;
            if (x < 0 || x % g.stride || x / g.stride >= g.OW) continue;
            const int64_t o = ((n * g.OH + y / g.stride) * g.OW + x / g.stride) * g.OC;
            for (int m = 0; m < Mg; m++)
                a = add_rn(a, mul_rn(dy[o + oc0 + m], w[(((int64_t)(oc0 + m) * Cg + ci) * g.K + kh) * g.K + kw]));
        }
    }
    din[i] = a;
}

// scratch element j = (output row r = (n, oh), weight element e = (oc, ci, kh, kw)): the
// row's sum over ow, from 0, of dy x the tap (those inside the image).
__host__ __device__ static inline void conv_grouped_rows_at(int64_t j, float *scratch, const float *dy,
                                                            const float *in, ConvGeometry g, int groups) {
    const int Cg = g.C / groups, Mg = g.OC / groups, KK = g.K * g.K;
    const int64_t E = (int64_t)g.OC * Cg * KK, e = j % E, r = j / E;
    const int kw = (int)(e % g.K), kh = (int)(e / g.K % g.K), ci = (int)(e / KK % Cg);
    const int oc = (int)(e / ((int64_t)KK * Cg)), oh = (int)(r % g.OH);
    const int64_t n = r / g.OH;
    const int ih = oh * g.stride - g.pad + kh;
    float a = 0.0f;
    if (ih >= 0 && ih < g.H)
        for (int ow = 0; ow < g.OW; ow++) {
            const int iw = ow * g.stride - g.pad + kw;
            if (iw < 0 || iw >= g.W) continue;
            a = add_rn(a, mul_rn(dy[(r * g.OW + ow) * g.OC + oc],
                                 in[((n * g.H + ih) * g.W + iw) * g.C + oc / Mg * Cg + ci]));
        }
    scratch[j] = a;
}

// dw element e += the rows' sums, in row order from 0.
__host__ __device__ static inline void conv_grouped_reduce_at(int64_t e, float *dw, const float *scratch,
                                                              int64_t rows, int64_t E) {
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s = add_rn(s, scratch[r * E + e]);
    dw[e] = add_rn(dw[e], s);
}

__host__ __device__ static inline void bias_act_at(int64_t i, float *out, const float *bias,
                                                   int cols, Activation act) {
    float v = out[i];
    if (bias) v += bias[i % cols];
    out[i] = act_apply(act, v);
}

// din = act_passes(y) ? dout : 0, where y is the activation's output (din may be dout).
__host__ __device__ static inline void relu_backward_at(int64_t i, float *din, const float *dout,
                                                        const float *y, Activation act) {
    din[i] = act_passes(act, y[i]) ? dout[i] : 0.0f;
}

// add_parts: the parts in order, then onto dst (the CPU's order).
__host__ __device__ static inline void add_parts_at(int64_t i, float *dst, const float *parts, int count,
                                                    int64_t stride) {
    float sum = parts[i];
    for (int p = 1; p < count; p++) sum += parts[p * stride + i];
    dst[i] += sum;
}

__host__ __device__ static inline void relu_forward_at(int64_t i, float *out, const float *in,
                                                       Activation act) {
    out[i] = act_apply(act, in[i]);
}

// The rows [*a, *b) of window o inside the image (padding excluded), as the CPU has them.
__host__ __device__ static inline void window_range(int o, int stride, int pad, int K, int H, int *a,
                                                    int *b) {
    const int lo = o * stride - pad;
    *a = lo < 0 ? 0 : lo;
    *b = lo + K < H ? lo + K : H;
}

// out element i = (n, oh, ow, c) and its argmax (kh * K + kw from the padded window's
// corner): the first maximum, or the last NaN, as on the CPU; padding never wins.
__host__ __device__ static inline void maxpool_forward_at(int64_t i, float *out, uint8_t *argmax,
                                                          const float *in, Window w) {
    const int c = (int)(i % w.C);
    const int64_t t = i / w.C;
    const int ow = (int)(t % w.OW), oh = (int)(t / w.OW % w.OH);
    const int64_t n = t / ((int64_t)w.OW * w.OH);
    int h0, h1, w0, w1;
    window_range(oh, w.stride, w.pad, w.K, w.H, &h0, &h1);
    window_range(ow, w.stride, w.pad, w.K, w.W, &w0, &w1);
    const int top = oh * w.stride - w.pad, left = ow * w.stride - w.pad;
    float m = -INFINITY;
    int a = (h0 - top) * w.K + w0 - left;  // a window of -inf alone: its first pixel inside
    for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) {
            const float v = in[((n * w.H + ih) * w.W + iw) * w.C + c];
            if (v > m || isnan(v)) m = v, a = (ih - top) * w.K + iw - left;
        }
    out[i] = m;
    argmax[i] = (uint8_t)a;
}

// din element i = (n, ih, iw, c): the sum, in the CPU's order from 0, of the output
// gradients of the windows that hold it and whose argmax it is.
__host__ __device__ static inline void maxpool_backward_at(int64_t i, float *din, const float *dout,
                                                           const uint8_t *argmax, Window w) {
    const int c = (int)(i % w.C);
    const int64_t t = i / w.C;
    const int iw = (int)(t % w.W), ih = (int)(t / w.W % w.H);
    const int64_t n = t / ((int64_t)w.W * w.H);
    const int y = ih + w.pad, x = iw + w.pad;  // in padded coordinates
    const int oh0 = first_window(y, w.K, w.stride), oh1 = last_window(y, w.stride, w.OH);
    const int ow0 = first_window(x, w.K, w.stride), ow1 = last_window(x, w.stride, w.OW);
    float acc = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++) {
            const int64_t o = ((n * w.OH + oh) * w.OW + ow) * w.C + c;
            if (argmax[o] == (y - oh * w.stride) * w.K + x - ow * w.stride) acc += dout[o];
        }
    din[i] = acc;
}

// out element i = (n, oh, ow, c): the window's pixels inside the image summed in order,
// divided by K * K (padding counts as zeros).
__host__ __device__ static inline void avgpool_forward_at(int64_t i, float *out, const float *in,
                                                          Window w) {
    const int c = (int)(i % w.C);
    const int64_t t = i / w.C;
    const int ow = (int)(t % w.OW), oh = (int)(t / w.OW % w.OH);
    const int64_t n = t / ((int64_t)w.OW * w.OH);
    int h0, h1, w0, w1;
    window_range(oh, w.stride, w.pad, w.K, w.H, &h0, &h1);
    window_range(ow, w.stride, w.pad, w.K, w.W, &w0, &w1);
    float acc = 0.0f;
    for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) acc = add_rn(acc, in[((n * w.H + ih) * w.W + iw) * w.C + c]);
    out[i] = div_rn(acc, (float)(w.K * w.K));
}

// din element i = (n, ih, iw, c): dout / (K * K) of each window that holds it, in (oh, ow)
// order from 0, as the CPU sums them.
__host__ __device__ static inline void avgpool_backward_at(int64_t i, float *din, const float *dout,
                                                           Window w) {
    const int c = (int)(i % w.C);
    const int64_t t = i / w.C;
    const int iw = (int)(t % w.W), ih = (int)(t / w.W % w.H);
    const int64_t n = t / ((int64_t)w.W * w.H);
    const int y = ih + w.pad, x = iw + w.pad;
    const int oh0 = first_window(y, w.K, w.stride), oh1 = last_window(y, w.stride, w.OH);
    const int ow0 = first_window(x, w.K, w.stride), ow1 = last_window(x, w.stride, w.OW);
    const float div = (float)(w.K * w.K);
    float acc = 0.0f;
    for (int oh = oh0; oh <= oh1; oh++)
        for (int ow = ow0; ow <= ow1; ow++)
            acc = add_rn(acc, div_rn(dout[((n * w.OH + oh) * w.OW + ow) * w.C + c], div));
    din[i] = acc;
}

// out element i = (n, c): the mean over the pixels, summed in order.
__host__ __device__ static inline void global_avgpool_forward_at(int64_t i, float *out,
                                                                 const float *in, int64_t HW, int C) {
    const int c = (int)(i % C);
    const int64_t n = i / C;
    float acc = 0.0f;
    for (int64_t p = 0; p < HW; p++) acc = add_rn(acc, in[(n * HW + p) * C + c]);
    out[i] = div_rn(acc, (float)HW);
}

__host__ __device__ static inline void global_avgpool_backward_at(int64_t i, float *din,
                                                                  const float *dout, int64_t HW,
                                                                  int C) {
    const int c = (int)(i % C);
    const int64_t n = i / C / HW;
    din[i] = div_rn(dout[n * C + c], (float)HW);
}

__host__ __device__ static inline void add_act_at(int64_t i, float *out, const float *a,
                                                  const float *b, Activation act) {
    out[i] = act_apply(act, add_rn(a[i], b[i]));
}

// ---- batchnorm: the CPU's per-element arithmetic; its sums in another fixed order ----

// What batchnorm's backward reads per channel: the statistics, gamma and beta; and where
// it reads its activation's mask from the forward's output, that output (else NULL).
struct BnChannels {
    const float *mean, *invstd, *gamma, *beta;
    const float *out;
};

// dy = dout * act'(z) at element e of channel c: act_passes(out) where s.out is given, else
// act_passes(z), z the forward's pre-activation recomputed from x exactly as bn_forward_at
// computes it.
__host__ __device__ static inline float bn_dy(const float *dout, const float *x, BnChannels s,
                                              int64_t e, int c, Activation act) {
    if (act == ACT_NONE) return dout[e];
    if (s.out) return act_passes(act, s.out[e]) ? dout[e] : 0.0f;
    const float z = add_rn(mul_rn(sub_rn(x[e], s.mean[c]), mul_rn(s.invstd[c], s.gamma[c])), s.beta[c]);
    return act_passes(act, z) ? dout[e] : 0.0f;
}

// Channel c's statistics from the sums, in double as the CPU computes them.
__host__ __device__ static inline void bn_batch_stats_at(int c, float *mean, float *invstd,
                                                         float *running_mean, float *running_var,
                                                         const double *acc, int C, int64_t count,
                                                         double eps, double momentum) {
    const double m = acc[c] / (double)count;
    double var = acc[C + c] / (double)count - dmul_rn(m, m);
    if (var < 0) var = 0;
    mean[c] = (float)m;
    invstd[c] = (float)(1.0 / sqrt(var + eps));
    running_mean[c] = (float)dadd_rn(dmul_rn(momentum, m), dmul_rn(1.0 - momentum, (double)running_mean[c]));
    if (count > 1)
        running_var[c] = (float)dadd_rn(dmul_rn(momentum, var * (double)count / (double)(count - 1)),
                                        dmul_rn(1.0 - momentum, (double)running_var[c]));
}

__host__ __device__ static inline void bn_eval_stats_at(int c, float *mean, float *invstd,
                                                        const float *running_mean,
                                                        const float *running_var, double eps) {
    mean[c] = running_mean[c];
    invstd[c] = (float)(1.0 / sqrt((double)running_var[c] + eps));
}

__host__ __device__ static inline void bn_forward_at(int64_t i, float *out, const float *x,
                                                     const float *mean, const float *invstd,
                                                     const float *gamma, const float *beta, int C,
                                                     Activation act) {
    const int c = (int)(i % C);
    const float v = add_rn(mul_rn(sub_rn(x[i], mean[c]), mul_rn(invstd[c], gamma[c])), beta[c]);
    out[i] = act_apply(act, v);
}

__host__ __device__ static inline void bn_backward_at(int64_t i, float *din, const float *dout,
                                                      const float *x, BnChannels s,
                                                      const double *acc, int C, int64_t count,
                                                      Activation act) {
    const int c = (int)(i % C);
    const float a = (float)(acc[c] / (double)count), b = (float)(acc[C + c] / (double)count);
    const float xhat = mul_rn(sub_rn(x[i], s.mean[c]), s.invstd[c]);
    din[i] = mul_rn(sub_rn(sub_rn(bn_dy(dout, x, s, i, c, act), a), mul_rn(xhat, b)),
                    mul_rn(s.gamma[c], s.invstd[c]));
}

__host__ __device__ static inline void bn_param_grads_at(int c, float *dgamma, float *dbeta,
                                                         const double *acc, int C) {
    dgamma[c] = add_rn(dgamma[c], (float)acc[C + c]);
    dbeta[c] = add_rn(dbeta[c], (float)acc[c]);
}

// scale is computed by the caller exactly as the CPU does: 1.0f / (1.0f - p).
__host__ __device__ static inline void dropout_at(int64_t i, float *out, const float *in, float p,
                                                  float scale, uint64_t key, uint64_t offset) {
    out[i] = rng_uniform(key, offset + (uint64_t)i) >= p ? mul_rn(in[i], scale) : 0.0f;
}

// out element i = (n, c, p) of (N, C, H*W) from (N, H*W, C), and the reverse.
__host__ __device__ static inline void nhwc_to_nchw_at(int64_t i, float *out, const float *in,
                                                       int64_t hw, int C) {
    const int64_t p = i % hw, nc = i / hw, n = nc / C;
    const int c = (int)(nc - n * C);
    out[i] = in[(n * hw + p) * C + c];
}
__host__ __device__ static inline void nchw_to_nhwc_at(int64_t i, float *out, const float *in,
                                                       int64_t hw, int C) {
    const int c = (int)(i % C);
    const int64_t np = i / C, n = np / hw, p = np - n * hw;
    out[i] = in[(n * C + c) * hw + p];
}

// One row per call, in the CPU's order and precision (a double sum of exponentials):
// rows are few (the batch) and short (the classes).
__host__ __device__ static inline void log_softmax_forward_row(int64_t n, float *out,
                                                               const float *in, int C) {
    const float *x = in + n * C;
    float *y = out + n * C;
    float m = -INFINITY;
    for (int c = 0; c < C; c++) m = x[c] > m ? x[c] : m;
    double s = 0.0;
    for (int c = 0; c < C; c++) s += exp((double)x[c] - m);
    const float lse = m + (float)log(s);
    for (int c = 0; c < C; c++) y[c] = x[c] - lse;
}

__host__ __device__ static inline void log_softmax_backward_row(int64_t n, float *din,
                                                                const float *dout,
                                                                const float *out, int C) {
    const float *dy = dout + n * C, *y = out + n * C;
    float *dx = din + n * C;
    double s = 0.0;
    for (int c = 0; c < C; c++) s += dy[c];
    for (int c = 0; c < C; c++) dx[c] = sub_rn(dy[c], mul_rn(expf(y[c]), (float)s));
}

// Row n's contribution to the metrics: its loss (added to *loss) and whether the first
// maximum is the label. A label outside [0, C) makes the loss NaN (the CPU would read
// out of bounds; the loaders check labels).
__host__ __device__ static inline void nll_row(int n, const float *logp, const int32_t *labels,
                                               int C, float smoothing, double *loss, int *correct) {
    const float *y = logp + (int64_t)n * C;
    int best = 0;
    for (int c = 1; c < C; c++)
        if (y[c] > y[best]) best = c;
    const int label = labels[n];
    if (label < 0 || label >= C) {
        *loss = NAN;
        return;
    }
    *correct += best == label;
    if (smoothing == 0.0f) {
        *loss -= y[label];
        return;
    }
    const double e = smoothing;
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum = dadd_rn(sum, (double)y[c]);
    *loss -= dadd_rn(dmul_rn(1.0 - e, (double)y[label]), dmul_rn(e / C, sum));
}

// Element i of the gradient: the target (on at the label, off elsewhere) times -scale.
__host__ __device__ static inline void nll_grad_at(int64_t i, float *dlogp, const int32_t *labels,
                                                   int C, float scale, float on, float off) {
    dlogp[i] = (int)(i % C) == labels[i / C] ? -mul_rn(scale, on) : off != 0.0f ? -mul_rn(scale, off) : 0.0f;
}

// nn/half.h's conversions. The hardware conversions round to nearest even and overflow to
// infinity as half.h does; NaNs are done by hand because half.h keeps the payload's top
// bits where the hardware may give a canonical NaN.
__host__ __device__ static inline uint16_t f32_to_f16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((absx >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

__host__ __device__ static inline float f16_bits_to_f32(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {  // NaN: quiet, payload kept
        const uint32_t x =
            ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ffu) << 13);
        float f;
        memcpy(&f, &x, sizeof f);
        return f;
    }
    return __half2float(__ushort_as_half(h));
}

// g *= scale; true if the result is not finite.
__host__ __device__ static inline bool scale_check_at(int64_t i, float *grad, float scale) {
    const float v = mul_rn(grad[i], scale);
    grad[i] = v;
    return !isfinite(v);
}

// nn/cpu_kernels.c's expression, operation by operation.
__host__ __device__ static inline void adadelta_at(int64_t i, float *p, float *square_avg,
                                                   float *acc_delta, const float *grad, float lr,
                                                   float rho, float eps, float weight_decay) {
    const float one_minus_rho = 1.0f - rho;
    const float gi =
        weight_decay != 0.0f ? add_rn(grad[i], mul_rn(weight_decay, p[i])) : grad[i];
    const float sq = add_rn(mul_rn(rho, square_avg[i]), mul_rn(mul_rn(one_minus_rho, gi), gi));
    const float std = sqrt_rn(add_rn(sq, eps));
    const float delta = mul_rn(div_rn(sqrt_rn(add_rn(acc_delta[i], eps)), std), gi);
    square_avg[i] = sq;
    acc_delta[i] = add_rn(mul_rn(rho, acc_delta[i]), mul_rn(mul_rn(one_minus_rho, delta), delta));
    p[i] = sub_rn(p[i], mul_rn(lr, delta));
}

// nn/cpu_kernels.c's SGD and AdamW, operation by operation.
__host__ __device__ static inline void sgd_at(int64_t i, float *p, float *buf, const float *grad,
                                              float lr, float momentum, float one_minus_dampening,
                                              float weight_decay, bool nesterov, bool first) {
    float d = weight_decay != 0.0f ? add_rn(grad[i], mul_rn(weight_decay, p[i])) : grad[i];
    if (buf) {
        const float b = first ? d : add_rn(mul_rn(buf[i], momentum), mul_rn(one_minus_dampening, d));
        buf[i] = b;
        d = nesterov ? add_rn(d, mul_rn(momentum, b)) : b;
    }
    p[i] = add_rn(p[i], mul_rn(-lr, d));
}

__host__ __device__ static inline void adamw_at(int64_t i, float *p, float *m, float *v,
                                                const float *grad, AdamWScalars a) {
    const float pi = mul_rn(p[i], a.decay);
    const float mi = add_rn(mul_rn(m[i], a.beta1), mul_rn(a.one_minus_beta1, grad[i]));
    const float vi =
        add_rn(mul_rn(v[i], a.beta2), mul_rn(mul_rn(a.one_minus_beta2, grad[i]), grad[i]));
    m[i] = mi;
    v[i] = vi;
    p[i] = add_rn(pi, div_rn(mul_rn(-a.step_size, mi), add_rn(div_rn(sqrt_rn(vi), a.bc2_sqrt), a.eps)));
}

// ---- compressed optimizer state (nn/quant.h) ---------------------------------------------

// One element of a packed step: the rule's update on fp32 values.
__host__ __device__ static inline void packed_rule_at(const StepScalars &r, const AdamWScalars &a,
                                                      bool first, float *p, float *x0, float *x1,
                                                      float g) {
    switch (r.rule) {
    case RULE_ADADELTA: adadelta_at(0, p, x0, x1, &g, r.lr, r.rho, r.eps, r.weight_decay); break;
    case RULE_SGD:
        sgd_at(0, p, x0, &g, r.lr, r.momentum, r.one_minus_dampening, r.weight_decay, r.nesterov, first);
        break;
    case RULE_ADAMW: adamw_at(0, p, x0, x1, &g, a); break;
    }
}

// Value i (of block b) of packed state s read back; map: the state's map (int8); root: it
// holds square roots (PackedPlan).
__host__ __device__ static inline float unpack_at(PackedState s, StateFormat f, const float *map,
                                                  bool root, int64_t i, int64_t b) {
    if (f == STATE_BF16) return bf16_to_float(((const uint16_t *)s.codes)[i]);
    const float x = mul_rn(map[((const uint8_t *)s.codes)[i]], s.absmax[b]);
    return root ? mul_rn(x, x) : x;
}

// x stored as value i of s, its block's absmax amax (int8; a square root already where the
// state holds them).
__host__ __device__ static inline void pack_at(PackedState s, StateFormat f, const float *map,
                                               bool is_signed, float amax, float x, int64_t i) {
    if (f == STATE_BF16) {
        ((uint16_t *)s.codes)[i] = bf16_from_float(x);
        return;
    }
    uint8_t *c = (uint8_t *)s.codes;
    if (amax == 0.0f) {
        c[i] = is_signed ? QUANT_SIGNED_ZERO : 0;
        return;
    }
    const float v = div_rn(x, amax);
    int code;
    QUANT_NEAREST(map, v, sub_rn, code);
    c[i] = (uint8_t)code;
}

// ---- Winograd F(2x2, 3x3): the CPU's formulas (nn/cpu_kernels.c), operation for operation -----

__host__ __device__ static inline void wg_bt_at(float *y, const float *x, int s) {
    const float x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = sub_rn(x0, x2), y[s] = add_rn(x1, x2), y[2 * s] = sub_rn(x2, x1), y[3 * s] = sub_rn(x1, x3);
}
__host__ __device__ static inline void wg_b_at(float *y, const float *x, int s) {
    const float x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = x0, y[s] = add_rn(sub_rn(x1, x2), x3), y[2 * s] = add_rn(sub_rn(x1, x0), x2), y[3 * s] = -x3;
}
__host__ __device__ static inline void wg_at_at(float *y, const float *x, int s) {
    const float x0 = x[0], x1 = x[s], x2 = x[2 * s], x3 = x[3 * s];
    y[0] = add_rn(add_rn(x0, x1), x2), y[s] = sub_rn(sub_rn(x1, x2), x3);
}
__host__ __device__ static inline void wg_a_at(float *x, const float *y, int s) {
    const float y0 = y[0], y1 = y[s];
    x[0] = y0, x[s] = add_rn(y0, y1), x[2 * s] = sub_rn(y0, y1), x[3 * s] = -y1;
}
__host__ __device__ static inline void wg_g_at(float *y, const float *x, int s) {
    const float x0 = x[0], x1 = x[s], x2 = x[2 * s];
    y[0] = x0, y[s] = mul_rn(add_rn(add_rn(x0, x1), x2), 0.5f);
    y[2 * s] = mul_rn(add_rn(sub_rn(x0, x1), x2), 0.5f), y[3 * s] = x2;
}
__host__ __device__ static inline void wg_gt_at(float *x, const float *y, int s) {
    const float y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
    x[0] = add_rn(y0, mul_rn(add_rn(y1, y2), 0.5f)), x[s] = mul_rn(sub_rn(y1, y2), 0.5f);
    x[2 * s] = add_rn(mul_rn(add_rn(y1, y2), 0.5f), y3);
}

// Element i = (tile t, channel c) of V: the tile's 4 x 4 input, B^T d B.
__host__ __device__ static inline void winograd_input_at(int64_t i, float *V, const float *in,
                                                         ConvGeometry g, int64_t S) {
    const int TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int c = (int)(i % g.C);
    const int64_t t = i / g.C, r = t / TW, n = r / TH;
    const int ty = (int)(r % TH), tx = (int)(t % TW);
    float d[16], u[16];
    for (int p = 0; p < 16; p++) {
        const int y = 2 * ty - g.pad + p / 4, x = 2 * tx - g.pad + p % 4;
        d[p] = y >= 0 && y < g.H && x >= 0 && x < g.W ? in[((n * g.H + y) * g.W + x) * g.C + c] : 0.0f;
    }
    for (int b = 0; b < 4; b++) wg_bt_at(u + b, d + b, 4);
    for (int a = 0; a < 4; a++) wg_bt_at(d + 4 * a, u + 4 * a, 1);
    for (int p = 0; p < 16; p++) V[p * S + t * g.C + c] = d[p];
}

// Element i = (image n, tile row of parity `odd`, channel c): the CPU's row of tiles, left
// to right with the right half of each tile carried into the next; stored over din for
// the even rows, added for the odd ones.
__host__ __device__ static inline void winograd_input_backward_at(int64_t i, float *din,
                                                                  const float *dV, ConvGeometry g,
                                                                  int64_t S, int odd) {
    const int TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2, rows_per_image = (TH - odd + 1) / 2;
    const int c = (int)(i % g.C);
    const int64_t r = i / g.C, n = r / rows_per_image;
    const int ty = odd + 2 * (int)(r % rows_per_image), y0 = 2 * ty - g.pad;
    const int64_t t0 = (n * TH + ty) * TW;
    float carry[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int tx = 0; tx <= TW; tx++) {
        float d[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, u[16];
        if (tx < TW) {
            for (int p = 0; p < 16; p++) d[p] = dV[p * S + (t0 + tx) * g.C + c];
            for (int b = 0; b < 4; b++) wg_b_at(u + b, d + b, 4);
            for (int a = 0; a < 4; a++) wg_b_at(d + 4 * a, u + 4 * a, 1);
        }
        const int x0 = 2 * tx - g.pad;
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 2; b++) {
                const float v = add_rn(d[4 * a + b], carry[2 * a + b]);
                carry[2 * a + b] = d[4 * a + b + 2];
                const int y = y0 + a, x = x0 + b;
                if (y < 0 || y >= g.H || x < 0 || x >= g.W) continue;
                float *dst = &din[((n * g.H + y) * g.W + x) * g.C + c];
                *dst = odd ? add_rn(*dst, v) : v;
            }
    }
}

// Element i of the rows below `covered` of each image: 0 (no even tile row reaches them).
__host__ __device__ static inline void winograd_zero_rows_at(int64_t i, float *din, ConvGeometry g,
                                                             int covered) {
    const int64_t below = (int64_t)(g.H - covered) * g.W * g.C;
    din[(i / below) * g.H * g.W * g.C + (int64_t)covered * g.W * g.C + i % below] = 0.0f;
}

// Element i = (tile t, output channel oc): A^T M A, cut at the image's edge.
__host__ __device__ static inline void winograd_output_at(int64_t i, float *out, const float *M,
                                                          ConvGeometry g, int64_t S) {
    const int TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int oc = (int)(i % g.OC);
    const int64_t t = i / g.OC, r = t / TW, n = r / TH;
    const int ty = (int)(r % TH), tx = (int)(t % TW);
    float m[16], u[8], y[4];
    for (int p = 0; p < 16; p++) m[p] = M[p * S + t * g.OC + oc];
    for (int b = 0; b < 4; b++) wg_at_at(u + b, m + b, 4);
    for (int a = 0; a < 2; a++) wg_at_at(y + 2 * a, u + 4 * a, 1);
    for (int p = 0; p < 4; p++) {
        const int oy = 2 * ty + p / 2, ox = 2 * tx + p % 2;
        if (oy < g.OH && ox < g.OW) out[((n * g.OH + oy) * g.OW + ox) * g.OC + oc] = y[p];
    }
}

// Element i = (tile t, output channel oc) of dM: A dY A^T.
__host__ __device__ static inline void winograd_output_backward_at(int64_t i, float *dM,
                                                                   const float *dout, ConvGeometry g,
                                                                   int64_t S) {
    const int TH = (g.OH + 1) / 2, TW = (g.OW + 1) / 2;
    const int oc = (int)(i % g.OC);
    const int64_t t = i / g.OC, r = t / TW, n = r / TH;
    const int ty = (int)(r % TH), tx = (int)(t % TW);
    float y[4], u[8], m[16];
    for (int p = 0; p < 4; p++) {
        const int oy = 2 * ty + p / 2, ox = 2 * tx + p % 2;
        y[p] = oy < g.OH && ox < g.OW ? dout[((n * g.OH + oy) * g.OW + ox) * g.OC + oc] : 0.0f;
    }
    for (int b = 0; b < 2; b++) wg_a_at(u + b, y + b, 2);
    for (int a = 0; a < 4; a++) wg_a_at(m + 4 * a, u + 2 * a, 1);
    for (int p = 0; p < 16; p++) dM[p * S + t * g.OC + oc] = m[p];
}

// Element i = (oc, c): U = G w G^T; and dw += G^T dU G.
__host__ __device__ static inline void winograd_weights_at(int64_t i, float *U, const float *w,
                                                           int64_t pairs) {
    float u[12], v[16];
    for (int b = 0; b < 3; b++) wg_g_at(u + b, w + i * 9 + b, 3);
    for (int a = 0; a < 4; a++) wg_g_at(v + a * 4, u + a * 3, 1);
    for (int p = 0; p < 16; p++) U[p * pairs + i] = v[p];
}
__host__ __device__ static inline void winograd_weights_backward_at(int64_t i, float *dw,
                                                                    const float *dU, int64_t pairs) {
    float v[16], u[12], x[9];
    for (int p = 0; p < 16; p++) v[p] = dU[p * pairs + i];
    for (int b = 0; b < 4; b++) wg_gt_at(u + b, v + b, 4);
    for (int a = 0; a < 3; a++) wg_gt_at(x + a * 3, u + a * 4, 1);
    for (int p = 0; p < 9; p++) dw[i * 9 + p] = add_rn(dw[i * 9 + p], x[p]);
}

// Rows of the image that the even tile rows reach (the CPU's `covered`).
__host__ __device__ static inline int winograd_covered_rows(ConvGeometry g) {
    const int TH = (g.OH + 1) / 2;
    return 2 * ((TH - 1) / 2 * 2) - g.pad + 4;
}

// ---- kernels and their launchers ---------------------------------------------------------------

__global__ void winograd_input_kernel(float *V, const float *in, ConvGeometry cg, int64_t S, int64_t total) {
    GRID_LOOP(i, total) winograd_input_at(i, V, in, cg, S);
}
__global__ void winograd_input_backward_kernel(float *din, const float *dV, ConvGeometry cg, int64_t S,
                                               int odd, int64_t total) {
    GRID_LOOP(i, total) winograd_input_backward_at(i, din, dV, cg, S, odd);
}
__global__ void winograd_zero_rows_kernel(float *din, ConvGeometry cg, int covered, int64_t total) {
    GRID_LOOP(i, total) winograd_zero_rows_at(i, din, cg, covered);
}
__global__ void winograd_output_kernel(float *out, const float *M, ConvGeometry cg, int64_t S, int64_t total) {
    GRID_LOOP(i, total) winograd_output_at(i, out, M, cg, S);
}
__global__ void winograd_output_backward_kernel(float *dM, const float *dout, ConvGeometry cg, int64_t S,
                                                int64_t total) {
    GRID_LOOP(i, total) winograd_output_backward_at(i, dM, dout, cg, S);
}
__global__ void winograd_weights_kernel(float *U, const float *w, int64_t pairs) {
    GRID_LOOP(i, pairs) winograd_weights_at(i, U, w, pairs);
}
__global__ void winograd_weights_backward_kernel(float *dw, const float *dU, int64_t pairs) {
    GRID_LOOP(i, pairs) winograd_weights_backward_at(i, dw, dU, pairs);
}

static void cuda_winograd_input(float *V, const float *in, ConvGeometry cg) {
    const int64_t T = winograd_tiles(cg), total = T * cg.C;
    if (total <= 0) return;
    winograd_input_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(V, in, cg, winograd_stride(T, cg.C), total);
    LAUNCH_CHECK();
}
static void cuda_winograd_input_backward(float *din, const float *dV, ConvGeometry cg) {
    const int64_t S = winograd_stride(winograd_tiles(cg), cg.C);
    const int covered = winograd_covered_rows(cg), TH = (cg.OH + 1) / 2;
    if (covered < cg.H) {
        const int64_t total = (int64_t)cg.N * (cg.H - covered) * cg.W * cg.C;
        winograd_zero_rows_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(din, cg, covered, total);
        LAUNCH_CHECK();
    }
    for (int odd = 0; odd < 2; odd++) {
        const int64_t total = (int64_t)cg.N * ((TH - odd + 1) / 2) * cg.C;
        if (total <= 0) continue;
        winograd_input_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(din, dV, cg, S, odd, total);
        LAUNCH_CHECK();
    }
}
static void cuda_winograd_output(float *out, const float *M, ConvGeometry cg) {
    const int64_t T = winograd_tiles(cg), total = T * cg.OC;
    if (total <= 0) return;
    winograd_output_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, M, cg, winograd_stride(T, cg.OC), total);
    LAUNCH_CHECK();
}
static void cuda_winograd_output_backward(float *dM, const float *dout, ConvGeometry cg) {
    const int64_t T = winograd_tiles(cg), total = T * cg.OC;
    if (total <= 0) return;
    winograd_output_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        dM, dout, cg, winograd_stride(T, cg.OC), total);
    LAUNCH_CHECK();
}
static void cuda_winograd_weights(float *U, const float *w, int OC, int C) {
    const int64_t pairs = (int64_t)OC * C;
    if (pairs <= 0) return;
    winograd_weights_kernel<<<blocks_for(pairs), THREADS, 0, g.stream>>>(U, w, pairs);
    LAUNCH_CHECK();
}
static void cuda_winograd_weights_backward(float *dw, const float *dU, int OC, int C) {
    const int64_t pairs = (int64_t)OC * C;
    if (pairs <= 0) return;
    winograd_weights_backward_kernel<<<blocks_for(pairs), THREADS, 0, g.stream>>>(dw, dU, pairs);
    LAUNCH_CHECK();
}


__global__ void im2col_kernel(float *col, const float *in, Window w, int64_t total) {
    GRID_LOOP(i, total) im2col_at(i, col, in, w);
}
__global__ void col2im_kernel(float *din, const float *col, Window w, int64_t total) {
    GRID_LOOP(i, total) col2im_at(i, din, col, w);
}

static void cuda_im2col(float *col, const float *in, int N, int H, int W, int C, int K,
                        int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * OH * OW * C * K * K;
    if (total <= 0) return;
    im2col_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        col, in, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

static void cuda_col2im(float *din, const float *col, int N, int H, int W, int C, int K,
                        int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * H * W * C;
    if (total <= 0) return;
    col2im_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        din, col, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

__global__ void conv_direct_forward_kernel(float *out, const float *in, const float *w,
                                           const float *bias, ConvGeometry g, Activation act,
                                           int64_t total) {
    GRID_LOOP(i, total) conv_direct_forward_at(i, out, in, w, bias, g, act);
}
__global__ void conv_direct_partial_kernel(float *partial, const float *dout, const float *in,
                                           const float *out, ConvGeometry g, Activation act,
                                           int64_t total) {
    GRID_LOOP(j, total) conv_direct_partial_at(j, partial, dout, in, out, g, act);
}
__global__ void conv_direct_reduce_kernel(float *dw, float *dbias, const float *partial,
                                          ConvGeometry g, int64_t total) {
    GRID_LOOP(e, total) conv_direct_reduce_at(e, dw, dbias, partial, g);
}
__global__ void conv_direct_din_kernel(float *din, const float *dout, const float *out,
                                       const float *w, ConvGeometry g, Activation act, int64_t total) {
    GRID_LOOP(i, total) conv_direct_din_at(i, din, dout, out, w, g, act);
}

static void cuda_conv_direct_forward(float *out, const float *in, const float *w, const float *bias,
                                     ConvGeometry cg, Activation act) {
    const int64_t total = (int64_t)cg.N * cg.OH * cg.OW * cg.OC;
    if (total <= 0) return;
    conv_direct_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        out, in, w, bias, cg, act, total);
    LAUNCH_CHECK();
}

// The block sums (one thread each: 196 blocks of 256 pixels x 10 x 32 for the seed network's
// conv1 at batch 64), then one thread per parameter adds them in block order: no atomics, the
// CPU's bits.
static void cuda_conv_direct_backward(float *din, float *dw, float *dbias, float *partial,
                                      const float *dout, const float *in, const float *out,
                                      const float *w, ConvGeometry cg, Activation act) {
    const int64_t parts = conv_direct_partial_floats(cg), params = parts / conv_direct_parts(cg);
    if (parts <= 0) return;
    if (dw) {  // NULL: a frozen layer
        conv_direct_partial_kernel<<<blocks_for(parts), THREADS, 0, g.stream>>>(partial, dout, in,
                                                                                 out, cg, act, parts);
        LAUNCH_CHECK();
        conv_direct_reduce_kernel<<<blocks_for(params), THREADS, 0, g.stream>>>(dw, dbias, partial,
                                                                                cg, params);
        LAUNCH_CHECK();
    }
    const int64_t total = (int64_t)cg.N * cg.H * cg.W * cg.C;
    if (!din || total <= 0) return;
    conv_direct_din_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(din, dout, out, w, cg, act,
                                                                        total);
    LAUNCH_CHECK();
}

__global__ void conv_grouped_forward_kernel(float *out, const float *in, const float *w, const float *bias,
                                            ConvGeometry g, int groups, Activation act, int64_t total) {
    GRID_LOOP(i, total) conv_grouped_forward_at(i, out, in, w, bias, g, groups, act);
}
__global__ void conv_grouped_din_kernel(float *din, const float *dy, const float *w, ConvGeometry g, int groups,
                                        int64_t total) {
    GRID_LOOP(i, total) conv_grouped_din_at(i, din, dy, w, g, groups);
}
__global__ void conv_grouped_rows_kernel(float *scratch, const float *dy, const float *in, ConvGeometry g,
                                         int groups, int64_t total) {
    GRID_LOOP(j, total) conv_grouped_rows_at(j, scratch, dy, in, g, groups);
}
__global__ void conv_grouped_reduce_kernel(float *dw, const float *scratch, int64_t rows, int64_t E) {
    GRID_LOOP(e, E) conv_grouped_reduce_at(e, dw, scratch, rows, E);
}

static void cuda_conv_grouped_forward(float *out, const float *in, const float *w, const float *bias,
                                      ConvGeometry cg, int groups, Activation act) {
    const int64_t total = (int64_t)cg.N * cg.OH * cg.OW * cg.OC;
    if (total <= 0) return;
    conv_grouped_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, in, w, bias, cg, groups, act,
                                                                             total);
    LAUNCH_CHECK();
}

static void cuda_conv_grouped_backward_data(float *din, const float *dy, const float *w, ConvGeometry cg,
                                            int groups) {
    const int64_t total = (int64_t)cg.N * cg.H * cg.W * cg.C;
    if (total <= 0) return;
    conv_grouped_din_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(din, dy, w, cg, groups, total);
    LAUNCH_CHECK();
}

static int64_t cuda_conv_grouped_scratch_floats(ConvGeometry cg, int groups) {
    return (int64_t)cg.N * cg.OH * cg.OC * (cg.C / groups) * cg.K * cg.K;
}

// A thread per (output row, weight element) sums the row, then one per weight element adds
// the rows in order: the CPU's sums, no atomics.
static void cuda_conv_grouped_backward_weight(float *dw, float *scratch, const float *dy, const float *in,
                                              ConvGeometry cg, int groups) {
    const int64_t rows = (int64_t)cg.N * cg.OH, E = (int64_t)cg.OC * (cg.C / groups) * cg.K * cg.K;
    if (rows * E <= 0) return;
    conv_grouped_rows_kernel<<<blocks_for(rows * E), THREADS, 0, g.stream>>>(scratch, dy, in, cg, groups, rows * E);
    LAUNCH_CHECK();
    conv_grouped_reduce_kernel<<<blocks_for(E), THREADS, 0, g.stream>>>(dw, scratch, rows, E);
    LAUNCH_CHECK();
}

__global__ void bias_act_kernel(float *out, const float *bias, int cols, Activation act, int64_t total) {
    GRID_LOOP(i, total) bias_act_at(i, out, bias, cols, act);
}

static void cuda_bias_act_forward(float *out, const float *bias, int64_t rows, int cols,
                                  Activation act) {
    const int64_t total = rows * cols;
    if (total <= 0 || (!bias && act == ACT_NONE)) return;
    bias_act_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, bias, cols, act, total);
    LAUNCH_CHECK();
}

__global__ void add_parts_kernel(float *dst, const float *parts, int count, int64_t n, int64_t stride) {
    GRID_LOOP(i, n) add_parts_at(i, dst, parts, count, stride);
}
__global__ void relu_forward_kernel(float *out, const float *in, Activation act, int64_t n) {
    GRID_LOOP(i, n) relu_forward_at(i, out, in, act);
}
__global__ void relu_backward_kernel(float *din, const float *dout, const float *y, Activation act,
                                     int64_t n) {
    GRID_LOOP(i, n) relu_backward_at(i, din, dout, y, act);
}

static void cuda_act_backward(float *dout, const float *y, int64_t n, Activation act) {
    if (act == ACT_NONE || n <= 0) return;
    relu_backward_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(dout, dout, y, act, n);
    LAUNCH_CHECK();
}

// One shard: the GPU runs a layer's images together.
static int cuda_shard_count(void) { return 1; }
static void cuda_shards(int64_t n, void (*fn)(void *arg, int s, int64_t lo, int64_t hi), void *arg) {
    fn(arg, 0, 0, n);
}

static void cuda_add_parts(float *dst, const float *parts, int count, int64_t n, int64_t stride) {
    if (n <= 0) return;
    add_parts_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(dst, parts, count, n, stride);
    LAUNCH_CHECK();
}

static void cuda_relu_forward(float *out, const float *in, int64_t n, Activation act) {
    if (n <= 0) return;
    relu_forward_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, act, n);
    LAUNCH_CHECK();
}

static void cuda_relu_backward(float *din, const float *dout, const float *out, int64_t n,
                               Activation act) {
    if (n <= 0) return;
    relu_backward_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(din, dout, out, act, n);
    LAUNCH_CHECK();
}

// Column sums: the rows are cut into `slabs` (slab_count: a function of the shape alone)
// and a block takes 32 columns (one per lane, so a warp reads 32 consecutive floats of a
// row) of one slab with 32 row lanes; row lane ty sums the slab's rows r0 + ty, r0 + ty +
// 32, ... in order, then a fixed tree adds the 32 lane sums. With one slab the block adds
// its sum to the result; with several it writes it to the backend's slab scratch and a
// second kernel adds the slabs' sums in slab order. No atomics: the same bits on every
// run and on every GPU. (One slab, a column block on one multiprocessor, read the 205 MB
// of resnet18's stem batchnorm at batch 64 with 2 of an H100's 132 multiprocessors.)
#define BB_COLS 32
#define BB_ROWS 32
#define SLAB_ROWS 1024   // rows a slab at least (32 a lane)
#define SLABS_MAX 64
#define SLAB_SCRATCH_BYTES ((size_t)4 << 20)  // allocated at set-up, before the baseline

// Slabs of `rows` for a column sum of `cols` values of `bytes` each (1: no scratch used).
__host__ __device__ static inline int slab_count(int64_t rows, int cols, size_t bytes) {
    int64_t s = rows / SLAB_ROWS;
    const int64_t fit = (int64_t)(SLAB_SCRATCH_BYTES / ((size_t)cols * bytes));
    if (s > SLABS_MAX) s = SLABS_MAX;
    if (s > fit) s = fit;
    return s > 1 ? (int)s : 1;
}
__host__ __device__ static inline int64_t slab_start(int64_t rows, int slabs, int j) {
    return rows * j / slabs;
}

__host__ __device__ static inline float bias_lane_sum(const float *dout, int64_t r0, int64_t r1,
                                                      int cols, int c, int lane) {
    float acc = 0.0f;
    for (int64_t r = r0 + lane; r < r1; r += BB_ROWS) acc += dout[r * cols + c];
    return acc;
}

// dbias[c] += the slabs' sums in slab order (part: slabs x cols).
__host__ __device__ static inline void bias_slabs_at(int64_t c, float *dbias, const float *part,
                                                     int slabs, int cols) {
    float sum = 0.0f;
    for (int j = 0; j < slabs; j++) sum += part[(int64_t)j * cols + c];
    dbias[c] += sum;
}

// (The launch bounds: 1024 threads a block fit a T4's 64K registers only at 64 a thread;
// without them sm_75 took 66 for bn_sums_kernel and every launch failed.)
__global__ void __launch_bounds__(BB_COLS * BB_ROWS)
bias_backward_kernel(float *dbias, float *slab_part, const float *dout, int64_t rows, int cols,
                     int slabs) {
    __shared__ float part[BB_ROWS][BB_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, j = blockIdx.y;
    const int64_t r0 = slab_start(rows, slabs, j), r1 = slab_start(rows, slabs, j + 1);
    for (int c0 = blockIdx.x * BB_COLS; c0 < cols; c0 += gridDim.x * BB_COLS) {
        const int c = c0 + tx;
        part[ty][tx] = c < cols ? bias_lane_sum(dout, r0, r1, cols, c, ty) : 0.0f;
        __syncthreads();
        for (int half = BB_ROWS / 2; half > 0; half /= 2) {
            if (ty < half) part[ty][tx] += part[ty + half][tx];
            __syncthreads();
        }
        if (ty == 0 && c < cols) {
            if (slabs == 1) dbias[c] += part[0][tx];
            else slab_part[(int64_t)j * cols + c] = part[0][tx];
        }
        __syncthreads();  // part is reused by the next column block
    }
}

__global__ void bias_slabs_kernel(float *dbias, const float *part, int slabs, int cols) {
    GRID_LOOP(c, (int64_t)cols) bias_slabs_at(c, dbias, part, slabs, cols);
}

static void cuda_bias_backward(float *dbias, const float *dout, int64_t rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    const int col_blocks = (cols + BB_COLS - 1) / BB_COLS;
    const unsigned blocks = (unsigned)(col_blocks < g.sms * 8 ? col_blocks : g.sms * 8);
    const int slabs = slab_count(rows, cols, sizeof(float));
    float *part = (float *)g.slab_scratch;
    bias_backward_kernel<<<dim3(blocks, (unsigned)slabs), dim3(BB_COLS, BB_ROWS), 0, g.stream>>>(
        dbias, part, dout, rows, cols, slabs);
    LAUNCH_CHECK();
    if (slabs > 1) {
        bias_slabs_kernel<<<blocks_for(cols), THREADS, 0, g.stream>>>(dbias, part, slabs, cols);
        LAUNCH_CHECK();
    }
}

// The activation's gradient in place, then the column sums: two kernels on the stream.
static void cuda_bias_act_backward(float *dbias, float *dout, const float *y, int64_t rows, int cols,
                                   Activation act) {
    cuda_act_backward(dout, y, rows * cols, act);
    if (dbias) cuda_bias_backward(dbias, dout, rows, cols);
}

__global__ void maxpool_forward_kernel(float *out, uint8_t *argmax, const float *in, Window w,
                                       int64_t total) {
    GRID_LOOP(i, total) maxpool_forward_at(i, out, argmax, in, w);
}
__global__ void maxpool_backward_kernel(float *din, const float *dout, const uint8_t *argmax,
                                        Window w, int64_t total) {
    GRID_LOOP(i, total) maxpool_backward_at(i, din, dout, argmax, w);
}

static void cuda_maxpool_forward(float *out, uint8_t *argmax, const float *in, int N, int H, int W,
                                 int C, int K, int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * OH * OW * C;
    if (total <= 0) return;
    maxpool_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        out, argmax, in, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

static void cuda_maxpool_backward(float *din, const float *dout, const uint8_t *argmax, int N,
                                  int H, int W, int C, int K, int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * H * W * C;
    if (total <= 0) return;
    maxpool_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        din, dout, argmax, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

__global__ void avgpool_forward_kernel(float *out, const float *in, Window w, int64_t total) {
    GRID_LOOP(i, total) avgpool_forward_at(i, out, in, w);
}
__global__ void avgpool_backward_kernel(float *din, const float *dout, Window w, int64_t total) {
    GRID_LOOP(i, total) avgpool_backward_at(i, din, dout, w);
}

static void cuda_avgpool_forward(float *out, const float *in, int N, int H, int W, int C, int K,
                                 int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * OH * OW * C;
    if (total <= 0) return;
    avgpool_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        out, in, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

static void cuda_avgpool_backward(float *din, const float *dout, int N, int H, int W, int C, int K,
                                  int stride, int pad, int OH, int OW) {
    const int64_t total = (int64_t)N * H * W * C;
    if (total <= 0) return;
    avgpool_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        din, dout, Window{H, W, C, K, stride, pad, OH, OW}, total);
    LAUNCH_CHECK();
}

__global__ void global_avgpool_forward_kernel(float *out, const float *in, int64_t HW, int C,
                                              int64_t total) {
    GRID_LOOP(i, total) global_avgpool_forward_at(i, out, in, HW, C);
}
__global__ void global_avgpool_backward_kernel(float *din, const float *dout, int64_t HW, int C,
                                               int64_t total) {
    GRID_LOOP(i, total) global_avgpool_backward_at(i, din, dout, HW, C);
}

static void cuda_global_avgpool_forward(float *out, const float *in, int N, int64_t HW, int C) {
    const int64_t total = (int64_t)N * C;
    if (total <= 0) return;
    global_avgpool_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, in, HW, C, total);
    LAUNCH_CHECK();
}

static void cuda_global_avgpool_backward(float *din, const float *dout, int N, int64_t HW, int C) {
    const int64_t total = (int64_t)N * HW * C;
    if (total <= 0) return;
    global_avgpool_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(din, dout, HW, C,
                                                                                total);
    LAUNCH_CHECK();
}

__global__ void add_act_kernel(float *out, const float *a, const float *b, Activation act, int64_t n) {
    GRID_LOOP(i, n) add_act_at(i, out, a, b, act);
}

static void cuda_add_act(float *out, const float *a, const float *b, int64_t n, Activation act) {
    if (n <= 0) return;
    add_act_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, a, b, act, n);
    LAUNCH_CHECK();
}

// ---- batchnorm ------------------------------------------------------------------------------

// The per-channel sums of bn_sums (dout NULL: x and x^2) and bn_backward_sums (dy and
// dy * xhat), with bias_backward's layout: a block takes 32 channels and 32 row lanes, lane
// ty sums rows ty, ty + 32, ... in order in double, then a fixed tree adds the lanes.
// (Deterministic; the CPU sums in other blocks, so the two differ by double rounding.)
__host__ __device__ static inline void bn_lane_sums(const float *x, const float *dout, BnChannels s,
                                                    int64_t r0, int64_t r1, int C, int c, int lane,
                                                    Activation act, double *s1, double *s2) {
    double a = 0.0, b = 0.0;
    for (int64_t r = r0 + lane; r < r1; r += BB_ROWS) {
        const int64_t e = r * C + c;
        if (!dout) {
            const double v = x[e];
            a = dadd_rn(a, v);
            b = dadd_rn(b, dmul_rn(v, v));
        } else {
            const float dy = bn_dy(dout, x, s, e, c, act);
            const float xhat = mul_rn(sub_rn(x[e], s.mean[c]), s.invstd[c]);
            a = dadd_rn(a, (double)dy);
            b = dadd_rn(b, dmul_rn((double)dy, (double)xhat));
        }
    }
    *s1 = a, *s2 = b;
}

// The rows go sample after sample (kernels.h): each sample's in units of at most
// SLAB_ROWS rows (their count a function of the sample's size alone), each unit summed by
// a block column, and the units' sums added to acc in order, so that a batch in chunks of
// samples sums as it does in one call.
__host__ __device__ static inline int64_t bn_unit_count(int64_t sample_rows) {
    return (sample_rows + SLAB_ROWS - 1) / SLAB_ROWS;
}
__host__ __device__ static inline void bn_unit_rows(int64_t u, int64_t sample_rows, int64_t *r0, int64_t *r1) {
    const int64_t P = bn_unit_count(sample_rows), per = (sample_rows + P - 1) / P;
    const int64_t at = u / P * sample_rows, b = u % P;
    *r0 = at + (b * per < sample_rows ? b * per : sample_rows);
    *r1 = at + ((b + 1) * per < sample_rows ? (b + 1) * per : sample_rows);
}

// Units u0 .. u0 + nu - 1, one a block row (blockIdx.y); with one the block adds its sums to
// acc, else it writes them to unit_part for bn_units_kernel.
__global__ void __launch_bounds__(BB_COLS * BB_ROWS)
bn_sums_kernel(double *acc, double *unit_part, const float *x, const float *dout, BnChannels s,
               int64_t sample_rows, int64_t u0, int nu, int C, Activation act) {
    __shared__ double p1[BB_ROWS][BB_COLS + 1], p2[BB_ROWS][BB_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, j = blockIdx.y;
    int64_t r0, r1;
    bn_unit_rows(u0 + j, sample_rows, &r0, &r1);
    for (int c0 = blockIdx.x * BB_COLS; c0 < C; c0 += gridDim.x * BB_COLS) {
        const int c = c0 + tx;
        double a = 0.0, b = 0.0;
        if (c < C) bn_lane_sums(x, dout, s, r0, r1, C, c, ty, act, &a, &b);
        p1[ty][tx] = a, p2[ty][tx] = b;
        __syncthreads();
        for (int half = BB_ROWS / 2; half > 0; half /= 2) {
            if (ty < half) {
                p1[ty][tx] = dadd_rn(p1[ty][tx], p1[ty + half][tx]);
                p2[ty][tx] = dadd_rn(p2[ty][tx], p2[ty + half][tx]);
            }
            __syncthreads();
        }
        if (ty == 0 && c < C && nu == 1) {
            acc[c] = dadd_rn(acc[c], p1[0][tx]);
            acc[C + c] = dadd_rn(acc[C + c], p2[0][tx]);
        } else if (ty == 0 && c < C) {
            unit_part[(int64_t)j * 2 * C + c] = p1[0][tx];
            unit_part[(int64_t)j * 2 * C + C + c] = p2[0][tx];
        }
        __syncthreads();  // p1 and p2 are reused by the next channel block
    }
}

// acc[i] += the units' sums one after the other, in order, for i < 2C (part: nu x 2C).
__host__ __device__ static inline void bn_units_at(int64_t i, double *acc, const double *part, int nu,
                                                   int C) {
    double a = acc[i];
    for (int j = 0; j < nu; j++) a = dadd_rn(a, part[(int64_t)j * 2 * C + i]);
    acc[i] = a;
}

__global__ void bn_units_kernel(double *acc, const double *part, int nu, int C) {
    GRID_LOOP(i, 2 * (int64_t)C) bn_units_at(i, acc, part, nu, C);
}

// Units a launch takes: as many as the slab scratch holds the sums of (1 at least).
__host__ __device__ static inline int bn_units_a_launch(int C) {
    const int64_t fit = (int64_t)(SLAB_SCRATCH_BYTES / (2 * (size_t)C * sizeof(double)));
    return fit > 65535 ? 65535 : fit > 1 ? (int)fit : 1;
}

static void bn_column_sums(double *acc, const float *x, const float *dout, BnChannels s, int64_t rows,
                           int64_t sample_rows, int C, Activation act) {
    if (rows <= 0 || C <= 0 || sample_rows <= 0) return;
    const int col_blocks = (C + BB_COLS - 1) / BB_COLS;
    const unsigned blocks = (unsigned)(col_blocks < g.sms * 8 ? col_blocks : g.sms * 8);
    const int64_t units = rows / sample_rows * bn_unit_count(sample_rows);
    double *part = (double *)g.slab_scratch;
    for (int64_t u0 = 0; u0 < units; u0 += bn_units_a_launch(C)) {
        const int nu = (int)(units - u0 < bn_units_a_launch(C) ? units - u0 : bn_units_a_launch(C));
        bn_sums_kernel<<<dim3(blocks, (unsigned)nu), dim3(BB_COLS, BB_ROWS), 0, g.stream>>>(
            acc, part, x, dout, s, sample_rows, u0, nu, C, act);
        LAUNCH_CHECK();
        if (nu > 1) {
            bn_units_kernel<<<blocks_for(2 * (int64_t)C), THREADS, 0, g.stream>>>(acc, part, nu, C);
            LAUNCH_CHECK();
        }
    }
}

static void cuda_bn_sums(double *acc, const float *x, int64_t rows, int64_t sample_rows, int C) {
    bn_column_sums(acc, x, NULL, BnChannels{}, rows, sample_rows, C, ACT_NONE);
}

static void cuda_bn_backward_sums(double *acc, const float *dout, const float *x, const float *out,
                                  const float *mean, const float *invstd, const float *gamma,
                                  const float *beta, int64_t rows, int64_t sample_rows, int C,
                                  Activation act) {
    bn_column_sums(acc, x, dout, BnChannels{mean, invstd, gamma, beta, out}, rows, sample_rows, C, act);
}

__global__ void bn_batch_stats_kernel(float *mean, float *invstd, float *running_mean,
                                      float *running_var, const double *acc, int C, int64_t count,
                                      double eps, double momentum) {
    GRID_LOOP(c, (int64_t)C)
    bn_batch_stats_at((int)c, mean, invstd, running_mean, running_var, acc, C, count, eps, momentum);
}
__global__ void bn_eval_stats_kernel(float *mean, float *invstd, const float *running_mean,
                                     const float *running_var, int C, double eps) {
    GRID_LOOP(c, (int64_t)C) bn_eval_stats_at((int)c, mean, invstd, running_mean, running_var, eps);
}
__global__ void bn_forward_kernel(float *out, const float *x, const float *mean, const float *invstd,
                                  const float *gamma, const float *beta, int C, Activation act,
                                  int64_t total) {
    GRID_LOOP(i, total) bn_forward_at(i, out, x, mean, invstd, gamma, beta, C, act);
}
__global__ void bn_backward_kernel(float *din, const float *dout, const float *x, BnChannels s,
                                   const double *acc, int C, int64_t count, Activation act,
                                   int64_t total) {
    GRID_LOOP(i, total) bn_backward_at(i, din, dout, x, s, acc, C, count, act);
}
__global__ void bn_param_grads_kernel(float *dgamma, float *dbeta, const double *acc, int C) {
    GRID_LOOP(c, (int64_t)C) bn_param_grads_at((int)c, dgamma, dbeta, acc, C);
}

static void cuda_bn_batch_stats(float *mean, float *invstd, float *running_mean, float *running_var,
                                const double *acc, int C, int64_t count, double eps,
                                double momentum) {
    if (C <= 0) return;
    bn_batch_stats_kernel<<<blocks_for(C), THREADS, 0, g.stream>>>(mean, invstd, running_mean,
                                                                   running_var, acc, C, count, eps,
                                                                   momentum);
    LAUNCH_CHECK();
}

static void cuda_bn_eval_stats(float *mean, float *invstd, const float *running_mean,
                               const float *running_var, int C, double eps) {
    if (C <= 0) return;
    bn_eval_stats_kernel<<<blocks_for(C), THREADS, 0, g.stream>>>(mean, invstd, running_mean,
                                                                  running_var, C, eps);
    LAUNCH_CHECK();
}

static void cuda_bn_forward(float *out, const float *x, const float *mean, const float *invstd,
                            const float *gamma, const float *beta, int64_t rows, int C,
                            Activation act) {
    const int64_t total = rows * C;
    if (total <= 0) return;
    bn_forward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, x, mean, invstd, gamma, beta,
                                                                   C, act, total);
    LAUNCH_CHECK();
}

static void cuda_bn_backward(float *din, const float *dout, const float *x, const float *out,
                             const float *mean, const float *invstd, const float *gamma,
                             const float *beta, const double *acc, int64_t rows, int C,
                             int64_t count, Activation act) {
    const int64_t total = rows * C;
    if (total <= 0) return;
    bn_backward_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(
        din, dout, x, BnChannels{mean, invstd, gamma, beta, out}, acc, C, count, act, total);
    LAUNCH_CHECK();
}

static void cuda_bn_param_grads(float *dgamma, float *dbeta, const double *acc, int C) {
    if (C <= 0) return;
    bn_param_grads_kernel<<<blocks_for(C), THREADS, 0, g.stream>>>(dgamma, dbeta, acc, C);
    LAUNCH_CHECK();
}

__global__ void dropout_kernel(float *out, const float *in, int64_t n, float p, float scale,
                               uint64_t key, uint64_t offset) {
    GRID_LOOP(i, n) dropout_at(i, out, in, p, scale, key, offset);
}

static void cuda_dropout_forward(float *out, const float *in, int64_t n, float p, uint64_t key,
                                 uint64_t offset) {
    if (n <= 0) return;
    const float scale = 1.0f / (1.0f - p);
    dropout_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n, p, scale, key, offset);
    LAUNCH_CHECK();
}

static void cuda_dropout_backward(float *din, const float *dout, int64_t n, float p,
                                  uint64_t key, uint64_t offset) {
    cuda_dropout_forward(din, dout, n, p, key, offset);  // the same mask and scale
}

__global__ void nhwc_to_nchw_kernel(float *out, const float *in, int64_t hw, int C, int64_t total) {
    GRID_LOOP(i, total) nhwc_to_nchw_at(i, out, in, hw, C);
}
__global__ void nchw_to_nhwc_kernel(float *out, const float *in, int64_t hw, int C, int64_t total) {
    GRID_LOOP(i, total) nchw_to_nhwc_at(i, out, in, hw, C);
}

static void cuda_nhwc_to_nchw(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W, total = (int64_t)N * hw * C;
    if (total <= 0) return;
    nhwc_to_nchw_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, in, hw, C, total);
    LAUNCH_CHECK();
}

static void cuda_nchw_to_nhwc(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W, total = (int64_t)N * hw * C;
    if (total <= 0) return;
    nchw_to_nhwc_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(out, in, hw, C, total);
    LAUNCH_CHECK();
}

__global__ void log_softmax_forward_kernel(float *out, const float *in, int N, int C) {
    GRID_LOOP(n, (int64_t)N) log_softmax_forward_row(n, out, in, C);
}
__global__ void log_softmax_backward_kernel(float *din, const float *dout, const float *out,
                                            int N, int C) {
    GRID_LOOP(n, (int64_t)N) log_softmax_backward_row(n, din, dout, out, C);
}

static void cuda_log_softmax_forward(float *out, const float *in, int N, int C) {
    if (N <= 0 || C <= 0) return;
    log_softmax_forward_kernel<<<blocks_for(N), THREADS, 0, g.stream>>>(out, in, N, C);
    LAUNCH_CHECK();
}

static void cuda_log_softmax_backward(float *din, const float *dout, const float *out, int N,
                                      int C) {
    if (N <= 0 || C <= 0) return;
    log_softmax_backward_kernel<<<blocks_for(N), THREADS, 0, g.stream>>>(din, dout, out, N, C);
    LAUNCH_CHECK();
}

// The metrics: one block; thread t takes rows t, t + 256, ... in order, then a fixed tree
// adds the threads' sums (the loss in double, as on the CPU). Deterministic, no atomics.
#define NLL_THREADS 256
__host__ __device__ static inline void nll_lane(const float *logp, const int32_t *labels, int N,
                                                int C, float smoothing, int t, double *loss,
                                                int *correct) {
    *loss = 0.0, *correct = 0;
    for (int n = t; n < N; n += NLL_THREADS) nll_row(n, logp, labels, C, smoothing, loss, correct);
}

__global__ void nll_metrics_kernel(float *metrics, const float *logp, const int32_t *labels,
                                   int N, int C, float smoothing) {
    __shared__ double loss_part[NLL_THREADS];
    __shared__ int correct_part[NLL_THREADS];
    const int t = threadIdx.x;
    double loss;
    int correct;
    nll_lane(logp, labels, N, C, smoothing, t, &loss, &correct);
    loss_part[t] = loss;
    correct_part[t] = correct;
    __syncthreads();
    for (int half = NLL_THREADS / 2; half > 0; half /= 2) {
        if (t < half) {
            loss_part[t] += loss_part[t + half];
            correct_part[t] += correct_part[t + half];
        }
        __syncthreads();
    }
    if (t == 0) {
        metrics[0] += (float)loss_part[0];
        metrics[1] += (float)correct_part[0];
    }
}

// The gradient's scale times the loss scale, as the CPU computes it.
__host__ __device__ static inline float nll_grad_scale(float scale, const ScalerState *scaler) {
    return scaler ? mul_rn(scale, (float)scaler->scale) : scale;
}

__global__ void nll_grad_kernel(float *dlogp, const int32_t *labels, int C, float scale,
                                float smoothing, const ScalerState *scaler, int64_t total) {
    const float s = nll_grad_scale(scale, scaler);
    float on, off;
    nll_targets(smoothing, C, &on, &off);
    GRID_LOOP(i, total) nll_grad_at(i, dlogp, labels, C, s, on, off);
}

static void cuda_nll_loss(float *dlogp, float *metrics, const float *logp, const int32_t *labels,
                          int N, int C, float scale, float smoothing, const ScalerState *scaler) {
    if (N <= 0 || C <= 0) return;
    nll_metrics_kernel<<<1, NLL_THREADS, 0, g.stream>>>(metrics, logp, labels, N, C, smoothing);
    LAUNCH_CHECK();
    if (dlogp) {
        const int64_t total = (int64_t)N * C;
        nll_grad_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(dlogp, labels, C, scale,
                                                                     smoothing, scaler, total);
        LAUNCH_CHECK();
    }
}

__global__ void f32_to_f16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_LOOP(i, n) out[i] = f32_to_f16_bits(in[i]);
}
__global__ void f16_to_f32_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_LOOP(i, n) out[i] = f16_bits_to_f32(in[i]);
}

static void cuda_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    f32_to_f16_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n);
    LAUNCH_CHECK();
}

static void cuda_f16_to_f32(float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    f16_to_f32_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n);
    LAUNCH_CHECK();
}

__global__ void f32_to_bf16_kernel(uint16_t *out, const float *in, int64_t n) {
    GRID_LOOP(i, n) out[i] = bf16_from_float(in[i]);
}
__global__ void bf16_to_f32_kernel(float *out, const uint16_t *in, int64_t n) {
    GRID_LOOP(i, n) out[i] = bf16_to_float(in[i]);
}

static void cuda_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
    if (n <= 0) return;
    f32_to_bf16_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n);
    LAUNCH_CHECK();
}

static void cuda_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
    if (n <= 0) return;
    bf16_to_f32_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n);
    LAUNCH_CHECK();
}

// The byte input's value at element i: its channel's row of the table.
__host__ __device__ static inline float u8_value_at(int64_t i, const uint8_t *in, int C, const float *lut) {
    return lut[(i % C) * 256 + in[i]];
}
__global__ void u8_to_f32_kernel(float *out, const uint8_t *in, int64_t n, int C, const float *lut) {
    GRID_LOOP(i, n) out[i] = u8_value_at(i, in, C, lut);
}

static void cuda_u8_to_f32(float *out, const uint8_t *in, int64_t n, int C, const float *lut) {
    if (n <= 0) return;
    u8_to_f32_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(out, in, n, C, lut);
    LAUNCH_CHECK();
}

// Compressed activations: a thread a group, running quant.h's functions as the CPU does.
__host__ __device__ static inline void act_pack_at(int64_t q, unsigned char *dst, const float *x,
                                                   int64_t values, int bits, uint64_t key, int64_t sample0) {
    const int64_t groups = (values + ACT_GROUP - 1) / ACT_GROUP;
    const int64_t s = q / groups, i = q % groups * ACT_GROUP;
    const int count = values - i < ACT_GROUP ? (int)(values - i) : ACT_GROUP;
    act_pack_group(dst + q * act_group_bytes(bits), x + s * values + i, count, bits, key,
                   ((uint64_t)(sample0 + s) << 32) + (uint64_t)(i / 4));
}
__host__ __device__ static inline void act_unpack_at(int64_t q, float *x, const unsigned char *src,
                                                     int64_t values, int bits) {
    const int64_t groups = (values + ACT_GROUP - 1) / ACT_GROUP;
    const int64_t s = q / groups, i = q % groups * ACT_GROUP;
    const int count = values - i < ACT_GROUP ? (int)(values - i) : ACT_GROUP;
    act_unpack_group(x + s * values + i, src + q * act_group_bytes(bits), count, bits);
}
__global__ void act_pack_kernel(unsigned char *dst, const float *x, int64_t values, int64_t total,
                                int bits, uint64_t key, int64_t sample0) {
    GRID_LOOP(q, total) act_pack_at(q, dst, x, values, bits, key, sample0);
}
__global__ void act_unpack_kernel(float *x, const unsigned char *src, int64_t values, int64_t total,
                                  int bits) {
    GRID_LOOP(q, total) act_unpack_at(q, x, src, values, bits);
}

static void cuda_act_pack(void *dst, const float *x, int64_t values, int n, int bits, uint64_t key,
                          int64_t sample0) {
    const int64_t total = n * ((values + ACT_GROUP - 1) / ACT_GROUP);
    if (total <= 0) return;
    act_pack_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>((unsigned char *)dst, x, values, total,
                                                                  bits, key, sample0);
    LAUNCH_CHECK();
}

static void cuda_act_unpack(float *x, const void *src, int64_t values, int n, int bits) {
    const int64_t total = n * ((values + ACT_GROUP - 1) / ACT_GROUP);
    if (total <= 0) return;
    act_unpack_kernel<<<blocks_for(total), THREADS, 0, g.stream>>>(x, (const unsigned char *)src, values,
                                                                    total, bits);
    LAUNCH_CHECK();
}

// 1 / scale as the CPU rounds it.
__host__ __device__ static inline float unscale_factor(const ScalerState *s) {
    return (float)(1.0 / s->scale);
}

// Every thread that saw a non-finite result writes 1.0f to the flag (the same value, so
// the race is benign); otherwise the flag is left alone and one flag covers several calls.
__global__ void unscale_check_kernel(float *grad, int64_t n, ScalerState *s) {
    const float scale = unscale_factor(s);
    bool bad = false;
    GRID_LOOP(i, n) bad |= scale_check_at(i, grad, scale);
    if (bad) s->found = 1.0f;
}

static void cuda_unscale_check(float *grad, int64_t n, ScalerState *s) {
    if (n <= 0) return;
    unscale_check_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(grad, n, s);
    LAUNCH_CHECK();
}

__global__ void scaler_update_kernel(ScalerState *s, ScalerRules r) { scaler_advance(s, r); }

static void cuda_scaler_update(ScalerState *s, ScalerRules r) {
    scaler_update_kernel<<<1, 1, 0, g.stream>>>(s, r);
    LAUNCH_CHECK();
}

// The optimizer kernels: every thread reads the gate (nn/scaler.h) and returns at once when
// the step is skipped; the grid's shape does not depend on it, so the launches never wait
// for the device.
__global__ void adadelta_kernel(float *p, float *square_avg, float *acc_delta, const float *grad,
                                int64_t n, float lr, float rho, float eps, float weight_decay,
                                const ScalerState *gate) {
    int64_t taken;
    if (!scaler_gate(gate, 0, &taken)) return;
    GRID_LOOP(i, n) adadelta_at(i, p, square_avg, acc_delta, grad, lr, rho, eps, weight_decay);
}

static void cuda_adadelta_step(float *p, float *square_avg, float *acc_delta, const float *grad,
                               int64_t n, float lr, float rho, float eps, float weight_decay,
                               const ScalerState *gate) {
    if (n <= 0) return;
    adadelta_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(p, square_avg, acc_delta, grad, n, lr,
                                                             rho, eps, weight_decay, gate);
    LAUNCH_CHECK();
}

__global__ void sgd_kernel(float *p, float *buf, const float *grad, int64_t n, float lr,
                           float momentum, float one_minus_dampening, float weight_decay,
                           bool nesterov, const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    GRID_LOOP(i, n)
    sgd_at(i, p, buf, grad, lr, momentum, one_minus_dampening, weight_decay, nesterov, taken == 0);
}

static void cuda_sgd_step(float *p, float *buf, const float *grad, int64_t n, float lr,
                          float momentum, float one_minus_dampening, float weight_decay,
                          bool nesterov, const ScalerState *gate, uint64_t step) {
    if (n <= 0) return;
    sgd_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(p, buf, grad, n, lr, momentum,
                                                        one_minus_dampening, weight_decay, nesterov,
                                                        gate, step);
    LAUNCH_CHECK();
}

__global__ void adamw_kernel(float *p, float *m, float *v, const float *grad, int64_t n,
                             AdamWHyper h, const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    const AdamWScalars a = adamw_scalars(h, taken);
    GRID_LOOP(i, n) adamw_at(i, p, m, v, grad, a);
}

static void cuda_adamw_step(float *p, float *m, float *v, const float *grad, int64_t n,
                            AdamWHyper h, const ScalerState *gate, uint64_t step) {
    if (n <= 0) return;
    adamw_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(p, m, v, grad, n, h, gate, step);
    LAUNCH_CHECK();
}

// ---- gradient clipping ---------------------------------------------------------------------

// Block b's sum of squares in double: each thread its values in order, then a fixed tree.
#define SUMSQ_THREADS 256
__host__ __device__ static inline double sumsq_lane(const float *x, int64_t n, int64_t b, int t) {
    double s = 0.0;
    const int64_t e = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
    for (int64_t i = b * SUMSQ_BLOCK + t; i < e; i += SUMSQ_THREADS) s = dadd_rn(s, dmul_rn((double)x[i], (double)x[i]));
    return s;
}

__global__ void sumsq_blocks_kernel(double *partial, const float *x, int64_t n) {
    __shared__ double part[SUMSQ_THREADS];
    const int t = threadIdx.x;
    part[t] = sumsq_lane(x, n, blockIdx.x, t);
    __syncthreads();
    for (int half = SUMSQ_THREADS / 2; half > 0; half /= 2) {
        if (t < half) part[t] = dadd_rn(part[t], part[t + half]);
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = part[0];
}

// The blocks' sums added to *out (0 first when `fresh`) in order, by one thread.
__global__ void sumsq_total_kernel(double *out, const double *partial, int64_t nb, bool fresh) {
    double s = fresh ? 0.0 : *out;
    for (int64_t b = 0; b < nb; b++) s = dadd_rn(s, partial[b]);
    *out = s;
}

static void cuda_sum_squares(double *out, const float *x, int64_t n) {
    const int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK, cap = SLAB_SCRATCH_BYTES / sizeof(double);
    // The blocks' sums in the slab scratch, a run of at most `cap` blocks at a time.
    double *partial = (double *)g.slab_scratch;
    if (nb == 0) sumsq_total_kernel<<<1, 1, 0, g.stream>>>(out, partial, 0, true);
    for (int64_t b0 = 0; b0 < nb; b0 += cap) {
        const int64_t m = nb - b0 < cap ? nb - b0 : cap;
        sumsq_blocks_kernel<<<(unsigned)m, SUMSQ_THREADS, 0, g.stream>>>(partial, x + b0 * SUMSQ_BLOCK,
                                                                         n - b0 * SUMSQ_BLOCK);
        LAUNCH_CHECK();
        sumsq_total_kernel<<<1, 1, 0, g.stream>>>(out, partial, m, b0 == 0);
    }
    LAUNCH_CHECK();
}

// Every thread works the factor out from the sum on the device: no launch waits for it.
__host__ __device__ static inline void clip_scale_at(int64_t i, float *x, float s) {
    if (s < 1.0f) x[i] = mul_rn(x[i], s);
}

__global__ void clip_scale_kernel(float *x, int64_t n, const double *sumsq, float max_norm) {
    const float s = clip_coef(*sumsq, max_norm);
    GRID_LOOP(i, n) clip_scale_at(i, x, s);
}

static void cuda_clip_scale(float *x, int64_t n, const double *sumsq, float max_norm) {
    if (n <= 0) return;
    clip_scale_kernel<<<blocks_for(n), THREADS, 0, g.stream>>>(x, n, sumsq, max_norm);
    LAUNCH_CHECK();
}

// The quantization maps (nn/quant.h), uploaded at set-up.
__constant__ float quant_map_dev[QUANT_MAP_FLOATS];

// A CUDA block per block of QUANT_BLOCK values (grid-stride over them), each thread
// PACK_PER_THREAD of them: read back, updated in registers, the block's new absmax reduced
// in shared memory (a maximum: the order does not matter), stored rounded. bf16 has no
// absmax and takes the same path.
#define PACK_PER_THREAD (QUANT_BLOCK / THREADS)
static_assert(QUANT_BLOCK % THREADS == 0, "a quantization block is whole threads' values");

__global__ void __launch_bounds__(THREADS)
    packed_step_kernel(float *p, PackedState s0, PackedState s1, const float *grad, int64_t n,
                       StateFormat f, StepScalars r, const ScalerState *gate, uint64_t step) {
    __shared__ float amax[2][THREADS];
    PackedPlan pp;
    if (!packed_plan(r, f, gate, step, &pp)) return;
    const AdamWScalars a = pp.a;
    const bool two = pp.two, first = pp.first;
    const float *map0 = quant_map_dev + pp.map0, *map1 = quant_map_dev + pp.map1;
    for (int64_t b = blockIdx.x; b < quant_blocks(n); b += gridDim.x) {
        float x0[PACK_PER_THREAD], x1[PACK_PER_THREAD], m0 = 0.0f, m1 = 0.0f;
        for (int k = 0; k < PACK_PER_THREAD; k++) {
            const int64_t i = b * QUANT_BLOCK + threadIdx.x + (int64_t)k * THREADS;
            if (i >= n) continue;
            x0[k] = unpack_at(s0, f, map0, pp.root0, i, b);
            x1[k] = two ? unpack_at(s1, f, map1, pp.root1, i, b) : 0.0f;
            packed_rule_at(r, a, first, &p[i], &x0[k], &x1[k], grad[i]);
            if (pp.root0) x0[k] = sqrt_rn(x0[k]);
            if (pp.root1) x1[k] = sqrt_rn(x1[k]);
            m0 = fmaxf(m0, fabsf(x0[k])), m1 = fmaxf(m1, fabsf(x1[k]));
        }
        amax[0][threadIdx.x] = m0, amax[1][threadIdx.x] = m1;
        __syncthreads();  // every thread has read the old absmax too
        for (int w = THREADS / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w) {
                amax[0][threadIdx.x] = fmaxf(amax[0][threadIdx.x], amax[0][threadIdx.x + w]);
                amax[1][threadIdx.x] = fmaxf(amax[1][threadIdx.x], amax[1][threadIdx.x + w]);
            }
            __syncthreads();
        }
        m0 = amax[0][0], m1 = amax[1][0];
        if (f == STATE_INT8 && threadIdx.x == 0) {
            s0.absmax[b] = m0;
            if (two) s1.absmax[b] = m1;
        }
        for (int k = 0; k < PACK_PER_THREAD; k++) {
            const int64_t i = b * QUANT_BLOCK + threadIdx.x + (int64_t)k * THREADS;
            if (i >= n) continue;
            pack_at(s0, f, map0, r.rule != RULE_ADADELTA, m0, x0[k], i);
            if (two) pack_at(s1, f, map1, false, m1, x1[k], i);
        }
        __syncthreads();  // amax is reused by the next block
    }
}

static void cuda_optim_step_packed(float *p, PackedState s0, PackedState s1, const float *grad,
                                   int64_t n, StateFormat f, StepScalars r,
                                   const ScalerState *gate, uint64_t step) {
    if (n <= 0) return;
    int64_t blocks = quant_blocks(n), cap = (int64_t)g.sms * 8;
    packed_step_kernel<<<(unsigned)(blocks < cap ? blocks : cap), THREADS, 0, g.stream>>>(
        p, s0, s1, grad, n, f, r, gate, step);
    LAUNCH_CHECK();
}

// ---- the table -------------------------------------------------------------------------------

static Kernels g_table;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_error[512];  // set when set-up failed: the message for every caller

static void set_error(const char *fmt, const char *what, cudaError_t e) {
    snprintf(g_error, sizeof g_error, fmt, what, cudaGetErrorString(e));
    (void)cudaGetLastError();
}

// Once per process: find a GPU, check that this build has code for it, create the stream
// and the cuBLAS handle. Failures become messages, not aborts: device=cuda on a machine
// without a usable GPU is a user error.
static void cuda_init(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        set_error("device=cuda: no CUDA GPU found (%s: %s); use device=cpu", "cudaGetDeviceCount", e);
        return;
    }
    if (count == 0) {
        snprintf(g_error, sizeof g_error,
                 "device=cuda: no CUDA GPU found (cudaGetDeviceCount: 0 devices); use device=cpu");
        return;
    }
    int dev = 0;
    cudaDeviceProp prop;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
        set_error("device=cuda: cannot query the GPU (%s: %s)", "cudaGetDeviceProperties", e);
        return;
    }
    // A GPU older than the build's targets has no image for our kernels: say so now
    // rather than at the first launch.
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, relu_forward_kernel)) != cudaSuccess) {
        snprintf(g_error, sizeof g_error,
                 "device=cuda: this build has no kernels for GPU %d (%s, compute capability "
                 "%d.%d): %s; rebuild with a -gencode for it in NVFLAGS, or use device=cpu",
                 dev, prop.name, prop.major, prop.minor, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return;
    }
    if ((e = cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking)) != cudaSuccess) {
        set_error("device=cuda: cannot set up the GPU (%s: %s)", "cudaStreamCreate", e);
        return;
    }
    cublasStatus_t s = cublasCreate(&g.blas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(g.blas, g.stream);
    // Plain fp32 products, no TF32 (CUBLAS_DEFAULT_MATH; NVIDIA_TF32_OVERRIDE=1 in the
    // environment would still allow it).
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH);
    if (s == CUBLAS_STATUS_SUCCESS && !(g.blas_workspace = cuda_alloc(CUBLAS_WORKSPACE_BYTES))) {
        snprintf(g_error, sizeof g_error, "device=cuda: no room on the GPU for cuBLAS's "
                 "workspace (%zu MiB)", CUBLAS_WORKSPACE_BYTES >> 20);
        return;
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(g.blas, g.blas_workspace, CUBLAS_WORKSPACE_BYTES);
    if (s == CUBLAS_STATUS_SUCCESS && !(g.slab_scratch = cuda_alloc(SLAB_SCRATCH_BYTES))) {
        snprintf(g_error, sizeof g_error, "device=cuda: no room on the GPU for the reductions' "
                 "scratch (%zu MiB)", SLAB_SCRATCH_BYTES >> 20);
        return;
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(g_error, sizeof g_error, "device=cuda: cannot set up cuBLAS (%s)",
                 cublasGetStatusString(s));
        return;
    }
    g.sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    float map[QUANT_MAP_FLOATS];
    quant_map_fill(map);
    if ((e = cudaMemcpyToSymbol(quant_map_dev, map, sizeof map)) != cudaSuccess) {
        set_error("device=cuda: cannot set up the GPU (%s: %s)", "cudaMemcpyToSymbol", e);
        return;
    }
    size_t avail;
    if ((e = cudaMemGetInfo(&avail, &g.used_at_init)) != cudaSuccess) {
        set_error("device=cuda: cannot query the GPU's memory (%s: %s)", "cudaMemGetInfo", e);
        return;
    }
    g.used_at_init -= avail;  // total - free

    Kernels *k = &g_table;
    k->name = "cuda";
    k->host_memory = false;  // device pointers: the host reads them through download
    k->fp16_scratch_bytes = (size_t)256 << 20;
    k->chunk_bytes = (size_t)64 << 20;
    k->alloc = cuda_alloc;
    k->release = cuda_release;
    k->upload = cuda_upload;
    k->download = cuda_download;
    k->zero = cuda_zero;
    k->copy = cuda_copy;
    k->sync = cuda_sync;
    k->device_memory = cuda_device_memory;
    k->shard_count = cuda_shard_count;
    k->shards = cuda_shards;
    k->add_parts = cuda_add_parts;
    k->gemm = cuda_gemm;
    k->gemm_arith = cuda_gemm_arith;
    k->im2col = cuda_im2col;
    k->winograd_input = cuda_winograd_input;
    k->winograd_input_backward = cuda_winograd_input_backward;
    k->winograd_output = cuda_winograd_output;
    k->winograd_output_backward = cuda_winograd_output_backward;
    k->winograd_weights = cuda_winograd_weights;
    k->winograd_weights_backward = cuda_winograd_weights_backward;
    k->gemm_batched = cuda_gemm_batched;
    k->col2im = cuda_col2im;
    k->conv_direct_forward = cuda_conv_direct_forward;
    k->conv_direct_backward = cuda_conv_direct_backward;
    k->conv_grouped_forward = cuda_conv_grouped_forward;
    k->conv_grouped_backward_data = cuda_conv_grouped_backward_data;
    k->conv_grouped_backward_weight = cuda_conv_grouped_backward_weight;
    k->conv_grouped_scratch_floats = cuda_conv_grouped_scratch_floats;
    k->bias_act_forward = cuda_bias_act_forward;
    k->bias_act_backward = cuda_bias_act_backward;
    k->relu_forward = cuda_relu_forward;
    k->relu_backward = cuda_relu_backward;
    k->add_act = cuda_add_act;
    k->maxpool_forward = cuda_maxpool_forward;
    k->maxpool_backward = cuda_maxpool_backward;
    k->avgpool_forward = cuda_avgpool_forward;
    k->avgpool_backward = cuda_avgpool_backward;
    k->global_avgpool_forward = cuda_global_avgpool_forward;
    k->global_avgpool_backward = cuda_global_avgpool_backward;
    k->bn_sums = cuda_bn_sums;
    k->bn_batch_stats = cuda_bn_batch_stats;
    k->bn_eval_stats = cuda_bn_eval_stats;
    k->bn_forward = cuda_bn_forward;
    k->bn_backward_sums = cuda_bn_backward_sums;
    k->bn_backward = cuda_bn_backward;
    k->bn_param_grads = cuda_bn_param_grads;
    k->dropout_forward = cuda_dropout_forward;
    k->dropout_backward = cuda_dropout_backward;
    k->nhwc_to_nchw = cuda_nhwc_to_nchw;
    k->nchw_to_nhwc = cuda_nchw_to_nhwc;
    k->log_softmax_forward = cuda_log_softmax_forward;
    k->log_softmax_backward = cuda_log_softmax_backward;
    k->nll_loss = cuda_nll_loss;
    k->f32_to_f16 = cuda_f32_to_f16;
    k->f16_to_f32 = cuda_f16_to_f32;
    k->f32_to_bf16 = cuda_f32_to_bf16;
    k->bf16_to_f32 = cuda_bf16_to_f32;
    k->u8_to_f32 = cuda_u8_to_f32;
    k->act_pack = cuda_act_pack;
    k->act_unpack = cuda_act_unpack;
    k->unscale_check = cuda_unscale_check;
    k->scaler_update = cuda_scaler_update;
    k->adadelta_step = cuda_adadelta_step;
    k->sgd_step = cuda_sgd_step;
    k->adamw_step = cuda_adamw_step;
    k->optim_step_packed = cuda_optim_step_packed;
    k->sum_squares = cuda_sum_squares;
    k->clip_scale = cuda_clip_scale;
}

// The CUDA table, or NULL with a message when no usable GPU is here (set up once; every
// call gives the same answer).
extern "C" const Kernels *cnn_cuda_kernels(Error *err) {
    pthread_once(&g_once, cuda_init);
    if (g_error[0]) {
        err_set(err, "%s", g_error);
        return NULL;
    }
    return &g_table;
}
