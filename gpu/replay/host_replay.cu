// host_replay.cu: gpu/cuda_kernels.cu replayed on the host, to test it where no GPU is.
//
// Includes the real source and builds a table whose entries run the same per-element
// __host__ __device__ bodies on the host, over every index; the block reductions
// (bias_act_backward's sums, the NLL metrics) are replayed with the same partial sums and tree; the
// GEMM goes through the same row-major -> column-major argument mapping into a column-major
// reference with cuBLAS's semantics and argument checks (loops in double; OpenBLAS's
// column-major sgemm for large products, to keep whole training runs fast enough). Linked with
// tests/test_gpu.c in place of the real table (`make test-gpu-replay`), it checks the
// index arithmetic, the summation orders, the first-maximum and NaN rules, the RNG use, the
// fp16 bit handling (through cuda_fp16.h's host conversions), the Adadelta expression and
// the GEMM operand mapping against the CPU table. What it cannot check: the device's own
// arithmetic (its exp, log, expf and conversion instructions), the launches, the block
// reductions' shared memory and barriers, streams and synchronisation, cuBLAS itself.
// It is not built into libcnn.a (the Makefile takes gpu/*.cu only).
#define cuda_kernels cuda_kernels_device
#include "../cuda_kernels.cu"
#undef cuda_kernels

#include <stdlib.h>
#include <cblas.h>

// Each allocation's size sits in the 256 bytes before it, for device_memory's count.
static size_t replay_taken;
static void *replay_alloc(size_t bytes) {
    char *p = NULL;
    if (bytes > ((size_t)1 << 32)) return NULL;  // keeps test_gpu's 8.6 GB test off the host
    if (posix_memalign((void **)&p, 256, 256 + (bytes ? bytes : 256))) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    replay_taken += bytes;
    memset(p + 256, 0xa5, bytes);  // garbage, as cudaMalloc leaves it
    return p + 256;
}
static void replay_release(void *p) {
    if (!p) return;
    size_t bytes;
    memcpy(&bytes, (char *)p - 256, sizeof bytes);
    replay_taken -= bytes;
    free((char *)p - 256);
}
static void replay_device_memory(size_t *avail, size_t *taken, size_t *baseline) {
    *avail = (size_t)1 << 34, *taken = replay_taken, *baseline = 0;  // a 16 GiB device
}
static void replay_copy(void *d, const void *s, size_t n) { if (n) memmove(d, s, n); }
static void replay_zero(void *p, size_t n) { memset(p, 0, n); }
static void replay_sync(void) {}

// cublasSgemm's definition, column-major: C = alpha op1(A1) op2(A2) + beta C, with C not
// read when beta == 0.
static void ref_sgemm_cm(cublasOperation_t o1, cublasOperation_t o2, int m, int n, int k,
                         float alpha, const float *a1, int ld1, const float *a2, int ld2,
                         float beta, float *c, int ldc) {
    if (o1 == CUBLAS_OP_N ? ld1 < (m > 1 ? m : 1) : ld1 < (k > 1 ? k : 1)) abort();
    if (o2 == CUBLAS_OP_N ? ld2 < (k > 1 ? k : 1) : ld2 < (n > 1 ? n : 1)) abort();
    if (ldc < (m > 1 ? m : 1)) abort();
    if ((int64_t)m * n * k > (1 << 22)) {  // large: OpenBLAS has the same column-major semantics
        cblas_sgemm(CblasColMajor, o1 == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    o2 == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha, a1, ld1, a2,
                    ld2, beta, c, ldc);
        return;
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                const float x = o1 == CUBLAS_OP_N ? a1[i + (int64_t)p * ld1] : a1[p + (int64_t)i * ld1];
                const float y = o2 == CUBLAS_OP_N ? a2[p + (int64_t)j * ld2] : a2[j + (int64_t)p * ld2];
                s += (double)x * y;
            }
            float *out = &c[i + (int64_t)j * ldc];
            *out = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *out));
        }
}

