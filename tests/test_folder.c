// test_folder.c: image folders (data/folder.c), their cache, val_split (data/split.c) and
// the [data] keys for folders (data/data_cfg.c).
//
// The tests write their own small image trees with stb_image_write into a mkdtemp
// directory (PNG, BMP, TGA, PGM, JPEG; gray, RGB, RGBA; a corrupt file, an empty class,
// a file that is not an image), so nothing depends on downloaded data. Resizing is
// checked against a triangle-filter reference computed here in double precision.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stb/stb_image_write.h>

#include "../data/data_cfg.h"
#include "../data/dataset.h"
#include "testutil.h"

static char g_dir[512];  // the suite's temporary directory

// ---- helpers ---------------------------------------------------------------------------

// g_dir/a/b/..., creating the folders on the way.
static void tpath(char *out, const char *fmt, ...) {
    char rel[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    int n = snprintf(out, PATH_MAX, "%s/%s", g_dir, rel);
    assert_true(n > 0 && n < PATH_MAX);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", out);
    for (char *s = dir + strlen(g_dir) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(dir, 0777);
            *s = '/';
        }
}

static void mkdir_t(const char *fmt, ...) {
    char rel[PATH_MAX], p[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    tpath(p, "%s/x", rel);
    p[strlen(p) - 2] = 0;
    assert_true(mkdir(p, 0777) == 0 || errno == EEXIST);
}

// The byte at position p of image `id`: the first two bytes encode id, so a sample says
// which file it came from; the rest vary with id and p.
static uint8_t pix(int id, int64_t p) {
    if (p == 0) return (uint8_t)(id & 0xff);
    if (p == 1) return (uint8_t)((id >> 8) & 0xff);
    return (uint8_t)((id * 31 + p * 7) & 0xff);
}

static uint8_t *make_pixels(int w, int h, int c, int id) {
    uint8_t *b = malloc((size_t)w * h * c);
    assert_non_null(b);
    for (int64_t p = 0; p < (int64_t)w * h * c; p++) b[p] = pix(id, p);
    return b;
}

// A smooth image (for resize checks, where a filter's details matter less than on noise).
static uint8_t *smooth_pixels(int w, int h, int c) {
    uint8_t *b = malloc((size_t)w * h * c);
    assert_non_null(b);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++)
                b[((size_t)y * w + x) * c + k] =
                    (uint8_t)(127.5 + 127.5 * sin(x * 0.7 + k) * cos(y * 0.45 - k));
    return b;
}

static void write_img(const char *path, const char *kind, int w, int h, int c, const uint8_t *px) {
    int ok = 0;
    if (!strcmp(kind, "png"))
        ok = stbi_write_png(path, w, h, c, px, w * c);
    else if (!strcmp(kind, "bmp"))
        ok = stbi_write_bmp(path, w, h, c, px);
    else if (!strcmp(kind, "tga"))
        ok = stbi_write_tga(path, w, h, c, px);
    else if (!strcmp(kind, "jpg"))
        ok = stbi_write_jpg(path, w, h, c, px, 95);
    else if (!strcmp(kind, "pgm")) {
        assert_int_equal(c, 1);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fprintf(f, "P5\n%d %d\n255\n", w, h);
        assert_int_equal(fwrite(px, 1, (size_t)w * h, f), (size_t)w * h);
        ok = fclose(f) == 0;
    }
    assert_true(ok);
}

// Writes image `id` (w x h x c of pix) to g_dir/rel.
static void put_img(const char *rel, const char *kind, int w, int h, int c, int id) {
    char p[PATH_MAX];
    tpath(p, "%s", rel);
    uint8_t *px = make_pixels(w, h, c, id);
    write_img(p, kind, w, h, c, px);
    free(px);
}

static void put_text(const char *rel, const char *text) {
    char p[PATH_MAX];
    tpath(p, "%s", rel);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static FolderOptions opts(int w, int h, int c) {
    return (FolderOptions){.fit = {.channels = c, .width = w, .height = h}};
}

static Dataset *open_ok(const char *rel, FolderOptions o) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (folder_dataset_open(&ds, p, &o, &err) != 0) fail_msg("%s", err.msg);
    return ds;
}

// Opening must fail with a message that holds each of the strings.
static void open_fails(const char *rel, FolderOptions o, ...) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    Dataset *ds = (Dataset *)1;
    Error err = {{0}};
    assert_int_equal(folder_dataset_open(&ds, p, &o, &err), -1);
    assert_null(ds);
    va_list ap;
    va_start(ap, o);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(err.msg, s)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, s);
    va_end(ap);
}

static void read_ok(const Dataset *ds, int64_t i, uint8_t *px, int32_t *label) {
    Error err = {{0}};
    int rc = ds->ops->read(ds, i, px, label, &err);
    if (rc != 0) fail_msg("sample %lld: %s", (long long)i, err.msg);
}

// ---- the index ---------------------------------------------------------------------------

