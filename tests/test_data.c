// test_data.c: the IDX dataset and the loader (data/idx.c, data/loader.c).
//
// The tests write their own small IDX files, raw and gzip, into a mkdtemp directory:
// nothing depends on downloaded data. Broken files must fail with a message that names
// the file and the problem; the loader's order must be a pure function of (seed, epoch).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../data/dataset.h"
#include "../nn/kernels.h"
#include "testutil.h"

static char g_dir[PATH_MAX];  // the test's temporary directory

// ---- helpers ---------------------------------------------------------------------------

static void tpath(char *out, const char *name) {
    int n = snprintf(out, PATH_MAX, "%s/%s", g_dir, name);
    assert_true(n > 0 && n < PATH_MAX);
}

// The byte at position p of sample i: its first two bytes encode i, so a batch tells
// which samples it holds; the rest vary with i and p.
static uint8_t sample_byte(int64_t i, int64_t p) {
    if (p == 0) return (uint8_t)(i & 0xff);
    if (p == 1) return (uint8_t)((i >> 8) & 0xff);
    return (uint8_t)((i * 31 + p * 7) & 0xff);
}

static uint8_t sample_label(int64_t i) { return (uint8_t)(i % 10); }

// An IDX images file image in memory: (count, rows, cols) of sample_byte. *size = bytes.
static uint8_t *idx_images(uint32_t count, uint32_t rows, uint32_t cols, size_t *size) {
    size_t sample = (size_t)rows * cols;
    *size = 16 + count * sample;
    uint8_t *b = malloc(*size);
    assert_non_null(b);
    put_be32(b, 0x00000803);
    put_be32(b + 4, count);
    put_be32(b + 8, rows);
    put_be32(b + 12, cols);
    for (size_t i = 0; i < count; i++)
        for (size_t p = 0; p < sample; p++)
            b[16 + i * sample + p] = sample_byte((int64_t)i, (int64_t)p);
    return b;
}

static uint8_t *idx_labels(uint32_t count, size_t *size) {
    *size = 8 + (size_t)count;
    uint8_t *b = malloc(*size);
    assert_non_null(b);
    put_be32(b, 0x00000801);
    put_be32(b + 4, count);
    for (size_t i = 0; i < count; i++) b[8 + i] = sample_label((int64_t)i);
    return b;
}

static void write_raw(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_gz(const char *path, const void *buf, size_t n) {
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    if (n) assert_int_equal(gzwrite(gz, buf, (unsigned)n), (int)n);
    assert_int_equal(gzclose(gz), Z_OK);
}

// Writes images and labels files named name-images / name-labels (raw or gzip) and
// returns their paths.
static void make_set(const char *name, uint32_t count, uint32_t rows, uint32_t cols, int gz,
                     char *images, char *labels) {
    char n1[128], n2[128];
    snprintf(n1, sizeof n1, "%s-images%s", name, gz ? ".gz" : "");
    snprintf(n2, sizeof n2, "%s-labels%s", name, gz ? ".gz" : "");
    tpath(images, n1);
    tpath(labels, n2);
    size_t si, sl;
    uint8_t *bi = idx_images(count, rows, cols, &si), *bl = idx_labels(count, &sl);
    if (gz) {
        write_gz(images, bi, si);
        write_gz(labels, bl, sl);
    } else {
        write_raw(images, bi, si);
        write_raw(labels, bl, sl);
    }
    free(bi);
    free(bl);
}

// Opening must fail with a message that contains each of the given strings.
static void expect_open_error(const char *images, const char *labels, ...) {
    Dataset *ds = (Dataset *)1;
    Error err = {{0}};
    assert_int_equal(idx_dataset_open(&ds, images, labels, &err), -1);
    assert_null(ds);
    va_list ap;
    va_start(ap, labels);
    for (const char *s; (s = va_arg(ap, const char *));) {
        if (!strstr(err.msg, s)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, s);
    }
    va_end(ap);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_data"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

// ---- IDX: valid files ------------------------------------------------------------------

static void check_reads_back(const char *images, const char *labels, uint32_t count,
                             uint32_t rows, uint32_t cols) {
    Dataset *ds = NULL;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ds->count, count);
    assert_int_equal(ds->shape.c, 1);
    assert_int_equal(ds->shape.h, (int)rows);
    assert_int_equal(ds->shape.w, (int)cols);
    assert_int_equal(ds->classes, count >= 10 ? 10 : (int)count);
    assert_string_equal(ds->source, images);
    uint8_t *px = malloc((size_t)rows * cols);
    assert_non_null(px);
    for (uint32_t i = 0; i < count; i++) {
        int32_t label = -1;
        if (ds->ops->read(ds, i, px, &label, &err) != 0) fail_msg("%s", err.msg);
        assert_int_equal(label, sample_label(i));
        for (uint32_t p = 0; p < rows * cols; p++) assert_int_equal(px[p], sample_byte(i, p));
    }
    // Out of range: an error, not a read past the end.
    int32_t label;
    assert_int_equal(ds->ops->read(ds, count, px, &label, &err), -1);
    assert_non_null(strstr(err.msg, "out of range"));
    assert_int_equal(ds->ops->read(ds, -1, px, &label, &err), -1);
    free(px);
    dataset_close(ds);
}

static void test_idx_raw_reads_back(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("raw", 23, 5, 7, 0, images, labels);
    check_reads_back(images, labels, 23, 5, 7);
}

static void test_idx_gzip_reads_back(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("gz", 300, 28, 28, 1, images, labels);
    // The inflated copy is unlinked at once: it never shows in TMPDIR.
    char tmpdir[PATH_MAX];
    tpath(tmpdir, "tmpdir");
    assert_int_equal(mkdir(tmpdir, 0700), 0);
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    assert_int_equal(setenv("TMPDIR", tmpdir, 1), 0);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(count_entries(tmpdir), 0);
    dataset_close(ds);
    check_reads_back(images, labels, 300, 28, 28);
    if (saved) {
        setenv("TMPDIR", saved, 1);
        free(saved);
    } else {
        unsetenv("TMPDIR");
    }
}

// gzip is told by content, not by name: a gzip file without .gz, raw labels beside it.
static void test_idx_gzip_detected_by_magic(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    tpath(images, "noext-images");
    tpath(labels, "noext-labels");
    size_t si, sl;
    uint8_t *bi = idx_images(12, 4, 3, &si), *bl = idx_labels(12, &sl);
    write_gz(images, bi, si);
    write_raw(labels, bl, sl);
    free(bi);
    free(bl);
    check_reads_back(images, labels, 12, 4, 3);
}

static void test_idx_classes_from_max_label(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("classes", 4, 2, 2, 0, images, labels);
    size_t sl;
    uint8_t *bl = idx_labels(4, &sl);
    bl[8 + 2] = 200;  // classes = 201 even though 1..199 never occur
    write_raw(labels, bl, sl);
    free(bl);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ds->classes, 201);
    uint8_t px[4];
    int32_t label;
    assert_int_equal(ds->ops->read(ds, 2, px, &label, &err), 0);
    assert_int_equal(label, 200);
    dataset_close(ds);
    dataset_close(NULL);
}

