// net.c: building, planning, allocating and running the sequential network.
#include "net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt19937.h"

size_t mem_plan_total(const MemPlan *p) {
    return p->params + p->grads + p->optimizer + p->buffers + p->activations + p->workspace +
           p->loader;
}

// Blocks are carved in 64-byte aligned pieces.
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool is_layer_section(const CfgSection *s) {
    return strcmp(s->name, "train") != 0 && strcmp(s->name, "data") != 0;
}

static int count_modules(const Layer *l) {
    int n = 1;
    for (int i = 0; i < l->nchildren; i++) n += count_modules(l->children[i]);
    return n;
}

// Appends l and its children (pre-order) to net->modules, numbering them.
static void add_modules(Net *net, Layer *l) {
    l->index = net->nmodules;
    net->modules[net->nmodules++] = l;
    for (int i = 0; i < l->nchildren; i++) add_modules(net, l->children[i]);
}

static int net_build_layers(Net *net, const Cfg *cfg, Shape input, int classes, Error *err) {
    int n = 0;
    for (int i = 0; i < cfg->nsections; i++) n += is_layer_section(&cfg->sections[i]);
    if (n == 0)
        return err_set(err, "%s: no layer sections: the network needs at least [flatten], "
                            "[linear] and [log_softmax]", cfg->path);
    net->layers = xcalloc((size_t)n, sizeof *net->layers, err);
    if (!net->layers) return -1;
    // The section of each top-level layer, for messages about it.
    const CfgSection **from = xcalloc((size_t)n, sizeof *from, err);
    if (!from) return -1;
    int rc = -1;
    Shape shape = input;
    const CfgSection *last = NULL;
    for (int i = 0; i < cfg->nsections; i++) {
        const CfgSection *s = &cfg->sections[i];
        if (!is_layer_section(s)) continue;
        const LayerOps *ops = layer_type(s->name);
        if (!ops) {
            char known[512] = "";
            for (int t = 0; t < layer_ntypes; t++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s[%s]",
                         t ? ", " : "", layer_types[t]->type);
            err_set(err, "%s:%d: unknown section [%s]; known: [train], [data], %s", cfg->path,
                    s->line, s->name, known);
            goto done;
        }
        if (ops->run_forward && net->nlayers == 0) {
            err_set(err, "%s:%d: [%s] is the first layer: a block needs a layer before it (a "
                         "stem such as [conv] + [batchnorm])", cfg->path, s->line, s->name);
            goto done;
        }
        Layer *l = NULL;
        const LayerArgs args = {.cfg = cfg, .s = s, .in = shape, .classes = classes};
        if (ops->create(&l, &args, err)) goto done;
        from[net->nlayers] = s;
        net->layers[net->nlayers++] = l;
        net->nmodules += count_modules(l);
        shape = l->out;
        last = s;
    }
    if (!(net->modules = xcalloc((size_t)net->nmodules, sizeof *net->modules, err))) goto done;
    net->nmodules = 0;
    for (int t = 0; t < net->nlayers; t++) {
        const int first = net->nmodules;
        add_modules(net, net->layers[t]);
        for (int i = first; i < net->nmodules; i++)
            for (int j = 0; j < i; j++)
                if (strcmp(net->modules[j]->name, net->modules[i]->name) == 0) {
                    err_set(err, "%s:%d: [%s] the name '%s' is already used by an earlier layer: "
                                 "names must be unique (they key the checkpoint)",
                            cfg->path, from[t]->line, from[t]->name, net->modules[i]->name);
                    goto done;
                }
    }
    rc = 0;
done:
    free(from);
    if (rc) return -1;
    const Layer *out = net->layers[net->nlayers - 1];
    if (out->ops != &log_softmax_ops)
        return err_set(err, "%s:%d: the last layer is [%s]: it must be [log_softmax], whose "
                            "log-probabilities the NLL loss takes", cfg->path, last->line, last->name);
    if (out->out.c != classes)
        return err_set(err, "%s:%d: the network ends with %d outputs but the data has %d classes: "
                            "set `outputs = %d` (or `outputs = classes`) in the last [linear]",
                       cfg->path, last->line, out->out.c, classes, classes);
    return 0;
}

