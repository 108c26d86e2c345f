// layer.c: the registry of layer types and helpers shared by their implementations.
#include "layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const LayerOps *const layer_types[] = {
    &conv_ops,           &linear_ops,   &batchnorm_ops, &relu_ops,    &relu6_ops,
    &maxpool_ops,        &avgpool_ops,  &global_avgpool_ops, &dropout_ops, &flatten_ops,
    &block_ops,          &residual_ops, &log_softmax_ops};
const int layer_ntypes = sizeof layer_types / sizeof layer_types[0];

const LayerOps *layer_type(const char *section) {
    for (int i = 0; i < layer_ntypes; i++)
        if (strcmp(layer_types[i]->type, section) == 0) return layer_types[i];
    return NULL;
}

void layer_free(Layer *l) {
    if (!l) return;
    for (int i = 0; i < l->nchildren; i++) layer_free(l->children[i]);
    free(l->children);
    free(l);
}

// The shape of node i's output (NODE_INPUT: the network's input).
static Shape node_shape(const NodeList *nl, int i) { return i == NODE_INPUT ? nl->input : nl->node[i].out; }

static bool same_shape(Shape a, Shape b) { return a.c == b.c && a.h == b.h && a.w == b.w; }

// A new node at the end of nl; NULL with err.
static NetNode *node_append(NodeList *nl, Error *err) {
    if (nl->n == nl->cap) {
        const int cap = nl->cap ? 2 * nl->cap : 64;
        NetNode *p = realloc(nl->node, (size_t)cap * sizeof *p);
        if (!p) {
            err_set(err, "out of host memory listing the network's nodes");
            return NULL;
        }
        nl->node = p, nl->cap = cap;
    }
    NetNode *n = &nl->node[nl->n++];
    memset(n, 0, sizeof *n);
    n->top = nl->top;
    n->in[0] = n->in[1] = NODE_INPUT;
    return n;
}

int node_leaf(NodeList *nl, Layer *l, int in, bool jit, Error *err) {
    if (in < NODE_INPUT || in >= nl->n || !same_shape(node_shape(nl, in), l->in))
        return err_set(err, "%s: node %d cannot feed it (a container's expand is wrong)", l->name, in);
    NetNode *n = node_append(nl, err);
    if (!n) return -1;
    n->kind = NODE_LEAF, n->l = l, n->in[0] = in, n->out = l->out, n->jit = jit;
    return nl->n - 1;
}

int node_sum(NodeList *nl, int a, int b, Activation act, Error *err) {
    if (a < NODE_INPUT || a >= nl->n || b < NODE_INPUT || b >= nl->n ||
        !same_shape(node_shape(nl, a), node_shape(nl, b)))
        return err_set(err, "a sum of nodes %d and %d of different shapes", a, b);
    const Shape out = node_shape(nl, a);
    NetNode *n = node_append(nl, err);
    if (!n) return -1;
    n->kind = NODE_SUM, n->act = act, n->in[0] = a, n->in[1] = b, n->out = out;
    return nl->n - 1;
}

size_t layer_workspace_bytes(const Layer *l, const Kernels *k, int N) {
    return l->ops->workspace_bytes ? l->ops->workspace_bytes(l, k, N) : 0;
}

bool layer_trains(const Layer *l) { return l->nparams > 0 && !l->frozen; }

int64_t layer_param_floats(const Layer *l) {
    int64_t n = 0;
    for (int j = 0; j < l->nparams; j++) n += tensor_numel(&l->params[j]);
    return n;
}

unsigned layer_backward_reads(const Layer *l) {
    return l->ops->backward_reads ? l->ops->backward_reads(l) : BACKWARD_READS_IN | BACKWARD_READS_OUT;
}

bool layer_is_conv(const Layer *l) { return !strcmp(l->ops->type, "conv"); }

unsigned layer_reads_with_act(Activation act) {
    return BACKWARD_READS_IN | (act == ACT_NONE ? 0 : BACKWARD_READS_OUT);
}

unsigned layer_reads_nothing(const Layer *l) {
    (void)l;
    return 0;
}

unsigned layer_reads_out(const Layer *l) {
    (void)l;
    return BACKWARD_READS_OUT;
}

const char *layer_name_problem(const char *name) {
    if (!*name) return "it is empty";
    if (strlen(name) >= LAYER_NAME_MAX) return "it is longer than a layer name may be";
    if (name[0] == '.' || name[strlen(name) - 1] == '.' || strstr(name, ".."))
        return "a part between its dots is empty (a name is a module path such as layer1.0)";
    return NULL;
}