// ---- IDX: broken files -----------------------------------------------------------------

static void test_idx_wrong_magic(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("magic", 5, 3, 3, 0, images, labels);
    size_t si;
    uint8_t *bi = idx_images(5, 3, 3, &si);
    put_be32(bi, 0x12345678);
    write_raw(images, bi, si);
    free(bi);
    expect_open_error(images, labels, images, "0x12345678", "not an IDX images or labels file",
                      "0x00000803", NULL);
}

static void test_idx_swapped_paths(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("swap", 5, 3, 3, 0, images, labels);
    expect_open_error(labels, images, labels, "0x00000801", "labels file", "swapped", NULL);
}

static void test_idx_labels_wrong_magic(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("lmagic", 5, 3, 3, 0, images, labels);
    write_raw(labels, "GIF89a\0\0\0\0\0\0\0", 13);
    expect_open_error(images, labels, labels, "0x47494638", "expected an IDX labels file", NULL);
}

static void test_idx_truncated_images(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("trunc", 10, 4, 4, 0, images, labels);
    size_t si;
    uint8_t *bi = idx_images(10, 4, 4, &si);
    write_raw(images, bi, si - 5);  // expected 16 + 160 = 176, found 171
    free(bi);
    expect_open_error(images, labels, images, "truncated", "expected 176 bytes", "found 171",
                      NULL);
}

static void test_idx_truncated_labels(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("ltrunc", 10, 4, 4, 0, images, labels);
    size_t sl;
    uint8_t *bl = idx_labels(10, &sl);
    write_raw(labels, bl, sl - 1);
    free(bl);
    expect_open_error(images, labels, labels, "truncated", "expected 18 bytes", "found 17",
                      NULL);
}

static void test_idx_trailing_bytes(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("trail", 3, 2, 2, 0, images, labels);
    size_t si;
    uint8_t *bi = idx_images(3, 2, 2, &si);
    uint8_t *longer = calloc(si + 3, 1);
    assert_non_null(longer);
    memcpy(longer, bi, si);
    write_raw(images, longer, si + 3);
    free(bi);
    free(longer);
    expect_open_error(images, labels, images, "expected 28 bytes", "found 31", NULL);
}

static void test_idx_short_header(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("short", 3, 2, 2, 0, images, labels);
    size_t si;
    uint8_t *bi = idx_images(3, 2, 2, &si);
    write_raw(images, bi, 10);
    free(bi);
    expect_open_error(images, labels, images, "header", "expected 16 bytes", "found 10", NULL);
    write_raw(images, "\x00\x00", 2);
    expect_open_error(images, labels, images, "too short", NULL);
}

