#include "data_cfg.h"

#include <stdbool.h>
#include <string.h>

const CfgKey data_keys[] = {
    {"train", NULL, "training images: an IDX file (raw or .gz)"},
    {"train_labels", NULL, "training labels: an IDX file (raw or .gz)"},
    {"test", "", "test images (IDX); evaluated after each epoch; empty = none"},
    {"test_labels", "", "test labels (IDX); needed with test"},
    {"mean", "0", "per-channel mean subtracted after scaling pixels to [0, 1]"},
    {"std", "1", "per-channel standard deviation divided by after that"},
    {"shuffle", "1", "1: a new seeded order of the training set each epoch; 0: file order"},
    {"drop_last", "0", "1: skip the last training batch if it is smaller than batch"},
};
const int data_nkeys = sizeof data_keys / sizeof data_keys[0];

static int read_floats(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
                       float *out, int *n, Error *err) {
    double v[DATASET_MAX_CHANNELS];
    if (cfg_floats(cfg, s, key, def, v, DATASET_MAX_CHANNELS, n, err)) return -1;
    for (int i = 0; i < *n; i++) out[i] = (float)v[i];
    return 0;
}

int data_cfg_read(DataConfig *dc, const Cfg *cfg, const CfgSection *s, Error *err) {
    int64_t shuffle, drop_last;
    if (cfg_check_keys(cfg, s, data_keys, data_nkeys, err) ||
        cfg_str(cfg, s, "train", NULL, &dc->train, err) ||
        cfg_str(cfg, s, "train_labels", NULL, &dc->train_labels, err) ||
        cfg_str(cfg, s, "test", "", &dc->test, err) ||
        cfg_str(cfg, s, "test_labels", "", &dc->test_labels, err) ||
        read_floats(cfg, s, "mean", "0", dc->mean, &dc->nmean, err) ||
        read_floats(cfg, s, "std", "1", dc->std, &dc->nstd, err) ||
        cfg_int(cfg, s, "shuffle", "1", 0, 1, &shuffle, err) ||
        cfg_int(cfg, s, "drop_last", "0", 0, 1, &drop_last, err))
        return -1;
    for (int i = 0; i < dc->nstd; i++)
        if (!(dc->std[i] > 0.0f))
            return err_set(err, "%s:%d: [data] std: every value must be > 0", cfg->path, s->line);
    if (dc->test[0] && !dc->test_labels[0])
        return err_set(err, "%s:%d: [data] test is set but test_labels is not", cfg->path, s->line);
    dc->shuffle = (int)shuffle, dc->drop_last = (int)drop_last;
    return 0;
}

// One mean/std value applies to every channel; otherwise one per channel.
static int loader_config(LoaderConfig *lc, const DataConfig *dc, const Dataset *ds, int batch,
                         uint64_t seed, bool train, Error *err) {
    *lc = (LoaderConfig){.batch = batch, .shuffle = train ? dc->shuffle : 0,
                         .drop_last = train ? dc->drop_last : 0, .seed = seed};
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

int data_open(Data *d, const DataConfig *dc, int batch, uint64_t seed, Error *err) {
    memset(d, 0, sizeof *d);
    LoaderConfig lc;
    if (idx_dataset_open(&d->train, dc->train, dc->train_labels, err) ||
        loader_config(&lc, dc, d->train, batch, seed, true, err) ||
        loader_create(&d->train_loader, d->train, &lc, err))
        goto fail;
    d->classes = d->train->classes;
    if (!dc->test[0]) return 0;
    if (idx_dataset_open(&d->test, dc->test, dc->test_labels, err)) goto fail;
    const Shape a = d->train->shape, b = d->test->shape;
    if (a.c != b.c || a.h != b.h || a.w != b.w) {
        err_set(err, "%s has %dx%dx%d images (C x H x W) but %s has %dx%dx%d", dc->test, b.c,
                b.h, b.w, dc->train, a.c, a.h, a.w);
        goto fail;
    }
    if (loader_config(&lc, dc, d->test, batch, seed, false, err) ||
        loader_create(&d->test_loader, d->test, &lc, err))
        goto fail;
    if (d->test->classes > d->classes) d->classes = d->test->classes;
    return 0;
fail:
    data_close(d);
    return -1;
}

void data_close(Data *d) {
    loader_destroy(d->train_loader);
    loader_destroy(d->test_loader);
    dataset_close(d->train);
    dataset_close(d->test);
    memset(d, 0, sizeof *d);
}

size_t data_loader_bytes(const Data *d) {
    // loader_bytes needs the config the loader was made with; the loaders keep it.
    return loader_size(d->train_loader) + (d->test_loader ? loader_size(d->test_loader) : 0);
}
