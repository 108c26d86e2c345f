// loader.c: the batched loader (DESIGN.md decision 8): worker threads, a ring of batch
// buffers, augmentation.
//
// Each epoch has an order of sample indices that is a pure function of (seed, epoch):
// Fisher-Yates driven by the counter-based RNG, recomputed from scratch every epoch. So
// any epoch can be started directly (resuming a run) and gives the same batches as an
// uninterrupted run.
//
// Batch k of an epoch is a pure function of (seed, epoch, k) and the files: batch_fill
// reads positions [k * batch, k * batch + n) of the order and augments each sample with
// random numbers keyed by (seed, epoch, sample index); loader_next hands out the slot's
// bytes as they are, with the table of their normalised values (the network's first layer
// reads them through it: no float copy of a batch anywhere). Bad samples
// (skip_bad) are replaced by the next good samples of the order after the batch, so no
// batch depends on another one. Who fills a batch, and when, changes nothing: with
// workers = N, N threads fill batches ahead into a ring of `prefetch` slots (batch k
// goes to slot k % prefetch), and loader_next hands them out in order; with workers = 0
// loader_next fills the one slot itself.
//
// Two loaders may share one ring (loader_create_shared: the test set's, which only runs
// between training epochs): the ring's memory then serves the loader that started an
// epoch last, and starting one stops the other's fills first.
//
// Synchronisation: one mutex guards the ring's bookkeeping (slot states, fill_next,
// released, busy); a slot's buffers belong to the worker filling it until it is marked
// ready under the mutex, then to the caller until its next loader_next. The order and
// the epoch change only when no worker is busy. A shared ring's owner changes in the
// caller's thread, after the old owner's workers are idle (under its mutex).
#include "dataset.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#include "../nn/rng.h"

#define LOADER_MAX_WORKERS 256

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_FAILED };

typedef struct Slot {
    int32_t *y;        // (batch)
    uint8_t *pixels;   // (batch, H, W, C) bytes as read (and augmented), before normalising
    int64_t batch;     // the batch it holds or is being filled with; -1: none
    int state;         // SLOT_*
    int n;             // samples in it
    int offset;        // where they start in the whole batch (a shard's part)
    int64_t skipped;   // bad samples skipped while filling it
    Error err;         // SLOT_FAILED: why
} Slot;

// The batch buffers: each slot's labels and bytes, and each filler's augmentation scratch,
// in one block; offsets in bytes, y and pixels of slot 0 with the other slots after them.
typedef struct RingLayout {
    int nslots;
    size_t y_b, px_b;                      // one slot's y and pixels
    size_t y, pixels, scratch, scratch_b;  // where they start; all the fillers' scratch
    size_t total;
} RingLayout;

typedef struct Ring {
    uint8_t *block;        // lay.total bytes
    RingLayout lay;
    int users;             // loaders on it: freed with the last
    struct Loader *owner;  // the loader whose batches the slots hold; NULL: none yet
} Ring;

typedef struct Worker {
    struct Loader *l;
    uint8_t *scratch;  // (H, W, C) one sample before augmentation; NULL without it
    pthread_t thread;
} Worker;

struct Loader {
    Dataset *ds;          // not owned
    LoaderConfig cfg;
    int64_t sample;       // bytes (= values) of one sample: H * W * C
    int64_t batches;      // per epoch
    int augment;          // any of crop_pad, crop, flip, jitter
    int nslots;           // ring size: 1 with workers = 0, else prefetch
    int nworkers;
    int64_t *order;       // (count) sample indices of the epoch, in batch order (owned)
    Ring *ring;           // the slots' buffers: its own, or another loader's (shared)
    bool own_ring;        // made by this loader: its bytes are in loader_size
    Slot *slots;          // (nslots) pointing into the ring
    uint8_t *scratch;     // (max(workers, 1), H, W, C) in the ring with augmentation, else NULL
    Worker *workers;      // (nworkers)
    float lut[DATASET_MAX_CHANNELS][256];  // (C, 256) the normalised value of each byte
    Batch batch;          // what loader_next hands out: a slot's pixels and y, and lut

