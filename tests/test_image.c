// test_image.c: one image file to input bytes (data/image.c: image_load).
//
// JPEGs, written here with libjpeg (baseline, progressive, grayscale, CMYK), decode at a
// DCT scale within a stated tolerance of a full-size decode followed by the same resize;
// images smaller than the target are enlarged from their full size. Files whose header
// declares more than they hold, or nothing, are bad files with a message naming them, never
// zero-filled pixels or an abort: PGMs of width 0 or -1, maxval 0 or no pixel data, BMPs
// cut short or declaring 20000 x 6000 pixels in 102 bytes, a PNG chunk of 1.5 GB in 40
// bytes, truncated JPEGs, a JPEG whose frame header says 1 x 65000 over 30 rows of data, a
// JPEG after fill bytes (libjpeg-turbo's "not a JPEG", never stb_image's JPEG decoder).
// torchvision's evaluation preprocessing (resize = shorter, center_crop) against PIL +
// torchvision's transforms (tests/preprocess_reference.py, skipped without torchvision)
// within the README's bounds; a random resized crop of a file is the box of its own pixels;
// fits that make no sample are refused, an image too elongated for resize = shorter is bad;
// what a load holds, against the memory plan's charge, for every kind of read.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <stb/stb_image_write.h>

#include "../data/dataset.h"
#include "testutil.h"

static char g_dir[512], g_root[PATH_MAX] = ".";

static const char *path(const char *name) { return test_path(g_dir, name); }

// A photo-like image: smooth waves and a little deterministic noise, c channels.
static uint8_t *photo(int w, int h, int c) {
    uint8_t *b = malloc((size_t)w * h * c);
    assert_non_null(b);
    uint32_t s = 12345;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) {
                s = s * 1664525u + 1013904223u;
                const double v = 128 + 90 * sin(x / 37.0 + k) * cos(y / 23.0 - k) + (double)(s >> 27) - 16;
                b[((size_t)y * w + x) * c + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return b;
}

// Writes px (h, w, components) as a JPEG of the colour space `space` with libjpeg.
static void write_jpeg(const char *file, const uint8_t *px, int w, int h, int components,
                       J_COLOR_SPACE space, bool progressive) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h;
    c.input_components = components, c.in_color_space = space;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(px + (size_t)c.next_scanline * w * components);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    assert_int_equal(fclose(f), 0);
}

// The JPEG decoded at full size to C channels (CMYK as image.c converts it), written as a
// PNG: image_load of that PNG is the full-size decode followed by the same resize.
static void full_decode_png(const char *jpg, int C, const char *png) {
    struct jpeg_decompress_struct d;
    struct jpeg_error_mgr e;
    d.err = jpeg_std_error(&e);
    jpeg_create_decompress(&d);
    FILE *f = fopen(jpg, "rb");
    assert_non_null(f);
    jpeg_stdio_src(&d, f);
    jpeg_read_header(&d, TRUE);
    const bool cmyk = d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK;
    d.out_color_space = cmyk ? JCS_CMYK : C == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&d);
    const int w = (int)d.output_width, h = (int)d.output_height, n = d.output_components;
    uint8_t *raw = malloc((size_t)w * h * n), *out = malloc((size_t)w * h * C);
    assert_true(raw && out);
    while (d.output_scanline < d.output_height) {
        JSAMPROW r = raw + (size_t)d.output_scanline * w * n;
        jpeg_read_scanlines(&d, &r, 1);
    }
    for (int i = 0; i < w * h; i++) {
        if (n == C) {
            memcpy(out + (size_t)i * C, raw + (size_t)i * n, (size_t)C);
            continue;
        }
        const uint8_t *q = raw + (size_t)i * 4;
        int rgb[3];
        for (int k = 0; k < 3; k++)
            rgb[k] = d.saw_Adobe_marker ? q[k] * q[3] / 255 : (255 - q[k]) * (255 - q[3]) / 255;
        if (C == 1) out[i] = (uint8_t)((rgb[0] * 77 + rgb[1] * 150 + rgb[2] * 29) >> 8);
        else for (int k = 0; k < 3; k++) out[(size_t)i * 3 + k] = (uint8_t)rgb[k];
    }
    jpeg_finish_decompress(&d);
    jpeg_destroy_decompress(&d);
    fclose(f);
    assert_true(stbi_write_png(png, w, h, C, out, w * C));
    free(raw), free(out);
}

// resize = stretch to the shape s.
static ImageFit stretch(Shape s) { return (ImageFit){.channels = s.c, .width = s.w, .height = s.h}; }

static void load_ok(const char *file, Shape s, uint8_t *out) {
    Error err = {{0}};
    const ImageFit fit = stretch(s);
    if (image_load(file, &fit, out, &err)) fail_msg("%s", err.msg);
}

