// data_cfg.h: the [data] section of the cfg: which data sets, how they are loaded.
//
// data_cfg_read checks the section's keys; data_open opens the training and test sets and
// their loaders from it. The trainer knows nothing of file formats.
#ifndef DATA_DATA_CFG_H
#define DATA_DATA_CFG_H

#include <stdbool.h>

#include "../nn/cfg.h"
#include "dataset.h"

extern const CfgKey data_keys[];
extern const int data_nkeys;

typedef struct DataConfig {
    const char *train, *train_labels;  // strings owned by the Cfg; labels "" for a folder
    const char *test, *test_labels;    // "" when there is no test set
    int train_folder, test_folder;     // 1: an image folder (a directory), 0: IDX files
    double val_split;                  // > 0: the test set is this part of train
    int width, height, channels;       // folders: the size resize = stretch gives every image
                                       // (0 with resize = shorter), and its channels
    ImageResize resize;                // folders: stretch, or the shorter side to short_side
    int short_side, center_crop;       // folders: resize = shorter's size; the centre crop of
                                       // either (0: none), the samples' size then
    float mean[DATASET_MAX_CHANNELS], std[DATASET_MAX_CHANNELS];
    int nmean, nstd;  // 1 (applies to every channel) or one per channel
    int shuffle, drop_last;
    int workers, prefetch, skip_bad;   // the loaders' (LoaderConfig)
    const char *cache;                 // folders: cache folder, "" = none
    int crop_pad, flip;                // training augmentation
    ResizedCrop crop;                  // crop_scale (scale[0] = 0: off) and crop_ratio
    float jitter[3];                   // brightness, contrast, saturation (0: off)
    int shard, nshards;                // set by the trainer: this process's part of each batch
                                       // of both loaders (LoaderConfig), nshards <= 1: all
} DataConfig;

// Which of [data]'s files data_cfg_read looks at.
typedef enum DataFiles {
    DATA_FILES_NONE,  // none: the values alone (the normalisation for --predict of a
                      // checkpoint, whose training data may be on another machine):
                      // train_folder and test_folder stay 0, channels 0 where not set
    DATA_FILES_ALL,   // train and test
    DATA_FILES_TEST,  // test alone (--eval on a set named on the command line): train is
                      // not opened, train_folder follows test_folder, val_split is 0
} DataFiles;

// Reads and checks [data] (s may not be NULL). Errors name the file, line and key. Where
// `files` says, it looks at the file system once: a set is an image folder if it is a
// directory, else IDX (which then needs its labels key).
int data_cfg_read(DataConfig *dc, const Cfg *cfg, const CfgSection *s, DataFiles files, Error *err);

// The opened data: train is always there; test and test_loader may be NULL.
typedef struct Data {
    Dataset *train, *test;
    Loader *train_loader, *test_loader;
    int classes;        // the larger class count of the two sets
    char **class_names; // the names of that set's classes (the other's are the first of them:
                        // folders' sets name the same classes, IDX sets' are "0", "1", ...)
} Data;

// Opens the data sets and makes loaders of `batch` samples; the training loader shuffles
// and augments with `seed` (if dc->shuffle), and val_split splits with it. The sets'
// class_names and info (a line on each set: files left out, cache state) are for the
// trainer to print and store. On error everything opened is closed again.
int data_open(Data *d, const DataConfig *dc, int batch, uint64_t seed, Error *err);
// Opens the test set only (for evaluating a checkpoint): d->train stays NULL.
int data_open_test(Data *d, const DataConfig *dc, int batch, Error *err);
void data_close(Data *d);
// How [data] makes a sample of an image for a network whose input is `input`: its
// channels, and with resize = stretch and no center_crop its size (a cfg of IDX data names
// none). image_fit_shape of it is `input` when the cfg and the network agree.
ImageFit data_image_fit(const DataConfig *dc, Shape input);
// The normalisation of [data] for C-channel samples, mean[c] and std[c] (one value applies
// to every channel): what the loaders and --predict make their byte tables of
// (normalise_table). An error when the cfg gives neither one value nor C.
int data_normalisation(const DataConfig *dc, int C, float *mean, float *std, Error *err);
// Bytes of the loaders' buffers and of their readers' decoding, for the memory plan.
size_t data_loader_bytes(const Data *d);
// The same had the loaders been made with `prefetch` batches ahead (0: as they were).
size_t data_loader_bytes_at(const Data *d, int prefetch);

#endif