// gemm_arith: the inputs rounded to TF32 (10 mantissa bits) or bf16 (7), to nearest even,
// as the tensor cores take them.
static GemmArith replay_arith = GEMM_FP32;
static void replay_gemm_arith(GemmArith arith) { replay_arith = arith; }
static float *rounded_copy(const float *x, int64_t n) {
    if (replay_arith == GEMM_FP32) return NULL;
    const int drop = replay_arith == GEMM_TF32 ? 13 : 16;  // mantissa bits dropped
    const uint32_t half = (1u << (drop - 1)) - 1, keep = ~((1u << drop) - 1);
    float *y = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    if (!y) abort();
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + half + ((u >> drop) & 1u)) & keep;
        memcpy(&y[i], &u, sizeof u);
    }
    return y;
}

static void replay_gemm(float *C, const float *A, const float *B, int M, int N, int K, bool transA,
                     bool transB, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    float *a = rounded_copy(A, (int64_t)M * K);
    float *b = rounded_copy(B, (int64_t)K * N);
    const ColumnMajorGemm c = gemm_for_cublas(C, a ? a : A, b ? b : B, M, N, K, transA, transB);
    ref_sgemm_cm(c.op1, c.op2, c.m, c.n, c.k, alpha, c.a1, c.ld1, c.a2, c.ld2, beta, c.c, c.ldc);
    free(a), free(b);
}

static void replay_gemm_batched(float *C, const float *A, const float *B, int count, int M, int N,
                                int K, bool transA, bool transB, float alpha, float beta,
                                int64_t stride_c, int64_t stride_a, int64_t stride_b) {
    for (int i = 0; i < count; i++)
        replay_gemm(C + i * stride_c, A + i * stride_a, B + i * stride_b, M, N, K, transA, transB,
                    alpha, beta);
}
static void replay_winograd_input(float *V, const float *in, ConvGeometry g) {
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, g.C);
    for (int64_t i = 0; i < T * g.C; i++) winograd_input_at(i, V, in, g, S);
}
static void replay_winograd_input_backward(float *din, const float *dV, ConvGeometry g) {
    const int64_t S = winograd_stride(winograd_tiles(g), g.C);
    const int covered = winograd_covered_rows(g), TH = (g.OH + 1) / 2;
    for (int64_t i = 0; covered < g.H && i < (int64_t)g.N * (g.H - covered) * g.W * g.C; i++)
        winograd_zero_rows_at(i, din, g, covered);
    for (int odd = 0; odd < 2; odd++)
        for (int64_t i = 0; i < (int64_t)g.N * ((TH - odd + 1) / 2) * g.C; i++)
            winograd_input_backward_at(i, din, dV, g, S, odd);
}
static void replay_winograd_output(float *out, const float *M, ConvGeometry g) {
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, g.OC);
    for (int64_t i = 0; i < T * g.OC; i++) winograd_output_at(i, out, M, g, S);
}
static void replay_winograd_output_backward(float *dM, const float *dout, ConvGeometry g) {
    const int64_t T = winograd_tiles(g), S = winograd_stride(T, g.OC);
    for (int64_t i = 0; i < T * g.OC; i++) winograd_output_backward_at(i, dM, dout, g, S);
}
static void replay_winograd_weights(float *U, const float *w, int OC, int C) {
    for (int64_t i = 0; i < (int64_t)OC * C; i++) winograd_weights_at(i, U, w, (int64_t)OC * C);
}
static void replay_winograd_weights_backward(float *dw, const float *dU, int OC, int C) {
    for (int64_t i = 0; i < (int64_t)OC * C; i++) winograd_weights_backward_at(i, dw, dU, (int64_t)OC * C);
}
static void replay_im2col(float *col, const float *in, int N, int H, int W, int C, int K, int stride,
                       int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * OH * OW * C * K * K; i++) im2col_at(i, col, in, w);
}
static void replay_col2im(float *din, const float *col, int N, int H, int W, int C, int K, int stride,
                       int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * H * W * C; i++) col2im_at(i, din, col, w);
}
static void replay_conv_direct_forward(float *out, const float *in, const float *w, const float *bias,
                                       ConvGeometry g, Activation act) {
    for (int64_t i = 0; i < (int64_t)g.N * g.OH * g.OW * g.OC; i++)
        conv_direct_forward_at(i, out, in, w, bias, g, act);
}
static void replay_conv_direct_backward(float *din, float *dw, float *dbias, float *partial,
                                        const float *dout, const float *in, const float *out,
                                        const float *w, ConvGeometry g, Activation act) {
    const int64_t parts = conv_direct_partial_floats(g);
    for (int64_t j = 0; j < parts && dw; j++) conv_direct_partial_at(j, partial, dout, in, out, g, act);
    for (int64_t e = 0; e < parts / conv_direct_parts(g) && dw; e++) conv_direct_reduce_at(e, dw, dbias, partial, g);
    if (din)
        for (int64_t i = 0; i < (int64_t)g.N * g.H * g.W * g.C; i++)
            conv_direct_din_at(i, din, dout, out, w, g, act);
}
static void replay_conv_grouped_forward(float *out, const float *in, const float *w, const float *bias,
                                        ConvGeometry g, int groups, Activation act) {
    for (int64_t i = 0; i < (int64_t)g.N * g.OH * g.OW * g.OC; i++)
        conv_grouped_forward_at(i, out, in, w, bias, g, groups, act);
}
static void replay_conv_grouped_backward_data(float *din, const float *dy, const float *w, ConvGeometry g,
                                              int groups) {
    for (int64_t i = 0; i < (int64_t)g.N * g.H * g.W * g.C; i++) conv_grouped_din_at(i, din, dy, w, g, groups);
}
static void replay_conv_grouped_backward_weight(float *dw, float *scratch, const float *dy, const float *in,
                                                ConvGeometry g, int groups) {
    const int64_t rows = (int64_t)g.N * g.OH, E = (int64_t)g.OC * (g.C / groups) * g.K * g.K;
    for (int64_t j = 0; j < rows * E; j++) conv_grouped_rows_at(j, scratch, dy, in, g, groups);
    for (int64_t e = 0; e < E && rows > 0; e++) conv_grouped_reduce_at(e, dw, scratch, rows, E);
}
static void replay_bias_act_forward(float *out, const float *bias, int64_t rows, int cols,
                                 Activation act) {
    if (!bias && act == ACT_NONE) return;
    for (int64_t i = 0; i < rows * cols; i++) bias_act_at(i, out, bias, cols, act);
}
// The column sums' slab scratch (SLAB_SCRATCH_BYTES, as the backend's).
static double replay_slabs[SLAB_SCRATCH_BYTES / sizeof(double)];

