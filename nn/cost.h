// cost.h: the time a training step takes under a plan, for the budget's choice (budget.c).
//
// A probe runs a few steps of one plan on this machine and times every call: each leaf
// layer's forward, backward and batch passes (also inside sweeps), each sweep as a whole,
// and the elementwise work between layers (sums, their gradients, the second terms of
// gradients). Costs are kept per sample (per value for the elementwise work), so any plan
// of the same network, at any micro-batch, is costed by going through its schedule: the
// recomputations checkpointing adds, a sweep's passes, a plain run's one call a layer.
// A call's time is fitted as a fixed part and a part per sample, from the probe's steps at
// two batch sizes, so smaller micro-batches cost what their calls' overheads add.
#ifndef NN_COST_H
#define NN_COST_H

#include "net.h"

typedef enum CallKind {
    CALL_FORWARD,          // a leaf's forward
    CALL_FORWARD_REDUCE,   // its batch pass before it (batchnorm's statistics)
    CALL_BACKWARD,
    CALL_BACKWARD_REDUCE,
    CALL_SWEEP_FORWARD,    // a sweep (under its first member's index): a training forward,
    CALL_SWEEP_RECOMPUTE,  // a recomputation (no batch passes), and its backward
    CALL_SWEEP_BACKWARD,
    CALL_KINDS
} CallKind;

// One kind of call's measure: seconds, samples and calls, in the current step, and the
// least seconds over the steps at each of the probe's two batch sizes; then a call of n
// samples costs about fixed + per * n (fitted to the two sizes: a small call's overhead).
typedef struct CallCost {
    double seconds, samples, calls;          // the current step
    double best[2], samples_at[2], calls_at[2];  // per probe size, the fastest step
    double fixed, per;
} CallCost;

typedef struct CostTable {
    int nlayers;           // the network's modules, by Layer.index
    CallCost (*call)[CALL_KINDS];
    CallCost value;        // the elementwise work, per value
    CallCost loss;         // the loss, per sample
    int size;              // the probe's current size: 0 the whole batch, 1 half of it
    int steps;             // timed so far
} CostTable;

// An empty table for net's layers; cost_free releases it.
int cost_init(CostTable *t, const Net *net, Error *err);
void cost_free(CostTable *t);

// Adds a call of n samples (values, for the elementwise work: l NULL) that took `seconds`.
// The executor and the network call it while Exec.costs is set.
void cost_record(CostTable *t, const Layer *l, CallKind kind, double n, double seconds);

// Runs `steps` training forwards and backwards of random inputs through net (allocated,
// any plan), alternately of its whole batch and of half of it, timing all but the first
// two (they warm up) into t; no optimizer step. The network's running statistics and
// counters move: the probe is a network of its own.
int cost_probe(CostTable *t, Net *net, int classes, int steps, Error *err);

// The seconds of one step of `accumulate` micro-batches under plan (a plan_only network
// of the same cfg is enough), from t; a layer or sweep the probe never timed costs what its
// parts did (a plain run's swept layers), or nothing if nothing of it was timed.
double cost_step(const CostTable *t, const Net *plan, int accumulate);

#endif
