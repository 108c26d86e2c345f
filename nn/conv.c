// conv.c: 2-D convolution as im2col + one GEMM over many images at once.
//
// Activations are channel-last, so the GEMM's output rows (n, oh, ow) x OC are already the
// layer's output (N, OH, OW, OC): out = col @ Wp^T. im2col's columns are (kh, kw, c), so
// that a patch is copied in runs of K * C contiguous floats; Wp is the weight permuted
// in place from PyTorch's (OC, C, K, K) to (OC, K, K, C) at a pass's first call and back at
// its last, and the weight gradient is accumulated in that order between the same calls
// (conv_permute; both orders are the same when C = 1 or K = 1, and nothing is permuted
// then).
// The batch is lowered in chunks of images so the im2col workspace stays near the kernel
// table's chunk_bytes whatever the batch: a large batch costs activations, not workspace.
// The CPU's 2 MB keeps a chunk in the caches between im2col writing it and the GEMM
// reading it: on the seed network (3 images a chunk) a step took 37 ms against 45 ms with
// 16 MB chunks, which went through memory (bench/PROFILE.md).
// Where the backend's GEMMs read the columns themselves (kernels.h conv_gemm_usable: the
// CPU's bf16 GEMM, whose packing reads the input, and the forward's weight where PyTorch's
// layout keeps it), nothing is lowered into the workspace: the forward is one product for
// the call without permutes, the weight gradient one product a chunk (the same calls as
// above, so the same bits), and a stride-1 layer's input gradient the convolution of dout
// with the weight turned half a turn, after the weight gradients (no dcol, no col2im).
// The CPU also runs on these calls, with AMX, the 3x3 stride-1 layers whose channels the
// bf16 GEMM cannot read where they lie (multiples of 16, not 32): its tiles read the input
// itself (nn/gemm_bf16.h conv_amx_*), in place of fp32 Winograd.
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "layer.h"


// How the layer computes (the `algorithm` key); auto picks per layer (conv_algorithm).
typedef enum ConvAlgorithm { CONV_AUTO, CONV_GEMM, CONV_WINOGRAD, CONV_ALGORITHMS } ConvAlgorithm;
static const char *const conv_algorithm_names[CONV_ALGORITHMS] = {"auto", "gemm", "winograd"};

typedef struct Conv {
    Layer base;
    int filters, size, stride, pad;
    bool bias;
    Activation act;
    ConvAlgorithm algorithm;  // never CONV_AUTO after conv_create
} Conv;

static const CfgKey conv_keys[] = {
    {"name", "conv<k>", "module name, as in PyTorch's state_dict (conv1, ...)"},
    {"filters", NULL, "output channels"},
    {"size", NULL, "kernel size K (K x K)"},
    {"stride", "1", "stride"},
    {"pad", "0", "zero padding on each side"},
    {"bias", "1", "1: a learned bias per filter; 0: none (before a batchnorm, as ResNets do)"},
    {"activation", "none", "none, relu or relu6 (min(max(x, 0), 6)), applied to the output"},
    {"algorithm", "auto", "auto, gemm (im2col + GEMM) or winograd (3x3 stride 1 only)"},
    {"groups", "1", "channel groups (C and filters multiples of it): output channel o reads the input "
                    "channels of group o / (filters / groups); groups = C is depthwise"},
};

// 1x1, stride 1, unpadded: the input already is its own im2col.
static bool conv_is_pointwise(const Conv *c) { return c->size == 1 && c->stride == 1 && c->pad == 0; }

static ConvGeometry conv_geometry(const Conv *c, int N) {
    const Layer *l = &c->base;
    return (ConvGeometry){N, l->in.h, l->in.w, l->in.c, c->size, c->stride, c->pad,
                          l->out.h, l->out.w, c->filters};
}

// Whether the backend's GEMMs read the im2col columns and the weight where they lie
// (kernels.h: conv_gemm_usable, for the input's channels, the forward's and the weight
// gradient's columns, and the filters, the input gradient's columns; or AMX's 3x3
// convolutions), not a pointwise layer's (its input is its columns).
static bool conv_gemm_views(const Conv *c, const Kernels *k) {
    return !conv_is_pointwise(c) && k->conv_gemm_usable && k->conv_gemm_usable(conv_geometry(c, 1));
}

