// residual.c: torchvision's residual blocks from a few keys, written as the text of a
// general [block] (nn/block.c) and made by it:
//
//   basic       BasicBlock:  relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); conv1 3x3
//               with the stride, conv2 3x3; filters outputs
//   bottleneck  Bottleneck (ResNet-50's, the stride on the 3x3 as torchvision's V1.5):
//               relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x));
//               conv1 1x1 to filters, conv2 3x3 with the stride, conv3 1x1 to 4 x filters
//   inverted    MobileNetV2's InvertedResidual: expand 1x1 to in x expand channels
//               (conv.0, with its batchnorm and ReLU6; none when expand = 1), depthwise 3x3
//               with the stride (conv.1), project 1x1 to filters (conv.2, linear) and its
//               batchnorm (conv.3); plus x when the stride is 1 and the channels agree
//
// The shortcut of basic and bottleneck is the identity, or (downsample) a 1x1 convolution
// with the stride and a batchnorm: downsample.0 and downsample.1. Convolutions are padded
// to keep the size and have no bias, as torchvision's.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef enum ResidualKind { BASIC, BOTTLENECK, INVERTED, RESIDUAL_KINDS } ResidualKind;
static const char *const residual_kind_names[RESIDUAL_KINDS] = {"basic", "bottleneck", "inverted"};

static const CfgKey residual_keys[] = {
    {"name", "residual<k>", "module path, as torchvision names blocks (layer1.0, features.2, ...)"},
    {"block", "basic", "basic (BasicBlock), bottleneck (Bottleneck) or inverted (MobileNetV2's "
                       "InvertedResidual)"},
    {"filters", NULL, "basic and inverted: output channels; bottleneck: the width of its 3x3 "
                      "(torchvision's planes), its output has 4 x filters"},
    {"stride", "1", "stride of the block's 3x3 convolution (and of the downsample)"},
    {"downsample", "auto", "basic, bottleneck: auto: a 1x1 convolution + batchnorm on the shortcut "
                           "when the stride or the channels change; 1: always; 0: never (identity)"},
    {"expand", "6", "inverted: expansion ratio t (hidden channels = round(in x t))"},
};

// Appends printf-formatted text at *at within [buf, buf + size); false when it does not fit.
static bool put(char *buf, size_t size, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool put(char *buf, size_t size, size_t *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size - *at) return false;
    *at += (size_t)n;
    return true;
}

static int residual_create(Layer **out, const LayerArgs *a, Error *err) {
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    if (cfg_check_keys(cfg, s, residual_keys, sizeof residual_keys / sizeof residual_keys[0], err)) return -1;
    char name[LAYER_NAME_MAX];
    layer_section_name(cfg, s, name, sizeof name);
    int kind;
    int64_t filters, stride;
    double expand;
    const char *ds;
    if (cfg_choice(cfg, s, "block", "basic", residual_kind_names, RESIDUAL_KINDS, &kind, err) ||
        cfg_int(cfg, s, "filters", NULL, 1, 1 << 20, &filters, err) ||
        cfg_int(cfg, s, "stride", "1", 1, 1024, &stride, err) ||
        cfg_str(cfg, s, "downsample", "auto", &ds, err) ||
        cfg_float(cfg, s, "expand", "6", 1, 1024, &expand, err))
        return -1;
    const int f = (int)filters, st = (int)stride, in = a->in.c;
    const int outputs = kind == BOTTLENECK ? 4 * f : f;
    const bool changes = stride != 1 || outputs != in;
    bool downsample = changes;
    if (kind == INVERTED) {
        if (cfg_entry(s, "downsample"))
            return err_set(err, "%s:%d: [residual] %s: block = inverted has no downsample: its "
                           "shortcut is the identity where the shapes agree, else none",
                           cfg->path, s->line, name);
    } else if (!strcmp(ds, "1") || !strcmp(ds, "0")) {
        downsample = ds[0] == '1';
    } else if (strcmp(ds, "auto")) {
        return err_set(err, "%s:%d: [residual] %s: downsample = '%s': expected auto, 1 or 0", cfg->path,
                       s->line, name, ds);
    }
    if (kind != INVERTED && changes && !downsample)
        return err_set(err, "%s:%d: [residual] %s: downsample = 0, but the block turns %d channels into "
                       "%d with stride %d: the identity shortcut cannot add them; use downsample = auto",
                       cfg->path, s->line, name, in, outputs, st);
    if (kind != INVERTED && cfg_entry(s, "expand"))
        return err_set(err, "%s:%d: [residual] %s: expand is for block = inverted", cfg->path, s->line, name);

    char text[2048];
    size_t at = 0;
    bool fits = true;
#define PUT(...) (fits = fits && put(text, sizeof text, &at, __VA_ARGS__))
#define CONV(n, filt, size, str, groups)                                                              \
    PUT("[conv]\nname = %s\nfilters = %d\nsize = %d\nstride = %d\npad = %d\nbias = 0\n", n, filt, size, \
        str, (size) / 2),                                                                             \
        ((groups) > 1 ? PUT("groups = %d\n", groups) : 0)
#define BN(n, act) PUT("[batchnorm]\nname = %s\nactivation = %s\n", n, act)
    switch ((ResidualKind)kind) {
    case BASIC:
        PUT("[block]\nname = %s\nactivation = relu\n", name);
        CONV("conv1", f, 3, st, 1), BN("bn1", "relu");
        CONV("conv2", f, 3, 1, 1), BN("bn2", "none");
        break;
    case BOTTLENECK:
        PUT("[block]\nname = %s\nactivation = relu\n", name);
        CONV("conv1", f, 1, 1, 1), BN("bn1", "relu");
        CONV("conv2", f, 3, st, 1), BN("bn2", "relu");
        CONV("conv3", outputs, 1, 1, 1), BN("bn3", "none");
        break;
    case INVERTED: {
        const int hidden = (int)lround(in * expand);  // torchvision: int(round(inp * expand_ratio))
        PUT("[block]\nname = %s\nadd = auto\n", name);
        if (hidden != in) {
            CONV("conv.0.0", hidden, 1, 1, 1), BN("conv.0.1", "relu6");
            CONV("conv.1.0", hidden, 3, st, hidden), BN("conv.1.1", "relu6");
            CONV("conv.2", f, 1, 1, 1), BN("conv.3", "none");
        } else {  // expand_ratio 1: torchvision leaves the expansion out and numbers on
            CONV("conv.0.0", hidden, 3, st, hidden), BN("conv.0.1", "relu6");
            CONV("conv.1", f, 1, 1, 1), BN("conv.2", "none");
        }
        break;
    }
    case RESIDUAL_KINDS:
        break;
    }
    if (downsample && kind != INVERTED) {
        PUT("[shortcut]\n");
        CONV("downsample.0", outputs, 1, st, 1), BN("downsample.1", "none");
    }
    PUT("[end]\n");
#undef PUT
#undef CONV
#undef BN
    if (!fits) return err_set(err, "%s:%d: [residual] %s: its block's text is too long", cfg->path, s->line, name);
    return layer_create_child(out, &block_ops, text, a->in, a, err);
}

const LayerOps residual_ops = {
    .type = "residual",
    .summary = "torchvision's residual blocks (BasicBlock, Bottleneck, InvertedResidual) from a few "
               "keys, made as a [block]",
    .keys = residual_keys,
    .nkeys = sizeof residual_keys / sizeof residual_keys[0],
    .create = residual_create,
};