    // The caller's side (loader_start_epoch, loader_next, loader_stats).
    int epoch;            // the epoch started last
    int64_t next;         // next batch loader_next returns; -1 before the first epoch
    int held;             // slot the caller holds (handed out last), or -1
    int64_t delivered;    // samples handed out this epoch
    LoaderStats stats;

    // Shared with the workers, under mu.
    pthread_mutex_t mu;
    pthread_cond_t work;  // a batch can be taken, or quit
    pthread_cond_t done;  // a slot is ready or failed, or a worker went idle
    int64_t fill_next;    // the next batch a worker takes
    int64_t released;     // batches below this are handed out and given back (their slots free)
    int busy;             // workers filling a batch now
    int quit;
    uint64_t gen;         // atomic: changes when an epoch starts; a fill of an older one stops
    int threads_started;  // workers running (joined by loader_destroy)
};

// ---- the memory plan ---------------------------------------------------------------------

static int loader_nslots(const LoaderConfig *cfg) {
    if (cfg->workers <= 0) return 1;
    return cfg->prefetch >= 1 ? cfg->prefetch : 2 * cfg->workers;
}

static int loader_augments(const LoaderConfig *cfg) {
    return cfg->crop_pad > 0 || cfg->crop.scale[0] > 0 || cfg->flip || cfg->jitter[0] > 0 ||
           cfg->jitter[1] > 0 || cfg->jitter[2] > 0;
}

// The samples of each batch that this process reads: the whole batch, or its shard's part.
static int loader_part(const LoaderConfig *cfg) {
    return cfg->nshards > 1 ? cfg->batch / cfg->nshards : cfg->batch;
}

// The ring a loader of cfg over ds needs, and the bytes of its order. Slots' y first, then
// their pixels, then the scratch; each at an offset that is a multiple of its element size.
// Returns -1 if the configuration is invalid or the sizes overflow.
static int loader_layout(const Dataset *ds, const LoaderConfig *cfg, RingLayout *lay, size_t *order_b) {
    int64_t sample = shape_numel(ds->shape);
    size_t values, all;
    if (ds->count < 0 || sample <= 0 || cfg->batch <= 0 || cfg->workers < 0 ||
        cfg->workers > LOADER_MAX_WORKERS || cfg->prefetch > 4096)
        return -1;
    const size_t slots = (size_t)loader_nslots(cfg);
    const size_t fillers = (size_t)(cfg->workers > 0 ? cfg->workers : 1);
    const size_t part = (size_t)loader_part(cfg);  // the samples of a batch this process takes
    if (__builtin_mul_overflow(part, (size_t)sample, &values)) return -1;
    if (__builtin_mul_overflow((size_t)ds->count, sizeof(int64_t), order_b)) return -1;
    lay->nslots = (int)slots;
    lay->y_b = part * sizeof(int32_t);
    lay->px_b = values;
    lay->scratch_b = 0;
    size_t per_slot = lay->y_b + lay->px_b;
    if (per_slot < lay->px_b) return -1;
    if (__builtin_mul_overflow(per_slot, slots, &all)) return -1;
    if (loader_augments(cfg) && __builtin_mul_overflow(fillers, (size_t)sample, &lay->scratch_b))
        return -1;
    lay->y = 0;
    lay->pixels = slots * lay->y_b;
    lay->scratch = all;
    if (__builtin_add_overflow(all, lay->scratch_b, &lay->total)) return -1;
    return 0;
}

