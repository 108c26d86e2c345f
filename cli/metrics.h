// metrics.h: what a run leaves besides its checkpoints: SAVE/metrics.jsonl (one JSON object
// a line per epoch) and SAVE/curves.svg (loss and accuracy per epoch, the learning rate per step).
// Both are replaced atomically (file_write_atomic), so a full disk or a kill leaves the
// old copies whole.
#ifndef CLI_METRICS_H
#define CLI_METRICS_H

#include "../nn/error.h"

// Appends line (ending in a newline) to SAVE/metrics.jsonl; an empty line ("") only makes
// sure the log exists and can be written.
int metrics_log_line(const char *save, const char *line, Error *err);

// The learning rate of the run's steps so far (or of a sample of them), for curves.svg:
// step i at epoch[i] (its position in epochs: the first epoch's steps between 0 and 1).
typedef struct LrSteps {
    const double *epoch, *lr;
    int n;
} LrSteps;

// Appends an epoch's line to the log, then draws SAVE/curves.svg from the whole log with
// the title (the log's last line of each epoch: a resumed run may log an epoch again), the
// learning-rate panel from lr (NULL: the log's value at each epoch's end).
int metrics_log_epoch(const char *save, const char *line, const char *title, const LrSteps *lr,
                      Error *err);

#endif
