// dataset.h: datasets and the lazy batched loader (DESIGN.md decision 8).
//
// A Dataset holds an index (file descriptors, offsets, paths), never the samples: read
// fetches one sample when the loader needs it. A Loader turns a Dataset into batches of
// bytes in a seeded order, in buffers it owns, handed out with the table of their
// normalised values (the network reads the bytes through it).
#ifndef DATA_DATASET_H
#define DATA_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../nn/error.h"
#include "../nn/tensor.h"
#include "transform.h"

#define DATASET_MAX_CHANNELS 3

typedef struct Dataset Dataset;

// What read returns for a sample whose file is bad (cannot be opened, read or decoded):
// err says which file and why. The loader skips such samples with skip_bad = 1; any
// other failure (-1: an I/O error of the set itself, memory) always stops the run.
enum { DATASET_BAD = 1 };

typedef struct DatasetOps {
    // Reads sample i (0 <= i < count) as bytes into pixels (H, W, C) row-major, the
    // channel-last layout of the network's input, and its class into *label. Returns 0,
    // DATASET_BAD (the sample's file is bad; *label is still set), or -1.
    // Thread-safe: workers call it concurrently on one Dataset.
    int (*read)(const Dataset *ds, int64_t i, uint8_t *pixels, int32_t *label, Error *err);
    // Sample i as a random resized crop (crop's ranges, the box drawn from key) of the image
    // it was made from, at the set's shape: NULL for sets whose samples are their images
    // (IDX), which the loader crops itself. Returns as read does; thread-safe.
    int (*read_crop)(const Dataset *ds, int64_t i, const ResizedCrop *crop, uint64_t key,
                     uint8_t *pixels, int32_t *label, Error *err);
    // The class of sample i without reading its pixels (for a stratified split).
    int (*label)(const Dataset *ds, int64_t i, int32_t *label, Error *err);
    void (*close)(Dataset *ds);
} DatasetOps;

struct Dataset {
    const DatasetOps *ops;
    int64_t count;  // samples
    Shape shape;    // of one sample (c = 1 or 3)
    int classes;    // number of classes (labels are 0 .. classes-1)
    char *source;   // what it was opened from, for messages
    char **class_names;  // (classes) owned: folder names for image folders, "0".."9" for IDX
    char *info;     // owned; one line on how it was opened (cache state, split), or NULL
    size_t read_bytes;  // the most heap one read holds while it decodes (0: none), planned
                        // for each reader (image folders: from every image's header)
    void *impl;
};

// MNIST's IDX format, raw or gzip (.gz): an images file (magic 0x00000803, dimensions
// count x rows x cols, unsigned bytes) and a labels file (magic 0x00000801, count).
// Checks magics, dimensions, file sizes and equal counts; labels must be < 256 and
// classes = max label + 1 over the file. A .gz file is inflated once into an unlinked
// temporary file, so memory does not hold the set. Errors name the file.
int idx_dataset_open(Dataset **out, const char *images_path, const char *labels_path,
                     Error *err);
void dataset_close(Dataset *ds);  // NULL is fine (dataset.c, for every implementation)
// A hash (64-bit FNV-1a) of the set's index: every sample's label in order and the class
// names. Two processes that hash alike train on the same samples in the same order (with
// the same count and shape, which the hash leaves to its caller).
int dataset_index_hash(const Dataset *ds, uint64_t *hash, Error *err);

// How an image file becomes a sample (image.c): torchvision's Resize, then CenterCrop.
typedef enum ImageResize {
    RESIZE_STRETCH,  // to width x height, the aspect ratio not kept: Resize((height, width))
    RESIZE_SHORTER,  // the shorter side to short_side, the aspect kept: Resize(short_side)
} ImageResize;

typedef struct ImageFit {
    int channels;        // 1 (gray) or 3 (RGB)
    ImageResize resize;
    int width, height;   // RESIZE_STRETCH
    int short_side;      // RESIZE_SHORTER
    int center_crop;     // > 0: the sample is the centre center_crop x center_crop of the
                         // resized image (CenterCrop(center_crop)); 0: all of it (stretch only)
} ImageFit;

// The shape of fit's samples: center_crop x center_crop, else width x height.
Shape image_fit_shape(const ImageFit *fit);
// 0 if fit makes samples (channels 1 or 3; sizes 1 to INPUT_MAX_SIDE; a centre crop no larger
// than the resized image: short_side, or width and height); else -1 with err saying which.
int image_fit_check(const ImageFit *fit, Error *err);

