// transform.c: torchvision's transforms on bytes (transform.h).
#include "transform.h"

#include <math.h>

#include "../nn/rng.h"

__extension__ typedef unsigned __int128 u128;

// ---- draws ---------------------------------------------------------------------------------

uint64_t draw_below(uint64_t key, uint64_t i, uint64_t stride, uint64_t range) {
    uint64_t counter = i;
    u128 m = (u128)rng_u64(key, counter) * range;
    uint64_t low = (uint64_t)m;
    if (low < range) {
        const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
        while (low < threshold) {
            counter += stride;
            m = (u128)rng_u64(key, counter) * range;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double draw_unit(uint64_t key, uint64_t counter) {
    return (double)(rng_u64(key, counter) >> 11) * (1.0 / 9007199254740992.0);
}

// ---- Resize and CenterCrop ------------------------------------------------------------------

void resize_shorter(int w, int h, int size, int64_t *rw, int64_t *rh) {
    const int64_t shorter = w <= h ? w : h, longer = w <= h ? h : w;
    // Python's size * longer / shorter: an exact product, one correctly rounded division.
    const int64_t other = (int64_t)((double)(size * longer) / (double)shorter);
    *rw = w <= h ? size : other;
    *rh = w <= h ? other : size;
}

int center_crop_offset(int size, int n) {
    const int margin = size - n, half = margin / 2;
    return margin % 2 && half % 2 ? half + 1 : half;  // x.5 goes to the even neighbour
}

// ---- RandomResizedCrop ------------------------------------------------------------------------

// The central crop after 10 failed attempts: the whole image, narrowed (or shortened) to the
// nearest ratio of the range, at least a pixel (torchvision's would be empty for a ratio
// beyond twice the image's side).
static CropBox fallback_box(const ResizedCrop *rc, int w, int h) {
    CropBox b = {.w = w, .h = h};
    if ((double)w / h < rc->ratio[0]) b.h = (int)rint(w / rc->ratio[0]);
    else if ((double)w / h > rc->ratio[1]) b.w = (int)rint(h * rc->ratio[1]);
    if (b.w < 1) b.w = 1;
    if (b.h < 1) b.h = 1;
    b.x = (w - b.w) / 2, b.y = (h - b.h) / 2;
    return b;
}

CropBox resized_crop_box(const ResizedCrop *rc, uint64_t key, int w, int h) {
    const double area = (double)w * h, lo = log(rc->ratio[0]), hi = log(rc->ratio[1]);
    for (int a = 0; a < AUG_RRC_ATTEMPTS; a++) {
        const uint64_t c = AUG_RRC + 4 * (uint64_t)a;
        const double target = area * (rc->scale[0] + (rc->scale[1] - rc->scale[0]) * draw_unit(key, c));
        const double ratio = exp(lo + (hi - lo) * draw_unit(key, c + 1));
        const double bw = rint(sqrt(target * ratio)), bh = rint(sqrt(target / ratio));
        if (bw > 0 && bw <= w && bh > 0 && bh <= h)
            return (CropBox){.x = (int)draw_below(key, c + 3, AUG_COUNTERS, (uint64_t)(w - bw + 1)),
                             .y = (int)draw_below(key, c + 2, AUG_COUNTERS, (uint64_t)(h - bh + 1)),
                             .w = (int)bw, .h = (int)bh};
    }
    return fallback_box(rc, w, h);
}

CropBox resized_crop_smallest(const ResizedCrop *rc, int w, int h) {
    // An attempt's sides grow with its area and (width) its ratio or (height) its inverse.
    const double area = (double)w * h * rc->scale[0];
    const int aw = (int)rint(sqrt(area * rc->ratio[0])), ah = (int)rint(sqrt(area / rc->ratio[1]));
    const CropBox f = fallback_box(rc, w, h);
    const int bw = aw < f.w ? aw : f.w, bh = ah < f.h ? ah : f.h;
    return (CropBox){.w = bw > 1 ? bw : 1, .h = bh > 1 ? bh : 1};
}

// ---- ColorJitter ----------------------------------------------------------------------------

// PIL's Image.blend(degenerate, image, factor) of one value: its single-precision arithmetic,
// clipped, rounded down.
static uint8_t blend(int degenerate, int v, float factor) {
    const float t = (float)degenerate + factor * (float)(v - degenerate);
    return t <= 0.0f ? 0 : t >= 255.0f ? 255 : (uint8_t)t;
}

// PIL's convert("L") of one RGB pixel.
static int gray(const uint8_t *p) { return (p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16; }

void adjust_brightness(uint8_t *px, int64_t n, int C, float factor) {
    for (int64_t i = 0; i < n * C; i++) px[i] = blend(0, px[i], factor);
}

void adjust_contrast(uint8_t *px, int64_t n, int C, float factor) {
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) sum += C == 3 ? gray(px + 3 * i) : px[i];
    const int mean = n ? (int)((double)sum / (double)n + 0.5) : 0;  // ImageStat's, rounded
    for (int64_t i = 0; i < n * C; i++) px[i] = blend(mean, px[i], factor);
}

void adjust_saturation(uint8_t *px, int64_t n, int C, float factor) {
    if (C != 3) return;  // a gray image is its own gray
    for (int64_t i = 0; i < n; i++) {
        uint8_t *p = px + 3 * i;
        const int g = gray(p);
        for (int c = 0; c < 3; c++) p[c] = blend(g, p[c], factor);
    }
}

void color_jitter(uint8_t *px, int64_t n, int C, const float jitter[3], uint64_t key) {
    void (*const adjust[3])(uint8_t *, int64_t, int, float) = {adjust_brightness, adjust_contrast,
                                                              adjust_saturation};
    float factor[3];
    for (int k = 0; k < 3; k++) {
        const double lo = jitter[k] < 1 ? 1 - jitter[k] : 0, hi = 1 + (double)jitter[k];
        factor[k] = (float)(lo + (hi - lo) * draw_unit(key, AUG_JITTER + (uint64_t)k));
    }
    int order[3] = {0, 1, 2};  // Fisher-Yates from the back
    for (int i = 2; i > 0; i--) {
        const int j = (int)draw_below(key, AUG_JITTER + 3 + (uint64_t)(2 - i), AUG_COUNTERS, (uint64_t)i + 1);
        const int t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int k = 0; k < 3; k++)
        if (jitter[order[k]] > 0) adjust[order[k]](px, n, C, factor[order[k]]);
}
