// data_cfg.c: the [data] section: its keys, their checks, and opening the data it names.
#include "data_cfg.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

const CfgKey data_keys[] = {
    {"train", NULL, "training data: a folder with one subfolder of images per class, or an IDX "
                    "images file (raw or .gz)"},
    {"train_labels", "", "IDX labels of train (raw or .gz); not used with a folder, whose "
                         "subfolders are the classes"},
    {"test", "", "test data, evaluated after each epoch: a folder like train, or IDX images; "
                 "empty = none"},
    {"test_labels", "", "IDX labels of test; not used with a folder"},
    {"val_split", "0", "instead of test: hold out this fraction of each class of train (seeded "
                       "by [train] seed)"},
    {"width", "0", "folders: the width every image is stretched to (needed with resize = stretch)"},
    {"height", "0", "folders: the height every image is stretched to (needed with resize = stretch)"},
    {"resize", "stretch", "folders: stretch (every image to width x height, its aspect not kept) or "
                          "shorter (its shorter side to short_side, the aspect kept), as "
                          "torchvision's Resize((height, width)) and Resize(short_side)"},
    {"short_side", "0", "resize = shorter: the length of the shorter side (256 in torchvision's "
                        "ImageNet recipes)"},
    {"center_crop", "0", "folders: the sample is the centre N x N of the resized image, as "
                         "torchvision's CenterCrop(N) (the test set's, --predict's, and training's "
                         "unless crop_scale crops); 0 = none; needed with resize = shorter"},
    {"channels", "0", "folders: 1 (gray) or 3 (RGB) channels; 0 = 3 for a folder, 1 for IDX"},
    {"mean", "0", "per-channel mean subtracted after scaling pixels to [0, 1]"},
    {"std", "1", "per-channel standard deviation divided by after that"},
    {"shuffle", "1", "1: a new seeded order of the training set each epoch; 0: file order"},
    {"drop_last", "0", "1: skip the last training batch if it is smaller than batch"},
    {"workers", "2", "threads that read and decode batches ahead of the trainer; "
                     "0 = in the trainer's thread; the batches are the same for any number"},
    {"prefetch", "4", "batches the workers prepare ahead (buffers in the memory plan)"},
    {"skip_bad", "0", "1: skip images that cannot be read or decoded (and leave files that are "
                      "not images out), counted each epoch; 0: stop, naming the file"},
    {"cache", "", "folders: a folder for train.cache and test.cache, the decoded, resized "
                  "samples (uint8), written during the first epoch and read while the settings "
                  "and files are unchanged; empty = none"},
    {"crop_pad", "0", "training: pad each side by this many pixels, then crop width x height at "
                      "random (0 = off)"},
    {"crop_scale", "0", "training: random resized crop (torchvision's RandomResizedCrop) of this "
                        "fraction of the image's area: smallest, largest (0.08, 1), or the "
                        "smallest alone (to 1); of a folder's images at their own size; 0 = off"},
    {"crop_ratio", "0.75, 1.3333333333333333", "training: crop_scale's range of aspect ratios, "
                                               "width / height, drawn log-uniformly"},
    {"flip", "0", "training: 1 = flip images left-right with probability 1/2"},
    {"jitter", "0, 0, 0", "training: colour jitter as torchvision's ColorJitter(brightness, "
                          "contrast, saturation): factors uniform in [max(0, 1 - x), 1 + x], "
                          "applied in a random order (0 = none; e.g. 0.4, 0.4, 0.4)"},
};
const int data_nkeys = sizeof data_keys / sizeof data_keys[0];

static int read_floats(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
                       float *out, int *n, Error *err) {
    double v[DATASET_MAX_CHANNELS];
    if (cfg_floats(cfg, s, key, def, v, DATASET_MAX_CHANNELS, n, err)) return -1;
    for (int i = 0; i < *n; i++) out[i] = (float)v[i];
    return 0;
}

