// split.c: a seeded, stratified train/validation split of any Dataset (val_split).
//
// A part is a view: an index map into the shared base dataset, which is closed with the
// last of the two parts. Memory: 8 bytes a sample for the maps, never the samples.
#include "dataset.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/rng.h"

typedef struct SplitBase {
    Dataset *ds;  // owned; closed when refs drops to 0
    int refs;     // parts still open (open and close happen in one thread)
} SplitBase;

typedef struct Part {
    SplitBase *base;
    int64_t *map;  // (count) indices into base->ds, ascending
} Part;

static int part_read(const Dataset *ds, int64_t i, uint8_t *pixels, int32_t *label, Error *err) {
    const Part *p = ds->impl;
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the part has %" PRId64 ")",
                       ds->source, i, ds->count);
    const Dataset *b = p->base->ds;
    return b->ops->read(b, p->map[i], pixels, label, err);
}

static int part_read_crop(const Dataset *ds, int64_t i, const ResizedCrop *crop, uint64_t key,
                          uint8_t *pixels, int32_t *label, Error *err) {
    const Part *p = ds->impl;
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the part has %" PRId64 ")",
                       ds->source, i, ds->count);
    const Dataset *b = p->base->ds;
    return b->ops->read_crop(b, p->map[i], crop, key, pixels, label, err);
}

static int part_label(const Dataset *ds, int64_t i, int32_t *label, Error *err) {
    const Part *p = ds->impl;
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the part has %" PRId64 ")",
                       ds->source, i, ds->count);
    const Dataset *b = p->base->ds;
    return b->ops->label(b, p->map[i], label, err);
}

static void part_close(Dataset *ds) {
    Part *p = ds->impl;
    if (p) {
        if (p->base && --p->base->refs == 0) {
            dataset_close(p->base->ds);
            free(p->base);
        }
        free(p->map);
        free(p);
    }
    dataset_names_free(ds->class_names, ds->classes);
    free(ds->source);
    free(ds->info);
    free(ds);
}

// A part crops as its base does: from the images (read_crop), or the loader crops its samples.
static const DatasetOps part_ops = {.read = part_read, .label = part_label, .close = part_close};
static const DatasetOps part_ops_crop = {.read = part_read, .read_crop = part_read_crop,
                                         .label = part_label, .close = part_close};

// A part of base over map[0..n) (taken over), named "SOURCE (what)".
static Dataset *part_new(SplitBase *base, int64_t *map, int64_t n, const char *what,
                         const char *info, Error *err) {
    Dataset *ds = xcalloc(1, sizeof *ds, err);
    Part *p = ds ? xcalloc(1, sizeof *p, err) : NULL;
    if (!p) {
        free(ds);
        free(map);
        return NULL;
    }
    const Dataset *b = base->ds;
    p->map = map;
    ds->ops = b->ops->read_crop ? &part_ops_crop : &part_ops;
    ds->impl = p;
    ds->count = n;
    ds->shape = b->shape;
    ds->classes = b->classes;
    ds->read_bytes = b->read_bytes;
    size_t len = strlen(b->source) + strlen(what) + 4;
    size_t ilen = strlen(info) + 1;
    if (!(ds->source = xcalloc(len, 1, err)) || !(ds->info = xcalloc(ilen, 1, err)) ||
        !(ds->class_names = dataset_names_copy(b->class_names, b->classes, err))) {
        part_close(ds);  // p->base is not set yet: the base stays with the caller
        return NULL;
    }
    p->base = base;
    base->refs++;
    snprintf(ds->source, len, "%s (%s)", b->source, what);
    memcpy(ds->info, info, ilen);
    return ds;
}

