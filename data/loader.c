// loader.c: the batched loader (DESIGN.md decision 8), synchronous for now.
//
// Each epoch has an order of sample indices that is a pure function of (seed, epoch):
// Fisher-Yates driven by the counter-based RNG, recomputed from scratch every epoch. So
// any epoch can be started directly (resuming a run) and gives the same batches as an
// uninterrupted run. batch_fill assembles one batch from a list of indices and touches
// only its arguments, so the worker threads of a later version can each call it on their
// own buffers; the batches do not depend on who fills them.
#include "dataset.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/rng.h"

__extension__ typedef unsigned __int128 u128;

struct Loader {
    Dataset *ds;          // not owned
    LoaderConfig cfg;
    int64_t sample;       // bytes (= values) of one sample: H * W * C
    int64_t batches;      // per epoch
    int epoch;            // the epoch started last
    int64_t next;         // next batch loader_next returns; -1 before the first epoch
    void *block;          // the one allocation of loader_bytes bytes behind the four below
    int64_t *order;       // (count) sample indices of the epoch, in batch order
    float *x;             // (batch, H, W, C) normalised
    int32_t *y;           // (batch)
    uint8_t *pixels;      // (batch, H, W, C) bytes as read, before normalising
    float lut[DATASET_MAX_CHANNELS][256];  // (C, 256) the normalised value of each byte
    Batch batch;          // what loader_next hands out: views of x and y
};

// Byte offsets of the buffers in the loader's block, and its size.
typedef struct LoaderLayout {
    size_t order, x, y, pixels, total;
} LoaderLayout;

// Lays out the block: order first (8-byte aligned at offset 0), then x, y, pixels, each
// at an offset that is a multiple of its element size. Returns -1 if the sizes overflow.
static int loader_layout(const Dataset *ds, const LoaderConfig *cfg, LoaderLayout *lay) {
    int64_t sample = shape_numel(ds->shape);
    size_t values, order_b, x_b, y_b, px_b;
    if (ds->count < 0 || sample <= 0 || cfg->batch <= 0) return -1;
    if (__builtin_mul_overflow((size_t)cfg->batch, (size_t)sample, &values)) return -1;
    if (__builtin_mul_overflow((size_t)ds->count, sizeof(int64_t), &order_b)) return -1;
    if (__builtin_mul_overflow(values, sizeof(float), &x_b)) return -1;
    y_b = (size_t)cfg->batch * sizeof(int32_t);
    px_b = values;
    lay->order = 0;
    lay->x = order_b;
    lay->y = lay->x + x_b;
    if (lay->y < lay->x) return -1;
    lay->pixels = lay->y + y_b;
    if (lay->pixels < lay->y) return -1;
    lay->total = lay->pixels + px_b;
    if (lay->total < lay->pixels) return -1;
    return 0;
}

// Contract: the bytes of the one block loader_create allocates:
//   batch * H*W*C * sizeof(float)   x, the normalised batch
// + batch * sizeof(int32_t)         y, the labels
// + batch * H*W*C                   the bytes of one batch as read
// + count * sizeof(int64_t)         the order of the epoch
// The Loader struct itself (fixed, a few KB with its lookup table) is not counted.
// 0 when the configuration is invalid; loader_create then says why.
size_t loader_size(const Loader *l) { return loader_bytes(l->ds, &l->cfg); }

size_t loader_bytes(const Dataset *ds, const LoaderConfig *cfg) {
    LoaderLayout lay;
    if (!ds || !cfg || loader_layout(ds, cfg, &lay) != 0) return 0;
    return lay.total;
}

int64_t loader_batches(const Loader *l) { return l->batches; }

int loader_create(Loader **out, Dataset *ds, const LoaderConfig *cfg, Error *err) {
    *out = NULL;
    if (cfg->batch <= 0)
        return err_set(err, "%s: batch = %d; the batch size must be at least 1", ds->source,
                       cfg->batch);
    int C = ds->shape.c;
    if (C < 1 || C > DATASET_MAX_CHANNELS || ds->shape.h < 1 || ds->shape.w < 1)
        return err_set(err, "%s: sample shape (%d, %d, %d) (H, W, C) is not supported: the "
                       "loader takes 1 to %d channels and H, W >= 1",
                       ds->source, ds->shape.h, ds->shape.w, C, DATASET_MAX_CHANNELS);
    for (int c = 0; c < C; c++) {
        if (!isfinite(cfg->mean[c]) || !isfinite(cfg->std[c]) || cfg->std[c] == 0.0f)
            return err_set(err, "%s: channel %d: mean %g, std %g; normalisation needs a finite "
                           "mean and a finite, non-zero std (set mean and std in [data])",
                           ds->source, c, cfg->mean[c], cfg->std[c]);
    }
    if (ds->count <= 0 || (cfg->drop_last && ds->count < cfg->batch))
        return err_set(err, "%s: %" PRId64 " samples%s with batch = %d: an epoch would have no "
                       "batch; use a smaller batch%s",
                       ds->source, ds->count, cfg->drop_last ? " and drop_last" : "",
                       cfg->batch, cfg->drop_last ? " or drop_last = 0" : "");
    LoaderLayout lay;
    if (loader_layout(ds, cfg, &lay) != 0)
        return err_set(err, "%s: batch %d of %" PRId64 " values over %" PRId64 " samples "
                       "overflows the address space; use a smaller batch",
                       ds->source, cfg->batch, shape_numel(ds->shape), ds->count);

    Loader *l = xcalloc(1, sizeof *l, err);
    if (!l) return -1;
    l->block = xcalloc(lay.total, 1, err);
    if (!l->block) {
        err_wrap(err, "%s: loader buffers (%zu bytes)", ds->source, lay.total);
        free(l);
        return -1;
    }
    uint8_t *base = l->block;
    l->order = (int64_t *)(void *)(base + lay.order);
    l->x = (float *)(void *)(base + lay.x);
    l->y = (int32_t *)(void *)(base + lay.y);
    l->pixels = base + lay.pixels;
    l->ds = ds;
    l->cfg = *cfg;
    l->sample = shape_numel(ds->shape);
    l->batches = cfg->drop_last ? ds->count / cfg->batch
                                : (ds->count + cfg->batch - 1) / cfg->batch;
    l->next = -1;
    // Exactly PyTorch's ToTensor + Normalize in fp32: (b / 255 - mean) / std.
    for (int c = 0; c < C; c++)
        for (int b = 0; b < 256; b++)
            l->lut[c][b] = ((float)b / 255.0f - cfg->mean[c]) / cfg->std[c];
    l->batch.x = l->x;
    l->batch.y = l->y;
    *out = l;
    return 0;
}