// Contract: a loader allocates
//   count * sizeof(int64_t)             the order of the epoch
// and, unless it shares another loader's ring (loader_create_shared), the ring's one block:
// + S * batch * sizeof(int32_t)         y of each slot, the labels
// + S * batch * H*W*C                   the bytes of each slot's batch as read (and handed out)
// + F * H*W*C                           with augmentation: one sample per filler
// where S = 1 with workers = 0, else prefetch (2 * workers if prefetch < 1), F =
// max(workers, 1), and batch is the shard's part with shards. The Loader struct, its slot
// table and the threads' stacks are not counted (fixed, a few KB plus the stacks' touched
// pages), nor the transient decode of an image (loader_read_bytes).
// 0 when the configuration is invalid; loader_create then says why.
size_t loader_size(const Loader *l) {
    if (!l) return 0;
    return (size_t)l->ds->count * sizeof(int64_t) + (l->own_ring ? l->ring->lay.total : 0);
}

size_t loader_size_at(const Loader *l, int prefetch) {
    if (!l || !l->own_ring) return loader_size(l);
    LoaderConfig c = l->cfg;
    c.prefetch = prefetch;
    return loader_bytes(l->ds, &c);
}

size_t loader_read_bytes(const Loader *l) {
    return l ? (size_t)(l->cfg.workers > 0 ? l->cfg.workers : 1) * l->ds->read_bytes : 0;
}

size_t loader_bytes(const Dataset *ds, const LoaderConfig *cfg) {
    RingLayout lay;
    size_t order_b;
    if (!ds || !cfg || loader_layout(ds, cfg, &lay, &order_b) != 0 || order_b + lay.total < order_b) return 0;
    return order_b + lay.total;
}

int64_t loader_batches(const Loader *l) { return l->batches; }

void loader_stats(const Loader *l, LoaderStats *out) { *out = l->stats; }

// ---- the order ------------------------------------------------------------------------------

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

// ---- augmentation ------------------------------------------------------------------------

// dst (H, W, C) = src (H, W, C) cropped as cfg says, for the sample whose key is key:
// crop_pad's shifted window, a random resized crop of the sample itself (a set that cannot
// crop the images its samples came from: IDX), or src as it is. Returns -1 only if the
// resize of a resized crop runs out of memory.
static int crop_sample(const LoaderConfig *cfg, Shape sh, uint64_t key, const uint8_t *src,
                       uint8_t *dst) {
    const int H = sh.h, W = sh.w, C = sh.c;
    const size_t row = (size_t)W * C;
    if (cfg->crop_pad > 0) {
        // torchvision's RandomCrop(size, padding=P): zero padding, a uniform offset.
        const int P = cfg->crop_pad;
        const int dx = (int)draw_below(key, AUG_PAD_X, AUG_COUNTERS, (uint64_t)(2 * P + 1)) - P;
        const int dy = (int)draw_below(key, AUG_PAD_Y, AUG_COUNTERS, (uint64_t)(2 * P + 1)) - P;
        // Columns x with 0 <= x + dx < W come from src; the rest, and rows outside, are 0.
        const int x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? W - dx : W;
        for (int y = 0; y < H; y++) {
            uint8_t *d = dst + (size_t)y * row;
            const int sy = y + dy;
            memset(d, 0, row);
            if (sy >= 0 && sy < H && x1 > x0)
                memcpy(d + (size_t)x0 * C, src + (size_t)sy * row + (size_t)(x0 + dx) * C,
                       (size_t)(x1 - x0) * C);
        }
        return 0;
    }
    if (cfg->crop.scale[0] > 0) {
        const CropBox b = resized_crop_box(&cfg->crop, key, W, H);
        return image_resize(src + (size_t)b.y * row + (size_t)b.x * C, b.w, b.h, row, C, dst, W, H);
    }
    memcpy(dst, src, (size_t)H * row);
    return 0;
}

// A horizontal flip of px (H, W, C) in place.
static void flip(uint8_t *px, Shape sh) {
    const size_t row = (size_t)sh.w * sh.c;
    for (int y = 0; y < sh.h; y++) {
        uint8_t *r = px + (size_t)y * row;
        for (int a = 0, b = sh.w - 1; a < b; a++, b--)
            for (int c = 0; c < sh.c; c++) {
                const uint8_t t = r[(size_t)a * sh.c + c];
                r[(size_t)a * sh.c + c] = r[(size_t)b * sh.c + c];
                r[(size_t)b * sh.c + c] = t;
            }
    }
}