// Classes in sorted order of their folder names, files in sorted order of their paths
// (below subfolders too), hidden files and root files that are not images not read.
static void test_folder_index_order(void **state) {
    put_img("idx/dog/b.png", "png", 4, 3, 3, 4);
    put_img("idx/dog/a.png", "png", 4, 3, 3, 3);
    put_img("idx/dog/sub/c.png", "png", 4, 3, 3, 5);
    put_img("idx/cat/z.png", "png", 4, 3, 3, 2);
    put_img("idx/cat/y.PNG", "png", 4, 3, 3, 1);
    put_img("idx/cat/.hidden.png", "png", 4, 3, 3, 99);
    put_img("idx/ant/m.bmp", "bmp", 4, 3, 3, 0);
    put_text("idx/README.txt", "not data\n");
    Dataset *ds = open_ok("idx", opts(4, 3, 3));
    assert_int_equal(ds->count, 6);
    assert_int_equal(ds->classes, 3);
    assert_string_equal(ds->class_names[0], "ant");
    assert_string_equal(ds->class_names[1], "cat");
    assert_string_equal(ds->class_names[2], "dog");
    assert_int_equal(ds->shape.c, 3);
    assert_int_equal(ds->shape.h, 3);
    assert_int_equal(ds->shape.w, 4);
    assert_non_null(ds->info);
    assert_non_null(strstr(ds->info, "6 images in 3 classes"));
    const int32_t labels[6] = {0, 1, 1, 2, 2, 2};
    uint8_t px[36];
    for (int i = 0; i < 6; i++) {
        int32_t y = -1, y2 = -1;
        read_ok(ds, i, px, &y);
        assert_int_equal(y, labels[i]);
        Error err = {{0}};
        assert_int_equal(ds->ops->label(ds, i, &y2, &err), 0);
        assert_int_equal(y2, labels[i]);
        // Lossless formats at their own size: exactly the bytes written; file i has id i.
        uint8_t *want = make_pixels(4, 3, 3, i);
        assert_memory_equal(px, want, 36);
        free(want);
    }
    Error err = {{0}};
    int32_t y;
    assert_int_equal(ds->ops->read(ds, 6, px, &y, &err), -1);
    assert_non_null(strstr(err.msg, "out of range"));
    dataset_close(ds);
}

// PNG, BMP, TGA, PGM and JPEG decode; gray goes to RGB by replication, RGB to gray by
// stb_image's luma (77 R + 150 G + 29 B) >> 8, alpha is dropped.
static void test_folder_formats_and_channels(void **state) {
    put_img("fmt/a/gray.png", "png", 5, 4, 1, 10);
    put_img("fmt/a/rgb.png", "png", 5, 4, 3, 11);
    put_img("fmt/a/rgba.png", "png", 5, 4, 4, 12);
    put_img("fmt/a/t.tga", "tga", 5, 4, 3, 13);
    put_img("fmt/a/p.pgm", "pgm", 5, 4, 1, 14);
    put_img("fmt/b/j.jpg", "jpg", 5, 4, 3, 15);
    Dataset *rgb = open_ok("fmt", opts(5, 4, 3));
    Dataset *gray = open_ok("fmt", opts(5, 4, 1));
    assert_int_equal(rgb->count, 6);
    // Sorted: a/gray.png, a/p.pgm, a/rgb.png, a/rgba.png, a/t.tga, b/j.jpg.
    const int ids[5] = {10, 14, 11, 12, 13}, chans[5] = {1, 1, 3, 4, 3};
    uint8_t out3[60], out1[20];
    int32_t y;
    for (int i = 0; i < 5; i++) {
        uint8_t *src = make_pixels(5, 4, chans[i], ids[i]);
        read_ok(rgb, i, out3, &y);
        read_ok(gray, i, out1, &y);
        assert_int_equal(y, 0);
        for (int p = 0; p < 20; p++) {
            const uint8_t *s = src + p * chans[i];
            uint8_t r = s[0], g = chans[i] >= 3 ? s[1] : s[0], b = chans[i] >= 3 ? s[2] : s[0];
            assert_int_equal(out3[3 * p], r);
            assert_int_equal(out3[3 * p + 1], g);
            assert_int_equal(out3[3 * p + 2], b);
            uint8_t luma = chans[i] >= 3 ? (uint8_t)((r * 77 + g * 150 + b * 29) >> 8) : r;
            assert_int_equal(out1[p], luma);
        }
        free(src);
    }
    read_ok(rgb, 5, out3, &y);  // the JPEG: lossy, but it decodes to the right class
    assert_int_equal(y, 1);
    dataset_close(rgb);
    dataset_close(gray);
}

// ---- resizing against a reference ---------------------------------------------------------

// One line of the triangle filter as stb_image_resize applies it to the region [0, extent)
// of the n input pixels: output pixel o is centred at (o + 0.5) / scale in input
// coordinates, scale = m / extent; the filter's support grows by 1 / scale when shrinking
// (so every input pixel counts); edges are clamped; the weights are normalised.
static void ref_line(const double *in, int n, double extent, int si, double *out, int m, int so) {
    const double scale = m / extent, sup = scale < 1 ? 1 / scale : 1;
    for (int o = 0; o < m; o++) {
        const double c = (o + 0.5) / scale;
        double acc = 0, ws = 0;
        for (int i = (int)floor(c - sup) - 2; i <= (int)ceil(c + sup) + 2; i++) {
            const double x = i + 0.5 - c, t = scale < 1 ? x * scale : x, w = 1 - fabs(t);
            if (w <= 0) continue;
            const int ii = i < 0 ? 0 : i >= n ? n - 1 : i;
            acc += w * in[(size_t)ii * si];
            ws += w;
        }
        out[(size_t)o * so] = acc / ws;
    }
}