// The JPEG at a DCT scale against the full-size decode, both resized by image.c: the
// largest and the mean byte difference over the target sizes, within the README's bounds.
static void expect_close_to_full(const char *jpg, int C, const char *what) {
    const int sizes[][2] = {{28, 28}, {64, 64}, {224, 224}, {100, 30}, {700, 650}};
    full_decode_png(jpg, C, path("full.png"));
    int worst = 0;
    double worst_mean = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const Shape s = {.c = C, .h = sizes[k][1], .w = sizes[k][0]};
        const size_t n = (size_t)s.w * s.h * C;
        uint8_t *a = malloc(n), *b = malloc(n);
        assert_true(a && b);
        load_ok(jpg, s, a);
        load_ok(path("full.png"), s, b);
        int mx = 0;
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
            const int d = abs(a[i] - b[i]);
            mx = d > mx ? d : mx;
            sum += d;
        }
        if (mx > worst) worst = mx;
        if (sum / n > worst_mean) worst_mean = sum / n;
        free(a), free(b);
    }
    print_message("%s, %d channel%s: at a DCT scale against full size, largest difference %d, "
                  "largest mean %.2f\n", what, C, C > 1 ? "s" : "", worst, worst_mean);
    assert_true(worst <= 24);
    assert_true(worst_mean <= 2.5);
}

static void test_jpeg_scaled_decode(void **state) {
    uint8_t *rgb = photo(600, 600, 3), *gray = photo(600, 600, 1);
    write_jpeg(path("base.jpg"), rgb, 600, 600, 3, JCS_RGB, false);
    write_jpeg(path("prog.jpg"), rgb, 600, 600, 3, JCS_RGB, true);
    write_jpeg(path("gray.jpg"), gray, 600, 600, 1, JCS_GRAYSCALE, false);
    uint8_t *cmyk = malloc(600 * 600 * 4);
    assert_non_null(cmyk);
    for (int i = 0; i < 600 * 600; i++)  // plain (not inverted) CMYK with some black
        for (int k = 0; k < 4; k++) cmyk[i * 4 + k] = k < 3 ? (uint8_t)(255 - rgb[i * 3 + k]) : (uint8_t)(i % 64);
    write_jpeg(path("cmyk.jpg"), cmyk, 600, 600, 4, JCS_CMYK, false);
    for (int C = 1; C <= 3; C += 2) {
        expect_close_to_full(path("base.jpg"), C, "baseline");
        expect_close_to_full(path("prog.jpg"), C, "progressive");
        expect_close_to_full(path("gray.jpg"), C, "grayscale");
        expect_close_to_full(path("cmyk.jpg"), C, "CMYK");
    }
    // The progressive and the baseline file hold the same image: the same bytes.
    uint8_t a[64 * 64 * 3], b[64 * 64 * 3];
    load_ok(path("base.jpg"), (Shape){.c = 3, .h = 64, .w = 64}, a);
    load_ok(path("prog.jpg"), (Shape){.c = 3, .h = 64, .w = 64}, b);
    int differ = 0;
    for (size_t i = 0; i < sizeof a; i++) differ += abs(a[i] - b[i]) > 2;
    assert_true(differ * 100 < (int)sizeof a);
    free(rgb), free(gray), free(cmyk);
}

// An image smaller than the target: decoded at full size, enlarged by the filter (no DCT
// scale above 1), the same as its full-size decode.
static void test_jpeg_smaller_than_target(void **state) {
    uint8_t *rgb = photo(40, 30, 3);
    write_jpeg(path("small.jpg"), rgb, 40, 30, 3, JCS_RGB, false);
    full_decode_png(path("small.jpg"), 3, path("small.png"));
    const Shape s = {.c = 3, .h = 64, .w = 64};
    uint8_t a[64 * 64 * 3], b[64 * 64 * 3];
    load_ok(path("small.jpg"), s, a);
    load_ok(path("small.png"), s, b);
    assert_memory_equal(a, b, sizeof a);
    free(rgb);
}