// Few inputs per output (an image's first layer: conv1 of the seed network has 9): the
// direct kernels, because a GEMM over K = 9 runs far below its speed and im2col would
// write 9 floats for every output pixel, twice a step. Not a 1x1 convolution (a ResNet's
// strided downsample): its im2col is a gather of one pixel in `stride`, and the GEMM beat
// the direct kernels 4x there (bench/PROFILE.md).
static bool conv_is_direct(const Conv *c) {
    return c->size > 1 && c->base.in.c * c->size * c->size <= CONV_DIRECT_MAX_TAPS &&
           c->filters <= CONV_DIRECT_MAX_FILTERS;
}

// Winograd F(2x2, 3x3) for a 3x3 stride-1 convolution of at least WINOGRAD_MIN_CHANNELS
// input and output channels and WINOGRAD_MIN_PIXELS output pixels: 16 products over C for
// each 2 x 2 block of outputs instead of 36 (2.25x fewer FLOPs), for transforms that read
// and write 4 floats per input pixel where im2col writes 9. Measured (bench/PROFILE.md):
// fewer channels leave the products too thin to pay for the transforms; on ResNet-18's
// 7x7 layers (16 tiles an image, 30% of them padding) each chunk's products of 32 rows
// re-read 16 MB of transformed weights, 1.3-2x slower than im2col.
// Not where k's GEMMs read this layer's columns where they lie (conv_gemm_views: the CPU's
// bf16 GEMM, channels in and out multiples of 32), whose arithmetic runs at twice fp32's
// and more and whose packing replaces im2col, where Winograd's transforms are fp32 passes
// over memory. Under matmul = bf16, measured in alternation: models/resnet-small.cfg (its
// 32-channel layers by GEMM, 14 x 14) a step 77.6 -> 72.0-72.8 ms; resnet18 at 224, batch
// 32, 770-782 -> 682-708 ms; models/fashion-resnet.cfg (layer1.0.conv2) 62.4-64.4 ->
// 59.7-62.5 ms.
#define WINOGRAD_MIN_CHANNELS 16
#define WINOGRAD_MIN_PIXELS 100
static ConvAlgorithm conv_auto_algorithm(const Conv *c, const Kernels *k) {
    const Layer *l = &c->base;
    return c->size == 3 && c->stride == 1 && !conv_is_direct(c) && !(k && conv_gemm_views(c, k)) &&
                   l->in.c >= WINOGRAD_MIN_CHANNELS && c->filters >= WINOGRAD_MIN_CHANNELS &&
                   l->out.h * l->out.w >= WINOGRAD_MIN_PIXELS
               ? CONV_WINOGRAD
               : CONV_GEMM;
}

// Images per im2col chunk for a batch of N on k.
static int conv_chunk(const Conv *c, const Kernels *k, int N) {
    const Layer *l = &c->base;
    size_t per_image = (size_t)l->out.h * l->out.w * l->in.c * c->size * c->size * sizeof(float);
    size_t chunk = k->chunk_bytes / per_image;
    if (chunk < 1) chunk = 1;
    return chunk < (size_t)N ? (int)chunk : N;
}

int conv_window(const LayerArgs *a, const char *name, ConvWindow *w, Error *err) {
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    const Shape in = a->in;
    int64_t filters, size, stride, pad, bias;
    if (cfg_int(cfg, s, "filters", NULL, 1, 1 << 20, &filters, err) ||
        cfg_int(cfg, s, "size", NULL, 1, 1024, &size, err) ||
        cfg_int(cfg, s, "stride", "1", 1, 1024, &stride, err) ||
        cfg_int(cfg, s, "pad", "0", 0, 1024, &pad, err) ||
        cfg_int(cfg, s, "bias", "1", 0, 1, &bias, err) ||
        layer_activation(a, &w->act, err))
        return -1;
    w->filters = (int)filters, w->size = (int)size, w->stride = (int)stride, w->pad = (int)pad;
    w->bias = bias != 0;
    if (in.h + 2 * w->pad < w->size || in.w + 2 * w->pad < w->size)
        return err_set(err, "%s:%d: [conv] %s: kernel size %d does not fit its input %dx%d (pad %d)",
                       cfg->path, s->line, name, w->size, in.h, in.w, w->pad);
    w->out = (Shape){.c = w->filters, .h = (in.h + 2 * w->pad - w->size) / w->stride + 1,
                     .w = (in.w + 2 * w->pad - w->size) / w->stride + 1};
    return 0;
}