// "PATH:LINE" of key (or of the section when the key is not there), or "command line".
static const char *where(char *buf, size_t size, const Cfg *cfg, const CfgSection *s,
                         const char *key) {
    const CfgEntry *e = cfg_entry(s, key);
    int line = e ? e->line : s->line;
    if (e && line == 0)
        snprintf(buf, size, "command line");
    else
        snprintf(buf, size, "%s:%d", cfg->path, line);
    return buf;
}

// A string key where "none" means the same as empty (a command line cannot set "").
static int read_path(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
                     const char **out, Error *err) {
    if (cfg_str(cfg, s, key, def, out, err)) return -1;
    if (*out && strcmp(*out, "none") == 0) *out = "";
    return 0;
}

// 1 if path is a directory, 0 if something else, -1 (err set) if it cannot be found.
static int is_dir(const Cfg *cfg, const CfgSection *s, const char *key, const char *path,
                  Error *err) {
    struct stat st;
    char w[1100];
    if (stat(path, &st) != 0)
        return err_set(err, "%s: [data] %s = %s: %s; it names an image folder (one subfolder "
                       "per class) or an IDX images file", where(w, sizeof w, cfg, s, key), key,
                       path, strerror(errno));
    return S_ISDIR(st.st_mode) ? 1 : 0;
}

// The labels key of an images key: not used with a folder, needed with an IDX file.
static int check_labels(const Cfg *cfg, const CfgSection *s, const char *key, const char *path,
                        bool folder, const char *lkey, const char *labels, Error *err) {
    char w[1100];
    if (folder && labels[0])
        return err_set(err, "%s: [data] %s = %s is an image folder, whose subfolders are the "
                       "classes: %s (= %s) is not used; remove it (on the command line: "
                       "%s=none)", where(w, sizeof w, cfg, s, lkey), key, path, lkey, labels,
                       lkey);
    if (!folder && !labels[0])
        return err_set(err, "%s: [data] %s = %s is a file, not a folder, so it is read as IDX "
                       "images, and %s must name its IDX labels file",
                       where(w, sizeof w, cfg, s, key), key, path, lkey);
    return 0;
}

// The checks of [data] that look at the file system (`files`: all, or the test set's
// alone): whether train and test are image folders or IDX files, their labels keys, and
// what that means for the size keys. dc->channels gets its default (3 for a folder, 1 for
// IDX).
static int check_files(DataConfig *dc, const Cfg *cfg, const CfgSection *s, DataFiles files,
                       Error *err) {
    char w[1100];
    if (dc->test[0] && (dc->test_folder = is_dir(cfg, s, "test", dc->test, err)) < 0) return -1;
    if (files == DATA_FILES_TEST) dc->train_folder = dc->test_folder;
    else if ((dc->train_folder = is_dir(cfg, s, "train", dc->train, err)) < 0 ||
             check_labels(cfg, s, "train", dc->train, dc->train_folder, "train_labels",
                          dc->train_labels, err))
        return -1;
    if (dc->test[0]) {
        if (check_labels(cfg, s, "test", dc->test, dc->test_folder, "test_labels",
                         dc->test_labels, err))
            return -1;
        if (dc->test_folder != dc->train_folder)
            return err_set(err, "%s: [data] test = %s is %s but train = %s is %s; both must be "
                           "image folders or both IDX", where(w, sizeof w, cfg, s, "test"),
                           dc->test, dc->test_folder ? "a folder" : "an IDX file", dc->train,
                           dc->train_folder ? "a folder" : "an IDX file");
    } else if (dc->test_labels[0]) {
        return err_set(err, "%s: [data] test_labels is set but test is not",
                       where(w, sizeof w, cfg, s, "test_labels"));
    }
    if (dc->train_folder) {
        if (dc->resize == RESIZE_STRETCH && (dc->width == 0 || dc->height == 0))
            return err_set(err, "%s: [data] train = %s is an image folder: set width and height, "
                           "the size every image is resized to (e.g. width = 64, height = 64), or "
                           "resize = shorter with short_side and center_crop",
                           where(w, sizeof w, cfg, s, dc->width == 0 ? "width" : "height"), dc->train);
        if (dc->channels == 0) dc->channels = 3;
        if (dc->channels == 2)
            return err_set(err, "%s: [data] channels = 2: images are converted to 1 (gray) or 3 "
                           "(RGB) channels", where(w, sizeof w, cfg, s, "channels"));
    } else {
        if (dc->channels > 1)
            return err_set(err, "%s: [data] channels = %d, but IDX images have 1 channel",
                           where(w, sizeof w, cfg, s, "channels"), dc->channels);
        dc->channels = 1;
        if (dc->cache[0])
            return err_set(err, "%s: [data] cache is for image folders; IDX files are read "
                           "directly and need none (remove the key, or cache=none)",
                           where(w, sizeof w, cfg, s, "cache"));
        const char *key = dc->resize != RESIZE_STRETCH ? "resize" : dc->center_crop ? "center_crop" : NULL;
        if (key)
            return err_set(err, "%s: [data] %s is for image folders; IDX images are read at their "
                           "own size (remove the key)", where(w, sizeof w, cfg, s, key), key);
    }
    return 0;
}

