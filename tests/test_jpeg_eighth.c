// test_jpeg_eighth.c: the DC path (data/jpeg_eighth.c) against libjpeg-turbo's own decode
// at 1/8 scale, byte for byte.
//
// - What encoders write, all accepted and equal: sizes from 1 x 1 to 600 x 600 (partial
//   MCUs on both edges); gray, and YCbCr at 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0, 3:1,
//   chroma sampled above luma and the two chroma components sampled differently (blocks of
//   one pixel, 2 x 2 IDCT blocks, replication by 1 to 4); qualities 5 to 100; restart
//   markers every MCU, every row, every 7 MCUs; standard and optimized Huffman tables;
//   smooth, noisy and flat black-and-white pictures; gray and RGB output.
// - Coefficients written directly (jpeg_write_coefficients): DC sums far past the IDCT's
//   range limit, where libjpeg-turbo's table wraps (accepted, equal); 2 x 2 blocks up to
//   IDCT2_MAX (accepted, equal) and past it (declined).
// - Damaged files (each bit of the entropy data flipped in turn, the file cut, restart
//   markers renumbered, dropped or added, bytes before EOI, EOI missing): the DC path
//   accepts only files that libjpeg-turbo decodes without a warning, to the same bytes.
// - Out of scope, declined: progressive, CMYK, RGB-coded, one scan per component, scales
//   other than 1/8.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "jpeg_reference.h"

typedef struct Jpeg {
    unsigned char *data;
    unsigned long size;
} Jpeg;

typedef struct Options {
    int quality;             // 1..100
    int samp[3][2];          // h, v of each component; zeros: libjpeg's default
    int restart_interval;    // MCUs; negative: -rows (restart_in_rows)
    bool optimize;           // Huffman tables made for the image
    bool progressive;
    bool scan_per_component; // a sequential file of one scan per component
    J_COLOR_SPACE jpeg_space;  // 0: libjpeg's default for the input
} Options;

