// profile.h: where a training step's time goes (./train profile=1, issue 8).
//
// profile_kernels wraps a kernel table so that every kernel call is timed (on a device
// with queues, synchronised after each call) and its time charged to the current scope:
// a layer's forward or backward, which the network sets through Net.on_layer, or the
// loss, the optimizer, the loader and the rest of the step, which the trainer sets. A
// scope's wall time minus its kernels' time is the time spent outside kernels. There is
// one profile per process: kernel functions carry no context.
#ifndef NN_PROFILE_H
#define NN_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels.h"
#include "net.h"

typedef enum ProfScope {
    PROF_STEP,       // the step outside the scopes below (batch upload, zeroing)
    PROF_LOSS,
    PROF_OPTIMIZER,  // loss-scale check and the Adadelta update
    PROF_LOADER,     // waiting for the next batch
    PROF_IDLE,       // not training (evaluation, printing, checkpoints): not reported
    PROF_FIXED_SCOPES
} ProfScope;

// Starts profiling `net` (its layers name the per-layer scopes): net->k becomes the timing
// table around the one it had, and net->on_layer is set. The scope starts as PROF_IDLE.
// Returns -1 with err if memory runs out.
int profile_start(Net *net, Error *err);
// Switches the current scope; no-op while not profiling.
void profile_enter(ProfScope scope);
// The current scope (a ProfScope, or a layer's), for profile_return; -1 while not
// profiling. The fused update charges its work to PROF_OPTIMIZER from inside a layer's
// backward, then returns to it.
int profile_scope(void);
void profile_return(int scope);
// The layer hook: layer i's forward or backward begins (ignored while PROF_IDLE).
void profile_layer(int layer, bool backward);
// Prints the table (milliseconds per step) for `steps` steps of `images` images.
void profile_print(FILE *f, int64_t steps, int64_t images);
// Gives net back its own table and frees the profile.
void profile_stop(Net *net);

#endif