static int conv_create(Layer **out, const LayerArgs *a, Error *err) {
    int64_t groups;
    if (cfg_int(a->cfg, a->s, "groups", "1", 1, 1 << 20, &groups, err)) return -1;
    if (groups > 1) return conv_grouped_create(out, a, err);  // nn/conv_grouped.c
    Conv *c = layer_alloc(sizeof *c, &conv_ops, a, err);
    if (!c) return -1;
    const Cfg *cfg = a->cfg;
    const CfgSection *s = a->s;
    const Shape in = a->in;
    ConvWindow w;
    if (conv_window(a, c->base.name, &w, err)) goto fail;
    c->filters = w.filters, c->size = w.size, c->stride = w.stride, c->pad = w.pad;
    c->bias = w.bias, c->act = w.act;
    int algorithm;
    if (cfg_choice(cfg, s, "algorithm", "auto", conv_algorithm_names, CONV_ALGORITHMS, &algorithm, err))
        goto fail;
    c->algorithm = (ConvAlgorithm)algorithm;
    if (c->algorithm == CONV_WINOGRAD && (c->size != 3 || c->stride != 1)) {
        err_set(err, "%s:%d: [conv] %s: algorithm = winograd needs size = 3 and stride = 1 (it has %d and %d)",
                cfg->path, s->line, c->base.name, c->size, c->stride);
        goto fail;
    }
    c->base.out = w.out;
    if (c->algorithm == CONV_AUTO) c->algorithm = conv_auto_algorithm(c, a->k);
    layer_param(&c->base, 0, "weight", 4, (int64_t[]){c->filters, in.c, c->size, c->size}, INIT_WEIGHT);
    if (c->bias) layer_param(&c->base, 1, "bias", 1, (int64_t[]){c->filters}, INIT_BIAS);
    c->base.fan_in = (int64_t)in.c * c->size * c->size;
    *out = &c->base;
    return 0;
fail:
    free(c);
    return -1;
}

// The bias and its gradient, or NULL without one.
static float *conv_bias(const Conv *c) { return c->bias ? c->base.params[1].data : NULL; }
static float *conv_dbias(const Conv *c) { return c->bias ? c->base.grads[1] : NULL; }  // NULL when frozen

// Whether PyTorch's weight order (c, kh, kw) differs from im2col's (kh, kw, c).
static bool conv_permutes(const Conv *c) { return c->base.in.c > 1 && c->size > 1; }

// ---- Winograd: workspace [U][each shard's dU and dbias][each shard's V and M chunk] -------
//
// Each shard (Kernels.shards: one per compute thread on the CPU) takes its own images
// through the input transform, the 16 products and the output transform, chunk by chunk,
// its V and M within half the table's chunk_bytes when there are several (the CPU's 1 MB:
// a core's L2; 1 MB ran as fast as 2 MB on deep.cfg, 256 KB 15% slower), or within
// chunk_bytes when one shard does it all. Backward, each of several shards sums its dU and
// dbias apart over the pass's calls (LayerCtx.after_first, before_last), and on the last
// they are added in shard order, into shard 0's (then dW) and onto dbias; one shard sums
// into its own dU and dbias directly. No dU besides the shards' (resnet18's layer3: 4 MB).
// The sums lie before the chunks: a pass's calls may take different numbers of images (the
// executor's last chunk is short), and a call of fewer images cuts smaller chunks, so
// what lies after the chunks would move between the calls that sum into it.

// Floats of the transformed weight U (16 x OC x C), and of dU, rounded up to 64 bytes.
static size_t winograd_weight_floats(const Conv *c) {
    return ((size_t)16 * c->filters * c->base.in.c + 15) / 16 * 16;
}

// Bytes of a chunk of n images: its transformed input V and output M.
static size_t winograd_chunk_bytes(const Conv *c, int n) {
    const int64_t T = winograd_tiles(conv_geometry(c, n));
    return (size_t)16 * (winograd_stride(T, c->base.in.c) + winograd_stride(T, c->filters)) * sizeof(float);
}

typedef struct WinogradSpace {
    float *U;
    float *chunks;       // shard s's V at chunks + s * chunk_floats, its M after it (dV, dM)
    float *parts;        // shard s's dU at parts + s * part_floats, its dbias after it (one
                         // shard: the dU alone, dbias being the layer's)
    int shards, chunk;   // images a chunk, at most
    size_t chunk_floats, part_floats;
} WinogradSpace;