// src (h, w, c) resized to (oh, ow, c), rounded to bytes. A reduction by a factor f >= 4
// first averages boxes of floor(f / 2) pixels (rounded to bytes; the last box of a row
// or column holds what is left, and covers that part of a pixel), then filters the rest.
static void ref_resize(const uint8_t *src, int w, int h, int c, uint8_t *dst, int ow, int oh) {
    const int kx = w / ow / 2 > 1 ? w / ow / 2 : 1, ky = h / oh / 2 > 1 ? h / oh / 2 : 1;
    const double ex = (double)w / kx, ey = (double)h / ky;  // the picture's extent, reduced
    uint8_t *red = NULL;
    if (kx > 1 || ky > 1) {
        const int rw = (w + kx - 1) / kx, rh = (h + ky - 1) / ky;
        red = malloc((size_t)rw * rh * c);
        assert_non_null(red);
        for (int oy = 0; oy < rh; oy++)
            for (int ox = 0; ox < rw; ox++)
                for (int k = 0; k < c; k++) {
                    int sum = 0, n = 0;
                    for (int y = oy * ky; y < oy * ky + ky && y < h; y++)
                        for (int x = ox * kx; x < ox * kx + kx && x < w; x++, n++)
                            sum += src[((size_t)y * w + x) * c + k];
                    red[((size_t)oy * rw + ox) * c + k] = (uint8_t)((sum + n / 2) / n);
                }
        src = red, w = rw, h = rh;
    }
    double *a = malloc(sizeof(double) * w * h), *b = malloc(sizeof(double) * ow * h),
           *r = malloc(sizeof(double) * ow * oh);
    assert_true(a && b && r);
    for (int k = 0; k < c; k++) {
        for (int i = 0; i < w * h; i++) a[i] = src[(size_t)i * c + k] / 255.0;
        for (int y = 0; y < h; y++) ref_line(a + (size_t)y * w, w, ex, 1, b + (size_t)y * ow, ow, 1);
        for (int x = 0; x < ow; x++) ref_line(b + x, h, ey, ow, r + x, oh, ow);
        for (int i = 0; i < ow * oh; i++) dst[(size_t)i * c + k] = (uint8_t)(r[i] * 255 + 0.5);
    }
    free(a), free(b), free(r), free(red);
}

static void test_folder_resize_reference(void **state) {
    static const int cases[][4] = {{40, 30, 16, 12}, {40, 30, 20, 15}, {7, 5, 14, 10},
                                   {37, 23, 32, 32}, {90, 90, 28, 28}, {300, 250, 32, 24},
                                   {203, 161, 20, 16}, {120, 40, 12, 40}, {640, 480, 28, 28}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int w = cases[k][0], h = cases[k][1], ow = cases[k][2], oh = cases[k][3];
        char rel[64], root[64];
        snprintf(root, sizeof root, "rs%zu", k);
        snprintf(rel, sizeof rel, "rs%zu/c/img.png", k);
        uint8_t *src = smooth_pixels(w, h, 3);
        char p[PATH_MAX];
        tpath(p, "%s", rel);
        write_img(p, "png", w, h, 3, src);
        Dataset *ds = open_ok(root, opts(ow, oh, 3));
        uint8_t *got = malloc((size_t)ow * oh * 3), *want = malloc((size_t)ow * oh * 3);
        int32_t y;
        read_ok(ds, 0, got, &y);
        ref_resize(src, w, h, 3, want, ow, oh);
        int differ = 0;
        for (int i = 0; i < ow * oh * 3; i++) {
            int d = abs((int)got[i] - (int)want[i]);
            if (d > 1) fail_msg("%dx%d -> %dx%d: value %d is %d, reference %d", w, h, ow, oh, i,
                                got[i], want[i]);
            differ += d != 0;
        }
        // Off by one only where the float rounding of the two sums differs: a few.
        assert_true(differ * 20 < ow * oh * 3);
        free(src), free(got), free(want);
        dataset_close(ds);
    }
}

// The loader normalises the resized bytes per channel: x = (b / 255 - mean[c]) / std[c].
static void test_folder_normalisation(void **state) {
    uint8_t *src = smooth_pixels(24, 18, 3);
    char p[PATH_MAX];
    tpath(p, "norm/only/x.png");
    write_img(p, "png", 24, 18, 3, src);
    Dataset *ds = open_ok("norm", opts(12, 9, 3));
    LoaderConfig cfg = {.batch = 1, .mean = {0.485f, 0.456f, 0.406f},
                        .std = {0.229f, 0.224f, 0.225f}};
    Loader *l;
    Error err = {{0}};
    if (loader_create(&l, ds, &cfg, &err)) fail_msg("%s", err.msg);
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    const Batch *b;
    assert_int_equal(loader_next(l, &b, &err), 0);
    assert_non_null(b);
    uint8_t want[12 * 9 * 3];
    ref_resize(src, 24, 18, 3, want, 12, 9);
    for (int i = 0; i < 12 * 9 * 3; i++) {
        const int c = i % 3;
        const double x = ((double)want[i] / 255.0 - cfg.mean[c]) / cfg.std[c];
        // One byte of resize tolerance is 1 / (255 std) < 0.018.
        const float v = b->lut[c * 256 + b->px[i]];
        if (fabs(v - x) > 1.0 / (255.0 * cfg.std[c]) + 1e-5)
            fail_msg("value %d: %f, reference %f", i, v, x);
    }
    loader_destroy(l);
    dataset_close(ds);
    free(src);
}

// ---- errors --------------------------------------------------------------------------------

static void test_folder_errors(void **state) {
    mkdir_t("err_none");
    open_fails("err_none", opts(4, 4, 3), "no class folders", "one subfolder per class", NULL);
    put_text("err_files/notes.txt", "x");
    open_fails("err_files", opts(4, 4, 3), "no class folders", NULL);
    put_img("err_root/a/1.png", "png", 4, 4, 3, 1);
    put_img("err_root/stray.png", "png", 4, 4, 3, 2);
    open_fails("err_root", opts(4, 4, 3), "stray.png", "no class", "subfolder of its class", NULL);
    put_img("err_empty/a/1.png", "png", 4, 4, 3, 1);
    mkdir_t("err_empty/b");
    put_text("err_empty/b/.keep", "");
    open_fails("err_empty", opts(4, 4, 3), "err_empty/b", "'b' has no images", "remove the folder",
               NULL);
    put_img("err_text/a/1.png", "png", 4, 4, 3, 1);
    put_text("err_text/a/labels.csv", "1,2\n");
    open_fails("err_text", opts(4, 4, 3), "err_text/a/labels.csv", "not an image", "skip_bad = 1",
               NULL);
    open_fails("err_missing", opts(4, 4, 3), "err_missing", "cannot open", NULL);
    // A class folder's name on two lines: refused at once (a checkpoint stores a name a line;
    // the run failed when it saved, after its first epoch).
    put_img("err_lines/a\nb/1.png", "png", 4, 4, 3, 1);
    open_fails("err_lines", opts(4, 4, 3), "a class folder's name holds a line break", NULL);
    open_fails("err_text/a/1.png", opts(4, 4, 3), "not a folder", NULL);
    open_fails("err_text", opts(0, 4, 3), "width = 0", NULL);
    open_fails("err_text", opts(4, 4, 2), "channels = 2", NULL);
    // With skip_bad the file that is not an image is left out and counted.
    FolderOptions o = opts(4, 4, 3);
    o.skip_bad = 1;
    Dataset *ds = open_ok("err_text", o);
    assert_int_equal(ds->count, 1);
    assert_non_null(strstr(ds->info, "1 files that are not images left out"));
    assert_non_null(strstr(ds->info, "labels.csv"));
    dataset_close(ds);
    // A class with only files that are not images is empty, skip_bad or not.
    put_text("err_only_text/a/x.txt", "x");
    put_img("err_only_text/b/1.png", "png", 4, 4, 3, 1);
    open_fails("err_only_text", o, "'a' has no images", NULL);
}

