// options.h: the [train] section's keys and the command line of ./train: what a run is
// asked to do (Options), read from a parsed cfg with its overrides applied.
#ifndef CLI_OPTIONS_H
#define CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../data/data_cfg.h"
#include "../nn/cfg.h"
#include "../nn/optim.h"
#include "../nn/scaler.h"

// A comma-separated list of layer names of the cfg: names[0..n) point into text.
typedef struct NameList {
    char text[1024];
    const char *names[64];
    int n;
} NameList;

typedef struct Options {
    int epochs, batch, threads, accumulate;
    double bucket_mb;    // several processes: the gradient sum's buckets (0: one sum; -1: auto)
    int64_t save_every, stop_after;
    int segments;        // NetOptions.segments
    bool fused_update;   // NetOptions.fused_update (fp32 and accumulate = 1 only)
    bool recompute_1x1;  // NetOptions.recompute_1x1
    int compress;        // NetOptions.compress: 0, or 2, 4, 8 bits
    NameList compress_skip;
    size_t memory;       // budget in bytes; 0 = none
    int auto_fp16;       // memory may choose fp16
    int auto_microbatch; // memory may choose micro-batches on a batch-coupled network
    int auto_compress;   // memory may choose compressed optimizer state (bf16, int8)
    Matmul matmul;       // NetOptions.matmul
    double label_smoothing;  // the training loss's (Net.label_smoothing)
    int profile;         // print the profile table (nn/profile.h) after each epoch
    bool plan, json;     // --plan [--json]
    bool cfg_stored;     // the cfg is the one stored in the resumed checkpoint (no cfg file)
    const char *resume, *init;
    int resume_force;
    NameList init_skip, freeze;
    int freeze_bn;
    DType precision;
    ScalerRules scaling;  // the loss scaler (fp16)
    double init_scale;    // its first scale
    Optimizer optim;
    Schedule schedule;  // total is set when the data is open
    int64_t patience;   // early stopping: epochs without a lower validation loss; 0 = none
    const char *device;
    char save[1024];
    uint64_t seed;
    DataConfig data;
} Options;

// The keys of [train], with their defaults and help (./train --help prints them).
extern const CfgKey train_keys[];
extern const int train_nkeys;

// Reads [train] and [data] of cfg (cfg_path names it in messages) into *o. Errors name the
// file, line and key. data_files: which of [data]'s files are checked (data_cfg_read).
int options_read(Options *o, const Cfg *cfg, const char *cfg_path, DataFiles data_files, Error *err);

// Applies one command-line override "key=value", "section.key=value" or "layer.key=value"
// to cfg; "key=" sets the key back to its default.
int options_override(Cfg *cfg, const char *arg, Error *err);

// ./train's usage: the commands, the options and every cfg key with its default.
void options_usage(FILE *f);

#endif
