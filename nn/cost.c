// cost.c: the time of a step under a plan, from a probe's timings (cost.h).
#include "cost.h"

#include <stdlib.h>
#include <string.h>

int cost_init(CostTable *t, const Net *net, Error *err) {
    memset(t, 0, sizeof *t);
    t->nlayers = net->nmodules;
    t->seconds = xcalloc((size_t)t->nlayers, sizeof *t->seconds, err);
    t->samples = xcalloc((size_t)t->nlayers, sizeof *t->samples, err);
    t->rate = xcalloc((size_t)t->nlayers, sizeof *t->rate, err);
    if (t->seconds && t->samples && t->rate) return 0;
    cost_free(t);
    return -1;
}

void cost_free(CostTable *t) {
    free(t->seconds);
    free(t->samples);
    free(t->rate);
    memset(t, 0, sizeof *t);
}

void cost_record(CostTable *t, const Layer *l, CallKind kind, double n, double seconds) {
    if (!l) {
        t->value_seconds += seconds, t->values += n;
        return;
    }
    if (l->index < 0 || l->index >= t->nlayers) return;
    t->seconds[l->index][kind] += seconds;
    t->samples[l->index][kind] += n;
}

// The least of a and b, b counting only where it was measured (n > 0).
static double least(double a, double seconds, double n, int steps) {
    if (n <= 0) return a;
    const double r = seconds / n;
    return steps == 0 || a <= 0 || r < a ? r : a;
}

// Folds the current step's timings into the rates, and clears them for the next.
static void cost_end_step(CostTable *t, int N) {
    for (int i = 0; i < t->nlayers; i++)
        for (int k = 0; k < CALL_KINDS; k++)
            t->rate[i][k] = least(t->rate[i][k], t->seconds[i][k], t->samples[i][k], t->steps);
    t->value_rate = least(t->value_rate, t->value_seconds, t->values, t->steps);
    t->fixed_rate = least(t->fixed_rate, t->fixed, N, t->steps);
    memset(t->seconds, 0, (size_t)t->nlayers * sizeof *t->seconds);
    memset(t->samples, 0, (size_t)t->nlayers * sizeof *t->samples);
    t->value_seconds = t->values = t->fixed = 0;
    t->steps++;
}

// Seconds a sample of layer l's calls of `kind` (0: never timed).
static double rate(const CostTable *t, const Layer *l, CallKind kind) { return t->rate[l->index][kind]; }

static double value_rate(const CostTable *t) { return t->value_rate; }

int cost_probe(CostTable *t, Net *net, int classes, int steps, Error *err) {
    const int N = net->batch;
    const int64_t numel = (int64_t)N * shape_numel(net->input);
    float *x = xcalloc((size_t)numel, sizeof *x, err);
    int32_t *y = xcalloc((size_t)N, sizeof *y, err);
    if (!x || !y) {
        free(x), free(y);
        return -1;
    }
    uint64_t r = 0x9e3779b97f4a7c15ULL;  // any inputs: the kernels' time does not depend on them
    for (int64_t i = 0; i < numel; i++) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    for (int i = 0; i < N; i++) y[i] = i % classes;
    net->k->upload(net->input_buf, x, (size_t)numel * sizeof *x);
    net->k->upload(net->labels, y, (size_t)N * sizeof *y);
    free(x), free(y);
    for (int s = 0; s < steps; s++) {
        net->exec.costs = s ? t : NULL;  // the first step warms up
        net->k->zero(net->metrics, NET_METRICS * sizeof(float));
        net_forward(net, N, true, 1, (uint64_t)s, 0);
        net_loss(net, N, N, true);
        net_backward(net, N, 1, (uint64_t)s, 0);
        if (s) cost_end_step(t, N);
    }
    net->exec.costs = NULL;
    return 0;
}

// A sweep the probe did not time: its members once each (a lower bound: the passes of
// its batch statistics and of backward's recomputation come on top).
static double members(const CostTable *t, const NetNode *nd, bool backward) {
    double s = 0;
    for (int i = 0; i < nd->nchain; i++) {
        const Layer *l = nd->chain[i];
        s += backward ? rate(t, l, CALL_BACKWARD) + rate(t, l, CALL_BACKWARD_REDUCE)
                      : rate(t, l, CALL_FORWARD) + rate(t, l, CALL_FORWARD_REDUCE);
    }
    return s;
}

double cost_step(const CostTable *t, const Net *plan, int accumulate) {
    const double N = plan->batch;
    double s = t->fixed_rate * N;
    for (int e = 0; e < plan->nevents; e++) {
        const Event ev = plan->events[e];
        const NetNode *nd = &plan->nodes[ev.node];
        const double values = N * (double)shape_numel(nd->out);
        switch (ev.kind) {
        case EV_FORWARD:
        case EV_RECOMPUTE: {
            const bool first = ev.kind == EV_FORWARD;
            if (nd->kind == NODE_LEAF) {
                s += N * (rate(t, nd->l, CALL_FORWARD) + (first ? rate(t, nd->l, CALL_FORWARD_REDUCE) : 0));
            } else if (nd->kind == NODE_SWEEP) {
                const double r = rate(t, nd->chain[0], first ? CALL_SWEEP_FORWARD : CALL_SWEEP_RECOMPUTE);
                s += N * (r > 0 ? r : members(t, nd, false));
            } else {
                s += values * value_rate(t);
            }
            break;
        }
        case EV_BACKWARD:
            if (nd->kind == NODE_LEAF) {
                s += N * (rate(t, nd->l, CALL_BACKWARD) + rate(t, nd->l, CALL_BACKWARD_REDUCE));
            } else if (nd->kind == NODE_SWEEP) {
                const double r = rate(t, nd->chain[0], CALL_SWEEP_BACKWARD);
                s += N * (r > 0 ? r : members(t, nd, true));
            } else if (nd->act != ACT_NONE) {
                s += values * value_rate(t);
            }
            break;
        case EV_GRAD_ADD: s += values * value_rate(t); break;
        default: break;
        }
    }
    return s * accumulate;
}