static void test_idx_truncated_gzip(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("gztrunc", 200, 10, 10, 1, images, labels);
    size_t n;
    uint8_t *b = test_read_file(images, &n);
    write_raw(images, b, n / 2);
    free(b);
    expect_open_error(images, labels, images, "truncated gzip stream", NULL);
}

static void test_idx_corrupt_gzip(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("gzbad", 200, 10, 10, 1, images, labels);
    size_t n;
    uint8_t *b = test_read_file(images, &n);
    // A wrong CRC-32 in the trailer: the data inflates but fails zlib's check.
    b[n - 8] ^= 0xff;
    write_raw(images, b, n);
    expect_open_error(images, labels, images, "corrupt", "incorrect data check", NULL);
    // Garbage in the middle of the deflate stream: some zlib error, never success.
    b[n - 8] ^= 0xff;
    for (size_t i = 20; i < 60 && i < n - 8; i++) b[i] = (uint8_t)(0xa5 ^ i);
    write_raw(images, b, n);
    expect_open_error(images, labels, images, "corrupt gzip stream", "zlib", NULL);
    free(b);
}

// A gzip file whose stream inflates past the size its header declares (one 1x1 image, then
// 64 MB of zeros in 64 KB of gzip) is refused while it inflates: the temporary copy never
// holds more than one chunk past the header (a GB of gzip would have filled the disk). A
// header that is wrong is refused as soon as it is out, as in a raw file.
static void test_idx_gzip_bomb(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("bomb", 1, 1, 1, 1, images, labels);
    const size_t n = (size_t)64 << 20;
    uint8_t *b = calloc(n, 1);
    assert_non_null(b);
    size_t si;
    uint8_t *bi = idx_images(1, 1, 1, &si);
    memcpy(b, bi, si);
    write_gz(images, b, n);
    expect_open_error(images, labels, images, "inflates to more than the 17 bytes its IDX header declares", NULL);
    memcpy(b, "\0\0\x08\x03\0\0\0\1\0\0\0\0\0\0\0\1", 16);  // rows 0
    write_gz(images, b, n);
    expect_open_error(images, labels, images, "a dimension is zero", "(count 1, rows 0, cols 1)", NULL);
    free(b), free(bi);
}

// Bytes after the gzip stream are damage (zlib's gzread ignored them); a second gzip member
// is gzip's own format and reads as the concatenation.
static void test_idx_gzip_trailing(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("gztrail", 50, 4, 4, 1, images, labels);
    size_t n;
    uint8_t *b = test_read_file(images, &n);
    uint8_t *c = malloc(n + 7);
    assert_non_null(c);
    memcpy(c, b, n);
    memcpy(c + n, "garbage", 7);
    write_raw(images, c, n + 7);
    char at[64];
    snprintf(at, sizeof at, "7 bytes after the end of the gzip stream (from byte %zu)", n);
    expect_open_error(images, labels, images, at, NULL);
    free(c);
    free(b);
    // Two members: the header and half of the pixels, then the rest.
    char raw[PATH_MAX], two[PATH_MAX];
    size_t si;
    uint8_t *bi = idx_images(50, 4, 4, &si);
    tpath(raw, "gzhalf1.gz");
    write_gz(raw, bi, si / 2);
    tpath(two, "gzhalf2.gz");
    write_gz(two, bi + si / 2, si - si / 2);
    size_t n1, n2;
    uint8_t *m1 = test_read_file(raw, &n1), *m2 = test_read_file(two, &n2), *cat = malloc(n1 + n2);
    assert_non_null(cat);
    memcpy(cat, m1, n1);
    memcpy(cat + n1, m2, n2);
    write_raw(images, cat, n1 + n2);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err)) fail_msg("%s", err.msg);
    assert_int_equal(ds->count, 50);
    uint8_t px[16];
    int32_t y;
    assert_int_equal(ds->ops->read(ds, 49, px, &y, &err), 0);
    assert_memory_equal(px, bi + 16 + 49 * 16, 16);
    dataset_close(ds);
    free(m1), free(m2), free(cat), free(bi);
}

static void test_idx_count_mismatch(void **state) {
    char images[PATH_MAX], labels[PATH_MAX], labels4[PATH_MAX];
    make_set("mismatch", 5, 3, 3, 0, images, labels);
    tpath(labels4, "mismatch-labels4");
    size_t sl;
    uint8_t *bl = idx_labels(4, &sl);
    write_raw(labels4, bl, sl);
    free(bl);
    expect_open_error(images, labels4, images, labels4, "5 images but", "4 labels", NULL);
}

static void test_idx_missing_file(void **state) {
    char images[PATH_MAX], labels[PATH_MAX], missing[PATH_MAX];
    make_set("missing", 5, 3, 3, 0, images, labels);
    tpath(missing, "no-such-file");
    expect_open_error(missing, labels, missing, "No such file", NULL);
    expect_open_error(images, missing, missing, "No such file", NULL);
    expect_open_error(g_dir, labels, g_dir, "not a regular file", NULL);
}

