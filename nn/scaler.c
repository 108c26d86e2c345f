#include "scaler.h"

LossScaler scaler_make(bool dynamic, double init_scale, int64_t growth_interval) {
    return (LossScaler){.dynamic = dynamic, .scale = init_scale, .growth = 2.0, .backoff = 0.5,
                        .growth_interval = growth_interval};
}

bool scaler_update(LossScaler *s, bool found_nonfinite) {
    if (found_nonfinite) {
        s->skipped++;
        s->good_steps = 0;
        if (s->dynamic) s->scale *= s->backoff;
        return false;
    }
    if (s->dynamic && ++s->good_steps == s->growth_interval) {
        s->scale *= s->growth;
        s->good_steps = 0;
    }
    return true;
}
