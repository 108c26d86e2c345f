// test_transform.c: torchvision's transforms as the loader applies them (data/transform.c).
//
//   - Resize(size)'s size for the shorter side and CenterCrop's offsets: torchvision's
//     numbers, its truncation and Python's round (halves to even) included;
//   - RandomResizedCrop: over 20,000 keys on each of several image sizes, every box lies in
//     the image; on images whose aspect ratio lies in the range, every box's area fraction
//     lies in [0.08, 1] and its aspect ratio in [3/4, 4/3] up to the rounding of its sides
//     to whole pixels, and the draws reach both ends of both ranges; elsewhere the central
//     fallback of torchvision; a box is a pure function of its key;
//   - ColorJitter: adjust_brightness, adjust_contrast and adjust_saturation of a small RGB
//     and a gray image, at factors from 0 to 2.5, byte for byte as torchvision's functional
//     on the PIL image (tests/preprocess_reference.py, skipped without torchvision);
//     color_jitter draws each factor from its range and all six orders of the three.
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

#include <stb/stb_image_write.h>

#include "../data/transform.h"
#include "../nn/rng.h"
#include "testutil.h"

static char g_root[PATH_MAX] = ".", g_dir[512];

// ---- Resize and CenterCrop ------------------------------------------------------------------

// Sizes as torchvision's _compute_resized_output_size gives them (int() of size * long / short).
static void test_resize_shorter(void **state) {
    static const int cases[][5] = {
        {500, 375, 256, 341, 256}, {375, 500, 256, 256, 341}, {640, 480, 256, 341, 256},
        {1024, 768, 256, 341, 256}, {333, 257, 256, 331, 256}, {256, 256, 256, 256, 256},
        {500, 375, 232, 309, 232}, {100, 3, 256, 8533, 256}, {7, 5, 10, 14, 10},
        {1, 1000, 256, 256, 256000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t w, h;
        resize_shorter(cases[i][0], cases[i][1], cases[i][2], &w, &h);
        if (w != cases[i][3] || h != cases[i][4])
            fail_msg("%d x %d to %d: %lld x %lld, torchvision %d x %d", cases[i][0], cases[i][1],
                     cases[i][2], (long long)w, (long long)h, cases[i][3], cases[i][4]);
    }
}

// int(round((size - n) / 2.0)) in Python: 58.5 -> 58, 59.5 -> 60, 0.5 -> 0, 1.5 -> 2.
static void test_center_crop_offset(void **state) {
    static const int cases[][3] = {{341, 224, 58}, {343, 224, 60}, {256, 224, 16}, {225, 224, 0},
                                   {227, 224, 2}, {224, 224, 0}, {331, 224, 54}, {309, 224, 42}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(center_crop_offset(cases[i][0], cases[i][1]), cases[i][2]);
}

// ---- RandomResizedCrop ------------------------------------------------------------------------

static const ResizedCrop imagenet = {.scale = {0.08, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};

static void test_resized_crop_ranges(void **state) {
    static const int sizes[][2] = {{500, 375}, {375, 500}, {224, 224}, {64, 48}, {32, 32}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int W = sizes[s][0], H = sizes[s][1];
        double lo_frac = 1, hi_frac = 0, lo_ratio = 10, hi_ratio = 0;
        int left = W, right = 0;
        for (uint64_t k = 0; k < 20000; k++) {
            const uint64_t key = rng_key(1, RNG_STREAM_AUGMENT, 0, k);
            const CropBox b = resized_crop_box(&imagenet, key, W, H);
            if (b.x < 0 || b.y < 0 || b.w < 1 || b.h < 1 || b.x + b.w > W || b.y + b.h > H)
                fail_msg("%dx%d, key %llu: box %d,%d %dx%d outside the image", W, H,
                         (unsigned long long)k, b.x, b.y, b.w, b.h);
            // Sides within half a pixel of a box whose area and ratio lie in the ranges.
            const double area = (double)W * H;
            if ((b.w + 0.5) * (b.h + 0.5) < 0.08 * area || (b.w - 0.5) * (b.h - 0.5) > area ||
                (b.w + 0.5) / (b.h - 0.5) < 3.0 / 4.0 || (b.w - 0.5) / (b.h + 0.5) > 4.0 / 3.0)
                fail_msg("%dx%d, key %llu: a %dx%d box is no crop of area fraction in [0.08, 1] "
                         "and aspect ratio in [3/4, 4/3]", W, H, (unsigned long long)k, b.w, b.h);
            const double frac = b.w * (double)b.h / area, ratio = (double)b.w / b.h;
            lo_frac = fmin(lo_frac, frac), hi_frac = fmax(hi_frac, frac);
            lo_ratio = fmin(lo_ratio, ratio), hi_ratio = fmax(hi_ratio, ratio);
            left = b.x < left ? b.x : left, right = b.x + b.w > right ? b.x + b.w : right;
            const CropBox again = resized_crop_box(&imagenet, key, W, H);
            assert_memory_equal(&b, &again, sizeof b);
        }
        print_message("%dx%d: area fractions %.3f to %.3f, aspect ratios %.3f to %.3f\n", W, H,
                      lo_frac, hi_frac, lo_ratio, hi_ratio);
        // The draws reach both ends of both ranges, and the boxes both sides of the image.
        assert_true(lo_frac < 0.1 && hi_frac > 0.95);
        assert_true(lo_ratio < 0.78 && hi_ratio > 1.28);
        assert_true(left == 0 && right == W);
    }
}

// An image whose aspect ratio lies outside the range mostly takes the fallback: the whole
// image narrowed (or shortened) to the nearest ratio, centred, as torchvision's.
static void test_resized_crop_fallback(void **state) {
    int fallbacks = 0;
    for (uint64_t k = 0; k < 2000; k++) {
        const CropBox wide = resized_crop_box(&imagenet, k, 1000, 10);
        const CropBox tall = resized_crop_box(&imagenet, k, 10, 1000);
        assert_true(wide.x + wide.w <= 1000 && wide.h <= 10 && tall.y + tall.h <= 1000 && tall.w <= 10);
        if (wide.w == 13 && wide.h == 10) {  // round(10 * 4 / 3)
            assert_int_equal(wide.x, (1000 - 13) / 2);
            assert_int_equal(wide.y, 0);
            fallbacks++;
        }
        if (tall.w == 10 && tall.h == 13) assert_int_equal(tall.y, (1000 - 13) / 2);
    }
    assert_true(fallbacks > 1900);
    // Fixed ranges give a fixed box: half the area of a square, square.
    const ResizedCrop half = {.scale = {0.5, 0.5}, .ratio = {1, 1}};
    for (uint64_t k = 0; k < 100; k++) {
        const CropBox b = resized_crop_box(&half, k, 100, 100);
        assert_int_equal(b.w, 71);  // round(sqrt(5000))
        assert_int_equal(b.h, 71);
    }
    // The smallest box any draw gives, for the memory plan: no draw below it.
    const int sizes[][2] = {{500, 375}, {1000, 10}, {10, 1000}, {3, 3}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const CropBox least = resized_crop_smallest(&imagenet, sizes[s][0], sizes[s][1]);
        for (uint64_t k = 0; k < 5000; k++) {
            const CropBox b = resized_crop_box(&imagenet, k, sizes[s][0], sizes[s][1]);
            assert_true(b.w >= least.w && b.h >= least.h);
        }
    }
}

// ---- ColorJitter ----------------------------------------------------------------------------

enum { JW = 7, JH = 5 };
static const float factors[] = {0, 0.3f, 0.5f, 0.77f, 1, 1.3f, 1.6f, 2.5f};
enum { NF = sizeof factors / sizeof *factors };

// A small image: every value 0..255 somewhere across the channels, colours and grays.
static void jitter_image(uint8_t *px, int C) {
    for (int i = 0; i < JW * JH * C; i++) px[i] = (uint8_t)((i * 73 + i / 3 * 29) % 256);
    if (C == 3) px[0] = px[1] = px[2] = 255, px[3] = px[4] = px[5] = 0;
}

static void test_jitter_torchvision(void **state) {
    for (int C = 1; C <= 3; C += 2) {
        uint8_t img[JW * JH * 3];
        jitter_image(img, C);
        const char *file = test_path(g_dir, C == 3 ? "jitter_rgb.png" : "jitter_gray.png");
        assert_true(stbi_write_png(file, JW, JH, C, img, JW * C));
        char args[256] = "";
        for (int f = 0; f < NF; f++)
            snprintf(args + strlen(args), sizeof args - strlen(args), " %g", factors[f]);
        const int rc = test_sh(g_dir, "/usr/bin/python3 '%s/tests/preprocess_reference.py' jitter '%s'%s",
                               g_root, file, args);
        if (rc == 3) skip();  // no torchvision here
        if (rc) fail_msg("preprocess_reference.py: %s", test_sh_output(g_dir));
        char ref_path[600];
        snprintf(ref_path, sizeof ref_path, "%s.jitter", file);
        size_t n;
        uint8_t *ref = test_read_file(ref_path, &n);
        const size_t one = (size_t)JW * JH * C;
        assert_int_equal(n, 3 * NF * one);
        void (*const adjust[3])(uint8_t *, int64_t, int, float) = {adjust_brightness, adjust_contrast,
                                                                  adjust_saturation};
        static const char *const names[3] = {"brightness", "contrast", "saturation"};
        for (int a = 0; a < 3; a++)
            for (int f = 0; f < NF; f++) {
                uint8_t out[JW * JH * 3];
                memcpy(out, img, one);
                adjust[a](out, JW * JH, C, factors[f]);
                const uint8_t *want = ref + ((size_t)a * NF + f) * one;
                for (size_t i = 0; i < one; i++)
                    if (out[i] != want[i])
                        fail_msg("%s %g of a %d-channel image: byte %zu is %d, torchvision %d",
                                 names[a], factors[f], C, i, out[i], want[i]);
            }
        free(ref);
    }
}

// color_jitter: the factors from their ranges (brightness 0.5 alone: [0.5, 1.5]), and the
// three adjustments in each of the six orders over enough keys.
static void test_color_jitter_draws(void **state) {
    uint8_t img[JW * JH * 3];
    jitter_image(img, 3);
    void (*const adjust[3])(uint8_t *, int64_t, int, float) = {adjust_brightness, adjust_contrast,
                                                              adjust_saturation};
    const float only_brightness[3] = {0.5f, 0, 0}, all[3] = {0.4f, 0.4f, 0.4f};
    int seen[3][3][3] = {{{0}}};
    for (uint64_t key = 0; key < 300; key++) {
        uint8_t out[sizeof img], want[sizeof img];
        memcpy(out, img, sizeof img);
        color_jitter(out, JW * JH, 3, only_brightness, key);
        const float fb = (float)(0.5 + draw_unit(key, AUG_JITTER));
        memcpy(want, img, sizeof img);
        adjust_brightness(want, JW * JH, 3, fb);
        assert_memory_equal(out, want, sizeof img);
        // The order that gave it, from its factors: one of the six.
        memcpy(out, img, sizeof img);
        color_jitter(out, JW * JH, 3, all, key);
        float factor[3];
        for (int k = 0; k < 3; k++) factor[k] = (float)(0.6 + 0.8 * draw_unit(key, AUG_JITTER + (uint64_t)k));
        int matched = 0;
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                const int c = 3 - a - b;
                if (a == b || c < 0 || c > 2 || c == a || c == b) continue;
                memcpy(want, img, sizeof img);
                adjust[a](want, JW * JH, 3, factor[a]);
                adjust[b](want, JW * JH, 3, factor[b]);
                adjust[c](want, JW * JH, 3, factor[c]);
                if (!memcmp(out, want, sizeof img)) seen[a][b][c]++, matched = 1;
            }
        assert_true(matched);
    }
    int orders = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) orders += seen[a][b][c] > 0;
    assert_int_equal(orders, 6);
    // No amounts: no change.
    uint8_t out[sizeof img];
    memcpy(out, img, sizeof img);
    color_jitter(out, JW * JH, 3, (const float[3]){0, 0, 0}, 7);
    assert_memory_equal(out, img, sizeof img);
}

static int suite_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_transform"); }
static int suite_teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    test_find_root(g_root, sizeof g_root, argv[0], "tests/preprocess_reference.py");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resize_shorter),
        cmocka_unit_test(test_center_crop_offset),
        cmocka_unit_test(test_resized_crop_ranges),
        cmocka_unit_test(test_resized_crop_fallback),
        cmocka_unit_test(test_jitter_torchvision),
        cmocka_unit_test(test_color_jitter_draws),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
