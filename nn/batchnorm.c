// batchnorm.c: batch normalisation (PyTorch BatchNorm2d after a convolution, BatchNorm1d
// after a linear layer: the same per-channel arithmetic on (rows, C) activations, rows =
// samples x pixels), optionally followed by an activation.
//
// Training: each (micro-)batch is normalised by its own statistics, mean and biased
// variance over its rows, and the running statistics move by momentum with the unbiased
// variance (DESIGN.md decision 12); evaluation: the running statistics. The statistics
// need the whole batch before any output, so forward and backward each begin with a pass
// over the batch (forward_reduce, backward_reduce: sums in double, nn/kernels.h); under
// fp16 the passes run over the same chunks as the layer.
//
// A recomputed forward (checkpointing, ctx->recompute) reuses the statistics of the first
// forward, saved in l->state: the same outputs, and the running statistics move once per
// forward pass of a micro-batch, as in PyTorch (so k times a step with accumulate = k).
//
// State (device, l->state): acc (2C doubles: the sums of the current pass), then mean and
// invstd (C floats each) of the current batch, which backward uses.
#include <stdlib.h>

#include "layer.h"

typedef struct BatchNorm {
    Layer base;
    double eps, momentum;
    Activation act;
    int64_t count;               // values a channel in the batch being normalised
    int64_t num_batches_tracked; // training forward passes (PyTorch's counter; host)
} BatchNorm;

static const CfgKey batchnorm_keys[] = {
    {"name", "batchnorm<k>", "module name, as in PyTorch's state_dict (bn1, ...)"},
    {"eps", "1e-5", "added to the variance"},
    {"momentum", "0.1", "running statistics: running = (1 - momentum) * running + momentum * batch"},
    {"activation", "none", "none, relu or relu6 (min(max(x, 0), 6)), applied to the output"},
};

static int batchnorm_create(Layer **out, const LayerArgs *a, Error *err) {
    BatchNorm *b = layer_alloc(sizeof *b, &batchnorm_ops, a, err);
    if (!b) return -1;
    if (cfg_float(a->cfg, a->s, "eps", "1e-5", 1e-30, 1.0, &b->eps, err) ||
        cfg_float(a->cfg, a->s, "momentum", "0.1", 0.0, 1.0, &b->momentum, err) ||
        layer_activation(a, &b->act, err)) {
        free(b);
        return -1;
    }
    const int64_t C = a->in.c;
    layer_param(&b->base, 0, "weight", 1, &C, INIT_ONES);
    layer_param(&b->base, 1, "bias", 1, &C, INIT_ZEROS);
    layer_buffer(&b->base, 0, "running_mean", C, 0.0f, NULL);
    layer_buffer(&b->base, 1, "running_var", C, 1.0f, NULL);
    layer_buffer(&b->base, 2, "num_batches_tracked", -1, 0.0f, &b->num_batches_tracked);
    *out = &b->base;
    return 0;
}

static size_t batchnorm_state_bytes(const Layer *l) {
    return 2 * (size_t)l->in.c * (sizeof(double) + sizeof(float));
}

static double *bn_acc(const Layer *l) { return l->state; }
static float *bn_mean(const Layer *l) { return (float *)(bn_acc(l) + 2 * l->in.c); }
static float *bn_invstd(const Layer *l) { return bn_mean(l) + l->in.c; }

static int64_t bn_rows(const Layer *l, int n) { return (int64_t)n * l->in.h * l->in.w; }

// Whether backward reads its activation's mask from the output (then passed to the kernels
// and read, batchnorm_backward_reads): where it has one and its input is read back from
// compressed codes (Layer.in_compressed); else the kernels recompute it from the input.
static bool bn_mask_from_out(const Layer *l) {
    return l->in_compressed && ((const BatchNorm *)l)->act != ACT_NONE;
}
static const float *bn_mask_out(const Layer *l, const float *out) { return bn_mask_from_out(l) ? out : NULL; }

// Normalised by the running statistics: in evaluation, and when frozen with them.
static bool bn_eval(const Layer *l, const LayerCtx *ctx) { return !ctx->train || l->frozen_stats; }

// The batch pass is for training forwards that are not recomputations.
static bool batchnorm_forward_reduces(const Layer *l, const LayerCtx *ctx) {
    return !bn_eval(l, ctx) && !ctx->recompute;
}