// A corrupt or truncated image is DATASET_BAD with the path and stb_image's reason.
static void test_folder_bad_files(void **state) {
    put_img("bad/a/good.png", "png", 6, 6, 3, 1);
    put_text("bad/a/corrupt.png", "this is not a PNG file at all");
    char p[PATH_MAX];
    tpath(p, "bad/a/trunc.png");
    uint8_t *px = make_pixels(6, 6, 3, 2);
    write_img(p, "png", 6, 6, 3, px);
    free(px);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size / 2), 0);
    Dataset *ds = open_ok("bad", opts(6, 6, 3));
    assert_int_equal(ds->count, 3);  // corrupt.png, good.png, trunc.png
    uint8_t out[108];
    int32_t y = -1;
    Error err = {{0}};
    assert_int_equal(ds->ops->read(ds, 0, out, &y, &err), DATASET_BAD);
    assert_non_null(strstr(err.msg, "bad/a/corrupt.png"));
    assert_non_null(strstr(err.msg, "not a readable image"));
    assert_int_equal(y, 0);
    read_ok(ds, 1, out, &y);
    err.msg[0] = 0;
    assert_int_equal(ds->ops->read(ds, 2, out, &y, &err), DATASET_BAD);
    assert_non_null(strstr(err.msg, "bad/a/trunc.png"));
    // A file that vanished after open.
    tpath(p, "bad/a/good.png");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(ds->ops->read(ds, 1, out, &y, &err), DATASET_BAD);
    assert_non_null(strstr(err.msg, "good.png: cannot open"));
    dataset_close(ds);
}

// ---- the cache ------------------------------------------------------------------------------

static int count_tmp(const char *rel) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    DIR *d = opendir(p);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp-") != NULL;
    closedir(d);
    return n;
}

static int exists(const char *rel) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    return access(p, F_OK) == 0;
}

static FolderOptions cache_opts(int w, int h, int c) {
    static char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/cache_dir/sub", g_dir);
    FolderOptions o = opts(w, h, c);
    o.cache_dir = dir;
    o.cache_name = "train.cache";
    return o;
}

// All samples of ds, read in file order (rc per sample into rcs).
static uint8_t *read_all(const Dataset *ds, int *rcs) {
    const int64_t sample = shape_numel(ds->shape);
    uint8_t *all = calloc((size_t)ds->count, (size_t)sample);
    assert_non_null(all);
    for (int64_t i = 0; i < ds->count; i++) {
        int32_t y;
        Error err = {{0}};
        rcs[i] = ds->ops->read(ds, i, all + i * sample, &y, &err);
        assert_true(rcs[i] == 0 || rcs[i] == DATASET_BAD);
    }
    return all;
}