// The kernels' algorithm: the activation's gradient in place, then for each slab the same lane sums
// and the bias kernel's tree over them, and the slabs added in order.
static void replay_bias_act_backward(float *dbias, float *dout, const float *y, int64_t rows, int cols,
                                     Activation act) {
    if (act != ACT_NONE)
        for (int64_t i = 0; i < rows * cols; i++) relu_backward_at(i, dout, dout, y, act);
    if (!dbias || rows <= 0) return;
    const int slabs = slab_count(rows, cols, sizeof(float));
    float *slab_part = (float *)replay_slabs;
    for (int j = 0; j < slabs; j++)
        for (int c = 0; c < cols; c++) {
            float part[BB_ROWS];
            const int64_t r0 = slab_start(rows, slabs, j), r1 = slab_start(rows, slabs, j + 1);
            for (int ty = 0; ty < BB_ROWS; ty++) part[ty] = bias_lane_sum(dout, r0, r1, cols, c, ty);
            for (int half = BB_ROWS / 2; half > 0; half /= 2)
                for (int ty = 0; ty < half; ty++) part[ty] += part[ty + half];
            if (slabs == 1) dbias[c] += part[0];
            else slab_part[(int64_t)j * cols + c] = part[0];
        }
    if (slabs > 1)
        for (int c = 0; c < cols; c++) bias_slabs_at(c, dbias, slab_part, slabs, cols);
}
static void replay_add_parts(float *dst, const float *parts, int count, int64_t n, int64_t stride) {
    for (int64_t i = 0; i < n; i++) add_parts_at(i, dst, parts, count, stride);
}
static void replay_relu_forward(float *out, const float *in, int64_t n, Activation act) {
    for (int64_t i = 0; i < n; i++) relu_forward_at(i, out, in, act);
}
static void replay_relu_backward(float *din, const float *dout, const float *out, int64_t n,
                                 Activation act) {
    for (int64_t i = 0; i < n; i++) relu_backward_at(i, din, dout, out, act);
}
static void replay_maxpool_forward(float *out, uint8_t *argmax, const float *in, int N, int H, int W,
                                   int C, int K, int stride, int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * OH * OW * C; i++) maxpool_forward_at(i, out, argmax, in, w);
}
static void replay_maxpool_backward(float *din, const float *dout, const uint8_t *argmax, int N, int H,
                                    int W, int C, int K, int stride, int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * H * W * C; i++) maxpool_backward_at(i, din, dout, argmax, w);
}
static void replay_avgpool_forward(float *out, const float *in, int N, int H, int W, int C, int K,
                                   int stride, int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * OH * OW * C; i++) avgpool_forward_at(i, out, in, w);
}
static void replay_avgpool_backward(float *din, const float *dout, int N, int H, int W, int C, int K,
                                    int stride, int pad, int OH, int OW) {
    const Window w = {H, W, C, K, stride, pad, OH, OW};
    for (int64_t i = 0; i < (int64_t)N * H * W * C; i++) avgpool_backward_at(i, din, dout, w);
}
static void replay_global_avgpool_forward(float *out, const float *in, int N, int64_t HW, int C) {
    for (int64_t i = 0; i < (int64_t)N * C; i++) global_avgpool_forward_at(i, out, in, HW, C);
}
static void replay_global_avgpool_backward(float *din, const float *dout, int N, int64_t HW, int C) {
    for (int64_t i = 0; i < (int64_t)N * HW * C; i++) global_avgpool_backward_at(i, din, dout, HW, C);
}
static void replay_add_act(float *out, const float *a, const float *b, int64_t n, Activation act) {
    for (int64_t i = 0; i < n; i++) add_act_at(i, out, a, b, act);
}
// The kernels' algorithm: for each unit of each sample the same lane sums and the same
// tree per channel, and the units added in order, as many at a time as a launch takes.
static void replay_bn_column_sums(double *acc, const float *x, const float *dout, BnChannels s,
                                  int64_t rows, int64_t sample_rows, int C, Activation act) {
    if (rows <= 0 || sample_rows <= 0) return;
    const int64_t units = rows / sample_rows * bn_unit_count(sample_rows);
    for (int64_t u0 = 0; u0 < units; u0 += bn_units_a_launch(C)) {
        const int nu = (int)(units - u0 < bn_units_a_launch(C) ? units - u0 : bn_units_a_launch(C));
        for (int j = 0; j < nu; j++)
            for (int c = 0; c < C; c++) {
                double p1[BB_ROWS], p2[BB_ROWS];
                int64_t r0, r1;
                bn_unit_rows(u0 + j, sample_rows, &r0, &r1);
                for (int ty = 0; ty < BB_ROWS; ty++)
                    bn_lane_sums(x, dout, s, r0, r1, C, c, ty, act, &p1[ty], &p2[ty]);
                for (int half = BB_ROWS / 2; half > 0; half /= 2)
                    for (int ty = 0; ty < half; ty++) p1[ty] += p1[ty + half], p2[ty] += p2[ty + half];
                if (nu == 1) {
                    acc[c] += p1[0];
                    acc[C + c] += p2[0];
                } else {
                    replay_slabs[(int64_t)j * 2 * C + c] = p1[0];
                    replay_slabs[(int64_t)j * 2 * C + C + c] = p2[0];
                }
            }
        if (nu > 1)
            for (int64_t i = 0; i < 2 * (int64_t)C; i++) bn_units_at(i, acc, replay_slabs, nu, C);
    }
}
static void replay_bn_sums(double *acc, const float *x, int64_t rows, int64_t sample_rows, int C) {
    replay_bn_column_sums(acc, x, NULL, BnChannels{}, rows, sample_rows, C, ACT_NONE);
}
static void replay_bn_backward_sums(double *acc, const float *dout, const float *x, const float *out,
                                    const float *mean, const float *invstd, const float *gamma,
                                    const float *beta, int64_t rows, int64_t sample_rows, int C,
                                    Activation act) {
    replay_bn_column_sums(acc, x, dout, BnChannels{mean, invstd, gamma, beta, out}, rows, sample_rows, C, act);
}
static void replay_bn_batch_stats(float *mean, float *invstd, float *running_mean, float *running_var,
                                  const double *acc, int C, int64_t count, double eps,
                                  double momentum) {
    for (int c = 0; c < C; c++)
        bn_batch_stats_at(c, mean, invstd, running_mean, running_var, acc, C, count, eps, momentum);
}
static void replay_bn_eval_stats(float *mean, float *invstd, const float *running_mean,
                                 const float *running_var, int C, double eps) {
    for (int c = 0; c < C; c++) bn_eval_stats_at(c, mean, invstd, running_mean, running_var, eps);
}
static void replay_bn_forward(float *out, const float *x, const float *mean, const float *invstd,
                              const float *gamma, const float *beta, int64_t rows, int C,
                              Activation act) {
    for (int64_t i = 0; i < rows * C; i++)
        bn_forward_at(i, out, x, mean, invstd, gamma, beta, C, act);
}
static void replay_bn_backward(float *din, const float *dout, const float *x, const float *out,
                               const float *mean, const float *invstd, const float *gamma,
                               const float *beta, const double *acc, int64_t rows, int C,
                               int64_t count, Activation act) {
    const BnChannels s = {mean, invstd, gamma, beta, out};
    for (int64_t i = 0; i < rows * C; i++) bn_backward_at(i, din, dout, x, s, acc, C, count, act);
}
static void replay_bn_param_grads(float *dgamma, float *dbeta, const double *acc, int C) {
    for (int c = 0; c < C; c++) bn_param_grads_at(c, dgamma, dbeta, acc, C);
}
static void replay_dropout(float *out, const float *in, int64_t n, float p, uint64_t key,
                        uint64_t offset) {
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++) dropout_at(i, out, in, p, scale, key, offset);
}
static void replay_nhwc_to_nchw(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W;
    for (int64_t i = 0; i < N * hw * C; i++) nhwc_to_nchw_at(i, out, in, hw, C);
}
static void replay_nchw_to_nhwc(float *out, const float *in, int N, int H, int W, int C) {
    const int64_t hw = (int64_t)H * W;
    for (int64_t i = 0; i < N * hw * C; i++) nchw_to_nhwc_at(i, out, in, hw, C);
}
static void replay_log_softmax_forward(float *out, const float *in, int N, int C) {
    for (int64_t n = 0; n < N; n++) log_softmax_forward_row(n, out, in, C);
}
static void replay_log_softmax_backward(float *din, const float *dout, const float *out, int N, int C) {
    for (int64_t n = 0; n < N; n++) log_softmax_backward_row(n, din, dout, out, C);
}
// The kernel's algorithm: the same per-thread sums, then the kernel's tree over them.
static void replay_nll_loss(float *dlogp, float *metrics, const float *logp, const int32_t *labels,
                         int N, int C, float scale, float smoothing, const ScalerState *scaler) {
    double loss[NLL_THREADS];
    int correct[NLL_THREADS];
    for (int t = 0; t < NLL_THREADS; t++) nll_lane(logp, labels, N, C, smoothing, t, &loss[t], &correct[t]);
    for (int half = NLL_THREADS / 2; half > 0; half /= 2)
        for (int t = 0; t < half; t++) loss[t] += loss[t + half], correct[t] += correct[t + half];
    metrics[0] += (float)loss[0];
    metrics[1] += (float)correct[0];
    float on, off;
    nll_targets(smoothing, C, &on, &off);
    if (dlogp)
        for (int64_t i = 0; i < (int64_t)N * C; i++)
            nll_grad_at(i, dlogp, labels, C, nll_grad_scale(scale, scaler), on, off);
}
static void replay_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = f32_to_f16_bits(in[i]);
}
static void replay_f16_to_f32(float *out, const uint16_t *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = f16_bits_to_f32(in[i]);
}
static void replay_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_from_float(in[i]);
}
static void replay_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_float(in[i]);
}
static void replay_u8_to_f32(float *out, const uint8_t *in, int64_t n, int C, const float *lut) {
    for (int64_t i = 0; i < n; i++) out[i] = u8_value_at(i, in, C, lut);
}
static void replay_act_pack(void *dst, const float *x, int64_t values, int n, int bits, uint64_t key,
                            int64_t sample0) {
    const int64_t total = n * ((values + ACT_GROUP - 1) / ACT_GROUP);
    for (int64_t q = 0; q < total; q++) act_pack_at(q, (unsigned char *)dst, x, values, bits, key, sample0);
}
static void replay_act_unpack(float *x, const void *src, int64_t values, int n, int bits) {
    const int64_t total = n * ((values + ACT_GROUP - 1) / ACT_GROUP);
    for (int64_t q = 0; q < total; q++) act_unpack_at(q, x, (const unsigned char *)src, values, bits);
}
static void replay_unscale_check(float *grad, int64_t n, ScalerState *s) {
    bool bad = false;
    for (int64_t i = 0; i < n; i++) bad |= scale_check_at(i, grad, unscale_factor(s));
    if (bad) s->found = 1.0f;
}
static void replay_scaler_update(ScalerState *s, ScalerRules r) { scaler_advance(s, r); }
static void replay_adadelta_step(float *p, float *sq, float *acc, const float *grad, int64_t n,
                                 float lr, float rho, float eps, float wd, const ScalerState *gate) {
    int64_t taken;
    if (!scaler_gate(gate, 0, &taken)) return;
    for (int64_t i = 0; i < n; i++) adadelta_at(i, p, sq, acc, grad, lr, rho, eps, wd);
}