static void batchnorm_forward_reduce(Layer *l, const LayerCtx *ctx, const float *in, int n0, int n,
                                     int N) {
    BatchNorm *b = (BatchNorm *)l;
    const int C = l->in.c;
    if (n0 == 0) ctx->k->zero(bn_acc(l), 2 * (size_t)C * sizeof(double));
    ctx->k->bn_sums(bn_acc(l), in, bn_rows(l, n), bn_rows(l, 1), C);
    if (n0 + n < N) return;
    ctx->k->bn_batch_stats(bn_mean(l), bn_invstd(l), l->buffers[0].data, l->buffers[1].data,
                           bn_acc(l), C, bn_rows(l, N), b->eps, b->momentum);
    b->num_batches_tracked++;
}

static void batchnorm_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const BatchNorm *b = (const BatchNorm *)l;
    if (bn_eval(l, ctx))
        ctx->k->bn_eval_stats(bn_mean(l), bn_invstd(l), l->buffers[0].data, l->buffers[1].data,
                              l->in.c, b->eps);
    ctx->k->bn_forward(out, in, bn_mean(l), bn_invstd(l), l->params[0].data, l->params[1].data,
                       bn_rows(l, N), l->in.c, b->act);
}

// Frozen with its running statistics, the normalisation is a fixed affine map: its
// gradient is bn_backward's with zero sums (din = dy * gamma * invstd), and there are no
// parameter gradients.
static void batchnorm_backward_reduce(Layer *l, const LayerCtx *ctx, const float *dout,
                                      const float *in, const float *out, int n0, int n, int N) {
    BatchNorm *b = (BatchNorm *)l;
    const int C = l->in.c;
    if (n0 == 0) ctx->k->zero(bn_acc(l), 2 * (size_t)C * sizeof(double));
    b->count = bn_rows(l, N);
    if (l->frozen_stats) return;
    ctx->k->bn_backward_sums(bn_acc(l), dout, in, bn_mask_out(l, out), bn_mean(l), bn_invstd(l),
                             l->params[0].data, l->params[1].data, bn_rows(l, n), bn_rows(l, 1), C,
                             b->act);
    if (n0 + n == N && l->grads[0]) ctx->k->bn_param_grads(l->grads[0], l->grads[1], bn_acc(l), C);
}

// Elementwise after the pass: din may be dout (the network's gradient buffers); when it is
// not, dout is only read (a residual block passes the same gradient on to its shortcut).
static void batchnorm_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                               const float *in, const float *out, int N) {
    const BatchNorm *b = (const BatchNorm *)l;
    if (din)
        ctx->k->bn_backward(din, dout, in, bn_mask_out(l, out), bn_mean(l), bn_invstd(l),
                            l->params[0].data, l->params[1].data, bn_acc(l), bn_rows(l, N), l->in.c,
                            b->count, b->act);
}

// Backward recomputes its activation's mask from the input (nn/kernels.h): the output is
// not read, unless the input is read back from compressed codes (bn_mask_out).
static unsigned batchnorm_backward_reads(const Layer *l) {
    return BACKWARD_READS_IN | (bn_mask_from_out(l) ? BACKWARD_READS_OUT : 0);
}

// bn_backward is elementwise: each value of x is read before din's is written.
static bool batchnorm_din_over_in(const Layer *l) {
    (void)l;
    return true;
}

const LayerOps batchnorm_ops = {
    .type = "batchnorm",
    .summary = "batch normalisation (PyTorch BatchNorm2d / BatchNorm1d), optionally followed by an activation",
    .keys = batchnorm_keys,
    .nkeys = sizeof batchnorm_keys / sizeof batchnorm_keys[0],
    .create = batchnorm_create,
    .state_bytes = batchnorm_state_bytes,
    .forward = batchnorm_forward,
    .backward = batchnorm_backward,
    .backward_in_place = true,
    .backward_reads = batchnorm_backward_reads,
    .din_over_in = batchnorm_din_over_in,
    .forward_reduces = batchnorm_forward_reduces,
    .forward_reduce = batchnorm_forward_reduce,
    .backward_reduce = batchnorm_backward_reduce,
};