int dataset_split(Dataset *ds, double fraction, uint64_t seed, Dataset **train, Dataset **val,
                  Error *err) {
    *train = *val = NULL;
    if (!(fraction > 0.0 && fraction < 1.0)) {
        err_set(err, "%s: val_split = %g: the validation fraction must lie strictly between 0 "
                "and 1", ds->source, fraction);
        dataset_close(ds);
        return -1;
    }
    const int64_t n = ds->count;
    const int K = ds->classes;
    int32_t *labels = xcalloc((size_t)n, sizeof *labels, err);
    int64_t *start = xcalloc((size_t)K + 1, sizeof *start, err);  // (K + 1) class offsets
    int64_t *fill = xcalloc((size_t)K, sizeof *fill, err);
    int64_t *by_class = xcalloc((size_t)n, sizeof *by_class, err);  // indices grouped by class
    uint8_t *is_val = xcalloc((size_t)n, 1, err);
    int64_t *tmap = NULL, *vmap = NULL;
    SplitBase *base = NULL;
    if (!labels || !start || !fill || !by_class || !is_val) goto fail;
    for (int64_t i = 0; i < n; i++) {
        if (ds->ops->label(ds, i, &labels[i], err)) goto fail;
        if (labels[i] < 0 || labels[i] >= K) {
            err_set(err, "%s: sample %" PRId64 " has label %d outside 0..%d", ds->source, i,
                    labels[i], K - 1);
            goto fail;
        }
        start[labels[i] + 1]++;
    }
    for (int c = 0; c < K; c++) start[c + 1] += start[c];
    for (int64_t i = 0; i < n; i++) by_class[start[labels[i]] + fill[labels[i]]++] = i;

    // Each class sends round(fraction * size) samples to val: at least one if it has two or
    // more, never all of them. Which ones: the first of a seeded Fisher-Yates permutation.
    // (A draw modulo the range: the bias is below range / 2^64, nothing at these sizes.)
    int64_t nval = 0;
    for (int c = 0; c < K; c++) {
        int64_t *idx = by_class + start[c];
        const int64_t m = start[c + 1] - start[c];
        int64_t k = (int64_t)llround(fraction * (double)m);
        if (k == 0 && m >= 2) k = 1;
        if (k >= m) k = m - 1;
        if (k <= 0) continue;
        const uint64_t key = rng_key(seed, RNG_STREAM_SPLIT, (uint64_t)c, 0);
        for (int64_t i = m - 1; i > 0; i--) {
            int64_t j = (int64_t)(rng_u64(key, (uint64_t)i) % (uint64_t)(i + 1));
            int64_t t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
        }
        for (int64_t i = 0; i < k; i++) is_val[idx[i]] = 1;
        nval += k;
    }
    if (nval == 0 || nval == n) {
        err_set(err, "%s: val_split = %g of %" PRId64 " samples leaves %s empty; use a larger "
                "fraction or more images",
                ds->source, fraction, n, nval == 0 ? "the validation part" : "the training part");
        goto fail;
    }
    if (!(tmap = xcalloc((size_t)(n - nval), sizeof *tmap, err)) ||
        !(vmap = xcalloc((size_t)nval, sizeof *vmap, err)))
        goto fail;
    for (int64_t i = 0, t = 0, v = 0; i < n; i++) {
        if (is_val[i])
            vmap[v++] = i;
        else
            tmap[t++] = i;
    }
    if (!(base = xcalloc(1, sizeof *base, err))) goto fail;
    base->ds = ds;
    char info[1200];
    snprintf(info, sizeof info, "%" PRId64 " training and %" PRId64 " validation samples "
             "(val_split %g, stratified by class, seed %" PRIu64 ")%s%s",
             n - nval, nval, fraction, seed, ds->info ? "; " : "", ds->info ? ds->info : "");
    *train = part_new(base, tmap, n - nval, "training part", info, err);
    tmap = NULL;
    if (!*train) goto fail_base;
    *val = part_new(base, vmap, nval, "validation part of val_split", info, err);
    vmap = NULL;
    if (!*val) goto fail_base;
    free(labels), free(start), free(fill), free(by_class), free(is_val);
    return 0;

fail_base:
    // The parts that exist own the base now; closing them closes it.
    if (*train) dataset_close(*train);
    else if (base->refs == 0) dataset_close(ds), free(base);
    *train = *val = NULL;
    free(labels), free(start), free(fill), free(by_class), free(is_val);
    return -1;
fail:
    free(labels), free(start), free(fill), free(by_class), free(is_val), free(tmap), free(vmap);
    free(base);
    dataset_close(ds);
    return -1;
}
