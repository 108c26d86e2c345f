// net.c: building, planning, allocating and running the sequential network.
#include "net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

size_t mem_plan_total(const MemPlan *p) {
    return p->params + p->grads + p->optimizer + p->activations + p->workspace + p->loader;
}

// Blocks are carved in 64-byte aligned pieces.
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool is_layer_section(const CfgSection *s) {
    return strcmp(s->name, "train") != 0 && strcmp(s->name, "data") != 0;
}

static int net_build_layers(Net *net, const Cfg *cfg, Shape input, int classes, Error *err) {
    int n = 0;
    for (int i = 0; i < cfg->nsections; i++) n += is_layer_section(&cfg->sections[i]);
    if (n == 0)
        return err_set(err, "%s: no layer sections: the network needs at least [flatten], "
                            "[linear] and [log_softmax]", cfg->path);
    net->layers = xcalloc((size_t)n, sizeof *net->layers, err);
    if (!net->layers) return -1;
    Shape shape = input;
    const CfgSection *last = NULL;
    for (int i = 0; i < cfg->nsections; i++) {
        const CfgSection *s = &cfg->sections[i];
        if (!is_layer_section(s)) continue;
        const LayerOps *ops = layer_type(s->name);
        if (!ops) {
            char known[256] = "";
            for (int t = 0; t < layer_ntypes; t++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s[%s]",
                         t ? ", " : "", layer_types[t]->type);
            return err_set(err, "%s:%d: unknown section [%s]; known: [train], [data], %s",
                           cfg->path, s->line, s->name, known);
        }
        Layer *l = NULL;
        if (ops->create(&l, cfg, s, shape, err)) return -1;
        l->index = net->nlayers;
        net->layers[net->nlayers++] = l;
        for (int j = 0; j < net->nlayers - 1; j++)
            if (strcmp(net->layers[j]->name, l->name) == 0)
                return err_set(err, "%s:%d: [%s] name '%s' is already used by an earlier layer",
                               cfg->path, s->line, s->name, l->name);
        shape = l->out;
        last = s;
    }
    const Layer *out = net->layers[net->nlayers - 1];
    if (out->ops != &log_softmax_ops)
        return err_set(err, "%s:%d: the last layer is [%s]: it must be [log_softmax], whose "
                            "log-probabilities the NLL loss takes", cfg->path, last->line, last->name);
    if (out->out.c != classes)
        return err_set(err, "%s:%d: the network ends with %d outputs but the data has %d classes: "
                            "set `outputs = %d` in the last [linear]",
                       cfg->path, last->line, out->out.c, classes, classes);
    return 0;
}

// Computes net->plan and the offsets of everything; with `base` non-NULL also sets the
// pointers. The same function plans and carves, so the plan is the allocation.
static void net_layout(Net *net, char *act_base) {
    const int B = net->batch;
    size_t off = 0, largest = (size_t)shape_numel(net->input);
    if (act_base) net->input_buf = (float *)(act_base + off);
    off += align64((size_t)B * shape_numel(net->input) * sizeof(float));
    for (int i = 0; i < net->nlayers; i++) {
        const size_t n = (size_t)shape_numel(net->layers[i]->out);
        if (act_base) net->acts[i] = (float *)(act_base + off);
        off += align64((size_t)B * n * sizeof(float));
        if (n > largest) largest = n;
    }
    for (int i = 0; i < 2; i++) {
        if (act_base) net->grad_buf[i] = (float *)(act_base + off);
        off += align64((size_t)B * largest * sizeof(float));
    }
    if (act_base) net->labels = (int32_t *)(act_base + off);
    off += align64((size_t)B * sizeof(int32_t));
    if (act_base) net->metrics = (float *)(act_base + off);
    off += align64(2 * sizeof(float));
    net->plan.activations = off;

    size_t ws = 0;
    for (int i = 0; i < net->nlayers; i++) {
        size_t w = net->layers[i]->ops->workspace_bytes(net->layers[i], B);
        if (w > ws) ws = w;
    }
    net->plan.workspace = ws;
    net->plan.params = (size_t)net->nparams * sizeof(float);
    net->plan.grads = net->plan.params;
    net->plan.optimizer = 2 * net->plan.params;
}

static void *device_block(const Kernels *k, size_t bytes, const char *what, Error *err) {
    void *p = k->alloc(bytes);
    if (!p)
        err_set(err, "out of %s memory: the %s block needs %.1f MB; lower the batch or see "
                     "`./train CFG --plan`", k->name, what, bytes / 1e6);
    else
        k->zero(p, bytes);
    return p;
}