static const char *const resize_names[] = {"stretch", "shorter"};
static_assert(sizeof resize_names / sizeof *resize_names == RESIZE_SHORTER + 1,
              "resize_names must list every ImageResize");

// resize, short_side, center_crop, width and height agree: a sample of a size the images
// can give (checked without the files: --predict of a checkpoint reads none).
static int check_fit(const DataConfig *dc, const Cfg *cfg, const CfgSection *s, Error *err) {
    char w[1100];
    const int crop = dc->center_crop;
    if (dc->resize == RESIZE_SHORTER) {
        if (!dc->short_side)
            return err_set(err, "%s: [data] resize = shorter needs short_side, the length the "
                           "shorter side of every image is resized to (256 in torchvision's "
                           "ImageNet recipes)", where(w, sizeof w, cfg, s, "resize"));
        if (!crop)
            return err_set(err, "%s: [data] resize = shorter keeps each image's aspect ratio, so "
                           "the resized images differ in size: set center_crop = N, the N x N "
                           "centre the network takes (224 in torchvision's ImageNet recipes)",
                           where(w, sizeof w, cfg, s, "resize"));
        if (dc->width || dc->height)
            return err_set(err, "%s: [data] width and height are the size resize = stretch "
                           "gives; with resize = shorter the samples are center_crop x "
                           "center_crop (%d x %d): remove them (on the command line: width= "
                           "height=)", where(w, sizeof w, cfg, s, dc->width ? "width" : "height"),
                           crop, crop);
        if (crop > dc->short_side)
            return err_set(err, "%s: [data] center_crop = %d is larger than the shorter side of "
                           "the resized images (short_side = %d): the crop must fit in them",
                           where(w, sizeof w, cfg, s, "center_crop"), crop, dc->short_side);
        return 0;
    }
    if (dc->short_side)
        return err_set(err, "%s: [data] short_side = %d is for resize = shorter (resize = stretch "
                       "resizes to width x height)", where(w, sizeof w, cfg, s, "short_side"),
                       dc->short_side);
    if (crop && dc->width && dc->height && (crop > dc->width || crop > dc->height))
        return err_set(err, "%s: [data] center_crop = %d is larger than the %d x %d images "
                       "resize = stretch makes: the crop must fit in them",
                       where(w, sizeof w, cfg, s, "center_crop"), crop, dc->width, dc->height);
    return 0;
}