static void test_idx_zero_dimension(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("zero", 5, 3, 3, 0, images, labels);
    uint8_t h[16];
    put_be32(h, 0x00000803);
    put_be32(h + 4, 5);
    put_be32(h + 8, 0);  // rows = 0
    put_be32(h + 12, 3);
    write_raw(images, h, sizeof h);
    expect_open_error(images, labels, images, "dimension is zero", "rows 0", NULL);
    put_be32(h + 4, 0);  // count = 0
    put_be32(h + 8, 3);
    write_raw(images, h, sizeof h);
    expect_open_error(images, labels, images, "dimension is zero", "count 0", NULL);
    uint8_t l[8];
    put_be32(l, 0x00000801);
    put_be32(l + 4, 0);
    make_set("zero", 5, 3, 3, 0, images, labels);
    write_raw(labels, l, sizeof l);
    expect_open_error(images, labels, labels, "count is zero", NULL);
}

static void test_idx_empty_file(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set("empty", 5, 3, 3, 0, images, labels);
    write_raw(images, "", 0);
    expect_open_error(images, labels, images, "empty", NULL);
    make_set("empty", 5, 3, 3, 0, images, labels);
    write_raw(labels, "", 0);
    expect_open_error(images, labels, labels, "empty", NULL);
    // A valid gzip of nothing is an empty IDX file too.
    char gz[PATH_MAX];
    tpath(gz, "empty.gz");
    write_gz(gz, "", 0);
    expect_open_error(gz, labels, gz, "empty", "inflating", NULL);
}

// ---- loader ----------------------------------------------------------------------------

typedef struct Fixture {
    Dataset *ds;
    LoaderConfig cfg;
} Fixture;

// A raw set of count samples of 4 x 3 pixels, and a config of mean 0, std 1, so x * 255
// gives back the bytes (and the first two the sample index).
static Fixture fixture(const char *name, uint32_t count, int batch, int shuffle, int drop_last,
                       uint64_t seed) {
    char images[PATH_MAX], labels[PATH_MAX];
    make_set(name, count, 4, 3, 0, images, labels);
    Fixture f = {0};
    Error err = {{0}};
    if (idx_dataset_open(&f.ds, images, labels, &err) != 0) fail_msg("%s", err.msg);
    f.cfg = (LoaderConfig){.batch = batch, .shuffle = shuffle, .drop_last = drop_last,
                           .seed = seed, .mean = {0}, .std = {1, 1, 1}};
    return f;
}

static Loader *make_loader(Fixture *f) {
    Loader *l = NULL;
    Error err = {{0}};
    if (loader_create(&l, f->ds, &f->cfg, &err) != 0) fail_msg("%s", err.msg);
    return l;
}

static int64_t batch_sample_id(const Batch *b, int k, int64_t sample) {
    const uint8_t *x = b->px + (size_t)k * (size_t)sample;
    return x[0] | (int64_t)x[1] << 8;
}

// Runs epoch `epoch` from batch `first` and writes the sample ids in batch order into ids
// (returns how many); checks the labels, the batch index and n on the way.
static int64_t epoch_ids(Loader *l, const Dataset *ds, int epoch, int64_t first, int64_t *ids,
                         int *last_n, int64_t *nbatches) {
    Error err = {{0}};
    if (loader_start_epoch(l, epoch, first, &err) != 0) fail_msg("%s", err.msg);
    int64_t m = 0, b = 0, sample = shape_numel(ds->shape);
    const Batch *batch;
    for (;;) {
        if (loader_next(l, &batch, &err) != 0) fail_msg("%s", err.msg);
        if (!batch) break;
        assert_int_equal(batch->index, first + b);
        for (int k = 0; k < batch->n; k++) {
            int64_t id = batch_sample_id(batch, k, sample);
            assert_int_equal(batch->y[k], sample_label(id));
            ids[m++] = id;
        }
        if (last_n) *last_n = batch->n;
        b++;
    }
    // After the end it stays at the end.
    assert_int_equal(loader_next(l, &batch, &err), 0);
    assert_null(batch);
    if (nbatches) *nbatches = b;
    return m;
}

static void test_loader_every_sample_once(void **state) {
    Fixture f = fixture("once", 103, 10, 1, 0, 42);
    Loader *l = make_loader(&f);
    assert_int_equal(loader_batches(l), 11);
    int64_t ids[103];
    for (int epoch = 0; epoch < 3; epoch++) {
        int last_n = 0;
        int64_t nb = 0;
        assert_int_equal(epoch_ids(l, f.ds, epoch, 0, ids, &last_n, &nb), 103);
        assert_int_equal(nb, 11);
        assert_int_equal(last_n, 3);
        int seen[103] = {0};
        for (int i = 0; i < 103; i++) {
            assert_true(ids[i] >= 0 && ids[i] < 103);
            seen[ids[i]]++;
        }
        for (int i = 0; i < 103; i++) assert_int_equal(seen[i], 1);
    }
    loader_destroy(l);
    dataset_close(f.ds);
}

