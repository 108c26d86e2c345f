// cost.c: the time of a step under a plan, from a probe's timings (cost.h).
#include "cost.h"

#include <stdlib.h>
#include <string.h>

int cost_init(CostTable *t, const Net *net, Error *err) {
    memset(t, 0, sizeof *t);
    t->nlayers = net->nmodules;
    t->call = xcalloc((size_t)t->nlayers, sizeof *t->call, err);
    return t->call ? 0 : -1;
}

void cost_free(CostTable *t) {
    free(t->call);
    memset(t, 0, sizeof *t);
}

static void add(CallCost *c, double n, double seconds) {
    c->seconds += seconds, c->samples += n, c->calls += 1;
}

void cost_record(CostTable *t, const Layer *l, CallKind kind, double n, double seconds) {
    if (!l) add(&t->value, n, seconds);
    else if (l->index >= 0 && l->index < t->nlayers) add(&t->call[l->index][kind], n, seconds);
}

// The current step of c into its best at `size`, and cleared for the next.
static void fold(CallCost *c, int size, bool first) {
    if (c->calls > 0 && (first || c->calls_at[size] == 0 || c->seconds < c->best[size])) {
        c->best[size] = c->seconds;
        c->samples_at[size] = c->samples;
        c->calls_at[size] = c->calls;
    }
    c->seconds = c->samples = c->calls = 0;
}

// seconds = fixed * calls + per * samples through the two sizes' best steps; where they
// cannot tell the two apart (calls in proportion to samples: sweeps' chunks), or one size
// is missing, all per sample.
static void fit(CallCost *c) {
    const double c0 = c->calls_at[0], c1 = c->calls_at[1], s0 = c->samples_at[0], s1 = c->samples_at[1];
    const double det = c0 * s1 - c1 * s0;
    c->fixed = c->per = 0;
    if (c0 > 0 && c1 > 0 && det > 1e-9 * c0 * s1) {
        c->fixed = (c->best[0] * s1 - c->best[1] * s0) / det;
        c->per = (c0 * c->best[1] - c1 * c->best[0]) / det;
        if (c->fixed >= 0 && c->per >= 0) return;
    }
    const double s = s0 + s1, b = (c0 > 0 ? c->best[0] : 0) + (c1 > 0 ? c->best[1] : 0);
    c->fixed = 0;
    c->per = s > 0 ? b / s : 0;
}

static void end_step(CostTable *t, int size) {
    const bool first = t->steps < 2;
    for (int i = 0; i < t->nlayers; i++)
        for (int k = 0; k < CALL_KINDS; k++) fold(&t->call[i][k], size, first);
    fold(&t->value, size, first);
    fold(&t->loss, size, first);
    t->steps++;
}

int cost_probe(CostTable *t, Net *net, int classes, int steps, Error *err) {
    const int N = net->batch;
    const int64_t numel = (int64_t)N * shape_numel(net->input);
    // Any inputs: the kernels' time does not depend on them. As the trainer gives them:
    // fp32 values, or bytes and their table.
    const size_t lut_values = (size_t)net->input.c * 256;
    float *x = xcalloc(net->input_bytes ? lut_values : (size_t)numel, sizeof *x, err);
    uint8_t *px = net->input_bytes ? xcalloc((size_t)numel, 1, err) : NULL;
    int32_t *y = xcalloc((size_t)N, sizeof *y, err);
    if (!x || !y || (net->input_bytes && !px)) {
        free(x), free(px), free(y);
        return -1;
    }
    uint64_t r = 0x9e3779b97f4a7c15ULL;
    for (int64_t i = 0; i < numel; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        if (px) px[i] = (uint8_t)(r >> 56);
        else x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < N; i++) y[i] = i % classes;
    if (px) {
        for (size_t i = 0; i < lut_values; i++) x[i] = (float)(i % 256) / 127.5f - 1.0f;
        net_put_input(net, px, x, N);
    } else {
        net->k->upload(net->input_buf, x, (size_t)numel * sizeof *x);
    }
    net->k->upload(net->labels, y, (size_t)N * sizeof *y);
    free(x), free(y);  // px: the network may read it where it is (net_put_input)
    const int sizes[2] = {N, N > 1 ? N / 2 : 1};
    for (int s = 0; s < steps; s++) {
        const int size = s % 2, n = sizes[size];
        net->exec.costs = s >= 2 ? t : NULL;  // one step of each size warms up
        net->k->zero(net->metrics, NET_METRICS * sizeof(float));
        net_forward(net, n, true, 1, (uint64_t)s, 0);
        net_loss(net, n, n, true);
        net_backward(net, n, 1, (uint64_t)s, 0);
        if (s >= 2) end_step(t, size);
    }
    net->exec.costs = NULL;
    free(px);
    for (int i = 0; i < t->nlayers; i++)
        for (int k = 0; k < CALL_KINDS; k++) fit(&t->call[i][k]);
    fit(&t->value);
    fit(&t->loss);
    return 0;
}