// crop_scale and crop_ratio into dc->crop, jitter into dc->jitter.
static int read_augmentation(DataConfig *dc, const Cfg *cfg, const CfgSection *s, Error *err) {
    double scale[2], ratio[2], jitter[3];
    int nscale, nratio, njitter;
    char w[1100];
    if (cfg_floats(cfg, s, "crop_scale", "0", scale, 2, &nscale, err) ||
        cfg_floats(cfg, s, "crop_ratio", "0.75, 1.3333333333333333", ratio, 2, &nratio, err) ||
        cfg_floats(cfg, s, "jitter", "0, 0, 0", jitter, 3, &njitter, err))
        return -1;
    if (nscale == 1) scale[1] = 1;  // the smallest fraction alone: up to the whole image
    const bool crop = !(nscale == 1 && scale[0] == 0);
    if (crop && !(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1))
        return err_set(err, "%s: [data] crop_scale = %g, %g: the fractions of an image's area a "
                       "random resized crop takes, the smallest then the largest, 0 < smallest "
                       "<= largest <= 1 (torchvision's 0.08, 1); 0 = off",
                       where(w, sizeof w, cfg, s, "crop_scale"), scale[0], scale[1]);
    if (nratio != 2)
        return err_set(err, "%s: [data] crop_ratio takes two aspect ratios (width / height) of "
                       "crop_scale's crops, the smallest and the largest (torchvision's 3/4, 4/3: "
                       "0.75, 1.3333333333333333)", where(w, sizeof w, cfg, s, "crop_ratio"));
    if (!(ratio[0] > 0 && ratio[0] <= ratio[1] && ratio[1] <= 1000))
        return err_set(err, "%s: [data] crop_ratio = %g, %g: the aspect ratios (width / height) "
                       "of crop_scale's crops lie in 0 < smallest <= largest <= 1000",
                       where(w, sizeof w, cfg, s, "crop_ratio"), ratio[0], ratio[1]);
    if (!crop && cfg_entry(s, "crop_ratio"))
        return err_set(err, "%s: [data] crop_ratio is the range of aspect ratios of crop_scale's "
                       "random resized crops: set crop_scale too (e.g. crop_scale = 0.08, 1)",
                       where(w, sizeof w, cfg, s, "crop_ratio"));
    if (njitter != 3 || !(jitter[0] >= 0 && jitter[0] <= 100 && jitter[1] >= 0 &&
                          jitter[1] <= 100 && jitter[2] >= 0 && jitter[2] <= 100))
        return err_set(err, "%s: [data] jitter takes three amounts, of brightness, contrast and "
                       "saturation, each 0 (none) to 100: torchvision's ColorJitter(0.4, 0.4, "
                       "0.4) is jitter = 0.4, 0.4, 0.4", where(w, sizeof w, cfg, s, "jitter"));
    dc->crop = (ResizedCrop){.scale = {crop ? scale[0] : 0, crop ? scale[1] : 0},
                             .ratio = {ratio[0], ratio[1]}};
    for (int k = 0; k < 3; k++) dc->jitter[k] = (float)jitter[k];
    return 0;
}