// The workspace's layout for N images on k (workspace NULL: the sizes alone). Images per
// chunk: as many of a shard's as fit the shard's bytes.
static WinogradSpace winograd_space(const Conv *c, const Kernels *k, void *workspace, int N) {
    WinogradSpace w = {.shards = k->shard_count()};
    const size_t budget = w.shards > 1 ? k->chunk_bytes / 2 : k->chunk_bytes;
    const int share = (N + w.shards - 1) / w.shards;
    w.chunk = 1;
    while (w.chunk < share && winograd_chunk_bytes(c, w.chunk + 1) <= budget) w.chunk++;
    w.chunk_floats = winograd_chunk_bytes(c, w.chunk) / sizeof(float);
    w.part_floats = w.shards > 1 ? ((size_t)16 * c->filters * c->base.in.c + c->filters + 15) / 16 * 16
                                 : winograd_weight_floats(c);
    if (!workspace) return w;
    w.U = workspace;
    w.parts = w.U + winograd_weight_floats(c);
    w.chunks = w.parts + w.shards * w.part_floats;
    return w;
}

static size_t winograd_workspace_bytes(const Conv *c, const Kernels *k, int N) {
    const WinogradSpace w = winograd_space(c, k, NULL, N);
    return (winograd_weight_floats(c) + w.shards * (w.chunk_floats + w.part_floats)) * sizeof(float);
}

// What a pass gives its shards.
typedef struct WinogradPass {
    const Conv *c;
    const Kernels *k;
    WinogradSpace w;
    float *out, *din, *dout;
    const float *in, *y;  // y: the layer's output, read by backward (NULL when not needed)
    bool dw;              // backward: sum dU
    bool first;           // backward: the pass's first call (the sums start from zero)
} WinogradPass;

// Shard s's V and M for chunks of `chunk` images.
static float *winograd_v(const WinogradPass *p, int s) { return p->w.chunks + s * p->w.chunk_floats; }
static float *winograd_m(const WinogradPass *p, int s) {
    const int64_t T = winograd_tiles(conv_geometry(p->c, p->w.chunk));
    return winograd_v(p, s) + 16 * winograd_stride(T, p->c->base.in.c);
}

static void winograd_forward_shard(void *arg, int s, int64_t lo, int64_t hi) {
    const WinogradPass *p = arg;
    const Layer *l = &p->c->base;
    const Kernels *k = p->k;
    const int C = l->in.c, OC = p->c->filters;
    float *V = winograd_v(p, s), *M = winograd_m(p, s);
    for (int64_t n0 = lo; n0 < hi; n0 += p->w.chunk) {
        const ConvGeometry g = conv_geometry(p->c, (int)(hi - n0 < p->w.chunk ? hi - n0 : p->w.chunk));
        const int T = (int)winograd_tiles(g);
        float *out = p->out + n0 * shape_numel(l->out);
        k->winograd_input(V, p->in + n0 * shape_numel(l->in), g);
        k->gemm_batched(M, V, p->w.U, 16, T, OC, C, false, true, 1.0f, 0.0f, winograd_stride(T, OC),
                        winograd_stride(T, C), (int64_t)OC * C);
        k->winograd_output(out, M, g);
        k->bias_act_forward(out, conv_bias(p->c), (int64_t)g.N * l->out.h * l->out.w, OC, p->c->act);
    }
}

static void winograd_forward(const Conv *c, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Layer *l = &c->base;
    WinogradPass p = {.c = c, .k = ctx->k, .w = winograd_space(c, ctx->k, ctx->workspace, N), .out = out, .in = in};
    if (!ctx->after_first) ctx->k->winograd_weights(p.w.U, l->params[0].data, c->filters, l->in.c);
    ctx->k->shards(N, winograd_forward_shard, &p);
}