static void replay_sgd_step(float *p, float *buf, const float *grad, int64_t n, float lr,
                            float momentum, float omd, float wd, bool nesterov,
                            const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    for (int64_t i = 0; i < n; i++) sgd_at(i, p, buf, grad, lr, momentum, omd, wd, nesterov, taken == 0);
}
static void replay_adamw_step(float *p, float *m, float *v, const float *grad, int64_t n,
                              AdamWHyper h, const ScalerState *gate, uint64_t step) {
    int64_t taken;
    if (!scaler_gate(gate, step, &taken)) return;
    const AdamWScalars a = adamw_scalars(h, taken);
    for (int64_t i = 0; i < n; i++) adamw_at(i, p, m, v, grad, a);
}

// packed_step_kernel, a CUDA block (one block of values) after another, its threads'
// values in any order: the block's absmax is a maximum.
static float replay_quant_map[QUANT_MAP_FLOATS];
static void replay_optim_step_packed(float *p, PackedState s0, PackedState s1, const float *grad,
                                     int64_t n, StateFormat f, StepScalars r,
                                     const ScalerState *gate, uint64_t step) {
    PackedPlan pp;
    if (!packed_plan(r, f, gate, step, &pp)) return;
    const AdamWScalars a = pp.a;
    const bool two = pp.two, first = pp.first;
    const float *map0 = replay_quant_map + pp.map0, *map1 = replay_quant_map + pp.map1;
    static float x0[QUANT_BLOCK], x1[QUANT_BLOCK];
    for (int64_t b = 0; b < quant_blocks(n); b++) {
        const int64_t i0 = b * QUANT_BLOCK, m = n - i0 < QUANT_BLOCK ? n - i0 : QUANT_BLOCK;
        float m0 = 0.0f, m1 = 0.0f;
        for (int64_t k = 0; k < m; k++) {
            x0[k] = unpack_at(s0, f, map0, pp.root0, i0 + k, b);
            x1[k] = two ? unpack_at(s1, f, map1, pp.root1, i0 + k, b) : 0.0f;
            packed_rule_at(r, a, first, &p[i0 + k], &x0[k], &x1[k], grad[i0 + k]);
            if (pp.root0) x0[k] = sqrt_rn(x0[k]);
            if (pp.root1) x1[k] = sqrt_rn(x1[k]);
            m0 = fmaxf(m0, fabsf(x0[k])), m1 = fmaxf(m1, fabsf(x1[k]));
        }
        if (f == STATE_INT8) {
            s0.absmax[b] = m0;
            if (two) s1.absmax[b] = m1;
        }
        for (int64_t k = 0; k < m; k++) {
            pack_at(s0, f, map0, r.rule != RULE_ADADELTA, m0, x0[k], i0 + k);
            if (two) pack_at(s1, f, map1, false, m1, x1[k], i0 + k);
        }
    }
}