static void test_folder_cache(void **state) {
    for (int i = 0; i < 12; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "cache_src/%c/%02d.png", 'a' + i % 3, i);
        put_img(rel, "png", 10 + i, 8, 3, i);
    }
    int rcs[16], rcs2[16];
    // Without a cache: the reference bytes.
    Dataset *ds = open_ok("cache_src", opts(6, 5, 3));
    uint8_t *ref = read_all(ds, rcs);
    dataset_close(ds);

    // First open: the cache is written as the samples are read, into a temporary file
    // that becomes cache_dir/sub/train.cache when the last sample is in.
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "being written"));
    assert_non_null(strstr(ds->info, "none yet"));
    assert_false(exists("cache_dir/sub/train.cache"));
    assert_int_equal(count_tmp("cache_dir/sub"), 1);
    uint8_t *got = read_all(ds, rcs2);
    assert_memory_equal(got, ref, 12 * 6 * 5 * 3);
    assert_true(exists("cache_dir/sub/train.cache"));
    assert_int_equal(count_tmp("cache_dir/sub"), 0);
    free(got);
    dataset_close(ds);
    assert_true(exists("cache_dir/sub/train.cache"));

    // Second open: up to date, and the samples come from it (the sources can go).
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "up to date"));
    char p[PATH_MAX];
    tpath(p, "cache_src/b/04.png");
    char moved[PATH_MAX];
    tpath(moved, "cache_moved.png");
    assert_int_equal(rename(p, moved), 0);
    got = read_all(ds, rcs2);
    assert_memory_equal(got, ref, 12 * 6 * 5 * 3);
    assert_int_equal(rename(moved, p), 0);
    free(got);
    dataset_close(ds);

    // A source file's mtime changes: rebuilt, naming the file.
    struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 0},
                                {.tv_sec = 1000000000, .tv_nsec = 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, times, 0), 0);
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "being written"));
    assert_non_null(strstr(ds->info, "source files changed"));
    assert_non_null(strstr(ds->info, "b/04.png"));
    got = read_all(ds, rcs2);
    free(got);
    dataset_close(ds);
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "up to date"));
    dataset_close(ds);

    // A source file's content (and size) changes: rebuilt, and the new pixels are read.
    put_img("cache_src/a/00.png", "png", 10, 8, 3, 77);
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "source files changed"));
    assert_non_null(strstr(ds->info, "a/00.png"));
    got = read_all(ds, rcs2);
    assert_memory_not_equal(got, ref, 6 * 5 * 3);  // sample 0 is a/00.png
    assert_memory_equal(got + 90, ref + 90, 11 * 90);
    free(got);
    dataset_close(ds);

    // Other settings: rebuilt. (The old file stays until the new one is complete.)
    ds = open_ok("cache_src", cache_opts(7, 5, 3));
    assert_non_null(strstr(ds->info, "written for 6x5x3"));
    dataset_close(ds);
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    assert_non_null(strstr(ds->info, "written for 6x5x3"));
    // Stopped before every sample is read: the temporary file goes, the old cache stays.
    got = read_all(ds, rcs2);  // completes the 6x5x1 cache
    free(got);
    dataset_close(ds);
    ds = open_ok("cache_src", cache_opts(6, 5, 3));
    assert_non_null(strstr(ds->info, "written for 6x5x1"));
    int32_t y;
    uint8_t one[90];
    read_ok(ds, 3, one, &y);
    assert_int_equal(count_tmp("cache_dir/sub"), 1);
    dataset_close(ds);
    assert_int_equal(count_tmp("cache_dir/sub"), 0);
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    assert_non_null(strstr(ds->info, "up to date"));
    dataset_close(ds);

    // A new file: rebuilt ("images in" counts differ).
    put_img("cache_src/c/99.png", "png", 10, 8, 3, 99);
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    assert_non_null(strstr(ds->info, "12 images in 3 classes then, 13 in 3 now"));
    dataset_close(ds);

    // A damaged cache file is not trusted.
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    free(read_all(ds, rcs2));
    dataset_close(ds);
    char cp[PATH_MAX];
    snprintf(cp, sizeof cp, "%s/cache_dir/sub/train.cache", g_dir);
    struct stat st;
    assert_int_equal(stat(cp, &st), 0);
    assert_int_equal(truncate(cp, st.st_size - 1), 0);
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    assert_non_null(strstr(ds->info, "incomplete or damaged"));
    dataset_close(ds);
    put_text("cache_dir/sub/train.cache", "junk");
    ds = open_ok("cache_src", cache_opts(6, 5, 1));
    assert_non_null(strstr(ds->info, "not a cache file"));
    free(read_all(ds, rcs2));
    dataset_close(ds);

    // Samples of the same shape made another way (the centre 5 x 5 of a 6 x 5 stretch, then
    // of the shorter side at 5): rebuilt, naming the resize.
    FolderOptions o = cache_opts(6, 5, 1);
    o.fit.center_crop = 5;
    ds = open_ok("cache_src", o);
    assert_non_null(strstr(ds->info, "written for 6x5x1"));
    free(read_all(ds, rcs2));
    dataset_close(ds);
    o.fit = (ImageFit){.channels = 1, .resize = RESIZE_SHORTER, .short_side = 5, .center_crop = 5};
    ds = open_ok("cache_src", o);
    assert_non_null(strstr(ds->info, "written for resize = stretch, short_side = 0, center_crop = 5"));
    dataset_close(ds);
    // A set read with random crops of its files (crop_scale) keeps no cache: every epoch
    // decodes new crops.
    o.crop = &(const ResizedCrop){.scale = {0.5, 1}, .ratio = {0.75, 4.0 / 3.0}};
    ds = open_ok("cache_src", o);
    assert_non_null(strstr(ds->info, "not cached: crop_scale"));
    assert_int_equal(count_tmp("cache_dir/sub"), 0);
    dataset_close(ds);
    free(ref);
}

// Bad files are recorded in the cache and stay bad (with their reason) when it is read.
static void test_folder_cache_bad(void **state) {
    put_img("cbad/a/1.png", "png", 4, 4, 1, 1);
    put_text("cbad/a/2.png", "corrupt");
    put_img("cbad/b/3.png", "png", 4, 4, 1, 3);
    int rcs[3];
    Dataset *ds = open_ok("cbad", cache_opts(4, 4, 1));
    free(read_all(ds, rcs));
    assert_int_equal(rcs[0], 0);
    assert_int_equal(rcs[1], DATASET_BAD);
    assert_int_equal(rcs[2], 0);
    dataset_close(ds);
    ds = open_ok("cbad", cache_opts(4, 4, 1));
    assert_non_null(strstr(ds->info, "up to date"));
    assert_non_null(strstr(ds->info, "3 samples, 1 bad"));
    uint8_t px[16];
    int32_t y;
    Error err = {{0}};
    assert_int_equal(ds->ops->read(ds, 1, px, &y, &err), DATASET_BAD);
    assert_non_null(strstr(err.msg, "cbad/a/2.png"));
    dataset_close(ds);
}

static void test_folder_cache_dir_errors(void **state) {
    put_img("cdir/a/1.png", "png", 4, 4, 1, 1);
    put_text("cdir_file", "x");
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/cdir_file/sub", g_dir);
    FolderOptions o = opts(4, 4, 1);
    o.cache_dir = p;
    o.cache_name = "train.cache";
    open_fails("cdir", o, "cache", "cdir_file", NULL);
}

// ---- val_split ---------------------------------------------------------------------------------

