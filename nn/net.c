// net.c: building, planning, allocating and running the sequential network.
#include "net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt19937.h"

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

// fp16 runs each layer over chunks of samples through four fp32 scratch buffers; the
// chunk is as many samples as fit in this many bytes of scratch (at least one).
#define FP16_SCRATCH_BYTES ((size_t)16 << 20)

// Computes net->plan and the offsets of everything; with `act_base` non-NULL also sets
// the pointers. The same function plans and carves, so the plan is the allocation.
static void net_layout(Net *net, char *act_base) {
    const int B = net->batch, last = net->nlayers - 1;
    const size_t es = dtype_sizes[net->precision];
    size_t off = 0, largest = (size_t)shape_numel(net->input);
    if (act_base) net->input_buf = (float *)(act_base + off);
    off += align64((size_t)B * shape_numel(net->input) * sizeof(float));
    // Saved outputs: the last layer of each segment (the network's output is one, in F32).
    for (int g = 0; g < net->nsegments; g++) {
        const int i = net->seg_first[g + 1] - 1;
        if (act_base) net->acts[i] = act_base + off;
        off += align64((size_t)B * shape_numel(net->layers[i]->out) * (i == last ? sizeof(float) : es));
    }
    net->plan.act_saved = off;
    // The scratch region: the other outputs of one segment at a time, laid out in order.
    size_t scratch = 0;
    for (int g = 0; g < net->nsegments; g++) {
        size_t o = 0;
        for (int i = net->seg_first[g]; i < net->seg_first[g + 1] - 1; i++) {
            if (act_base) net->acts[i] = act_base + off + o;
            o += align64((size_t)B * shape_numel(net->layers[i]->out) * es);
        }
        if (o > scratch) scratch = o;
    }
    off += scratch;
    net->plan.act_scratch = scratch;
    if (net->nsegments == 1) {  // nothing is recomputed: every output is kept
        net->plan.act_saved += scratch;
        net->plan.act_scratch = 0;
    }
    for (int i = 0; i <= last; i++)
        if ((size_t)shape_numel(net->layers[i]->out) > largest) largest = (size_t)shape_numel(net->layers[i]->out);
    for (int i = 0; i < 2; i++) {
        if (act_base) net->grad_buf[i] = act_base + off;
        off += align64((size_t)B * largest * es);
    }
    if (act_base) net->dlogp = (float *)(act_base + off);
    off += align64((size_t)B * shape_numel(net->layers[last]->out) * sizeof(float));
    if (act_base) net->labels = (int32_t *)(act_base + off);
    off += align64((size_t)B * sizeof(int32_t));
    if (act_base) net->metrics = (float *)(act_base + off);
    off += align64(NET_METRICS * sizeof(float));
    net->plan.activations = off;

    // Layers run on the whole batch in fp32, on chunks through the scratch in fp16. The
    // workspace block holds the scratch (fp16 only) and then the layers' workspace.
    net->chunk = B;
    net->largest = largest;
    size_t ws = 0;
    if (net->precision == DT_F16) {
        const size_t per_sample = 4 * largest * sizeof(float);
        net->chunk = FP16_SCRATCH_BYTES / per_sample < (size_t)B ? (int)(FP16_SCRATCH_BYTES / per_sample) : B;
        if (net->chunk < 1) net->chunk = 1;
        ws = 4 * align64((size_t)net->chunk * largest * sizeof(float));
    }
    net->scratch_bytes = ws;
    size_t layer_ws = 0;
    for (int i = 0; i <= last; i++) {
        size_t w = net->layers[i]->ops->workspace_bytes(net->layers[i], net->chunk);
        if (w > layer_ws) layer_ws = w;
    }
    net->plan.workspace = ws + layer_ws;
    net->plan.params = (size_t)net->nparams * sizeof(float);
    net->plan.grads = net->plan.params;
    net->plan.optimizer = 2 * net->plan.params;
}