// dM from dout (times act'), then dU += M^T V and dbias (this shard's sums over the pass
// when there are several, else the pass's), then dV = dM U in V's place and din from it.
static void winograd_backward_shard(void *arg, int s, int64_t lo, int64_t hi) {
    const WinogradPass *p = arg;
    const Layer *l = &p->c->base;
    const Kernels *k = p->k;
    const int C = l->in.c, OC = p->c->filters;
    const int64_t su = (int64_t)OC * C;
    float *V = winograd_v(p, s), *M = winograd_m(p, s), *dU = p->w.parts + s * p->w.part_floats,
          *dbias = conv_dbias(p->c);
    if (p->w.shards > 1) dbias = dbias ? dU + 16 * su : NULL;
    if (p->first && (p->dw || dbias != conv_dbias(p->c))) k->zero(dU, p->w.part_floats * sizeof(float));
    for (int64_t n0 = lo; n0 < hi; n0 += p->w.chunk) {
        const ConvGeometry g = conv_geometry(p->c, (int)(hi - n0 < p->w.chunk ? hi - n0 : p->w.chunk));
        const int T = (int)winograd_tiles(g);
        const int64_t sv = winograd_stride(T, C), sm = winograd_stride(T, OC), at = n0 * shape_numel(l->out);
        k->bias_act_backward(dbias, p->dout + at, p->y ? p->y + at : NULL, (int64_t)g.N * l->out.h * l->out.w, OC,
                             p->c->act);
        k->winograd_output_backward(M, p->dout + at, g);
        if (p->dw) {
            k->winograd_input(V, p->in + n0 * shape_numel(l->in), g);
            k->gemm_batched(dU, M, V, 16, OC, C, T, true, false, 1.0f, 1.0f, su, sm, sv);
        }
        if (!p->din) continue;
        k->gemm_batched(V, M, p->w.U, 16, T, C, OC, false, false, 1.0f, 0.0f, sv, sm, su);
        k->winograd_input_backward(p->din + n0 * shape_numel(l->in), V, g);
    }
}

// The shards' dU sum a pass's calls (zeroed on its first); on its last they are added up
// (into shard 0's) and onto dW.
static void winograd_backward(const Conv *c, const LayerCtx *ctx, float *din, float *dout,
                              const float *in, const float *out, int N) {
    const Layer *l = &c->base;
    const Kernels *k = ctx->k;
    float *dw = l->grads[0];
    const int C = l->in.c, OC = c->filters;
    WinogradPass p = {.c = c, .k = k, .w = winograd_space(c, k, ctx->workspace, N), .din = din, .dout = dout,
                      .in = in, .y = out, .dw = dw != NULL, .first = !ctx->after_first};
    if (din && !ctx->after_first) k->winograd_weights(p.w.U, l->params[0].data, OC, C);
    k->shards(N, winograd_backward_shard, &p);
    if (ctx->before_last) return;
    if (p.w.shards > 1) {  // each part: the shard's dU (16 x OC x C), then its dbias (OC)
        const int64_t du = (int64_t)16 * OC * C, stride = (int64_t)p.w.part_floats;
        if (dw) k->add_parts(p.w.parts, p.w.parts + stride, p.w.shards - 1, du, stride);
        if (conv_dbias(c)) {  // dbias += the parts' sum, in shard order
            k->add_parts(p.w.parts + du, p.w.parts + stride + du, p.w.shards - 1, OC, stride);
            k->add_parts(conv_dbias(c), p.w.parts + du, 1, OC, stride);
        }
    }
    if (dw) k->winograd_weights_backward(dw, p.w.parts, OC, C);
}

// ---- im2col + GEMM, and the direct kernels -------------------------------------------------

// Workspace: the im2col chunk; the direct kernels' partial sums instead.
static size_t conv_workspace_bytes(const Layer *l, const Kernels *k, int N) {
    const Conv *c = (const Conv *)l;
    if (c->algorithm == CONV_WINOGRAD) return winograd_workspace_bytes(c, k, N);
    if (conv_is_pointwise(c)) return 0;
    if (conv_is_direct(c)) return (size_t)conv_direct_partial_floats(conv_geometry(c, N)) * sizeof(float);
    return (size_t)conv_chunk(c, k, N) * l->out.h * l->out.w * l->in.c * c->size * c->size * sizeof(float);
}