static void write_bytes(const char *file, const void *data, size_t n) {
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

// Every pair of sizes resizes, each output within the range of the input: stb_image_resize
// aborted on some (13 x 9 to 11 x 11, found by the fuzzer: tests/fuzz/regress/image).
static void test_resize_any_size(void **state) {
    static const int from[] = {1, 2, 3, 5, 7, 9, 13, 17, 31, 64}, to[] = {1, 2, 3, 4, 7, 11, 16};
    uint8_t *px = photo(64, 64, 1), out[16 * 16];
    int checked = 0;
    for (size_t a = 0; a < sizeof from / sizeof *from; a++)
        for (size_t b = 0; b < sizeof from / sizeof *from; b++) {
            const int w = from[a], h = from[b];
            char head[32];
            const int n = snprintf(head, sizeof head, "P5\n%d %d\n255\n", w, h);
            uint8_t *file = malloc((size_t)n + (size_t)w * h);
            assert_non_null(file);
            memcpy(file, head, (size_t)n);
            uint8_t lo = 255, hi = 0;
            for (int i = 0; i < w * h; i++) {
                file[n + i] = px[i];
                lo = px[i] < lo ? px[i] : lo, hi = px[i] > hi ? px[i] : hi;
            }
            write_bytes(path("sweep.pgm"), file, (size_t)n + (size_t)w * h);
            free(file);
            for (size_t c = 0; c < sizeof to / sizeof *to; c++)
                for (size_t d = 0; d < sizeof to / sizeof *to; d++) {
                    const Shape s = {.c = 1, .h = to[d], .w = to[c]};
                    load_ok(path("sweep.pgm"), s, out);
                    for (int i = 0; i < s.w * s.h; i++)
                        if (out[i] < lo || out[i] > hi)
                            fail_msg("%dx%d to %dx%d: %d outside [%d, %d]", w, h, s.w, s.h, out[i], lo, hi);
                    checked++;
                }
        }
    print_message("%d pairs of sizes resized\n", checked);
    free(px);
    // 8210 x 8210 pixels of 255 to one: boxes of more than 2^24 pixels (their sum wrapped at
    // 32 bits: 12).
    const int side = 8210;
    uint8_t *white = malloc((size_t)side * side);
    assert_non_null(white);
    memset(white, 255, (size_t)side * side);
    assert_int_equal(image_resize(white, side, side, (size_t)side, 1, out, 1, 1), 0);
    assert_int_equal(out[0], 255);
    free(white);
}

// image_load of the file must be DATASET_BAD with a message naming it and holding `why`.
// Binary PNMs, decoded by image.c (stb_image 2.27 reads 16-bit samples in the wrong byte
// order, then past its buffer when it converts their channels): a 16-bit gray PGM of
// 0x1234 everywhere is 0x12 replicated to RGB, a 16-bit PPM of (0x12.., 0x56.., 0x9A..) its
// luma; samples are scaled by 255 / maxval (7 of 15 is 119).
static void test_pnm_depths(void **state) {
    static uint8_t file[64 + 3 * 5 * 4 * 2];
    for (int color = 0; color < 2; color++) {
        const int n = snprintf((char *)file, 64, "P%c\n5 4\n65535\n", color ? '6' : '5'), ch = color ? 3 : 1;
        for (int i = 0; i < 5 * 4 * ch; i++) file[n + 2 * i] = (uint8_t)(0x12 + 0x44 * (i % ch)), file[n + 2 * i + 1] = 0x34;
        write_bytes(path("deep.pnm"), file, (size_t)n + 5 * 4 * ch * 2);
        uint8_t out[5 * 4 * 3];
        const int C = color ? 1 : 3;
        load_ok(path("deep.pnm"), (Shape){.c = C, .h = 4, .w = 5}, out);
        const uint8_t want = color ? (uint8_t)((0x12 * 77 + 0x56 * 150 + 0x9A * 29) >> 8) : 0x12;
        for (int i = 0; i < 5 * 4 * C; i++) assert_int_equal(out[i], want);
    }
    write_bytes(path("low.pgm"), "P5\n2 1\n15\n\x07\x0F", 13);
    uint8_t out[2];
    load_ok(path("low.pgm"), (Shape){.c = 1, .h = 1, .w = 2}, out);
    assert_int_equal(out[0], 119);
    assert_int_equal(out[1], 255);
}

static void expect_bad(const char *file, const char *why) {
    uint8_t out[8 * 8 * 3];
    Error err = {{0}};
    const ImageFit fit = stretch((Shape){.c = 3, .h = 8, .w = 8});
    const int rc = image_load(file, &fit, out, &err);
    if (rc != DATASET_BAD) fail_msg("%s: image_load gave %d, not DATASET_BAD (%s)", file, rc, err.msg);
    if (!strstr(err.msg, file) || !strstr(err.msg, why))
        fail_msg("message \"%s\" lacks the file or \"%s\"", err.msg, why);
}

static void test_declared_sizes(void **state) {
    write_bytes(path("w0.pgm"), "P5\n0 5\n255\n", 11);
    expect_bad(path("w0.pgm"), "width 0");
    write_bytes(path("wm.pgm"), "P5\n-1 5\n255\n", 12);
    expect_bad(path("wm.pgm"), "not an image");
    write_bytes(path("max0.pgm"), "P5\n2 2\n0\n\1\2\3\4", 13);
    expect_bad(path("max0.pgm"), "maxval 0");
    write_bytes(path("nodata.pgm"), "P5\n# a comment\n4 4\n255\n", 23);
    expect_bad(path("nodata.pgm"), "truncated");
    write_bytes(path("short.ppm"), "P6\n4 4\n255\n0123456789", 21);
    expect_bad(path("short.ppm"), "truncated");
    // A PNG whose IDAT chunk declares 1.5 GB in a 40-byte file (stb_image allocated 2 GB
    // for it: found by the image fuzz target).
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                  0, 0, 0, 12, 0, 0, 0, 9, 8, 0, 0, 0, 0, 0x23, 0xd3, 0x92, 0x88,
                                  0x5d, 0, 0, 0x2c, 'I', 'D', 'A', 'T', 0x78};
    write_bytes(path("forged.png"), png, sizeof png);
    expect_bad(path("forged.png"), "a PNG chunk at byte 33 declares 1560281132 bytes");
    // A whole PGM still reads, comments and all.
    write_bytes(path("ok.pgm"), "P5\n# c\n2 2\n255\n\1\2\3\4", 19);
    uint8_t out[4];
    load_ok(path("ok.pgm"), (Shape){.c = 1, .h = 2, .w = 2}, out);
    assert_memory_equal(out, "\1\2\3\4", 4);

    // A BMP cut short, and one of 102 bytes that declares 20000 x 6000 pixels.
    uint8_t *px = photo(16, 16, 3);
    assert_true(stbi_write_bmp(path("full.bmp"), 16, 16, 3, px));
    FILE *f = fopen(path("full.bmp"), "rb");
    assert_non_null(f);
    uint8_t bmp[2048];
    const size_t n = fread(bmp, 1, sizeof bmp, f);
    fclose(f);
    assert_true(n > 102 && n < sizeof bmp);
    write_bytes(path("cut.bmp"), bmp, n - 100);
    expect_bad(path("cut.bmp"), "truncated");
    uint8_t huge[102];
    memcpy(huge, bmp, sizeof huge);
    const uint32_t w = 20000, h = 6000;
    for (int i = 0; i < 4; i++) huge[18 + i] = (uint8_t)(w >> 8 * i), huge[22 + i] = (uint8_t)(h >> 8 * i);
    write_bytes(path("huge.bmp"), huge, sizeof huge);
    expect_bad(path("huge.bmp"), "20000 x 6000");
    free(px);
    // What the loader plans for a file it refuses by its header is nothing (it planned 360
    // MB for this one: a run with skip_bad was refused for memory).
    const ImageFit fit8 = stretch((Shape){.c = 3, .h = 8, .w = 8});
    assert_int_equal(image_load_bytes(path("huge.bmp"), &fit8, NULL), 0);
    write_bytes(path("vast.pgm"), "P5\n60000 60000\n255\n0123456789", 29);
    expect_bad(path("vast.pgm"), "truncated");
    assert_int_equal(image_load_bytes(path("vast.pgm"), &fit8, NULL), 0);
    // A 28-byte run-length TGA of 65280 x 1220 pixels (found by the fuzzer: it expanded for
    // seconds): more pixels than any format packs into so few bytes.
    static const uint8_t bomb[] = {0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x00, 0xff, 0xc4, 0x04, 0x20, 0x0a, 0xe5, 0x41, 0x47, 0x49, 0x46, 0x39, 0x37, 0x61, 0xd0, 0x14};
    write_bytes(path("bomb.tga"), bomb, sizeof bomb);
    expect_bad(path("bomb.tga"), "more than any image format compresses to");
    assert_int_equal(image_load_bytes(path("bomb.tga"), &fit8, NULL), 0);
}

