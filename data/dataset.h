// dataset.h: datasets and the lazy batched loader (DESIGN.md decision 8).
//
// A Dataset holds an index (file descriptors, offsets, paths), never the samples: read
// fetches one sample when the loader needs it. A Loader turns a Dataset into batches in a
// seeded order, normalised, into a buffer it owns.
#ifndef DATA_DATASET_H
#define DATA_DATASET_H

#include <stdint.h>

#include "../nn/error.h"
#include "../nn/tensor.h"

#define DATASET_MAX_CHANNELS 3

typedef struct Dataset Dataset;

typedef struct DatasetOps {
    // Reads sample i (0 <= i < count) as bytes into pixels (H, W, C) row-major, the
    // channel-last layout of the network's input, and its class into *label.
    // Thread-safe: workers call it concurrently on one Dataset.
    int (*read)(const Dataset *ds, int64_t i, uint8_t *pixels, int32_t *label, Error *err);
    void (*close)(Dataset *ds);
} DatasetOps;

struct Dataset {
    const DatasetOps *ops;
    int64_t count;  // samples
    Shape shape;    // of one sample (c = 1 or 3)
    int classes;    // number of classes (labels are 0 .. classes-1)
    char *source;   // what it was opened from, for messages
    void *impl;
};

// MNIST's IDX format, raw or gzip (.gz): an images file (magic 0x00000803, dimensions
// count x rows x cols, unsigned bytes) and a labels file (magic 0x00000801, count).
// Checks magics, dimensions, file sizes and equal counts; labels must be < 256 and
// classes = max label + 1 over the file. A .gz file is inflated once into an unlinked
// temporary file, so memory does not hold the set. Errors name the file.
int idx_dataset_open(Dataset **out, const char *images_path, const char *labels_path,
                     Error *err);
void dataset_close(Dataset *ds);  // NULL is fine

typedef struct LoaderConfig {
    int batch;         // samples per batch
    int shuffle;       // 1: a fresh seeded permutation each epoch; 0: file order
    int drop_last;     // 1: drop the last partial batch
    uint64_t seed;     // shuffle order = f(seed, epoch) only
    float mean[DATASET_MAX_CHANNELS];  // normalisation per channel:
    float std[DATASET_MAX_CHANNELS];   //   x = (byte / 255 - mean) / std
} LoaderConfig;

typedef struct Batch {
    float *x;       // (n, H, W, C), normalised; owned by the loader
    int32_t *y;     // (n) labels
    int n;          // samples in this batch (== batch except a last partial one)
    int64_t index;  // batch number within the epoch
} Batch;

typedef struct Loader Loader;

int loader_create(Loader **out, Dataset *ds, const LoaderConfig *cfg, Error *err);
void loader_destroy(Loader *l);  // NULL is fine
// Bytes the loader allocates (its batch buffers), for the memory plan.
size_t loader_bytes(const Dataset *ds, const LoaderConfig *cfg);
// loader_bytes of an existing loader.
size_t loader_size(const Loader *l);
// Batches per epoch.
int64_t loader_batches(const Loader *l);
// Starts epoch `epoch` (0-based): computes its order; the next call to loader_next
// returns its first batch (or batch `first` to continue an interrupted epoch).
int loader_start_epoch(Loader *l, int epoch, int64_t first, Error *err);
// *out = the next batch of the epoch, or NULL at the end of the epoch; returns 0. On a
// read error returns -1 with err naming the file and sample. The batch stays valid until
// the next call.
int loader_next(Loader *l, const Batch **out, Error *err);

#endif
