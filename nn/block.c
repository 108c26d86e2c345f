// block.c: the general block (DESIGN.md decision 11, as revised): a layer of the sequential
// network whose body and shortcut are cfg sections of their own,
//
//     [block]
//     name = layer1.0
//     activation = relu      # on the sum
//     [conv]                 # the body: layer1.0.conv1, ...
//     name = conv1
//     ...
//     [shortcut]             # optional: the shortcut's layers (none: the identity)
//     [conv]
//     name = downsample.0
//     ...
//     [end]
//
// computing out = act(body(x) + shortcut(x)), or body(x) alone (add = 0, or add = auto
// and shapes that cannot add: an InvertedResidual with a stride). Members are named under
// the block (layer_section_name): their `name`, or their place as nn.Sequential numbers
// them. torchvision's BasicBlock, Bottleneck and InvertedResidual are such text
// (nn/residual.c writes it from a few keys).
//
// It expands into its members' nodes and the sum. The planner's rule of recomputation
// inside a block (what residual.c hand-coded for BasicBlock): a batchnorm between two
// convolutions, and the shortcut's 1x1 convolution, are jit: cheap to compute again from
// an output the network keeps anyway (the convolution's before it; the block's input),
// so backward recomputes them where it reads them instead of keeping them. With
// NetOptions.recompute_1x1 (`recompute_1x1 = 1`) so is a body's 1x1 convolution that does
// not narrow (a Bottleneck's conv3, an InvertedResidual's expansion) whose output only the
// batchnorm after it reads: its input is kept anyway (its weight gradient reads it), and
// recomputing costs a GEMM of C_in products for each value not kept: a saver, at 8-37% of
// a step, not the rule.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef enum BlockAdd { ADD_AUTO, ADD_ALWAYS, ADD_NEVER, ADD_MODES } BlockAdd;
static const char *const add_names[ADD_MODES] = {"auto", "1", "0"};

typedef struct Block {
    Layer base;
    int nbody;  // children[0..nbody): the body; the rest: the shortcut (none: the identity)
    bool add;   // out = act(body(x) + shortcut(x)); false: out = body(x)
    Activation act;
} Block;

static const CfgKey block_keys[] = {
    {"name", "block<k>", "module path of the block (layer1.0, features.2, ...); its members' "
                         "names follow it"},
    {"add", "1", "1: out = body(x) + shortcut(x); auto: add when the shapes agree (an "
                 "InvertedResidual), else out = body(x); 0: out = body(x)"},
    {"activation", "none", "none, relu or relu6, applied to the sum"},
};

static bool same_shape(Shape a, Shape b) { return a.c == b.c && a.h == b.h && a.w == b.w; }

// Creates the members in sections (first, last) of cfg into l->children from shape `in`:
// the body, then after a [shortcut] the shortcut's from `in` again.
static int block_members(Block *b, const LayerArgs *a, int first, int last, Shape *body_out,
                         Shape *shortcut_out, Error *err) {
    Layer *l = &b->base;
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    int n = 0;
    for (int i = first; i < last; i++) {
        if (!strcmp(cfg->sections[i].name, BLOCK_SHORTCUT)) continue;
        const int extent = layer_section_extent(cfg, &cfg->sections[i], err);
        if (extent < 0) return -1;
        n++;
        i += extent - 1;
    }
    if (!(l->children = xcalloc((size_t)n, sizeof *l->children, err))) return -1;
    Shape shape = a->in;
    bool in_shortcut = false;
    for (int i = first; i < last; i++) {
        const CfgSection *m = &cfg->sections[i];
        if (!strcmp(m->name, BLOCK_SHORTCUT)) {
            if (in_shortcut)
                return err_set(err, "%s:%d: a second [%s] in the [%s] of line %d", cfg->path, m->line,
                               BLOCK_SHORTCUT, BLOCK_TYPE, s->line);
            if (m->nentries)
                return err_set(err, "%s:%d: [%s] takes no keys: the shortcut's layers follow it",
                               cfg->path, m->entries[0].line, BLOCK_SHORTCUT);
            in_shortcut = true;
            b->nbody = l->nchildren;
            *body_out = shape;
            shape = a->in;
            continue;
        }
        const LayerOps *ops = layer_type(m->name);
        if (!ops)
            return err_set(err, "%s:%d: unknown section [%s] in the [%s] of line %d", cfg->path, m->line,
                           m->name, BLOCK_TYPE, s->line);
        const LayerArgs ma = {.cfg = cfg, .s = m, .in = shape, .classes = a->classes, .k = a->k};
        if (ops->create(&l->children[l->nchildren], &ma, err)) return -1;
        shape = l->children[l->nchildren++]->out;
        i += layer_section_extent(cfg, m, err) - 1;
    }
    if (in_shortcut) {
        *shortcut_out = shape;
    } else {
        b->nbody = l->nchildren;
        *body_out = shape;
        *shortcut_out = a->in;
    }
    if (b->nbody == 0)
        return err_set(err, "%s:%d: [%s] %s has no body: list its layers between [%s] and [%s]",
                       cfg->path, s->line, BLOCK_TYPE, l->name, BLOCK_TYPE,
                       in_shortcut ? BLOCK_SHORTCUT : BLOCK_END);
    if (in_shortcut && b->nbody == l->nchildren)
        return err_set(err, "%s:%d: [%s] %s: [%s] with no layers after it: leave it out for the "
                       "identity", cfg->path, s->line, BLOCK_TYPE, l->name, BLOCK_SHORTCUT);
    return 0;
}