int data_cfg_read(DataConfig *dc, const Cfg *cfg, const CfgSection *s, DataFiles files, Error *err) {
    int64_t shuffle, drop_last, width, height, channels, workers, prefetch, skip_bad, crop_pad, flip;
    int64_t short_side, center_crop;
    int resize;
    double val_split;
    memset(dc, 0, sizeof *dc);
    if (cfg_check_keys(cfg, s, data_keys, data_nkeys, err) ||
        cfg_str(cfg, s, "train", NULL, &dc->train, err) ||
        read_path(cfg, s, "train_labels", "", &dc->train_labels, err) ||
        read_path(cfg, s, "test", "", &dc->test, err) ||
        read_path(cfg, s, "test_labels", "", &dc->test_labels, err) ||
        cfg_float(cfg, s, "val_split", "0", 0.0, 0.99, &val_split, err) ||
        cfg_int(cfg, s, "width", "0", 0, INPUT_MAX_SIDE, &width, err) ||
        cfg_int(cfg, s, "height", "0", 0, INPUT_MAX_SIDE, &height, err) ||
        cfg_int(cfg, s, "channels", "0", 0, 3, &channels, err) ||
        cfg_choice(cfg, s, "resize", "stretch", resize_names, 2, &resize, err) ||
        cfg_int(cfg, s, "short_side", "0", 0, INPUT_MAX_SIDE, &short_side, err) ||
        cfg_int(cfg, s, "center_crop", "0", 0, INPUT_MAX_SIDE, &center_crop, err) ||
        read_floats(cfg, s, "mean", "0", dc->mean, &dc->nmean, err) ||
        read_floats(cfg, s, "std", "1", dc->std, &dc->nstd, err) ||
        cfg_int(cfg, s, "shuffle", "1", 0, 1, &shuffle, err) ||
        cfg_int(cfg, s, "drop_last", "0", 0, 1, &drop_last, err) ||
        cfg_int(cfg, s, "workers", "2", 0, 256, &workers, err) ||
        cfg_int(cfg, s, "prefetch", "4", 1, 4096, &prefetch, err) ||
        cfg_int(cfg, s, "skip_bad", "0", 0, 1, &skip_bad, err) ||
        read_path(cfg, s, "cache", "", &dc->cache, err) ||
        cfg_int(cfg, s, "crop_pad", "0", 0, 4096, &crop_pad, err) ||
        cfg_int(cfg, s, "flip", "0", 0, 1, &flip, err) ||
        read_augmentation(dc, cfg, s, err))
        return -1;
    char w[1100];
    // (byte / 255 - mean) / std: values far outside these ranges are a slip (std = 1e-30
    // trained to a loss of 1e28 without a word), not a normalisation.
    for (int i = 0; i < dc->nstd; i++)
        if (!(dc->std[i] >= 1e-3f && dc->std[i] <= 1e3f))
            return err_set(err, "%s: [data] std = %g: normalised pixels (byte / 255 - mean) / std "
                                "would reach %.3g; std is the data's standard deviation in units of "
                                "[0, 1] (0.3081 for MNIST), between 0.001 and 1000",
                           where(w, sizeof w, cfg, s, "std"), dc->std[i],
                           dc->std[i] > 0 ? 1.0 / dc->std[i] : INFINITY);
    for (int i = 0; i < dc->nmean; i++)
        if (!(fabsf(dc->mean[i]) <= 1e3f))
            return err_set(err, "%s: [data] mean = %g: the mean of the pixels in units of [0, 1] "
                                "(0.1307 for MNIST), between -1000 and 1000",
                           where(w, sizeof w, cfg, s, "mean"), dc->mean[i]);
    if (files == DATA_FILES_TEST) val_split = 0.0;  // train is not opened: nothing to split
    if (val_split > 0.0 && dc->test[0])
        return err_set(err, "%s: [data] val_split = %g and test = %s: validate on a held-out "
                       "part of train or on a test set, not both",
                       where(w, sizeof w, cfg, s, "val_split"), val_split, dc->test);
    dc->width = (int)width, dc->height = (int)height, dc->channels = (int)channels;
    dc->resize = (ImageResize)resize;
    dc->short_side = (int)short_side, dc->center_crop = (int)center_crop;
    if (check_fit(dc, cfg, s, err) || (files != DATA_FILES_NONE && check_files(dc, cfg, s, files, err)))
        return -1;
    dc->val_split = val_split;
    dc->shuffle = (int)shuffle, dc->drop_last = (int)drop_last;
    dc->workers = (int)workers, dc->prefetch = (int)prefetch, dc->skip_bad = (int)skip_bad;
    dc->crop_pad = (int)crop_pad, dc->flip = (int)flip;
    if (dc->crop_pad > 0 && dc->crop.scale[0] > 0)
        return err_set(err, "%s: [data] crop_pad and crop_scale are both set: choose one crop",
                       where(w, sizeof w, cfg, s, "crop_scale"));
    return 0;
}

