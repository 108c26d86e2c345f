// optim.c: the optimizers and the schedule of optim.h.
#include "optim.h"

#include <math.h>
#include <string.h>

const char *const optim_names[OPTIM_COUNT] = {"adadelta", "sgd", "adamw"};
static_assert(OPTIM_COUNT == 3, "optim_names must list every OptimKind");
const char *const schedule_names[SCHEDULE_COUNT] = {"step", "cosine", "onecycle", "plateau"};
static_assert(SCHEDULE_COUNT == 4, "schedule_names must list every ScheduleKind");

static const char *const adadelta_states[] = {"square_avg", "acc_delta"};
static const char *const sgd_states[] = {"momentum_buffer"};
static const char *const adamw_states[] = {"exp_avg", "exp_avg_sq"};

int optim_nstates(const Optimizer *o) {
    switch (o->kind) {
    case OPTIM_SGD: return o->momentum != 0.0 ? 1 : 0;
    case OPTIM_ADAMW: return 2;
    default: return 2;
    }
}

const char *const *optim_state_names(const Optimizer *o) {
    return o->kind == OPTIM_SGD ? sgd_states : o->kind == OPTIM_ADAMW ? adamw_states : adadelta_states;
}

bool optim_state_nonnegative(const char *state_name) {
    return !strcmp(state_name, "square_avg") || !strcmp(state_name, "acc_delta") ||
           !strcmp(state_name, "exp_avg_sq");
}

void optim_plan(const Optimizer *o, NetOptions *opt) {
    opt->opt_states = optim_nstates(o);
    opt->opt_state_names = optim_state_names(o);
    opt->opt_format = o->state_format;
}

const char *const state_format_names[STATE_FORMAT_COUNT] = {"fp32", "bf16", "int8"};
static_assert(STATE_FORMAT_COUNT == 3, "state_format_names must list every StateFormat");

// A run of neighbouring trained tensors that one kernel call updates: n parameters from p,
// their gradients from g, their optimizer state from that of trained parameter j of
// module l (the run's first), one weight decay.
typedef struct Span {
    float *p, *g;
    const Layer *l;
    int j;
    int64_t n;
    double wd;
} Span;

// One kernel call over span s.
static void step_span(const Net *net, const Optimizer *o, double lr, uint64_t step, const Span *s) {
    const Kernels *k = net->k;
    // The scalars as PyTorch computes them, in double, then rounded to float as its
    // kernels take them.
    const AdamWHyper h = {.lr = lr, .weight_decay = s->wd, .beta1 = o->beta1, .beta2 = o->beta2,
                          .eps = o->eps};
    if (net->opt_format != STATE_F32) {
        const StepScalars r = {
            .rule = o->kind == OPTIM_ADADELTA ? RULE_ADADELTA : o->kind == OPTIM_SGD ? RULE_SGD : RULE_ADAMW,
            .lr = (float)lr, .rho = (float)o->rho, .eps = (float)o->eps, .weight_decay = (float)s->wd,
            .momentum = (float)o->momentum, .one_minus_dampening = (float)(1 - o->dampening),
            .nesterov = o->nesterov, .adamw = h};
        const PackedState s1 = net->nstates > 1 ? net_opt_state(net, s->l, s->j, 1) : (PackedState){0};
        k->optim_step_packed(s->p, net_opt_state(net, s->l, s->j, 0), s1, s->g, s->n,
                             net->opt_format, r, net->scaler, step);
        return;
    }
    float *st0 = net_opt_state(net, s->l, s->j, 0).codes, *st1 = st0 + (size_t)net->ntrain;
    switch (o->kind) {
    case OPTIM_ADADELTA:
        k->adadelta_step(s->p, st0, st1, s->g, s->n, (float)lr, (float)o->rho, (float)o->eps,
                         (float)s->wd, net->scaler);
        break;
    case OPTIM_SGD:
        k->sgd_step(s->p, o->momentum != 0.0 ? st0 : NULL, s->g, s->n, (float)lr,
                    (float)o->momentum, (float)(1 - o->dampening), (float)s->wd, o->nesterov,
                    net->scaler, step);
        break;
    case OPTIM_ADAMW:
        k->adamw_step(s->p, st0, st1, s->g, s->n, h, net->scaler, step);
        break;
    default:
        break;
    }
}

// Adds module l's trained tensors to the run *s, stepping the run first where one cannot
// continue it: the updates are elementwise, so neighbouring tensors with the same weight
// decay are one kernel call (one launch on a GPU, one parallel loop on the CPU). A frozen
// tensor between two (its parameters lie between theirs, it has no gradient or state), a
// gradient elsewhere (the fused update's block), a change of weight decay
// (decay_skip_norm_bias) or int8 state (its blocks start at each tensor's first value)
// starts a new one. Each element's arithmetic is the same however the tensors are
// grouped: the same scalars go to every call of a step.
static void add_module(const Net *net, const Optimizer *o, double lr, uint64_t step, Span *s,
                       const Layer *l) {
    for (int j = 0; j < l->nparams; j++) {
        float *g = l->grads[j];
        if (!g) continue;  // frozen
        float *p = l->params[j].data;
        const int64_t n = tensor_numel(&l->params[j]);
        const double wd = o->decay_skip_norm_bias && l->params[j].ndim <= 1 ? 0.0 : o->weight_decay;
        if (s->n && p == s->p + s->n && g == s->g + s->n &&
            l->train_off[j] == s->l->train_off[s->j] + s->n && wd == s->wd &&
            net->opt_format != STATE_INT8) {
            s->n += n;
            continue;
        }
        if (s->n) step_span(net, o, lr, step, s);
        *s = (Span){p, g, l, j, n, wd};
    }
}

