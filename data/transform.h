// transform.h: torchvision's image transforms as the loader applies them to bytes: the size
// of Resize(size) and the offsets of CenterCrop (evaluation), the box of RandomResizedCrop
// and ColorJitter's brightness, contrast and saturation (training), with the draws they
// take from the counter-based RNG (DESIGN.md decision 3).
//
// Each random transform is a pure function of a sample's key, rng_key(seed,
// RNG_STREAM_AUGMENT, epoch, sample index), and the counters below: the same crops and
// colours for any number of workers, on any machine.
#ifndef DATA_TRANSFORM_H
#define DATA_TRANSFORM_H

#include <stdint.h>

// ---- draws from the counter-based RNG -----------------------------------------------------

// The counters of a sample's key.
enum {
    AUG_FLIP = 0,          // the flip bit
    AUG_PAD_X = 1,         // crop_pad: the crop's offsets
    AUG_PAD_Y = 2,
    AUG_JITTER = 3,        // ColorJitter: its 3 factors, then 2 draws of their order
    AUG_RRC = 8,           // RandomResizedCrop: 4 counters per attempt, 10 attempts
    AUG_RRC_ATTEMPTS = 10,
    AUG_COUNTERS = 64,     // draw_below's redraws step by this: beyond every counter above
};

// A uniform draw in [0, range), range >= 1, without bias: Lemire's multiply-shift with
// rejection. The first draw uses counter i; the rare redraws use i + k * stride, which no
// other counter of the key may use (stride beyond them all), so the result stays a pure
// function of (key, i).
uint64_t draw_below(uint64_t key, uint64_t i, uint64_t stride, uint64_t range);

// Uniform in [0, 1) with 53 bits.
double draw_unit(uint64_t key, uint64_t counter);

// ---- evaluation: Resize(size) and CenterCrop(n) --------------------------------------------

// torchvision's Resize(size) of a w x h image: the shorter side becomes `size`, the longer
// int(size * longer / shorter) (truncated, as torchvision computes it: 500 x 375 to 256
// gives 341 x 256). 64 bits: an image of 1 x 100,000,000 pixels asks for more than an int.
void resize_shorter(int w, int h, int size, int64_t *rw, int64_t *rh);

// CenterCrop's offset of a crop of n pixels from `size` (n <= size): int(round((size - n) /
// 2.0)), with Python's round, which takes halves to even (a margin of 117 gives 58, 115 too).
int center_crop_offset(int size, int n);

// ---- training: RandomResizedCrop ------------------------------------------------------------

// The ranges of torchvision's RandomResizedCrop(size, scale, ratio): the crop's area as a
// fraction of the image's, and its aspect ratio width / height (drawn log-uniformly).
// torchvision's defaults are scale (0.08, 1) and ratio (3/4, 4/3).
typedef struct ResizedCrop {
    double scale[2];  // 0 < scale[0] <= scale[1] <= 1
    double ratio[2];  // 0 < ratio[0] <= ratio[1]
} ResizedCrop;

// A box of an image's pixels: columns [x, x + w), rows [y, y + h).
typedef struct CropBox {
    int x, y, w, h;
} CropBox;

// RandomResizedCrop.get_params on a w x h image: up to 10 attempts, each an area fraction
// uniform in `scale` and a ratio log-uniform in `ratio`, sides rounded to whole pixels
// (halves to even, as Python's round); the first that fits the image is placed uniformly
// in it. Otherwise the central crop of the whole image, narrowed (or shortened) to the
// nearest ratio of the range. Draws counters AUG_RRC.. of key.
CropBox resized_crop_box(const ResizedCrop *rc, uint64_t key, int w, int h);

// The narrowest width and the lowest height (w, h; x = y = 0) of any box resized_crop_box
// gives on a w x h image, for the memory plan: the decode a crop needs at most.
CropBox resized_crop_smallest(const ResizedCrop *rc, int w, int h);

// ---- training: ColorJitter ------------------------------------------------------------------

// torchvision's adjust_brightness, adjust_contrast and adjust_saturation on a PIL image of
// n pixels of C channels (1: L, 3: RGB), in place: PIL's ImageEnhance, each a blend
// degenerate + factor * (pixel - degenerate) in single precision, clipped to [0, 255] and
// rounded down (Image.blend). Brightness blends with black; contrast with the mean of the
// image's gray (PIL's L: (19595 R + 38470 G + 7471 B + 2^15) >> 16), rounded to a byte;
// saturation with each pixel's gray (C = 1: the image itself, unchanged).
void adjust_brightness(uint8_t *px, int64_t n, int C, float factor);
void adjust_contrast(uint8_t *px, int64_t n, int C, float factor);
void adjust_saturation(uint8_t *px, int64_t n, int C, float factor);

// torchvision's ColorJitter(brightness, contrast, saturation) = jitter[0..2]: for each
// amount j > 0 a factor uniform in [max(0, 1 - j), 1 + j], the three adjustments in a
// random order (as ColorJitter's randperm), from counters AUG_JITTER.. of key.
void color_jitter(uint8_t *px, int64_t n, int C, const float jitter[3], uint64_t key);

#endif