// Formats stb_image decodes but the loader refuses by their first bytes, whatever the
// file's name: a damaged Softimage PIC (stb_image read through NULL: CVE-2023-43898), a
// Radiance HDR with a run of length 0 (stb_image never returned: CVE-2021-42715), a PSD.
static void test_refused_formats(void **state) {
    uint8_t pic[110] = {0x53, 0x80, 0xf6, 0x34};
    memcpy(pic + 88, "PICT\0\2\0\2", 8);
    memcpy(pic + 104, "\0\x08\0\xe0", 4);
    write_bytes(path("damaged.png"), pic, sizeof pic);
    expect_bad(path("damaged.png"), "a Softimage PIC file; the loader reads PNG, JPEG, BMP, GIF, TGA and PNM");
    static const char hdr[] = "#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 1 +X 8\n\x02\x02\x00\x08\x00";
    write_bytes(path("zero-run.hdr"), hdr, sizeof hdr - 1);
    expect_bad(path("zero-run.hdr"), "a Radiance HDR file");
    write_bytes(path("layers.psd"), "8BPS\0\1\0\0\0\0\0\0\0\3\0\0\0\4\0\0\0\4\0\x08\0\3", 26);
    expect_bad(path("layers.psd"), "a PSD file");
    const ImageFit fit8 = stretch((Shape){.c = 3, .h = 8, .w = 8});
    assert_int_equal(image_load_bytes(path("layers.psd"), &fit8, NULL), 0);
    assert_false(image_name_has_ext("a.psd") || image_name_has_ext("a.hdr") || image_name_has_ext("a.pic"));
    assert_true(image_name_has_ext("a.PNG") && image_name_has_ext("b.pgm"));
}