// fp16 runs each layer over chunks of samples through four fp32 scratch buffers; the
// chunk is as many samples as fit in this many bytes of scratch (at least one).
#define FP16_SCRATCH_BYTES ((size_t)16 << 20)

static int64_t inner_values(const Layer *l) { return l->ops->inner_values ? l->ops->inner_values(l) : 0; }

// Values of the largest input or output of l and its children.
static size_t largest_of(const Layer *l) {
    size_t m = (size_t)shape_numel(l->in);
    if ((size_t)shape_numel(l->out) > m) m = (size_t)shape_numel(l->out);
    for (int i = 0; i < l->nchildren; i++) {
        const size_t c = largest_of(l->children[i]);
        if (c > m) m = c;
    }
    return m;
}

// Computes net->plan and the offsets of everything; with `act_base` non-NULL also sets
// the pointers. The same function plans and carves, so the plan is the allocation.
static void net_layout(Net *net, char *act_base) {
    const int B = net->batch, last = net->nlayers - 1;
    const size_t es = dtype_sizes[net->precision];
    size_t off = 0;
    if (act_base) net->input_buf = (float *)(act_base + off);
    off += align64((size_t)B * shape_numel(net->input) * sizeof(float));
    // Saved outputs: the last layer of each segment (the network's output is one, in F32).
    for (int g = 0; g < net->nsegments; g++) {
        const int i = net->seg_first[g + 1] - 1;
        if (act_base) net->acts[i] = act_base + off;
        off += align64((size_t)B * shape_numel(net->layers[i]->out) * (i == last ? sizeof(float) : es));
    }
    net->plan.act_saved = off;
    // The scratch region: the other outputs of one segment at a time, laid out in order,
    // and the inner activations of its containers (the last one's too: backward recomputes
    // it when it has them).
    size_t scratch = 0;
    for (int g = 0; g < net->nsegments; g++) {
        size_t o = 0;
        for (int i = net->seg_first[g]; i < net->seg_first[g + 1]; i++) {
            Layer *l = net->layers[i];
            if (i < net->seg_first[g + 1] - 1) {
                if (act_base) net->acts[i] = act_base + off + o;
                o += align64((size_t)B * shape_numel(l->out) * es);
            }
            if (inner_values(l)) {
                if (act_base) l->inner = act_base + off + o;
                o += align64((size_t)B * (size_t)inner_values(l) * es);
            }
        }
        if (o > scratch) scratch = o;
    }
    off += scratch;
    net->plan.act_scratch = scratch;
    if (net->nsegments == 1) {  // nothing is recomputed: every output is kept
        net->plan.act_saved += scratch;
        net->plan.act_scratch = 0;
    }
    size_t block_scratch = 0;
    for (int i = 0; i <= last; i++) {
        const Layer *l = net->layers[i];
        if (l->ops->scratch_values && (size_t)l->ops->scratch_values(l) > block_scratch)
            block_scratch = (size_t)l->ops->scratch_values(l);
    }
    // The gradient buffers, each as large as the largest input gradient written into it
    // (backward stops at the first trained layer, which writes none).
    net->grad_bytes[0] = net->grad_bytes[1] = 0;
    for (int i = last, cur = -1; i > net->first_trained; i--) {
        cur = net_din_slot(net, i, cur);
        const size_t b = align64((size_t)B * (size_t)shape_numel(net->layers[i]->in) * es);
        if (b > net->grad_bytes[cur]) net->grad_bytes[cur] = b;
    }
    for (int i = 0; i < 2; i++) {
        if (act_base) net->grad_buf[i] = net->grad_bytes[i] ? act_base + off : NULL;
        off += net->grad_bytes[i];
    }
    if (act_base) net->exec.block_scratch = block_scratch ? act_base + off : NULL;
    off += align64((size_t)B * block_scratch * es);
    if (act_base) net->dlogp = (float *)(act_base + off);
    off += align64((size_t)B * shape_numel(net->layers[last]->out) * sizeof(float));
    if (act_base) net->labels = (int32_t *)(act_base + off);
    off += align64((size_t)B * sizeof(int32_t));
    if (act_base) net->metrics = (float *)(act_base + off);
    off += align64(NET_METRICS * sizeof(float));
    net->plan.activations = off;

    // Layers run on the whole batch in fp32, on chunks through the scratch in fp16. The
    // workspace block holds the scratch (fp16 only) and then the layers' workspace.
    size_t largest_any = 0;
    for (int i = 0; i <= last; i++)
        if (largest_of(net->layers[i]) > largest_any) largest_any = largest_of(net->layers[i]);
    net->exec.precision = net->precision;
    net->exec.slot_values = 0;
    size_t ws = 0;
    if (net->precision == DT_F16) {  // a slot holds `fit` samples of the largest activation
        const size_t per_sample = 4 * largest_any * sizeof(float);
        size_t fit = FP16_SCRATCH_BYTES / per_sample;
        fit = fit < 1 ? 1 : fit > (size_t)B ? (size_t)B : fit;
        net->exec.slot_values = (int64_t)(fit * largest_any);
        ws = 4 * align64(fit * largest_any * sizeof(float));
    }
    net->scratch_bytes = ws;
    size_t layer_ws = 0;
    for (int i = 0; i < net->nmodules; i++) {
        const Layer *l = net->modules[i];
        const size_t w = layer_workspace_bytes(l, exec_chunk(&net->exec, l, B));
        if (w > layer_ws) layer_ws = w;
    }
    net->plan.workspace = ws + layer_ws;
    net->plan.params = (size_t)net->nparams * sizeof(float);
    net->plan.grads = (size_t)net->ntrain * sizeof(float);
    net->plan.optimizer = (size_t)net->nstates * net->plan.grads;
}