static void test_loader_order_is_f_of_seed_and_epoch(void **state) {
    enum { N = 200 };
    Fixture f = fixture("order", N, 16, 1, 0, 7);
    Loader *a = make_loader(&f), *b = make_loader(&f);
    int64_t e0[N], e1[N], e2a[N], e2b[N], other[N];
    epoch_ids(a, f.ds, 0, 0, e0, NULL, NULL);
    epoch_ids(a, f.ds, 1, 0, e1, NULL, NULL);
    epoch_ids(a, f.ds, 2, 0, e2a, NULL, NULL);
    // b goes straight to epoch 2: the same order as after epochs 0 and 1.
    epoch_ids(b, f.ds, 2, 0, e2b, NULL, NULL);
    assert_memory_equal(e2a, e2b, sizeof e2a);
    // Repeating an epoch repeats its order.
    epoch_ids(a, f.ds, 0, 0, other, NULL, NULL);
    assert_memory_equal(e0, other, sizeof e0);
    // Different epochs differ, and none is file order.
    assert_memory_not_equal(e0, e1, sizeof e0);
    assert_memory_not_equal(e1, e2a, sizeof e1);
    int sorted = 1;
    for (int i = 0; i < N; i++) sorted &= e0[i] == i;
    assert_false(sorted);
    loader_destroy(b);
    // Another seed, same epoch: another order.
    f.cfg.seed = 8;
    b = make_loader(&f);
    epoch_ids(b, f.ds, 0, 0, other, NULL, NULL);
    assert_memory_not_equal(e0, other, sizeof e0);
    loader_destroy(a);
    loader_destroy(b);
    dataset_close(f.ds);
}

static void test_loader_no_shuffle_keeps_order(void **state) {
    enum { N = 50 };
    Fixture f = fixture("noshuf", N, 8, 0, 0, 99);
    Loader *l = make_loader(&f);
    int64_t ids[N];
    for (int epoch = 0; epoch < 2; epoch++) {
        assert_int_equal(epoch_ids(l, f.ds, epoch, 0, ids, NULL, NULL), N);
        for (int i = 0; i < N; i++) assert_int_equal(ids[i], i);
    }
    loader_destroy(l);
    dataset_close(f.ds);
}

static void test_loader_drop_last(void **state) {
    enum { N = 103 };
    int64_t ids[N];
    int last_n;
    int64_t nb;
    // drop_last = 0: 11 batches, the last one of 3.
    Fixture f = fixture("drop", N, 10, 1, 0, 3);
    Loader *l = make_loader(&f);
    assert_int_equal(loader_batches(l), 11);
    assert_int_equal(epoch_ids(l, f.ds, 0, 0, ids, &last_n, &nb), N);
    assert_int_equal(nb, 11);
    assert_int_equal(last_n, 3);
    loader_destroy(l);
    // drop_last = 1: 10 full batches, 3 samples left out.
    f.cfg.drop_last = 1;
    l = make_loader(&f);
    assert_int_equal(loader_batches(l), 10);
    assert_int_equal(epoch_ids(l, f.ds, 0, 0, ids, &last_n, &nb), 100);
    assert_int_equal(nb, 10);
    assert_int_equal(last_n, 10);
    loader_destroy(l);
    // A count that divides evenly: the same with and without drop_last.
    f.cfg.batch = 103;
    l = make_loader(&f);
    assert_int_equal(loader_batches(l), 1);
    loader_destroy(l);
    f.cfg.drop_last = 0;
    f.cfg.batch = 1000;  // one partial batch of everything
    l = make_loader(&f);
    assert_int_equal(loader_batches(l), 1);
    assert_int_equal(epoch_ids(l, f.ds, 0, 0, ids, &last_n, &nb), N);
    assert_int_equal(last_n, N);
    loader_destroy(l);
    // drop_last with fewer samples than a batch: no batch at all is an error.
    f.cfg.drop_last = 1;
    Loader *none = (Loader *)1;
    Error err = {{0}};
    assert_int_equal(loader_create(&none, f.ds, &f.cfg, &err), -1);
    assert_null(none);
    assert_non_null(strstr(err.msg, "no batch"));
    dataset_close(f.ds);
}