// ---- filling a batch ---------------------------------------------------------------------

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Reads sample idx, augmented, into dst: a crop (crop_pad, or crop's random resized crop
// of the sample's image where the set has it, else of the sample), a horizontal flip,
// colour jitter, in torchvision's usual order. Returns 0, DATASET_BAD or -1 like Dataset read.
static int read_sample(const Loader *l, int epoch, int64_t idx, uint8_t *dst, int32_t *label,
                       uint8_t *scratch, Error *err) {
    const Dataset *ds = l->ds;
    const LoaderConfig *cfg = &l->cfg;
    if (!l->augment) return ds->ops->read(ds, idx, dst, label, err);
    const uint64_t key = rng_key(cfg->seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)idx);
    int rc;
    if (cfg->crop.scale[0] > 0 && ds->ops->read_crop) {
        rc = ds->ops->read_crop(ds, idx, &cfg->crop, key, dst, label, err);
    } else if (!(rc = ds->ops->read(ds, idx, scratch, label, err)) &&
               crop_sample(cfg, ds->shape, key, scratch, dst)) {
        rc = err_set(err, "%s: sample %" PRId64 ": out of memory in the resized crop", ds->source, idx);
    }
    if (rc) return rc;
    if (cfg->flip && (rng_u64(key, AUG_FLIP) >> 63)) flip(dst, ds->shape);
    if (cfg->jitter[0] > 0 || cfg->jitter[1] > 0 || cfg->jitter[2] > 0)
        color_jitter(dst, (int64_t)ds->shape.h * ds->shape.w, ds->shape.c, cfg->jitter, key);
    return 0;
}

static int cancelled(Loader *l, uint64_t gen) {
    return __atomic_load_n(&l->gen, __ATOMIC_ACQUIRE) != gen;
}

// Puts where it happened before err's message, counting epochs and batches from 1 as the
// trainer shows them; for a bad file, says how to go on. Returns -1.
static int fill_error(const Loader *l, int epoch, int64_t k, int bad, Error *err) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return err_set(err, "epoch %d, batch %" PRId64 " of %" PRId64 ": %s%s", epoch + 1, k + 1,
                   l->batches, msg,
                   bad ? "; or set skip_bad = 1 to skip such files (counted each epoch)" : "");
}

// Fills slot s with batch k of epoch `epoch`: reads positions [k * batch, k * batch + n) of
// the order into s->pixels and s->y. A bad sample (with
// skip_bad) is counted in s->skipped and, with fill_bad, replaced by the next good sample
// of the order after the batch (wrapping around; never one of the batch's own); without,
// or when none is left, the batch is shorter. Touches the loader's immutable state, the
// order (constant while a fill runs) and s only. Returns 0, 1 if the epoch changed
// (gen) before it finished (s is then garbage), or -1 with err naming the file, sample,
// epoch and batch.
static int batch_fill(Loader *l, int epoch, int64_t k, Slot *s, uint8_t *scratch, uint64_t gen,
                      Error *err) {
    const Dataset *ds = l->ds;
    const int64_t sample = l->sample, count = ds->count, begin = k * l->cfg.batch;
    const int all = (int)(count - begin < l->cfg.batch ? count - begin : l->cfg.batch);
    // This shard's part of the batch: positions [offset, offset + n) of it.
    const int part = loader_part(&l->cfg), offset = l->cfg.nshards > 1 ? l->cfg.shard * part : 0;
    const int n = offset >= all ? 0 : all - offset < part ? all - offset : part;
    const int64_t start = begin + offset;
    s->offset = offset;
    int64_t t = 0;  // the next position to borrow from: (start + n + t) % count
    int m = 0;      // samples placed
    s->skipped = 0;
    for (int j = 0; j < n; j++) {
        if (cancelled(l, gen)) return 1;
        uint8_t *dst = s->pixels + (size_t)m * (size_t)sample;
        int rc = read_sample(l, epoch, l->order[start + j], dst, &s->y[m], scratch, err);
        if (rc == 0) {
            m++;
            continue;
        }
        if (rc != DATASET_BAD || !l->cfg.skip_bad)
            return fill_error(l, epoch, k, rc == DATASET_BAD, err);
        s->skipped++;
        if (!l->cfg.fill_bad || l->cfg.nshards > 1) continue;  // shards: no borrowing across parts
        while (t < count - n) {
            int64_t p = (start + n + t++) % count;
            rc = read_sample(l, epoch, l->order[p], dst, &s->y[m], scratch, err);
            if (rc == 0) {
                m++;
                break;
            }
            if (rc != DATASET_BAD) return fill_error(l, epoch, k, 0, err);
        }
    }
    s->n = m;
    return 0;
}

