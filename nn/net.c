// net.c: building, planning, allocating and running the sequential network.
#include "net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mt19937.h"

size_t mem_plan_blocks(const MemPlan *p) {
    return p->params + p->grads + p->optimizer + p->buffers + p->activations + p->workspace;
}

size_t mem_plan_total(const MemPlan *p) { return mem_plan_blocks(p) + p->threads + p->loader; }

size_t mem_plan_on(const MemPlan *p, const Kernels *k) {
    return k->host_memory ? mem_plan_total(p) : mem_plan_blocks(p);
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

// Bytes per sample that layer l keeps besides its output (LayerOps.inner_bytes).
static size_t inner_bytes(const Layer *l, DType precision) {
    return l->ops->inner_bytes ? l->ops->inner_bytes(l, precision) : 0;
}

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

// ---- the activation block: buffers planned by lifetime ------------------------------------
//
// The step is a fixed schedule (net->events): every layer's forward, the loss, then
// backward, segment by segment from the last: the recomputation of the segment's layers
// (checkpointing), then the backward of each. Each buffer of the activation block (the
// input, every layer's output, the inner activations of containers, their scratch,
// every input gradient, the loss's) is live over the spans of events from a write that
// fills it to the last event that reads what that write left; between spans its bytes
// serve other buffers. Offsets are assigned greedily, largest buffer first, at the lowest
// offset that no buffer live at the same time occupies (the greedy-by-size placement of
// TFLite's memory planner). The block is as large as the highest end.

// Buffer ids: four fixed ones, then per layer its output, its inner activations, the input
// gradient that its backward writes (in-place layers share their successor's) and a
// container's scratch (its own, so that a small block's backward does not hold the
// scratch a large block needs).
enum { BUF_INPUT, BUF_LABELS, BUF_METRICS, BUF_DLOGP, BUF_LAYERS, BUFS_A_LAYER = 4 };
static int buf_out(int i) { return BUF_LAYERS + BUFS_A_LAYER * i; }
static int buf_inner(int i) { return buf_out(i) + 1; }
static int buf_grad(int i) { return buf_out(i) + 2; }
static int buf_scratch(int i) { return buf_out(i) + 3; }

// Which buffer holds the input gradient of each layer that writes one (-1: none).
static void grad_buffers(const Net *net, int *gid) {
    const int last = net->nlayers - 1;
    for (int i = 0; i <= last; i++) gid[i] = -1;
    for (int i = last; i > net->first_trained; i--)
        gid[i] = net->layers[i]->ops->backward_in_place && i < last ? gid[i + 1] : buf_grad(i);
}

// Builds net->events from the segments and the first trained layer. A layer's backward is
// the last event of the step that runs it (a segment is recomputed before its backward,
// and later events are earlier layers'): what the fused update relies on (GradHook).
static int net_schedule(Net *net, Error *err) {
    const int n = net->nlayers, S = net->nsegments, stop = net->first_trained;
    free(net->events);
    net->events = xcalloc(3 * (size_t)n + 1, sizeof *net->events, err);
    if (!net->events) return -1;
    int e = 0;
    for (int i = 0; i < n; i++) net->events[e++] = (Event){EV_FORWARD, i};
    net->events[e++] = (Event){EV_LOSS, n - 1};
    for (int g = S - 1; g >= 0 && net->seg_first[g + 1] > stop; g--) {
        const int first = net->seg_first[g] > stop ? net->seg_first[g] : stop;
        const int end = net->seg_first[g + 1];
        // Later segments reused this one's buffers: recompute them from its saved input.
        // The last output is saved; that layer runs again only for its inner activations.
        if (g < S - 1) {
            for (int i = net->seg_first[g]; i < end - 1; i++) net->events[e++] = (Event){EV_RECOMPUTE, i};
            if (inner_bytes(net->layers[end - 1], net->precision)) net->events[e++] = (Event){EV_RECOMPUTE, end - 1};
        }
        for (int i = end - 1; i >= first; i--) net->events[e++] = (Event){EV_BACKWARD, i};
    }
    net->nevents = e;
    return 0;
}

// Spans being built: per buffer the open one (from < 0: none), and the closed ones.
typedef struct SpanBuilder {
    ActSpan *open;
    int *owner;  // (cap) the buffer of each closed span
    ActSpan *closed;
    int n, cap;
    bool failed;
} SpanBuilder;

static void span_close(SpanBuilder *sb, int b) {
    if (sb->open[b].from < 0) return;
    if (sb->n == sb->cap) {
        const int cap = sb->cap ? 2 * sb->cap : 64;
        ActSpan *c = realloc(sb->closed, (size_t)cap * sizeof *c);
        int *o = realloc(sb->owner, (size_t)cap * sizeof *o);
        if (c) sb->closed = c;
        if (o) sb->owner = o;
        if (!c || !o) {
            sb->failed = true;
            return;
        }
        sb->cap = cap;
    }
    sb->closed[sb->n] = sb->open[b];
    sb->owner[sb->n++] = b;
    sb->open[b].from = -1;
}

// Event t fills buffer b (what it held before is not needed).
static void span_write(SpanBuilder *sb, int b, int t) {
    span_close(sb, b);
    sb->open[b] = (ActSpan){t, t};
}

// Event t reads (or updates) buffer b, which an earlier event wrote.
static void span_read(SpanBuilder *sb, int b, int t) { sb->open[b].to = t; }

// Layer i's forward (or recomputation) at event t.
static void spans_forward(const Net *net, SpanBuilder *sb, int i, int t) {
    const Layer *l = net->layers[i];
    span_read(sb, i ? buf_out(i - 1) : BUF_INPUT, t);
    span_write(sb, buf_out(i), t);
    if (l->ops->inner_bytes) span_write(sb, buf_inner(i), t);
    if (l->ops->scratch_values) span_write(sb, buf_scratch(i), t);
}

// The bytes of each buffer in net->bufs (0: not used).
static void buffer_bytes(Net *net, const int *gid) {
    ActBuffer *buf = net->bufs;
    const size_t B = (size_t)net->batch, es = dtype_sizes[net->precision];
    const int last = net->nlayers - 1;
    buf[BUF_INPUT].bytes = align64(B * (size_t)shape_numel(net->input) * sizeof(float));
    buf[BUF_LABELS].bytes = align64(B * sizeof(int32_t));
    buf[BUF_METRICS].bytes = align64(NET_METRICS * sizeof(float)) + align64(sizeof(ScalerState));
    buf[BUF_DLOGP].bytes = align64(B * (size_t)shape_numel(net->layers[last]->out) * sizeof(float));
    for (int i = 0; i <= last; i++) {
        const Layer *l = net->layers[i];
        buf[buf_out(i)].bytes = align64(B * (size_t)shape_numel(l->out) * (i == last ? sizeof(float) : es));
        buf[buf_inner(i)].bytes = align64(B * inner_bytes(l, net->precision));
        buf[buf_grad(i)].bytes = gid[i] == buf_grad(i) ? align64(B * (size_t)shape_numel(l->in) * es) : 0;
        buf[buf_scratch(i)].bytes = l->ops->scratch_values ? align64(B * (size_t)l->ops->scratch_values(l) * es) : 0;
    }
}

// The spans of every buffer over net->events, into net->spans (grouped by buffer) and
// net->bufs[b].span0 / nspans.
static int buffer_spans(Net *net, const int *gid, Error *err) {
    const int n = net->nlayers, nb = BUF_LAYERS + BUFS_A_LAYER * n, after = net->nevents;
    SpanBuilder sb = {.open = xcalloc((size_t)nb, sizeof *sb.open, err)};
    if (!sb.open) return -1;
    for (int b = 0; b < nb; b++) sb.open[b].from = -1;
    // The trainer fills the batch and its labels, and zeroes the metrics, before the step.
    const int filled[] = {BUF_INPUT, BUF_LABELS, BUF_METRICS};
    for (size_t k = 0; k < sizeof filled / sizeof filled[0]; k++) span_write(&sb, filled[k], 0);
    for (int t = 0; t < net->nevents; t++) {
        const int i = net->events[t].layer;
        const Layer *l = net->layers[i];
        switch (net->events[t].kind) {
        case EV_FORWARD:
        case EV_RECOMPUTE: spans_forward(net, &sb, i, t); break;
        case EV_LOSS:
            span_read(&sb, buf_out(i), t);
            span_read(&sb, BUF_LABELS, t);
            span_read(&sb, BUF_METRICS, t);
            span_write(&sb, BUF_DLOGP, t);
            break;
        case EV_BACKWARD: {
            const unsigned reads = layer_backward_reads(l);
            span_read(&sb, i == n - 1 ? BUF_DLOGP : gid[i + 1], t);
            if (gid[i] >= 0) {
                if (gid[i] == buf_grad(i)) span_write(&sb, gid[i], t);
                else span_read(&sb, gid[i], t);  // in place
            }
            if (reads & BACKWARD_READS_IN) span_read(&sb, i ? buf_out(i - 1) : BUF_INPUT, t);
            if (reads & BACKWARD_READS_OUT) span_read(&sb, buf_out(i), t);
            if (l->ops->inner_bytes) span_read(&sb, buf_inner(i), t);
            if (l->ops->scratch_values) span_write(&sb, buf_scratch(i), t);
            break;
        }
        }
    }
    // Read after the step: those, and the output (the trainer's predictions).
    const int kept[] = {BUF_INPUT, BUF_LABELS, BUF_METRICS, buf_out(n - 1)};
    for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++) span_read(&sb, kept[k], after);
    for (int b = 0; b < nb; b++) span_close(&sb, b);
    int rc = -1;
    if (sb.failed) {
        err_set(err, "out of host memory planning the activations");
        goto done;
    }
    free(net->spans);
    net->spans = xcalloc((size_t)sb.n + 1, sizeof *net->spans, err);
    if (!net->spans) goto done;
    int m = 0;
    for (int b = 0; b < nb; b++) {
        net->bufs[b].span0 = m;
        for (int k = 0; k < sb.n; k++)
            if (sb.owner[k] == b) net->spans[m++] = sb.closed[k];
        net->bufs[b].nspans = m - net->bufs[b].span0;
    }
    net->nspans = m;
    rc = 0;
done:
    free(sb.open), free(sb.owner), free(sb.closed);
    return rc;
}

