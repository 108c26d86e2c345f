// residual.c: torchvision's BasicBlock as one layer (DESIGN.md decision 11):
//
//     out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//
// conv1 is 3x3 with the block's stride, conv2 3x3, both padded by 1 and without bias; the
// shortcut is the identity, or (downsample) a 1x1 convolution with the stride and a
// batchnorm. The children carry torchvision's names under the block's: layer2.0.conv1,
// layer2.0.bn1, layer2.0.conv2, layer2.0.bn2, layer2.0.downsample.0, layer2.0.downsample.1.
//
// Storage (the network plans both, in its precision):
//   inner          kept from forward to backward: c1 = conv1(x) and c2 = conv2(r1), each
//                  (N, out). bn2's output goes straight into out, where the sum replaces it.
//   scratch        A (N, out) and B (N, max(out, in)): in forward the downsample's conv
//                  output d1 (B) and batchnorm output (A), in backward the chain of
//                  gradients.
// r1 = bn1(c1) with ReLU, conv2's input, is not kept: forward writes it into out, which bn2
// overwrites after conv2 has read it, and backward, once it has read out (the sum's ReLU)
// and nobody needs out any more, recomputes it there from c1 with the forward's batch
// statistics (LayerCtx.recompute). d1 is not kept either: backward recomputes it into out
// (from x, a 1x1 convolution) once bn1's backward is done with r1. The same bits, for one
// batchnorm pass and one 1x1 convolution, and two activations stored per block instead of
// three or four (resnet18 at batch 32: 838 -> 720 MB of activations).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct Residual {
    Layer base;
    bool downsample;
    Layer *conv1, *bn1, *conv2, *bn2, *ds_conv, *ds_bn;  // the children
} Residual;

static const CfgKey residual_keys[] = {
    {"name", "residual<k>", "module path, as torchvision names blocks (layer1.0, layer2.1, ...)"},
    {"filters", NULL, "output channels of both convolutions"},
    {"stride", "1", "stride of the first convolution (and of the downsample)"},
    {"downsample", "auto", "auto: a 1x1 convolution + batchnorm on the shortcut when the stride "
                           "or the channels change; 1: always; 0: never (identity)"},
};

static int residual_create(Layer **out, const LayerArgs *a, Error *err) {
    Residual *r = layer_alloc(sizeof *r, &residual_ops, a, err);
    if (!r) return -1;
    Layer *l = &r->base;
    int64_t filters, stride;
    const char *ds;
    if (cfg_int(a->cfg, a->s, "filters", NULL, 1, 1 << 20, &filters, err) ||
        cfg_int(a->cfg, a->s, "stride", "1", 1, 1024, &stride, err) ||
        cfg_str(a->cfg, a->s, "downsample", "auto", &ds, err))
        goto fail;
    const bool changes = stride != 1 || filters != a->in.c;
    if (!strcmp(ds, "auto")) {
        r->downsample = changes;
    } else if (!strcmp(ds, "1") || !strcmp(ds, "0")) {
        r->downsample = ds[0] == '1';
    } else {
        err_set(err, "%s:%d: [residual] %s: downsample = '%s': expected auto, 1 or 0", a->cfg->path,
                a->s->line, l->name, ds);
        goto fail;
    }
    if (changes && !r->downsample) {
        err_set(err, "%s:%d: [residual] %s: downsample = 0, but the block turns %d channels into "
                "%lld with stride %lld: the identity shortcut cannot add them; use downsample = auto",
                a->cfg->path, a->s->line, l->name, a->in.c, (long long)filters, (long long)stride);
        goto fail;
    }
    l->nchildren = r->downsample ? 6 : 4;
    if (!(l->children = xcalloc((size_t)l->nchildren, sizeof *l->children, err))) goto fail;
    char text[512];
    const char *n = l->name;
    const int f = (int)filters, st = (int)stride;
    snprintf(text, sizeof text,
             "[conv]\nname = %s.conv1\nfilters = %d\nsize = 3\nstride = %d\npad = 1\nbias = 0\n", n, f, st);
    if (layer_create_child(&l->children[0], &conv_ops, text, a->in, a, err)) goto fail;
    const Shape o = l->children[0]->out;
    snprintf(text, sizeof text, "[batchnorm]\nname = %s.bn1\nactivation = relu\n", n);
    if (layer_create_child(&l->children[1], &batchnorm_ops, text, o, a, err)) goto fail;
    snprintf(text, sizeof text, "[conv]\nname = %s.conv2\nfilters = %d\nsize = 3\npad = 1\nbias = 0\n", n, f);
    if (layer_create_child(&l->children[2], &conv_ops, text, o, a, err)) goto fail;
    snprintf(text, sizeof text, "[batchnorm]\nname = %s.bn2\n", n);
    if (layer_create_child(&l->children[3], &batchnorm_ops, text, o, a, err)) goto fail;
    if (r->downsample) {
        snprintf(text, sizeof text,
                 "[conv]\nname = %s.downsample.0\nfilters = %d\nsize = 1\nstride = %d\nbias = 0\n", n, f, st);
        if (layer_create_child(&l->children[4], &conv_ops, text, a->in, a, err)) goto fail;
        snprintf(text, sizeof text, "[batchnorm]\nname = %s.downsample.1\n", n);
        if (layer_create_child(&l->children[5], &batchnorm_ops, text, o, a, err)) goto fail;
        r->ds_conv = l->children[4], r->ds_bn = l->children[5];
    }
    r->conv1 = l->children[0], r->bn1 = l->children[1];
    r->conv2 = l->children[2], r->bn2 = l->children[3];
    l->out = o;
    *out = l;
    return 0;
fail:
    layer_free(l);
    return -1;
}