int net_create(Net *net, const Cfg *cfg, Shape input, int classes, int batch, const Kernels *k,
               Error *err) {
    memset(net, 0, sizeof *net);
    net->k = k;
    net->input = input;
    net->batch = batch;
    if (net_build_layers(net, cfg, input, classes, err)) goto fail;
    for (int i = 0; i < net->nlayers; i++)
        for (int j = 0; j < net->layers[i]->nparams; j++)
            net->nparams += tensor_numel(&net->layers[i]->params[j]);
    net_layout(net, NULL);

    net->acts = xcalloc((size_t)net->nlayers, sizeof *net->acts, err);
    if (!net->acts) goto fail;
    if (!(net->params = device_block(k, net->plan.params, "parameter", err)) ||
        !(net->grads = device_block(k, net->plan.grads, "gradient", err)) ||
        !(net->optimizer = device_block(k, net->plan.optimizer, "optimizer state", err)) ||
        !(net->activations = device_block(k, net->plan.activations, "activation", err)) ||
        !(net->workspace = device_block(k, net->plan.workspace, "workspace", err)))
        goto fail;
    net_layout(net, net->activations);
    int64_t off = 0;
    for (int i = 0; i < net->nlayers; i++) {
        Layer *l = net->layers[i];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].data = net->params + off;
            l->grads[j] = net->grads + off;
            off += tensor_numel(&l->params[j]);
        }
    }
    return 0;
fail:
    net_free(net);
    return -1;
}

void net_free(Net *net) {
    if (net->k) {
        void *blocks[] = {net->params, net->grads, net->optimizer, net->activations, net->workspace};
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
            if (blocks[i]) net->k->release(blocks[i]);
    }
    for (int i = 0; i < net->nlayers; i++) free(net->layers[i]);
    free(net->layers);
    free(net->acts);
    memset(net, 0, sizeof *net);
}

int net_init_params(Net *net, uint64_t seed, Error *err) {
    float *host = xcalloc((size_t)net->nparams ? (size_t)net->nparams : 1, sizeof(float), err);
    if (!host) return -1;
    int64_t off = 0;
    for (int i = 0; i < net->nlayers; i++) {
        const Layer *l = net->layers[i];
        for (int j = 0; j < l->nparams; j++) {
            const uint64_t key = rng_key(seed, RNG_STREAM_INIT, (uint64_t)i, (uint64_t)j);
            const int64_t n = tensor_numel(&l->params[j]);
            for (int64_t e = 0; e < n; e++)
                host[off + e] = (float)((2.0 * rng_uniform(key, (uint64_t)e) - 1.0) * l->init_bound);
            off += n;
        }
    }
    net->k->upload(net->params, host, (size_t)net->nparams * sizeof(float));
    free(host);
    return 0;
}

static LayerCtx net_ctx(const Net *net, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    return (LayerCtx){.k = net->k, .workspace = net->workspace, .seed = seed, .step = step,
                      .sample0 = sample0, .train = train};
}

void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, train, seed, step, sample0);
    const float *in = net->input_buf;
    for (int i = 0; i < net->nlayers; i++) {
        Layer *l = net->layers[i];
        l->ops->forward(l, &ctx, net->acts[i], in, N);
        in = net->acts[i];
    }
}

void net_loss(Net *net, int N, int denominator, bool grad) {
    const Layer *out = net->layers[net->nlayers - 1];
    net->k->nll_loss(grad ? net->grad_buf[0] : NULL, net->metrics, net_output(net), net->labels, N, out->out.c,
                     1.0f / (float)denominator);
}

void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, true, seed, step, sample0);
    int cur = 0;  // grad_buf[cur] holds the gradient of layer i's output
    for (int i = net->nlayers - 1; i >= 0; i--) {
        Layer *l = net->layers[i];
        const float *in = i > 0 ? net->acts[i - 1] : net->input_buf;
        float *din = i > 0 ? net->grad_buf[1 - cur] : NULL;
        l->ops->backward(l, &ctx, din, net->grad_buf[cur], in, net->acts[i], N);
        cur = 1 - cur;
    }
}

void net_zero_grads(Net *net) { net->k->zero(net->grads, (size_t)net->nparams * sizeof(float)); }

void net_print(const Net *net, FILE *f) {
    fprintf(f, "  %-3s %-14s %-12s %-16s %12s\n", "#", "name", "type", "output (CxHxW)", "params");
    char in[48];
    snprintf(in, sizeof in, "%dx%dx%d", net->input.c, net->input.h, net->input.w);
    fprintf(f, "  %-3s %-14s %-12s %-16s %12s\n", "", "input", "", in, "");
    for (int i = 0; i < net->nlayers; i++) {
        const Layer *l = net->layers[i];
        int64_t p = 0;
        for (int j = 0; j < l->nparams; j++) p += tensor_numel(&l->params[j]);
        char shape[48];
        snprintf(shape, sizeof shape, "%dx%dx%d", l->out.c, l->out.h, l->out.w);
        fprintf(f, "  %-3d %-14s %-12s %-16s %12lld\n", i, l->name, l->ops->type, shape, (long long)p);
    }
    fprintf(f, "  parameters: %lld\n", (long long)net->nparams);
}