// The buffer block: every module's F32 buffers, then every module's state. Computes
// net->plan.buffers; with `base` non-NULL sets the pointers.
static void net_layout_buffers(Net *net, char *base) {
    size_t off = 0;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        for (int j = 0; j < l->nbuffers; j++) {
            Tensor *t = &l->buffers[j];
            if (t->dtype != DT_F32) continue;  // the I64 counters live on the host
            if (base) t->data = base + off;
            off += align64(tensor_bytes(t));
        }
    }
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        if (!l->ops->state_bytes) continue;
        if (base) l->state = base + off;
        off += align64(l->ops->state_bytes(l));
    }
    net->plan.buffers = off;
}

// Checkpoint segments (DESIGN.md decision 6). Segment [s, e) keeps its last output
// (saved) and lays the others, with the inner activations of all its layers, in the
// scratch region that the segments share; the activation bytes a segmentation costs are
// the saved outputs plus the largest segment's scratch (net_layout). S segments are cut
// where that sum is smallest: the big early activations of an image network (ResNet's
// 112x112 stem) then get segments of their own instead of an equal share of layers.
typedef struct SegCost {
    int n;
    const size_t *out;    // (n) bytes of each layer's output
    const size_t *above;  // (n + 1) above[i]: the bytes of outputs and inner activations of
                          // layers 0 .. i-1 (prefix sums)
} SegCost;

static size_t seg_scratch(const SegCost *c, int s, int e) {
    return c->above[e] - c->above[s] - c->out[e - 1];
}