static void test_bad_jpegs(void **state) {
    uint8_t *rgb = photo(64, 64, 3);
    write_jpeg(path("whole.jpg"), rgb, 64, 64, 3, JCS_RGB, false);
    FILE *f = fopen(path("whole.jpg"), "rb");
    assert_non_null(f);
    static uint8_t jpg[1 << 16];
    const size_t n = fread(jpg, 1, sizeof jpg, f);
    fclose(f);
    write_bytes(path("half.jpg"), jpg, n / 2);
    expect_bad(path("half.jpg"), "Premature end of JPEG file");
    write_bytes(path("head.jpg"), jpg, 200);
    expect_bad(path("head.jpg"), "libjpeg-turbo");
    write_bytes(path("soi.jpg"), "\xFF\xD8\xFF", 3);
    expect_bad(path("soi.jpg"), "libjpeg-turbo");
    // Fill bytes before SOI: libjpeg-turbo's "not a JPEG file", never stb_image's own JPEG
    // decoder (it takes them, and writes past its tables on some damaged files).
    static uint8_t filled[2 + sizeof jpg];
    memcpy(filled, "\xFF\xFF", 2);
    memcpy(filled + 2, jpg, n);
    write_bytes(path("filled.jpg"), filled, n + 2);
    expect_bad(path("filled.jpg"), "Not a JPEG file");
    // Corrupt entropy-coded data in the middle: a warning, so a bad file.
    memcpy(jpg + n / 2, "\xFF\x01\xFF\x02", 4);
    write_bytes(path("corrupt.jpg"), jpg, n);
    expect_bad(path("corrupt.jpg"), "libjpeg-turbo");
    // A 1-pixel-wide JPEG of 30 rows whose frame header then says 65000 rows (libjpeg's
    // limit is 65500; stb_image filled the rest).
    uint8_t col[30 * 3];
    memcpy(col, rgb, sizeof col);
    write_jpeg(path("col.jpg"), col, 1, 30, 3, JCS_RGB, false);
    assert_non_null(f = fopen(path("col.jpg"), "rb"));
    const size_t m = fread(jpg, 1, sizeof jpg, f);
    fclose(f);
    size_t sof = 2;
    while (sof + 4 < m && !(jpg[sof] == 0xFF && jpg[sof + 1] == 0xC0)) sof++;
    assert_true(sof + 9 < m);
    jpg[sof + 5] = 0xFD, jpg[sof + 6] = 0xE8;  // the height, after marker, length, precision
    write_bytes(path("tall.jpg"), jpg, m);
    expect_bad(path("tall.jpg"), "premature end of data segment");
    free(rgb);
}

// ---- torchvision's preprocessing -------------------------------------------------------------

// Runs torchvision's Resize(size) + CenterCrop(crop) on the PIL images `files` (quoted paths,
// tests/preprocess_reference.py; size "256", or "WxH" to stretch): each file's FILE.ref.
// false when torchvision is missing.
static bool pil_reference(const char *size, int crop, const char *files) {
    const int rc = test_sh(g_dir, "/usr/bin/python3 '%s/tests/preprocess_reference.py' resize %s %d %s",
                           g_root, size, crop, files);
    if (rc == 3) return false;
    if (rc) fail_msg("preprocess_reference.py: %s", test_sh_output(g_dir));
    return true;
}

// The largest and the mean difference of file's bytes through fit from its FILE.ref.
static void pil_difference(const char *file, const ImageFit *fit, int *largest, double *mean) {
    const size_t n = (size_t)shape_numel(image_fit_shape(fit));
    uint8_t *got = malloc(n);
    assert_non_null(got);
    Error err = {{0}};
    if (image_load(file, fit, got, &err)) fail_msg("%s", err.msg);
    char ref[600];
    snprintf(ref, sizeof ref, "%s.ref", file);
    size_t bytes;
    uint8_t *want = test_read_file(ref, &bytes);
    assert_int_equal(bytes, n);
    double sum = 0;
    *largest = 0;
    for (size_t i = 0; i < n; i++) {
        const int d = abs(got[i] - want[i]);
        *largest = d > *largest ? d : *largest;
        sum += d;
    }
    *mean = sum / (double)n;
    free(got), free(want);
}

