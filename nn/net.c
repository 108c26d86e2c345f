// net.c: building, planning, allocating and running the sequential network.
#include "net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost.h"
#include "mt19937.h"

size_t mem_plan_blocks(const MemPlan *p) {
    return p->params + p->grads + p->optimizer + p->buffers + p->activations + p->workspace;
}

size_t mem_plan_total(const MemPlan *p) {
    return mem_plan_blocks(p) + p->threads + p->loader + p->exchange;
}

size_t mem_plan_on(const MemPlan *p, const Kernels *k) {
    return k->host_memory ? mem_plan_total(p) : mem_plan_blocks(p);
}

// Blocks are carved in 64-byte aligned pieces.
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

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
    // The top-level layers: a [block]'s members are its own.
    const int n = layer_section_count(cfg, err);
    if (n < 0) return -1;
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
        if (!layer_is_section(s)) continue;
        i += layer_section_extent(cfg, s, err) - 1;
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
        Layer *l = NULL;
        const LayerArgs args = {.cfg = cfg, .s = s, .in = shape, .classes = classes, .k = net->k};
        if (ops->create(&l, &args, err)) goto done;
        if (l->ops->expand && net->nlayers == 0) {
            layer_free(l);
            err_set(err, "%s:%d: [%s] is the first layer: a block needs a layer before it (a "
                         "stem such as [conv] + [batchnorm])", cfg->path, s->line, s->name);
            goto done;
        }
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

// Bytes per sample that node j keeps besides its output (a leaf's LayerOps.inner_bytes; a
// sweep keeps its members' a chunk at a time, in its scratch).
static size_t inner_bytes(const Net *net, int j) {
    const Layer *l = net->nodes[j].kind == NODE_LEAF ? net->nodes[j].l : NULL;
    return l && l->ops->inner_bytes ? l->ops->inner_bytes(l, net->precision) : 0;
}

// A sweep node's chain as exec.h runs it (scratch set by the caller).
static Sweep node_sweep(const Net *net, const NetNode *nd, void *scratch) {
    return (Sweep){.m = nd->chain, .nm = nd->nchain, .chunk = nd->chunk,
                   .bytes_in = net->input_bytes && nd->in[0] == NODE_INPUT, .scratch = scratch};
}

// Values of the largest input or output of a node that runs through the executor's fp16
// scratch: every node but a sweep, which converts a chunk at a time in its own scratch (so
// a swept stem's 112x112 tensors do not size the slots).
static size_t largest_unswept(const Net *net) {
    size_t m = 0;
    for (int j = 0; j < net->nnodes; j++) {
        const NetNode *nd = &net->nodes[j];
        if (nd->kind == NODE_SWEEP) continue;
        size_t v = (size_t)shape_numel(nd->out);
        if (nd->kind == NODE_LEAF && (size_t)shape_numel(nd->l->in) > v) v = (size_t)shape_numel(nd->l->in);
        if (v > m) m = v;
    }
    return m;
}

// Samples a call of module l takes at most: the executor's chunk, or a sweep's.
static int call_samples(const Net *net, const Layer *l) {
    int n = exec_chunk(&net->exec, l, net->batch);
    for (int j = 0; j < net->nnodes; j++)
        for (int i = 0; net->nodes[j].kind == NODE_SWEEP && i < net->nodes[j].nchain; i++)
            if (net->nodes[j].chain[i] == l && net->nodes[j].chunk > n) n = net->nodes[j].chunk;
    return n;
}

// The stem's rule of recomputation: a convolution that reads the network's input, and
// whose output only the batchnorm after it reads, is jit. Its input is kept anyway (the
// batch's bytes, which its weight gradient reads), and computing the output again costs
// C_in x K x K products a value (147 for a ResNet's 7x7 stem, 27 for MobileNetV2's 3x3)
// at the network's widest resolution, where keeping it costs the most: 103 MB of
// ResNet-34's activations at batch 32 for about 1% of a step's products.
static bool stem_jit(const Net *net, int t, int in) {
    const Layer *l = net->layers[t];
    return in == NODE_INPUT && layer_is_conv(l) && t + 1 < net->nlayers &&
           net->layers[t + 1]->ops == &batchnorm_ops && !(layer_backward_reads(l) & BACKWARD_READS_OUT);
}

// Appends the nodes of every top-level layer: a leaf is its own node, a container expands.
static int net_build_nodes(Net *net, Error *err) {
    NodeList nl = {.input = net->input, .recompute_1x1 = net->recompute_1x1};
    int prev = NODE_INPUT;
    for (int t = 0; t < net->nlayers; t++) {
        Layer *l = net->layers[t];
        nl.top = t;
        prev = l->ops->expand ? l->ops->expand(l, &nl, prev, err) : node_leaf(&nl, l, prev, stem_jit(net, t, prev), err);
        if (prev < 0) {
            free(nl.node);
            return -1;
        }
    }
    net->nodes = nl.node;
    net->nnodes = nl.n;
    net->widening_1x1 = nl.widening_1x1;
    return 0;
}

// The inputs of node j that it reads: 2 for a sum, else 1.
static int node_nin(const NetNode *n) { return n->kind == NODE_SUM ? 2 : 1; }

// What node j's backward reads of the forward's (a sum reads its output: the ReLU mask; a
// sweep its input, from which it runs its members again).
static unsigned node_reads(const NetNode *n) {
    if (n->kind == NODE_SUM) return n->act == ACT_NONE ? 0 : BACKWARD_READS_OUT;
    if (n->kind == NODE_SWEEP) return BACKWARD_READS_IN;
    return layer_backward_reads(n->l);
}

// Whether node j's backward may write its input gradient over its output gradient: a
// layer that computes in place, or with halves any leaf whose input and output are the same
// size (the executor reads a chunk's output gradient into its fp32 scratch before it stores
// that chunk's input gradient, and a batch pass reads all of it first), but the last,
// whose output gradient is fp32.
static bool node_in_place(const Net *net, int j) {
    const NetNode *n = &net->nodes[j];
    if (n->kind != NODE_LEAF) return false;
    return n->l->ops->backward_in_place ||
           (precision_is_half(net->precision) && j < net->nnodes - 1 && shape_numel(n->l->in) == shape_numel(n->l->out));
}

// Whether node j's backward may write its input gradient over its input (LayerOps.din_over_in;
// a sweep reads each chunk's input before it writes the chunk's gradient).
static bool node_din_over_in(const NetNode *n) {
    if (n->kind == NODE_SWEEP) return true;
    return n->kind == NODE_LEAF && n->l->ops->din_over_in && n->l->ops->din_over_in(n->l);
}

// Whether node j's backward may change its output gradient (a sweep copies it, but its
// last member may be anything it allows).
static bool node_writes_dout(const NetNode *n) {
    if (n->kind == NODE_LEAF)
        return n->l->ops->backward_writes_dout && n->l->ops->backward_writes_dout(n->l);
    return false;
}

// Whether node j has a trained parameter.
static bool node_trained(const NetNode *n) {
    if (n->kind == NODE_LEAF) return !n->l->frozen && n->l->nparams;
    for (int i = 0; i < n->nchain; i++)
        if (!n->chain[i]->frozen && n->chain[i]->nparams) return true;
    return false;
}

// The readers of node p's output.
static int consumers(const Net *net, int p) {
    int c = 0;
    for (int j = p + 1; j < net->nnodes; j++)
        for (int k = 0; k < node_nin(&net->nodes[j]); k++) c += net->nodes[j].in[k] == p;
    return c;
}

// Whether leaf l may be a sweep's member after its first: it computes each sample alone
// (its batch pass, batchnorm's, sums chunk by chunk) and is cheap to run again.
static bool sweep_cheap(const Layer *l) {
    const LayerOps *o = l->ops;
    return o == &batchnorm_ops || o == &relu_ops || o == &maxpool_ops || o == &avgpool_ops ||
           o == &dropout_ops;
}

// Per sample, the scratch bytes a sweep needs: about what exec_sweep_bytes takes.
static size_t sweep_sample_bytes(const NetNode *nd) {
    size_t b = 0, big = (size_t)shape_numel(nd->chain[0]->in);
    for (int i = 0; i < nd->nchain; i++) {
        const Layer *l = nd->chain[i];
        b += (size_t)shape_numel(l->out) * sizeof(float) + (l->ops->inner_bytes ? l->ops->inner_bytes(l, DT_F32) : 0);
        if ((size_t)shape_numel(l->out) > big) big = (size_t)shape_numel(l->out);
    }
    return b + 4 * big * sizeof(float);
}

// Under checkpointing, each chain of leaves that a sweep may run becomes one NODE_SWEEP,
// so what passes between them never exists for the whole batch: cheap members (sweep_cheap)
// each read only by the next, the first one possibly a layer with parameters
// (LayerOps.sample_quantum) when it reads the network's input (nobody needs its input
// gradient: the stem convolution of an image network). Chunks are a multiple of that
// quantum, as many samples as fit in `budget` bytes of scratch. With compressed
// activations a chain whose input may be compressed is not swept: a sweep's backward
// runs its members again from its input, which must then stay exact (and a sweep keeps
// nothing of its members, so nothing of them is compressed).
static int net_fuse_sweeps(Net *net, size_t budget, Error *err) {
    NetNode *nodes = net->nodes;
    const int n = net->nnodes;
    int *to = xcalloc((size_t)n, sizeof *to, err);  // old index -> new index
    if (!to) return -1;
    int m = 0;
    for (int j = 0; j < n;) {
        int q = 0;
        const NetNode *a = &nodes[j];
        // A sweep's input must stay exact (its backward runs the members again from it).
        const bool exact_in = a->in[0] == NODE_INPUT || !nodes[to[a->in[0]]].compress;
        // A jit stem (stem_jit) may lead a sweep, which runs it again from the input anyway.
        if (a->kind == NODE_LEAF && (!a->jit || a->in[0] == NODE_INPUT) && exact_in) {
            if (sweep_cheap(a->l)) q = 1;
            else if (a->in[0] == NODE_INPUT && a->l->ops->sample_quantum)
                q = a->l->ops->sample_quantum(a->l, net->k);
        }
        int e = j + 1;  // the chain [j, e)
        while (q > 0 && e < n && e - j < NODE_CHAIN_MAX && nodes[e].kind == NODE_LEAF && !nodes[e].jit &&
               sweep_cheap(nodes[e].l) && nodes[e].in[0] == e - 1 && consumers(net, e - 1) == 1)
            e++;
        if (q <= 0 || e - j < 2 || e == n) {  // none (the network's output is never swept)
            NetNode c = nodes[j];
            for (int k = 0; k < node_nin(&c); k++) c.in[k] = c.in[k] == NODE_INPUT ? NODE_INPUT : to[c.in[k]];
            to[j] = m;
            nodes[m++] = c;
            j++;
            continue;
        }
        NetNode sw = {.kind = NODE_SWEEP, .nchain = e - j, .in = {a->in[0] == NODE_INPUT ? NODE_INPUT : to[a->in[0]], NODE_INPUT},
                      .out = nodes[e - 1].out, .top = a->top, .compress = nodes[e - 1].compress};
        for (int i = j; i < e; i++) sw.chain[i - j] = nodes[i].l;
        const size_t per = sweep_sample_bytes(&sw);
        int fit = (int)(budget / per / (size_t)q) * q;
        sw.chunk = fit < q ? q : fit;
        if (sw.chunk > net->batch) sw.chunk = net->batch;
        for (int i = j; i < e; i++) to[i] = m;
        nodes[m++] = sw;
        j = e;
    }
    net->nnodes = m;
    free(to);
    return 0;
}

// The last node that reads node p's output in forward (p itself if none).
static int last_consumer(const Net *net, int p) {
    int last = p;
    for (int j = p + 1; j < net->nnodes; j++)
        for (int k = 0; k < node_nin(&net->nodes[j]); k++)
            if (net->nodes[j].in[k] == p) last = j;
    return last;
}

// The segment of node j.
static int segment_of(const Net *net, int j) {
    int g = 0;
    while (g + 1 < net->nsegments && net->seg_first[g + 1] <= j) g++;
    return g;
}

