// scaler.h: dynamic loss scaling with PyTorch GradScaler's semantics (DESIGN.md
// decision 4), for precision = fp16.
//
// The loss gradient is multiplied by `scale` so that small activation gradients survive
// fp16; before each optimizer step the parameter gradients are multiplied by 1/scale
// and checked. A step with inf or NaN is skipped and the scale backed off; after
// `growth_interval` consecutive clean steps the scale grows.
//
// The state lives on the compute device (Net.scaler), next to the gradients: the kernel
// table's unscale_check sets its flag, the optimizer kernels skip the step when it is set,
// and scaler_update applies the rules below. A step never waits for the host to decide;
// the host reads the state only to print or save it (a GPU runs step after step without a
// read-back, as PyTorch's fused optimizers with GradScaler do).
#ifndef NN_SCALER_H
#define NN_SCALER_H

#include <stdbool.h>
#include <stdint.h>

#include "hostdevice.h"

// The rules, fixed for a run.
typedef struct ScalerRules {
    bool dynamic;             // false: a fixed scale (skips non-finite steps all the same)
    double growth;            // 2.0
    double backoff;           // 0.5
    int64_t growth_interval;  // 2000 clean steps
} ScalerRules;

// The state, in device memory. Its layout is the same in C and in CUDA.
typedef struct ScalerState {
    double scale;         // 65536 initially (PyTorch's init_scale); 1 without loss scaling
    int64_t good_steps;   // clean steps since the last change of scale
    int64_t skipped;      // steps skipped so far
    float found;          // 1 once this step's unscaled gradients had an inf or NaN
} ScalerState;

// dynamic: GradScaler's growth (2) and backoff (0.5); otherwise a fixed scale.
static inline ScalerRules scaler_rules(bool dynamic, int64_t growth_interval) {
    ScalerRules r;  // (no compound literal: nvcc compiles this as C++)
    r.dynamic = dynamic, r.growth = 2.0, r.backoff = 0.5, r.growth_interval = growth_interval;
    return r;
}

// The end of a step whose gradients were unscaled and checked (s->found): a non-finite
// step counts as skipped, resets the clean count and backs the scale off (dynamic); a
// clean one grows the scale after growth_interval in a row (dynamic). Clears the flag
// for the next step.
HOST_DEVICE static inline void scaler_advance(ScalerState *s, ScalerRules r) {
    if (s->found != 0.0f) {
        s->skipped++;
        s->good_steps = 0;
        if (r.dynamic) s->scale *= r.backoff;
    } else if (r.dynamic && ++s->good_steps == r.growth_interval) {
        s->scale *= r.growth;
        s->good_steps = 0;
    }
    s->found = 0.0f;
}

// An optimizer step's gate (the kernel table's optimizer entries): false if the step is
// skipped (gate->found); otherwise true with *taken = the steps the optimizer took before
// step `step` of the run (from 0). A NULL gate never skips: *taken = step.
HOST_DEVICE static inline bool scaler_gate(const ScalerState *gate, uint64_t step,
                                           int64_t *taken) {
    if (gate && gate->found != 0.0f) return false;
    *taken = (int64_t)step - (gate ? gate->skipped : 0);
    return true;
}

#endif