static void test_split(void **state) {
    // Classes of 20, 10 and 3 images.
    const int sizes[3] = {20, 10, 3};
    int id = 0;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < sizes[c]; i++) {
            char rel[64];
            snprintf(rel, sizeof rel, "split/c%d/%03d.png", c, i);
            put_img(rel, "png", 2, 2, 1, id++);
        }
    Dataset *tr, *va, *tr2, *va2;
    Error err = {{0}};
    if (dataset_split(open_ok("split", opts(2, 2, 1)), 0.2, 7, &tr, &va, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(tr->count + va->count, 33);
    assert_int_equal(va->count, 4 + 2 + 1);  // round(0.2 n), at least 1 of a class of 3
    assert_int_equal(tr->classes, 3);
    assert_int_equal(va->classes, 3);
    assert_string_equal(va->class_names[2], "c2");
    assert_non_null(strstr(tr->info, "26 training and 7 validation samples"));
    assert_non_null(strstr(va->source, "validation"));
    // Disjoint, together every sample once; per class as planned.
    int seen[33] = {0}, per_class[3] = {0};
    uint8_t px[4];
    int32_t y;
    for (int64_t i = 0; i < va->count; i++) {
        read_ok(va, i, px, &y);
        seen[px[0]]++;
        per_class[y]++;
    }
    assert_int_equal(per_class[0], 4);
    assert_int_equal(per_class[1], 2);
    assert_int_equal(per_class[2], 1);
    int last = -1;
    for (int64_t i = 0; i < tr->count; i++) {
        read_ok(tr, i, px, &y);
        assert_true(px[0] > last);  // the part keeps the file order
        last = px[0];
        seen[px[0]]++;
    }
    for (int i = 0; i < 33; i++) assert_int_equal(seen[i], 1);
    // The same seed gives the same split; another seed another one.
    if (dataset_split(open_ok("split", opts(2, 2, 1)), 0.2, 7, &tr2, &va2, &err))
        fail_msg("%s", err.msg);
    uint8_t a[4], b[4];
    for (int64_t i = 0; i < va->count; i++) {
        read_ok(va, i, a, &y);
        read_ok(va2, i, b, &y);
        assert_int_equal(a[0], b[0]);
    }
    dataset_close(tr2);
    dataset_close(va2);
    if (dataset_split(open_ok("split", opts(2, 2, 1)), 0.2, 8, &tr2, &va2, &err))
        fail_msg("%s", err.msg);
    int same = 1;
    for (int64_t i = 0; i < va->count; i++) {
        read_ok(va, i, a, &y);
        read_ok(va2, i, b, &y);
        same &= a[0] == b[0];
    }
    assert_false(same);
    // Closing in either order frees the shared base once (ASan checks).
    dataset_close(va);
    dataset_close(tr2);
    dataset_close(tr);
    dataset_close(va2);
    // Bad fractions.
    assert_int_equal(dataset_split(open_ok("split", opts(2, 2, 1)), 1.0, 7, &tr, &va, &err), -1);
    assert_non_null(strstr(err.msg, "strictly between 0 and 1"));
    assert_null(tr);
}

// ---- the [data] keys ------------------------------------------------------------------------

// Parses "[data]\n" + body (with %s replaced by g_dir) and reads the section.
static int read_data_cfg(Cfg *cfg, DataConfig *dc, const char *body, Error *err) {
    char text[4096], b2[3500];
    snprintf(b2, sizeof b2, body, g_dir, g_dir, g_dir);
    snprintf(text, sizeof text, "[data]\n%s", b2);
    if (cfg_parse(cfg, text, "test.cfg", err)) fail_msg("%s", err->msg);
    return data_cfg_read(dc, cfg, cfg_section(cfg, "data"), DATA_FILES_ALL, err);
}

static void cfg_fails(const char *body, ...) {
    Cfg cfg = {0};
    DataConfig dc;
    Error err = {{0}};
    assert_int_equal(read_data_cfg(&cfg, &dc, body, &err), -1);
    va_list ap;
    va_start(ap, body);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(err.msg, s)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, s);
    va_end(ap);
    cfg_free(&cfg);
}

// models/resnet18.cfg's data side: 224x224 RGB from 600x600 JPEGs (as bench/make_folders'
// jpg600), batch 32, val_split 0.1, 2 workers, 4 batches ahead, flips. The loader's memory:
// one ring of 4 slots of 32 samples' bytes that both sets share (19.27 MB), the flip
// scratch, the orders, and 2 workers' decodes at the 3/8 DCT scale: at most 25 MB (an fp32
// batch for each loader and a ring each made 79 MB).
static void test_resnet18_loader_bytes(void **state) {
    uint8_t *px = smooth_pixels(600, 600, 3);
    size_t biggest = 0;  // the largest file
    for (int i = 0; i < 20; i++) {
        char p[PATH_MAX];
        tpath(p, "r18/%s/%02d.jpg", i % 2 ? "odd" : "even", i);
        px[i] = (uint8_t)i;  // each file its own
        write_img(p, "jpg", 600, 600, 3, px);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        if ((size_t)st.st_size > biggest) biggest = (size_t)st.st_size;
    }
    free(px);
    Cfg cfg = {0};
    DataConfig dc;
    Error err = {{0}};
    if (read_data_cfg(&cfg, &dc,
                      "train = %s/r18\nval_split = 0.1\nwidth = 224\nheight = 224\nchannels = 3\n"
                      "mean = 0.485, 0.456, 0.406\nstd = 0.229, 0.224, 0.225\nworkers = 2\nflip = 1\n",
                      &err))
        fail_msg("%s", err.msg);
    assert_int_equal(dc.prefetch, 4);
    Data d;
    if (data_open(&d, &dc, 32, 1, &err)) fail_msg("%s", err.msg);
    const size_t sample = 224 * 224 * 3, ring = 4 * (32 * 4 + 32 * sample) + 2 * sample;
    const size_t decode = 2 * (d.train->read_bytes > d.test->read_bytes ? d.train->read_bytes : d.test->read_bytes);
    assert_int_equal(data_loader_bytes(&d), ring + 20 * 8 + decode);
    // The decode is sized by the 225x225 image libjpeg-turbo gives at 3/8 (and the file), not
    // by the 600x600 one.
    assert_true(d.train->read_bytes < biggest + 225 * 225 * 3 + 120000);
    assert_true(d.train->read_bytes < biggest + 600 * 600 * 3 / 2);
    print_message("resnet18's loader: %.2f MB (ring %.2f MB, decoding %.2f MB)\n", data_loader_bytes(&d) / 1e6,
                  ring / 1e6, decode / 1e6);
    assert_true(data_loader_bytes(&d) <= 25000000);
    data_close(&d);
    cfg_free(&cfg);
}

