// conv_grouped.c: grouped and depthwise convolution, PyTorch's Conv2d(groups = G > 1).
//
// A [conv] section with `groups` above 1 is made here (conv_create hands it over): C and
// filters are multiples of G, the weight is (filters, C / G, K, K), and output channel oc
// reads the C / G input channels of group oc / (filters / G). Depthwise is groups = C
// (MobileNetV2's 3x3 convolutions, filters = C). The names are conv's ("features.2.conv.1.0.weight").
//
// The kernels are direct and channel-last (Kernels.conv_grouped_*): a depthwise 3x3 does 9
// products for each value it reads, so it is bound by memory, and im2col + a GEMM per
// group would only add traffic. Each compute thread takes its share of the images through
// forward, and through the weight gradient then the input gradient in backward (DESIGN.md
// decision 16); with several shares each sums its own weight gradient over the pass, and
// the last call of the pass adds them in share order: the bits depend on the thread count
// alone.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct ConvGrouped {
    Layer base;
    int filters, size, stride, pad, groups;
    bool bias;
    Activation act;
} ConvGrouped;

static const LayerOps conv_grouped_ops;

static ConvGeometry cg_geometry(const ConvGrouped *c, int N) {
    const Layer *l = &c->base;
    return (ConvGeometry){N, l->in.h, l->in.w, l->in.c, c->size, c->stride, c->pad, l->out.h, l->out.w,
                          c->filters};
}

// Floats of the weight gradient, rounded up to 64 bytes: one share's part.
static int64_t cg_part_floats(const ConvGrouped *c) {
    return (tensor_numel(&c->base.params[0]) + 15) / 16 * 16;
}

int conv_grouped_create(Layer **out, const LayerArgs *a, Error *err) {
    // The section's keys are conv's: layer_alloc checks them against conv's table.
    ConvGrouped *c = layer_alloc(sizeof *c, &conv_ops, a, err);
    if (!c) return -1;
    c->base.ops = &conv_grouped_ops;
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    const Shape in = a->in;
    ConvWindow w;
    int64_t groups;
    if (conv_window(a, c->base.name, &w, err) || cfg_int(cfg, s, "groups", "1", 1, 1 << 20, &groups, err))
        goto fail;
    c->filters = w.filters, c->size = w.size, c->stride = w.stride, c->pad = w.pad;
    c->groups = (int)groups, c->bias = w.bias, c->act = w.act;
    const CfgEntry *alg = cfg_entry(s, "algorithm");
    if (alg && strcmp(alg->value, "auto") != 0) {
        err_set(err, "%s:%d: [conv] %s: algorithm = %s is for groups = 1; a grouped convolution (groups = %d) "
                "has its own kernels: leave algorithm out", cfg->path, alg->line ? alg->line : s->line,
                c->base.name, alg->value, c->groups);
        goto fail;
    }
    if (in.c % c->groups || c->filters % c->groups) {
        err_set(err, "%s:%d: [conv] %s: groups = %d must divide the input channels (%d) and filters (%d)",
                cfg->path, s->line, c->base.name, c->groups, in.c, c->filters);
        goto fail;
    }
    c->base.out = w.out;
    const int cg = in.c / c->groups;
    layer_param(&c->base, 0, "weight", 4, (int64_t[]){c->filters, cg, c->size, c->size}, INIT_WEIGHT);
    if (c->bias) layer_param(&c->base, 1, "bias", 1, (int64_t[]){c->filters}, INIT_BIAS);
    c->base.fan_in = (int64_t)cg * c->size * c->size;  // PyTorch's: the weight's dims 1..3
    *out = &c->base;
    return 0;
fail:
    free(c);
    return -1;
}

static float *cg_bias(const ConvGrouped *c) { return c->bias ? c->base.params[1].data : NULL; }
static float *cg_dbias(const ConvGrouped *c) { return c->bias ? c->base.grads[1] : NULL; }  // NULL when frozen

// Workspace: with several shares, each one's weight gradient (kept from a pass's first call
// to its last, so first: where it lies does not depend on the call's images), then each
// share's scratch for the backend's weight-gradient kernel (none on the CPU).
typedef struct CgSpace {
    float *scratch, *parts;
    int shards;
    int64_t scratch_floats, part_floats;
} CgSpace;

static int cg_chunk(const ConvGrouped *c, const Kernels *k);

// The workspace's layout for calls of at most N images on k (workspace NULL: the sizes
// alone). A share's kernels see a chunk of its images at a time.
static CgSpace cg_space(const ConvGrouped *c, const Kernels *k, void *workspace, int N) {
    CgSpace w = {.shards = k->shard_count()};
    const int share = (N + w.shards - 1) / w.shards, chunk = cg_chunk(c, k);
    w.scratch_floats =
        (k->conv_grouped_scratch_floats(cg_geometry(c, share < chunk ? share : chunk), c->groups) + 15) / 16 * 16;
    w.part_floats = w.shards > 1 ? cg_part_floats(c) : 0;
    w.parts = workspace;
    w.scratch = workspace ? w.parts + w.shards * w.part_floats : NULL;
    return w;
}