// resize = shorter, short_side = 256, center_crop = 224 (and a stretch with a centre crop)
// against PIL + torchvision's transforms: images decoded at full size (PNG) within 1 of
// PIL's bytes and 0.25 on average (PIL rounds its first pass to bytes, and sums in fixed
// point); JPEGs, which cnn.c decodes at the smallest DCT scale that covers the resized image
// and PIL at full size, within 10 and 1.2 on average (8 and 0.96 at most here: a margin for
// another libjpeg-turbo's scaled IDCT). Landscape, portrait, an odd margin
// (333 x 257: 331 x 256, its crop 54 from the left, Python's round), an enlargement, gray.
static void test_shorter_center_crop_pil(void **state) {
    static const struct {
        int w, h, C;
        bool jpeg, stretch;  // stretch: to 300 x 260, torchvision's Resize((260, 300))
    } cases[] = {{500, 375, 3, false, false}, {375, 500, 3, false, false}, {333, 257, 3, false, false},
                 {640, 480, 1, false, false}, {200, 150, 3, false, false}, {500, 375, 3, false, true},
                 {500, 375, 3, true, false},  {640, 480, 3, true, false},  {1024, 768, 3, true, false}};
    enum { CASES = sizeof cases / sizeof *cases };
    char names[CASES][64], shorter[4096] = "", stretched[1024] = "";
    for (size_t k = 0; k < CASES; k++) {
        const int w = cases[k].w, h = cases[k].h, C = cases[k].C;
        snprintf(names[k], sizeof names[k], "pil%dx%dx%d%s.%s", w, h, C, cases[k].stretch ? "s" : "",
                 cases[k].jpeg ? "jpg" : "png");
        uint8_t *px = photo(w, h, C);
        if (cases[k].jpeg) write_jpeg(path(names[k]), px, w, h, C, JCS_RGB, false);
        else assert_true(stbi_write_png(path(names[k]), w, h, C, px, w * C));
        free(px);
        char *list = cases[k].stretch ? stretched : shorter;
        const size_t size = cases[k].stretch ? sizeof stretched : sizeof shorter;
        snprintf(list + strlen(list), size - strlen(list), " '%s'", path(names[k]));
    }
    if (!pil_reference("256", 224, shorter) || !pil_reference("300x260", 224, stretched)) skip();
    for (size_t k = 0; k < CASES; k++) {
        const int C = cases[k].C;
        const ImageFit fit = cases[k].stretch
            ? (ImageFit){.channels = C, .width = 300, .height = 260, .center_crop = 224}
            : (ImageFit){.channels = C, .resize = RESIZE_SHORTER, .short_side = 256, .center_crop = 224};
        int largest;
        double mean;
        pil_difference(path(names[k]), &fit, &largest, &mean);
        print_message("%-22s Resize(%s), CenterCrop(224): largest difference %d, mean %.3f\n", names[k],
                      cases[k].stretch ? "(260, 300)" : "256", largest, mean);
        if (cases[k].jpeg ? largest > 10 || mean > 1.2 : largest > 1 || mean > 0.25)
            fail_msg("%s: %d and %.3f from PIL's bytes", names[k], largest, mean);
    }
}