// Whether node p's output is kept from the first forward to backward because a later
// segment reads it (or it is the network's output).
static bool crosses(const Net *net, int p) {
    return p == net->nnodes - 1 || last_consumer(net, p) >= net->seg_first[segment_of(net, p) + 1];
}

// ---- the activation block: buffers planned by lifetime ------------------------------------
//
// The step is a fixed schedule (net->events): every node's forward, the loss, then
// backward, segment by segment from the last: the recomputation of the segment's nodes
// (checkpointing), then the backward of each, with a jit node recomputed right before the
// first backward that reads it. Each buffer of the activation block (the input, every
// node's output, a leaf's inner activations, every output gradient and the second term of
// one, the loss's) is live over the spans of events from a write that fills it to the
// last event that reads what that write left; between spans its bytes serve other
// buffers. Nodes share a buffer where the schedule allows it: a sum writes its output over
// its first input's (bn2's output, which nothing reads after the sum), an in-place
// backward writes its input gradient over its output gradient, a sum passes its output
// gradient on to its inputs as it is. Offsets are assigned greedily, largest buffer first,
// at the lowest offset that no buffer live at the same time occupies (the greedy-by-size
// placement of TFLite's memory planner). The block is as large as the highest end.

// The layers node j runs: a leaf's, or a sweep's members (a sum runs none); their count.
static int node_layers(const NetNode *nd, Layer *const **ls) {
    if (nd->kind == NODE_LEAF) {
        *ls = &nd->l;
        return 1;
    }
    *ls = nd->chain;
    return nd->kind == NODE_SWEEP ? nd->nchain : 0;
}

// The gradient floats of node j's trained modules.
static int64_t node_grad_floats(const NetNode *nd) {
    Layer *const *ls;
    int64_t n = 0;
    for (int i = node_layers(nd, &ls) - 1; i >= 0; i--)
        if (layer_trains(ls[i])) n += layer_param_floats(ls[i]);
    return n;
}

// The workspace node j's events need: the most of its layers' (LayerCtx.workspace), and of
// a virtual input's layer, which it runs on the chunks it reads.
static size_t node_workspace_bytes(const Net *net, int j) {
    const NetNode *nd = &net->nodes[j];
    Layer *const *ls;
    size_t w = 0;
    for (int i = node_layers(nd, &ls) - 1; i >= 0; i--) {
        const size_t x = layer_workspace_bytes(ls[i], net->k, call_samples(net, ls[i]));
        if (x > w) w = x;
    }
    for (int k = 0; k < node_nin(nd); k++) {
        const int p = nd->in[k];
        if (p == NODE_INPUT || !net->nodes[p].virt) continue;
        const size_t x = layer_workspace_bytes(net->nodes[p].l, net->k, call_samples(net, net->nodes[p].l));
        if (x > w) w = x;
    }
    return w;
}

// Buffer ids: five fixed ones, then per node its output, its inner activations, its output
// gradient, that gradient's second term, a sweep's scratch, its output compressed, with
// the fused update its trained modules' gradients (live at its backward alone: the
// network zeroes them first, the hook updates from them at the end; the gradient block is
// then none), and its layers' workspace (live at its own events; where the placement
// keeps the layers' workspace in the block, place_buffers, else none).
// BUF_INPUT holds the batch: fp32 values, or with input_bytes the table of byte values and
// the bytes (off the host: on the host the network reads the caller's, net_put_input); BUF_INPUT_F32
// (input_bytes in F32) is where a leaf that reads the network's input expands the bytes, a
// chunk at a time (Exec.input_chunk), live during its events only (a sweep expands them in
// its scratch).
enum { BUF_INPUT, BUF_LABELS, BUF_METRICS, BUF_DLOGP, BUF_INPUT_F32, BUF_NODES, BUFS_A_NODE = 8 };
static int buf_out(int j) { return BUF_NODES + BUFS_A_NODE * j; }
static int buf_inner(int j) { return buf_out(j) + 1; }
static int buf_grad(int j) { return buf_out(j) + 2; }
static int buf_term(int j) { return buf_out(j) + 3; }
static int buf_scratch(int j) { return buf_out(j) + 4; }  // a sweep's, during its own events
static int buf_pack(int j) { return buf_out(j) + 5; }
static int buf_wgrad(int j) { return buf_out(j) + 6; }
static int buf_ws(int j) { return buf_out(j) + 7; }
static bool is_buf_ws(int b) { return b >= BUF_NODES && b == buf_ws((b - BUF_NODES) / BUFS_A_NODE); }

// The buffer of node p's output as a reader sees it (NODE_INPUT: the network's input).
static int out_buffer(const Net *net, int p) { return p == NODE_INPUT ? BUF_INPUT : net->nbuf[p].out; }

// The buffer where a backward reads node p's output: its records where it is compressed.
static int read_buffer(const Net *net, int p) {
    return p != NODE_INPUT && net->nodes[p].packed ? buf_pack(p) : out_buffer(net, p);
}

// Whether node p's output gradient is needed: backward reaches p (every input of a node
// at or after first_trained gets one, but the network's input).
static bool needs_grad(const Net *net, int p) { return p != NODE_INPUT && p >= net->first_trained; }

// Whether buffer b holds, besides node j's gradient, the gradient or second term of a node
// whose backward (or sum of terms) is still to come after j's backward: then j may not
// change it.
static bool shared_later(const Net *net, int b, int j) {
    for (int q = net->first_trained; q < j; q++)
        if (net->nbuf[q].grad == b || net->nbuf[q].term == b) return true;
    return false;
}

// Events being built.
typedef struct Schedule {
    Net *net;
    bool *fresh;  // recomputed while backward goes through the current segment (still valid)
    int n;
} Schedule;

static void sched_add(Schedule *sc, EventKind kind, int j) { sc->net->events[sc->n++] = (Event){kind, j}; }

// Whether backward must compute node p's output again before it reads it: a jit node's is
// not kept; neither are those of an earlier segment's nodes (later segments reused their
// buffers), but for the outputs that cross into a later segment, which are kept; and a
// kept node's inner activations are not (max pooling's argmax).
static bool recomputed(const Net *net, int p) {
    if (p == NODE_INPUT) return false;
    if (net->nodes[p].jit && !crosses(net, p)) return true;
    return segment_of(net, p) < net->nsegments - 1 && (!crosses(net, p) || inner_bytes(net, p));
}

// Whether a training forward of node j (a recomputation, or a first forward) compresses
// its output: a packed node does where backward reads what it writes, so not in a first
// forward that the schedule computes again before any backward reads it (an earlier
// segment's node).
static bool packs(const Net *net, int j, bool recompute) {
    return net->nodes[j].packed && (recompute || !recomputed(net, j));
}

// packs for event t (a forward or recomputation).
static bool packs_at(const Net *net, int t) {
    return packs(net, net->events[t].node, net->events[t].kind == EV_RECOMPUTE);
}

// Node p's output (and inner activations), read by a backward next: computed again first
// where it was not kept, once in each segment's backward, after its own inputs. So a
// segment's nodes come back one by one as its backward needs them, not all at once.
static void sched_live(Schedule *sc, int p) {
    Net *net = sc->net;
    if (p == NODE_INPUT || sc->fresh[p] || !recomputed(net, p)) return;
    for (int k = 0; k < node_nin(&net->nodes[p]); k++) sched_live(sc, net->nodes[p].in[k]);
    sched_add(sc, EV_RECOMPUTE, p);
    sc->fresh[p] = true;
}

// Whether an event after t reads buffer b as a forward value (an input, an output that a
// backward reads, the loss's) or writes a forward value into it.
static bool data_used_after(const Net *net, int b, int t) {
    for (int e = t + 1; e < net->nevents; e++) {
        const int j = net->events[e].node;
        if (j < 0) continue;  // a sum of terms dropped while routing (NodeBufs.adds)
        const NetNode *nd = &net->nodes[j];
        switch (net->events[e].kind) {
        case EV_FORWARD:
        case EV_RECOMPUTE:
            if (net->nbuf[j].out == b || (packs_at(net, e) && buf_pack(j) == b)) return true;
            for (int k = 0; k < node_nin(nd); k++)
                if (out_buffer(net, nd->in[k]) == b) return true;
            break;
        case EV_LOSS:
            if (net->nbuf[j].out == b) return true;
            break;
        case EV_BACKWARD: {
            const unsigned reads = node_reads(nd);
            if (((reads & BACKWARD_READS_IN) && read_buffer(net, nd->in[0]) == b) ||
                ((reads & BACKWARD_READS_OUT) && read_buffer(net, j) == b))
                return true;
            break;
        }
        default: break;
        }
    }
    return b == BUF_INPUT || b == net->nbuf[net->nnodes - 1].out;  // read after the step
}

// Whether some node's gradient or term already lives in buffer b.
static bool holds_gradient(const Net *net, int b) {
    for (int q = 0; q < net->nnodes; q++)
        if (net->nbuf[q].grad == b || net->nbuf[q].term == b) return true;
    return false;
}

// Whether leaf j's backward runs over chunks of samples through the scratch anyway
// (nn/exec.c): with halves, or where it reads a compressed input or output. Only there
// may its input gradient take its output gradient's bytes (net_handoff) or be added into
// its input's gradient (NodeBufs.adds): elsewhere either would cut one call into chunks,
// which changes a weight gradient's bits where the layer has no sample quantum (Winograd).
static bool backward_in_chunks(const Net *net, int j) {
    const NetNode *nd = &net->nodes[j];
    const unsigned reads = node_reads(nd);
    return nd->kind == NODE_LEAF &&
           (precision_is_half(net->precision) ||
            ((reads & BACKWARD_READS_IN) && nd->in[0] != NODE_INPUT && net->nodes[nd->in[0]].packed) ||
            ((reads & BACKWARD_READS_OUT) && nd->packed));
}

// Whether leaf j's backward may add its input gradient into node p's, a later term of it
// (NodeBufs.adds): its backward runs in chunks anyway, and p's gradient is neither j's
// own nor shared with a node other than p whose backward is still to come.
static bool adds_into_gradient(const Net *net, int j, int p) {
    const int g = net->nbuf[p].grad;
    if (net->apart || !backward_in_chunks(net, j) || g == net->nbuf[j].grad) return false;
    for (int q = net->first_trained; q < j; q++)
        if (q != p && (net->nbuf[q].grad == g || net->nbuf[q].term == g)) return false;
    return true;
}

// Where leaf j's backward at event t may write node p's gradient (a first term) or its
// second term, besides a buffer of its own: over p's output (LayerOps.din_over_in), which
// then serves as the gradient, when nothing reads or writes that output after t. Not over
// a compressed output: its exact values live only in forward, and one buffer for them and
// a gradient of backward would span the step, which the placement pays for (resnet18 at
// batch 32 with 2-bit activations: an activation block of 119 MB instead of 96).
static int over_input(const Net *net, int j, int p, int t) {
    const int b = out_buffer(net, p);
    if (!node_din_over_in(&net->nodes[j]) || b == BUF_INPUT || net->nodes[p].packed ||
        data_used_after(net, b, t) || holds_gradient(net, b))
        return -1;
    return b;
}

// The buffers of the gradients that node j's backward at event t sends to its inputs
// (nodes after j have sent theirs): the first term of an input's gradient is written to,
// or shares, a gradient buffer (in place over j's output gradient, over the input's own
// output, or a buffer of its own; a sum passes its own gradient on); a later term goes to
// the input's term buffer (or a sum's gradient) and the EV_GRAD_ADD after j adds it.
static int route_gradients(Net *net, int j, int t, Error *err) {
    const NetNode *n = &net->nodes[j];
    NodeBufs *b = net->nbuf;
    // A backward that changes its output gradient must have it to itself: a sum passes its
    // gradient on to both its inputs, and the first one's backward comes before the other's.
    if (node_writes_dout(n) && shared_later(net, b[j].grad, j))
        return err_set(err, "%s: its backward scales its output gradient in place, which a sum "
                            "also passes to another node; the network cannot run it",
                       n->l->name);
    for (int k = 0; k < node_nin(n); k++) {
        const int p = n->in[k];
        if (!needs_grad(net, p)) continue;
        const bool sum = n->kind == NODE_SUM;
        if (b[p].grad < 0 && sum) {  // a sum's first term: its own gradient, passed on
            b[p].grad = b[j].grad;
        } else if (b[p].grad < 0) {  // a leaf's or sweep's first term
            const int over = over_input(net, j, p, t);
            b[p].grad = node_in_place(net, j) && !shared_later(net, b[j].grad, j) ? b[j].grad
                        : over >= 0                                           ? over
                                                                              : buf_grad(p);
            b[j].din = b[p].grad;
        } else if (sum) {  // a sum's later term: its gradient as it is
            b[p].term = b[j].grad;
        } else if (adds_into_gradient(net, j, p)) {  // a leaf's later term, added in place
            b[j].din = b[p].grad;
            b[j].adds = true;
            for (int e = t + 1; e < net->nevents; e++)  // the sum of terms it does instead
                if (net->events[e].kind == EV_GRAD_ADD && net->events[e].node == p) {
                    net->events[e].node = -1;
                    break;
                }
        } else {  // a leaf's or sweep's later term
            const int over = over_input(net, j, p, t);
            b[p].term = over >= 0 ? over : buf_term(p);
            b[j].din = b[p].term;
        }
    }
    return 0;
}