void loader_destroy(Loader *l) {
    if (!l) return;
    free(l->block);
    free(l);
}

// A uniform draw in [0, range), range >= 1, without bias: Lemire's multiply-shift with
// rejection. The first draw uses counter i; the rare redraws use i + k * n, which no
// other position uses, so the result stays a pure function of (key, i).
static uint64_t draw_below(uint64_t key, uint64_t i, uint64_t n, uint64_t range) {
    uint64_t counter = i;
    u128 m = (u128)rng_u64(key, counter) * range;
    uint64_t low = (uint64_t)m;
    if (low < range) {
        uint64_t threshold = (0 - range) % range;  // 2^64 mod range
        while (low < threshold) {
            counter += n;
            m = (u128)rng_u64(key, counter) * range;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

// order = a permutation of 0..n-1 that depends only on (seed, epoch); file order if
// shuffle is off. Fisher-Yates from the back: position i swaps with a uniform j <= i.
static void loader_shuffle(int64_t *order, int64_t n, int shuffle, uint64_t seed, int epoch) {
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    uint64_t key = rng_key(seed, RNG_STREAM_SHUFFLE, (uint64_t)epoch, 0);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)draw_below(key, (uint64_t)i, (uint64_t)n, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

// Fills one batch: reads samples indices[0..n) of ds into pixels (n, H, W, C) and their
// labels into y (n), then writes x (n, H, W, C) = lut[c][byte]. Touches nothing but its
// arguments (Dataset read is thread-safe), so any thread may call it on its own buffers.
static int batch_fill(const Dataset *ds, const float (*lut)[256], const int64_t *indices, int n,
                      float *x, int32_t *y, uint8_t *pixels, Error *err) {
    const int64_t sample = shape_numel(ds->shape);
    const int C = ds->shape.c;
    for (int k = 0; k < n; k++)
        if (ds->ops->read(ds, indices[k], pixels + (size_t)k * (size_t)sample, &y[k], err) != 0)
            return -1;
    const size_t total = (size_t)n * (size_t)sample;
    if (C == 1) {
        for (size_t v = 0; v < total; v++) x[v] = lut[0][pixels[v]];
    } else {
        // Channel-last: value v belongs to channel v % C, and sample sizes are multiples of C.
        for (size_t v = 0; v < total; v += (size_t)C)
            for (int c = 0; c < C; c++) x[v + c] = lut[c][pixels[v + c]];
    }
    return 0;
}

int loader_start_epoch(Loader *l, int epoch, int64_t first, Error *err) {
    if (epoch < 0)
        return err_set(err, "%s: epoch %d: epochs count from 0", l->ds->source, epoch);
    if (first < 0 || first > l->batches)
        return err_set(err, "%s: epoch %d: cannot start at batch %" PRId64 ", an epoch has "
                       "batches 0 to %" PRId64 "; is the checkpoint from another batch size "
                       "or data set?",
                       l->ds->source, epoch, first, l->batches - 1);
    loader_shuffle(l->order, l->ds->count, l->cfg.shuffle, l->cfg.seed, epoch);
    l->epoch = epoch;
    l->next = first;
    return 0;
}

int loader_next(Loader *l, const Batch **out, Error *err) {
    *out = NULL;
    if (l->next < 0)
        return err_set(err, "%s: loader_next before loader_start_epoch", l->ds->source);
    if (l->next >= l->batches) return 0;
    int64_t start = l->next * l->cfg.batch;
    int64_t left = l->ds->count - start;
    int n = left < l->cfg.batch ? (int)left : l->cfg.batch;
    if (batch_fill(l->ds, (const float (*)[256])l->lut, l->order + start, n, l->x, l->y,
                   l->pixels, err) != 0)
        return err_wrap(err, "epoch %d, batch %" PRId64, l->epoch, l->next);
    l->batch.n = n;
    l->batch.index = l->next;
    l->next++;
    *out = &l->batch;
    return 0;
}
