// evaluate.h: loss, accuracy, top-5 and the confusion matrix of a network over a data set:
// after each training epoch, and ./train --eval.
#ifndef CLI_EVALUATE_H
#define CLI_EVALUATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../data/dataset.h"
#include "../nn/dist.h"
#include "../nn/net.h"

// An epoch's or an evaluation's totals.
typedef struct Totals {
    double loss, correct;
    int64_t seen;         // samples of the epoch (a resumed epoch counts its first part)
    int64_t trained_now;  // samples this process trained (for images per second)
} Totals;

// What an evaluation finds beyond loss and accuracy: the confusion matrix (rows: the
// true class, columns: the predicted one, the first maximum as the accuracy counts it),
// and how many labels were among the five most likely classes.
typedef struct EvalStats {
    int classes;
    int64_t *confusion;  // (classes, classes)
    int64_t top5;
    float *logp;         // (net batch, classes): a host copy of one forward's output
} EvalStats;

int eval_stats_init(EvalStats *e, int classes, int batch, Error *err);
void eval_stats_free(EvalStats *e);

// Each class's accuracy in percent as a JSON list (null for a class without samples); null
// without stats.
void write_per_class(FILE *f, const EvalStats *e);

// Copies samples [first, first + n) of a host batch (bytes, with their table) into the
// network's input (NetOptions.input_bytes) and labels.
void put_batch(Net *net, const Batch *b, int first, int n);

// The loss and correct count on the device (this process's).
void read_metrics(Net *net, Totals *t);
// The same summed over the processes of dist (NULL: this one alone).
int read_metrics_all(Net *net, Dist *dist, Totals *t, Error *err);

// Loss and accuracy over a whole data set (its loader), without training, summed over the
// processes of dist (NULL: alone); with stats (may be NULL), the confusion matrix and top-5.
int evaluate(Net *net, Loader *loader, Dist *dist, Totals *t, EvalStats *stats, Error *err);

// ./train --eval WEIGHTS [--cfg CFG] [--json] [key=value ...]: the network and weights,
// evaluated on the test set of the cfg (or another: test=PATH test_labels=PATH), or on the
// held-out part of a val_split run, split as training split it (the cfg's seed). A
// checkpoint's class names and count are its own; plain weights take them from the
// cfg's data.
int eval_weights(const char *weights, const char *cfg_path, bool json, int noverrides,
                 char **overrides, Error *err);

#endif
