// pointwise.c: the layers without parameters that keep the sample count: relu, relu6,
// dropout, flatten, log_softmax.
#include <stdio.h>
#include <stdlib.h>

#include "layer.h"
#include "rng.h"

static const CfgKey name_only_keys[] = {{"name", "<type><k>", "module name"}};

static int plain_create(Layer **out, const LayerOps *ops, const LayerArgs *a, Error *err) {
    Layer *l = layer_alloc(sizeof *l, ops, a, err);
    if (!l) return -1;
    *out = l;
    return 0;
}

// ---- relu, relu6 -------------------------------------------------------------------------------

// The two share their code: the activation is the layer's type (nn.ReLU, nn.ReLU6).
static Activation relu_act(const Layer *l) { return l->ops == &relu6_ops ? ACT_RELU6 : ACT_RELU; }

static int relu_create(Layer **out, const LayerArgs *a, Error *err) {
    return plain_create(out, &relu_ops, a, err);
}
static int relu6_create(Layer **out, const LayerArgs *a, Error *err) {
    return plain_create(out, &relu6_ops, a, err);
}
static void relu_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    ctx->k->relu_forward(out, in, N * shape_numel(l->in), relu_act(l));
}
static void relu_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                          const float *in, const float *out, int N) {
    if (din) ctx->k->relu_backward(din, dout, out, N * shape_numel(l->in), relu_act(l));
}
const LayerOps relu6_ops = {
    .type = "relu6",
    .summary = "min(max(x, 0), 6), elementwise (PyTorch ReLU6)",
    .keys = name_only_keys,
    .nkeys = 1,
    .create = relu6_create,
    .forward = relu_forward,
    .backward = relu_backward,
    .backward_in_place = true,
    .backward_reads = layer_reads_out,
};
const LayerOps relu_ops = {
    .type = "relu",
    .summary = "max(x, 0), elementwise",
    .keys = name_only_keys,
    .nkeys = 1,
    .create = relu_create,
    .forward = relu_forward,
    .backward = relu_backward,
    .backward_in_place = true,
    .backward_reads = layer_reads_out,
};

// ---- dropout ----------------------------------------------------------------------------------

typedef struct Dropout {
    Layer base;
    float p;
} Dropout;

static const CfgKey dropout_keys[] = {
    {"name", "dropout<k>", "module name"},
    {"p", "0.5", "probability of zeroing an element while training, in [0, 1)"},
};

static int dropout_create(Layer **out, const LayerArgs *a, Error *err) {
    Dropout *d = layer_alloc(sizeof *d, &dropout_ops, a, err);
    if (!d) return -1;
    double p;
    if (cfg_float(a->cfg, a->s, "p", "0.5", 0.0, 0.999999, &p, err)) {
        free(d);
        return -1;
    }
    d->p = (float)p;
    *out = &d->base;
    return 0;
}

static uint64_t dropout_key(const Layer *l, const LayerCtx *ctx) {
    return rng_key(ctx->seed, RNG_STREAM_DROPOUT, ctx->step, (uint64_t)l->index);
}

static void dropout_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Dropout *d = (const Dropout *)l;
    const int64_t n = N * shape_numel(l->in);
    if (!ctx->train || d->p == 0.0f) {
        ctx->k->copy(out, in, (size_t)n * sizeof(float));
        return;
    }
    ctx->k->dropout_forward(out, in, n, d->p, dropout_key(l, ctx),
                            (uint64_t)(ctx->sample0 * shape_numel(l->in)));
}
static void dropout_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                             const float *in, const float *out, int N) {
    const Dropout *d = (const Dropout *)l;
    const int64_t n = N * shape_numel(l->in);
    if (!din) return;
    if (d->p == 0.0f) {
        ctx->k->copy(din, dout, (size_t)n * sizeof(float));
        return;
    }
    ctx->k->dropout_backward(din, dout, n, d->p, dropout_key(l, ctx),
                             (uint64_t)(ctx->sample0 * shape_numel(l->in)));
}
const LayerOps dropout_ops = {
    .type = "dropout",
    .summary = "inverted dropout (PyTorch Dropout); masks from the counter-based RNG",
    .keys = dropout_keys,
    .nkeys = 2,
    .create = dropout_create,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .backward_in_place = true,
    .backward_reads = layer_reads_nothing,
};

// ---- flatten ----------------------------------------------------------------------------------
// (N, H, W, C) -> (N, C*H*W) in PyTorch's (C, H, W) order, so the next linear layer's weight
// has PyTorch's layout.

static int flatten_create(Layer **out, const LayerArgs *a, Error *err) {
    if (plain_create(out, &flatten_ops, a, err)) return -1;
    (*out)->out = (Shape){.c = (int)shape_numel(a->in), .h = 1, .w = 1};
    return 0;
}
static void flatten_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    ctx->k->nhwc_to_nchw(out, in, N, l->in.h, l->in.w, l->in.c);
}
static void flatten_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                             const float *in, const float *out, int N) {
    if (din) ctx->k->nchw_to_nhwc(din, dout, N, l->in.h, l->in.w, l->in.c);
}
const LayerOps flatten_ops = {
    .type = "flatten",
    .summary = "(C, H, W) -> C*H*W features, in PyTorch's order",
    .keys = name_only_keys,
    .nkeys = 1,
    .create = flatten_create,
    .forward = flatten_forward,
    .backward = flatten_backward,
    .backward_reads = layer_reads_nothing,
};

// ---- log_softmax ------------------------------------------------------------------------------

static int log_softmax_create(Layer **out, const LayerArgs *a, Error *err) {
    if (plain_create(out, &log_softmax_ops, a, err)) return -1;
    if (a->in.h != 1 || a->in.w != 1) {
        err_set(err, "%s:%d: [log_softmax] its input is %dx%dx%d (C x H x W), not flat: put a "
                "[flatten] section before it", a->cfg->path, a->s->line, a->in.c, a->in.h, a->in.w);
        free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}
static void log_softmax_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    ctx->k->log_softmax_forward(out, in, N, l->in.c);
}
static void log_softmax_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                                 const float *in, const float *out, int N) {
    if (din) ctx->k->log_softmax_backward(din, dout, out, N, l->in.c);
}
const LayerOps log_softmax_ops = {
    .type = "log_softmax",
    .summary = "log of softmax over the features (the network's output for NLL loss)",
    .keys = name_only_keys,
    .nkeys = 1,
    .create = log_softmax_create,
    .forward = log_softmax_forward,
    .backward = log_softmax_backward,
    .backward_reads = layer_reads_out,
};