// An image folder: one subfolder per class (class index = subfolder names in strcmp
// order), images anywhere below it (.png .jpg .jpeg .bmp .gif .tga .pgm .ppm .pnm .psd
// .hdr .pic, any case), in strcmp order of their paths. Hidden entries (".name") are not
// read. Open lists the files only; read decodes one with image_load, read_crop with
// image_load_crop. Errors: no class subfolder, an empty class, an image directly in the
// root, a file without an image extension (with skip_bad: left out and counted in info).
// With cache_dir, the decoded samples go to cache_dir/cache_name (see folder.c) and are
// read from there once complete; not with crop, whose reads differ every time.
typedef struct FolderOptions {
    ImageFit fit;        // every sample's (image_fit_shape: the set's shape)
    const ResizedCrop *crop;  // non-NULL: samples are read as random crops of these ranges
                              // too (read_crop), which the memory plan allows for
    int skip_bad;        // 1: leave files without an image extension out (counted)
    const char *cache_dir;   // NULL or "" = no cache
    const char *cache_name;  // file name in cache_dir ("train.cache")
} FolderOptions;
int folder_dataset_open(Dataset **out, const char *dir, const FolderOptions *opt, Error *err);

// Resizes src (h, w, C; rows `stride` bytes apart) to dst (H, W, C) as image_load does: a
// triangle filter (bilinear when enlarging, widened when shrinking; boxes averaged first
// when shrinking by 4 or more), clamped edges. Returns 0, or -1 when out of memory.
int image_resize(const uint8_t *src, int w, int h, size_t stride, int C, uint8_t *dst, int W, int H);

// The heap image_load (crop NULL) or image_load_crop (any box of crop's ranges) holds at its
// peak for this file, from its header alone (the file, the decoded pixels, the decoders' and
// the resize's buffers; an estimate from above); 0 when the header cannot be read (the read
// will report the file).
size_t image_load_bytes(const char *path, const ImageFit *fit, const ResizedCrop *crop);

// Whether a file name ends in one of the image extensions a folder dataset reads (IMAGE_EXTS).
#define IMAGE_EXTS ".png .jpg .jpeg .bmp .gif .tga .pgm .ppm .pnm"
bool image_name_has_ext(const char *name);

// Decodes one image file as a folder dataset does (image.c) into out, image_fit_shape(fit)
// bytes (H, W, C): JPEG with libjpeg-turbo at the smallest DCT scale that covers the
// resized image, the rest with stb_image; converted to fit->channels (1: luma, 3: gray
// replicated; alpha dropped), resized as fit says (box reduction, then a triangle filter,
// clamped edges), only the centre crop's pixels computed. A header that declares more
// pixels than the file holds, a JPEG warning (premature end, corrupt data), an image of no
// pixels or one too elongated for resize = shorter makes the file bad. Returns 0, or
// DATASET_BAD (the file cannot be read or decoded) or -1 (out of memory, a fit that makes
// no sample: image_fit_check) with err naming the file.
int image_load(const char *path, const ImageFit *fit, uint8_t *out, Error *err);
// The same for torchvision's RandomResizedCrop(image_fit_shape(fit), crop's ranges) of the
// file's own pixels: the box (resized_crop_box of key, on the image's width x height)
// resized to the sample's shape; fit's resize and centre crop play no part.
int image_load_crop(const char *path, const ImageFit *fit, const ResizedCrop *crop,
                    uint64_t key, uint8_t *out, Error *err);

// Splits ds into *train and *val: in each class, round(fraction * its samples) go to val
// (at least 1 if the class has 2 or more and fraction > 0), chosen by a permutation
// keyed by seed; both keep ds's order. Takes ownership of ds (closed with the last of
// the two; on error closed at once). 0 < fraction < 1.
int dataset_split(Dataset *ds, double fraction, uint64_t seed, Dataset **train, Dataset **val,
                  Error *err);

// Helpers for Dataset implementations (dataset.c): copies of names; names "0".."n-1".
char **dataset_names_copy(char *const *names, int n, Error *err);
char **dataset_names_numbers(int n, Error *err);
void dataset_names_free(char **names, int n);

