// budget.h: what makes a training run fit a memory budget (`memory = 512M`), and how fast.
//
// The budget lists plans (budget_plans): the run as configured, and with the exact savers
// (checkpoint segments with their sweeps; the fused update; micro-batches where they give
// the same gradient up to rounding), with their bytes; a probe of a few steps of the smallest that fits times
// every call on this device (nn/cost.h), from which each plan's seconds a step follow
// (budget_estimate); the fastest that fits is chosen (of two as fast, the smaller). The
// savers that change the result (fp16; micro-batches under batchnorm; compressed optimizer
// state) join only with the user's leave and only when no exact plan fits (DESIGN
// decision 17).
#ifndef NN_BUDGET_H
#define NN_BUDGET_H

#include <stdbool.h>

#include "cost.h"
#include "net.h"

// The savers that change the result, which the budget may choose only with the user's
// leave: fp16 storage (auto_fp16), micro-batches on a network whose layers normalise by
// the statistics of the batch they see (auto_microbatch): batchnorm then normalises each
// micro-batch by its own, a different training from the batch asked for; compressed
// optimizer state, bf16 or int8 (auto_compress). Micro-batches on a network without such
// layers give the same gradient up to float rounding and need no leave.
typedef struct BudgetLeave {
    bool fp16, microbatch, compress;
} BudgetLeave;

// What the budget plans for: the network, the device, the batch as configured.
typedef struct BudgetQuery {
    const Cfg *cfg;
    const Kernels *k;
    Shape input;
    int classes, batch;     // batch: this process's share of the global batch
    NetOptions base;        // as configured (batch: the micro-batch)
    int base_accumulate;
    size_t overhead;        // beside the plan: the loader and the process's baseline (CPU),
                            // the GPU's baseline
    size_t budget;
    BudgetLeave leave;
    bool all_grads;         // the step needs every gradient before its update (gradient
                            // clipping): no fused update
} BudgetQuery;

typedef struct FitChoice {
    NetOptions net;   // batch here is the micro-batch
    int accumulate;
    MemPlan plan;     // the network's plan for this choice (loader not included)
    bool coupled;     // the network's result depends on the micro-batch (net_batch_coupled)
    bool exact;       // changes nothing but float rounding (no lossy saver)
    bool fits;        // mem_plan_on(plan) + overhead <= budget
    double seconds;   // a step, estimated (budget_estimate); < 0 until then
} FitChoice;

// The plans for q, into *plans (malloc'd, *n; caller frees): for each allowed precision
// and micro-batch, checkpointing none and 2, 3, 4, 6, round(sqrt(nodes)) and twice that
// segments (each with its sweeps), the configured ones among them, each without and with
// the fused update where it may run (one fp32 batch; always with it when q->base has it:
// it changes nothing but the gradients' memory); micro-batches for every
// divisor of the batch where they are exact or allowed; lossy plans (fp16, micro-batches
// under batchnorm, bf16 or int8 optimizer state) only when the leave allows and no exact
// plan fits. Errors come from
// building the network (a bad cfg).
int budget_plans(const BudgetQuery *q, FitChoice **plans, int *n, Error *err);

// The plan of the fewest bytes (that fits, when one does), or -1 for none.
int budget_smallest(const FitChoice *plans, int n);

// Sets the seconds of every plan that fits, and *plain those of the run as configured,
// from t (a probe's: budget_probe), and returns the fastest plan that fits (exact ones
// first, as budget_plans lists them; of two as fast, the smaller, but the run as configured
// where it fits), or -1 if none fits.
int budget_estimate(const BudgetQuery *q, FitChoice *plans, int n, const CostTable *t,
                    double *plain, Error *err);

// Builds plan c for real (its memory allocated on q's device), probes `steps` steps into
// t (cost_probe) and frees it again. *seconds: the probe's wall time.
int budget_probe(const BudgetQuery *q, const FitChoice *c, int steps, CostTable *t, double *seconds,
                 Error *err);

// What choice c changes in the training asked for (base: the options as configured, with
// base_accumulate and the global batch), in words for the message that chooses it (""
// when it changes nothing but float rounding), into why (cap bytes). Returns why.
const char *fit_changes(const FitChoice *c, const NetOptions *base, int base_accumulate, int batch,
                        char *why, size_t cap);

// The memory this process can still take on this machine, in bytes: the least of the
// kernel's MemAvailable (where it is missing, sysconf's free pages), the memory cgroup's
// limit less its use (v2's memory.max, v1's memory.limit_in_bytes; its parents' too), and
// the address space and data limits (ulimit -v, -d) less what the process maps; SIZE_MAX
// when none of them can be read. *source names the one that decided ("MemAvailable", ...).
size_t budget_machine_bytes(const char **source);
// The same, with /proc and /sys read under the folder root ("" for this machine's): for the
// tests.
size_t budget_machine_bytes_in(const char *root, const char **source);

// A size field of this process's /proc/self/status ("VmRSS:", "VmHWM:") in bytes. Where
// the file does not give it (not Linux), the peak resident size (getrusage): what VmHWM
// is, and what VmRSS is at start-up, before anything is freed.
size_t proc_status_bytes(const char *field);

#endif
