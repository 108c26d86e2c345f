// run.h: a training run as its parts share it: train.c sets it up (Run), cli/loop.c trains
// its epochs, cli/report.c prints and logs them.
#ifndef CLI_RUN_H
#define CLI_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "../data/data_cfg.h"
#include "../nn/cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/dist.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/scaler.h"
#include "evaluate.h"
#include "options.h"

// What a run holds while it trains. The pointers are train.c's, for the run's length.
typedef struct Run {
    const Options *o;
    const Cfg *cfg;
    Dist *dist;       // the processes of a data-parallel run (rank 0 of 1 alone)
    Net *net;
    Data *data;       // data->test is NULL without a test set
    TrainState st;
    ScalerState scaler;  // net->scaler as last read (to print or save)
    CheckpointInfo info;
    char last[1100], best[1100];
    EvalStats eval;                 // of the test set after each epoch
    int64_t steps_now, images_now;  // trained by this process (for the profile)
    Schedule schedule;              // the options' with its total: epochs x batches
    double lr;                      // of the last step
    const char *stopped;            // why the run stops after this epoch (a stop at its last
                                    // batch), or NULL
    bool signalled;                 // the stop came from a signal (to any process), not from
                                    // stop_after
    struct Staging *staging;        // the fused update's gradient copies with several
                                    // processes (cli/loop.c), NULL: none
} Run;

// How a run ends (train.c turns it into the exit status): trained to the end (or until
// early stopping ended it), stopped by a signal or at stop_after (a checkpoint written
// either way), or nothing left to train.
enum { RUN_TRAINED, RUN_STOPPED, RUN_STOPPED_AFTER, RUN_NOTHING_LEFT };

#endif
