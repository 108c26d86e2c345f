// make_folders.c: writes image folders (one subfolder per class) from Fashion-MNIST, for
// the data pipeline's benchmark (bench/data_bench.sh).
//
//   make_folders OUT png28 COUNT [FIRST]    COUNT 28x28 gray PNGs: images FIRST .. FIRST +
//                                           COUNT - 1 (FIRST = 60000: the 10,000 test images,
//                                           the same as Fashion-MNIST's t10k IDX files)
//   make_folders OUT jpgSIZE COUNT [UNIQUE [FROM]]
//                                           COUNT RGB JPEGs (quality 90) of SIZE, W or WxH
//                                           pixels (jpg600: 600x600; jpg500x375), made by
//                                           upscaling and colouring; with UNIQUE < COUNT
//                                           only UNIQUE files are encoded and the others
//                                           are hard links to them (disk and time); with
//                                           FROM, an earlier OUT of at least UNIQUE images,
//                                           the unique files are hard links to its files
//
// Fashion-MNIST is read from /usr/share/datasets/fashion-mnist, or from the folder that
// the environment's FASHION_MNIST names (the GPU machine: gpu/run.sh's unpacked packages).
// Image j is Fashion-MNIST training image j % 60000 (the test images after that, for
// j >= 60000 up to 70000), flipped left-right when j >= 70000 so every PNG differs. Class
// folders are named "0_tshirt" ... "9_boot", so their sorted order is the label order.
// Files are named c/j.png with j zero-padded; an existing complete folder is left as it
// is (delete it to write it again).
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb/stb_image_write.h>

#include "../data/dataset.h"
#include "../nn/rng.h"

#define FM "/usr/share/datasets/fashion-mnist"
#define NTHREADS 2

static const char *const class_dirs[10] = {"0_tshirt", "1_trouser", "2_pullover", "3_dress",
                                           "4_coat", "5_sandal", "6_shirt", "7_sneaker",
                                           "8_bag", "9_boot"};
// Colours (RGB at full intensity); image j gets tint j % 10, whatever its class, so that
// colour says nothing about the class and the task stays Fashion-MNIST's.
static const float tints[10][3] = {{1, .3f, .3f}, {.3f, 1, .3f}, {.3f, .3f, 1}, {1, 1, .3f},
                                   {1, .3f, 1},   {.3f, 1, 1},   {1, .6f, .2f}, {.6f, .2f, 1},
                                   {.2f, .6f, .4f}, {.8f, .8f, .8f}};

typedef struct Job {
    Dataset *train, *test;
    const char *out, *kind;
    const char *from;  // NULL, or a folder whose files the unique ones link to
    int width, height; // the JPEGs' size
    int64_t start, count, unique;  // this job writes images [start, count)
    int64_t first;                 // png28: image j of the job is source image first + j
    int thread;
    int failed;
} Job;

static void path_of(char *p, const Job *jb, int label, int64_t j) {
    snprintf(p, PATH_MAX, "%s/%s/%07" PRId64 ".%s", jb->out, class_dirs[label], j,
             strcmp(jb->kind, "png28") == 0 ? "png" : "jpg");
}

// Fashion-MNIST image j (28 x 28) and its label.
static int source(const Job *jb, int64_t j, uint8_t *px, int32_t *label) {
    Error err;
    int64_t k = j % 70000;
    const Dataset *ds = k < 60000 ? jb->train : jb->test;
    if (ds->ops->read(ds, k < 60000 ? k : k - 60000, px, label, &err)) {
        fprintf(stderr, "make_folders: %s\n", err.msg);
        return -1;
    }
    if (j >= 70000)
        for (int y = 0; y < 28; y++)
            for (int a = 0, b = 27; a < b; a++, b--) {
                uint8_t t = px[y * 28 + a];
                px[y * 28 + a] = px[y * 28 + b];
                px[y * 28 + b] = t;
            }
    return 0;
}

