// kernels.h: the kernel table (DESIGN.md decision 1).
//
// Layers and the network call the device only through a Kernels table; nn/cpu_kernels.c
// implements it on OpenBLAS, gpu/ implements the same table in CUDA. Pointers passed to
// kernels point into the device's memory (from alloc); host pointers are marked `host`.
//
// Conventions: outputs first, then inputs, then dimensions. Activations are channel-last
// (N, H, W, C) row-major. Kernels that write an input gradient overwrite it; kernels that
// write a parameter gradient accumulate into it (zeroing is an explicit step).
#ifndef NN_KERNELS_H
#define NN_KERNELS_H

#include <assert.h>
#include <stdbool.h>
#include <math.h>
#include <stdint.h>

#include "error.h"
#include "quant.h"
#include "scaler.h"

// The arithmetic of GEMMs (Kernels.gemm_arith): fp32, or inputs rounded to TF32 or bf16
// with fp32 accumulation.
typedef enum GemmArith { GEMM_FP32, GEMM_TF32, GEMM_BF16 } GemmArith;

typedef enum Activation { ACT_NONE, ACT_RELU, ACT_RELU6, ACT_COUNT } Activation;
extern const char *const activation_names[ACT_COUNT];  // "none", "relu", "relu6"

// The activations, one definition for the CPU, the CUDA kernels and their host replay.
// ReLU max(x, 0); ReLU6 min(max(x, 0), 6), PyTorch's nn.ReLU6 (Hardtanh(0, 6)). A NaN gives
// 0 with both (x > 0 is false), as ReLU's x > 0 ? x : 0 always has.
// (Selects, not branches: the CPU's loops over them vectorise.)
HOST_DEVICE static inline float act_apply(Activation act, float x) {
    const float relu = x > 0.0f ? x : 0.0f, relu6 = relu > 6.0f ? 6.0f : relu;
    return act == ACT_NONE ? x : act == ACT_RELU ? relu : relu6;
}
// Whether the gradient passes: act'(x) = 1, read from the output y = act(x) or from x (the
// same set: y is 0 iff x <= 0, and 6 iff x >= 6). ReLU where y > 0 (+inf included, as
// PyTorch's threshold_backward); ReLU6 where 0 < y < 6 (hardtanh_backward: 0 at x <= 0 and
// at x >= 6); a NaN never; no activation always.
HOST_DEVICE static inline bool act_passes(Activation act, float y) {
    return (act == ACT_NONE) | ((y > 0.0f) & ((act == ACT_RELU) | (y < 6.0f)));
}

// The outputs whose windows cover input x (>= 0, in padded coordinates) along one axis, for
// the CPU and the CUDA kernels alike: the first output o whose window [o * stride,
// o * stride + K - 1] reaches x, and the last whose window starts at or before x.
HOST_DEVICE static inline int first_window(int x, int K, int stride) {
    const int a = x - K + 1;
    return a <= 0 ? 0 : (a + stride - 1) / stride;
}
HOST_DEVICE static inline int last_window(int x, int stride, int O) {
    const int o = x / stride;
    return o < O - 1 ? o : O - 1;
}

// A convolution over N images (H, W, C) -> (OH, OW, OC), K x K windows.
typedef struct ConvGeometry {
    int N, H, W, C, K, stride, pad, OH, OW, OC;
} ConvGeometry;

#define CONV_DIRECT_MAX_TAPS 32      // C * K * K
#define CONV_DIRECT_MAX_FILTERS 256  // OC
#define CONV_DIRECT_PART_ROWS 256    // output pixels in a block of the parameter gradients
#define CONV_DIRECT_PARTIAL_MAX (1 << 20)  // floats of the blocks' sums, at most (4 MB)

// The blocks of output pixels whose parameter gradients the direct convolution sums on
// their own and then adds in order: one per CONV_DIRECT_PART_ROWS pixels (a GPU thread's
// sum stays short at any batch), fewer where their sums would pass CONV_DIRECT_PARTIAL_MAX.
// A function of the geometry alone: the bits do not depend on the device or the threads.
HOST_DEVICE static inline int64_t conv_direct_parts(ConvGeometry g) {
    const int64_t rows = (int64_t)g.N * g.OH * g.OW, part_floats = (int64_t)(g.C * g.K * g.K + 1) * g.OC;
    const int64_t want = (rows + CONV_DIRECT_PART_ROWS - 1) / CONV_DIRECT_PART_ROWS,
                  most = CONV_DIRECT_PARTIAL_MAX / part_floats;
    return want < 1 ? 1 : want < most ? want : most;
}

HOST_DEVICE static inline int64_t conv_direct_partial_floats(ConvGeometry g) {
    return conv_direct_parts(g) * (g.C * g.K * g.K + 1) * g.OC;
}

// Winograd tiles of ConvGeometry g: 2 x 2 output pixels each.
static inline int64_t winograd_tiles(ConvGeometry g) {
    return (int64_t)g.N * ((g.OH + 1) / 2) * ((g.OW + 1) / 2);
}