static void test_data_cfg_folders(void **state) {
    for (int i = 0; i < 20; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "dcfg/%s/%02d.png", i % 2 ? "odd" : "even", i);
        put_img(rel, "png", 8, 8, 3, i);
        snprintf(rel, sizeof rel, "dcfg_test/%s/%02d.png", i % 2 ? "odd" : "even", i);
        if (i < 6) put_img(rel, "png", 8, 8, 3, i);
    }
    put_img("dcfg_other/one/1.png", "png", 8, 8, 3, 1);
    put_img("dcfg_other/two/1.png", "png", 8, 8, 3, 1);
    Cfg cfg = {0};
    DataConfig dc;
    Error err = {{0}};
    // A folder needs no labels; channels default to 3; workers, prefetch, augmentation read.
    if (read_data_cfg(&cfg, &dc,
                      "train = %s/dcfg\ntest = %s/dcfg_test\nwidth = 6\nheight = 4\n"
                      "mean = 0.5\nstd = 0.25\nworkers = 3\nprefetch = 2\nflip = 1\ncrop_pad = 2\n"
                      "skip_bad = 1\n",
                      &err))
        fail_msg("%s", err.msg);
    assert_true(dc.train_folder);
    assert_true(dc.test_folder);
    assert_int_equal(dc.channels, 3);
    assert_int_equal(dc.workers, 3);
    assert_int_equal(dc.prefetch, 2);
    Data d;
    if (data_open(&d, &dc, 4, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(d.train->count, 20);
    assert_int_equal(d.test->count, 6);
    assert_int_equal(d.classes, 2);
    assert_string_equal(d.train->class_names[0], "even");
    assert_int_equal(d.train->shape.w, 6);
    assert_int_equal(d.train->shape.h, 4);
    // One ring of 2 slots that the two loaders share, with scratch for the training one's
    // augmentation; each loader's order; and what 3 workers hold while decoding, from the
    // images' headers (the two loaders never decode at once).
    const size_t slot = 4 * 4 + 4 * 72;
    assert_true(d.train->read_bytes > 72 && d.test->read_bytes > 72);
    const size_t decode = 3 * (d.train->read_bytes > d.test->read_bytes ? d.train->read_bytes : d.test->read_bytes);
    assert_int_equal(data_loader_bytes(&d), 2 * slot + 20 * 8 + 3 * 72 + 6 * 8 + decode);
    LoaderStats st;
    assert_int_equal(loader_start_epoch(d.train_loader, 0, 0, &err), 0);
    const Batch *b;
    int n = 0;
    while (!loader_next(d.train_loader, &b, &err) && b) n += b->n;
    assert_int_equal(n, 20);
    loader_stats(d.train_loader, &st);
    assert_int_equal(st.skipped, 0);
    data_close(&d);
    cfg_free(&cfg);

    // val_split: the test set is a stratified part of train.
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\nval_split = 0.2\nwidth = 8\nheight = 8\n"
                      "channels = 1\nworkers = 0\n", &err))
        fail_msg("%s", err.msg);
    if (data_open(&d, &dc, 4, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(d.train->count, 16);
    assert_int_equal(d.test->count, 4);
    assert_int_equal(d.train->shape.c, 1);
    assert_non_null(d.test_loader);
    data_close(&d);
    cfg_free(&cfg);

    // "none" stands for empty (a command line cannot give an empty value).
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\ntrain_labels = none\ntest = none\n"
                      "width = 8\nheight = 8\ncache = none\n", &err))
        fail_msg("%s", err.msg);
    assert_string_equal(dc.test, "");
    assert_string_equal(dc.cache, "");
    cfg_free(&cfg);

    // The test folder must have the same classes.
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\ntest = %s/dcfg_other\nwidth = 8\nheight = 8\n",
                      &err))
        fail_msg("%s", err.msg);
    assert_int_equal(data_open(&d, &dc, 4, 1, &err), -1);
    assert_non_null(strstr(err.msg, "even, odd"));
    assert_non_null(strstr(err.msg, "one, two"));
    cfg_free(&cfg);

    cfg_fails("train = %s/dcfg\nwidth = 8\n", "test.cfg:1", "set width and height", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ntrain_labels = x\n", "test.cfg:5",
              "train_labels (= x) is not used", "train_labels=none", NULL);
    cfg_fails("train = %s/dcfg/even/00.png\n", "is a file, not a folder", "train_labels", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\nval_split = 0.1\ntest = %s/dcfg_test\n",
              "val_split", "not both", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_pad = 2\ncrop_scale = 0.5\n",
              "choose one crop", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\nresize = sideways\n", "test.cfg:5",
              "'resize'", "one of stretch, shorter", NULL);
    cfg_fails("train = %s/dcfg\nresize = shorter\ncenter_crop = 8\n", "test.cfg:3",
              "needs short_side", NULL);
    cfg_fails("train = %s/dcfg\nresize = shorter\nshort_side = 10\n", "test.cfg:3",
              "set center_crop = N", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nresize = shorter\nshort_side = 10\ncenter_crop = 8\n",
              "test.cfg:3", "width and height are the size resize = stretch gives", "width= height=",
              NULL);
    cfg_fails("train = %s/dcfg\nresize = shorter\nshort_side = 10\ncenter_crop = 12\n",
              "test.cfg:5", "center_crop = 12 is larger than the shorter side", "short_side = 10",
              NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\nshort_side = 10\n", "test.cfg:5",
              "short_side = 10 is for resize = shorter", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 6\ncenter_crop = 7\n", "test.cfg:5",
              "center_crop = 7 is larger than the 8 x 6 images", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncenter_crop = -1\n", "test.cfg:5",
              "'center_crop'", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.5, 0.3\n", "test.cfg:5",
              "crop_scale = 0.5, 0.3", "smallest <= largest <= 1", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 1.5\n", "test.cfg:5",
              "crop_scale = 1.5, 1", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = -0.1\n", "test.cfg:5",
              "crop_scale = -0.1", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.1, 0.2, 0.3\n", "test.cfg:5",
              "'crop_scale'", "1 to 2 finite numbers", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.08\ncrop_ratio = 2\n",
              "test.cfg:6", "crop_ratio takes two aspect ratios", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.08\ncrop_ratio = 1.5, 1\n",
              "test.cfg:6", "crop_ratio = 1.5, 1", "0 < smallest <= largest", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.08\ncrop_ratio = 0, 1\n",
              "test.cfg:6", "crop_ratio = 0, 1", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_ratio = 0.5, 2\n", "test.cfg:5",
              "set crop_scale too", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\njitter = 0.4\n", "test.cfg:5",
              "jitter takes three amounts", "jitter = 0.4, 0.4, 0.4", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\njitter = 0.4, -0.1, 0\n", "test.cfg:5",
              "jitter takes three amounts", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\njitter = 0.4, nan, 0\n", "test.cfg:5",
              "'jitter'", NULL);
    // IDX images are not resized.
    char images[PATH_MAX], labels[PATH_MAX], body[3 * PATH_MAX];
    write_squares(g_dir, "dcfg_idx", 8, 1, images, labels);
    snprintf(body, sizeof body, "train = %s\ntrain_labels = %s\ncenter_crop = 4\n", images, labels);
    cfg_fails(body, "test.cfg:4", "center_crop is for image folders", NULL);
    snprintf(body, sizeof body, "train = %s\ntrain_labels = %s\nresize = shorter\nshort_side = 8\n"
             "center_crop = 4\n", images, labels);
    cfg_fails(body, "test.cfg:4", "resize is for image folders", NULL);

    // The keys read: crop_scale alone is its smallest fraction (to 1), crop_ratio defaults to
    // torchvision's 3/4, 4/3.
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.08\n"
                      "jitter = 0.4, 0.3, 0.2\n", &err))
        fail_msg("%s", err.msg);
    assert_true(dc.crop.scale[0] == 0.08 && dc.crop.scale[1] == 1);
    assert_true(dc.crop.ratio[0] == 0.75 && dc.crop.ratio[1] == 4.0 / 3.0);
    assert_true(dc.jitter[0] == 0.4f && dc.jitter[1] == 0.3f && dc.jitter[2] == 0.2f);
    cfg_free(&cfg);
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\nwidth = 8\nheight = 8\ncrop_scale = 0.5, 0.9\n"
                      "crop_ratio = 1, 2\n", &err))
        fail_msg("%s", err.msg);
    assert_true(dc.crop.scale[0] == 0.5 && dc.crop.scale[1] == 0.9);
    assert_true(dc.crop.ratio[0] == 1 && dc.crop.ratio[1] == 2);
    assert_true(dc.jitter[0] == 0 && dc.jitter[1] == 0 && dc.jitter[2] == 0);
    cfg_free(&cfg);

    // resize = shorter: the 8 x 8 images' shorter side to 10, their centre 6 x 6, for both
    // sets; the training set with random crops of the files and colour jitter.
    if (read_data_cfg(&cfg, &dc, "train = %s/dcfg\ntest = %s/dcfg_test\nresize = shorter\n"
                      "short_side = 10\ncenter_crop = 6\ncrop_scale = 0.3\njitter = 0.2, 0.2, 0.2\n"
                      "flip = 1\n", &err))
        fail_msg("%s", err.msg);
    if (data_open(&d, &dc, 4, 1, &err)) fail_msg("%s", err.msg);
    assert_int_equal(d.train->shape.w, 6);
    assert_int_equal(d.test->shape.h, 6);
    assert_int_equal(loader_start_epoch(d.train_loader, 0, 0, &err), 0);
    n = 0;
    while (!loader_next(d.train_loader, &b, &err) && b) n += b->n;
    assert_int_equal(n, 20);
    assert_int_equal(loader_start_epoch(d.test_loader, 0, 0, &err), 0);
    n = 0;
    while (!loader_next(d.test_loader, &b, &err) && b) n += b->n;
    assert_int_equal(n, 6);
    data_close(&d);
    cfg_free(&cfg);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\nchannels = 2\n", "channels = 2", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\nworkers = -1\n", "workers", NULL);
    cfg_fails("train = %s/dcfg\nwidth = 8\nheight = 8\ntest = %s/dcfg/even/00.png\n"
              "test_labels = y\n", "both must be image folders or both IDX", NULL);
}

// ---- main -------------------------------------------------------------------------------------

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_folder"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_folder_index_order),
        cmocka_unit_test(test_folder_formats_and_channels),
        cmocka_unit_test(test_folder_resize_reference),
        cmocka_unit_test(test_folder_normalisation),
        cmocka_unit_test(test_folder_errors),
        cmocka_unit_test(test_folder_bad_files),
        cmocka_unit_test(test_folder_cache),
        cmocka_unit_test(test_folder_cache_bad),
        cmocka_unit_test(test_folder_cache_dir_errors),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_data_cfg_folders),
        cmocka_unit_test(test_resnet18_loader_bytes),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