ImageFit data_image_fit(const DataConfig *dc, Shape input) {
    ImageFit f = {.channels = input.c, .resize = dc->resize, .width = dc->width,
                  .height = dc->height, .short_side = dc->short_side,
                  .center_crop = dc->center_crop};
    if (f.resize == RESIZE_STRETCH && !f.center_crop) f.width = input.w, f.height = input.h;
    return f;
}

int data_normalisation(const DataConfig *dc, int C, float *mean, float *std, Error *err) {
    if (C < 1 || C > DATASET_MAX_CHANNELS)
        return err_set(err, "%d-channel images: the loader takes 1 to %d channels", C,
                       DATASET_MAX_CHANNELS);
    if ((dc->nmean != 1 && dc->nmean != C) || (dc->nstd != 1 && dc->nstd != C))
        return err_set(err, "[data] mean and std need one value, or one per channel (%d), for "
                            "%d-channel images; they have %d and %d", C, C, dc->nmean, dc->nstd);
    for (int c = 0; c < C; c++) {
        mean[c] = dc->mean[dc->nmean == 1 ? 0 : c];
        std[c] = dc->std[dc->nstd == 1 ? 0 : c];
    }
    return 0;
}

// Augmentation and the replacement of skipped samples (full batches) are for the training
// set only.
static int loader_config(LoaderConfig *lc, const DataConfig *dc, const Dataset *ds, int batch,
                         uint64_t seed, bool train, Error *err) {
    *lc = (LoaderConfig){.batch = batch, .shuffle = train ? dc->shuffle : 0,
                         .drop_last = train ? dc->drop_last : 0, .seed = seed,
                         .workers = dc->workers, .prefetch = dc->prefetch,
                         .skip_bad = dc->skip_bad, .fill_bad = train, .shard = dc->shard,
                         .nshards = dc->nshards};
    if (train) {
        lc->crop_pad = dc->crop_pad;
        lc->crop = dc->crop;
        lc->flip = dc->flip;
        memcpy(lc->jitter, dc->jitter, sizeof lc->jitter);
    }
    if (data_normalisation(dc, ds->shape.c, lc->mean, lc->std, err))
        return err_wrap(err, "%s", ds->source);
    return 0;
}