// Whether node a's output need not be stored (NetNode.virt): with halves, a jit leaf of a layer
// that computes each sample alone and cheaply (sweep_cheap: batchnorm, ReLU, ...), the
// same size out as in and keeping nothing, whose backward does not read its output, read
// by one leaf in its own segment, its input a stored node's output. Its reader computes
// it a chunk at a time wherever it reads it: a ResNet block's bn1 output exists only in
// conv2's scratch, in forward, in recomputation and in conv2's backward.
static bool virtual_node(const Net *net, int a) {
    const NetNode *an = &net->nodes[a];
    if (!precision_is_half(net->precision) || an->kind != NODE_LEAF || !an->jit || an->in[0] == NODE_INPUT ||
        net->nodes[an->in[0]].kind != NODE_LEAF || net->nodes[an->in[0]].virt || !sweep_cheap(an->l) ||
        inner_bytes(net, a) || (node_reads(an) & BACKWARD_READS_OUT) ||
        shape_numel(an->l->in) != shape_numel(an->l->out) || crosses(net, a) || consumers(net, a) != 1)
        return false;
    for (int j = a + 1; j < net->nnodes; j++)
        if (net->nodes[j].in[0] == a || (node_nin(&net->nodes[j]) > 1 && net->nodes[j].in[1] == a))
            return net->nodes[j].kind == NODE_LEAF && segment_of(net, j) == segment_of(net, a);
    return false;
}

// Whether node p's output is kept compressed for backward (NetNode.packed): it may be
// (NetNode.compress), it is not the network's output nor a virtual node's, a backward
// reads it (a leaf's input, a node's own output), and no sweep reads it (a sweep's
// backward runs its members' forward again on its input, which must be exact).
static bool packed_node(const Net *net, int p) {
    const NetNode *pn = &net->nodes[p];
    if (!pn->compress || p == net->nnodes - 1 || pn->virt) return false;
    bool read = (node_reads(pn) & BACKWARD_READS_OUT) != 0;
    for (int j = p + 1; j < net->nnodes; j++) {
        const NetNode *nd = &net->nodes[j];
        if (nd->in[0] != p && !(node_nin(nd) > 1 && nd->in[1] == p)) continue;
        if (nd->kind == NODE_SWEEP) return false;
        read |= nd->in[0] == p && (node_reads(nd) & BACKWARD_READS_IN);
    }
    return read;
}