// W or dW (OC, C, K*K) -> (OC, K*K, C) in place (to_khkwc), or back: an NCHW <-> NHWC
// permute of each output channel's row (N = OC, H = 1), a block of rows at a time through
// `scratch` (the im2col chunk of a call of N images: as many rows as its pixels, so that
// the copies and permutes are few and large: fashion-resnet's layer3.0 took 16 blocks of
// 16 rows, each a copy too small for two threads). The GEMMs read the weight and sum its
// gradient in im2col's order between a pass's first call and its last; in between nothing
// else reads them (a pass's calls follow each other, and in a sweep the other members have
// their own parameters). The bits come back as they were: no copy of either exists
// (resnet18's layer4: 2 x 9.4 MB).
static void conv_permute(const Conv *c, const Kernels *k, float *x, float *scratch, int N, bool to_khkwc) {
    const int C = c->base.in.c, KK = c->size * c->size;
    const int64_t row = (int64_t)C * KK, block = (int64_t)conv_chunk(c, k, N) * c->base.out.h * c->base.out.w;
    for (int64_t r0 = 0; r0 < c->filters; r0 += block) {
        const int n = (int)(c->filters - r0 < block ? c->filters - r0 : block);
        k->copy(scratch, x + r0 * row, (size_t)n * (size_t)row * sizeof(float));
        if (to_khkwc) k->nchw_to_nhwc(x + r0 * row, scratch, n, 1, KK, C);
        else k->nhwc_to_nchw(x + r0 * row, scratch, n, 1, KK, C);
    }
}

static void conv_forward(Layer *l, const LayerCtx *ctx, float *out, const float *in, int N) {
    const Conv *c = (const Conv *)l;
    const Kernels *k = ctx->k;
    if (c->algorithm == CONV_WINOGRAD) {
        winograd_forward(c, ctx, out, in, N);
        return;
    }
    if (conv_is_direct(c)) {
        k->conv_direct_forward(out, in, l->params[0].data, conv_bias(c), conv_geometry(c, N),
                               c->act);
        return;
    }
    const int ckk = l->in.c * c->size * c->size, pixels = l->out.h * l->out.w;
    float *cols = ctx->workspace;
    // PyTorch's (OC, C, K, K); below, (OC, K*K*C) from a pass's first call to its last.
    float *w = l->params[0].data;
    if (conv_gemm_views(c, k)) {  // one product for the call: no workspace, no permutes
        k->conv_gemm_forward(out, in, w, conv_geometry(c, N));
        k->bias_act_forward(out, conv_bias(c), (int64_t)N * pixels, c->filters, c->act);
        return;
    }
    const bool permutes = conv_permutes(c);
    if (permutes && !ctx->after_first) conv_permute(c, k, w, cols, N, true);
    const int chunk = conv_chunk(c, k, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = N - n0 < chunk ? N - n0 : chunk;
        const float *x = in + (int64_t)n0 * shape_numel(l->in);
        const float *col = x;  // (n*OH*OW, K*K*C)
        if (!conv_is_pointwise(c)) {
            k->im2col(cols, x, n, l->in.h, l->in.w, l->in.c, c->size, c->stride, c->pad,
                      l->out.h, l->out.w);
            col = cols;
        }
        k->gemm(out + (int64_t)n0 * shape_numel(l->out), col, w, n * pixels, c->filters, ckk,
                false, true, 1.0f, 0.0f);
    }
    if (permutes && !ctx->before_last) conv_permute(c, k, w, cols, N, false);
    k->bias_act_forward(out, conv_bias(c), (int64_t)N * pixels, c->filters, c->act);
}

