// budget.h: the changes that make a training run fit a memory budget (`memory = 512M`).
#ifndef NN_BUDGET_H
#define NN_BUDGET_H

#include <stdbool.h>

#include "net.h"

typedef struct FitChoice {
    NetOptions net;  // batch here is the micro-batch
    int accumulate;
    MemPlan plan;    // the network's plan for this choice (loader not included)
} FitChoice;

// Plans for device k without allocating, in this order of preference, and takes the first
// that fits mem_plan_on(plan, k) + overhead <= budget (overhead: on the CPU the loader
// buffers and the process's own baseline; on a GPU the device's baseline):
//   1. the run as configured (base, base_accumulate);
//   2. checkpoint = sqrt (unless already checkpointed), if it makes the plan smaller (a
//      network whose peak lies in the backward of its largest layers gains nothing);
//   3. with it (or without), accumulate = each divisor of batch above base_accumulate,
//      smallest first;
//   4. if allow_fp16 and base is fp32: precision = fp16 with each of 2 and 3.
// The fused update (base.fused_update) stays on where a choice keeps one batch in fp32 and
// goes off where it does not (micro-batches and fp16 need every gradient before the step).
// *fits says whether one did; if none, *out is the smallest plan of them all. Errors come
// from building the network (a bad cfg).
int fit_budget(const Cfg *cfg, const Kernels *k, Shape input, int classes, int batch,
               NetOptions base, int base_accumulate, size_t overhead, size_t budget,
               bool allow_fp16, FitChoice *out, bool *fits, Error *err);

// The memory this process can still take on this machine, in bytes: the least of the
// kernel's MemAvailable, the cgroup's memory.max less its memory.current, and the address
// space and data limits (ulimit -v, -d) less what the process maps; SIZE_MAX when none of
// them can be read. *source names the one that decided ("MemAvailable", ...).
size_t budget_machine_bytes(const char **source);

#endif
