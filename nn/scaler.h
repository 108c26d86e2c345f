// scaler.h: dynamic loss scaling with PyTorch GradScaler's semantics (DESIGN.md
// decision 4), for precision = fp16.
//
// The loss gradient is multiplied by `scale` so that small activation gradients survive
// fp16; before each optimizer step the parameter gradients are multiplied by 1/scale
// and checked. A step with inf or NaN is skipped and the scale backed off; after
// `growth_interval` consecutive clean steps the scale grows.
#ifndef NN_SCALER_H
#define NN_SCALER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct LossScaler {
    bool dynamic;         // false: a fixed scale (skips non-finite steps all the same)
    double scale;         // 65536 initially (PyTorch's init_scale)
    double growth;        // 2.0
    double backoff;       // 0.5
    int64_t growth_interval;  // 2000 clean steps
    int64_t good_steps;   // clean steps since the last change of scale
    int64_t skipped;      // steps skipped so far
} LossScaler;

// dynamic: GradScaler's growth and backoff from init_scale; otherwise a fixed scale.
LossScaler scaler_make(bool dynamic, double init_scale, int64_t growth_interval);

// Records the outcome of a step whose unscaled gradients were (not) all finite and
// updates the scale. Returns true if the optimizer should step.
bool scaler_update(LossScaler *s, bool found_nonfinite);

#endif