static bool buffers_meet(const Net *net, const ActBuffer *a, const ActBuffer *b) {
    for (int i = 0; i < a->nspans; i++)
        for (int j = 0; j < b->nspans; j++) {
            const ActSpan x = net->spans[a->span0 + i], y = net->spans[b->span0 + j];
            if (x.from <= y.to && y.from <= x.to) return true;
        }
    return false;
}

// Whether buffer b is live at event t.
bool net_buffer_live(const Net *net, int b, int t) {
    const ActBuffer *a = &net->bufs[b];
    for (int i = 0; i < a->nspans; i++)
        if (net->spans[a->span0 + i].from <= t && t <= net->spans[a->span0 + i].to) return true;
    return false;
}

// Places every used buffer (bytes > 0), largest first, at the lowest offset where it
// overlaps no placed buffer that is live with it; sets plan.activations (the highest
// end) and plan.act_kept (the bytes live at the loss).
static int place_buffers(Net *net, Error *err) {
    const int nb = net->nbufs;
    int *order = xcalloc((size_t)nb, sizeof *order, err), *placed = xcalloc((size_t)nb, sizeof *placed, err);
    int rc = -1;
    if (!order || !placed) goto done;
    int used = 0;
    for (int b = 0; b < nb; b++)
        if (net->bufs[b].bytes) order[used++] = b;
    for (int a = 1; a < used; a++)  // by size, largest first; ties in id order
        for (int c = a; c > 0 && net->bufs[order[c]].bytes > net->bufs[order[c - 1]].bytes; c--) {
            const int t = order[c];
            order[c] = order[c - 1], order[c - 1] = t;
        }
    size_t top = 0;
    for (int k = 0; k < used; k++) {
        ActBuffer *x = &net->bufs[order[k]];
        int nconf = 0;  // the placed buffers live with x, by offset
        for (int j = 0; j < k; j++) {
            const ActBuffer *y = &net->bufs[order[j]];
            if (!buffers_meet(net, x, y)) continue;
            int c = nconf++;
            for (; c > 0 && net->bufs[placed[c - 1]].offset > y->offset; c--) placed[c] = placed[c - 1];
            placed[c] = order[j];
        }
        size_t off = 0;
        for (int c = 0; c < nconf; c++) {
            const ActBuffer *y = &net->bufs[placed[c]];
            if (off + x->bytes <= y->offset) break;
            if (y->offset + y->bytes > off) off = y->offset + y->bytes;
        }
        x->offset = off;
        if (off + x->bytes > top) top = off + x->bytes;
    }
    net->plan.activations = top;
    net->plan.act_kept = 0;
    for (int b = 0; b < nb; b++)
        if (net->bufs[b].bytes && net_buffer_live(net, b, net->nlayers)) net->plan.act_kept += net->bufs[b].bytes;
    rc = 0;
done:
    free(order), free(placed);
    return rc;
}