// The fewest saved bytes over exactly S segments whose scratch is at most limit
// (SIZE_MAX if none); first[] gets the cut. dp is (S + 1) * (n + 1) sums and from the
// same of arg-mins.
static size_t seg_fit(const SegCost *c, int S, size_t limit, size_t *dp, int *from, int *first) {
    const int n = c->n;
    for (int k = 0; k <= S; k++)
        for (int j = 0; j <= n; j++) dp[k * (n + 1) + j] = SIZE_MAX;
    dp[0] = 0;
    for (int k = 1; k <= S; k++)
        for (int j = k; j <= n; j++)
            for (int i = k - 1; i < j; i++) {
                const size_t before = dp[(k - 1) * (n + 1) + i];
                if (before == SIZE_MAX || seg_scratch(c, i, j) > limit) continue;
                const size_t v = before + c->out[j - 1];
                if (v < dp[k * (n + 1) + j]) dp[k * (n + 1) + j] = v, from[k * (n + 1) + j] = i;
            }
    const size_t best = dp[S * (n + 1) + n];
    if (best == SIZE_MAX) return best;
    first[S] = n;
    for (int k = S; k > 0; k--) first[k - 1] = from[k * (n + 1) + first[k]];
    return best;
}

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

// Splits the layers into `segments` segments (NET_SEGMENTS_SQRT: round(sqrt(layers)); at
// most one segment per layer) at the cut of the fewest activation bytes: for each limit
// on the scratch, the cut with the fewest saved bytes (seg_fit); the best sum wins.
static int net_segments(Net *net, int segments, Error *err) {
    const int n = net->nlayers, last = n - 1;
    int S = segments == NET_SEGMENTS_SQRT ? (int)lround(sqrt((double)n)) : segments;
    if (S < 1) S = 1;
    if (S > n) S = n;
    net->nsegments = S;
    net->seg_first = xcalloc((size_t)S + 1, sizeof *net->seg_first, err);
    if (!net->seg_first) return -1;
    net->seg_first[S] = n;
    if (S == 1) return 0;
    const size_t es = dtype_sizes[net->precision], B = (size_t)net->batch;
    const size_t npairs = (size_t)n * (n + 1) / 2, cells = (size_t)(S + 1) * (n + 1);
    size_t *out = xcalloc((size_t)n, sizeof *out, err), *above = xcalloc((size_t)n + 1, sizeof *above, err);
    size_t *limits = xcalloc(npairs, sizeof *limits, err), *dp = xcalloc(cells, sizeof *dp, err);
    int *from = xcalloc(cells, sizeof *from, err), *cut = xcalloc((size_t)S + 1, sizeof *cut, err);
    int rc = -1;
    if (!out || !above || !limits || !dp || !from || !cut) goto done;
    for (int i = 0; i < n; i++) {
        const Layer *l = net->layers[i];
        out[i] = align64(B * (size_t)shape_numel(l->out) * (i == last ? sizeof(float) : es));
        above[i + 1] = above[i] + out[i] + align64(B * (size_t)inner_values(l) * es);
    }
    const SegCost c = {n, out, above};
    size_t m = 0;
    for (int s = 0; s < n; s++)
        for (int e = s + 1; e <= n; e++) limits[m++] = seg_scratch(&c, s, e);
    qsort(limits, m, sizeof *limits, cmp_size);
    size_t best = SIZE_MAX;
    for (size_t t = 0; t < m && limits[t] < best; t++) {
        if (t && limits[t] == limits[t - 1]) continue;
        const size_t saved = seg_fit(&c, S, limits[t], dp, from, cut);
        if (saved != SIZE_MAX && saved + limits[t] < best) {
            best = saved + limits[t];
            memcpy(net->seg_first, cut, ((size_t)S + 1) * sizeof *cut);
        }
    }
    rc = 0;
done:
    free(out), free(above), free(limits), free(dp), free(from), free(cut);
    return rc;
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

// Whether module `name` is `what` or lies inside it ("layer1" holds "layer1.0.conv1").
static bool within(const char *name, const char *what) {
    const size_t n = strlen(what);
    return n && !strncmp(name, what, n) && (!name[n] || name[n] == '.');
}

// Marks the modules that opt->freeze names (and the batchnorms among them, with
// freeze_stats), and finds the first top-level layer with a trained parameter.
static int net_freeze(Net *net, const Cfg *cfg, const NetOptions *opt, Error *err) {
    for (int f = 0; f < opt->nfreeze; f++) {
        bool found = false;
        for (int i = 0; i < net->nmodules; i++) {
            Layer *l = net->modules[i];
            if (!within(l->name, opt->freeze[f])) continue;
            found = true;
            l->frozen = true;
            l->frozen_stats = opt->freeze_stats && l->ops == &batchnorm_ops;
        }
        if (!found)
            return err_set(err, "%s: freeze names '%s', but the network has no layer of that name "
                                "(see the table of layers ./train prints)", cfg->path, opt->freeze[f]);
    }
    net->first_trained = net->nlayers;
    for (int i = net->nmodules - 1; i >= 0; i--) {
        const Layer *l = net->modules[i];
        if (l->frozen || !l->nparams) continue;
        for (int t = 0; t < net->nlayers; t++)  // the top-level layer that holds it
            if (net->layers[t] == l || within(l->name, net->layers[t]->name)) {
                if (t < net->first_trained) net->first_trained = t;
                break;
            }
    }
    return 0;
}

int net_create(Net *net, const Cfg *cfg, Shape input, int classes, const NetOptions *opt,
               const Kernels *k, Error *err) {
    memset(net, 0, sizeof *net);
    net->k = k;
    net->input = input;
    net->batch = opt->batch;
    net->precision = opt->precision;
    net->loss_scale = 1.0f;
    if (opt->batch < 1 || (opt->precision != DT_F32 && opt->precision != DT_F16)) {
        err_set(err, "net_create: batch %d and precision %s: expected batch >= 1 and F32 or F16",
                opt->batch, dtype_names[opt->precision]);
        goto fail;
    }
    if (net_build_layers(net, cfg, input, classes, err) || net_freeze(net, cfg, opt, err)) goto fail;
    net->nstates = opt->opt_states;
    net->state_names = opt->opt_state_names;
    for (int i = 0; i < net->nmodules; i++)
        for (int j = 0; j < net->modules[i]->nparams; j++) {
            const int64_t n = tensor_numel(&net->modules[i]->params[j]);
            net->nparams += n;
            if (!net->modules[i]->frozen) net->ntrain += n;
        }
    if (net_segments(net, opt->segments, err)) goto fail;
    net_layout(net, NULL);
    net_layout_buffers(net, NULL);
    if (opt->plan_only) return 0;

    net->acts = xcalloc((size_t)net->nlayers, sizeof *net->acts, err);
    if (!net->acts) goto fail;
    if (!(net->params = device_block(k, net->plan.params, "parameter", err)) ||
        !(net->grads = device_block(k, net->plan.grads, "gradient", err)) ||
        !(net->optimizer = device_block(k, net->plan.optimizer, "optimizer state", err)) ||
        !(net->buffers = device_block(k, net->plan.buffers, "buffer", err)) ||
        !(net->activations = device_block(k, net->plan.activations, "activation", err)) ||
        !(net->workspace = device_block(k, net->plan.workspace, "workspace", err)))
        goto fail;
    net_layout(net, net->activations);
    net_layout_buffers(net, net->buffers);
    for (int i = 0; i < 4 && net->scratch_bytes; i++)
        net->exec.scratch[i] = (float *)((char *)net->workspace + i * (net->scratch_bytes / 4));
    net->layer_workspace = (char *)net->workspace + net->scratch_bytes;
    int64_t off = 0, goff = 0;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].data = net->params + off;
            l->grads[j] = l->frozen ? NULL : net->grads + goff;
            off += tensor_numel(&l->params[j]);
            if (!l->frozen) goff += tensor_numel(&l->params[j]);
        }
    }
    if (net_reset_buffers(net, err)) goto fail;
    return 0;
