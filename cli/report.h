// report.h: what a training run prints and logs: its first lines (the data, the settings,
// the network), and after each epoch its line on stdout, SAVE/metrics.jsonl and
// SAVE/curves.svg (cli/metrics.c writes the files).
#ifndef CLI_REPORT_H
#define CLI_REPORT_H

#include "run.h"

// The run's first lines: the cfg, the device, the data, the batch as the processes and
// `accumulate` micro-batches divide it, what changes the arithmetic; then the network.
void report_header(const Run *r, int accumulate);

// The report of epoch r->st.epoch (not yet counted as done): its line on stdout (and the
// profile), and on rank 0 its line of SAVE/metrics.jsonl and curves.svg. tr, te: the
// epoch's training and test totals (te unused without a test set), seconds and dist0
// (r->dist before it: its communication times) its timing; *val_acc: its test accuracy (-1
// without a test set). -1 with err.
int report_epoch(Run *r, const Totals *tr, const Totals *te, double seconds, const Dist *dist0,
                 double *val_acc, Error *err);

#endif