// Floats from one matrix (rows x cols) of a transformed tensor to the next: rounded up to
// 4 KB and 64 bytes more, so that the 16 rows a transform writes at once never share
// their cache sets (at 4 KB apart they did: a 64x64 16-channel layer's input transform
// ran 2.5x slower than its im2col).
static inline int64_t winograd_stride(int64_t rows, int cols) {
    return (rows * cols + 1023) / 1024 * 1024 + 16;
}

#define SUMSQ_BLOCK 4096  // Kernels.sum_squares's blocks

// AdamW's hyperparameters, as PyTorch holds them (Python floats: double).
typedef struct AdamWHyper {
    double lr, weight_decay, beta1, beta2, eps;
} AdamWHyper;

// The float scalars of one AdamW step after `taken` steps, computed as PyTorch computes
// them, in double and then rounded: decay = 1 - lr * weight_decay, step_size = lr / (1 -
// beta1^t), bc2_sqrt = sqrt(1 - beta2^t) at t = taken + 1. Every kernel computes them
// with this function; CUDA's pow may differ from the C library's in the last bit of a
// double, which changes a float scalar only when that bit decides its rounding.
typedef struct AdamWScalars {
    float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt;
} AdamWScalars;

HOST_DEVICE static inline AdamWScalars adamw_scalars(AdamWHyper h, int64_t taken) {
    const double t = (double)(taken + 1);
#ifdef __CUDA_ARCH__
    const double decay = __dsub_rn(1.0, __dmul_rn(h.lr, h.weight_decay));  // no FMA contraction
#else
    const double decay = 1.0 - h.lr * h.weight_decay;
#endif
    AdamWScalars a;  // (no compound literal: nvcc compiles this as C++)
    a.decay = (float)decay;
    a.beta1 = (float)h.beta1, a.one_minus_beta1 = (float)(1.0 - h.beta1);
    a.beta2 = (float)h.beta2, a.one_minus_beta2 = (float)(1.0 - h.beta2);
    a.eps = (float)h.eps;
    a.step_size = (float)(h.lr / (1.0 - pow(h.beta1, t)));
    a.bc2_sqrt = (float)sqrt(1.0 - pow(h.beta2, t));
    return a;
}

// One optimizer step's rule and scalars, as the fp32 step kernels take them, for the
// kernel that updates compressed state (Kernels.optim_step_packed).
typedef enum StepRule { RULE_ADADELTA, RULE_SGD, RULE_ADAMW } StepRule;
typedef struct StepScalars {
    StepRule rule;
    float lr, rho, eps, weight_decay;        // adadelta (lr, weight_decay: sgd too)
    float momentum, one_minus_dampening;     // sgd (with momentum: packed state has one)
    bool nesterov;
    AdamWHyper adamw;                        // adamw
} StepScalars;

// torch.nn.utils.clip_grad_norm_'s factor for a sum of squares: max_norm / (norm + 1e-6),
// norm = sqrt(sumsq) rounded to float (torch's norm is a float tensor), every backend's.
HOST_DEVICE static inline float clip_coef(double sumsq, float max_norm) {
    return max_norm / ((float)sqrt(sumsq) + 1e-6f);
}

// The targets of label smoothing e over C classes (Kernels.nll_loss): on the label,
// elsewhere, from doubles.
HOST_DEVICE static inline void nll_targets(float smoothing, int C, float *on, float *off) {
    const double off_d = (double)smoothing / C;
    *on = (float)(1.0 - (double)smoothing + off_d), *off = (float)off_d;
}

// What a packed step works out once, the same on every backend: AdamW's scalars, whether
// this is the first step taken (SGD's momentum starts as the gradient), whether the rule
// has a second state, each state's map (QUANT_SIGNED or QUANT_UNSIGNED), and whether each
// is stored as its square root: int8 state that averages squares (AdamW's exp_avg_sq,
// Adadelta's square_avg and acc_delta), whose values span twice the decades of the
// gradients': AdamW's exp_avg_sq, stored as it is, had values rounded to 0 under a
// momentum that was not (a step of momentum / eps: runs diverged); Adadelta's, stored as
// they are, sat in the map's coarse lower decades, 10-50% apart, where a decay of 10% a
// step rounds back to the same code (resnet-small lost 0.73 points; bench/RESULTS.md).
// False when the gate skips the step.
typedef struct PackedPlan {
    AdamWScalars a;
    bool first, two, root0, root1;
    int map0, map1;
} PackedPlan;