// A call of n samples (values) of this kind.
static double cost_of(const CallCost *c, double n) { return c->fixed + c->per * n; }

static double layer_cost(const CostTable *t, const Layer *l, CallKind kind, double n) {
    return cost_of(&t->call[l->index][kind], n);
}

// A sweep the probe did not time: its members once each (a lower bound: the passes of
// its batch statistics and of backward's recomputation come on top).
static double members(const CostTable *t, const NetNode *nd, bool backward, double n) {
    double s = 0;
    for (int i = 0; i < nd->nchain; i++) {
        const Layer *l = nd->chain[i];
        s += backward ? layer_cost(t, l, CALL_BACKWARD, n) + layer_cost(t, l, CALL_BACKWARD_REDUCE, n)
                      : layer_cost(t, l, CALL_FORWARD, n) + layer_cost(t, l, CALL_FORWARD_REDUCE, n);
    }
    return s;
}

static bool timed(const CostTable *t, const Layer *l, CallKind kind) {
    const CallCost *c = &t->call[l->index][kind];
    return c->calls_at[0] > 0 || c->calls_at[1] > 0;
}

double cost_step(const CostTable *t, const Net *plan, int accumulate) {
    const double N = plan->batch;
    double s = cost_of(&t->loss, N);
    for (int e = 0; e < plan->nevents; e++) {
        const Event ev = plan->events[e];
        const NetNode *nd = &plan->nodes[ev.node];
        const double values = N * (double)shape_numel(nd->out);
        switch (ev.kind) {
        case EV_FORWARD:
        case EV_RECOMPUTE: {
            const bool first = ev.kind == EV_FORWARD;
            if (nd->kind == NODE_LEAF) {
                s += layer_cost(t, nd->l, CALL_FORWARD, N) + (first ? layer_cost(t, nd->l, CALL_FORWARD_REDUCE, N) : 0);
            } else if (nd->kind == NODE_SWEEP) {
                const CallKind k = first ? CALL_SWEEP_FORWARD : CALL_SWEEP_RECOMPUTE;
                s += timed(t, nd->chain[0], k) ? layer_cost(t, nd->chain[0], k, N) : members(t, nd, false, N);
            } else {
                s += cost_of(&t->value, values);
            }
            break;
        }
        case EV_BACKWARD:
            if (nd->kind == NODE_LEAF) {
                s += layer_cost(t, nd->l, CALL_BACKWARD, N) + layer_cost(t, nd->l, CALL_BACKWARD_REDUCE, N);
            } else if (nd->kind == NODE_SWEEP) {
                s += timed(t, nd->chain[0], CALL_SWEEP_BACKWARD) ? layer_cost(t, nd->chain[0], CALL_SWEEP_BACKWARD, N)
                                                                 : members(t, nd, true, N);
            } else if (nd->act != ACT_NONE) {
                s += cost_of(&t->value, values);
            }
            break;
        case EV_GRAD_ADD: s += cost_of(&t->value, values); break;
        default: break;
        }
    }
    return s * accumulate;
}