void optim_step(const Net *net, const Optimizer *o, const ScalerRules *scaling, double lr,
                uint64_t step) {
    const Kernels *k = net->k;
    if (scaling) k->unscale_check(net->grads, net->ntrain, net->scaler);
    if (o->clip_grad_norm > 0) {  // on the device: nothing waits for the norm
        k->sum_squares(net->grad_sumsq, net->grads, net->ntrain);
        k->clip_scale(net->grads, net->ntrain, net->grad_sumsq, (float)o->clip_grad_norm);
    }
    Span s = {0};
    for (int m = 0; m < net->nmodules; m++) add_module(net, o, lr, step, &s, net->modules[m]);
    if (s.n) step_span(net, o, lr, step, &s);
    if (scaling) k->scaler_update(net->scaler, *scaling);
}

void optim_step_module(const Net *net, const Optimizer *o, const Layer *m, double lr,
                       uint64_t step) {
    Span s = {0};
    add_module(net, o, lr, step, &s, m);
    if (s.n) step_span(net, o, lr, step, &s);
}

// ReduceLROnPlateau's fixed settings (PyTorch's defaults): the relative threshold of an
// improvement, and the smallest change of the lr it makes.
#define PLATEAU_THRESHOLD 1e-4
#define PLATEAU_EPS 1e-8

// OneCycleLR's _annealing_cos, in its order of operations: from start (pct 0) to end (1).
static double anneal_cos(double start, double end, double pct) {
    return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
}

// Where step t lies in OneCycleLR's two phases: true in the rise, false in the fall, *pct
// its fraction of the phase, as PyTorch works them out (the rise ends at step
// pct_start * total - 1, a double). A rise that ends at step 0 is none: PyTorch would
// divide by zero there.
static bool onecycle_rising(const Schedule *s, int64_t t, double *pct) {
    const double rise_end = s->pct_start * (double)s->total - 1;
    if ((double)t <= rise_end && rise_end > 0) {
        *pct = (double)t / rise_end;
        return true;
    }
    *pct = ((double)t - rise_end) / ((double)(s->total - 1) - rise_end);
    return false;
}

static double onecycle_lr(const Schedule *s, double max_lr, int64_t t) {
    const double initial = max_lr / s->div_factor, min_lr = initial / s->final_div_factor;
    double pct;
    return onecycle_rising(s, t, &pct) ? anneal_cos(initial, max_lr, pct)
                                       : anneal_cos(max_lr, min_lr, pct);
}

static double plateau_lr(const Schedule *s, double lr0, int64_t reductions) {
    double lr = lr0;
    for (int64_t i = 0; i < reductions; i++) lr = fmax(lr * s->factor, s->lr_min);
    return lr;
}

double schedule_lr(const Schedule *s, double lr0, int64_t t, int epoch, int64_t reductions) {
    if (s->kind == SCHEDULE_ONECYCLE) return onecycle_lr(s, lr0, t);
    if (s->kind == SCHEDULE_PLATEAU) return plateau_lr(s, lr0, reductions);
    const double w = t < s->warmup
                         ? s->warmup_start + (1 - s->warmup_start) * (double)t / (double)s->warmup
                         : 1.0;
    if (s->kind == SCHEDULE_COSINE) {
        if (t < s->warmup) return lr0 * w;
        const int64_t span = s->total - s->warmup;
        const double f = span > 0 ? (double)(t - s->warmup) / (double)span : 1.0;
        return s->lr_min + (lr0 - s->lr_min) * (1 + cos(M_PI * (f < 1 ? f : 1))) / 2;
    }
    double lr = lr0;
    for (int e = 0; e < epoch; e++) lr *= s->gamma;
    return lr * w;
}

Optimizer schedule_optimizer(const Schedule *s, const Optimizer *o, int64_t t) {
    Optimizer stepped = *o;
    if (s->kind != SCHEDULE_ONECYCLE || !s->cycle_momentum) return stepped;
    double pct;
    const double m = onecycle_rising(s, t, &pct) ? anneal_cos(s->max_momentum, s->base_momentum, pct)
                                                 : anneal_cos(s->base_momentum, s->max_momentum, pct);
    if (o->kind == OPTIM_SGD) stepped.momentum = m;
    else if (o->kind == OPTIM_ADAMW) stepped.beta1 = m;
    return stepped;
}

bool plateau_step(const Schedule *s, Plateau *p, double lr0, double loss) {
    if (loss < p->best * (1 - PLATEAU_THRESHOLD)) {
        p->best = loss;
        p->bad_epochs = 0;
    } else {
        p->bad_epochs++;
    }
    if (p->bad_epochs <= s->patience) return false;
    p->bad_epochs = 0;
    const double lr = plateau_lr(s, lr0, p->reductions);
    if (lr - fmax(lr * s->factor, s->lr_min) <= PLATEAU_EPS) return false;
    p->reductions++;
    return true;
}