static void *work(void *arg) {
    Job *jb = arg;
    uint8_t src[28 * 28];
    const int W = jb->width, H = jb->height;
    uint8_t *gray = malloc((size_t)W * H), *rgb = malloc((size_t)W * H * 3);
    if (!gray || !rgb) {
        jb->failed = 1;
        return NULL;
    }
    const int png = strcmp(jb->kind, "png28") == 0;
    for (int64_t j = jb->start + jb->thread; j < jb->count; j += NTHREADS) {
        char p[PATH_MAX];
        int32_t label;
        if (!png && j >= jb->unique) {
            // A hard link to unique file j % unique, under j's own name and that file's class.
            int64_t u = j % jb->unique;
            if (source(jb, u, src, &label)) goto fail;
            char target[PATH_MAX];
            path_of(target, jb, label, u);
            path_of(p, jb, label, j);
            if (link(target, p) != 0 && errno != EEXIST) {
                fprintf(stderr, "make_folders: link %s: %s\n", p, strerror(errno));
                goto fail;
            }
            continue;
        }
        if (source(jb, jb->first + j, src, &label)) goto fail;
        path_of(p, jb, label, jb->first + j);
        if (jb->from) {
            Job other = *jb;
            other.out = jb->from;
            char target[PATH_MAX];
            path_of(target, &other, label, j);
            if (link(target, p) != 0 && errno != EEXIST) {
                fprintf(stderr, "make_folders: link %s -> %s: %s\n", p, target, strerror(errno));
                goto fail;
            }
            continue;
        }
        int ok;
        if (png) {
            ok = stbi_write_png(p, 28, 28, 1, src, 28);
        } else {
            if (image_resize(src, 28, 28, 28, 1, gray, W, H)) goto fail;
            // Colour by class, with a little deterministic grain so the JPEG is not
            // unrealistically smooth (photos have texture).
            const uint64_t key = rng_key(7, 9, (uint64_t)j, 0);
            for (int i = 0; i < W * H; i++) {
                int noise = (int)(rng_u64(key, (uint64_t)i) & 15) - 8;
                for (int c = 0; c < 3; c++) {
                    int v = (int)(gray[i] * tints[j % 10][c]) + 20 + noise;
                    rgb[i * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            }
            ok = stbi_write_jpg(p, W, H, 3, rgb, 90);
        }
        if (!ok) {
            fprintf(stderr, "make_folders: cannot write %s\n", p);
            goto fail;
        }
    }
    free(gray), free(rgb);
    return NULL;
fail:
    jb->failed = 1;
    free(gray), free(rgb);
    return NULL;
}

int main(int argc, char **argv) {
    Job base = {.out = argc > 2 ? argv[1] : NULL, .kind = argc > 2 ? argv[2] : ""};
    const int png = strcmp(base.kind, "png28") == 0;
    // jpgW or jpgWxH, exactly as it is written back.
    const int sides = png ? 0 : sscanf(base.kind, "jpg%dx%d", &base.width, &base.height);
    if (sides == 1) base.height = base.width;
    char canon[64];
    snprintf(canon, sizeof canon, sides == 1 ? "jpg%d" : "jpg%dx%d", base.width, base.height);
    if (argc < 4 || (!png && (sides < 1 || strcmp(canon, base.kind) || base.width < 1 ||
                              base.height < 1 || base.width > 8192 || base.height > 8192))) {
        fprintf(stderr, "usage: make_folders OUT png28|jpgSIZE COUNT [UNIQUE [FROM]] (SIZE: W or "
                        "WxH pixels, up to 8192: jpg600, jpg500x375)\n");
        return 2;
    }
    base.count = atoll(argv[3]);
    base.unique = argc > 4 && !png ? atoll(argv[4]) : base.count;
    base.first = argc > 4 && png ? atoll(argv[4]) : 0;
    base.from = argc > 5 ? argv[5] : NULL;
    if (base.count < 1 || base.unique < 1 || base.unique > base.count || base.first < 0) {
        fprintf(stderr, "make_folders: need 1 <= UNIQUE <= COUNT and FIRST >= 0\n");
        return 2;
    }
    char done[PATH_MAX];
    snprintf(done, sizeof done, "%s/.complete", base.out);
    if (access(done, F_OK) == 0) {
        printf("%s: exists\n", base.out);
        return 0;
    }
    Error err;
    const char *dir = getenv("FASHION_MNIST") ? getenv("FASHION_MNIST") : FM;
    char files[4][PATH_MAX];
    static const char *const names[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) snprintf(files[i], sizeof files[i], "%s/%s", dir, names[i]);
    if (idx_dataset_open(&base.train, files[0], files[1], &err) ||
        idx_dataset_open(&base.test, files[2], files[3], &err)) {
        fprintf(stderr, "make_folders: %s (apt-get install dataset-fashion-mnist)\n", err.msg);
        return 1;
    }
    mkdir(base.out, 0777);
    for (int c = 0; c < 10; c++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", base.out, class_dirs[c]);
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "make_folders: mkdir %s: %s\n", p, strerror(errno));
            return 1;
        }
    }
    Job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    // Unique files first (all threads), then the links to them.
    int64_t count = base.count;
    for (int phase = 0; phase < 2; phase++) {
        for (int t = 0; t < NTHREADS; t++) {
            jobs[t] = base;
            jobs[t].thread = t;
            jobs[t].start = phase == 0 ? 0 : base.unique;
            jobs[t].count = phase == 0 ? base.unique : count;
            pthread_create(&th[t], NULL, work, &jobs[t]);
        }
        for (int t = 0; t < NTHREADS; t++) {
            pthread_join(th[t], NULL);
            if (jobs[t].failed) return 1;
        }
    }
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    printf("%s: %" PRId64 " %s images (%" PRId64 " unique files)\n", base.out, base.count,
           base.kind, png ? base.count : base.unique);
    dataset_close(base.train);
    dataset_close(base.test);
    return 0;
}