typedef struct LoaderConfig {
    int batch;         // samples per batch
    int shuffle;       // 1: a fresh seeded permutation each epoch; 0: file order
    int drop_last;     // 1: drop the last partial batch
    uint64_t seed;     // shuffle order = f(seed, epoch) only; augmentation f(seed, epoch, sample)
    float mean[DATASET_MAX_CHANNELS];  // normalisation per channel:
    float std[DATASET_MAX_CHANNELS];   //   x = (byte / 255 - mean) / std
    int workers;       // 0: loader_next reads in the caller's thread; N: N threads read ahead
    int prefetch;      // batch buffers in the ring when workers > 0; < 1 means 2 * workers
    int skip_bad;      // 1: skip samples whose file is bad (DATASET_BAD) and count them
    int fill_bad;      // with skip_bad: 1 = a skipped sample's place goes to the next good
                       // sample of the order (full batches); 0 = the batch is shorter
    int crop_pad;      // > 0: pad by this many zero bytes, then a random H x W crop
    ResizedCrop crop;  // scale[0] > 0: torchvision's RandomResizedCrop(H x W, scale, ratio)
                       // of the image the sample came from (read_crop), else of the sample
    int flip;          // 1: horizontal flip with probability 1/2
    float jitter[3];   // ColorJitter(brightness, contrast, saturation) after the flip; 0: off
    int shard, nshards;  // nshards > 1: this process reads only part `shard` of each batch:
                         // positions [shard * batch / nshards, (shard + 1) * batch / nshards)
                         // of it, the epochs and their order being the same for all; an
                         // empty part is handed out too (every process takes every step);
                         // fill_bad borrows nothing. batch must divide by nshards.
} LoaderConfig;

typedef struct Batch {
    const uint8_t *px;  // (n, H, W, C) the samples' bytes (augmented); owned by the loader
    const float *lut;   // (C, 256): lut[c * 256 + b] = (b / 255 - mean[c]) / std[c], the
                        // normalised value of byte b in channel c (normalise_table)
    int32_t *y;     // (n) labels
    int n;          // samples in this batch (== batch except a last partial one; a shard's part)
    int offset;     // where they start in the whole batch (0 without shards)
    int64_t index;  // batch number within the epoch
} Batch;

typedef struct Loader Loader;

// lut (C, 256) = (b / 255 - mean[c]) / std[c] for each byte value b and channel c, in fp32
// as PyTorch's ToTensor + Normalize compute it: what a loader's Batch.lut holds.
void normalise_table(float *lut, int C, const float *mean, const float *std);

// This epoch so far (since loader_start_epoch).
typedef struct LoaderStats {
    double wait_seconds;  // time spent in loader_next: waiting for a batch from the workers
                          // (or, workers = 0, reading it)
    int64_t skipped;      // bad samples skipped (skip_bad) in the batches handed out
} LoaderStats;

int loader_create(Loader **out, Dataset *ds, const LoaderConfig *cfg, Error *err);
// A loader that fills its batches into the ring of batch buffers of `with` instead of one
// of its own: for a set read only while `with` is not (the test set, between training
// epochs). The ring serves the loader that started an epoch last: loader_start_epoch of
// one stops the other's fills, and the other's loader_next is an error until it starts an
// epoch again. Both are driven from one thread; the ring lives until both are destroyed.
// Its batches must fit the ring (slots, their size, the augmentation scratch), else an
// error says so.
int loader_create_shared(Loader **out, Dataset *ds, const LoaderConfig *cfg, Loader *with,
                         Error *err);
void loader_destroy(Loader *l);  // NULL is fine
// Bytes a loader made with loader_create allocates (its ring of batch buffers, scratch,
// the epoch's order), for the memory plan. Decoding an image takes more for a moment, per
// reader: loader_read_bytes.
size_t loader_bytes(const Dataset *ds, const LoaderConfig *cfg);
// What an existing loader allocated: loader_bytes, or its order alone for one that
// shares another's ring; 0 for NULL.
size_t loader_size(const Loader *l);
// What loader_size would be, had the loader been made with `prefetch` batches ahead.
size_t loader_size_at(const Loader *l, int prefetch);
// The heap its readers (each worker, or the caller) hold at most while they decode:
// readers x the data set's read_bytes. Not part of loader_size's block.
size_t loader_read_bytes(const Loader *l);
// Batches per epoch.
int64_t loader_batches(const Loader *l);
// Starts epoch `epoch` (0-based): computes its order; the next call to loader_next
// returns its first batch (or batch `first` to continue an interrupted epoch).
int loader_start_epoch(Loader *l, int epoch, int64_t first, Error *err);
// *out = the next batch of the epoch, or NULL at the end of the epoch; returns 0. On a
// read error returns -1 with err naming the file and sample. The batch (its bytes, labels
// and table) stays valid until the next call, or until the loader sharing the ring starts
// an epoch. The batches (order, contents, skipped samples) are the same for any
// number of workers.
int loader_next(Loader *l, const Batch **out, Error *err);
void loader_stats(const Loader *l, LoaderStats *out);

#endif
