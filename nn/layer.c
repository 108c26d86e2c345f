// layer.c: the registry of layer types and helpers shared by their implementations.
#include "layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const LayerOps *const layer_types[] = {
    &conv_ops,           &linear_ops,  &batchnorm_ops, &relu_ops,     &relu6_ops,   &maxpool_ops,
    &avgpool_ops, &global_avgpool_ops, &dropout_ops, &flatten_ops,   &residual_ops, &log_softmax_ops};
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
    layer_section_name(a->cfg, a->s, l->name, sizeof l->name);
    const CfgEntry *e = cfg_entry(a->s, "name");
    const char *why = e ? layer_name_problem(e->value) : NULL;
    if (why) {
        err_set(err, "%s:%d: [%s] name '%.100s': %s", a->cfg->path, e->line ? e->line : a->s->line,
                a->s->name, e->value, why);
        free(l);
        return NULL;
    }
    return l;
}

void layer_section_name(const Cfg *cfg, const CfgSection *s, char *name, size_t size) {
    const CfgEntry *e = cfg_entry(s, "name");
    if (e) {
        snprintf(name, size, "%s", e->value);
        return;
    }
    int count = 0;
    for (const CfgSection *t = cfg->sections; t <= s; t++) count += strcmp(t->name, s->name) == 0;
    snprintf(name, size, "%s%d", s->name, count);
}

CfgSection *layer_find_section(const Cfg *cfg, const char *name) {
    for (int i = 0; i < cfg->nsections; i++) {
        CfgSection *s = &cfg->sections[i];
        if (!strcmp(s->name, "train") || !strcmp(s->name, "data")) continue;
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
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = in, .classes = parent->classes};
    const int rc = ops->create(out, &a, err);
    cfg_free(&cfg);  // layers keep what they need
    return rc;
}
