// predict.h: ./train --predict: the most likely classes of image files for trained weights.
#ifndef CLI_PREDICT_H
#define CLI_PREDICT_H

#include <stdbool.h>
#include <stddef.h>

#include "../nn/error.h"

// How --predict reports: --cfg CFG (plain weights need it), --json, --top K.
typedef struct PredictOptions {
    const char *cfg;
    bool json;  // one JSON object per line and image
    int top;    // classes listed per image
    size_t memory;  // the most the network may take, in bytes; 0: what the device can give
} PredictOptions;

// ./train --predict WEIGHTS [--cfg CFG] [--json] [--top K] [key=value ...] IMAGE|FOLDER...:
// the key=value arguments override the cfg (threads=1, batch=8, device=cpu, ...; an
// argument that names an existing file or folder is always a path); the top classes of
// each image, decoded and resized to the network's input as a folder data set
// does and normalised with the cfg's mean and std, in batches of the cfg's batch size.
// Plain weights take the input shape and the class names from the cfg's training data.
// A file that cannot be read or decoded is reported (on stderr, or as a JSON line with
// "error") and the others go on. Returns the number of such files, or -1.
int predict(const char *weights, const PredictOptions *po, int nargs, char **args, Error *err);

#endif