fail:
    net_free(net);
    return -1;
}

void net_free(Net *net) {
    if (net->k) {
        void *blocks[] = {net->params,  net->grads,       net->optimizer,
                          net->buffers, net->activations, net->workspace};
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
            if (blocks[i]) net->k->release(blocks[i]);
    }
    for (int i = 0; i < net->nlayers; i++) layer_free(net->layers[i]);
    free(net->layers);
    free(net->modules);
    free(net->acts);
    free(net->seg_first);
    memset(net, 0, sizeof *net);
}

int net_reset_buffers(Net *net, Error *err) {
    int64_t most = 1;
    for (int i = 0; i < net->nmodules; i++)
        for (int j = 0; j < net->modules[i]->nbuffers; j++)
            if (tensor_numel(&net->modules[i]->buffers[j]) > most) most = tensor_numel(&net->modules[i]->buffers[j]);
    float *host = xcalloc((size_t)most, sizeof(float), err);
    if (!host) return -1;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        for (int j = 0; j < l->nbuffers; j++) {
            Tensor *t = &l->buffers[j];
            if (t->dtype != DT_F32) {
                *(int64_t *)t->data = 0;
                continue;
            }
            const int64_t n = tensor_numel(t);
            for (int64_t e = 0; e < n; e++) host[e] = l->buffer_fill[j];
            net->k->upload(t->data, host, (size_t)n * sizeof(float));
        }
    }
    free(host);
    return 0;
}