HOST_DEVICE static inline bool packed_plan(StepScalars r, StateFormat f, const ScalerState *gate,
                                           uint64_t step, PackedPlan *p) {
    int64_t taken;
    if (!scaler_gate(gate, r.rule == RULE_ADADELTA ? 0 : step, &taken)) return false;
    p->a = adamw_scalars(r.adamw, r.rule == RULE_ADAMW ? taken : 0);
    p->first = taken == 0, p->two = r.rule != RULE_SGD;
    p->root0 = r.rule == RULE_ADADELTA && f == STATE_INT8;
    p->root1 = r.rule != RULE_SGD && f == STATE_INT8;
    p->map0 = r.rule == RULE_ADADELTA ? QUANT_UNSIGNED : QUANT_SIGNED, p->map1 = QUANT_UNSIGNED;
    return true;
}

// A state tensor in a compressed format (nn/quant.h): its codes, and (int8) the absmax of
// each of its blocks.
typedef struct PackedState {
    void *codes;
    float *absmax;
} PackedState;

typedef struct Kernels {
    const char *name;  // "cpu", "cuda"
    bool host_memory;  // the device's pointers are host memory (the CPU): no copies needed
    // fp16 runs each layer over chunks of samples through four fp32 scratch buffers of at
    // most this many bytes in all (at least one sample a chunk): cache-sized on the CPU
    // (8 MB: as fast as 16 MB on resnet18 and resnet-small, 4 MB was 12% slower on
    // resnet18; bench/RESULTS.md), where a chunk's conversions and compute stay in the
    // caches; larger on a GPU (256 MB), where small chunks would mean small kernels and
    // many launches.
    size_t fp16_scratch_bytes;
    // The workspace a convolution lowers a chunk of its images into (im2col's columns, a
    // Winograd shard's transformed tiles; half of it a shard when there are several):
    // cache-sized on the CPU (2 MB: a chunk stays in the caches from the kernel that
    // writes it to the GEMM that reads it), larger on a GPU (64 MB: GEMMs big enough to
    // fill it, and few launches).
    size_t chunk_bytes;
    // Bytes the backend keeps outside the network's blocks once it has computed with the
    // threads it has now (the CPU: the GEMM's packing buffers of each thread); the plan
    // counts them in its workspace. NULL: none.
    size_t (*thread_scratch)(void);

    // ---- shards: a layer's images through all of its kernels, one share per thread ---
    // How many shards `shards` cuts a layer's images into: the CPU's compute threads, 1 on
    // CUDA. A shard's images stay in one core's caches from one kernel to the next, and the
    // threads meet once a layer instead of after every kernel: on a machine whose two
    // cores are far apart (a VM's vCPUs on different CCDs, 370 ns a cache-line round trip
    // instead of 100) deep.cfg's step took 2.2x as long with kernels that each cut the work
    // their own way, and no longer with shards (bench/PROFILE.md).
    int (*shard_count)(void);
    // Calls fn(arg, s, lo, hi) for each s < shard_count() with the contiguous share [lo,
    // hi) of [0, n) that is shard s's (lo = n * s / count), concurrently, and returns when
    // every one has; the kernels fn calls run on its shard's thread alone. The same n gives
    // the same shares on the same threads in every call.
    void (*shards)(int64_t n, void (*fn)(void *arg, int s, int64_t lo, int64_t hi), void *arg);
    // dst (n) += ((parts[0] + parts[1]) + ...) + parts[count - 1], each part n floats, the
    // parts `stride` floats apart: a sum of shards' partial sums in shard order.
    void (*add_parts)(float *dst, const float *parts, int count, int64_t n, int64_t stride);

    // ---- memory of the device -------------------------------------------------------
    void *(*alloc)(size_t bytes);  // NULL on failure; the caller reports it
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);  // device to device
    void (*sync)(void);  // waits for queued work (no-op on the CPU)
    // Where the device's memory is not the host's (NULL on the CPU): *avail = what the device
    // can still give now; *taken = what this process's alloc calls hold there now, measured
    // (the device's use now less its use once the backend was set up, allocator rounding
    // included); *baseline = the device's use once the backend was set up: the context,
    // the cuBLAS workspace, and whatever other processes hold there.
    void (*device_memory)(size_t *avail, size_t *taken, size_t *baseline);

    // ---- dense algebra ---------------------------------------------------------------
    // C (M, N) = alpha * op(A) @ op(B) + beta * C, all row-major; op(A) is (M, K) and
    // op(B) is (K, N); transA/transB say A is stored (K, M) / B is stored (N, K).
    void (*gemm)(float *C, const float *A, const float *B, int M, int N, int K,
                 bool transA, bool transB, float alpha, float beta);
    // Until called again, gemm and gemm_batched may round their inputs as arith says and
    // accumulate in fp32. GEMM_TF32: 10 mantissa bits (fp16's precision with fp32's range),
    // TF32 tensor cores on CUDA, several times fp32's speed; the CPU computes in fp32 all the
    // same. GEMM_BF16: 7 mantissa bits, bf16 tensor cores on CUDA, and on CPUs with
    // AVX512-BF16 nn/gemm_bf16.c at twice the fp32 rate (fp32 on other CPUs, and for
    // products of fewer than 32 columns or over fewer than 32 values of k, which it runs
    // slower than fp32: nn/cpu_kernels.c bf16_product). The network
    // sets it before each forward and backward (Net.gemm_arith, the cfg's `matmul`): by
    // default TF32 with precision = fp16, whose stored activations and gradients lose
    // nothing by it (what PyTorch's autocast does with fp16 operands), BF16 with bf16, FP32
    // with fp32.
    void (*gemm_arith)(GemmArith arith);

    // ---- convolution lowering --------------------------------------------------------
    // col (N*OH*OW, K*K*C) <- in (N, H, W, C); a row is one output pixel's patch, its
    // columns ordered (kh, kw, c): the weight in PyTorch's layout (OC, C, K, K) is
    // permuted to (OC, K, K, C) to multiply it (nn/conv.c). Zero padding.
    void (*im2col)(float *col, const float *in, int N, int H, int W, int C, int K,
                   int stride, int pad, int OH, int OW);
    // din (N, H, W, C) = sum of col's patches back onto the pixels they came from.
    void (*col2im)(float *din, const float *col, int N, int H, int W, int C, int K,
                   int stride, int pad, int OH, int OW);
    // A convolution's GEMMs without im2col's columns in memory, nor the forward's permuted
    // weight (NULL where the backend has none: CUDA), where conv_gemm_usable says so for
    // the convolution g (its N aside) under the current gemm_arith. The CPU, under
    // GEMM_BF16 on a CPU with AVX512-BF16: the bf16 GEMM's packing reads the input and the
    // weight where they lie, for channels in and out multiples of 32 (a tap's runs read 32
    // at a time): the same bits as im2col into a workspace and gemm with the weight
    // permuted to (OC, K, K, C), where gemm runs the product in bf16 (not over fewer than
    // 32 values of k: a weight gradient over fewer than 32 pixels, which gemm sums in fp32).
    // Else, where AMX is usable, a 3x3 stride-1 convolution padded by 1 of channels in and
    // out multiples of 16 and at least 16 pixels wide (nn/gemm_bf16.h conv_amx_*): bf16
    // operands and fp32 sums in orders of its own.
    bool (*conv_gemm_usable)(ConvGeometry g);
    // out (N*OH*OW, OC) = cols @ w'^T; w (OC, C, K, K) in PyTorch's layout, w' the same
    // in the columns' order (OC, K*K*C). Each output pixel's sums are the same bits
    // whatever images the call has (gemm's for the same M, except where its threads split
    // a small product's K: never here).
    void (*conv_gemm_forward)(float *out, const float *in, const float *w, ConvGeometry g);
    // dw' (OC, K*K*C) in the columns' order += dy^T @ cols, dy (N*OH*OW, OC).
    void (*conv_gemm_weight_grad)(float *dw, const float *dy, const float *in, ConvGeometry g);
    // din (N, H, W, C) = the input gradient of dy (N*OH*OW, OC), for g.stride = 1 alone:
    // the convolution of dy padded by K - 1 - pad with w (PyTorch's layout) turned half a
    // turn, filters and channels swapped, as one product of its columns (never split over
    // K). Not the bits of gemm and col2im: its sums run over (tap, oc) in the GEMM's blocks.
    void (*conv_gemm_data_grad)(float *din, const float *dy, const float *w, ConvGeometry g);

    // ---- Winograd F(2x2, 3x3), for 3x3 stride-1 convolutions (nn/conv.c says when) -----
    // Tile t = (n, ty, tx) of ConvGeometry g (winograd_tiles: N x ceil(OH/2) x ceil(OW/2))
    // covers the output pixels (2ty + i, 2tx + j), i, j < 2, and the 4 x 4 input pixels
    // from (2ty - pad, 2tx - pad), zeros outside the image. A transformed tensor is 16
    // matrices, one per point (a, b) of the 4 x 4 transform, matrix a * 4 + b: V[ab][t][c]
    // and M[ab][t][oc], winograd_stride(T, C) and (T, OC) floats apart, and U[ab][oc][c]
    // (contiguous). With B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
    // G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]:
    // out tile = A^T (the sum over c of U[.][oc][c] * V[.][t][c]) A, as 16 GEMMs.
    // Each transform applies its 1-D formula to the rows, then to the columns, in the
    // order written in cpu_kernels.c (the CUDA bodies repeat it: same bits).
    // V = B^T d B for each tile's input d.
    void (*winograd_input)(float *V, const float *in, ConvGeometry g);
    // Its adjoint: din (N, H, W, C) = the sum over tiles of B dV B^T at their pixels, each
    // pixel's as (its even tile row's right tile + left tile) + (its odd tile row's right
    // tile + left tile), the pairs' missing tiles left out.
    void (*winograd_input_backward)(float *din, const float *dV, ConvGeometry g);
    // out (N, OH, OW, OC) = A^T M A of each tile, cut at the image's edge.
    void (*winograd_output)(float *out, const float *M, ConvGeometry g);
    // Its adjoint: dM = A dY A^T of each tile's 2 x 2 of dout (zeros past the edge).
    void (*winograd_output_backward)(float *dM, const float *dout, ConvGeometry g);
    // U = G w G^T for each (oc, c) of w (OC, C, 3, 3), PyTorch's layout.
    void (*winograd_weights)(float *U, const float *w, int OC, int C);
    // Its adjoint: dw (OC, C, 3, 3) += G^T dU G.
    void (*winograd_weights_backward)(float *dw, const float *dU, int OC, int C);
    // count independent products C_i = alpha op(A_i) @ op(B_i) + beta C_i, as gemm, with
    // A_i at A + i * stride_a floats, B_i at B + i * stride_b, C_i at C + i * stride_c.
    void (*gemm_batched)(float *C, const float *A, const float *B, int count, int M, int N,
                         int K, bool transA, bool transB, float alpha, float beta,
                         int64_t stride_c, int64_t stride_a, int64_t stride_b);

    // ---- direct convolution, for layers with few inputs per output -------------------
    // The convolution of ConvGeometry g without im2col or GEMM, for g.C * g.K * g.K <=
    // CONV_DIRECT_MAX_TAPS and g.OC <= CONV_DIRECT_MAX_FILTERS (nn/conv.c says when).
    // w (OC, C, K, K) in PyTorch's layout; in (N, H, W, C), out (N, OH, OW, OC); zero padding.
    // out = act(bias + the sum over the patch (c, kh, kw), in that order, of in * w); bias
    // may be NULL (0).
    void (*conv_direct_forward)(float *out, const float *in, const float *w, const float *bias,
                                ConvGeometry g, Activation act);
    // With dy = dout * act'(out) (not stored): dw (OC, C, K, K) += the sum over output
    // pixels of dy x patch, dbias (OC) += the sum of dy, each summed over the pixels of
    // conv_direct_parts(g) blocks into partial (device scratch of conv_direct_partial_floats
    // floats) and the blocks added in order; dbias may be NULL (a layer without bias), dw
    // and dbias both NULL (a frozen layer); din (may be NULL) = the sum, over (kh, kw) then
    // oc, of dy * w.
    void (*conv_direct_backward)(float *din, float *dw, float *dbias, float *partial,
                                 const float *dout, const float *in, const float *out,
                                 const float *w, ConvGeometry g, Activation act);

    // ---- grouped convolution (nn/conv_grouped.c): depthwise when groups = C ----------
    // ConvGeometry g in `groups` groups (C and OC multiples of it): output channel oc reads
    // the Cg = C / groups input channels of its group oc / (OC / groups); w (OC, Cg, K, K),
    // PyTorch's layout. in (N, H, W, C), out (N, OH, OW, OC); zero padding. Every sum below
    // runs over the taps inside the image only (the padding's zeros add nothing).
    // out = act_apply(act, bias, or 0, + the sum over (ci, kh, kw), in that order, of
    // in * w), each product and sum rounded apart (no FMA); bias may be NULL.
    void (*conv_grouped_forward)(float *out, const float *in, const float *w, const float *bias,
                                 ConvGeometry g, int groups, Activation act);
    // din (N, H, W, C) = for each input element the sum over (kh, kw), then over its
    // group's output channels in order, of dy * w (overwritten; 0 where no window reaches).
    // dy (N, OH, OW, OC) is the gradient of the convolution's output before any activation.
    void (*conv_grouped_backward_data)(float *din, const float *dy, const float *w, ConvGeometry g,
                                       int groups);
    // dw (OC, Cg, K, K) += s, s = the sum over the output rows (n, oh) in order, from 0, of
    // each row's sum over ow in order, from 0, of dy x patch. scratch: device memory of
    // conv_grouped_scratch_floats(g, groups) floats (a GPU's row sums; none on the CPU).
    void (*conv_grouped_backward_weight)(float *dw, float *scratch, const float *dy, const float *in,
                                         ConvGeometry g, int groups);
    int64_t (*conv_grouped_scratch_floats)(ConvGeometry g, int groups);

    // ---- elementwise and reductions ----------------------------------------------------
    // out (rows, cols) = act(out + bias), in place; bias (cols) may be NULL.
    void (*bias_act_forward)(float *out, const float *bias, int64_t rows, int cols,
                             Activation act);
    // Its backward: dout (rows, cols) *= act'(y) in place, where y is the activation's
    // output; then, if dbias is non-NULL, dbias (cols) += the column sums of the result.
    void (*bias_act_backward)(float *dbias, float *dout, const float *y, int64_t rows, int cols,
                              Activation act);
    // out = act(in) for act ACT_RELU or ACT_RELU6 (act_apply); din = dout where act_passes(out),
    // else 0 (din may be dout).
    void (*relu_forward)(float *out, const float *in, int64_t n, Activation act);
    void (*relu_backward)(float *din, const float *dout, const float *out, int64_t n, Activation act);
    // out = act(a + b) (out may be a or b): a residual block's sum.
    void (*add_act)(float *out, const float *a, const float *b, int64_t n, Activation act);

    // ---- pooling ------------------------------------------------------------------------
    // out (N, OH, OW, C) = max over K x K windows of in (N, H, W, C) with `pad` rows and
    // columns of padding on each side that never win (PyTorch's -inf padding); the first
    // maximum wins a tie, a NaN wins and a later NaN over an earlier one, and a window of
    // -inf alone gives its first pixel inside the image (PyTorch's rules).
    // argmax (same shape, K <= 15) = where in its window the winner is: kh * K + kw, from
    // the window's corner in padded coordinates.
    void (*maxpool_forward)(float *out, uint8_t *argmax, const float *in, int N, int H, int W,
                            int C, int K, int stride, int pad, int OH, int OW);
    // din (N, H, W, C) = dout routed to each window's argmax, summed per pixel in window
    // order (oh, ow) from zero.
    void (*maxpool_backward)(float *din, const float *dout, const uint8_t *argmax, int N, int H,
                             int W, int C, int K, int stride, int pad, int OH, int OW);
    // out = the mean of each K x K window, padding counted as zeros (PyTorch's AvgPool2d
    // with count_include_pad: every window divides by K * K); din = each window's dout /
    // (K * K) sent back to its pixels, summed per pixel.
    void (*avgpool_forward)(float *out, const float *in, int N, int H, int W, int C, int K,
                            int stride, int pad, int OH, int OW);
    void (*avgpool_backward)(float *din, const float *dout, int N, int H, int W, int C, int K,
                             int stride, int pad, int OH, int OW);
    // out (N, C) = the mean over the HW pixels of in (N, HW, C) (AdaptiveAvgPool2d(1));
    // din (N, HW, C) = dout / HW at every pixel.
    void (*global_avgpool_forward)(float *out, const float *in, int N, int64_t HW, int C);
    void (*global_avgpool_backward)(float *din, const float *dout, int N, int64_t HW, int C);

    // ---- batch normalisation ------------------------------------------------------------
    // Per channel of x (rows, C), rows = samples x pixels: samples of `sample_rows` rows
    // (rows is a multiple). acc (2C doubles, device) holds two sums per channel; they are
    // added sample after sample, each sample's in a fixed order that depends on its size
    // alone: deterministic, and calls over consecutive samples (a batch in chunks) give the
    // bits of one call over all of them.
    // acc[c] += sum of x, acc[C + c] += sum of x^2 (products and sums in double).
    void (*bn_sums)(double *acc, const float *x, int64_t rows, int64_t sample_rows, int C);
    // From acc over `count` values a channel: mean = acc[c] / count, var = acc[C + c] /
    // count - mean^2 (biased), invstd = 1 / sqrt(var + eps), in double, stored as floats;
    // and running_mean = momentum * mean + (1 - momentum) * running_mean, running_var
    // likewise with the unbiased var * count / (count - 1) (left as it is when count < 2),
    // as PyTorch's CPU code computes them.
    void (*bn_batch_stats)(float *mean, float *invstd, float *running_mean, float *running_var,
                           const double *acc, int C, int64_t count, double eps, double momentum);
    // Evaluation: mean = running_mean, invstd = 1 / sqrt(running_var + eps) (in double).
    void (*bn_eval_stats)(float *mean, float *invstd, const float *running_mean,
                          const float *running_var, int C, double eps);
    // out = act((x - mean) * (invstd * gamma) + beta) per channel.
    void (*bn_forward)(float *out, const float *x, const float *mean, const float *invstd,
                       const float *gamma, const float *beta, int64_t rows, int C, Activation act);
    // With dy = dout * act'(z) and xhat = (x - mean) * invstd: acc[c] += sum of dy,
    // acc[C + c] += sum of dy * xhat. dout is read only. The activation's mask is
    // act_passes(out) where the forward's output `out` is given (the same mask from the
    // exact output; a network whose x is read back from compressed codes, which would move
    // z across 0, passes its output read back, whose zeros are exact: nn/quant.h);
    // with out NULL, act_passes(z), z the forward's pre-activation recomputed from x
    // ((x - mean) * (invstd * gamma) + beta, exactly as bn_forward computes it: the output
    // need not be kept).
    void (*bn_backward_sums)(double *acc, const float *dout, const float *x, const float *out,
                             const float *mean, const float *invstd, const float *gamma,
                             const float *beta, int64_t rows, int64_t sample_rows, int C,
                             Activation act);
    // din = (dy - acc[c] / count - xhat * acc[C + c] / count) * (gamma * invstd): the
    // gradient through the batch statistics of `count` values a channel (din may be dout;
    // the mask as above).
    void (*bn_backward)(float *din, const float *dout, const float *x, const float *out,
                        const float *mean, const float *invstd, const float *gamma,
                        const float *beta, const double *acc, int64_t rows, int C, int64_t count,
                        Activation act);
    // dgamma += acc[C + c], dbeta += acc[c] (the sums of bn_backward_sums).
    void (*bn_param_grads)(float *dgamma, float *dbeta, const double *acc, int C);

    // ---- dropout (inverted), masks from the counter-based RNG of nn/rng.h --------------
    // Element i is kept iff rng_uniform(key, offset + i) >= p; kept elements are scaled by
    // 1/(1-p); din may be dout. key = rng_key(seed, RNG_STREAM_DROPOUT, step, layer) and offset = the
    // element's position within the whole batch, so backward, recomputation and any split
    // into micro-batches see the same mask.
    void (*dropout_forward)(float *out, const float *in, int64_t n, float p, uint64_t key,
                            uint64_t offset);
    void (*dropout_backward)(float *din, const float *dout, int64_t n, float p, uint64_t key,
                             uint64_t offset);

    // ---- layout ---------------------------------------------------------------------------
    // out (N, C, H, W) <- in (N, H, W, C), and back. Flatten uses these so that linear
    // layers see PyTorch's flatten order.
    void (*nhwc_to_nchw)(float *out, const float *in, int N, int H, int W, int C);
    void (*nchw_to_nhwc)(float *out, const float *in, int N, int H, int W, int C);

    // ---- output and loss ------------------------------------------------------------------
    // out (N, C) = log_softmax(in) over C.
    void (*log_softmax_forward)(float *out, const float *in, int N, int C);
    // din = dout - exp(out) * sum(dout) per row, where out is log_softmax's output.
    void (*log_softmax_backward)(float *din, const float *dout, const float *out, int N,
                                 int C);
    // NLL on log-probabilities logp (N, C) with labels (N) on the device, with label
    // smoothing e (PyTorch's CrossEntropyLoss(label_smoothing = e); 0: plain NLL): the
    // target puts 1 - e + e / C on the label and e / C on every other class.
    // metrics[0] += sum over rows of -((1 - e) * logp[i, label_i] + e / C * sum_c logp[i, c])
    // (in double; with e = 0 the first term alone); metrics[1] += count of argmax == label.
    // If dlogp is non-NULL, dlogp (N, C) = -(scale * loss scale * target) where the target
    // is not 0, and 0 where it is (scale = 1/N for the mean over the batch), the loss scale
    // being (float)scaler->scale, or 1 where scaler is NULL; scale * loss scale is rounded to
    // float first, the targets are (float)(1 - e + e / C) and (float)(e / C) from doubles.
    void (*nll_loss)(float *dlogp, float *metrics, const float *logp, const int32_t *labels,
                     int N, int C, float scale, float smoothing, const ScalerState *scaler);

    // ---- precision -------------------------------------------------------------------------
    // IEEE binary16 storage (nn/half.h): round to nearest even, overflow to inf.
    void (*f32_to_f16)(uint16_t *out, const float *in, int64_t n);
    void (*f16_to_f32)(float *out, const uint16_t *in, int64_t n);
    // bfloat16 storage (quant.h's bf16_from_float: round to nearest even, NaN quieted;
    // fp32's range, so nothing overflows); back to fp32 exactly.
    void (*f32_to_bf16)(uint16_t *out, const float *in, int64_t n);
    void (*bf16_to_f32)(float *out, const uint16_t *in, int64_t n);
    // The network's byte input read as floats: out[i] = lut[(i % C) * 256 + in[i]] for
    // i < n, in (n / C pixels, C channels) channel-last bytes, lut (C, 256) on the device
    // (the loader's normalisation of each byte value, so the floats are its bits).
    void (*u8_to_f32)(float *out, const uint8_t *in, int64_t n, int C, const float *lut);
    // Compressed activations (nn/quant.h): n samples of `values` each from x into their
    // records at dst (act_sample_bytes(values, bits) a sample), rounded with the random
    // bits of (key, (sample0 + s) * 2^32 + i / 4) for value i of sample s (values < 2^34);
    // and the n samples' values back from the records at src.
    void (*act_pack)(void *dst, const float *x, int64_t values, int n, int bits, uint64_t key,
                     int64_t sample0);
    void (*act_unpack)(float *x, const void *src, int64_t values, int n, int bits);
    // ---- loss scaling (nn/scaler.h), its state s in device memory ------------------------
    // g (n) *= (float)(1 / s->scale); s->found = 1 if any result is inf or NaN (left as it
    // was otherwise, so one flag can cover several calls).
    void (*unscale_check)(float *g, int64_t n, ScalerState *s);
    // ---- gradient clipping --------------------------------------------------------------
    // *out (device) = the sum of x[i]^2 over n values, in double: each block of
    // SUMSQ_BLOCK values summed, then the blocks' sums in order (within a block the order
    // is the backend's: rounding differs between devices, not between runs).
    void (*sum_squares)(double *out, const float *x, int64_t n);
    // x (n) *= clip_coef(*sumsq, max_norm) where that is below 1 (sumsq: device memory).
    void (*clip_scale)(float *x, int64_t n, const double *sumsq, float max_norm);
    // The step's outcome: scaler_advance(s, r), on the device.
    void (*scaler_update)(ScalerState *s, ScalerRules r);

    // ---- optimizer ------------------------------------------------------------------------
    // Each step kernel is gated by the loss scaler's state (device memory; NULL: none): it
    // does nothing when gate->found is set (the step is skipped), and `taken`, the steps
    // the optimizer took before this one, is step - gate->skipped (step without a gate),
    // `step` counting every step of the run from 0. Nothing waits for the host.
    //
    // One Adadelta step over n parameters, PyTorch's update exactly:
    //   g += wd * p; sq = rho*sq + (1-rho)*g^2; d = sqrt(acc + eps) / sqrt(sq + eps) * g;
    //   acc = rho*acc + (1-rho)*d^2; p -= lr * d.
    void (*adadelta_step)(float *p, float *square_avg, float *acc_delta, const float *g,
                          int64_t n, float lr, float rho, float eps, float weight_decay,
                          const ScalerState *gate);
    // SGD, PyTorch's update: d = g + weight_decay * p; with momentum (buf non-NULL) buf = d
    // on the first step taken, else buf = buf * momentum + one_minus_dampening * d, and d =
    // nesterov ? d + momentum * buf : buf; then p = p - lr * d.
    void (*sgd_step)(float *p, float *buf, const float *g, int64_t n, float lr, float momentum,
                     float one_minus_dampening, float weight_decay, bool nesterov,
                     const ScalerState *gate, uint64_t step);
    // AdamW, PyTorch's update with the scalars of adamw_scalars(h, taken): p = p * decay;
    // m = m * beta1 + one_minus_beta1 * g; v = v * beta2 + one_minus_beta2 * g * g;
    // p = p + -step_size * m / (sqrt(v) / bc2_sqrt + eps).
    void (*adamw_step)(float *p, float *m, float *v, const float *g, int64_t n, AdamWHyper h,
                       const ScalerState *gate, uint64_t step);
    // The same updates over n parameters whose state is stored in format f (STATE_BF16 or
    // STATE_INT8, nn/quant.h), one or two tensors of it (s1 unused by SGD): each value is
    // read back to fp32, the rule's update runs as above on fp32 values (the parameter
    // takes the updated state before it is rounded), and the state is stored rounded
    // again: int8 a block of QUANT_BLOCK values at a time from the first (its new absmax,
    // then its codes; the n values are one tensor's). Adadelta's two states and AdamW's
    // exp_avg_sq use the unsigned map, momentum and exp_avg the signed one; int8 state that
    // averages squares is stored as its square root (PackedPlan). Gated as above.
    void (*optim_step_packed)(float *p, PackedState s0, PackedState s1, const float *g, int64_t n,
                              StateFormat f, StepScalars r, const ScalerState *gate,
                              uint64_t step);
} Kernels;