static void test_loader_normalisation(void **state) {
    char images[PATH_MAX], labels[PATH_MAX];
    tpath(images, "norm-images");
    tpath(labels, "norm-labels");
    // One sample of 2 x 2 bytes: 0, 255, 128, 1.
    uint8_t bi[16 + 4] = {0}, bl[8 + 1] = {0};
    put_be32(bi, 0x00000803);
    put_be32(bi + 4, 1);
    put_be32(bi + 8, 2);
    put_be32(bi + 12, 2);
    bi[16] = 0;
    bi[17] = 255;
    bi[18] = 128;
    bi[19] = 1;
    put_be32(bl, 0x00000801);
    put_be32(bl + 4, 1);
    bl[8] = 3;
    write_raw(images, bi, sizeof bi);
    write_raw(labels, bl, sizeof bl);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err) != 0) fail_msg("%s", err.msg);
    LoaderConfig cfg = {.batch = 4, .shuffle = 1, .seed = 1, .mean = {0.1307f}, .std = {0.3081f}};
    Loader *l = NULL;
    if (loader_create(&l, ds, &cfg, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(loader_start_epoch(l, 0, 0, &err), 0);
    const Batch *b = NULL;
    assert_int_equal(loader_next(l, &b, &err), 0);
    assert_non_null(b);
    assert_int_equal(b->n, 1);
    assert_int_equal(b->y[0], 3);
    // By hand: (0 - 0.1307) / 0.3081, (1 - 0.1307) / 0.3081, (128/255 - 0.1307) / 0.3081,
    // (1/255 - 0.1307) / 0.3081.
    const double want[4] = {-0.42421292, 2.82148653, 1.20500092, -0.41148468};
    for (int i = 0; i < 4; i++) {
        // The batch holds the bytes; the table gives PyTorch's fp32 arithmetic exactly, and
        // the hand values to fp32 precision.
        assert_int_equal(b->px[i], bi[16 + i]);
        const float x = b->lut[b->px[i]], exact = ((float)bi[16 + i] / 255.0f - 0.1307f) / 0.3081f;
        assert_memory_equal(&x, &exact, sizeof exact);
        double d = x - want[i];
        if (d > 1e-6 || d < -1e-6) fail_msg("x[%d] = %.8f, want %.8f", i, x, want[i]);
    }
    loader_destroy(l);
    dataset_close(ds);
}

// The table the batches carry (normalise_table) and the network's read of bytes through it
// (u8_to_f32) give, for every byte value and channel, the floats the loader computed when it
// handed out an fp32 batch: ((float)byte / 255 - mean[c]) / std[c], bit for bit.
static void test_byte_table(void **state) {
    static const float means[][3] = {{0.1307f, 0, 0}, {0.485f, 0.456f, 0.406f}, {0, 0, 0}, {-3.5f, 999.0f, 0.5f}};
    static const float stds[][3] = {{0.3081f, 1, 1}, {0.229f, 0.224f, 0.225f}, {1, 1, 1}, {0.001f, 7.25f, 1000.0f}};
    float lut[3 * 256], *out = malloc(3 * 256 * 3 * sizeof(float));
    uint8_t *px = malloc(3 * 256 * 3);
    assert_non_null(out);
    assert_non_null(px);
    for (size_t m = 0; m < sizeof means / sizeof *means; m++)
        for (int C = 1; C <= 3; C++) {
            normalise_table(lut, C, means[m], stds[m]);
            for (int c = 0; c < C; c++)
                for (int b = 0; b < 256; b++) {
                    const float old = ((float)b / 255.0f - means[m][c]) / stds[m][c];  // loader.c's normalise
                    if (memcmp(&lut[c * 256 + b], &old, sizeof old))
                        fail_msg("mean %g std %g: byte %d of channel %d: %.9g, the loader gave %.9g",
                                 means[m][c], stds[m][c], b, c, lut[c * 256 + b], old);
                }
            // Every byte value in every channel, at every position of a pixel, and a length
            // that is not a multiple of the channels' (the tail).
            const int64_t n = 3 * 256 * C - (C > 1);
            for (int64_t i = 0; i < n; i++) px[i] = (uint8_t)(i / C * 7 + i % C * 85);
            cpu_kernels()->u8_to_f32(out, px, n, C, lut);
            for (int64_t i = 0; i < n; i++) {
                const int c = (int)(i % C);
                const float old = ((float)px[i] / 255.0f - means[m][c]) / stds[m][c];
                if (memcmp(&out[i], &old, sizeof old))
                    fail_msg("u8_to_f32, %d channels, value %lld: %.9g, the loader gave %.9g", C, (long long)i,
                             out[i], old);
            }
        }
    free(out);
    free(px);
}

static void test_loader_resume_mid_epoch(void **state) {
    enum { N = 97 };
    Fixture f = fixture("resume", N, 8, 1, 0, 11);
    Loader *a = make_loader(&f), *b = make_loader(&f);
    Error err = {{0}};
    const int64_t first = 5;
    // The uninterrupted epoch 3, kept batch by batch.
    int64_t nb = loader_batches(a);
    assert_int_equal(nb, 13);
    size_t sample = (size_t)shape_numel(f.ds->shape);
    uint8_t *xs = calloc((size_t)nb * 8 * sample, 1);
    int32_t *ys = calloc((size_t)nb * 8, sizeof(int32_t));
    int ns[13];
    assert_non_null(xs);
    assert_non_null(ys);
    assert_int_equal(loader_start_epoch(a, 3, 0, &err), 0);
    const Batch *batch;
    for (int64_t i = 0; i < nb; i++) {
        assert_int_equal(loader_next(a, &batch, &err), 0);
        assert_non_null(batch);
        ns[i] = batch->n;
        memcpy(xs + i * 8 * sample, batch->px, (size_t)batch->n * sample);
        memcpy(ys + i * 8, batch->y, (size_t)batch->n * sizeof(int32_t));
    }
    // b ran another epoch first, then resumes epoch 3 at batch 5.
    int64_t ids[N];
    epoch_ids(b, f.ds, 0, 0, ids, NULL, NULL);
    assert_int_equal(loader_start_epoch(b, 3, first, &err), 0);
    for (int64_t i = first; i < nb; i++) {
        assert_int_equal(loader_next(b, &batch, &err), 0);
        assert_non_null(batch);
        assert_int_equal(batch->index, i);
        assert_int_equal(batch->n, ns[i]);
        assert_memory_equal(batch->px, xs + i * 8 * sample, (size_t)batch->n * sample);
        assert_memory_equal(batch->y, ys + i * 8, (size_t)batch->n * sizeof(int32_t));
    }
    assert_int_equal(loader_next(b, &batch, &err), 0);
    assert_null(batch);
    // Starting at the end is allowed (an epoch interrupted after its last batch); past it
    // is not.
    assert_int_equal(loader_start_epoch(b, 3, nb, &err), 0);
    assert_int_equal(loader_next(b, &batch, &err), 0);
    assert_null(batch);
    assert_int_equal(loader_start_epoch(b, 3, nb + 1, &err), -1);
    assert_non_null(strstr(err.msg, "cannot start at batch 14"));
    assert_int_equal(loader_start_epoch(b, -1, 0, &err), -1);
    free(xs);
    free(ys);
    loader_destroy(a);
    loader_destroy(b);
    dataset_close(f.ds);
}

static void test_loader_bytes(void **state) {
    Fixture f = fixture("bytes", 1000, 64, 1, 0, 1);
    // 64 int32 + 64 x 12 bytes + 1000 int64: no float batch.
    size_t want = 64 * sizeof(int32_t) + 64 * 12 + 1000 * sizeof(int64_t);
    assert_int_equal(loader_bytes(f.ds, &f.cfg), want);
    assert_int_equal(want, 256 + 768 + 8000);
    // The formula follows batch and count, and is 0 for an invalid batch.
    f.cfg.batch = 1;
    assert_int_equal(loader_bytes(f.ds, &f.cfg), 4 + 12 + 8000);
    f.cfg.batch = 0;
    assert_int_equal(loader_bytes(f.ds, &f.cfg), 0);
    dataset_close(f.ds);
}

// Shards (data-parallel processes): for every batch, the parts of shards 0..2 side by side are
// the whole loader's batch, in order, with their offsets; a shard whose part of the last
// batch is empty hands out an empty batch; a batch that does not divide is refused.
static void test_loader_shards(void **state) {
    Fixture f = fixture("shards", 70, 6, 1, 0, 9);  // 11 batches: the last of 4 samples
    f.cfg.workers = 2;
    Loader *whole = make_loader(&f);
    Loader *part[3];
    for (int s = 0; s < 3; s++) {
        Fixture g = f;
        g.cfg.shard = s, g.cfg.nshards = 3;
        part[s] = make_loader(&g);
        assert_int_equal(loader_batches(part[s]), loader_batches(whole));
    }
    const int64_t sample = shape_numel(f.ds->shape);
    Error err = {{0}};
    for (int epoch = 0; epoch < 2; epoch++) {
        assert_int_equal(loader_start_epoch(whole, epoch, 0, &err), 0);
        for (int s = 0; s < 3; s++) assert_int_equal(loader_start_epoch(part[s], epoch, 0, &err), 0);
        for (;;) {
            const Batch *w, *b;
            assert_int_equal(loader_next(whole, &w, &err), 0);
            int64_t ids[6];
            for (int k = 0; w && k < w->n; k++) ids[k] = batch_sample_id(w, k, sample);
            int at = 0;
            for (int s = 0; s < 3; s++) {
                assert_int_equal(loader_next(part[s], &b, &err), 0);
                if (!w) {
                    assert_null(b);
                    continue;
                }
                assert_non_null(b);
                assert_int_equal(b->index, w->index);
                assert_int_equal(b->offset, 2 * s);
                assert_int_equal(b->n, w->n - 2 * s >= 2 ? 2 : w->n > 2 * s ? w->n - 2 * s : 0);
                for (int k = 0; k < b->n; k++) assert_int_equal(batch_sample_id(b, k, sample), ids[at++]);
            }
            if (!w) break;
            assert_int_equal(at, w->n);
        }
    }
    for (int s = 0; s < 3; s++) loader_destroy(part[s]);
    loader_destroy(whole);
    Fixture g = f;
    g.cfg.shard = 0, g.cfg.nshards = 4;  // 6 does not divide by 4
    Loader *l = (Loader *)1;
    assert_int_equal(loader_create(&l, g.ds, &g.cfg, &err), -1);
    assert_non_null(strstr(err.msg, "must divide among the shards"));
    dataset_close(f.ds);
}

static void test_loader_bad_config(void **state) {
    Fixture f = fixture("badcfg", 10, 4, 1, 0, 1);
    Loader *l = (Loader *)1;
    Error err = {{0}};
    f.cfg.batch = 0;
    assert_int_equal(loader_create(&l, f.ds, &f.cfg, &err), -1);
    assert_null(l);
    assert_non_null(strstr(err.msg, "batch = 0"));
    f.cfg.batch = 4;
    f.cfg.std[0] = 0;
    assert_int_equal(loader_create(&l, f.ds, &f.cfg, &err), -1);
    assert_non_null(strstr(err.msg, "std"));
    f.cfg.std[0] = 1;
    f.cfg.mean[0] = NAN;
    assert_int_equal(loader_create(&l, f.ds, &f.cfg, &err), -1);
    assert_non_null(strstr(err.msg, "mean"));
    f.cfg.mean[0] = 0;
    // loader_next before any epoch.
    l = make_loader(&f);
    const Batch *b = (const Batch *)1;
    assert_int_equal(loader_next(l, &b, &err), -1);
    assert_null(b);
    assert_non_null(strstr(err.msg, "loader_start_epoch"));
    loader_destroy(l);
    loader_destroy(NULL);
    dataset_close(f.ds);
}

// A read error reaches the caller with the file, the sample, the epoch and the batch.
static void test_loader_read_error(void **state) {
    Fixture f = fixture("readerr", 20, 4, 0, 0, 1);
    Loader *l = make_loader(&f);
    Error err = {{0}};
    // Cut the images file after open: sample 10 onwards is gone.
    assert_int_equal(truncate(f.ds->source, 16 + 10 * 12), 0);
    assert_int_equal(loader_start_epoch(l, 2, 0, &err), 0);
    const Batch *b;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(loader_next(l, &b, &err), 0);
        assert_non_null(b);
    }
    assert_int_equal(loader_next(l, &b, &err), -1);
    assert_null(b);
    assert_non_null(strstr(err.msg, f.ds->source));
    assert_non_null(strstr(err.msg, "sample 10"));
    assert_non_null(strstr(err.msg, "epoch 3, batch 3 of 5"));  // counted from 1
    loader_destroy(l);
    dataset_close(f.ds);
}