int net_init_params(Net *net, uint64_t seed, Error *err) {
    float *host = xcalloc((size_t)net->nparams ? (size_t)net->nparams : 1, sizeof(float), err);
    if (!host) return -1;
    // PyTorch's reset_parameters for Conv2d and Linear, with its arithmetic:
    // kaiming_uniform_(weight, a = sqrt(5)) draws U(-b, b) with
    // b = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in) (= 1/sqrt(fan_in) up to rounding),
    // then the bias draws U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm's ones and zeros
    // draw nothing. Module after module, from one MT19937 stream seeded as
    // torch.manual_seed(seed) seeds it.
    Mt19937 mt;
    mt19937_seed(&mt, (uint32_t)seed);
    const double a = sqrt(5.0);
    int64_t off = 0;
    for (int i = 0; i < net->nmodules; i++) {
        const Layer *l = net->modules[i];
        for (int j = 0; j < l->nparams; j++) {
            const int64_t n = tensor_numel(&l->params[j]);
            const ParamInit init = l->init[j];
            if (init == INIT_ONES || init == INIT_ZEROS) {
                for (int64_t e = 0; e < n; e++) host[off + e] = init == INIT_ONES ? 1.0f : 0.0f;
            } else {
                const double fan = (double)l->fan_in;
                const double bound = init == INIT_WEIGHT ? sqrt(3.0) * (sqrt(2.0 / (1 + a * a)) / sqrt(fan))
                                                         : 1 / sqrt(fan);
                for (int64_t e = 0; e < n; e++) host[off + e] = mt19937_uniform(&mt, (float)-bound, (float)bound);
            }
            off += n;
        }
    }
    net->k->upload(net->params, host, (size_t)net->nparams * sizeof(float));
    free(host);
    return net_reset_buffers(net, err);
}

static LayerCtx net_ctx(const Net *net, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    return (LayerCtx){.k = net->k, .exec = &net->exec, .workspace = net->layer_workspace,
                      .seed = seed, .step = step, .sample0 = sample0, .train = train};
}

// Layer i's input and output as stored: the network's input and output are F32.
static Stored net_in(const Net *net, int i) {
    if (i == 0) return (Stored){net->input_buf, true};
    return (Stored){net->acts[i - 1], net->precision == DT_F32};
}
static Stored net_out(const Net *net, int i) {
    return (Stored){net->acts[i], i == net->nlayers - 1 || net->precision == DT_F32};
}

static void forward_layer(Net *net, int i, const LayerCtx *ctx, int N) {
    if (net->on_layer) net->on_layer(i, false);
    exec_forward(ctx, net->layers[i], net_out(net, i), net_in(net, i), N);
}