// Plans the activation block for the current segments: schedule, spans, offsets.
static int net_plan_activations(Net *net, Error *err) {
    const int n = net->nlayers;
    int *gid = xcalloc((size_t)n, sizeof *gid, err);
    if (!gid || net_schedule(net, err)) goto fail;
    free(net->bufs);
    net->nbufs = BUF_LAYERS + BUFS_A_LAYER * n;
    net->bufs = xcalloc((size_t)net->nbufs, sizeof *net->bufs, err);
    if (!net->bufs) goto fail;
    grad_buffers(net, gid);
    buffer_bytes(net, gid);
    if (buffer_spans(net, gid, err)) goto fail;
    for (int b = 0; b < net->nbufs; b++)  // a buffer nothing uses needs no bytes
        if (!net->bufs[b].nspans) net->bufs[b].bytes = 0;
    if (place_buffers(net, err)) goto fail;
    free(gid);
    return 0;
fail:
    free(gid);
    return -1;
}

// Points every activation buffer into the block at `base`.
static void net_carve_activations(Net *net, char *base) {
    const int n = net->nlayers;
    int gid[n];
    grad_buffers(net, gid);
    char *at[net->nbufs];
    for (int b = 0; b < net->nbufs; b++) at[b] = net->bufs[b].bytes ? base + net->bufs[b].offset : NULL;
    net->input_buf = (float *)at[BUF_INPUT];
    net->labels = (int32_t *)at[BUF_LABELS];
    net->metrics = (float *)at[BUF_METRICS];
    net->scaler = (ScalerState *)(at[BUF_METRICS] + align64(NET_METRICS * sizeof(float)));
    net->dlogp = (float *)at[BUF_DLOGP];
    for (int i = 0; i < n; i++) {
        net->acts[i] = at[buf_out(i)];
        if (net->layers[i]->ops->inner_bytes) net->layers[i]->inner = at[buf_inner(i)];
        if (net->layers[i]->ops->scratch_values) net->layers[i]->scratch = at[buf_scratch(i)];
        net->din[i] = gid[i] >= 0 ? at[gid[i]] : NULL;
    }
}