static size_t residual_inner_bytes(const Layer *l, DType precision) {
    return 2 * (size_t)shape_numel(l->out) * dtype_sizes[precision];
}

static int64_t residual_scratch_values(const Layer *l) {
    const int64_t o = shape_numel(l->out), i = shape_numel(l->in);
    return o + (o > i ? o : i);
}

// The inner activations of N samples: c1, then c2.
static void *inner_at(const Layer *l, const LayerCtx *ctx, int which, int N) {
    return (char *)l->inner + layer_stored_bytes(ctx, (int64_t)which * N * shape_numel(l->out));
}

static void residual_forward(Layer *l, const LayerCtx *ctx, void *out, const void *in, int N) {
    const Residual *r = (const Residual *)l;
    void *c1 = inner_at(l, ctx, 0, N), *c2 = inner_at(l, ctx, 1, N), *r1 = out;
    layer_run_forward(ctx, r->conv1, c1, in, N);
    layer_run_forward(ctx, r->bn1, r1, c1, N);
    layer_run_forward(ctx, r->conv2, c2, r1, N);
    layer_run_forward(ctx, r->bn2, out, c2, N);
    const void *shortcut = in;
    if (r->downsample) {
        void *a = l->scratch, *d1 = (char *)a + layer_stored_bytes(ctx, N * shape_numel(l->out));
        layer_run_forward(ctx, r->ds_conv, d1, in, N);
        layer_run_forward(ctx, r->ds_bn, a, d1, N);
        shortcut = a;
    }
    layer_run_add_act(ctx, out, out, shortcut, shape_numel(l->out), N, ACT_RELU);
}

// bn2 and the shortcut's batchnorm have no activation, so the `out` they are given (the
// block's, by then r1) is not read; their backward leaves dout as it is, so the sum's
// gradient serves both paths. din is NULL when the block is the first layer that learns
// (the layers before it are frozen). out holds r1, then d1, afterwards (LayerOps.run_backward).
static void residual_backward(Layer *l, const LayerCtx *ctx, void *din, void *dout,
                              const void *in, void *out, int N) {
    const Residual *r = (const Residual *)l;
    const int64_t no = shape_numel(l->out);
    void *c1 = inner_at(l, ctx, 0, N), *c2 = inner_at(l, ctx, 1, N), *r1 = out;
    void *a = l->scratch, *b = (char *)a + layer_stored_bytes(ctx, N * no);
    layer_run_act_backward(ctx, dout, out, no, N, ACT_RELU);  // the gradient of the sum
    LayerCtx redo = *ctx;  // r1 (and d1) again, as the forward made them
    redo.recompute = true;
    layer_run_forward(&redo, r->bn1, r1, c1, N);
    layer_run_backward(ctx, r->bn2, a, dout, c2, out, N);
    layer_run_backward(ctx, r->conv2, b, a, r1, c2, N);
    layer_run_backward(ctx, r->bn1, a, b, c1, r1, N);
    layer_run_backward(ctx, r->conv1, din ? b : NULL, a, in, c1, N);
    if (r->downsample) {  // d1 again, in out (r1 is done with)
        void *d1 = out;
        layer_run_forward(&redo, r->ds_conv, d1, in, N);
        layer_run_backward(ctx, r->ds_bn, a, dout, d1, d1, N);
        layer_run_backward(ctx, r->ds_conv, din, a, in, d1, N);
        if (din) layer_run_add_act(ctx, din, din, b, shape_numel(l->in), N, ACT_NONE);
    } else if (din) {
        layer_run_add_act(ctx, din, b, dout, shape_numel(l->in), N, ACT_NONE);
    }
}

const LayerOps residual_ops = {
    .type = "residual",
    .summary = "a residual block, torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))",
    .keys = residual_keys,
    .nkeys = sizeof residual_keys / sizeof residual_keys[0],
    .create = residual_create,
    .run_forward = residual_forward,
    .run_backward = residual_backward,
    .inner_bytes = residual_inner_bytes,
    .scratch_values = residual_scratch_values,
};