void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, train, seed, step, sample0);
    for (int i = 0; i < net->nlayers; i++) forward_layer(net, i, &ctx, N);
}

void net_loss(Net *net, int N, int denominator, bool grad) {
    const Layer *out = net->layers[net->nlayers - 1];
    net->k->nll_loss(grad ? net->dlogp : NULL, net->metrics, net_output(net), net->labels, N,
                     out->out.c, net->loss_scale / (float)denominator);
}

void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, true, seed, step, sample0);
    LayerCtx redo = ctx;
    redo.recompute = true;
    Stored dout = {net->dlogp, true};  // the gradient of layer i's output
    int cur = -1;                      // its grad_buf (-1: dlogp)
    const int stop = net->first_trained;  // the layers before it have nothing to learn
    for (int g = net->nsegments - 1; g >= 0 && net->seg_first[g + 1] > stop; g--) {
        const int first = net->seg_first[g] > stop ? net->seg_first[g] : stop;
        const int end = net->seg_first[g + 1];
        // Later segments overwrote this one's outputs and inner activations in the shared
        // scratch: recompute them from its saved input, with the same dropout masks and
        // batch statistics (same step and samples). The last layer's output is saved; the
        // layer runs again only when it has inner activations, and then writes the same bits.
        if (g < net->nsegments - 1) {
            for (int i = net->seg_first[g]; i < end - 1; i++) forward_layer(net, i, &redo, N);
            if (inner_values(net->layers[end - 1])) forward_layer(net, end - 1, &redo, N);
        }
        for (int i = end - 1; i >= first; i--) {
            if (i > stop) cur = net_din_slot(net, i, cur);
            const Stored din = {i > stop ? net->grad_buf[cur] : NULL, net->precision == DT_F32};
            if (net->on_layer) net->on_layer(i, true);
            exec_backward(&ctx, net->layers[i], din, dout, net_in(net, i), net_out(net, i), N);
            dout = din;
        }
    }
}

int net_din_slot(const Net *net, int i, int cur) {
    return net->layers[i]->ops->backward_in_place && cur >= 0 ? cur : (cur == 0 ? 1 : 0);
}

void net_zero_grads(Net *net) { net->k->zero(net->grads, (size_t)net->ntrain * sizeof(float)); }

void net_print(const Net *net, FILE *f) {
    fprintf(f, "  %-3s %-14s %-12s %-16s %12s\n", "#", "name", "type", "output (CxHxW)", "params");
    char in[48];
    snprintf(in, sizeof in, "%dx%dx%d", net->input.c, net->input.h, net->input.w);
    fprintf(f, "  %-3s %-14s %-12s %-16s %12s\n", "", "input", "", in, "");
    for (int i = 0; i < net->nlayers; i++) {
        const Layer *l = net->layers[i];
        int64_t p = 0, frozen = 0;
        for (int m = 0; m < net->nmodules; m++) {  // the layer and its children
            const Layer *c = net->modules[m];
            if (c->index < l->index || c->index >= l->index + count_modules(l)) continue;
            for (int j = 0; j < c->nparams; j++) {
                p += tensor_numel(&c->params[j]);
                if (c->frozen) frozen += tensor_numel(&c->params[j]);
            }
        }
        char shape[48];
        snprintf(shape, sizeof shape, "%dx%dx%d", l->out.c, l->out.h, l->out.w);
        fprintf(f, "  %-3d %-14s %-12s %-16s %12lld%s\n", i, l->name, l->ops->type, shape, (long long)p,
                !frozen ? "" : frozen == p ? "  frozen" : "  partly frozen");
    }
    if (net->ntrain < net->nparams)
        fprintf(f, "  parameters: %lld, trained %lld, frozen %lld\n", (long long)net->nparams,
                (long long)net->ntrain, (long long)(net->nparams - net->ntrain));
    else
        fprintf(f, "  parameters: %lld\n", (long long)net->nparams);
}