// The fused update's gradient block, in floats: the largest trained module's gradients. One
// module's backward runs at a time (a container runs its children one after another), and
// the hook zeroes the module's gradients after its update, before the next one begins.
static int64_t fused_grad_floats(const Net *net) {
    int64_t most = 0;
    for (int i = 0; i < net->nmodules; i++)
        if (layer_trains(net->modules[i]) && layer_param_floats(net->modules[i]) > most)
            most = layer_param_floats(net->modules[i]);
    return most;
}

// Computes the rest of net->plan (workspace, parameters, gradients, optimizer state) and
// the fp16 scratch of the executor.
static void net_layout(Net *net) {
    const int B = net->batch, last = net->nlayers - 1;
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
        size_t fit = net->k->fp16_scratch_bytes / per_sample;
        fit = fit < 1 ? 1 : fit > (size_t)B ? (size_t)B : fit;
        net->exec.slot_values = (int64_t)(fit * largest_any);
        ws = 4 * align64(fit * largest_any * sizeof(float));
    }
    net->scratch_bytes = ws;
    size_t layer_ws = 0;
    for (int i = 0; i < net->nmodules; i++) {
        const Layer *l = net->modules[i];
        const size_t w = layer_workspace_bytes(l, net->k, exec_chunk(&net->exec, l, B));
        if (w > layer_ws) layer_ws = w;
    }
    net->plan.workspace = ws + layer_ws;
    net->plan.threads = net->k->thread_scratch ? net->k->thread_scratch() : 0;
    net->plan.params = (size_t)net->nparams * sizeof(float);
    net->plan.grads_unfused = (size_t)net->ntrain * sizeof(float);
    net->plan.grads = net->fused_update ? (size_t)fused_grad_floats(net) * sizeof(float)
                                        : net->plan.grads_unfused;
    net->plan.optimizer = (size_t)net->nstates * (size_t)net->ntrain * sizeof(float);
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
// (saved) from forward to backward; the others, with the inner activations of all its
// layers, are recomputed in backward. A cut is judged by the activation block its plan
// needs (net_plan_activations). The candidates come from a simpler model: the saved
// outputs plus the largest segment's recomputed bytes, for each limit on the latter the
// cut of the fewest saved bytes (seg_fit); the best one is then improved by moving single
// cuts by a layer. So the big early activations of an image network (ResNet's 112x112
// stem) get segments of their own instead of an equal share of layers.
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
// most one segment per layer) at the candidate cut whose activation block is smallest,
// and plans the activations for it.
static int net_segments(Net *net, int segments, Error *err) {
    const int n = net->nlayers, last = n - 1;
    int S = segments == NET_SEGMENTS_SQRT ? (int)lround(sqrt((double)n)) : segments;
    if (S < 1) S = 1;
    if (S > n) S = n;
    net->nsegments = S;
    net->seg_first = xcalloc((size_t)S + 1, sizeof *net->seg_first, err);
    if (!net->seg_first) return -1;
    net->seg_first[S] = n;
    if (S == 1) return net_plan_activations(net, err);
    const size_t es = dtype_sizes[net->precision], B = (size_t)net->batch;
    const size_t npairs = (size_t)n * (n + 1) / 2, cells = (size_t)(S + 1) * (n + 1);
    size_t *out = xcalloc((size_t)n, sizeof *out, err), *above = xcalloc((size_t)n + 1, sizeof *above, err);
    size_t *limits = xcalloc(npairs, sizeof *limits, err), *dp = xcalloc(cells, sizeof *dp, err);
    int *from = xcalloc(cells, sizeof *from, err), *cut = xcalloc((size_t)S + 1, sizeof *cut, err);
    int *best_cut = xcalloc((size_t)S + 1, sizeof *best_cut, err);
    int rc = -1;
    if (!out || !above || !limits || !dp || !from || !cut || !best_cut) goto done;
    for (int i = 0; i < n; i++) {
        const Layer *l = net->layers[i];
        out[i] = align64(B * (size_t)shape_numel(l->out) * (i == last ? sizeof(float) : es));
        above[i + 1] = above[i] + out[i] + align64(B * inner_bytes(l, net->precision));
    }
    const SegCost c = {n, out, above};
    size_t m = 0;
    for (int s = 0; s < n; s++)
        for (int e = s + 1; e <= n; e++) limits[m++] = seg_scratch(&c, s, e);
    qsort(limits, m, sizeof *limits, cmp_size);
    size_t best = SIZE_MAX;
    for (size_t t = 0; t < m; t++) {
        if ((t && limits[t] == limits[t - 1]) || seg_fit(&c, S, limits[t], dp, from, cut) == SIZE_MAX ||
            (best != SIZE_MAX && !memcmp(cut, best_cut, ((size_t)S + 1) * sizeof *cut)))
            continue;
        memcpy(net->seg_first, cut, ((size_t)S + 1) * sizeof *cut);
        if (net_plan_activations(net, err)) goto done;
        if (net->plan.activations < best) {
            best = net->plan.activations;
            memcpy(best_cut, cut, ((size_t)S + 1) * sizeof *cut);
        }
    }
    // Then moves single cuts by one layer while that shrinks the block.
    for (bool moved = true; moved;) {
        moved = false;
        for (int k = 1; k < S; k++)
            for (int d = -1; d <= 1; d += 2) {
                memcpy(cut, best_cut, ((size_t)S + 1) * sizeof *cut);
                cut[k] += d;
                if (cut[k] <= cut[k - 1] || cut[k] >= cut[k + 1]) continue;
                memcpy(net->seg_first, cut, ((size_t)S + 1) * sizeof *cut);
                if (net_plan_activations(net, err)) goto done;
                if (net->plan.activations < best) {
                    best = net->plan.activations;
                    memcpy(best_cut, cut, ((size_t)S + 1) * sizeof *cut);
                    moved = true;
                }
            }
    }
    memcpy(net->seg_first, best_cut, ((size_t)S + 1) * sizeof *cut);
    rc = net_plan_activations(net, err);
done:
    free(out), free(above), free(limits), free(dp), free(from), free(cut), free(best_cut);
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
    net->gemm_reduced = opt->precision == DT_F16 || opt->tf32;
    if (opt->batch < 1 || (opt->precision != DT_F32 && opt->precision != DT_F16)) {
        err_set(err, "net_create: batch %d and precision %s: expected batch >= 1 and F32 or F16",
                opt->batch, dtype_names[opt->precision]);
        goto fail;
    }
    if (opt->fused_update && opt->precision != DT_F32) {
        err_set(err, "net_create: the fused update needs fp32: with fp16 the loss scaler must "
                     "see every gradient before it decides whether the step is taken");
        goto fail;
    }
    net->fused_update = opt->fused_update;
    if (net_build_layers(net, cfg, input, classes, err) || net_freeze(net, cfg, opt, err)) goto fail;
    net->nstates = opt->opt_states;
    net->state_names = opt->opt_state_names;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        net->ntrained_modules += layer_trains(l);
        for (int j = 0; j < LAYER_MAX_PARAMS; j++) l->train_off[j] = -1;
        for (int j = 0; j < l->nparams; j++) {
            const int64_t n = tensor_numel(&l->params[j]);
            l->train_off[j] = l->frozen ? -1 : net->ntrain;
            net->nparams += n;
            if (!l->frozen) net->ntrain += n;
        }
    }
    if (net_segments(net, opt->segments, err)) goto fail;
    net_layout(net);
    net_layout_buffers(net, NULL);
    if (opt->plan_only) return 0;

    net->acts = xcalloc((size_t)net->nlayers, sizeof *net->acts, err);
    net->din = xcalloc((size_t)net->nlayers, sizeof *net->din, err);
    if (!net->acts || !net->din) goto fail;
    if (!(net->params = device_block(k, net->plan.params, "parameter", err)) ||
        !(net->grads = device_block(k, net->plan.grads, "gradient", err)) ||
        !(net->optimizer = device_block(k, net->plan.optimizer, "optimizer state", err)) ||
        !(net->buffers = device_block(k, net->plan.buffers, "buffer", err)) ||
        !(net->activations = device_block(k, net->plan.activations, "activation", err)) ||
        !(net->workspace = device_block(k, net->plan.workspace, "workspace", err)))
        goto fail;
    net_carve_activations(net, net->activations);
    const ScalerState unscaled = {.scale = 1.0};
    k->upload(net->scaler, &unscaled, sizeof unscaled);
    net_layout_buffers(net, net->buffers);
    for (int i = 0; i < 4 && net->scratch_bytes; i++)
        net->exec.scratch[i] = (float *)((char *)net->workspace + i * (net->scratch_bytes / 4));
    net->layer_workspace = (char *)net->workspace + net->scratch_bytes;
    // Gradients in state_dict order, or (fused) every module's from the block's start.
    int64_t off = 0;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        int64_t goff = net->fused_update ? 0 : l->train_off[0];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].data = net->params + off;
            l->grads[j] = l->frozen ? NULL : net->grads + goff;
            off += tensor_numel(&l->params[j]);
            goff += tensor_numel(&l->params[j]);
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
    free(net->din);
    free(net->seg_first);
    free(net->events);
    free(net->bufs);
    free(net->spans);
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
    net->k->gemm_reduced(net->gemm_reduced);
    for (int i = 0; i < net->nlayers; i++) forward_layer(net, i, &ctx, N);
}