// A frozen layer (grads NULL) computes din only.
static void conv_backward(Layer *l, const LayerCtx *ctx, float *din, float *dout,
                          const float *in, const float *out, int N) {
    const Conv *c = (const Conv *)l;
    const Kernels *k = ctx->k;
    if (c->algorithm == CONV_WINOGRAD) {
        winograd_backward(c, ctx, din, dout, in, out, N);
        return;
    }
    if (conv_is_direct(c)) {
        k->conv_direct_backward(din, l->grads[0], conv_dbias(c), ctx->workspace, dout, in, out,
                                l->params[0].data, conv_geometry(c, N), c->act);
        return;
    }
    const int ckk = l->in.c * c->size * c->size, pixels = l->out.h * l->out.w;
    float *cols = ctx->workspace;
    // Where the GEMMs read the columns and the weight themselves (views), din of a stride-1
    // layer is a convolution of dout after the pass's weight gradients (din may lie over
    // in, which they read), with the weight as it is; else dcol = dy @ W and col2im, chunk
    // by chunk, with the weight in im2col's order, as the weight gradient is from a pass's
    // first call to its last.
    float *w = l->params[0].data, *dw = l->grads[0];
    const bool permutes = conv_permutes(c), views = conv_gemm_views(c, k);
    const bool din_views = din && views && c->stride == 1, w_permutes = permutes && din && !din_views;
    if (permutes && !ctx->after_first) {  // zeros (LayerCtx.grads_zero) are their own permute
        if (w_permutes) conv_permute(c, k, w, cols, N, true);
        if (dw && !ctx->grads_zero) conv_permute(c, k, dw, cols, N, true);
    }
    k->bias_act_backward(conv_dbias(c), dout, out, (int64_t)N * pixels, c->filters, c->act);
    const int chunk = conv_chunk(c, k, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = N - n0 < chunk ? N - n0 : chunk;
        const float *x = in + (int64_t)n0 * shape_numel(l->in);
        const float *dy = dout + (int64_t)n0 * shape_numel(l->out);  // (n*OH*OW, OC)
        float *dx = din && !din_views ? din + (int64_t)n0 * shape_numel(l->in) : NULL;
        if (conv_is_pointwise(c)) {
            if (dw) k->gemm(dw, dy, x, c->filters, ckk, n * pixels, true, false, 1.0f, 1.0f);
            if (dx) k->gemm(dx, dy, w, n * pixels, ckk, c->filters, false, false, 1.0f, 0.0f);
            continue;
        }
        // dW += dy^T @ col; then the same workspace takes dcol = dy @ W for col2im.
        if (dw && views) {
            k->conv_gemm_weight_grad(dw, dy, x, conv_geometry(c, n));
        } else if (dw) {
            k->im2col(cols, x, n, l->in.h, l->in.w, l->in.c, c->size, c->stride, c->pad, l->out.h,
                      l->out.w);
            k->gemm(dw, dy, cols, c->filters, ckk, n * pixels, true, false, 1.0f, 1.0f);
        }
        if (!dx) continue;
        k->gemm(cols, dy, w, n * pixels, ckk, c->filters, false, false, 1.0f, 0.0f);
        k->col2im(dx, cols, n, l->in.h, l->in.w, l->in.c, c->size, c->stride, c->pad, l->out.h,
                  l->out.w);
    }
    if (din_views) k->conv_gemm_data_grad(din, dout, w, conv_geometry(c, N));
    // (OC, K*K*C) back to PyTorch's (OC, C, K*K).
    if (permutes && !ctx->before_last) {
        if (w_permutes) conv_permute(c, k, w, cols, N, false);
        if (dw) conv_permute(c, k, dw, cols, N, false);
    }
}

// The GEMM path runs a pass in chunks of conv_chunk images, each its own GEMMs, the weight
// gradient accumulated chunk after chunk: sub-batches of whole chunks give the same calls.
// Not with a trained bias (bias_act_backward sums the pass's rows at once), nor for
// Winograd (shards of the pass) or the direct kernels (fixed blocks of the pass's pixels).
static int conv_sample_quantum(const Layer *l, const Kernels *k) {
    const Conv *c = (const Conv *)l;
    if (c->algorithm == CONV_WINOGRAD || conv_is_direct(c) || (c->bias && !l->frozen)) return 0;
    return conv_chunk(c, k, INT_MAX);
}

static unsigned conv_backward_reads(const Layer *l) {
    return layer_reads_with_act(((const Conv *)l)->act);
}

// The im2col + GEMM path reads a chunk's images (im2col for dW) before col2im writes their
// din, a Winograd shard a chunk's (the input transform) before its input gradient; the
// direct kernels go over the whole call, din first.
static bool conv_din_over_in(const Layer *l) { return !conv_is_direct((const Conv *)l); }

// The activation's derivative scales dout in place (bias_act_backward).
static bool conv_backward_writes_dout(const Layer *l) { return ((const Conv *)l)->act != ACT_NONE; }

const LayerOps conv_ops = {
    .type = "conv",
    .summary = "2-D convolution (PyTorch Conv2d), optionally followed by an activation",
    .keys = conv_keys,
    .nkeys = sizeof conv_keys / sizeof conv_keys[0],
    .create = conv_create,
    .workspace_bytes = conv_workspace_bytes,
    .forward = conv_forward,
    .backward = conv_backward,
    .backward_reads = conv_backward_reads,
    .backward_writes_dout = conv_backward_writes_dout,
    .din_over_in = conv_din_over_in,
    .sample_quantum = conv_sample_quantum,
};