void *layer_alloc(size_t size, const LayerOps *ops, const LayerArgs *a, Error *err) {
    if (cfg_check_keys(a->cfg, a->s, ops->keys, ops->nkeys, err)) return NULL;
    Layer *l = xcalloc(1, size, err);
    if (!l) return NULL;
    l->ops = ops;
    l->in = a->in;
    l->out = a->in;
    char name[2 * LAYER_NAME_MAX];
    layer_section_name(a->cfg, a->s, name, sizeof name);
    snprintf(l->name, sizeof l->name, "%.*s", LAYER_NAME_MAX - 1, name);
    const CfgEntry *e = cfg_entry(a->s, "name");
    const char *why = e ? layer_name_problem(e->value) : NULL;
    if (!why && strlen(name) >= LAYER_NAME_MAX) why = "with its block's name before it, it is longer than a layer name may be";
    if (why) {
        err_set(err, "%s:%d: [%s] name '%.100s': %s", a->cfg->path, e && e->line ? e->line : a->s->line,
                a->s->name, e ? e->value : name, why);
        free(l);
        return NULL;
    }
    return l;
}

// The markers of a [block]'s member list (nn/block.c): not layers themselves.
static bool is_marker(const CfgSection *s) {
    return !strcmp(s->name, BLOCK_SHORTCUT) || !strcmp(s->name, BLOCK_END);
}

bool layer_is_section(const CfgSection *s) {
    return strcmp(s->name, "train") && strcmp(s->name, "data") && !is_marker(s);
}

// Walks the sections up to s, keeping the stack of [block]s open there: each one's full
// name and how many members of its body and its shortcut came so far. Returns the depth at
// s (its enclosing blocks: frames[0..depth)) and writes s's full name.
typedef struct BlockFrame {
    char name[LAYER_NAME_MAX];
    const CfgSection *s;
    int body, shortcut;  // members so far
    bool in_shortcut;
} BlockFrame;

static int walk_to(const Cfg *cfg, const CfgSection *s, BlockFrame *frames, char *name, size_t size) {
    int depth = 0;
    for (const CfgSection *t = cfg->sections; t < cfg->sections + cfg->nsections; t++) {
        if (!strcmp(t->name, "train") || !strcmp(t->name, "data")) continue;
        if (!strcmp(t->name, BLOCK_END)) {
            if (depth > 0) depth--;
            continue;
        }
        if (!strcmp(t->name, BLOCK_SHORTCUT)) {
            if (depth > 0) frames[depth - 1].in_shortcut = true;
            continue;
        }
        const bool opens = !strcmp(t->name, BLOCK_TYPE) && depth < BLOCK_MAX_DEPTH;
        if (t != s && !opens) {  // only counted: the names spelled are s's and its blocks'
            BlockFrame *f = depth > 0 ? &frames[depth - 1] : NULL;
            if (f) f->in_shortcut ? f->shortcut++ : f->body++;
            continue;
        }
        char full[2 * LAYER_NAME_MAX];  // too long for a name: layer_alloc says so
        const CfgEntry *e = cfg_entry(t, "name");
        if (depth == 0) {
            if (e) {
                snprintf(full, sizeof full, "%s", e->value);
            } else {  // the type and its count among the top-level sections so far
                int count = 0, d = 0;
                for (const CfgSection *u = cfg->sections; u <= t; u++) {
                    if (!strcmp(u->name, BLOCK_END)) {
                        if (d > 0) d--;
                        continue;
                    }
                    if (d == 0 && !strcmp(u->name, t->name)) count++;
                    if (!strcmp(u->name, BLOCK_TYPE)) d++;
                }
                snprintf(full, sizeof full, "%s%d", t->name, count);
            }
        } else {  // a member: named under its block, by default as nn.Sequential numbers them
            BlockFrame *f = &frames[depth - 1];
            char rel[LAYER_NAME_MAX];
            if (e) snprintf(rel, sizeof rel, "%s", e->value);
            else if (f->in_shortcut) snprintf(rel, sizeof rel, "downsample.%d", f->shortcut);
            else snprintf(rel, sizeof rel, "%d", f->body);
            f->in_shortcut ? f->shortcut++ : f->body++;
            snprintf(full, sizeof full, "%s.%s", f->name, rel);
        }
        if (t == s) {
            snprintf(name, size, "%s", full);
            return depth;
        }
        if (opens) {
            frames[depth] = (BlockFrame){.s = t};
            snprintf(frames[depth].name, sizeof frames[depth].name, "%.*s", LAYER_NAME_MAX - 1, full);
            depth++;
        }
    }
    snprintf(name, size, "%s", s->name);  // s is not in cfg
    return 0;
}

void layer_section_name(const Cfg *cfg, const CfgSection *s, char *name, size_t size) {
    BlockFrame frames[BLOCK_MAX_DEPTH];
    walk_to(cfg, s, frames, name, size);
}