void net_loss(Net *net, int N, int denominator, bool grad) {
    const Layer *out = net->layers[net->nlayers - 1];
    net->k->nll_loss(grad ? net->dlogp : NULL, net->metrics, net_output(net), net->labels, N,
                     out->out.c, 1.0f / (float)denominator, net->scaler);
}

void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0) {
    LayerCtx ctx = net_ctx(net, true, seed, step, sample0);
    ctx.hook = net->hook.ready ? &net->hook : NULL;
    net->k->gemm_reduced(net->gemm_reduced);
    LayerCtx redo = ctx;  // recomputations: the same dropout masks and batch statistics
    redo.recompute = true;
    redo.hook = NULL;
    const int last = net->nlayers - 1;
    const bool f32 = net->precision == DT_F32;
    for (int e = net->nlayers + 1; e < net->nevents; e++) {
        const int i = net->events[e].layer;
        if (net->events[e].kind == EV_RECOMPUTE) {
            forward_layer(net, i, &redo, N);
            continue;
        }
        // What backward does not read is not passed: its buffer may hold another's by now.
        const unsigned reads = layer_backward_reads(net->layers[i]);
        const Stored none = {NULL, true};
        const Stored dout = i == last ? (Stored){net->dlogp, true} : (Stored){net->din[i + 1], f32};
        if (net->on_layer) net->on_layer(i, true);
        exec_backward(&ctx, net->layers[i], (Stored){net->din[i], f32}, dout,
                      reads & BACKWARD_READS_IN ? net_in(net, i) : none,
                      reads & BACKWARD_READS_OUT ? net_out(net, i) : none, N);
    }
}

void net_zero_grads(Net *net) { net->k->zero(net->grads, net->plan.grads); }

void net_zero_module_grads(Net *net, const Layer *m) {
    if (layer_trains(m)) net->k->zero(m->grads[0], (size_t)layer_param_floats(m) * sizeof(float));
}

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
