// optim.c: the optimizers and the schedule of optim.h.
#include "optim.h"

#include <math.h>
#include <string.h>

const char *const optim_names[OPTIM_COUNT] = {"adadelta", "sgd", "adamw"};
static_assert(OPTIM_COUNT == 3, "optim_names must list every OptimKind");
const char *const schedule_names[SCHEDULE_COUNT] = {"step", "cosine"};
static_assert(SCHEDULE_COUNT == 2, "schedule_names must list every ScheduleKind");

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
}

// One kernel call over n parameters from p (gradients at g, the states laid out as them).
static void step_span(const Net *net, const Optimizer *o, double lr, uint64_t step, float *p,
                      float *g, int64_t n, double wd) {
    const Kernels *k = net->k;
    // The scalars as PyTorch computes them, in double, then rounded to float as its
    // kernels take them.
    switch (o->kind) {
    case OPTIM_ADADELTA:
        k->adadelta_step(p, net_opt_state(net, g, 0), net_opt_state(net, g, 1), g, n, (float)lr,
                         (float)o->rho, (float)o->eps, (float)wd, net->scaler);
        break;
    case OPTIM_SGD:
        k->sgd_step(p, o->momentum != 0.0 ? net_opt_state(net, g, 0) : NULL, g, n, (float)lr,
                    (float)o->momentum, (float)(1 - o->dampening), (float)wd, o->nesterov,
                    net->scaler, step);
        break;
    case OPTIM_ADAMW: {
        const AdamWHyper h = {.lr = lr, .weight_decay = wd, .beta1 = o->beta1, .beta2 = o->beta2,
                              .eps = o->eps};
        k->adamw_step(p, net_opt_state(net, g, 0), net_opt_state(net, g, 1), g, n, h, net->scaler,
                      step);
        break;
    }
    default:
        break;
    }
}

// The updates are elementwise, so neighbouring tensors with the same weight decay are one
// kernel call (one launch on a GPU, one parallel loop on the CPU): usually the whole
// network. A frozen tensor between two (its parameters lie between theirs, it has no
// gradient) or a change of weight decay (decay_skip_norm_bias) starts a new one.
void optim_step(const Net *net, const Optimizer *o, const ScalerRules *scaling, double lr,
                uint64_t step) {
    if (scaling) net->k->unscale_check(net->grads, net->ntrain, net->scaler);
    float *p0 = NULL, *g0 = NULL;
    int64_t n0 = 0;
    double wd0 = 0;
    for (int m = 0; m < net->nmodules; m++) {
        const Layer *l = net->modules[m];
        for (int j = 0; j < l->nparams; j++) {
            float *g = l->grads[j];
            if (!g) continue;  // frozen
            float *p = l->params[j].data;
            const int64_t n = tensor_numel(&l->params[j]);
            const double wd = o->decay_skip_norm_bias && l->params[j].ndim <= 1 ? 0.0 : o->weight_decay;
            if (n0 && p == p0 + n0 && g == g0 + n0 && wd == wd0) {
                n0 += n;
                continue;
            }
            if (n0) step_span(net, o, lr, step, p0, g0, n0, wd0);
            p0 = p, g0 = g, n0 = n, wd0 = wd;
        }
    }
    if (n0) step_span(net, o, lr, step, p0, g0, n0, wd0);
    if (scaling) net->k->scaler_update(net->scaler, *scaling);
}

double schedule_lr(const Schedule *s, double lr0, int64_t t, int epoch) {
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