// The CPU backend (OpenBLAS), always built: the table for this CPU (nn/cpu.c).
const Kernels *cpu_kernels(void);
// Whether the CPU backend may run AVX-512 code where the CPU has it (nn/gemm_avx512.h,
// nn/gemm_bf16.h, the direct convolution's wide blocks): false under CNN_CPU_KERNELS=avx2,
// which runs as a CPU with AVX2 alone would.
bool cpu_avx512_allowed(void);
// The 8-bit optimizer state's maps (nn/quant.h's QUANT_MAP_FLOATS values) that the CPU
// tables read, filled when the program loads.
extern float cpu_quant_map[];

// The CUDA backend: gpu/ defines it where CUDA was built; nn/no_cuda.c otherwise, which
// returns NULL with a message saying how to build with CUDA.
const Kernels *cuda_kernels(Error *err);

// "cpu" or "cuda" -> table, or NULL with err.
const Kernels *kernels_for_device(const char *device, Error *err);

// Threads for the CPU backend (OpenBLAS and the project's own loops).
void cpu_set_threads(int n);
// What the CPU backend runs, for the first line of ./train: the loops' instruction set
// ("AVX2", "x86-64" or "arm64") and the GEMM's kernels ("AVX-512 + OpenBLAS Zen" where
// the CPU has AVX-512: the project's own kernels, nn/gemm_avx512.h, with OpenBLAS for some
// shapes). OpenBLAS picks its kernels ("Haswell", "Cooperlake", ...) for the CPU when it
// loads, unless OPENBLAS_CORETYPE names them.
const char *cpu_kernels_name(void);
// Where the CPU backend's GEMMs run under gemm_arith(GEMM_BF16): "AMX-BF16" or
// "AVX512-BF16" (nn/gemm_bf16.h), NULL where they stay fp32 (no BF16 instructions, or the
// baseline table).
const char *cpu_bf16_gemm_name(void);

#endif
