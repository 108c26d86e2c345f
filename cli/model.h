// model.h: a trained network for --eval and --predict: its cfg (the one stored in a cnn.c
// checkpoint, or the one given with --cfg, which plain weights need) and its weights.
#ifndef CLI_MODEL_H
#define CLI_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "../data/data_cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "options.h"

typedef struct Model {
    bool is_checkpoint;  // a cnn.c checkpoint (info is read and checked), not a plain state_dict
    CheckpointInfo info;
    Cfg cfg;
    Options o;
    const Kernels *k;
    Net net;
    Data data;
    char name[1100];  // the cfg's name in messages
} Model;

// Reads the cfg of `weights` (its stored one, or cfg_path) with the overrides applied, and
// the options. The checkpoint's metadata is validated here (checkpoint_read_info) before
// anything uses it. data: which of the cfg's data sets will be opened, so that [data]'s
// files are checked (plain weights need one at least: their input shape and class names
// come from the data; DATA_FILES_NONE then checks all). model_close frees what it opened,
// also after a failure.
int model_open(Model *m, const char *weights, const char *cfg_path, int noverrides,
               char **overrides, DataFiles data, Error *err);

// Builds the network for batches of `batch` inputs of `shape` and loads the weights, once
// its plan is known to fit in `memory` bytes (0: what the device can still give).
int model_load(Model *m, const char *weights, Shape shape, int classes, int batch, size_t memory,
               Error *err);

void model_close(Model *m);

#endif