// ---- the workers -------------------------------------------------------------------------------

static void *worker_main(void *arg) {
    Worker *w = arg;
    Loader *l = w->l;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && !(l->fill_next < l->batches && l->fill_next < l->released + l->nslots))
            pthread_cond_wait(&l->work, &l->mu);
        if (l->quit) break;
        const int64_t k = l->fill_next++;
        Slot *s = &l->slots[k % l->nslots];
        s->state = SLOT_FILLING;
        s->batch = k;
        const uint64_t gen = __atomic_load_n(&l->gen, __ATOMIC_RELAXED);
        const int epoch = l->epoch;
        l->busy++;
        pthread_mutex_unlock(&l->mu);

        Error err = {{0}};
        int rc = batch_fill(l, epoch, k, s, w->scratch, gen, &err);

        pthread_mutex_lock(&l->mu);
        l->busy--;
        if (__atomic_load_n(&l->gen, __ATOMIC_RELAXED) == gen) {
            s->state = rc == 0 ? SLOT_READY : SLOT_FAILED;
            if (rc) s->err = err;
        }
        pthread_cond_broadcast(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

// ---- the interface ---------------------------------------------------------------------------------

void normalise_table(float *lut, int C, const float *mean, const float *std) {
    // Exactly PyTorch's ToTensor + Normalize in fp32: (b / 255 - mean) / std.
    for (int c = 0; c < C; c++)
        for (int b = 0; b < 256; b++) lut[c * 256 + b] = ((float)b / 255.0f - mean[c]) / std[c];
}

static void ring_release(Ring *r, Loader *l) {
    if (!r) return;
    if (r->owner == l) r->owner = NULL;
    if (--r->users > 0) return;
    free(r->block);
    free(r);
}

void loader_destroy(Loader *l) {
    if (!l) return;
    if (l->threads_started) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        __atomic_add_fetch(&l->gen, 1, __ATOMIC_RELEASE);  // a fill in progress stops early
        pthread_cond_broadcast(&l->work);
        pthread_mutex_unlock(&l->mu);
        for (int i = 0; i < l->threads_started; i++) pthread_join(l->workers[i].thread, NULL);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->done);
    ring_release(l->ring, l);
    free(l->workers);
    free(l->slots);
    free(l->order);
    free(l);
}