// sumsq_blocks_kernel and sumsq_total_kernel: each block's threads, then its tree, then the
// blocks in order.
static void replay_sum_squares(double *out, const float *x, int64_t n) {
    const int64_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        double part[SUMSQ_THREADS];
        for (int t = 0; t < SUMSQ_THREADS; t++) part[t] = sumsq_lane(x, n, b, t);
        for (int half = SUMSQ_THREADS / 2; half > 0; half /= 2)
            for (int t = 0; t < half; t++) part[t] = dadd_rn(part[t], part[t + half]);
        total = dadd_rn(total, part[0]);
    }
    *out = total;
}
static void replay_clip_scale(float *x, int64_t n, const double *sumsq, float max_norm) {
    const float s = clip_coef(*sumsq, max_norm);
    for (int64_t i = 0; i < n; i++) clip_scale_at(i, x, s);
}

// Stands in for the CUDA table, under its name.
static Kernels replay_table;

extern "C" const Kernels *cuda_kernels(Error *err) {
    (void)err;
    Kernels *k = &replay_table;
    k->name = "cuda";
    k->fp16_scratch_bytes = (size_t)256 << 20;
    k->chunk_bytes = (size_t)64 << 20;
    k->alloc = replay_alloc, k->release = replay_release, k->upload = replay_copy, k->download = replay_copy;
    k->zero = replay_zero, k->copy = replay_copy, k->sync = replay_sync, k->gemm = replay_gemm;
    k->device_memory = replay_device_memory, k->gemm_arith = replay_gemm_arith;
    k->shard_count = cuda_shard_count, k->shards = cuda_shards, k->add_parts = replay_add_parts;
    k->winograd_input = replay_winograd_input;
    k->winograd_input_backward = replay_winograd_input_backward;
    k->winograd_output = replay_winograd_output;
    k->winograd_output_backward = replay_winograd_output_backward;
    k->winograd_weights = replay_winograd_weights;
    k->winograd_weights_backward = replay_winograd_weights_backward;
    k->gemm_batched = replay_gemm_batched;
    k->im2col = replay_im2col, k->col2im = replay_col2im, k->bias_act_forward = replay_bias_act_forward;
    k->conv_direct_forward = replay_conv_direct_forward;
    k->conv_direct_backward = replay_conv_direct_backward;
    k->conv_grouped_forward = replay_conv_grouped_forward;
    k->conv_grouped_backward_data = replay_conv_grouped_backward_data;
    k->conv_grouped_backward_weight = replay_conv_grouped_backward_weight;
    k->conv_grouped_scratch_floats = cuda_conv_grouped_scratch_floats;
    k->bias_act_backward = replay_bias_act_backward;
    k->relu_forward = replay_relu_forward, k->relu_backward = replay_relu_backward;
    k->add_act = replay_add_act;
    k->maxpool_forward = replay_maxpool_forward, k->maxpool_backward = replay_maxpool_backward;
    k->avgpool_forward = replay_avgpool_forward, k->avgpool_backward = replay_avgpool_backward;
    k->global_avgpool_forward = replay_global_avgpool_forward;
    k->global_avgpool_backward = replay_global_avgpool_backward;
    k->bn_sums = replay_bn_sums, k->bn_batch_stats = replay_bn_batch_stats;
    k->bn_eval_stats = replay_bn_eval_stats, k->bn_forward = replay_bn_forward;
    k->bn_backward_sums = replay_bn_backward_sums, k->bn_backward = replay_bn_backward;
    k->bn_param_grads = replay_bn_param_grads;
    k->dropout_forward = replay_dropout, k->dropout_backward = replay_dropout;
    k->nhwc_to_nchw = replay_nhwc_to_nchw, k->nchw_to_nhwc = replay_nchw_to_nhwc;
    k->log_softmax_forward = replay_log_softmax_forward;
    k->log_softmax_backward = replay_log_softmax_backward;
    k->nll_loss = replay_nll_loss, k->f32_to_f16 = replay_f32_to_f16, k->f16_to_f32 = replay_f16_to_f32;
    k->f32_to_bf16 = replay_f32_to_bf16, k->bf16_to_f32 = replay_bf16_to_f32;
    k->u8_to_f32 = replay_u8_to_f32;
    k->act_pack = replay_act_pack, k->act_unpack = replay_act_unpack;
    k->unscale_check = replay_unscale_check, k->scaler_update = replay_scaler_update;
    k->adadelta_step = replay_adadelta_step;
    k->sgd_step = replay_sgd_step, k->adamw_step = replay_adamw_step;
    quant_map_fill(replay_quant_map);
    k->optim_step_packed = replay_optim_step_packed;
    k->sum_squares = replay_sum_squares, k->clip_scale = replay_clip_scale;
    return k;
}
