// pool.c: pooling layers: max and average pooling over K x K windows (PyTorch's MaxPool2d
// and AvgPool2d, floor mode, with padding), and global average pooling
// (AdaptiveAvgPool2d(1)).
#include <stdio.h>
#include <stdlib.h>

#include "layer.h"

typedef struct Pool {
    Layer base;
    int size, stride, pad;
} Pool;

// Max pooling keeps where each window's maximum is as a byte (kh * K + kw): K <= 15.
enum { MAXPOOL_MAX_SIZE = 15 };

static const CfgKey maxpool_keys[] = {
    {"name", "maxpool<k>", "module name"},
    {"size", "2", "window size K (K x K), at most 15: backward keeps each window's argmax as a byte"},
    {"stride", "size", "stride (default: the window size)"},
    {"pad", "0", "padding on each side, at most size / 2; padding never wins the max"},
};

static const CfgKey avgpool_keys[] = {
    {"name", "avgpool<k>", "module name"},
    {"size", "2", "window size K (K x K)"},
    {"stride", "size", "stride (default: the window size)"},
    {"pad", "0", "zero padding on each side, at most size / 2; counted in the mean"},
};

static int pool_create(Layer **out, const LayerOps *ops, const LayerArgs *a, int max_size, Error *err) {
    Pool *p = layer_alloc(sizeof *p, ops, a, err);
    if (!p) return -1;
    int64_t size, stride, pad;
    if (cfg_int(a->cfg, a->s, "size", "2", 1, max_size, &size, err)) goto fail;
    char def[16];
    snprintf(def, sizeof def, "%d", (int)size);
    if (cfg_int(a->cfg, a->s, "stride", def, 1, 1024, &stride, err) ||
        cfg_int(a->cfg, a->s, "pad", "0", 0, size / 2, &pad, err))
        goto fail;
    p->size = (int)size, p->stride = (int)stride, p->pad = (int)pad;
    const Shape in = a->in;
    if (in.h + 2 * p->pad < p->size || in.w + 2 * p->pad < p->size) {
        err_set(err, "%s:%d: [%s] %s: window %d is larger than its input %dx%d (pad %d)",
                a->cfg->path, a->s->line, ops->type, p->base.name, p->size, in.h, in.w, p->pad);
        goto fail;
    }
    p->base.out = (Shape){.c = in.c, .h = (in.h + 2 * p->pad - p->size) / p->stride + 1,
                          .w = (in.w + 2 * p->pad - p->size) / p->stride + 1};
    *out = &p->base;
    return 0;
fail:
    free(p);
    return -1;
}

// ---- maxpool ----------------------------------------------------------------------------------

static int maxpool_create(Layer **out, const LayerArgs *a, Error *err) {
    return pool_create(out, &maxpool_ops, a, MAXPOOL_MAX_SIZE, err);
}

// The argmax of the samples of this call (l->inner: a byte per output value).
static uint8_t *maxpool_argmax(const Layer *l, const LayerCtx *ctx) {
    return (uint8_t *)l->inner + (int64_t)ctx->n0 * shape_numel(l->out);
}

static size_t maxpool_inner_bytes(const Layer *l, DType precision) {
    (void)precision;
    return (size_t)shape_numel(l->out);
}

static void maxpool_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Pool *p = (const Pool *)l;
    ctx->k->maxpool_forward(out, maxpool_argmax(l, ctx), in, N, l->in.h, l->in.w, l->in.c, p->size,
                            p->stride, p->pad, l->out.h, l->out.w);
}

static void maxpool_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                             const float *in, const float *out, int N) {
    const Pool *p = (const Pool *)l;
    if (din)
        ctx->k->maxpool_backward(din, dout, maxpool_argmax(l, ctx), N, l->in.h, l->in.w, l->in.c,
                                 p->size, p->stride, p->pad, l->out.h, l->out.w);
}

const LayerOps maxpool_ops = {
    .type = "maxpool",
    .summary = "max pooling (PyTorch MaxPool2d)",
    .keys = maxpool_keys,
    .nkeys = sizeof maxpool_keys / sizeof maxpool_keys[0],
    .create = maxpool_create,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
    .backward_reads = layer_reads_nothing,
    .inner_bytes = maxpool_inner_bytes,
};

// ---- avgpool ----------------------------------------------------------------------------------

static int avgpool_create(Layer **out, const LayerArgs *a, Error *err) {
    return pool_create(out, &avgpool_ops, a, 1024, err);
}

static void avgpool_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Pool *p = (const Pool *)l;
    ctx->k->avgpool_forward(out, in, N, l->in.h, l->in.w, l->in.c, p->size, p->stride, p->pad,
                            l->out.h, l->out.w);
}

static void avgpool_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                             const float *in, const float *out, int N) {
    const Pool *p = (const Pool *)l;
    if (din)
        ctx->k->avgpool_backward(din, dout, N, l->in.h, l->in.w, l->in.c, p->size, p->stride,
                                 p->pad, l->out.h, l->out.w);
}

const LayerOps avgpool_ops = {
    .type = "avgpool",
    .summary = "average pooling (PyTorch AvgPool2d, padding counted as zeros)",
    .keys = avgpool_keys,
    .nkeys = sizeof avgpool_keys / sizeof avgpool_keys[0],
    .create = avgpool_create,
    .forward = avgpool_forward,
    .backward = avgpool_backward,
    .backward_reads = layer_reads_nothing,
};

// ---- global_avgpool ---------------------------------------------------------------------------

static const CfgKey global_avgpool_keys[] = {{"name", "global_avgpool<k>", "module name"}};

static int global_avgpool_create(Layer **out, const LayerArgs *a, Error *err) {
    Layer *l = layer_alloc(sizeof *l, &global_avgpool_ops, a, err);
    if (!l) return -1;
    l->out = (Shape){.c = a->in.c, .h = 1, .w = 1};
    *out = l;
    return 0;
}

static void global_avgpool_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in,
                                   int N) {
    ctx->k->global_avgpool_forward(out, in, N, (int64_t)l->in.h * l->in.w, l->in.c);
}

static void global_avgpool_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                                    const float *in, const float *out, int N) {
    if (din) ctx->k->global_avgpool_backward(din, dout, N, (int64_t)l->in.h * l->in.w, l->in.c);
}

const LayerOps global_avgpool_ops = {
    .type = "global_avgpool",
    .summary = "the mean of each channel over the image (PyTorch AdaptiveAvgPool2d(1)): C x 1 x 1",
    .keys = global_avgpool_keys,
    .nkeys = 1,
    .create = global_avgpool_create,
    .forward = global_avgpool_forward,
    .backward = global_avgpool_backward,
    .backward_reads = layer_reads_nothing,
};
