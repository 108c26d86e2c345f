// maxpool.c: max pooling (PyTorch MaxPool2d without padding; floor mode).
#include <stdio.h>
#include <stdlib.h>

#include "layer.h"

typedef struct MaxPool {
    Layer base;
    int size, stride;
} MaxPool;

static const CfgKey maxpool_keys[] = {
    {"name", "maxpool<k>", "module name"},
    {"size", "2", "window size K (K x K)"},
    {"stride", "size", "stride (default: the window size)"},
};

static int maxpool_create(Layer **out, const Cfg *cfg, const CfgSection *s, Shape in, Error *err) {
    MaxPool *p = layer_alloc(sizeof *p, &maxpool_ops, cfg, s, in, err);
    if (!p) return -1;
    int64_t size, stride;
    if (cfg_int(cfg, s, "size", "2", 1, 1024, &size, err)) goto fail;
    char def[16];
    snprintf(def, sizeof def, "%d", (int)size);
    if (cfg_int(cfg, s, "stride", def, 1, 1024, &stride, err)) goto fail;
    p->size = (int)size, p->stride = (int)stride;
    if (in.h < p->size || in.w < p->size) {
        err_set(err, "%s:%d: [maxpool] %s: window %d is larger than its input %dx%d", cfg->path,
                s->line, p->base.name, p->size, in.h, in.w);
        goto fail;
    }
    p->base.out = (Shape){.c = in.c, .h = (in.h - p->size) / p->stride + 1,
                          .w = (in.w - p->size) / p->stride + 1};
    *out = &p->base;
    return 0;
fail:
    free(p);
    return -1;
}

static size_t maxpool_workspace_bytes(const Layer *l, int N) { return 0; }

static void maxpool_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const MaxPool *p = (const MaxPool *)l;
    ctx->k->maxpool_forward(out, in, N, l->in.h, l->in.w, l->in.c, p->size, p->stride, l->out.h,
                            l->out.w);
}

static void maxpool_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                             const float *in, const float *out, int N) {
    const MaxPool *p = (const MaxPool *)l;
    if (din)
        ctx->k->maxpool_backward(din, dout, in, out, N, l->in.h, l->in.w, l->in.c, p->size,
                                 p->stride, l->out.h, l->out.w);
}

const LayerOps maxpool_ops = {
    .type = "maxpool",
    .summary = "max pooling (PyTorch MaxPool2d, no padding)",
    .keys = maxpool_keys,
    .nkeys = sizeof maxpool_keys / sizeof maxpool_keys[0],
    .create = maxpool_create,
    .workspace_bytes = maxpool_workspace_bytes,
    .forward = maxpool_forward,
    .backward = maxpool_backward,
};
