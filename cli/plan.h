// plan.h: the memory plan as ./train prints it, and what `memory =` chooses to fit a
// budget (nn/budget.h) or the machine, with the messages that say so.
#ifndef CLI_PLAN_H
#define CLI_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "../data/dataset.h"
#include "../nn/budget.h"
#include "../nn/cfg.h"
#include "../nn/net.h"
#include "options.h"

// What `memory =` considered and chose, for --plan --json.
typedef struct BudgetReport {
    FitChoice *plans;
    int n, chosen;       // chosen: -1 when the run fits as configured (nothing probed)
    double plain;        // the run as configured, seconds a step (estimated)
    double probe;        // the probe's wall time
    int probe_steps;
} BudgetReport;

// The plan of net (net->plan, on its device), and with `available` (SIZE_MAX: unknown)
// what the device can still give (`source` says whence). `baseline` is the process's own
// memory before the plan (the CPU), or the GPU's use once set up (its context, cuBLAS's
// workspace). With the fused update the gradients line says what they would take without
// it; with compressed activations, the activations' line what their codes take.
void plan_print(const Net *net, size_t baseline, size_t available, const char *source, bool json,
                const BudgetReport *budget);

// With `memory = SIZE`: when the run as configured does not fit device k with `overhead`
// beside the plan, lists the plans of the budget (nn/budget.h), times the smallest that
// fits with a probe of a few steps, and changes *opt and *accumulate to the fastest that
// fits: says what it chose, its estimated step against the run as configured's, and what it
// changes in the training when it changes more than float rounding (only with the user's
// leave); an error when nothing fits, naming what would with which leave, and whether
// prefetch = 1 would (`prefetch1_saves`: the bytes it takes off the overhead). *r: what it
// considered (the caller frees r->plans).
int plan_apply_budget(const Options *o, const Kernels *k, const Cfg *cfg, const Dataset *train,
                      int classes, size_t overhead, size_t prefetch1_saves, NetOptions *opt,
                      int *accumulate, BudgetReport *r, Error *err);

// The error for a plan larger than the machine can give: what would fit instead (the
// budget's smallest plan, with the leave it needs and what it changes), or that nothing
// does.
void plan_refuse_too_big(const Options *o, const Kernels *k, const Cfg *cfg,
                         const Dataset *train, int classes, NetOptions opt, int accumulate,
                         const MemPlan *plan, size_t available, const char *source, Error *err);

#endif