// Splits the layers into `segments` contiguous segments of as equal counts as possible
// (NET_SEGMENTS_SQRT: round(sqrt(layers)); at most one segment per layer).
static int net_segments(Net *net, int segments, Error *err) {
    const int n = net->nlayers;
    int S = segments == NET_SEGMENTS_SQRT ? (int)lround(sqrt((double)n)) : segments;
    if (S < 1) S = 1;
    if (S > n) S = n;
    net->nsegments = S;
    net->seg_first = xcalloc((size_t)S + 1, sizeof *net->seg_first, err);
    if (!net->seg_first) return -1;
    for (int g = 0; g <= S; g++) net->seg_first[g] = (int)((int64_t)g * n / S);
    return 0;
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
    if (net_build_layers(net, cfg, input, classes, err)) goto fail;
    for (int i = 0; i < net->nlayers; i++)
        for (int j = 0; j < net->layers[i]->nparams; j++)
            net->nparams += tensor_numel(&net->layers[i]->params[j]);
    if (net_segments(net, opt->segments, err)) goto fail;
    net_layout(net, NULL);
    if (opt->plan_only) return 0;

    net->acts = xcalloc((size_t)net->nlayers, sizeof *net->acts, err);
    if (!net->acts) goto fail;
    if (!(net->params = device_block(k, net->plan.params, "parameter", err)) ||
        !(net->grads = device_block(k, net->plan.grads, "gradient", err)) ||
        !(net->optimizer = device_block(k, net->plan.optimizer, "optimizer state", err)) ||
        !(net->activations = device_block(k, net->plan.activations, "activation", err)) ||
        !(net->workspace = device_block(k, net->plan.workspace, "workspace", err)))
        goto fail;
    net_layout(net, net->activations);
    for (int i = 0; i < 4 && net->scratch_bytes; i++)
        net->scratch[i] = (float *)((char *)net->workspace + i * (net->scratch_bytes / 4));
    net->layer_workspace = (char *)net->workspace + net->scratch_bytes;
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
    free(net->seg_first);
    memset(net, 0, sizeof *net);
}

int net_init_params(Net *net, uint64_t seed, Error *err) {
    float *host = xcalloc((size_t)net->nparams ? (size_t)net->nparams : 1, sizeof(float), err);
    if (!host) return -1;
    // PyTorch's reset_parameters for Conv2d and Linear, with its arithmetic:
    // kaiming_uniform_(weight, a = sqrt(5)) draws U(-b, b) with
    // b = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in) (= 1/sqrt(fan_in) up to rounding),
    // then the bias draws U(-1/sqrt(fan_in), 1/sqrt(fan_in)); layer after layer, from one
    // MT19937 stream seeded as torch.manual_seed(seed) seeds it.
    Mt19937 mt;
    mt19937_seed(&mt, (uint32_t)seed);
    const double a = sqrt(5.0);
    int64_t off = 0;
    for (int i = 0; i < net->nlayers; i++) {
        const Layer *l = net->layers[i];
        for (int j = 0; j < l->nparams; j++) {
            const double bound = j == 0 ? sqrt(3.0) * (sqrt(2.0 / (1 + a * a)) / sqrt((double)l->fan_in))
                                        : 1 / sqrt((double)l->fan_in);
            const int64_t n = tensor_numel(&l->params[j]);
            for (int64_t e = 0; e < n; e++) host[off + e] = mt19937_uniform(&mt, (float)-bound, (float)bound);
            off += n;
        }
    }
    net->k->upload(net->params, host, (size_t)net->nparams * sizeof(float));
    free(host);
    return 0;
}

static LayerCtx net_ctx(const Net *net, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    return (LayerCtx){.k = net->k, .workspace = net->layer_workspace, .seed = seed, .step = step,
                      .sample0 = sample0, .train = train};
}

// fp16: view of samples [n0, n0 + n) of an activation stored as halves, in scratch slot
// `slot` as floats. The input and the output (always F32) are used in place.
static float *fp32_view(const Net *net, int i, int n0, int n, int slot) {
    if (i < 0) return net->input_buf + (int64_t)n0 * shape_numel(net->input);
    const int64_t numel = shape_numel(net->layers[i]->out);
    if (i == net->nlayers - 1) return (float *)net->acts[i] + n0 * numel;
    net->k->f16_to_f32(net->scratch[slot], (const uint16_t *)net->acts[i] + n0 * numel, n * numel);
    return net->scratch[slot];
}