// The checks of loader_create; the ring's layout and the order's bytes into *lay, *order_b.
static int loader_check(const Dataset *ds, const LoaderConfig *cfg, RingLayout *lay, size_t *order_b,
                        Error *err) {
    if (cfg->batch <= 0)
        return err_set(err, "%s: batch = %d; the batch size must be at least 1", ds->source,
                       cfg->batch);
    if (cfg->nshards > 1 && (cfg->shard < 0 || cfg->shard >= cfg->nshards || cfg->batch % cfg->nshards))
        return err_set(err, "%s: shard %d of %d with batch = %d: the batch must divide among the "
                       "shards", ds->source, cfg->shard, cfg->nshards, cfg->batch);
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
    if (cfg->workers < 0 || cfg->workers > LOADER_MAX_WORKERS)
        return err_set(err, "%s: workers = %d; use 0 (read in the trainer's thread) to %d",
                       ds->source, cfg->workers, LOADER_MAX_WORKERS);
    if (cfg->prefetch > 4096)
        return err_set(err, "%s: prefetch = %d; at most 4096 batch buffers", ds->source,
                       cfg->prefetch);
    if (cfg->crop_pad < 0 || cfg->crop_pad > 4096)
        return err_set(err, "%s: crop_pad = %d; use 0 (off) to 4096 pixels", ds->source,
                       cfg->crop_pad);
    const ResizedCrop *rc = &cfg->crop;
    if (rc->scale[0] != 0 &&
        !(rc->scale[0] > 0 && rc->scale[0] <= rc->scale[1] && rc->scale[1] <= 1 &&
          rc->ratio[0] > 0 && rc->ratio[0] <= rc->ratio[1] && rc->ratio[1] < INFINITY))
        return err_set(err, "%s: crop_scale = %g, %g and crop_ratio = %g, %g; a random resized "
                       "crop's area fraction lies in 0 < smallest <= largest <= 1, its aspect "
                       "ratio in 0 < smallest <= largest", ds->source, rc->scale[0], rc->scale[1],
                       rc->ratio[0], rc->ratio[1]);
    if (cfg->crop_pad > 0 && rc->scale[0] > 0)
        return err_set(err, "%s: crop_pad = %d and crop_scale = %g: choose one crop", ds->source,
                       cfg->crop_pad, rc->scale[0]);
    for (int k = 0; k < 3; k++)
        if (!(cfg->jitter[k] >= 0 && cfg->jitter[k] <= 100))
            return err_set(err, "%s: jitter = %g, %g, %g; the amounts of brightness, contrast and "
                           "saturation lie in [0, 100] (0: none)", ds->source, cfg->jitter[0],
                           cfg->jitter[1], cfg->jitter[2]);
    if (ds->count <= 0 || (cfg->drop_last && ds->count < cfg->batch))
        return err_set(err, "%s: %" PRId64 " samples%s with batch = %d: an epoch would have no "
                       "batch; use a smaller batch%s",
                       ds->source, ds->count, cfg->drop_last ? " and drop_last" : "",
                       cfg->batch, cfg->drop_last ? " or drop_last = 0" : "");
    if (loader_layout(ds, cfg, lay, order_b) != 0)
        return err_set(err, "%s: batch %d of %" PRId64 " values over %" PRId64 " samples "
                       "overflows the address space; use a smaller batch",
                       ds->source, cfg->batch, shape_numel(ds->shape), ds->count);
    return 0;
}