static int block_create(Layer **out, const LayerArgs *a, Error *err) {
    Block *b = layer_alloc(sizeof *b, &block_ops, a, err);
    if (!b) return -1;
    Layer *l = &b->base;
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    int add;
    const int extent = layer_section_extent(cfg, s, err);
    if (extent < 0 || cfg_choice(cfg, s, "add", "1", add_names, ADD_MODES, &add, err) ||
        layer_activation(a, &b->act, err))
        goto fail;
    const int first = (int)(s - cfg->sections) + 1;
    Shape body = a->in, shortcut = a->in;
    if (block_members(b, a, first, first + extent - 2, &body, &shortcut, err)) goto fail;
    const bool agree = same_shape(body, shortcut);
    const bool has_shortcut = b->nbody < l->nchildren;
    if (add == ADD_ALWAYS && !agree) {
        err_set(err, "%s:%d: [%s] %s: the body gives %dx%dx%d but the shortcut %dx%dx%d: they cannot "
                "add (%s)", cfg->path, s->line, BLOCK_TYPE, l->name, body.c, body.h, body.w, shortcut.c,
                shortcut.h, shortcut.w,
                has_shortcut ? "fix the shortcut's layers"
                             : "give the block a [shortcut], such as a 1x1 [conv] with the stride");
        goto fail;
    }
    if (add == ADD_NEVER && has_shortcut) {
        err_set(err, "%s:%d: [%s] %s: add = 0 but it has a [%s]: nothing would read it", cfg->path,
                s->line, BLOCK_TYPE, l->name, BLOCK_SHORTCUT);
        goto fail;
    }
    if (add == ADD_AUTO && !agree && has_shortcut) {
        err_set(err, "%s:%d: [%s] %s: add = auto, and the shortcut's output %dx%dx%d differs from the "
                "body's %dx%dx%d", cfg->path, s->line, BLOCK_TYPE, l->name, shortcut.c, shortcut.h,
                shortcut.w, body.c, body.h, body.w);
        goto fail;
    }
    b->add = add == ADD_ALWAYS || (add == ADD_AUTO && agree);
    if (!b->add && b->act != ACT_NONE) {
        err_set(err, "%s:%d: [%s] %s: activation = %s applies to the sum, and this block adds "
                "nothing: put it on the body's last layer", cfg->path, s->line, BLOCK_TYPE, l->name,
                activation_names[b->act]);
        goto fail;
    }
    l->out = body;
    *out = l;
    return 0;
fail:
    layer_free(l);
    return -1;
}

static bool is_pointwise_conv(const Layer *l) {
    return layer_is_conv(l) && l->params[0].ndim == 4 && l->params[0].shape[2] == 1 && l->params[0].shape[3] == 1;
}

// A body's 1x1 convolution that does not narrow, and whose output only the batchnorm after
// it reads.
static bool widening_1x1(const Block *b, int i) {
    Layer *const *m = b->base.children;
    return i + 1 < b->nbody && is_pointwise_conv(m[i]) && m[i]->in.c <= m[i]->out.c &&
           m[i + 1]->ops == &batchnorm_ops;
}

// The rule of recomputation inside a block: which members are cheap to compute again from
// an input the network keeps anyway (see the top of this file).
static bool member_jit(const Block *b, int i, const NodeList *nl) {
    Layer *const *m = b->base.children;
    if (i < b->nbody)
        return (m[i]->ops == &batchnorm_ops && i > 0 && i + 1 < b->nbody && layer_is_conv(m[i - 1]) &&
                !m[i - 1]->ops->expand && layer_is_conv(m[i + 1])) ||
               (nl->recompute_1x1 && widening_1x1(b, i));
    return i == b->nbody && i + 1 < b->base.nchildren && is_pointwise_conv(m[i]);
}

static int block_expand(Layer *l, NodeList *nl, int in, Error *err) {
    const Block *b = (const Block *)l;
    int body = in, shortcut = in;
    for (int i = 0; i < l->nchildren; i++) {
        Layer *m = l->children[i];
        int *at = i < b->nbody ? &body : &shortcut;
        nl->widening_1x1 += widening_1x1(b, i);
        *at = m->ops->expand ? m->ops->expand(m, nl, *at, err) : node_leaf(nl, m, *at, member_jit(b, i, nl), err);
        if (*at < 0) return -1;
    }
    return b->add ? node_sum(nl, body, shortcut, b->act, err) : body;
}

const LayerOps block_ops = {
    .type = BLOCK_TYPE,
    .summary = "a block: its body's layers (the sections up to [shortcut] or [end]) and a "
               "shortcut's (after [shortcut]; none: the identity), out = act(body(x) + shortcut(x))",
    .keys = block_keys,
    .nkeys = sizeof block_keys / sizeof block_keys[0],
    .create = block_create,
    .expand = block_expand,
};