// A random resized crop of a file is the box of its own pixels (resized_crop_box on its
// width x height) resized to the sample: the same bytes as image_resize of that box.
static void test_crop_of_file(void **state) {
    const int w = 90, h = 60;
    uint8_t *px = photo(w, h, 3);
    assert_true(stbi_write_png(path("crop.png"), w, h, 3, px, w * 3));
    const ResizedCrop crop = {.scale = {0.08, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};
    const ImageFit fit = {.channels = 3, .width = 16, .height = 12};
    for (uint64_t key = 0; key < 40; key++) {
        uint8_t got[16 * 12 * 3], want[16 * 12 * 3];
        Error err = {{0}};
        if (image_load_crop(path("crop.png"), &fit, &crop, key, got, &err)) fail_msg("%s", err.msg);
        const CropBox b = resized_crop_box(&crop, key, w, h);
        assert_int_equal(image_resize(px + ((size_t)b.y * w + b.x) * 3, b.w, b.h, (size_t)w * 3, 3, want, 16, 12), 0);
        assert_memory_equal(got, want, sizeof got);
    }
    free(px);
}

// A fit that makes no sample is refused (-1) naming the file and the key; an image that
// resize = shorter would stretch beyond 2^24 pixels is a bad file; a random crop of a strip
// one pixel high still reads.
static void test_fit_errors(void **state) {
    uint8_t *px = photo(40, 30, 3);
    assert_true(stbi_write_png(path("fit.png"), 40, 30, 3, px, 40 * 3));
    free(px);
    static const struct {
        ImageFit fit;
        const char *why;
    } bad[] = {
        {{.channels = 3, .resize = RESIZE_SHORTER, .short_side = 256, .center_crop = 300}, "center_crop = 300"},
        {{.channels = 3, .resize = RESIZE_SHORTER, .short_side = 256}, "center_crop = 0"},
        {{.channels = 3, .resize = RESIZE_SHORTER, .short_side = 0, .center_crop = 8}, "short_side = 0"},
        {{.channels = 3, .resize = RESIZE_SHORTER, .short_side = -5, .center_crop = 8}, "short_side = -5"},
        {{.channels = 3, .width = 16, .height = 16, .center_crop = 20}, "center_crop = 20"},
        {{.channels = 3, .width = 16, .height = 16, .center_crop = -1}, "center_crop = -1"},
        {{.channels = 3, .width = 0, .height = 16}, "width = 0"},
        {{.channels = 2, .width = 16, .height = 16}, "channels = 2"},
        {{.channels = 3, .resize = (ImageResize)7, .width = 16, .height = 16}, "resize mode 7"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t out[16 * 16 * 3];
        Error err = {{0}};
        assert_int_equal(image_load(path("fit.png"), &bad[i].fit, out, &err), -1);
        if (!strstr(err.msg, path("fit.png")) || !strstr(err.msg, bad[i].why))
            fail_msg("message \"%s\" lacks the file or \"%s\"", err.msg, bad[i].why);
    }
    static uint8_t strip[32 + 70000];
    const int n = snprintf((char *)strip, 32, "P5\n70000 1\n255\n");
    write_bytes(path("strip.pgm"), strip, (size_t)n + 70000);
    const ImageFit shorter = {.channels = 1, .resize = RESIZE_SHORTER, .short_side = 256, .center_crop = 8};
    uint8_t out[64];
    Error err = {{0}};
    assert_int_equal(image_load(path("strip.pgm"), &shorter, out, &err), DATASET_BAD);
    if (!strstr(err.msg, "strip.pgm") || !strstr(err.msg, "too elongated")) fail_msg("%s", err.msg);
    const ResizedCrop crop = {.scale = {0.08, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};
    const ImageFit eight = {.channels = 1, .width = 8, .height = 8};
    for (uint64_t key = 0; key < 5; key++)
        if (image_load_crop(path("strip.pgm"), &eight, &crop, key, out, &err)) fail_msg("%s", err.msg);
}

// ---- what a decode holds, against image_load_bytes ----------------------------------------
//
// The heap the process holds, counted by malloc and its family defined here, over glibc's
// own (they take every call, libjpeg-turbo's and stb_image's included). Not under
// AddressSanitizer, which has its own.
#if defined(__SANITIZE_ADDRESS__)
#define HEAP_COUNTED 0
#else
#define HEAP_COUNTED 1
#include <malloc.h>
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
static size_t heap_now, heap_peak;
static void heap_add(void *p) {
    if (!p) return;
    heap_now += malloc_usable_size(p);
    if (heap_now > heap_peak) heap_peak = heap_now;
}
static void heap_sub(void *p) {
    if (p) heap_now -= malloc_usable_size(p);
}
void *malloc(size_t n) {
    void *p = __libc_malloc(n);
    heap_add(p);
    return p;
}
void *calloc(size_t a, size_t b) {
    void *p = __libc_calloc(a, b);
    heap_add(p);
    return p;
}
void *realloc(void *q, size_t n) {
    heap_sub(q);
    void *p = __libc_realloc(q, n);
    heap_add(p ? p : n ? q : NULL);
    return p;
}
void free(void *p) {
    heap_sub(p);
    __libc_free(p);
}
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = __libc_memalign(a, n);
    if (!p) return 12;  // ENOMEM
    heap_add(p);
    *out = p;
    return 0;
}
void *aligned_alloc(size_t a, size_t n) {
    void *p = __libc_memalign(a, n);
    heap_add(p);
    return p;
}
void *memalign(size_t a, size_t n) { return aligned_alloc(a, n); }
#endif

#if HEAP_COUNTED
// The heap image_load (crop NULL) or image_load_crop of file holds at its peak against what
// image_load_bytes charges for it: never more; for a JPEG read without a crop, not far
// less (a crop's charge is its largest box's, whatever box a key draws).
static void expect_charge(const char *file, const ImageFit *fit, const ResizedCrop *crop,
                          uint64_t key, uint8_t *out) {
    const size_t charge = image_load_bytes(path(file), fit, crop);
    heap_peak = heap_now;
    const size_t before = heap_now;
    Error err = {{0}};
    if (crop ? image_load_crop(path(file), fit, crop, key, out, &err) : image_load(path(file), fit, out, &err))
        fail_msg("%s", err.msg);
    const size_t held = heap_peak - before;
    const Shape s = image_fit_shape(fit);
    char what[160];
    snprintf(what, sizeof what, "%s to %dx%dx%d%s%s", file, s.w, s.h, s.c,
             fit->resize == RESIZE_SHORTER ? " (shorter side, centre crop)" : "", crop ? " (random crop)" : "");
    print_message("%-52s holds %7zu, charged %7zu\n", what, held, charge);
    if (held > charge) fail_msg("%s: image_load held %zu bytes, image_load_bytes says %zu", what, held, charge);
    // A JPEG's estimate is from above, not far above: the DC path's decoding tables (made
    // once a thread, then kept) are charged to every decode at 1/8 scale. (A PNG's allows
    // for 16-bit samples: an 8-bit one holds half its inflate charge.)
    if (!crop && strstr(file, ".jpg") && charge > held + held / 4 + 160000)
        fail_msg("%s: charged %zu bytes for a decode that held %zu", what, charge, held);
}
#endif

// image_load_bytes is what the loader plans for each worker's decode: it must cover what
// image_load holds (the plan stays true) and follow the JPEG's DCT scaling (the decode of
// a 600x600 photo for 224x224 holds the 225x225 scaled image, not the 600x600 one), for
// stretched images, shorter sides with centre crops, and random resized crops of any box.
static void test_decode_charge(void **state) {
#if !HEAP_COUNTED
    skip();
#else
    uint8_t *rgb = photo(600, 600, 3), *gray = photo(600, 600, 1);
    write_jpeg(path("c600.jpg"), rgb, 600, 600, 3, JCS_RGB, false);
    write_jpeg(path("c600p.jpg"), rgb, 600, 600, 3, JCS_RGB, true);
    write_jpeg(path("g600.jpg"), gray, 600, 600, 1, JCS_GRAYSCALE, false);
    uint8_t *big = photo(1600, 1200, 3);
    write_jpeg(path("c1600x1200.jpg"), big, 1600, 1200, 3, JCS_RGB, false);
    assert_true(stbi_write_png(path("c600.png"), 600, 600, 3, rgb, 600 * 3));
    const char *files[] = {"c600.jpg", "c600p.jpg", "g600.jpg", "c1600x1200.jpg", "c600.png"};
    const Shape targets[] = {{.c = 3, .h = 224, .w = 224}, {.c = 3, .h = 64, .w = 64},
                             {.c = 1, .h = 28, .w = 28}, {.c = 3, .h = 600, .w = 600},
                             {.c = 3, .h = 300, .w = 200}};
    const ImageFit shorter[] = {
        {.channels = 3, .resize = RESIZE_SHORTER, .short_side = 256, .center_crop = 224},
        {.channels = 3, .resize = RESIZE_SHORTER, .short_side = 72, .center_crop = 64},
        {.channels = 1, .resize = RESIZE_SHORTER, .short_side = 32, .center_crop = 28}};
    const ResizedCrop crop = {.scale = {0.08, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};
    uint8_t *out = malloc(600 * 600 * 3);
    assert_non_null(out);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        for (size_t t = 0; t < sizeof targets / sizeof *targets; t++) {
            const ImageFit fit = stretch(targets[t]);
            expect_charge(files[f], &fit, NULL, 0, out);
            if (t < 3)
                for (uint64_t key = 0; key < 4; key++) expect_charge(files[f], &fit, &crop, key, out);
        }
        for (size_t t = 0; t < sizeof shorter / sizeof *shorter; t++) expect_charge(files[f], &shorter[t], NULL, 0, out);
    }
    // The decode for 224 x 224 is sized by the 3/8-scaled image: 225 x 225 x 3 bytes and the
    // file, a small fraction of the 600 x 600 x 3 that a full-size decode would hold.
    const ImageFit fit224 = stretch(targets[0]);
    const size_t c224 = image_load_bytes(path("c600.jpg"), &fit224, NULL);
    struct stat st;
    assert_int_equal(stat(path("c600.jpg"), &st), 0);
    assert_true(c224 < (size_t)st.st_size + 225 * 225 * 3 + 120000);
    assert_true(c224 < 600 * 600 * 3 / 2);
    free(out), free(rgb), free(gray), free(big);
#endif
}

static int suite_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_image"); }
static int suite_teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    test_find_root(g_root, sizeof g_root, argv[0], "tests/preprocess_reference.py");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jpeg_scaled_decode),
        cmocka_unit_test(test_jpeg_smaller_than_target),
        cmocka_unit_test(test_resize_any_size),
        cmocka_unit_test(test_pnm_depths),
        cmocka_unit_test(test_declared_sizes),
        cmocka_unit_test(test_refused_formats),
        cmocka_unit_test(test_bad_jpegs),
        cmocka_unit_test(test_shorter_center_crop_pil),
        cmocka_unit_test(test_crop_of_file),
        cmocka_unit_test(test_fit_errors),
        cmocka_unit_test(test_decode_charge),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