// Builds net->events and the nodes' buffer ids (net->nbuf) from the segments and the
// first trained node: the events first (a node's inputs that already have a gradient term
// get an EV_GRAD_ADD after its backward), then, going through them, the gradients' buffers.
// A node's backward is the last event of the step that runs its layers: a node is
// recomputed only for a backward that reads its output (its own, or a later node's, which
// comes first): what the fused update relies on (GradHook).
static int net_schedule(Net *net, Error *err) {
    const int n = net->nnodes, S = net->nsegments, stop = net->first_trained;
    free(net->events);
    // Each node: forward, backward, a sum of terms for each of (at most 2) inputs, and at
    // most one recomputation in each segment's backward; the loss.
    net->events = xcalloc((size_t)n * (4 + (size_t)S) + 1, sizeof *net->events, err);
    Schedule sc = {.net = net, .fresh = xcalloc((size_t)n, sizeof *sc.fresh, err)};
    bool *has_grad = xcalloc((size_t)n, sizeof *has_grad, err);
    if (!net->events || !sc.fresh || !has_grad) {
        free(sc.fresh), free(has_grad);
        return -1;
    }
    // In node order, as each depends on the earlier nodes': whether a leaf's input is read
    // back compressed (Layer.in_compressed), which may change what its backward reads, then
    // whether it is virtual and whether its output is kept compressed.
    for (int j = 0; j < n; j++) net->nodes[j].virt = false;
    for (int j = 0; j < n; j++) {
        NetNode *nd = &net->nodes[j];
        if (nd->kind == NODE_LEAF)
            nd->l->in_compressed = nd->in[0] != NODE_INPUT && net->nodes[nd->in[0]].packed;
        nd->virt = virtual_node(net, j);
        nd->packed = packed_node(net, j);
    }
    for (int j = 0; j < n; j++) {
        const NetNode *nd = &net->nodes[j];
        if (nd->virt) {  // its reader's input is its own input's buffer (Stored.via)
            net->nbuf[j] = (NodeBufs){.out = out_buffer(net, nd->in[0]), .grad = -1, .term = -1, .din = -1};
            continue;
        }
        // A sum writes over its first input's output when nothing reads that after the
        // sum: a leaf in the sum's segment, not recomputed on its own, whose backward does
        // not read its output, with the sum its only reader.
        const int a = nd->in[0];
        const bool over = nd->kind == NODE_SUM && a != NODE_INPUT && net->nodes[a].kind != NODE_SUM &&
                          !net->nodes[a].jit && !inner_bytes(net, a) &&
                          !(node_reads(&net->nodes[a]) & BACKWARD_READS_OUT) &&
                          last_consumer(net, a) == j && segment_of(net, a) == segment_of(net, j);
        net->nbuf[j] = (NodeBufs){.out = over ? net->nbuf[a].out : buf_out(j), .grad = -1,
                                  .term = -1, .din = -1};
    }
    net->nbuf[n - 1].grad = BUF_DLOGP;
    for (int j = 0; j < n; j++) sched_add(&sc, EV_FORWARD, j);
    sched_add(&sc, EV_LOSS, n - 1);
    for (int g = S - 1; g >= 0 && net->seg_first[g + 1] > stop; g--) {
        const int first = net->seg_first[g], end = net->seg_first[g + 1];
        for (int j = 0; j < end; j++) sc.fresh[j] = false;
        for (int j = end - 1; j >= first && j >= stop; j--) {
            const NetNode *nd = &net->nodes[j];
            const unsigned reads = node_reads(nd);
            if (reads & BACKWARD_READS_IN) sched_live(&sc, nd->in[0]);
            if ((reads & BACKWARD_READS_OUT) || inner_bytes(net, j)) sched_live(&sc, j);
            sched_add(&sc, EV_BACKWARD, j);
            for (int k = 0; k < node_nin(nd); k++) {
                const int p = nd->in[k];
                if (!needs_grad(net, p)) continue;
                if (has_grad[p]) sched_add(&sc, EV_GRAD_ADD, p);  // a second term
                has_grad[p] = true;
            }
        }
    }
    net->nevents = sc.n;
    free(sc.fresh), free(has_grad);
    for (int t = n + 1; t < net->nevents; t++)
        if (net->events[t].kind == EV_BACKWARD && route_gradients(net, net->events[t].node, t, err))
            return -1;
    int kept = 0;  // without the sums of terms that backwards add in place
    for (int t = 0; t < net->nevents; t++)
        if (net->events[t].node >= 0) net->events[kept++] = net->events[t];
    net->nevents = kept;
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

// Whether node j is a leaf that expands the network's byte input into BUF_INPUT_F32 (F32).
static bool expands_input(const Net *net, int j) {
    const NetNode *nd = &net->nodes[j];
    return net->input_bytes && net->precision == DT_F32 && nd->kind == NODE_LEAF && nd->in[0] == NODE_INPUT;
}

// Samples of a byte input that a leaf reading it expands into fp32 at once in F32
// (Exec.input_chunk): its sample quantum where it has one below the batch (the smallest, if
// several leaves read the input), else the batch.
static int net_input_chunk(const Net *net) {
    int chunk = net->batch;
    for (int j = 0; j < net->nnodes; j++) {
        const NetNode *nd = &net->nodes[j];
        if (nd->kind != NODE_LEAF || nd->in[0] != NODE_INPUT) continue;
        const Layer *l = nd->l;
        const int q = l->ops->sample_quantum ? l->ops->sample_quantum(l, net->k) : 0;
        if (q <= 0) return net->batch;
        if (q < chunk) chunk = q;
    }
    return chunk;
}

// Bytes of the table of a byte input's values, (C, 256) floats.
static size_t lut_bytes(const Net *net) { return (size_t)net->input.c * 256 * sizeof(float); }

// Event t reads (or updates) buffer b, which an earlier event wrote.
static void span_read(SpanBuilder *sb, int b, int t) { sb->open[b].to = t; }

// Node j's forward (or recomputation) at event t.
static void spans_forward(const Net *net, SpanBuilder *sb, int j, int t) {
    const NetNode *nd = &net->nodes[j];
    for (int k = 0; k < node_nin(nd); k++) span_read(sb, out_buffer(net, nd->in[k]), t);
    if (nd->virt) return;  // its batch pass alone: it writes nothing
    if (expands_input(net, j)) span_write(sb, BUF_INPUT_F32, t);  // anew at every event that reads it
    span_write(sb, net->nbuf[j].out, t);
    if (packs_at(net, t)) span_write(sb, buf_pack(j), t);
    if (inner_bytes(net, j)) span_write(sb, buf_inner(j), t);
    if (nd->kind == NODE_SWEEP) span_write(sb, buf_scratch(j), t);
    span_write(sb, buf_ws(j), t);
}

// Node j's backward at event t: its output gradient (updated by a sum, or overwritten by
// an in-place backward), what it reads of the forward's, and the input gradients it writes.
static void spans_backward(const Net *net, SpanBuilder *sb, int j, int t) {
    const NetNode *nd = &net->nodes[j];
    const NodeBufs *b = net->nbuf;
    const unsigned reads = node_reads(nd);
    span_read(sb, b[j].grad, t);
    if (reads & BACKWARD_READS_IN) span_read(sb, read_buffer(net, nd->in[0]), t);
    if ((reads & BACKWARD_READS_IN) && expands_input(net, j)) span_write(sb, BUF_INPUT_F32, t);
    if (reads & BACKWARD_READS_OUT) span_read(sb, read_buffer(net, j), t);
    if (inner_bytes(net, j)) span_read(sb, buf_inner(j), t);
    if (nd->kind == NODE_SWEEP) span_write(sb, buf_scratch(j), t);
    if (net->bufs[buf_wgrad(j)].bytes) span_write(sb, buf_wgrad(j), t);
    span_write(sb, buf_ws(j), t);
    if (b[j].adds) span_read(sb, b[j].din, t);  // adds to the gradient it holds
    else if (b[j].din >= 0 && b[j].din != b[j].grad) span_write(sb, b[j].din, t);  // else in place
}

// The bytes of each buffer in net->bufs (0: not used).
static void buffer_bytes(Net *net) {
    ActBuffer *buf = net->bufs;
    const size_t B = (size_t)net->batch, es = dtype_sizes[net->precision];
    const size_t numel = (size_t)shape_numel(net->input);
    const int last = net->nnodes - 1;
    bool expanded = false;
    for (int j = 0; j <= last; j++) expanded |= expands_input(net, j);
    if (net->input_bytes) {  // the bytes are the caller's on the host (net_put_input)
        buf[BUF_INPUT].bytes = align64(lut_bytes(net)) + (net->k->host_memory ? 0 : align64(B * numel));
        buf[BUF_INPUT_F32].bytes = expanded ? align64((size_t)net->exec.input_chunk * numel * sizeof(float)) : 0;
    } else {
        buf[BUF_INPUT].bytes = align64(B * numel * sizeof(float));
        buf[BUF_INPUT_F32].bytes = 0;
    }
    buf[BUF_LABELS].bytes = align64(B * sizeof(int32_t));
    static_assert(NET_METRICS_SUMSQ_OFFSET >= NET_METRICS * sizeof(float) &&
                      NET_METRICS_SUMSQ_OFFSET + sizeof(double) <= 64,
                  "the gradients' sum of squares fits beside the metrics");
    buf[BUF_METRICS].bytes = align64(NET_METRICS * sizeof(float)) + align64(sizeof(ScalerState));
    buf[BUF_DLOGP].bytes = align64(B * (size_t)shape_numel(net->nodes[last].out) * sizeof(float));
    for (int j = 0; j <= last; j++) {
        const size_t values = B * (size_t)shape_numel(net->nodes[j].out);
        buf[buf_out(j)].bytes = net->nodes[j].virt ? 0 : align64(values * (j == last ? sizeof(float) : es));
        buf[buf_inner(j)].bytes = align64(B * inner_bytes(net, j));
        buf[buf_grad(j)].bytes = align64(values * es);
        buf[buf_term(j)].bytes = align64(values * es);
        const Sweep sw = node_sweep(net, &net->nodes[j], NULL);
        buf[buf_scratch(j)].bytes = net->nodes[j].kind == NODE_SWEEP ? align64(exec_sweep_bytes(&net->exec, &sw)) : 0;
        buf[buf_wgrad(j)].bytes = net->fused_update ? align64((size_t)node_grad_floats(&net->nodes[j]) * sizeof(float)) : 0;
        buf[buf_ws(j)].bytes = align64(node_workspace_bytes(net, j));
        buf[buf_pack(j)].bytes = net->nodes[j].packed
                                     ? align64(B * (size_t)act_sample_bytes(shape_numel(net->nodes[j].out), net->exec.pack_bits))
                                     : 0;
    }
}

// The spans of every buffer over net->events, into net->spans (grouped by buffer) and
// net->bufs[b].span0 / nspans.
static int buffer_spans(Net *net, Error *err) {
    const int n = net->nnodes, nb = net->nbufs, after = net->nevents;
    SpanBuilder sb = {.open = xcalloc((size_t)nb, sizeof *sb.open, err)};
    if (!sb.open) return -1;
    for (int b = 0; b < nb; b++) sb.open[b].from = -1;
    // The trainer fills the batch and its labels, and zeroes the metrics, before the step.
    const int filled[] = {BUF_INPUT, BUF_LABELS, BUF_METRICS};
    for (size_t k = 0; k < sizeof filled / sizeof filled[0]; k++) span_write(&sb, filled[k], 0);
    for (int t = 0; t < net->nevents; t++) {
        const int j = net->events[t].node;
        switch (net->events[t].kind) {
        case EV_FORWARD:
        case EV_RECOMPUTE: spans_forward(net, &sb, j, t); break;
        case EV_LOSS:
            span_read(&sb, net->nbuf[j].out, t);
            span_read(&sb, BUF_LABELS, t);
            span_read(&sb, BUF_METRICS, t);
            span_write(&sb, BUF_DLOGP, t);
            break;
        case EV_BACKWARD: spans_backward(net, &sb, j, t); break;
        case EV_GRAD_ADD:
            span_read(&sb, net->nbuf[j].term, t);
            span_read(&sb, net->nbuf[j].grad, t);
            break;
        }
    }
    // Read after the step: those, and the output (the trainer's predictions).
    const int kept[] = {BUF_INPUT, BUF_LABELS, BUF_METRICS, net->nbuf[n - 1].out};
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
    for (int k = 0; k < sb.n; k++) net->bufs[sb.owner[k]].nspans++;
    int m = 0;
    for (int b = 0; b < nb; b++) net->bufs[b].span0 = m, m += net->bufs[b].nspans, net->bufs[b].nspans = 0;
    for (int k = 0; k < sb.n; k++) {  // each buffer's spans closed in time order, kept so
        ActBuffer *a = &net->bufs[sb.owner[k]];
        net->spans[a->span0 + a->nspans++] = sb.closed[k];
    }
    for (int b = 0; b < nb; b++) {
        ActBuffer *a = &net->bufs[b];
        a->first = a->nspans ? net->spans[a->span0].from : 0;
        a->last = a->nspans ? net->spans[a->span0 + a->nspans - 1].to : -1;
    }
    net->nspans = m;
    rc = 0;
done:
    free(sb.open), free(sb.owner), free(sb.closed);
    return rc;
}

// Whether buffers x and y (their spans in `spans`) are live at some event both.
static bool buffers_meet(const ActSpan *spans, const ActBuffer *x, const ActBuffer *y) {
    if (x->last < y->first || y->last < x->first) return false;
    const ActSpan *u = &spans[x->span0], *v = &spans[y->span0];
    for (int i = 0, j = 0; i < x->nspans && j < y->nspans;) {  // both in time order
        if (u[i].from <= v[j].to && v[j].from <= u[i].to) return true;
        if (u[i].to < v[j].to) i++;
        else j++;
    }
    return false;
}

// Where buffer b lies in the allocated activation block.
static void *buffer_at(const Net *net, int b) { return (char *)net->activations + net->bufs[b].offset; }

// Whether buffer b is live at event t.
bool net_buffer_live(const Net *net, int b, int t) {
    const ActBuffer *a = &net->bufs[b];
    if (t < a->first || t > a->last) return false;
    for (int i = 0; i < a->nspans; i++)
        if (net->spans[a->span0 + i].from <= t && t <= net->spans[a->span0 + i].to) return true;
    return false;
}

// The lengths of buffer a's spans (in `spans`), summed (an event where one span ends and
// the next begins counts twice), and the events at which it holds something (counted once).
static int buffer_span_events(const ActSpan *spans, const ActBuffer *a) {
    const ActSpan *x = &spans[a->span0];
    int n = 0;
    for (int i = 0; i < a->nspans; i++) n += x[i].to - x[i].from + 1;
    return n;
}
static int buffer_live_events(const Net *net, int b) {
    const ActBuffer *a = &net->bufs[b];
    const ActSpan *x = &net->spans[a->span0];
    int n = buffer_span_events(net->spans, a);
    for (int i = 1; i < a->nspans; i++) n -= x[i].from <= x[i - 1].to ? x[i - 1].to - x[i].from + 1 : 0;
    return n;
}

// ---- handoffs: a leaf writing its output over its input chunk by chunk --------------------
//
// A leaf's forward reads its input and writes its output, its backward reads its output
// gradient and writes its input gradient. Where what it reads is read for the last time
// there (its span ends at the event) and what it writes begins there, and a sample of the
// latter takes no more bytes than one of the former, the executor runs the leaf a chunk
// of samples at a time and writes each chunk's result, through the scratch, where the
// chunk's samples were read (nn/exec.c): the two buffers may share their bytes. So a
// convolution's input from a batchnorm that is kept compressed for backward, its output
// and the batchnorm's after it take one buffer, not three: forward's working set at
// resnet18's first stage is the block's input and one more tensor. Backward hands over
// only where it runs in chunks anyway (backward_in_chunks). Buffers that share bytes form
// a group (ActBuffer.over: its first member) placed as one buffer, as large as its largest,
// live wherever one of them is; two groups join where every event at which members of
// both are live is a handoff between them.

// The buffers event t would hand over, but for the spans' condition: x, what a leaf reads
// (its input, or its output gradient), y what it writes (its output, or its input
// gradient), y no larger a sample than x; false for any other event.
static bool handoff_pair(const Net *net, int t, int *x, int *y) {
    if (net->apart || t < 0 || t >= net->nevents) return false;
    const Event ev = net->events[t];
    const int j = ev.node, a = net->nodes[j].in[0];
    const NetNode *nd = &net->nodes[j];
    if (nd->kind != NODE_LEAF || nd->virt) return false;
    const size_t es = dtype_sizes[net->precision];
    const size_t out = (size_t)shape_numel(nd->out) * (j == net->nnodes - 1 ? sizeof(float) : es),
                 in = (size_t)shape_numel(nd->l->in) * es;  // a sample's, of the values or gradients
    if (ev.kind == EV_FORWARD || ev.kind == EV_RECOMPUTE) {
        // Not into the network's output: its input (the logits) stays readable after the step.
        if (a == NODE_INPUT || net->nodes[a].virt || j == net->nnodes - 1 || out > in) return false;
        *x = out_buffer(net, a), *y = net->nbuf[j].out;
    } else if (ev.kind == EV_BACKWARD) {
        const NodeBufs *b = &net->nbuf[j];
        if (!backward_in_chunks(net, j) || b->adds || b->din < 0 || b->din == b->grad || in > out) return false;
        *x = b->grad, *y = b->din;
    } else {
        return false;
    }
    return *x != *y;
}

// Whether one of buffer b's spans ends (starts) at event t.
static bool span_ends_at(const Net *net, int b, int t) {
    for (int i = 0; i < net->bufs[b].nspans; i++)
        if (net->spans[net->bufs[b].span0 + i].to == t) return true;
    return false;
}
static bool span_starts_at(const Net *net, int b, int t) {
    for (int i = 0; i < net->bufs[b].nspans; i++)
        if (net->spans[net->bufs[b].span0 + i].from == t) return true;
    return false;
}

bool net_handoff(const Net *net, int x, int y, int t) {
    int hx, hy;
    return handoff_pair(net, t, &hx, &hy) && hx == x && hy == y && span_ends_at(net, x, t) &&
           span_starts_at(net, y, t);
}

// The group of buffer b: its first member.
static int buffer_group(const Net *net, int b) { return net->bufs[b].over >= 0 ? net->bufs[b].over : b; }

// Whether the groups of gx and gy may share bytes: wherever members of both are live at
// once, one hands over to the other.
static bool groups_fit(const Net *net, int gx, int gy) {
    for (int m = 0; m < net->nbufs; m++) {
        if (buffer_group(net, m) != gx || !net->bufs[m].bytes) continue;
        for (int q = 0; q < net->nbufs; q++) {
            if (buffer_group(net, q) != gy || !net->bufs[q].bytes) continue;
            const ActBuffer *a = &net->bufs[m], *c = &net->bufs[q];
            const int from = a->first > c->first ? a->first : c->first, to = a->last < c->last ? a->last : c->last;
            for (int t = from; t <= to; t++)
                if (net_buffer_live(net, m, t) && net_buffer_live(net, q, t) && !net_handoff(net, m, q, t) &&
                    !net_handoff(net, q, m, t))
                    return false;
        }
    }
    return true;
}

// Sets every buffer's group (ActBuffer.over) from the schedule's handoffs, in event order.
static void buffer_handoffs(Net *net) {
    for (int b = 0; b < net->nbufs; b++) net->bufs[b].over = -1;
    for (int t = 0; t < net->nevents; t++) {
        int x, y;
        if (!handoff_pair(net, t, &x, &y) || !net->bufs[x].bytes || !net->bufs[y].bytes || !net_handoff(net, x, y, t))
            continue;
        const int gx = buffer_group(net, x), gy = buffer_group(net, y);
        if (gx == gy || !groups_fit(net, gx, gy)) continue;
        for (int b = 0; b < net->nbufs; b++)
            if (b == gy || net->bufs[b].over == gy) net->bufs[b].over = gx;
    }
}

static int cmp_span(const void *a, const void *b) {
    const ActSpan *x = a, *y = b;
    return x->from != y->from ? (x->from > y->from) - (x->from < y->from) : (x->to > y->to) - (x->to < y->to);
}

// What the placement places (NULL: out of memory): net->bufs with their spans (in
// *spans), but, `grouped`, that a group's first member is as large as its largest and live
// wherever one of them is (their spans merged) and the other members take no bytes.
static ActBuffer *placement_units(const Net *net, bool grouped, bool workspace, ActSpan **spans, Error *err) {
    const int nb = net->nbufs;
    ActBuffer *u = xcalloc((size_t)nb, sizeof *u, err);
    ActSpan *sp = xcalloc((size_t)net->nspans + 1, sizeof *sp, err);
    if (!u || !sp) {
        free(u), free(sp);
        return NULL;
    }
    int m = 0;
    for (int g = 0; g < nb; g++) {
        u[g] = net->bufs[g];
        u[g].span0 = m, u[g].nspans = 0;
        if ((grouped && net->bufs[g].over >= 0) || (!workspace && is_buf_ws(g))) u[g].bytes = 0;
        if (!u[g].bytes) continue;
        for (int b = 0; b < nb; b++) {
            if (b != g && (!grouped || net->bufs[b].over != g)) continue;
            if (net->bufs[b].bytes > u[g].bytes) u[g].bytes = net->bufs[b].bytes;
            for (int i = 0; i < net->bufs[b].nspans; i++) sp[m++] = net->spans[net->bufs[b].span0 + i];
        }
        qsort(&sp[u[g].span0], (size_t)(m - u[g].span0), sizeof *sp, cmp_span);
        int k = u[g].span0;  // merged where they meet (at a handoff's event)
        for (int i = u[g].span0 + 1; i < m; i++) {
            if (sp[i].from <= sp[k].to) {
                if (sp[i].to > sp[k].to) sp[k].to = sp[i].to;
            } else {
                sp[++k] = sp[i];
            }
        }
        m = k + 1;
        u[g].nspans = m - u[g].span0;
        u[g].first = sp[u[g].span0].from, u[g].last = sp[m - 1].to;
    }
    *spans = sp;
    return u;
}

// Places the buffers in `order` (used of them, each by its index among them in `idx`; u:
// their spans in `spans`) one by one at the lowest offset where each overlaps no placed
// buffer that is live with it (meet: a bit for each pair of indices, used x used); returns
// the highest end.
static size_t place_in_order(ActBuffer *u, const int *order, const int *idx, const uint64_t *meet, int used,
                             int *placed) {
    size_t top = 0;
    for (int k = 0; k < used; k++) {
        ActBuffer *x = &u[order[k]];
        const size_t row = (size_t)idx[order[k]] * (size_t)used;
        int nconf = 0;  // the placed buffers live with x, by offset
        for (int j = 0; j < k; j++) {
            const size_t bit = row + (size_t)idx[order[j]];
            if (!(meet[bit / 64] >> (bit % 64) & 1)) continue;
            const ActBuffer *y = &u[order[j]];
            int c = nconf++;
            for (; c > 0 && u[placed[c - 1]].offset > y->offset; c--) placed[c] = placed[c - 1];
            placed[c] = order[j];
        }
        size_t off = 0;
        for (int c = 0; c < nconf; c++) {
            const ActBuffer *y = &u[placed[c]];
            if (off + x->bytes <= y->offset) break;
            if (y->offset + y->bytes > off) off = y->offset + y->bytes;
        }
        x->offset = off;
        if (off + x->bytes > top) top = off + x->bytes;
    }
    return top;
}

typedef struct Keyed {
    double key;
    int id;
} Keyed;

static int cmp_keyed(const void *a, const void *b) {  // largest key first; ties by id
    const Keyed *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

// The executor's scratch (Exec.scratch) of `slots` slots, each holding as many samples of
// the largest activation outside a sweep as fit the table's fp16_scratch_bytes together (at
// least one, at most the batch; above the kernels' shard count a multiple of it, so that a
// layer whose shards take a share of a chunk's samples each, Winograd's, gets even shares);
// its floats a slot into *slot_values.
static size_t scratch_size(const Net *net, int slots, int64_t *slot_values) {
    const size_t largest = largest_unswept(net), per_sample = (size_t)slots * largest * sizeof(float);
    const size_t shards = (size_t)net->k->shard_count();
    size_t fit = net->k->fp16_scratch_bytes / per_sample;
    if (fit > shards) fit -= fit % shards;
    fit = fit < 1 ? 1 : fit > (size_t)net->batch ? (size_t)net->batch : fit;
    if (slot_values) *slot_values = (int64_t)(fit * largest);
    return (size_t)slots * align64(fit * largest * sizeof(float));
}

// The F32 scratch's slots where only forwards hand over (scratch_slots).
enum { F32_FORWARD_SLOTS = 2 };

// Places units u (spans in `spans`) in each of the strategies' orders, the offsets of the
// lowest end into best[]; returns that end (SIZE_MAX: out of memory). Which units are live
// together is found once, for every order.
static size_t place_units(const Net *net, ActBuffer *u, const ActSpan *spans, int *order, int *placed, Keyed *keyed,
                          size_t *best, Error *err) {
    const int nb = net->nbufs;
    int used = 0;
    int *idx = xcalloc((size_t)nb, sizeof *idx, err);
    if (!idx) return SIZE_MAX;
    for (int b = 0; b < nb; b++)
        if (u[b].bytes) order[used] = b, idx[b] = used++;
    uint64_t *meet = xcalloc(((size_t)used * (size_t)used + 63) / 64 + 1, sizeof *meet, err);
    if (!meet) {
        free(idx);
        return SIZE_MAX;
    }
    for (int i = 0; i < used; i++)
        for (int j = 0; j < i; j++)
            if (buffers_meet(spans, &u[order[i]], &u[order[j]])) {
                const size_t ij = (size_t)i * used + j, ji = (size_t)j * used + i;
                meet[ij / 64] |= (uint64_t)1 << (ij % 64), meet[ji / 64] |= (uint64_t)1 << (ji % 64);
            }
    size_t top = SIZE_MAX;
    for (int strategy = 0; strategy < 4; strategy++) {
        for (int k = 0; k < used; k++) {
            const int b = order[k];
            const double bytes = (double)u[b].bytes, events = buffer_span_events(spans, &u[b]);
            keyed[k] = (Keyed){strategy == 0   ? bytes
                               : strategy == 1 ? bytes * events
                               : strategy == 2 ? -(double)u[b].first * 1e15 + bytes
                                               : bytes * sqrt(events * (u[b].last - u[b].first + 1)),
                               b};
        }
        qsort(keyed, (size_t)used, sizeof *keyed, cmp_keyed);
        for (int k = 0; k < used; k++) order[k] = keyed[k].id;
        const size_t end = place_in_order(u, order, idx, meet, used, placed);
        if (end < top) {
            top = end;
            for (int b = 0; b < nb; b++) best[b] = u[b].offset;
        }
    }
    free(idx), free(meet);
    return top;
}

// Places every used buffer (bytes > 0) greedily (TFLite's memory planner's placement: each
// at the lowest offset where it overlaps no placed buffer live with it), in each of a few
// orders: largest first; largest over the most events first (bytes x events); the earliest
// first; bytes x the square root of its events times its lifetime (short-lived workspaces
// and long-lived compressed records apart); and keeps the placement with the lowest end.
// Placed in up to four ways, the cheapest kept:
//   - the handoffs' groups placed as one buffer each, or apart (counting, in F32 without
//     compressed activations, the scratch that handoffs need): a group live over many
//     events may leave holes that its members apart would not;
//   - each node's layer workspace in the block (live at the node's events), or the largest
//     apart in the workspace block: the block's holes at a node hold its workspace where
//     the greedy placement finds room.
// Sets plan.activations (that end), net->block_cost and plan.act_kept
// (the bytes live at the loss). Ties keep the first way (groups, the workspace apart) and
// id order, so a plan is the same every time.
static int place_buffers(Net *net, Error *err) {
    const int nb = net->nbufs;
    int *order = xcalloc((size_t)nb, sizeof *order, err), *placed = xcalloc((size_t)nb, sizeof *placed, err);
    Keyed *keyed = xcalloc((size_t)nb, sizeof *keyed, err);
    size_t *best = xcalloc((size_t)nb, sizeof *best, err), *offsets = xcalloc((size_t)nb, sizeof *offsets, err);
    bool grouped = false;
    size_t ws_apart = 0;
    for (int b = 0; b < nb; b++) {
        grouped |= net->bufs[b].over >= 0;
        if (is_buf_ws(b) && net->bufs[b].bytes > ws_apart) ws_apart = net->bufs[b].bytes;
    }
    const size_t group_scratch =
        net->precision == DT_F32 && !net->exec.pack_bits ? scratch_size(net, F32_FORWARD_SLOTS, NULL) : 0;
    size_t cost = SIZE_MAX, top = 0;
    bool keep_groups = false, ws_in = false;
    int rc = -1;
    if (!order || !placed || !keyed || !best || !offsets) goto done;
    for (int way = 0; way < 4; way++) {
        const bool g = !(way & 1), w = (way & 2) != 0;
        if ((g && !grouped) || (w && (!ws_apart || net->workspace_apart))) continue;
        ActSpan *spans = NULL;
        ActBuffer *u = placement_units(net, g, w, &spans, err);
        if (!u) goto done;
        const size_t end = place_units(net, u, spans, order, placed, keyed, offsets, err);
        free(u), free(spans);
        if (end == SIZE_MAX) goto done;
        const size_t c = end + (g ? group_scratch : 0) + (w ? 0 : ws_apart);
        if (c < cost) {
            cost = c, top = end, keep_groups = g, ws_in = w;
            memcpy(best, offsets, (size_t)nb * sizeof *best);
        }
    }
    if (!keep_groups)
        for (int b = 0; b < nb; b++) net->bufs[b].over = -1;
    for (int b = 0; b < nb; b++) {
        if (!ws_in && is_buf_ws(b)) net->bufs[b].bytes = 0;  // layer_workspace serves
        net->bufs[b].offset = best[buffer_group(net, b)];
    }
    net->plan.activations = top;
    net->block_cost = top + (ws_in ? 0 : ws_apart);
    net->plan.act_kept = net->plan.act_packed = 0;
    for (int b = 0; b < nb; b++)
        if (net->bufs[b].bytes && net_buffer_live(net, b, net->nnodes)) {
            net->plan.act_kept += net->bufs[b].bytes;
            if (b >= BUF_NODES && b == buf_pack((b - BUF_NODES) / BUFS_A_NODE)) net->plan.act_packed += net->bufs[b].bytes;
        }
    rc = 0;
done:
    free(order), free(placed), free(keyed), free(best), free(offsets);
    return rc;
}

// The executor's scratch slots (Exec.scratch): halves use the four of exec.h; F32 three
// where a backward reads compressed activations (an input and an output read back, an
// input gradient apart: handoffs and adds in backward come only with those), two where
// only forwards hand over (an output apart, slot 1), none elsewhere.
static int scratch_slots(const Net *net) {
    if (precision_is_half(net->precision)) return 4;
    if (net->exec.pack_bits) return 3;
    for (int b = 0; b < net->nbufs; b++)
        if (net->bufs[b].over >= 0) return F32_FORWARD_SLOTS;
    return 0;
}

// The executor's precision and scratch (Exec.slot_values); its bytes.
static size_t exec_scratch(Net *net) {
    net->exec.precision = net->precision;
    net->exec.slot_values = 0;
    const int slots = scratch_slots(net);
    return slots ? scratch_size(net, slots, &net->exec.slot_values) : 0;
}

// Plans the activation block for the current segments: schedule, spans, offsets.
static int net_plan_activations(Net *net, Error *err) {
    const int n = net->nnodes;
    free(net->nbuf);
    net->nbuf = xcalloc((size_t)n, sizeof *net->nbuf, err);
    if (!net->nbuf || net_schedule(net, err)) return -1;
    free(net->bufs);
    net->nbufs = BUF_NODES + BUFS_A_NODE * n;
    net->bufs = xcalloc((size_t)net->nbufs, sizeof *net->bufs, err);
    if (!net->bufs) return -1;
    // The layers' chunks, which size their workspace (node_workspace_bytes): F32 layers take
    // the whole batch; halves and compressed reads have their scratch's slots whatever the
    // placement (scratch_slots reads the buffers only for F32's handoffs).
    if (precision_is_half(net->precision) || net->exec.pack_bits) exec_scratch(net);
    else net->exec.precision = net->precision;
    buffer_bytes(net);
    if (buffer_spans(net, err)) return -1;
    for (int b = 0; b < net->nbufs; b++)  // a buffer nothing uses needs no bytes
        if (!net->bufs[b].nspans) net->bufs[b].bytes = 0;
    buffer_handoffs(net);
    return place_buffers(net, err);
}

// Points every activation buffer into the block at `base`.
static void net_carve_activations(Net *net, char *base) {
    char *at[net->nbufs];
    for (int b = 0; b < net->nbufs; b++) at[b] = net->bufs[b].bytes ? base + net->bufs[b].offset : NULL;
    if (net->input_bytes) {
        net->input_lut = (float *)at[BUF_INPUT];
        net->input_u8 = net->k->host_memory ? NULL : (uint8_t *)at[BUF_INPUT] + align64(lut_bytes(net));
        net->exec.input_f32 = (float *)at[BUF_INPUT_F32];  // NULL with halves: the scratch serves
    } else {
        net->input_buf = (float *)at[BUF_INPUT];
    }
    net->labels = (int32_t *)at[BUF_LABELS];
    net->metrics = (float *)at[BUF_METRICS];
    net->scaler = (ScalerState *)(at[BUF_METRICS] + align64(NET_METRICS * sizeof(float)));
    net->grad_sumsq = (double *)(at[BUF_METRICS] + NET_METRICS_SUMSQ_OFFSET);
    net->dlogp = (float *)at[BUF_DLOGP];
    for (int j = 0; j < net->nnodes; j++) {
        const NodeBufs *b = &net->nbuf[j];
        net->acts[j] = at[b->out];
        net->grad[j] = b->grad >= 0 ? at[b->grad] : NULL;
        net->term[j] = b->term >= 0 ? at[b->term] : NULL;
        net->scratch[j] = at[buf_scratch(j)];
        net->packs[j] = at[buf_pack(j)];
        if (inner_bytes(net, j)) net->nodes[j].l->inner = at[buf_inner(j)];
    }
}

// Computes the rest of net->plan (workspace, parameters, gradients, optimizer state) and
// the scratch of the executor.
static void net_layout(Net *net) {
    // Layers run on the whole batch in fp32, on chunks through the scratch in fp16 (and
    // where scratch_slots says). The workspace block holds the scratch (then only) and
    // then the layers' workspace, where the activation block does not hold each node's.
    const size_t ws = exec_scratch(net);
    net->scratch_bytes = ws;
    size_t layer_ws = 0;  // the largest node's, in the activation block where it holds them
    bool in_block = false;
    for (int j = 0; j < net->nnodes; j++) {
        const size_t w = node_workspace_bytes(net, j);
        if (w > layer_ws) layer_ws = w;
        in_block |= net->bufs[buf_ws(j)].bytes > 0;
    }
    net->plan.act_workspace = in_block ? layer_ws : 0;
    net->plan.workspace = ws + (in_block ? 0 : layer_ws);
    net->plan.threads = net->k->thread_scratch ? net->k->thread_scratch() : 0;
    net->plan.params = (size_t)net->nparams * sizeof(float);
    net->plan.grads_unfused = (size_t)net->ntrain * sizeof(float);
    net->plan.grads = net->fused_update ? 0 : net->plan.grads_unfused;  // fused: in the activation block
    net->plan.optimizer =
        net->opt_format == STATE_INT8
            ? net_opt_absmax_offset(net) + (size_t)net->nstates * (size_t)net->nblocks * sizeof(float)
            : (size_t)net->nstates * (size_t)net->ntrain * state_format_bytes(net->opt_format);
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

// The bytes live at each event, summed over the step: a plan's second measure, so that of
// two cuts with the same block the one that holds less for less long is taken.
static double plan_area(const Net *net) {
    double area = 0;  // whole numbers below 2^53: the same in any order
    for (int b = 0; b < net->nbufs; b++) area += (double)net->bufs[b].bytes * buffer_live_events(net, b);
    return area;
}

// Checkpoint segments (DESIGN.md decision 6) over the nodes, so a segment may begin inside
// a block. A cut before node e keeps the outputs that cross it (read at or after e, made
// before: inside a block the block's input too) from forward to backward; the others, with
// the inner activations of all a segment's nodes, are recomputed in backward. A cut is
// judged by the activation block its plan needs (net_plan_activations). The candidates
// come from a simpler model: the kept outputs plus the largest segment's recomputed bytes,
// for each limit on the latter the cut of the fewest kept bytes (seg_fit); the best one is
// then improved by moving single cuts by a node. So the big early activations of an image
// network (ResNet's 112x112 stem) get segments of their own instead of an equal share.
typedef struct SegCost {
    int n;
    const size_t *kept;     // (n + 1) kept[e]: the bytes of the outputs that cross a cut before
                            // node e (kept[n]: the network's output)
    const size_t *scratch;  // (n + 1) x (n + 1): scratch[s * (n + 1) + e], the bytes of the
                            // outputs and inner activations of nodes s .. e-1 that the
                            // segment recomputes (those that do not cross e)
} SegCost;

static size_t seg_scratch(const SegCost *c, int s, int e) { return c->scratch[s * (c->n + 1) + e]; }

// The limits on a segment's scratch whose cuts net_segments plans (distinct ones, spread
// over those some cut meets): with all of them, no shipped model's block came out smaller
// (resnet18/34/50, mobilenet_v2, deep, resnet-small; sqrt, fp16, 4 segments).
enum { SEG_LIMITS = 64 };

// The fewest kept bytes over exactly S segments whose scratch is at most limit (SIZE_MAX
// if none); first[] gets the cut. dp is (S + 1) * (n + 1) sums and from the same of
// arg-mins; lo (n + 1) ints.
static size_t seg_fit(const SegCost *c, int S, size_t limit, size_t *dp, int *from, int *lo, int *first) {
    const int n = c->n;
    for (int k = 0; k <= S; k++)
        for (int j = 0; j <= n; j++) dp[k * (n + 1) + j] = SIZE_MAX;
    dp[0] = 0;
    for (int j = 1; j <= n; j++) {  // a segment's scratch shrinks as its start moves up
        lo[j] = j;
        while (lo[j] > 0 && seg_scratch(c, lo[j] - 1, j) <= limit) lo[j]--;
    }
    for (int k = 1; k <= S; k++)
        for (int j = k; j <= n; j++)
            for (int i = lo[j] > k - 1 ? lo[j] : k - 1; i < j; i++) {  // the segments i .. j-1 that fit
                const size_t before = dp[(k - 1) * (n + 1) + i];
                if (before == SIZE_MAX) continue;
                const size_t v = before + c->kept[j];
                if (v < dp[k * (n + 1) + j]) dp[k * (n + 1) + j] = v, from[k * (n + 1) + j] = i;
            }
    const size_t best = dp[S * (n + 1) + n];
    if (best == SIZE_MAX) return best;
    first[S] = n;
    for (int k = S; k > 0; k--) first[k - 1] = from[k * (n + 1) + first[k]];
    return best;
}

// The plans of the cuts tried so far, so that none is planned twice (a cut's plan is the
// same every time): open addressing on a hash of the cut.
typedef struct CutMemo {
    int width;            // ints a cut (segments + 1)
    size_t n, cap;        // cuts stored; slots (a power of two, more than twice n)
    int *cuts;            // (cap / 2) x width
    size_t *cost;         // (cap / 2) each cut's Net.block_cost
    double *area;         // (cap / 2) and plan_area
    size_t *slot;         // (cap) an index into the above plus one; 0: empty
} CutMemo;

static size_t cut_hash(const int *cut, int width) {
    uint64_t h = 1469598103934665603u;  // FNV-1a over the ints
    for (int i = 0; i < width; i++) h = (h ^ (uint32_t)cut[i]) * 1099511628211u;
    return (size_t)h;
}

static size_t *memo_find(const CutMemo *m, const int *cut) {
    size_t i = cut_hash(cut, m->width) & (m->cap - 1);
    for (; m->slot[i]; i = (i + 1) & (m->cap - 1))
        if (!memcmp(&m->cuts[(m->slot[i] - 1) * (size_t)m->width], cut, (size_t)m->width * sizeof *cut)) break;
    return &m->slot[i];
}

static int memo_grow(CutMemo *m, Error *err) {
    const size_t cap = m->cap ? 2 * m->cap : 1024, half = cap / 2;
    int *cuts = realloc(m->cuts, half * (size_t)m->width * sizeof *cuts);
    if (cuts) m->cuts = cuts;
    size_t *cost = realloc(m->cost, half * sizeof *cost);
    if (cost) m->cost = cost;
    double *area = realloc(m->area, half * sizeof *area);
    if (area) m->area = area;
    size_t *slot = xcalloc(cap, sizeof *slot, err);
    if (!cuts || !cost || !area || !slot) {
        free(slot);
        if (!err->msg[0]) err_set(err, "out of host memory planning the checkpoint segments");
        return -1;
    }
    free(m->slot);
    m->slot = slot, m->cap = cap;
    for (size_t k = 0; k < m->n; k++) *memo_find(m, &m->cuts[k * (size_t)m->width]) = k + 1;
    return 0;
}

static void memo_free(CutMemo *m) { free(m->cuts), free(m->cost), free(m->area), free(m->slot); }

// The block_cost and plan_area of the segments starting at cut[0 .. S], planned once per
// cut.
static int plan_cut(Net *net, CutMemo *m, const int *cut, size_t *cost, double *area, Error *err) {
    if (2 * (m->n + 1) > m->cap && memo_grow(m, err)) return -1;
    size_t *slot = memo_find(m, cut);
    if (!*slot) {
        memcpy(net->seg_first, cut, (size_t)m->width * sizeof *cut);
        if (net_plan_activations(net, err)) return -1;
        memcpy(&m->cuts[m->n * (size_t)m->width], cut, (size_t)m->width * sizeof *cut);
        m->cost[m->n] = net->block_cost, m->area[m->n] = plan_area(net);
        *slot = ++m->n;
    }
    *cost = m->cost[*slot - 1], *area = m->area[*slot - 1];
    return 0;
}

static int cmp_size(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

// The search of net_segments over the cuts that `limits` (nlimits of them) give, then single
// moves: the cut with the smallest block_cost it finds (of two as small, the one with the
// least area) into best_cut.
static int search_cuts(Net *net, const SegCost *c, int S, const size_t *limits, size_t nlimits, size_t *dp,
                       int *from, int *lo, int *cut, int *best_cut, Error *err) {
    const int n = net->nnodes;
    CutMemo memo = {.width = S + 1};
    int rc = -1;
    size_t best = SIZE_MAX, cost;
    double best_area = INFINITY, area;
    for (size_t t = 0; t < nlimits; t++) {
        if (seg_fit(c, S, limits[t], dp, from, lo, cut) == SIZE_MAX) continue;
        if (plan_cut(net, &memo, cut, &cost, &area, err)) goto done;
        if (cost < best || (cost == best && area < best_area)) {
            best = cost, best_area = area;
            memcpy(best_cut, cut, ((size_t)S + 1) * sizeof *cut);
        }
    }
    // Then moves single cuts (a cut taken out, one put in at another node) while that
    // shrinks the block (or keeps it and shortens what is live): between its neighbours
    // while that finds one, then anywhere for a smaller block (where one is found, back to
    // the neighbours), so the cut it stops at has no smaller block by any single move. The
    // best cuts of a segment of large tensors often lie several nodes from the model's.
    for (bool wide = false;;) {
        bool moved = false;
        for (int k = 1; k < S; k++)
            for (int at = wide ? 1 : best_cut[k - 1] + 1; at < (wide ? n : best_cut[k + 1]); at++) {
                bool taken = false;
                for (int m = 1; m < S; m++) taken |= best_cut[m] == at;
                if (taken) continue;
                int w = 0;  // best_cut without cut k, with `at`, in order
                for (int m = 0; m <= S; m++) {
                    if (m == k) continue;
                    if (at < best_cut[m] && (w == 0 || cut[w - 1] < at)) cut[w++] = at;
                    cut[w++] = best_cut[m];
                }
                if (plan_cut(net, &memo, cut, &cost, &area, err)) goto done;
                if (cost < best || (!wide && cost == best && area < best_area)) {
                    best = cost, best_area = area;
                    memcpy(best_cut, cut, ((size_t)S + 1) * sizeof *cut);
                    moved = true;
                }
            }
        if (!moved && wide) break;
        wide = !moved;
    }
    rc = 0;
done:
    memo_free(&memo);
    return rc;
}

// Splits the nodes into `segments` segments (NET_SEGMENTS_SQRT: round(sqrt(nodes)); at
// most one segment per node) at the candidate cut whose activation block (with the layers'
// workspace, where it is apart) is smallest, and plans the activations for it.
static int net_segments(Net *net, int segments, Error *err) {
    const int n = net->nnodes, last = n - 1;
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
    const size_t square = (size_t)(n + 1) * (n + 1);
    size_t *out = xcalloc((size_t)n, sizeof *out, err), *kept = xcalloc((size_t)n + 1, sizeof *kept, err);
    size_t *scratch = xcalloc(square, sizeof *scratch, err);
    size_t *limits = xcalloc(npairs, sizeof *limits, err), *dp = xcalloc(cells, sizeof *dp, err);
    int *reach = xcalloc((size_t)n, sizeof *reach, err), *lo = xcalloc((size_t)n + 1, sizeof *lo, err);
    int *from = xcalloc(cells, sizeof *from, err), *cut = xcalloc((size_t)S + 1, sizeof *cut, err);
    int *best_cut = xcalloc((size_t)S + 1, sizeof *best_cut, err);
    int rc = -1;
    if (!out || !kept || !scratch || !limits || !dp || !reach || !lo || !from || !cut || !best_cut) goto done;
    for (int p = 0; p < n; p++) {
        out[p] = align64(B * (size_t)shape_numel(net->nodes[p].out) * (p == last ? sizeof(float) : es));
        reach[p] = p == last ? n : last_consumer(net, p);  // crosses the cuts in (p, reach[p]]
    }
    for (int e = 1; e <= n; e++)
        for (int p = 0; p < e; p++)
            if (reach[p] >= e) kept[e] += out[p];
    for (int s = 0; s < n; s++)
        for (int e = s + 1; e <= n; e++) {
            size_t v = 0;
            for (int p = s; p < e; p++) v += (reach[p] >= e ? 0 : out[p]) + align64(B * inner_bytes(net, p));
            scratch[s * (n + 1) + e] = v;
        }
    const SegCost c = {n, kept, scratch};
    size_t m = 0;
    for (int s = 0; s < n; s++)
        for (int e = s + 1; e <= n; e++) limits[m++] = seg_scratch(&c, s, e);
    qsort(limits, m, sizeof *limits, cmp_size);
    size_t distinct = 0;
    for (size_t t = 0; t < m; t++)
        if (!t || limits[t] != limits[t - 1]) limits[distinct++] = limits[t];
    size_t feasible = 0, hi = distinct;  // the smallest limit some cut meets (they grow with it)
    while (feasible < hi) {
        const size_t mid = feasible + (hi - feasible) / 2;
        if (seg_fit(&c, S, limits[mid], dp, from, lo, cut) == SIZE_MAX) feasible = mid + 1;
        else hi = mid;
    }
    m = distinct - feasible;
    if (m > SEG_LIMITS) {  // spread by rank from the smallest feasible to the largest
        for (size_t t = 0; t < SEG_LIMITS; t++) limits[t] = limits[feasible + t * (m - 1) / (SEG_LIMITS - 1)];
        m = SEG_LIMITS;
    } else {
        memmove(limits, limits + feasible, m * sizeof *limits);
    }
    // The search plans with the layers' workspace apart (a placement with every node's
    // workspace in it costs twice the time, and the moves' search plans hundreds of cuts);
    // the plan of the cut it finds takes the workspace into the block where that is smaller.
    const bool workspace_apart = net->workspace_apart;
    net->workspace_apart = true;
    const int failed = search_cuts(net, &c, S, limits, m, dp, from, lo, cut, best_cut, err);
    net->workspace_apart = workspace_apart;
    if (failed) goto done;
    memcpy(net->seg_first, best_cut, ((size_t)S + 1) * sizeof *cut);
    rc = net_plan_activations(net, err);
done:
    free(out), free(kept), free(scratch), free(limits), free(dp), free(reach), free(lo), free(from), free(cut);
    free(best_cut);
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

// The layer whose output node j's is: a leaf's, a sweep's last member, a sum's block.
static const Layer *node_layer(const Net *net, int j) {
    const NetNode *nd = &net->nodes[j];
    return nd->kind == NODE_LEAF ? nd->l : nd->kind == NODE_SWEEP ? nd->chain[nd->nchain - 1] : net->layers[nd->top];
}

// Whether opt->compress_skip names node j's layer (or a module above it).
static bool compress_skipped(const Net *net, const NetOptions *opt, int j) {
    for (int f = 0; f < opt->ncompress_skip; f++)
        if (within(node_layer(net, j)->name, opt->compress_skip[f])) return true;
    return false;
}

// With compressed activations, checks that compress_skip names layers and marks the nodes
// whose outputs may be compressed (NetNode.compress), which are kept compressed where
// they are jit instead of being recomputed in backward (from an input that would have to
// stay exact for it).
static int net_compress_nodes(Net *net, const Cfg *cfg, const NetOptions *opt, Error *err) {
    for (int f = 0; f < opt->ncompress_skip; f++) {
        bool found = false;
        for (int i = 0; i < net->nmodules; i++) found |= within(net->modules[i]->name, opt->compress_skip[f]);
        if (!found)
            return err_set(err, "%s: compress_skip names '%s', but the network has no layer of that "
                                "name (see the table of layers ./train prints)", cfg->path, opt->compress_skip[f]);
    }
    for (int j = 0; opt->compress && j < net->nnodes; j++)
        if (!compress_skipped(net, opt, j)) net->nodes[j].compress = true, net->nodes[j].jit = false;
    return 0;
}

// Marks the modules that opt->freeze names (and the batchnorms among them, with
// freeze_stats), and finds the first node with a trained parameter.
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
    net->first_trained = net->nnodes;
    for (int j = net->nnodes - 1; j >= 0; j--)
        if (node_trained(&net->nodes[j])) net->first_trained = j;
    return 0;
}

const char *const matmul_names[MATMUL_COUNT] = {"auto", "fp32", "tf32", "bf16"};

static GemmArith net_gemm_arith(Matmul matmul, DType precision) {
    switch (matmul) {
    case MATMUL_FP32: return GEMM_FP32;
    case MATMUL_TF32: return GEMM_TF32;
    case MATMUL_BF16: return GEMM_BF16;
    default: return precision == DT_BF16 ? GEMM_BF16 : precision == DT_F16 ? GEMM_TF32 : GEMM_FP32;
    }
}

int net_create(Net *net, const Cfg *cfg, Shape input, int classes, const NetOptions *opt,
               const Kernels *k, Error *err) {
    memset(net, 0, sizeof *net);
    net->k = k;
    net->input = input;
    net->batch = opt->batch;
    net->precision = opt->precision;
    net->exec.precision = opt->precision;  // sweeps' scratch is planned by it
    net->input_bytes = opt->input_bytes;
    net->gemm_arith = net_gemm_arith(opt->matmul, opt->precision);
    if (opt->batch < 1 || (opt->precision != DT_F32 && !precision_is_half(opt->precision))) {
        err_set(err, "net_create: batch %d and precision %s: expected batch >= 1 and F32, F16 or BF16",
                opt->batch, dtype_names[opt->precision]);
        goto fail;
    }
    if ((unsigned)opt->opt_format >= STATE_FORMAT_COUNT) {
        err_set(err, "net_create: optimizer state format %d: expected fp32, bf16 or int8",
                (int)opt->opt_format);
        goto fail;
    }
    if (opt->compress && !act_bits_valid(opt->compress)) {
        err_set(err, "net_create: compressed activations of %d bits: expected 2, 4 or 8", opt->compress);
        goto fail;
    }
    net->exec.pack_bits = opt->compress;
    if (opt->fused_update && opt->precision == DT_F16) {
        err_set(err, "net_create: the fused update does not run with fp16: its loss scaler must "
                     "see every gradient before it decides whether the step is taken");
        goto fail;
    }
    net->fused_update = opt->fused_update;
    net->recompute_1x1 = opt->recompute_1x1;
    net->apart = opt->apart;
    net->workspace_apart = opt->workspace_apart;
    k->gemm_arith(net->gemm_arith);  // the layers' choices ask the kernels under it (LayerArgs.k)
    if (net_build_layers(net, cfg, input, classes, err) || net_build_nodes(net, err) ||
        net_compress_nodes(net, cfg, opt, err) ||
        (opt->sweep && net_fuse_sweeps(net, opt->sweep_bytes ? opt->sweep_bytes : (size_t)8 << 20, err)) ||
        net_freeze(net, cfg, opt, err))
        goto fail;
    net->nstates = opt->opt_states;
    net->state_names = opt->opt_state_names;
    net->opt_format = opt->opt_format;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        net->ntrained_modules += layer_trains(l);
        for (int j = 0; j < LAYER_MAX_PARAMS; j++) l->train_off[j] = -1;
        for (int j = 0; j < l->nparams; j++) {
            const int64_t n = tensor_numel(&l->params[j]);
            l->train_off[j] = l->frozen ? -1 : net->ntrain;
            l->state_block[j] = l->frozen ? -1 : net->nblocks;
            net->nparams += n;
            if (!l->frozen) net->ntrain += n, net->nblocks += quant_blocks(n);
        }
    }
    net->exec.input_c = input.c;  // planned by the cuts' search too
    net->exec.input_chunk = net->input_bytes ? net_input_chunk(net) : 0;
    if (net_segments(net, opt->segments, err)) goto fail;
    net_layout(net);
    net_layout_buffers(net, NULL);
    if (opt->plan_only) return 0;

    net->acts = xcalloc((size_t)net->nnodes, sizeof *net->acts, err);
    net->grad = xcalloc((size_t)net->nnodes, sizeof *net->grad, err);
    net->term = xcalloc((size_t)net->nnodes, sizeof *net->term, err);
    net->scratch = xcalloc((size_t)net->nnodes, sizeof *net->scratch, err);
    net->packs = xcalloc((size_t)net->nnodes, sizeof *net->packs, err);
    if (!net->acts || !net->grad || !net->term || !net->scratch || !net->packs) goto fail;
    if (!(net->params = device_block(k, net->plan.params, "parameter", err)) ||
        (net->plan.grads && !(net->grads = device_block(k, net->plan.grads, "gradient", err))) ||
        !(net->optimizer = device_block(k, net->plan.optimizer, "optimizer state", err)) ||
        !(net->buffers = device_block(k, net->plan.buffers, "buffer", err)) ||
        !(net->activations = device_block(k, net->plan.activations, "activation", err)) ||
        !(net->workspace = device_block(k, net->plan.workspace, "workspace", err)))
        goto fail;
    net_carve_activations(net, net->activations);
    if (net->input_bytes) {
        if (!(net->lut_host = xcalloc(lut_bytes(net), 1, err))) goto fail;
        for (size_t i = 0; i < lut_bytes(net) / sizeof(float); i++) net->lut_host[i] = NAN;
        net->exec.lut = net->input_lut;
    }
    const ScalerState unscaled = {.scale = 1.0};
    k->upload(net->scaler, &unscaled, sizeof unscaled);
    net_layout_buffers(net, net->buffers);
    const int slots = scratch_slots(net);
    for (int i = 0; i < slots && net->scratch_bytes; i++)
        net->exec.scratch[i] = (float *)((char *)net->workspace + i * (net->scratch_bytes / slots));
    net->layer_workspace = (char *)net->workspace + net->scratch_bytes;
    // Gradients in state_dict order, or (fused) each node's modules' in its buffer of the
    // activation block, one after the other.
    int64_t off = 0;
    for (int i = 0; i < net->nmodules; i++) {
        Layer *l = net->modules[i];
        int64_t goff = l->train_off[0];
        for (int j = 0; j < l->nparams; j++) {
            l->params[j].data = net->params + off;
            l->grads[j] = l->frozen || net->fused_update ? NULL : net->grads + goff;
            off += tensor_numel(&l->params[j]);
            goff += tensor_numel(&l->params[j]);
        }
    }
    for (int j = 0; net->fused_update && j < net->nnodes; j++) {  // each node's in its buffer
        Layer *const *ls;
        float *g = buffer_at(net, buf_wgrad(j));
        for (int i = 0; i < node_layers(&net->nodes[j], &ls); i++) {
            if (!layer_trains(ls[i])) continue;
            for (int t = 0; t < ls[i]->nparams; t++) {
                ls[i]->grads[t] = g;
                g += tensor_numel(&ls[i]->params[t]);
            }
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
    free(net->nodes);
    free(net->acts);
    free(net->grad);
    free(net->term);
    free(net->scratch);
    free(net->packs);
    free(net->seg_first);
    free(net->events);
    free(net->bufs);
    free(net->nbuf);
    free(net->spans);
    free(net->lut_host);
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
    // Drawn straight into the parameters where the device's memory is the host's (the
    // CPU), else into a host chunk that is uploaded as it fills: nothing outside the plan
    // but that chunk (a host copy of every parameter was resnet18's 44.7 MB, the peak of a
    // run's start).
    enum { CHUNK = 1 << 16 };  // floats
    const bool direct = net->k->host_memory;
    float *chunk = direct ? NULL : xcalloc(CHUNK, sizeof(float), err);
    if (!direct && !chunk) return -1;
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
            const double fan = (double)l->fan_in;
            const double bound = init == INIT_WEIGHT ? sqrt(3.0) * (sqrt(2.0 / (1 + a * a)) / sqrt(fan))
                                                     : 1 / sqrt(fan);
            for (int64_t e0 = 0; e0 < n; e0 += direct ? n : CHUNK) {
                const int64_t m = direct || n - e0 < CHUNK ? n - e0 : CHUNK;
                float *dst = direct ? net->params + off + e0 : chunk;
                if (init == INIT_ONES || init == INIT_ZEROS) {
                    for (int64_t e = 0; e < m; e++) dst[e] = init == INIT_ONES ? 1.0f : 0.0f;
                } else {
                    for (int64_t e = 0; e < m; e++) dst[e] = mt19937_uniform(&mt, (float)-bound, (float)bound);
                }
                if (!direct) net->k->upload(net->params + off + e0, chunk, (size_t)m * sizeof(float));
            }
            off += n;
        }
    }
    free(chunk);
    return net_reset_buffers(net, err);
}

static LayerCtx net_ctx(const Net *net, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    return (LayerCtx){.k = net->k, .exec = &net->exec, .workspace = net->layer_workspace,
                      .seed = seed, .step = step, .sample0 = sample0, .train = train};
}

// Node p's output as stored (NODE_INPUT: the network's input, F32 or bytes); the
// network's output is F32.
static Stored node_out(const Net *net, int p) {
    if (p == NODE_INPUT)
        return net->input_bytes ? (Stored){.p = (void *)net->input_u8, .kind = STORED_U8} : (Stored){.p = net->input_buf, .kind = STORED_F32};
    Stored s = stored_in(net->acts[p], p == net->nnodes - 1 || net->precision == DT_F32);
    if (net->nodes[p].virt) s.via = net->nodes[p].l;  // acts[p]: its input's buffer
    return s;
}

void net_put_input(Net *net, const uint8_t *px, const float *lut, int n) {
    // The table changes with the data's mean and std only: compared here, uploaded rarely.
    if (memcmp(net->lut_host, lut, lut_bytes(net))) {
        memcpy(net->lut_host, lut, lut_bytes(net));
        net->k->upload(net->input_lut, lut, lut_bytes(net));
    }
    if (net->k->host_memory) net->input_u8 = px;
    else net->k->upload((void *)net->input_u8, px, (size_t)n * (size_t)shape_numel(net->input));
}

static Stored stored(const Net *net, void *p) { return stored_in(p, net->precision == DT_F32); }

// The probe's clock (Exec.costs): the device's queued work done first.
static double net_clock(const Net *net) {
    if (net->k->sync) net->k->sync();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double net_start(const Net *net) { return net->exec.costs ? net_clock(net) : 0; }

// The probe charges node j's work since t0: a sweep's under its first member, the
// elementwise work by its values (`values`).
static void net_charge(const Net *net, int j, CallKind kind, int N, double t0) {
    if (!net->exec.costs) return;
    const NetNode *nd = &net->nodes[j];
    const double s = net_clock(net) - t0;
    if (nd->kind == NODE_SWEEP) cost_record(net->exec.costs, nd->chain[0], kind, N, s);
    else cost_record(net->exec.costs, NULL, kind, (double)N * (double)shape_numel(nd->out), s);
}

// Where a backward reads node p's output: its records where it is compressed.
static Stored node_read(const Net *net, int p) {
    if (p == NODE_INPUT || !net->nodes[p].packed) return node_out(net, p);
    return (Stored){.p = net->packs[p], .kind = STORED_PACKED};
}

// Node j's output compressed into its records, with the random bits of (seed, step, its
// layer): the same wherever the node runs (a recomputation, a sweep's chain or not).
static void pack_node(Net *net, int j, const LayerCtx *ctx, int N) {
    const double t0 = net_start(net);
    const uint64_t key = rng_key(ctx->seed, RNG_STREAM_ACTIVATIONS, ctx->step, (uint64_t)node_layer(net, j)->index);
    exec_pack(ctx, net->packs[j], node_out(net, j), shape_numel(net->nodes[j].out), N, key);
    net_charge(net, j, ctx->recompute ? CALL_SWEEP_RECOMPUTE : CALL_SWEEP_FORWARD, N, t0);
}

// ctx for node j's events: its workspace in the activation block where it is there.
static LayerCtx node_ctx(const Net *net, int j, const LayerCtx *ctx) {
    LayerCtx c = *ctx;
    if (net->bufs[buf_ws(j)].bytes) c.workspace = buffer_at(net, buf_ws(j));
    return c;
}

static void forward_node(Net *net, int j, const LayerCtx *ctx_in, int N) {
    const LayerCtx node = node_ctx(net, j, ctx_in), *ctx = &node;
    const NetNode *nd = &net->nodes[j];
    const double t0 = net_start(net);
    if (nd->virt) {
        exec_forward_stats(ctx, nd->l, node_out(net, nd->in[0]), N);
        return;
    }
    if (nd->kind == NODE_LEAF) {
        exec_forward(ctx, nd->l, node_out(net, j), node_out(net, nd->in[0]), N);  // timed by the executor
    } else if (nd->kind == NODE_SWEEP) {
        const Sweep sw = node_sweep(net, nd, net->scratch[j]);
        exec_sweep_forward(ctx, &sw, node_out(net, j), node_out(net, nd->in[0]), N);
    } else {
        exec_add_act(ctx, node_out(net, j), node_out(net, nd->in[0]), node_out(net, nd->in[1]),
                     shape_numel(nd->out), N, nd->act);
    }
    if (nd->kind != NODE_LEAF) net_charge(net, j, ctx->recompute ? CALL_SWEEP_RECOMPUTE : CALL_SWEEP_FORWARD, N, t0);
    if (ctx->train && packs(net, j, ctx->recompute)) pack_node(net, j, ctx, N);  // evaluation packs nothing
}

// Node j's backward: a leaf's (its input gradient to where the plan routed it: its input's
// gradient, or that gradient's second term), or a sum's: its output gradient through its
// activation, in place, which its inputs then share as theirs.
static void backward_node(Net *net, int j, const LayerCtx *ctx_in, int N) {
    const LayerCtx node = node_ctx(net, j, ctx_in), *ctx = &node;
    const NetNode *nd = &net->nodes[j];
    const Stored none = {.kind = STORED_F32}, dout = j == net->nnodes - 1 ? (Stored){.p = net->dlogp, .kind = STORED_F32}
                                                                   : stored(net, net->grad[j]);
    const double t0 = net_start(net);
    if (nd->kind == NODE_SUM) {
        exec_act_backward(ctx, dout, node_read(net, j), shape_numel(nd->out), N, nd->act);
        net_charge(net, j, CALL_SWEEP_BACKWARD, N, t0);
        return;
    }
    // What backward does not read is not passed: its buffer may hold another's by now.
    const unsigned reads = node_reads(nd);
    const NodeBufs *b = &net->nbuf[j];
    const int p = nd->in[0];
    void *dst = b->din < 0 ? NULL : !b->adds && b->din == net->nbuf[p].term ? net->term[p] : net->grad[p];
    if (nd->kind == NODE_SWEEP) {
        const Sweep sw = node_sweep(net, nd, net->scratch[j]);
        exec_sweep_backward(ctx, &sw, stored(net, dst), dout, node_out(net, p), N);
        net_charge(net, j, CALL_SWEEP_BACKWARD, N, t0);
        return;
    }
    // Its input gradient over its output gradient's bytes: in place, or at a handoff.
    const DinMode mode = b->adds ? DIN_ADD : dst == dout.p && b->din != b->grad ? DIN_OVER_DOUT : DIN_WRITE;
    exec_backward(ctx, nd->l, stored(net, dst), dout,
                  reads & BACKWARD_READS_IN ? node_read(net, p) : none,
                  reads & BACKWARD_READS_OUT ? node_read(net, j) : none, N, mode);
}

void net_forward(Net *net, int N, bool train, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, train, seed, step, sample0);
    net->k->gemm_arith(net->gemm_arith);
    for (int j = 0; j < net->nnodes; j++) {
        if (net->on_layer) net->on_layer(net->nodes[j].top, false);
        forward_node(net, j, &ctx, N);
    }
}

void net_loss(Net *net, int N, int denominator, bool grad) {
    const NetNode *out = &net->nodes[net->nnodes - 1];
    const double t0 = net_start(net);
    net->k->nll_loss(grad ? net->dlogp : NULL, net->metrics, net_output(net), net->labels, N,
                     out->out.c, 1.0f / (float)denominator, grad ? net->label_smoothing : 0.0f,
                     net->scaler);
    if (net->exec.costs) {
        CallCost *c = &net->exec.costs->loss;
        c->seconds += net_clock(net) - t0, c->samples += N, c->calls += 1;
    }
}

// Node j's backward is done: its trained modules' gradients are complete and their
// parameters read for the last time this step (GradHook).
static void node_done(Net *net, int j) {
    GradHook *h = &net->hook;
    Layer *const *ls;
    for (int i = node_layers(&net->nodes[j], &ls) - 1; i >= 0 && h->ready && !h->failed; i--)
        if (layer_trains(ls[i]) && h->ready(h->arg, ls[i])) h->failed = true;
}

void net_backward(Net *net, int N, uint64_t seed, uint64_t step, int64_t sample0) {
    const LayerCtx ctx = net_ctx(net, true, seed, step, sample0);
    net->k->gemm_arith(net->gemm_arith);
    LayerCtx redo = ctx;  // recomputations: the same dropout masks and batch statistics
    redo.recompute = true;
    for (int e = net->nnodes + 1; e < net->nevents; e++) {
        const Event ev = net->events[e];
        if (net->on_layer) net->on_layer(net->nodes[ev.node].top, ev.kind != EV_RECOMPUTE);
        switch (ev.kind) {
        case EV_RECOMPUTE: forward_node(net, ev.node, &redo, N); break;
        case EV_BACKWARD: {
            LayerCtx c = ctx;
            if (net->bufs[buf_wgrad(ev.node)].bytes) {  // the fused update's gradients start at zero
                net->k->zero(buffer_at(net, buf_wgrad(ev.node)), net->bufs[buf_wgrad(ev.node)].bytes);
                c.grads_zero = true;
            }
            backward_node(net, ev.node, &c, N);
            node_done(net, ev.node);
            break;
        }
        case EV_GRAD_ADD: {
            const double t0 = net_start(net);
            const Stored g = stored(net, net->grad[ev.node]);
            exec_add_act(&ctx, g, g, stored(net, net->term[ev.node]), shape_numel(net->nodes[ev.node].out),
                         N, ACT_NONE);
            if (net->exec.costs)
                cost_record(net->exec.costs, NULL, CALL_FORWARD, (double)N * (double)shape_numel(net->nodes[ev.node].out),
                            net_clock(net) - t0);
            break;
        }
        default: break;
        }
    }
}

void net_zero_grads(Net *net) {
    if (net->plan.grads) net->k->zero(net->grads, net->plan.grads);
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

bool net_batch_coupled(const Net *net) {
    for (int i = 0; i < net->nmodules; i++) {
        const Layer *l = net->modules[i];
        if (l->ops->forward_reduce && !l->frozen_stats) return true;
    }
    return false;
}