// The bounded draw has no bias: over 6,000 epochs of 3 samples the 6 orders each come
// up about 1,000 times (binomial sd ~ 29; the bounds are 5 sd).
static void test_loader_shuffle_uniform(void **state) {
    Fixture f = fixture("uniform", 3, 3, 1, 0, 5);
    Loader *l = make_loader(&f);
    int counts[3][3][3] = {{{0}}};
    int64_t ids[3];
    for (int epoch = 0; epoch < 6000; epoch++) {
        epoch_ids(l, f.ds, epoch, 0, ids, NULL, NULL);
        counts[ids[0]][ids[1]][ids[2]]++;
    }
    int perms = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                if (a != b && b != c && a != c) {
                    perms++;
                    if (counts[a][b][c] < 855 || counts[a][b][c] > 1145)
                        fail_msg("order %d%d%d came up %d times in 6000", a, b, c, counts[a][b][c]);
                }
    assert_int_equal(perms, 6);
    loader_destroy(l);
    dataset_close(f.ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_raw_reads_back),
        cmocka_unit_test(test_idx_gzip_reads_back),
        cmocka_unit_test(test_idx_gzip_detected_by_magic),
        cmocka_unit_test(test_idx_classes_from_max_label),
        cmocka_unit_test(test_idx_wrong_magic),
        cmocka_unit_test(test_idx_swapped_paths),
        cmocka_unit_test(test_idx_labels_wrong_magic),
        cmocka_unit_test(test_idx_truncated_images),
        cmocka_unit_test(test_idx_truncated_labels),
        cmocka_unit_test(test_idx_trailing_bytes),
        cmocka_unit_test(test_idx_short_header),
        cmocka_unit_test(test_idx_truncated_gzip),
        cmocka_unit_test(test_idx_corrupt_gzip),
        cmocka_unit_test(test_idx_gzip_bomb),
        cmocka_unit_test(test_idx_gzip_trailing),
        cmocka_unit_test(test_idx_count_mismatch),
        cmocka_unit_test(test_idx_missing_file),
        cmocka_unit_test(test_idx_zero_dimension),
        cmocka_unit_test(test_idx_empty_file),
        cmocka_unit_test(test_loader_every_sample_once),
        cmocka_unit_test(test_loader_order_is_f_of_seed_and_epoch),
        cmocka_unit_test(test_loader_no_shuffle_keeps_order),
        cmocka_unit_test(test_loader_drop_last),
        cmocka_unit_test(test_loader_normalisation),
        cmocka_unit_test(test_byte_table),
        cmocka_unit_test(test_loader_resume_mid_epoch),
        cmocka_unit_test(test_loader_bytes),
        cmocka_unit_test(test_loader_shards),
        cmocka_unit_test(test_loader_bad_config),
        cmocka_unit_test(test_loader_read_error),
        cmocka_unit_test(test_loader_shuffle_uniform),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
