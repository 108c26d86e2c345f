// loop.h: the training loop. Each epoch is a pass of optimizer steps over the training
// set (forward and backward over micro-batches, the gradients summed across the
// processes, the update), then the test, the epoch's report and its checkpoints. SIGINT
// and SIGTERM, and stop_after, stop it at a step with a checkpoint to resume.
#ifndef CLI_LOOP_H
#define CLI_LOOP_H

#include "run.h"

// Trains r from where r->st stands to the last epoch of r->o, or until a stop. Catches
// SIGINT and SIGTERM first (the first one of them asks for a stop; a second kills). r is
// set up: its network, data, TrainState, scaler, checkpoint paths and info, schedule and
// (with a test set) eval stats; the save folder is ready. After each epoch's test the
// plateau schedule steps on the validation loss (PyTorch's ReduceLROnPlateau.step), and
// with o->patience the run ends early (RUN_TRAINED, said on stdout) once that loss has not
// fallen below its lowest for patience epochs. Returns RUN_TRAINED, RUN_STOPPED or
// RUN_STOPPED_AFTER, or -1 with err.
int run_epochs(Run *r, Error *err);

// The floats of gradient copies the fused update keeps with several processes and buckets
// (o->bucket_mb != 0): four buckets, and at least the largest trained module; 0 when it
// keeps none. Their sums' received slices take as much again (the memory plan's exchange).
size_t fused_staging_floats(const Net *net, const Options *o, int processes);

// Whether early stopping has ended the run st stands at: its validation loss has not
// fallen below its lowest (st->best_val_loss) for o->patience epochs (false before the
// first validation loss, as in a checkpoint from before early stopping existed).
bool run_stopped_early(const Options *o, const TrainState *st);

#endif