// The loader over ds with cfg, its batches in ring r (NULL: a ring of its own, laid out
// as lay), its workers started.
static int loader_open(Loader **out, Dataset *ds, const LoaderConfig *cfg, const RingLayout *lay,
                       size_t order_b, Ring *r, Error *err) {
    Loader *l = xcalloc(1, sizeof *l, err);
    if (!l) return -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->done, NULL);
    l->ds = ds;
    l->cfg = *cfg;
    l->sample = shape_numel(ds->shape);
    l->batches = cfg->drop_last ? ds->count / cfg->batch
                                : (ds->count + cfg->batch - 1) / cfg->batch;
    l->augment = loader_augments(cfg);
    l->nslots = loader_nslots(cfg);
    l->nworkers = cfg->workers;
    l->next = -1;
    l->held = -1;
    if (!r) {
        r = xcalloc(1, sizeof *r, err);
        if (r && !(r->block = xcalloc(lay->total ? lay->total : 1, 1, err))) free(r), r = NULL;
        if (r) r->lay = *lay;
        l->own_ring = true;
    }
    if (r) r->users++;
    l->ring = r;
    l->order = r ? xcalloc(order_b, 1, err) : NULL;
    l->slots = l->order ? xcalloc((size_t)l->nslots, sizeof *l->slots, err) : NULL;
    l->workers = l->slots && l->nworkers
                     ? xcalloc((size_t)l->nworkers, sizeof *l->workers, err) : NULL;
    if (!l->slots || (l->nworkers && !l->workers)) {
        err_wrap(err, "%s: loader buffers (%zu bytes)", ds->source, order_b + (l->own_ring ? lay->total : 0));
        loader_destroy(l);
        return -1;
    }
    uint8_t *base = r->block;
    for (int i = 0; i < l->nslots; i++) {
        Slot *s = &l->slots[i];
        s->y = (int32_t *)(void *)(base + r->lay.y + (size_t)i * r->lay.y_b);
        s->pixels = base + r->lay.pixels + (size_t)i * r->lay.px_b;
        s->batch = -1;
    }
    if (l->augment) l->scratch = base + r->lay.scratch;
    normalise_table(&l->lut[0][0], ds->shape.c, cfg->mean, cfg->std);
    l->fill_next = l->batches;  // nothing to fill before the first epoch
    for (int i = 0; i < l->nworkers; i++) {
        Worker *w = &l->workers[i];
        w->l = l;
        w->scratch = l->scratch ? l->scratch + (size_t)i * (size_t)l->sample : NULL;
        int e = pthread_create(&w->thread, NULL, worker_main, w);
        if (e) {
            err_set(err, "%s: cannot start loader worker %d of %d: %s; use fewer workers",
                    ds->source, i + 1, l->nworkers, strerror(e));
            loader_destroy(l);
            return -1;
        }
        l->threads_started++;
    }
    *out = l;
    return 0;
}

int loader_create(Loader **out, Dataset *ds, const LoaderConfig *cfg, Error *err) {
    *out = NULL;
    RingLayout lay;
    size_t order_b;
    if (loader_check(ds, cfg, &lay, &order_b, err)) return -1;
    return loader_open(out, ds, cfg, &lay, order_b, NULL, err);
}

int loader_create_shared(Loader **out, Dataset *ds, const LoaderConfig *cfg, Loader *with,
                         Error *err) {
    *out = NULL;
    RingLayout lay;
    size_t order_b;
    if (loader_check(ds, cfg, &lay, &order_b, err)) return -1;
    const RingLayout *has = &with->ring->lay;
    if (lay.nslots > has->nslots || lay.y_b > has->y_b || lay.px_b > has->px_b || lay.scratch_b > has->scratch_b)
        return err_set(err, "%s: its batches (%d slots of %zu bytes, %zu bytes of scratch) do not "
                       "fit the batch buffers of %s (%d slots of %zu bytes, %zu of scratch) that "
                       "it would share; give it the same batch, workers and prefetch",
                       ds->source, lay.nslots, lay.px_b, lay.scratch_b, with->ds->source,
                       has->nslots, has->px_b, has->scratch_b);
    return loader_open(out, ds, cfg, &lay, order_b, with->ring, err);
}

// Stops o's fills and forgets its epoch: the ring o shares goes to another loader. o's
// workers finish what they fill (their epoch's gen changes: they stop early) and wait.
static void loader_yield_ring(Loader *o) {
    pthread_mutex_lock(&o->mu);
    __atomic_add_fetch(&o->gen, 1, __ATOMIC_RELEASE);
    o->fill_next = o->batches;
    while (o->busy > 0) pthread_cond_wait(&o->done, &o->mu);
    for (int i = 0; i < o->nslots; i++) {
        o->slots[i].state = SLOT_FREE;
        o->slots[i].batch = -1;
    }
    o->held = -1;
    pthread_mutex_unlock(&o->mu);
}