// Runs layer i forward on N samples: on the whole batch in fp32, through the scratch in
// chunks in fp16.
static void forward_layer(Net *net, int i, LayerCtx ctx, int N) {
    Layer *l = net->layers[i];
    const int last = net->nlayers - 1;
    if (net->on_layer) net->on_layer(i, false);
    if (net->precision == DT_F32) {
        l->ops->forward(l, &ctx, net->acts[i], i ? net->acts[i - 1] : net->input_buf, N);
        return;
    }
    const int64_t nout = shape_numel(l->out), sample0 = ctx.sample0;
    for (int n0 = 0; n0 < N; n0 += net->chunk) {
        const int n = N - n0 < net->chunk ? N - n0 : net->chunk;
        ctx.sample0 = sample0 + n0;
        const float *x = fp32_view(net, i - 1, n0, n, 0);
        float *y = i == last ? (float *)net->acts[i] + n0 * nout : net->scratch[1];
        l->ops->forward(l, &ctx, y, x, n);
        if (i != last) net->k->f32_to_f16((uint16_t *)net->acts[i] + n0 * nout, y, n * nout);
    }
}

// Runs layer i backward: din (NULL for the first layer) from dout.
static void backward_layer(Net *net, int i, LayerCtx ctx, int N, void *dout, void *din) {
    Layer *l = net->layers[i];
    const int last = net->nlayers - 1;
    if (net->on_layer) net->on_layer(i, true);
    if (net->precision == DT_F32) {
        l->ops->backward(l, &ctx, din, dout, i ? net->acts[i - 1] : net->input_buf, net->acts[i], N);
        return;
    }
    const int64_t nin = shape_numel(l->in), nout = shape_numel(l->out), sample0 = ctx.sample0;
    for (int n0 = 0; n0 < N; n0 += net->chunk) {
        const int n = N - n0 < net->chunk ? N - n0 : net->chunk;
        ctx.sample0 = sample0 + n0;
        const float *x = fp32_view(net, i - 1, n0, n, 0);
        const float *y = fp32_view(net, i, n0, n, 1);
        float *dy = net->scratch[2];
        if (i == last) dy = (float *)dout + n0 * nout;
        else net->k->f16_to_f32(dy, (const uint16_t *)dout + n0 * nout, n * nout);
        l->ops->backward(l, &ctx, din ? net->scratch[3] : NULL, dy, x, y, n);
        if (din) net->k->f32_to_f16((uint16_t *)din + n0 * nin, net->scratch[3], n * nin);
    }
}

void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, train, seed, step, sample0);
    for (int i = 0; i < net->nlayers; i++) forward_layer(net, i, ctx, N);
}

void net_loss(Net *net, int N, int denominator, bool grad) {
    const Layer *out = net->layers[net->nlayers - 1];
    net->k->nll_loss(grad ? net->dlogp : NULL, net->metrics, net_output(net), net->labels, N,
                     out->out.c, net->loss_scale / (float)denominator);
}

void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, true, seed, step, sample0);
    void *dout = net->dlogp;  // the gradient of layer i's output
    int next = 0;             // grad_buf[next] takes the gradient of its input
    for (int g = net->nsegments - 1; g >= 0; g--) {
        const int first = net->seg_first[g], end = net->seg_first[g + 1];
        // Later segments overwrote this one's outputs in the shared scratch: recompute them
        // from its saved input, with the same dropout masks (same step and samples).
        if (g < net->nsegments - 1)
            for (int i = first; i < end - 1; i++) forward_layer(net, i, ctx, N);
        for (int i = end - 1; i >= first; i--) {
            void *din = i > 0 ? net->grad_buf[next] : NULL;
            backward_layer(net, i, ctx, N, dout, din);
            dout = din;
            next = 1 - next;
        }
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