static size_t cg_workspace_bytes(const Layer *l, const Kernels *k, int N) {
    const CgSpace w = cg_space((const ConvGrouped *)l, k, NULL, N);
    return (size_t)w.shards * (size_t)(w.scratch_floats + w.part_floats) * sizeof(float);
}

typedef struct CgPass {
    const ConvGrouped *c;
    const Kernels *k;
    CgSpace w;
    float *out, *din, *dy;
    const float *in;
    bool first;  // backward: the pass's first call (the shares' sums start from zero)
    int chunk;   // backward: images a chunk (cg_chunk)
} CgPass;

static void cg_forward_shard(void *arg, int s, int64_t lo, int64_t hi) {
    const CgPass *p = arg;
    const Layer *l = &p->c->base;
    if (hi == lo) return;  // fewer images than shares
    p->k->conv_grouped_forward(p->out + lo * shape_numel(l->out), p->in + lo * shape_numel(l->in),
                               l->params[0].data, cg_bias(p->c), cg_geometry(p->c, (int)(hi - lo)),
                               p->c->groups, p->c->act);
}

static void cg_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const ConvGrouped *c = (const ConvGrouped *)l;
    CgPass p = {.c = c, .k = ctx->k, .out = out, .in = in};
    ctx->k->shards(N, cg_forward_shard, &p);
}

// A share's images a chunk at a time: their weight gradient (into the share's part, or the
// layer's with one share), then their input gradient (each chunk's input is read before
// its din is written).
static void cg_backward_shard(void *arg, int s, int64_t lo, int64_t hi) {
    const CgPass *p = arg;
    const Layer *l = &p->c->base;
    const Kernels *k = p->k;
    float *dw = l->grads[0];
    if (dw && p->w.shards > 1) {
        dw = p->w.parts + s * p->w.part_floats;
        if (p->first) k->zero(dw, (size_t)p->w.part_floats * sizeof(float));
    }
    for (int64_t n0 = lo; n0 < hi; n0 += p->chunk) {
        const int n = (int)(hi - n0 < p->chunk ? hi - n0 : p->chunk);
        const ConvGeometry g = cg_geometry(p->c, n);
        const float *dy = p->dy + n0 * shape_numel(l->out);
        if (dw)
            k->conv_grouped_backward_weight(dw, p->w.scratch + s * p->w.scratch_floats, dy,
                                            p->in + n0 * shape_numel(l->in), g, p->c->groups);
        if (p->din)
            k->conv_grouped_backward_data(p->din + n0 * shape_numel(l->in), dy, l->params[0].data, g, p->c->groups);
    }
}

// Images a chunk of backward: as many as the table's chunk_bytes hold of their output
// gradient and input (at least one), so that the input gradient reads the output gradient
// from the caches where the weight gradient left it.
static int cg_chunk(const ConvGrouped *c, const Kernels *k) {
    const size_t per_image = (size_t)(shape_numel(c->base.out) + shape_numel(c->base.in)) * sizeof(float);
    const size_t n = k->chunk_bytes / per_image;
    return n < 1 ? 1 : n > INT_MAX ? INT_MAX : (int)n;
}

// dout becomes dy = dout * act'(out) in place (the bias's gradient summed with it), then
// the shares; on a pass's last call their weight gradients are added in share order.
static void cg_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout, const float *in,
                        const float *out, int N) {
    const ConvGrouped *c = (const ConvGrouped *)l;
    const Kernels *k = ctx->k;
    k->bias_act_backward(cg_dbias(c), dout, out, (int64_t)N * l->out.h * l->out.w, c->filters, c->act);
    CgPass p = {.c = c, .k = k, .w = cg_space(c, k, ctx->workspace, N), .din = din, .dy = dout, .in = in,
                .first = !ctx->after_first, .chunk = cg_chunk(c, k)};
    k->shards(N, cg_backward_shard, &p);
    if (l->grads[0] && p.w.shards > 1 && !ctx->before_last)
        k->add_parts(l->grads[0], p.w.parts, p.w.shards, tensor_numel(&l->params[0]), p.w.part_floats);
}

static unsigned cg_backward_reads(const Layer *l) {
    return layer_reads_with_act(((const ConvGrouped *)l)->act);
}

// A share reads its images' input (the weight gradient) before it writes their din.
static bool cg_din_over_in(const Layer *l) { return true; }

static bool cg_backward_writes_dout(const Layer *l) { return ((const ConvGrouped *)l)->act != ACT_NONE; }

static const LayerOps conv_grouped_ops = {
    .type = "conv",
    .summary = "grouped or depthwise 2-D convolution (a [conv] with groups > 1)",
    .create = conv_grouped_create,
    .workspace_bytes = cg_workspace_bytes,
    .forward = cg_forward,
    .backward = cg_backward,
    .backward_reads = cg_backward_reads,
    .backward_writes_dout = cg_backward_writes_dout,
    .din_over_in = cg_din_over_in,
};