// Opens one set: an image folder (cached in dc->cache/cache_name; read with random resized
// crops too where `crop`) or IDX images + labels.
static int open_set(Dataset **out, const DataConfig *dc, const char *path, const char *labels,
                    bool folder, const char *cache_name, bool crop, Error *err) {
    if (folder) {
        const Shape sample = {.c = dc->channels, .h = dc->height, .w = dc->width};
        FolderOptions fo = {.fit = data_image_fit(dc, sample), .crop = crop ? &dc->crop : NULL,
                            .skip_bad = dc->skip_bad, .cache_dir = dc->cache,
                            .cache_name = cache_name};
        return folder_dataset_open(out, path, &fo, err);
    }
    if (idx_dataset_open(out, path, labels, err)) return -1;
    const Shape sh = (*out)->shape;
    if ((dc->width && dc->width != sh.w) || (dc->height && dc->height != sh.h)) {
        err_set(err, "[data] width = %d, height = %d, but the IDX images of %s are %d x %d; IDX "
                "images are not resized (width and height are for image folders)", dc->width,
                dc->height, path, sh.w, sh.h);
        dataset_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

// Both sets must name the same classes in the same order: class indices are positions.
static int check_classes(const Dataset *train, const Dataset *test, Error *err) {
    if (train->classes == test->classes) {
        int c = 0;
        while (c < train->classes && strcmp(train->class_names[c], test->class_names[c]) == 0) c++;
        if (c == train->classes) return 0;
    }
    char a[400] = "", b[400] = "";
    for (int c = 0, n = 0; c < train->classes && n < (int)sizeof a - 1; c++)
        n += snprintf(a + n, sizeof a - (size_t)n, "%s%s", c ? ", " : "", train->class_names[c]);
    for (int c = 0, n = 0; c < test->classes && n < (int)sizeof b - 1; c++)
        n += snprintf(b + n, sizeof b - (size_t)n, "%s%s", c ? ", " : "", test->class_names[c]);
    return err_set(err, "%s has the classes %s, but %s has %s; the class index is the position "
                   "of the subfolder's name in sorted order, so both folders need the same "
                   "class subfolders", train->source, a, test->source, b);
}

int data_open(Data *d, const DataConfig *dc, int batch, uint64_t seed, Error *err) {
    memset(d, 0, sizeof *d);
    LoaderConfig lc;
    const bool folder = dc->train_folder;
    if (open_set(&d->train, dc, dc->train, dc->train_labels, folder, "train.cache",
                 dc->crop.scale[0] > 0, err))
        goto fail;
    if (dc->val_split > 0.0) {
        Dataset *all = d->train;
        d->train = NULL;
        if (dataset_split(all, dc->val_split, seed, &d->train, &d->test, err)) goto fail;
    } else if (dc->test[0]) {
        if (open_set(&d->test, dc, dc->test, dc->test_labels, folder, "test.cache", false, err))
            goto fail;
        const Shape a = d->train->shape, b = d->test->shape;
        if (a.c != b.c || a.h != b.h || a.w != b.w) {
            err_set(err, "%s has %dx%dx%d images (C x H x W) but %s has %dx%dx%d", dc->test, b.c,
                    b.h, b.w, dc->train, a.c, a.h, a.w);
            goto fail;
        }
        if (folder && check_classes(d->train, d->test, err)) goto fail;
    }
    if (loader_config(&lc, dc, d->train, batch, seed, true, err) ||
        loader_create(&d->train_loader, d->train, &lc, err))
        goto fail;
    d->classes = d->train->classes;
    d->class_names = d->train->class_names;
    if (!d->test) return 0;
    // The test set is read between training epochs only: its loader fills the training
    // loader's batch buffers (the same batch, workers and prefetch; no augmentation).
    if (loader_config(&lc, dc, d->test, batch, seed, false, err) ||
        loader_create_shared(&d->test_loader, d->test, &lc, d->train_loader, err))
        goto fail;
    if (d->test->classes > d->classes) d->classes = d->test->classes, d->class_names = d->test->class_names;
    return 0;
fail:
    data_close(d);
    return -1;
}

int data_open_test(Data *d, const DataConfig *dc, int batch, Error *err) {
    memset(d, 0, sizeof *d);
    if (!dc->test[0])
        return err_set(err, "no test set to evaluate on: give test=PATH (and test_labels=PATH for "
                            "IDX files)");
    LoaderConfig lc;
    if (open_set(&d->test, dc, dc->test, dc->test_labels, dc->test_folder, "test.cache", false, err) ||
        loader_config(&lc, dc, d->test, batch, 0, false, err) ||
        loader_create(&d->test_loader, d->test, &lc, err)) {
        data_close(d);
        return -1;
    }
    d->classes = d->test->classes;
    d->class_names = d->test->class_names;
    return 0;
}

void data_close(Data *d) {
    loader_destroy(d->train_loader);
    loader_destroy(d->test_loader);
    dataset_close(d->train);
    dataset_close(d->test);
    memset(d, 0, sizeof *d);
}

size_t data_loader_bytes_at(const Data *d, int prefetch) {
    // loader_bytes needs the config the loader was made with; the loaders keep it. The test
    // loader shares the training loader's ring (its size: its order); the two never decode
    // at once (the test set is read between training epochs).
    const size_t train = loader_read_bytes(d->train_loader), test = loader_read_bytes(d->test_loader);
    const size_t ring = prefetch ? loader_size_at(d->train_loader, prefetch) : loader_size(d->train_loader);
    return ring + loader_size(d->test_loader) + (train > test ? train : test);
}

size_t data_loader_bytes(const Data *d) { return data_loader_bytes_at(d, 0); }