int loader_start_epoch(Loader *l, int epoch, int64_t first, Error *err) {
    if (epoch < 0)
        return err_set(err, "%s: epoch %d: epochs count from 0", l->ds->source, epoch);
    if (first < 0 || first > l->batches)
        return err_set(err, "%s: epoch %d: cannot start at batch %" PRId64 ", an epoch has "
                       "batches 0 to %" PRId64 "; is the checkpoint from another batch size "
                       "or data set?",
                       l->ds->source, epoch, first, l->batches - 1);
    if (l->ring->owner && l->ring->owner != l) loader_yield_ring(l->ring->owner);
    l->ring->owner = l;
    pthread_mutex_lock(&l->mu);
    // Stop the fills of the epoch before (they return early) and wait for them: the order
    // and the slots change below.
    __atomic_add_fetch(&l->gen, 1, __ATOMIC_RELEASE);
    l->fill_next = l->batches;
    while (l->busy > 0) pthread_cond_wait(&l->done, &l->mu);
    loader_shuffle(l->order, l->ds->count, l->cfg.shuffle, l->cfg.seed, epoch);
    for (int i = 0; i < l->nslots; i++) {
        l->slots[i].state = SLOT_FREE;
        l->slots[i].batch = -1;
    }
    l->epoch = epoch;
    l->next = first;
    l->held = -1;
    l->delivered = 0;
    l->stats = (LoaderStats){0};
    l->released = first;
    l->fill_next = first;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

// loader_next without the clock.
static int loader_get(Loader *l, const Batch **out, Error *err) {
    for (;;) {
        Slot *s;
        if (l->nworkers == 0) {
            if (l->next >= l->batches) break;
            s = &l->slots[0];
            if (batch_fill(l, l->epoch, l->next, s, l->scratch,
                           __atomic_load_n(&l->gen, __ATOMIC_RELAXED), err))
                return -1;
        } else {
            pthread_mutex_lock(&l->mu);
            if (l->held >= 0) {  // the batch handed out last is done with: its slot is free
                l->slots[l->held].state = SLOT_FREE;
                l->released = l->next;
                l->held = -1;
                pthread_cond_broadcast(&l->work);
            }
            if (l->next >= l->batches) {
                pthread_mutex_unlock(&l->mu);
                break;
            }
            const int i = (int)(l->next % l->nslots);
            s = &l->slots[i];
            while (!(s->batch == l->next && (s->state == SLOT_READY || s->state == SLOT_FAILED)))
                pthread_cond_wait(&l->done, &l->mu);
            if (s->state == SLOT_FAILED) {
                *err = s->err;
                pthread_mutex_unlock(&l->mu);
                return -1;
            }
            l->held = i;
            pthread_mutex_unlock(&l->mu);
        }
        l->stats.skipped += s->skipped;
        const int64_t k = l->next++;
        // Every sample of the batch was bad and skipped: the next batch (a shard hands out
        // its empty part, so every process takes part in every step).
        if (s->n == 0 && l->cfg.nshards <= 1) continue;
        l->batch.px = s->pixels;
        l->batch.lut = &l->lut[0][0];
        l->batch.y = s->y;
        l->batch.n = s->n;
        l->batch.offset = s->offset;
        l->batch.index = k;
        l->delivered += s->n;
        *out = &l->batch;
        return 0;
    }
    if (l->delivered == 0 && l->stats.skipped > 0)
        return err_set(err, "%s: epoch %d: all %" PRId64 " samples were bad files and skipped; "
                       "check the data (the loader's first error names a file)",
                       l->ds->source, l->epoch, l->stats.skipped);
    return 0;
}

int loader_next(Loader *l, const Batch **out, Error *err) {
    *out = NULL;
    if (l->next < 0)
        return err_set(err, "%s: loader_next before loader_start_epoch", l->ds->source);
    if (l->ring->owner != l)
        return err_set(err, "%s: loader_next after the loader sharing its batch buffers started an "
                       "epoch; start one of this loader's first (loader_start_epoch)", l->ds->source);
    const double t0 = now_seconds();
    int rc = loader_get(l, out, err);
    l->stats.wait_seconds += now_seconds() - t0;
    return rc;
}
