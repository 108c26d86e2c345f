// layer.c: the registry of layer types and helpers shared by their implementations.
#include "layer.h"

#include <stdio.h>
#include <string.h>

const LayerOps *const layer_types[] = {&conv_ops,    &linear_ops,  &relu_ops,       &maxpool_ops,
                                       &dropout_ops, &flatten_ops, &log_softmax_ops};
const int layer_ntypes = sizeof layer_types / sizeof layer_types[0];

const LayerOps *layer_type(const char *section) {
    for (int i = 0; i < layer_ntypes; i++)
        if (strcmp(layer_types[i]->type, section) == 0) return layer_types[i];
    return NULL;
}

void *layer_alloc(size_t size, const LayerOps *ops, const Cfg *cfg, const CfgSection *s,
                  Shape in, Error *err) {
    if (cfg_check_keys(cfg, s, ops->keys, ops->nkeys, err)) return NULL;
    const char *name;
    if (cfg_str(cfg, s, "name", "", &name, err)) return NULL;
    if (strlen(name) >= LAYER_NAME_MAX || strchr(name, '.')) {
        err_set(err, "%s:%d: [%s] name '%s': expected at most %d characters and no '.'",
                cfg->path, s->line, s->name, name, LAYER_NAME_MAX - 1);
        return NULL;
    }
    Layer *l = xcalloc(1, size, err);
    if (!l) return NULL;
    l->ops = ops;
    l->in = in;
    l->out = in;
    layer_section_name(cfg, s, l->name, sizeof l->name);
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

void layer_param(Layer *l, int i, const char *suffix, int ndim, const int64_t *shape) {
    Tensor *t = &l->params[i];
    snprintf(t->name, sizeof t->name, "%s.%s", l->name, suffix);
    t->dtype = DT_F32;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    if (i >= l->nparams) l->nparams = i + 1;
}

int layer_activation(const Cfg *cfg, const CfgSection *s, Activation *act, Error *err) {
    int a;
    if (cfg_choice(cfg, s, "activation", "none", activation_names, ACT_COUNT, &a, err)) return -1;
    *act = (Activation)a;
    return 0;
}
