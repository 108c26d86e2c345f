// linear.c: fully connected layer (PyTorch Linear): out = in @ W^T + b, W (OUT, IN).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct Linear {
    Layer base;
    int outputs;
    Activation act;
} Linear;

static const CfgKey linear_keys[] = {
    {"name", "linear<k>", "module name, as in PyTorch's state_dict (fc1, ...)"},
    {"outputs", NULL, "output features; `classes`: the data's class count"},
    {"activation", "none", "none, relu or relu6 (min(max(x, 0), 6)), applied to the output"},
};

static int linear_create(Layer **out, const LayerArgs *a, Error *err) {
    Linear *f = layer_alloc(sizeof *f, &linear_ops, a, err);
    if (!f) return -1;
    const CfgEntry *e = cfg_entry(a->s, "outputs");
    int64_t outputs;
    if (e && strcmp(e->value, "classes") == 0) {
        outputs = a->classes;
        if (outputs < 1) {
            err_set(err, "%s:%d: [linear] %s: outputs = classes, but the class count is not "
                    "known here: give a number", a->cfg->path, e->line ? e->line : a->s->line,
                    f->base.name);
            goto fail;
        }
    } else if (cfg_int(a->cfg, a->s, "outputs", NULL, 1, 1 << 24, &outputs, err)) {
        goto fail;
    }
    if (layer_activation(a, &f->act, err)) goto fail;
    if (a->in.h != 1 || a->in.w != 1) {
        err_set(err, "%s:%d: [linear] %s: its input is %dx%dx%d (C x H x W), not flat: put a "
                "[flatten] section before it",
                a->cfg->path, a->s->line, f->base.name, a->in.c, a->in.h, a->in.w);
        goto fail;
    }
    f->outputs = (int)outputs;
    f->base.out = (Shape){.c = f->outputs, .h = 1, .w = 1};
    layer_param(&f->base, 0, "weight", 2, (int64_t[]){f->outputs, a->in.c}, INIT_WEIGHT);
    layer_param(&f->base, 1, "bias", 1, (int64_t[]){f->outputs}, INIT_BIAS);
    f->base.fan_in = a->in.c;
    *out = &f->base;
    return 0;
fail:
    free(f);
    return -1;
}

static void linear_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Linear *f = (const Linear *)l;
    ctx->k->gemm(out, in, l->params[0].data, N, f->outputs, l->in.c, false, true, 1.0f, 0.0f);
    ctx->k->bias_act_forward(out, l->params[1].data, N, f->outputs, f->act);
}

static void linear_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                            const float *in, const float *out, int N) {
    const Linear *f = (const Linear *)l;
    const Kernels *k = ctx->k;
    k->bias_act_backward(l->grads[1], dout, out, N, f->outputs, f->act);  // grads NULL: frozen
    if (l->grads[0]) k->gemm(l->grads[0], dout, in, f->outputs, l->in.c, N, true, false, 1.0f, 1.0f);
    if (din) k->gemm(din, dout, l->params[0].data, N, l->in.c, f->outputs, false, false, 1.0f, 0.0f);
}

static unsigned linear_backward_reads(const Layer *l) {
    return layer_reads_with_act(((const Linear *)l)->act);
}

// dW's GEMM reads the whole input before din's GEMM writes.
static bool linear_din_over_in(const Layer *l) {
    (void)l;
    return true;
}

// The activation's derivative scales dout in place (bias_act_backward).
static bool linear_backward_writes_dout(const Layer *l) { return ((const Linear *)l)->act != ACT_NONE; }

const LayerOps linear_ops = {
    .type = "linear",
    .summary = "fully connected layer (PyTorch Linear), optionally followed by an activation",
    .keys = linear_keys,
    .nkeys = sizeof linear_keys / sizeof linear_keys[0],
    .create = linear_create,
    .forward = linear_forward,
    .backward = linear_backward,
    .backward_reads = linear_backward_reads,
    .backward_writes_dout = linear_backward_writes_dout,
    .din_over_in = linear_din_over_in,
};