// Pictures of w x h x c: smooth waves with noise, full-range noise, or black and white
// halves (the DC extremes).
enum { SMOOTH, NOISE, FLAT };
static uint8_t *picture(int w, int h, int c, int kind, uint32_t seed) {
    uint8_t *b = malloc((size_t)w * h * c);
    assert_non_null(b);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) {
                seed = seed * 1664525u + 1013904223u;
                double v = kind == NOISE ? (double)(seed >> 24)
                           : kind == FLAT ? (x < w / 2) == (k != 1) ? 255 : 0
                                          : 128 + 90 * sin(x / 9.0 + k) * cos(y / 7.0 - k) + (double)(seed >> 27) - 16;
                b[((size_t)y * w + x) * c + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return b;
}

// A compressor writing into *j, for w x h pixels of c channels (gray, RGB, CMYK), libjpeg's
// defaults set.
static void compress_begin(struct jpeg_compress_struct *e, struct jpeg_error_mgr *err, Jpeg *j, int w, int h,
                           int c) {
    *j = (Jpeg){NULL, 0};
    e->err = jpeg_std_error(err);
    jpeg_create_compress(e);
    jpeg_mem_dest(e, &j->data, &j->size);
    e->image_width = (JDIMENSION)w, e->image_height = (JDIMENSION)h;
    e->input_components = c, e->in_color_space = c == 1 ? JCS_GRAYSCALE : c == 4 ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(e);
}

static Jpeg encode(const uint8_t *px, int w, int h, int c, const Options *o) {
    struct jpeg_compress_struct e;
    struct jpeg_error_mgr err;
    Jpeg j;
    compress_begin(&e, &err, &j, w, h, c);
    if (o->jpeg_space) jpeg_set_colorspace(&e, o->jpeg_space);
    jpeg_set_quality(&e, o->quality, TRUE);
    for (int i = 0; i < e.num_components && o->samp[0][0]; i++)
        e.comp_info[i].h_samp_factor = o->samp[i][0], e.comp_info[i].v_samp_factor = o->samp[i][1];
    if (o->restart_interval > 0) e.restart_interval = (unsigned)o->restart_interval;
    if (o->restart_interval < 0) e.restart_in_rows = -o->restart_interval;
    e.optimize_coding = o->optimize;
    static jpeg_scan_info scans[4];
    if (o->scan_per_component) {
        for (int i = 0; i < e.num_components; i++)
            scans[i] = (jpeg_scan_info){.comps_in_scan = 1, .component_index = {i}, .Ss = 0, .Se = 63};
        e.scan_info = scans, e.num_scans = e.num_components;
    }
    if (o->progressive) jpeg_simple_progression(&e);
    jpeg_start_compress(&e, TRUE);
    while (e.next_scanline < e.image_height) {
        JSAMPROW r = (JSAMPROW)(px + (size_t)e.next_scanline * w * c);
        jpeg_write_scanlines(&e, &r, 1);
    }
    jpeg_finish_compress(&e);
    jpeg_destroy_compress(&e);
    return j;
}

static uint8_t g_a[1 << 20], g_b[1 << 20];  // the two decodes (2048 x 2048 at 1/8: 192 KB)

// Both decodes of j to C channels at 1/8 scale; the DC path's return code, after checking
// that an accepted file is one libjpeg-turbo decodes without a warning, to the same bytes.
// *clean: whether libjpeg-turbo decoded it without a warning (NULL: not wanted).
static int compare_clean(Jpeg j, int C, bool *clean) {
    int rc;
    bool ok;
    assert_true(jpeg_reference_agree(j.data, j.size, C, g_a, g_b, sizeof g_a, &rc, &ok));
    if (clean) *clean = ok;
    return rc;
}

static int compare(Jpeg j, int C) { return compare_clean(j, C, NULL); }

static void test_encoders_output(void **state) {
    static const int samplings[][3][2] = {
        {{1, 1}, {1, 1}, {1, 1}}, {{2, 1}, {1, 1}, {1, 1}}, {{2, 2}, {1, 1}, {1, 1}},
        {{1, 2}, {1, 1}, {1, 1}}, {{4, 1}, {1, 1}, {1, 1}}, {{4, 2}, {1, 1}, {1, 1}},
        {{3, 1}, {1, 1}, {1, 1}}, {{1, 1}, {2, 2}, {2, 2}}, {{2, 2}, {1, 1}, {2, 1}},
        {{2, 2}, {1, 2}, {2, 1}}};
    static const int sizes[][2] = {{1, 1}, {7, 9}, {16, 16}, {17, 33}, {45, 23}, {127, 64}, {200, 150}};
    static const int qualities[] = {5, 50, 90, 100}, restarts[] = {0, 1, -1, 7};
    const int S = sizeof samplings / sizeof *samplings, Z = sizeof sizes / sizeof *sizes;
    int files = 0;
    for (int s = 0; s <= S; s++) {  // s == S: a gray JPEG
        for (int z = 0; z <= Z; z++) {
            const int w = z < Z ? sizes[z][0] : 600 - s % 2, h = z < Z ? sizes[z][1] : 600 + s % 3;
            const int c = s < S ? 3 : 1;
            Options o = {.quality = qualities[(s + z) % 4], .restart_interval = restarts[(s + 2 * z) % 4],
                         .optimize = (s * 7 + z) % 2};
            if (s < S) memcpy(o.samp, samplings[s], sizeof o.samp);
            uint8_t *px = picture(w, h, c, (s + 2 * z) % 3, (uint32_t)(s * 100 + z));
            Jpeg j = encode(px, w, h, c, &o);
            for (int C = 1; C <= 3; C += 2)
                if (compare(j, C)) fail_msg("declined: sampling %d, %d x %d, quality %d, restart %d, C %d", s, w, h,
                                            o.quality, o.restart_interval, C);
            free(j.data), free(px);
            files++;
        }
    }
    print_message("%d files, each to gray and RGB: all accepted, the same bytes as libjpeg-turbo\n", files);
}

// The coefficients of block (bx, by) of component `comp` (0: Y), the mcu-th in coding order.
typedef void Fill(int comp, int bx, int by, int mcu, JCOEF *block);

// A JPEG of w x h pixels (whole MCUs: no dummy blocks) written from coefficients, 4:2:0
// (chroma_samp 2) or 4:4:4, quantization luma_q / chroma_q everywhere, optimized Huffman
// tables (the standard ones have no codes for the larger values). The encoder takes DC
// differences up to 2,047 between blocks in coding order and AC values up to 1,023.
static Jpeg from_coefficients(int w, int h, int chroma_samp, int luma_q, int chroma_q, Fill *fill) {
    struct jpeg_compress_struct e;
    struct jpeg_error_mgr err;
    Jpeg j;
    compress_begin(&e, &err, &j, w, h, 3);
    e.comp_info[0].h_samp_factor = e.comp_info[0].v_samp_factor = chroma_samp;
    unsigned int q[2][DCTSIZE2];
    for (int k = 0; k < DCTSIZE2; k++) q[0][k] = (unsigned)luma_q, q[1][k] = (unsigned)chroma_q;
    jpeg_add_quant_table(&e, 0, q[0], 100, TRUE);
    jpeg_add_quant_table(&e, 1, q[1], 100, TRUE);
    e.optimize_coding = TRUE;
    jvirt_barray_ptr arrays[3];
    int wb[3], hb[3];
    for (int i = 0; i < 3; i++) {
        const int hs = e.comp_info[i].h_samp_factor, vs = e.comp_info[i].v_samp_factor;
        wb[i] = w * hs / chroma_samp / 8, hb[i] = h * vs / chroma_samp / 8;
        arrays[i] = (*e.mem->request_virt_barray)((j_common_ptr)&e, JPOOL_IMAGE, TRUE, (JDIMENSION)wb[i],
                                                  (JDIMENSION)hb[i], (JDIMENSION)vs);
    }
    jpeg_write_coefficients(&e, arrays);
    for (int i = 0; i < 3; i++)
        for (int by = 0; by < hb[i]; by++) {
            JBLOCKARRAY rows = (*e.mem->access_virt_barray)((j_common_ptr)&e, arrays[i], (JDIMENSION)by, 1, TRUE);
            for (int bx = 0; bx < wb[i]; bx++) {
                const int s = i ? 1 : chroma_samp;
                fill(i, bx, by, by / s * (wb[i] / s) + bx / s, rows[0][bx]);
            }
        }
    jpeg_finish_compress(&e);
    jpeg_destroy_compress(&e);
    return j;
}

// Luma: a triangle wave of DC over the MCUs (amplitude g_dc_max, g_dc_step an MCU) and a
// little AC; chroma: DC +-100 and every AC coefficient +-g_chroma_ac.
static int g_dc_step, g_dc_max, g_chroma_ac;
static void fill_waves(int comp, int bx, int by, int mcu, JCOEF *b) {
    if (comp == 0) {
        const int t = (mcu * g_dc_step + g_dc_max) % (4 * g_dc_max);  // 0 at the first MCU
        b[0] = (JCOEF)(t <= 2 * g_dc_max ? t - g_dc_max : 3 * g_dc_max - t);
        for (int k = 1; k < DCTSIZE2; k += 5) b[k] = (JCOEF)((bx * 13 + by * 7 + k) % 31 - 15);
    } else {
        b[0] = (JCOEF)(bx % 2 ? 100 : -100);
        for (int k = 1; k < DCTSIZE2; k++) b[k] = (JCOEF)((k + bx) % 2 ? g_chroma_ac : -g_chroma_ac);
    }
}

static Jpeg waves(int chroma_samp, int luma_q, int chroma_q, int dc_step, int dc_max, int chroma_ac) {
    g_dc_step = dc_step, g_dc_max = dc_max, g_chroma_ac = chroma_ac;
    return from_coefficients(64, 48, chroma_samp, luma_q, chroma_q, fill_waves);
}

// DC only, quantization 1: Cb = 8 bx - 1,024 and Cr = 8 by - 1,024 over 256 x 256 blocks,
// so the 1/8 picture holds every (Cb, Cr) pair of bytes; Y a triangle wave of DC over
// +-32,760 in steps of 8, so the IDCT's range limit sees every index of its table.
static void fill_every_value(int comp, int bx, int by, int mcu, JCOEF *b) {
    const int t = (mcu * 8 + 32760) % (4 * 32760);
    b[0] = (JCOEF)(comp == 1 ? 8 * bx - 1024 : comp == 2 ? 8 * by - 1024 : t <= 2 * 32760 ? t - 32760 : 3 * 32760 - t);
}

static void test_extreme_coefficients(void **state) {
    // DC * 255 far past +-512 after the IDCT's /8: libjpeg-turbo's range limit wraps there.
    Jpeg j = waves(2, 255, 1, 2000, 32000, 3);
    for (int C = 1; C <= 3; C += 2) assert_int_equal(compare(j, C), 0);
    free(j.data);
    j = waves(1, 255, 1, 1500, 30000, 1000);  // 4:4:4: no 2 x 2 blocks, any AC
    for (int C = 1; C <= 3; C += 2) assert_int_equal(compare(j, C), 0);
    free(j.data);
    // 2 x 2 blocks: 1,000 x 2 = 2,000 is within IDCT2_MAX (2,048), 1,000 x 3 is not, nor a
    // DC of 100 x 21 in a block of no AC.
    j = waves(2, 1, 2, 10, 500, 1000);
    assert_int_equal(compare(j, 3), 0);
    assert_int_equal(compare(j, 1), 0);  // gray output: the chroma is passed over, any size
    free(j.data);
    j = waves(2, 1, 3, 10, 500, 1000);
    assert_int_equal(compare(j, 3), JPEG_EIGHTH_DECLINED);
    assert_int_equal(compare(j, 1), 0);
    free(j.data);
    j = waves(2, 1, 21, 10, 500, 0);
    assert_int_equal(compare(j, 3), JPEG_EIGHTH_DECLINED);
    free(j.data);
    // The colour conversion at every (Cb, Cr), the range limit at every index.
    j = from_coefficients(2048, 2048, 1, 1, 1, fill_every_value);
    assert_int_equal(compare(j, 3), 0);
    free(j.data);
}

static Jpeg copy(Jpeg j, size_t size) {
    Jpeg c = {malloc(size ? size : 1), size};
    assert_non_null(c.data);
    memcpy(c.data, j.data, size < j.size ? size : j.size);
    return c;
}

// Where the entropy-coded data starts: after the (first) SOS segment.
static size_t scan_start(Jpeg j) {
    for (size_t p = 2; p + 4 < j.size;) {
        const size_t len = (size_t)j.data[p + 2] << 8 | j.data[p + 3];
        if (j.data[p + 1] == 0xDA) return p + 2 + len;
        p += 2 + len;
    }
    fail_msg("no SOS");
    return 0;
}

static void test_damaged_data(void **state) {
    uint8_t *px = picture(40, 40, 3, SMOOTH, 7);
    int accepted = 0, variants = 0, libjpeg_ok = 0;
    for (int base = 0; base < 3; base++) {
        const Options o = {.quality = 75, .restart_interval = base == 1 ? 2 : 0, .samp = {{2, 2}, {1, 1}, {1, 1}}};
        Jpeg j = encode(px, 40, 40, base == 2 ? 1 : 3, &o);
        if (base == 2) {  // a gray file: the same picture's first channel
            free(j.data);
            uint8_t *g = picture(40, 40, 1, SMOOTH, 7);
            j = encode(g, 40, 40, 1, &o);
            free(g);
        }
        const size_t data = scan_start(j);
        // Each bit of the entropy-coded data flipped in turn, then each file cut short.
        for (size_t bit = 0; bit < (j.size - data) * 8; bit++) {
            Jpeg d = copy(j, j.size);
            d.data[data + bit / 8] ^= (uint8_t)(1 << bit % 8);
            for (int C = 1; C <= 3; C += 2, variants++) {
                bool clean;
                accepted += compare_clean(d, C, &clean) == 0;
                libjpeg_ok += clean;
            }
            free(d.data);
        }
        for (size_t cut = data; cut < j.size; cut += 1 + (j.size - data) / 40) {
            Jpeg d = copy(j, cut);
            assert_int_not_equal(compare(d, 3), 0);
            free(d.data);
            variants++;
        }
        // Markers: each restart marker renumbered, then dropped; RST0 added; bytes before
        // EOI; EOI missing; fill bytes FF before EOI (allowed).
        for (size_t p = data; p + 1 < j.size; p++) {
            if (j.data[p] != 0xFF || j.data[p + 1] < 0xD0 || j.data[p + 1] > 0xD7) continue;
            Jpeg d = copy(j, j.size);
            d.data[p + 1] = (uint8_t)(0xD0 + (d.data[p + 1] + 1) % 8);
            assert_int_not_equal(compare(d, 3), 0);
            memmove(d.data + p, j.data + p + 2, j.size - p - 2);
            d.size -= 2;
            assert_int_not_equal(compare(d, 3), 0);
            free(d.data);
            variants += 2;
        }
        Jpeg d = copy(j, j.size + 2);
        memmove(d.data + data + 6, j.data + data + 4, j.size - data - 4);
        memcpy(d.data + data + 4, "\xFF\xD0", 2);
        assert_int_not_equal(compare(d, 3), 0);
        memcpy(d.data, j.data, j.size - 2);  // two bytes of data before EOI
        memcpy(d.data + j.size - 2, "\x12\x34\xFF\xD9", 4);
        assert_int_not_equal(compare(d, 3), 0);
        memcpy(d.data + j.size - 2, "\xFF\xFF\xFF\xD9", 4);
        assert_int_equal(compare(d, 3), 0);
        d.size = j.size - 2;
        assert_int_not_equal(compare(d, 3), 0);
        free(d.data);
        variants += 4;
        free(j.data);
    }
    print_message("%d damaged files: libjpeg-turbo decodes %d without a warning; the DC path accepts %d, "
                  "each to libjpeg-turbo's bytes, and declines the rest\n", variants, libjpeg_ok, accepted);
    assert_true(accepted > 0 && accepted <= libjpeg_ok);
    free(px);
}

// Huffman tables libjpeg-turbo refuses, though the data never uses the broken part: a DC
// symbol above 15, two codes of one bit (the second all ones). Declined, and libjpeg-turbo
// fails.
static void test_bad_tables(void **state) {
    uint8_t *px = picture(32, 32, 3, SMOOTH, 5);
    const Options o = {.quality = 90};
    Jpeg j = encode(px, 32, 32, 3, &o);
    size_t dht = 2;  // the first DHT: the luma DC table, 0..11 by the standard's code lengths
    while (dht + 4 < j.size && !(j.data[dht] == 0xFF && j.data[dht + 1] == 0xC4))
        dht += 2 + ((size_t)j.data[dht + 2] << 8 | j.data[dht + 3]);
    assert_true(dht + 4 + 17 + 12 <= j.size && j.data[dht + 4] == 0x00 && j.data[dht + 5 + 1] == 1);
    uint8_t *counts = j.data + dht + 5, *symbols = counts + 16;
    for (int broken = 0; broken < 2; broken++) {
        Jpeg d = copy(j, j.size);
        if (broken == 0) {
            d.data[symbols - j.data + 11] = 16;
        } else {
            d.data[counts - j.data + 0] = 2;  // lengths 1 and 2: 2 + 1 codes instead of 0 + 1 ...
            d.data[counts - j.data + 2] -= 2;  // ... and 3 of length 3 instead of 5
        }
        bool clean;
        assert_int_equal(compare_clean(d, 3, &clean), JPEG_EIGHTH_DECLINED);
        assert_false(clean);
        free(d.data);
    }
    free(j.data), free(px);
}

static void test_out_of_scope(void **state) {
    uint8_t *rgb = picture(64, 64, 3, SMOOTH, 3), *cmyk = picture(64, 64, 4, SMOOTH, 4);
    const Options plain = {.quality = 90}, prog = {.quality = 90, .progressive = true},
                  scans = {.quality = 90, .scan_per_component = true}, rgb_coded = {.quality = 90, .jpeg_space = JCS_RGB};
    const Options *out_of_scope[] = {&prog, &scans, &rgb_coded};
    for (int i = 0; i < 3; i++) {
        Jpeg j = encode(rgb, 64, 64, 3, out_of_scope[i]);
        assert_int_equal(compare(j, 3), JPEG_EIGHTH_DECLINED);
        free(j.data);
    }
    Jpeg j = encode(cmyk, 64, 64, 4, &plain);
    int w, h;
    assert_int_equal(jpeg_reference_decode(j.data, j.size, 3, 1, true, g_b, sizeof g_b, &w, &h), JPEG_EIGHTH_DECLINED);
    free(j.data);
    j = encode(rgb, 64, 64, 3, &plain);
    for (int scale = 2; scale <= 8; scale++)
        assert_int_equal(jpeg_reference_decode(j.data, j.size, 3, scale, true, g_b, sizeof g_b, &w, &h), JPEG_EIGHTH_DECLINED);
    assert_int_equal(compare(j, 3), 0);
    free(j.data);
    free(rgb), free(cmyk);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encoders_output),
        cmocka_unit_test(test_extreme_coefficients),
        cmocka_unit_test(test_damaged_data),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_out_of_scope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
