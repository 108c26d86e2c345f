// residual.c: torchvision's BasicBlock as one layer (DESIGN.md decision 11):
//
//     out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//
// conv1 is 3x3 with the block's stride, conv2 3x3, both padded by 1 and without bias; the
// shortcut is the identity, or (downsample) a 1x1 convolution with the stride and a
// batchnorm. The children carry torchvision's names under the block's: layer2.0.conv1,
// layer2.0.bn1, layer2.0.conv2, layer2.0.bn2, layer2.0.downsample.0, layer2.0.downsample.1.
//
// It computes as nodes (LayerOps.expand): conv1, bn1 (with ReLU), conv2, bn2, the shortcut's
// downsample.0 and .1 when it has them, and the sum with its ReLU. r1 = bn1(c1) and the
// downsample's convolution output d1 are cheap to recompute (a batchnorm pass with the
// forward's statistics; a 1x1 convolution), so they are marked jit: the network keeps c1
// and x and computes them again where a backward reads them, instead of keeping them.
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

static int residual_expand(Layer *l, NodeList *nl, int in, Error *err) {
    const Residual *r = (const Residual *)l;
    const int c1 = node_leaf(nl, r->conv1, in, false, err);
    const int b1 = c1 < 0 ? -1 : node_leaf(nl, r->bn1, c1, true, err);
    const int c2 = b1 < 0 ? -1 : node_leaf(nl, r->conv2, b1, false, err);
    const int b2 = c2 < 0 ? -1 : node_leaf(nl, r->bn2, c2, false, err);
    if (b2 < 0) return -1;
    int shortcut = in;
    if (r->downsample) {
        const int d1 = node_leaf(nl, r->ds_conv, in, true, err);
        if (d1 < 0 || (shortcut = node_leaf(nl, r->ds_bn, d1, false, err)) < 0) return -1;
    }
    return node_sum(nl, b2, shortcut, ACT_RELU, err);
}

const LayerOps residual_ops = {
    .type = "residual",
    .summary = "a residual block, torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))",
    .keys = residual_keys,
    .nkeys = sizeof residual_keys / sizeof residual_keys[0],
    .create = residual_create,
    .expand = residual_expand,
};
