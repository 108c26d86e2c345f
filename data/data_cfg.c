// data_cfg.c: the [data] section: its keys, their checks, and opening the data it names.
#include "data_cfg.h"

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
    {"width", "0", "folders: the width every image is resized to (required with a folder)"},
    {"height", "0", "folders: the height every image is resized to (required with a folder)"},
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
    {"crop_scale", "0", "training: random resized crop covering at least this fraction of the "
                        "image, aspect ratio 3/4 to 4/3 (0 = off; e.g. 0.08)"},
    {"flip", "0", "training: 1 = flip images left-right with probability 1/2"},
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
// what that means for the size keys. *channels gets its default (3 for a folder, 1 for
// IDX).
static int check_files(DataConfig *dc, const Cfg *cfg, const CfgSection *s, DataFiles files,
                       int64_t width, int64_t height, int64_t *channels, Error *err) {
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
        if (width == 0 || height == 0)
            return err_set(err, "%s: [data] train = %s is an image folder: set width and height, "
                           "the size every image is resized to (e.g. width = 64, height = 64)",
                           where(w, sizeof w, cfg, s, width == 0 ? "width" : "height"), dc->train);
        if (*channels == 0) *channels = 3;
        if (*channels == 2)
            return err_set(err, "%s: [data] channels = 2: images are converted to 1 (gray) or 3 "
                           "(RGB) channels", where(w, sizeof w, cfg, s, "channels"));
    } else {
        if (*channels > 1)
            return err_set(err, "%s: [data] channels = %lld, but IDX images have 1 channel",
                           where(w, sizeof w, cfg, s, "channels"), (long long)*channels);
        *channels = 1;
        if (dc->cache[0])
            return err_set(err, "%s: [data] cache is for image folders; IDX files are read "
                           "directly and need none (remove the key, or cache=none)",
                           where(w, sizeof w, cfg, s, "cache"));
    }
    return 0;
}

int data_cfg_read(DataConfig *dc, const Cfg *cfg, const CfgSection *s, DataFiles files, Error *err) {
    int64_t shuffle, drop_last, width, height, channels, workers, prefetch, skip_bad, crop_pad, flip;
    double val_split, crop_scale;
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
        read_floats(cfg, s, "mean", "0", dc->mean, &dc->nmean, err) ||
        read_floats(cfg, s, "std", "1", dc->std, &dc->nstd, err) ||
        cfg_int(cfg, s, "shuffle", "1", 0, 1, &shuffle, err) ||
        cfg_int(cfg, s, "drop_last", "0", 0, 1, &drop_last, err) ||
        cfg_int(cfg, s, "workers", "2", 0, 256, &workers, err) ||
        cfg_int(cfg, s, "prefetch", "4", 1, 4096, &prefetch, err) ||
        cfg_int(cfg, s, "skip_bad", "0", 0, 1, &skip_bad, err) ||
        read_path(cfg, s, "cache", "", &dc->cache, err) ||
        cfg_int(cfg, s, "crop_pad", "0", 0, 4096, &crop_pad, err) ||
        cfg_float(cfg, s, "crop_scale", "0", 0.0, 1.0, &crop_scale, err) ||
        cfg_int(cfg, s, "flip", "0", 0, 1, &flip, err))
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
    if (files != DATA_FILES_NONE && check_files(dc, cfg, s, files, width, height, &channels, err))
        return -1;
    dc->val_split = val_split;
    dc->width = (int)width, dc->height = (int)height, dc->channels = (int)channels;
    dc->shuffle = (int)shuffle, dc->drop_last = (int)drop_last;
    dc->workers = (int)workers, dc->prefetch = (int)prefetch, dc->skip_bad = (int)skip_bad;
    dc->crop_pad = (int)crop_pad, dc->crop_scale = crop_scale, dc->flip = (int)flip;
    if (dc->crop_pad > 0 && dc->crop_scale > 0.0)
        return err_set(err, "%s: [data] crop_pad and crop_scale are both set: choose one crop",
                       where(w, sizeof w, cfg, s, "crop_scale"));
    return 0;
}

// One mean/std value applies to every channel; otherwise one per channel. Augmentation
// and the replacement of skipped samples (full batches) are for the training set only.
static int loader_config(LoaderConfig *lc, const DataConfig *dc, const Dataset *ds, int batch,
                         uint64_t seed, bool train, Error *err) {
    *lc = (LoaderConfig){.batch = batch, .shuffle = train ? dc->shuffle : 0,
                         .drop_last = train ? dc->drop_last : 0, .seed = seed,
                         .workers = dc->workers, .prefetch = dc->prefetch,
                         .skip_bad = dc->skip_bad, .fill_bad = train, .shard = dc->shard,
                         .nshards = dc->nshards};
    if (train) {
        lc->crop_pad = dc->crop_pad;
        lc->crop_scale = (float)dc->crop_scale;
        lc->flip = dc->flip;
    }
    const int c = ds->shape.c;
    if ((dc->nmean != 1 && dc->nmean != c) || (dc->nstd != 1 && dc->nstd != c))
        return err_set(err, "[data] mean and std need one value, or one per channel (%d), for "
                            "the %d-channel images of %s", c, c, ds->source);
    for (int i = 0; i < c; i++) {
        lc->mean[i] = dc->mean[dc->nmean == 1 ? 0 : i];
        lc->std[i] = dc->std[dc->nstd == 1 ? 0 : i];
    }
    return 0;
}

// Opens one set: an image folder (cached in dc->cache/cache_name) or IDX images + labels.
static int open_set(Dataset **out, const DataConfig *dc, const char *path, const char *labels,
                    bool folder, const char *cache_name, Error *err) {
    if (folder) {
        FolderOptions fo = {.width = dc->width, .height = dc->height, .channels = dc->channels,
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
    if (open_set(&d->train, dc, dc->train, dc->train_labels, folder, "train.cache", err))
        goto fail;
    if (dc->val_split > 0.0) {
        Dataset *all = d->train;
        d->train = NULL;
        if (dataset_split(all, dc->val_split, seed, &d->train, &d->test, err)) goto fail;
    } else if (dc->test[0]) {
        if (open_set(&d->test, dc, dc->test, dc->test_labels, folder, "test.cache", err))
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
    if (!d->test) return 0;
    // The test set is read between training epochs only: its loader fills the training
    // loader's batch buffers (the same batch, workers and prefetch; no augmentation).
    if (loader_config(&lc, dc, d->test, batch, seed, false, err) ||
        loader_create_shared(&d->test_loader, d->test, &lc, d->train_loader, err))
        goto fail;
    if (d->test->classes > d->classes) d->classes = d->test->classes;
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
    if (open_set(&d->test, dc, dc->test, dc->test_labels, dc->test_folder, "test.cache", err) ||
        loader_config(&lc, dc, d->test, batch, 0, false, err) ||
        loader_create(&d->test_loader, d->test, &lc, err)) {
        data_close(d);
        return -1;
    }
    d->classes = d->test->classes;
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