const CfgSection *layer_section_block(const Cfg *cfg, const CfgSection *s) {
    BlockFrame frames[BLOCK_MAX_DEPTH];
    char name[LAYER_NAME_MAX];
    const int depth = walk_to(cfg, s, frames, name, sizeof name);
    return depth ? frames[depth - 1].s : NULL;
}

int layer_section_extent(const Cfg *cfg, const CfgSection *s, Error *err) {
    if (is_marker(s))
        return err_set(err, "%s:%d: [%s] outside a [%s]: it %s", cfg->path, s->line, s->name, BLOCK_TYPE,
                       !strcmp(s->name, BLOCK_END) ? "closes a block's member list"
                                                   : "separates a block's body from its shortcut");
    if (strcmp(s->name, BLOCK_TYPE)) return 1;
    int depth = 0;
    for (const CfgSection *t = s; t < cfg->sections + cfg->nsections; t++) {
        if (!strcmp(t->name, "train") || !strcmp(t->name, "data"))
            return err_set(err, "%s:%d: [%s] inside the [%s] of line %d: close the block with [%s] first",
                           cfg->path, t->line, t->name, BLOCK_TYPE, s->line, BLOCK_END);
        if (!strcmp(t->name, BLOCK_TYPE) && ++depth > BLOCK_MAX_DEPTH)
            return err_set(err, "%s:%d: blocks nest deeper than %d", cfg->path, t->line, BLOCK_MAX_DEPTH);
        if (!strcmp(t->name, BLOCK_END) && --depth == 0) return (int)(t - s) + 1;
    }
    return err_set(err, "%s:%d: [%s] has no [%s] after its members", cfg->path, s->line, BLOCK_TYPE,
                   BLOCK_END);
}

int layer_section_count(const Cfg *cfg, Error *err) {
    int n = 0;
    for (int i = 0; i < cfg->nsections; i++) {
        if (!strcmp(cfg->sections[i].name, "train") || !strcmp(cfg->sections[i].name, "data")) continue;
        const int extent = layer_section_extent(cfg, &cfg->sections[i], err);
        if (extent < 0) return -1;
        n++;
        i += extent - 1;
    }
    return n;
}

CfgSection *layer_find_section(const Cfg *cfg, const char *name) {
    for (int i = 0; i < cfg->nsections; i++) {
        CfgSection *s = &cfg->sections[i];
        if (!layer_is_section(s)) continue;
        char n[LAYER_NAME_MAX];
        layer_section_name(cfg, s, n, sizeof n);
        if (strcmp(n, name) == 0) return s;
    }
    return NULL;
}

void layer_param(Layer *l, int i, const char *suffix, int ndim, const int64_t *shape,
                 ParamInit init) {
    Tensor *t = &l->params[i];
    snprintf(t->name, sizeof t->name, "%s.%s", l->name, suffix);
    t->dtype = DT_F32;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    l->init[i] = init;
    if (i >= l->nparams) l->nparams = i + 1;
}

void layer_buffer(Layer *l, int i, const char *suffix, int64_t n, float fill, int64_t *counter) {
    Tensor *t = &l->buffers[i];
    snprintf(t->name, sizeof t->name, "%s.%s", l->name, suffix);
    if (n < 0) {  // a host scalar: PyTorch saves num_batches_tracked as an I64 of shape []
        t->dtype = DT_I64;
        t->ndim = 0;
        t->data = counter;
    } else {
        t->dtype = DT_F32;
        t->ndim = 1;
        t->shape[0] = n;
    }
    l->buffer_fill[i] = fill;
    if (i >= l->nbuffers) l->nbuffers = i + 1;
}

int layer_activation(const LayerArgs *a, Activation *act, Error *err) {
    int v;
    if (cfg_choice(a->cfg, a->s, "activation", "none", activation_names, ACT_COUNT, &v, err)) return -1;
    *act = (Activation)v;
    return 0;
}

int layer_create_child(Layer **out, const LayerOps *ops, const char *text, Shape in,
                       const LayerArgs *parent, Error *err) {
    Cfg cfg;
    if (cfg_parse(&cfg, text, parent->cfg->path, err)) return -1;
    // Messages about the child point at the parent's section.
    for (int i = 0; i < cfg.nsections; i++) {
        cfg.sections[i].line = parent->s->line;
        for (int j = 0; j < cfg.sections[i].nentries; j++) cfg.sections[i].entries[j].line = parent->s->line;
    }
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = in, .classes = parent->classes, .k = parent->k};
    const int rc = ops->create(out, &a, err);
    cfg_free(&cfg);  // layers keep what they need
    return rc;
}
