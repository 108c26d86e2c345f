// image.c: one image file into the network's input bytes (H, W, C), as a folder data set
// and --predict read it.
//
// The file is read whole; its header is checked against its size (PNM, BMP: a header
// that declares more pixels than the file holds is a truncated or forged file, not an
// image to fill with zeros); JPEGs are decoded by libjpeg-turbo at the smallest DCT scale
// (M/8) that still covers the target size, any warning of the library (premature end,
// corrupt data) making the file bad; the other formats by stb_image. The pixels are
// converted to the channels asked for and resized by the project's triangle filter
// (image_resize).
#include "dataset.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <jpeglib.h>
#include <stb/stb_image.h>

#include "jpeg_eighth.h"

#define IMAGE_MAX_PIXELS (1LL << 27)      // decoded: larger images are bad files (134 MP)
#define IMAGE_MAX_FILE_BYTES (1LL << 30)  // a larger file is not an image to train on
// Pixels a file byte can decode to, at most: a 1-bit PNG at deflate's limit is about 8,300
// (the formats read: PNG, BMP, GIF, TGA, PNM).
#define IMAGE_MAX_PIXELS_PER_BYTE 16384

static const char *const image_exts[] = {"png", "jpg", "jpeg", "bmp", "gif", "tga", "pgm", "ppm", "pnm"};

// Formats stb_image would decode but the loader does not read, by their first bytes (the
// tests stb_image makes): Debian's stb_image crashes on a damaged PIC (CVE-2023-43898) and
// loops forever on an HDR run of length 0 (CVE-2021-42715); PSD is Photoshop's layers,
// not a photo to train on. NULL, or the format's name.
static const char *refused_format(const uint8_t *buf, size_t size) {
    if (size >= 4 && !memcmp(buf, "8BPS", 4)) return "PSD";
    if (size >= 4 && !memcmp(buf, "\x53\x80\xf6\x34", 4)) return "Softimage PIC";
    if ((size >= 6 && !memcmp(buf, "#?RGBE", 6)) || (size >= 10 && !memcmp(buf, "#?RADIANCE", 10)))
        return "Radiance HDR";
    return NULL;
}

bool image_name_has_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return false;
    for (size_t i = 0; i < sizeof image_exts / sizeof image_exts[0]; i++)
        if (strcasecmp(dot + 1, image_exts[i]) == 0) return true;
    return false;
}

// ---- resizing ---------------------------------------------------------------------------

// src (h, w, C; rows `stride` bytes apart) averaged over boxes of kx x ky pixels into dst
// (ceil(h / ky), ceil(w / kx), C), rounding to nearest; the last box of a row or column holds
// what is left.
static void box_reduce(const uint8_t *src, int w, int h, size_t stride, int C, int kx, int ky,
                       uint8_t *dst) {
    const int rw = (w + kx - 1) / kx, rh = (h + ky - 1) / ky;
    for (int oy = 0; oy < rh; oy++) {
        const int y0 = oy * ky, y1 = y0 + ky < h ? y0 + ky : h;
        for (int ox = 0; ox < rw; ox++) {
            const int x0 = ox * kx, x1 = x0 + kx < w ? x0 + kx : w;
            const uint32_t n = (uint32_t)((y1 - y0) * (x1 - x0));
            for (int c = 0; c < C; c++) {
                uint64_t sum = 0;  // a box may hold more than 2^24 pixels of 255
                for (int y = y0; y < y1; y++)
                    for (int x = x0; x < x1; x++) sum += src[(size_t)y * stride + (size_t)x * C + c];
                dst[((size_t)oy * rw + ox) * C + c] = (uint8_t)((sum + n / 2) / n);
            }
        }
    }
}

// One axis of a resize: the picture [x0, x0 + extent) of the input's pixels (a box of an
// image, at the scale it was decoded at) is resized to `full` pixels, of which the outputs
// [first, first + n) are made: a centre crop's, or all of them.
typedef struct Span {
    double x0, extent;
    int full, first;
} Span;

// One axis of the triangle filter: output pixel o is centred at x0 + (first + o + 0.5) /
// scale in input coordinates, scale = full / extent; its weights are 1 - |d| / r over the
// input pixel centres at distance d, r = 1 when enlarging (bilinear) and 1 / scale when
// shrinking (every input pixel counts), on pixels clamped to the input's edges, normalised
// to sum 1: stb_image_resize's and PIL's bilinear filter.
typedef struct Taps {
    int n;          // taps per output pixel
    int *index;     // (n_out * n) input pixels
    float *weight;  // (n_out * n)
} Taps;

static void taps_free(Taps *t) {
    free(t->index);
    free(t->weight);
}

// The taps of each output pixel start at its first nonzero weight; t->n covers the widest
// span, shorter ones end in zero weights (adding 0 leaves a float sum as it is).
static int taps_make(Taps *t, int n_in, const Span *s, int n_out) {
    const double scale = s->full / s->extent, r = scale < 1 ? 1 / scale : 1;
    const int span = (int)ceil(2 * r) + 2;
    t->index = malloc((size_t)n_out * span * sizeof *t->index);
    t->weight = malloc((size_t)n_out * span * sizeof *t->weight);
    if (!t->index || !t->weight) {
        taps_free(t);
        return -1;
    }
    t->n = 1;
    for (int o = 0; o < n_out; o++) {
        const double c = s->x0 + (s->first + o + 0.5) / scale;
        int first = (int)floor(c - r - 0.5), lo = span, hi = -1;
        double sum = 0, w[span];
        for (int k = 0; k < span; k++) {
            const double d = fabs(first + k + 0.5 - c) / r;
            w[k] = d < 1 ? 1 - d : 0;
            sum += w[k];
            if (w[k] > 0) lo = lo < k ? lo : k, hi = k;
        }
        first += lo;
        if (hi - lo + 1 > t->n) t->n = hi - lo + 1;
        for (int k = 0; k < span; k++) {
            const int i = first + k;
            t->index[o * span + k] = i < 0 ? 0 : i >= n_in ? n_in - 1 : i;
            t->weight[o * span + k] = lo + k <= hi ? (float)(w[lo + k] / sum) : 0.0f;
        }
    }
    for (int o = 1; o < n_out && t->n < span; o++) {  // pack the rows to t->n taps each
        memmove(t->index + (size_t)o * t->n, t->index + (size_t)o * span, (size_t)t->n * sizeof *t->index);
        memmove(t->weight + (size_t)o * t->n, t->weight + (size_t)o * span, (size_t)t->n * sizeof *t->weight);
    }
    return 0;
}

// One row of (w, C) floats filtered along x into (W, C).
static inline __attribute__((always_inline)) void filter_row(const Taps *t, const float *in, float *out, int W, int C) {
    for (int o = 0; o < W; o++) {
        const int *index = t->index + o * t->n;
        const float *weight = t->weight + o * t->n;
        for (int c = 0; c < C; c++) {
            float v = 0;
            for (int k = 0; k < t->n; k++) v += weight[k] * in[index[k] * C + c];
            out[o * C + c] = v;
        }
    }
}

// src (h, w, C; rows `stride` bytes apart) resized along the spans sx and sy to dst (H, W,
// C) with the triangle filter: rows first into floats, then columns, rounded to bytes. Each
// output value sums its taps in order. An output row's taps are consecutive input rows,
// moving down with the output row: the filtered rows are kept in a ring of ty.n (row y in
// slot y % ty.n), each filtered once, when first needed.
static int triangle_resize(const uint8_t *src, int w, int h, size_t stride, const Span *sx,
                           const Span *sy, int C, uint8_t *dst, int W, int H) {
    Taps tx = {0}, ty = {0};
    const size_t row = (size_t)W * C;
    float *rows = NULL;
    int rc = -1;
    if (taps_make(&tx, w, sx, W) || taps_make(&ty, h, sy, H) ||
        !(rows = malloc(((size_t)ty.n * row + row + (size_t)w * C) * sizeof *rows)))
        goto done;
    float *acc = rows + (size_t)ty.n * row, *in = acc + row;  // (W, C) and (w, C)
    int next = ty.index[0];  // the next input row to filter: rows next - ty.n .. next - 1 are in the ring
    for (int o = 0; o < H; o++) {
        for (; next <= ty.index[o * ty.n + ty.n - 1]; next++) {
            float *r = rows + (size_t)(next % ty.n) * row;
            for (int x = 0; x < w * C; x++) in[x] = src[(size_t)next * stride + x];
            if (C == 3) filter_row(&tx, in, r, W, 3);  // the channel loop unrolled
            else filter_row(&tx, in, r, W, C);
        }
        for (size_t x = 0; x < row; x++) acc[x] = 0;
        for (int k = 0; k < ty.n; k++) {
            const float wk = ty.weight[o * ty.n + k], *r = rows + (size_t)(ty.index[o * ty.n + k] % ty.n) * row;
            for (size_t x = 0; x < row; x++) acc[x] += wk * r[x];
        }
        for (size_t x = 0; x < row; x++) {
            const float v = acc[x];
            dst[(size_t)o * row + x] = (uint8_t)(v <= 0 ? 0 : v >= 255 ? 255 : (int)(v + 0.5f));
        }
    }
    rc = 0;
done:
    free(rows);
    taps_free(&tx);
    taps_free(&ty);
    return rc;
}

// Boxes of k pixels first when a span shrinks by 4 or more: k = floor(factor / 2).
static int reduce_factor(const Span *s) {
    const int k = (int)(s->extent / s->full / 2);
    return k > 1 ? k : 1;
}

// Whether the spans take whole pixels at scale 1 (an image at the size asked for, or its
// centre crop): a copy.
static bool spans_copy(const Span *sx, const Span *sy) {
    return sx->x0 == floor(sx->x0) && sy->x0 == floor(sy->x0) && sx->extent == sx->full &&
           sy->extent == sy->full;
}

// src (h, w, C; rows `stride` bytes apart) resized along the spans to dst (H, W, C) with the
// triangle filter (bilinear when enlarging, widened to cover every input pixel when
// shrinking). Only the pixels the picture touches are read, its edge pixels clamped (PIL
// crops a box before it resizes it). A large reduction is done in two steps, like PIL's
// reducing_gap: first averaging boxes of k x k pixels, k = floor(factor / 2) in each
// direction, then the triangle filter over the remaining factor of 2 to 4, on the region
// the boxes cover (a last, partial box is the part of a pixel it holds, as PIL's box
// argument). The result differs from one triangle pass by a byte here and there, and costs a
// fraction. (stb_image_resize's version of this filter aborts on some sizes, 13 x 9 to 11 x
// 11 among them: stb issue 1449.)
static int resize_spans(const uint8_t *src, int w, int h, size_t stride, int C, Span sx, Span sy,
                        uint8_t *dst, int W, int H) {
    const int x0 = (int)floor(sx.x0), y0 = (int)floor(sy.x0);
    const int x1 = (int)ceil(sx.x0 + sx.extent), y1 = (int)ceil(sy.x0 + sy.extent);
    src += (size_t)y0 * stride + (size_t)x0 * C;
    w = (x1 < w ? x1 : w) - x0, h = (y1 < h ? y1 : h) - y0;
    sx.x0 -= x0, sy.x0 -= y0;
    if (spans_copy(&sx, &sy)) {
        for (int y = 0; y < H; y++)
            memcpy(dst + (size_t)y * W * C, src + (size_t)(sy.first + y) * stride + (size_t)sx.first * C,
                   (size_t)W * C);
        return 0;
    }
    const int kx = reduce_factor(&sx), ky = reduce_factor(&sy);
    uint8_t *tmp = NULL;
    if (kx > 1 || ky > 1) {
        const int rw = (w + kx - 1) / kx, rh = (h + ky - 1) / ky;
        if (!(tmp = malloc((size_t)rw * (size_t)rh * (size_t)C))) return -1;
        box_reduce(src, w, h, stride, C, kx, ky, tmp);
        sx.x0 /= kx, sx.extent /= kx, sy.x0 /= ky, sy.extent /= ky;
        src = tmp, stride = (size_t)rw * C;
        w = rw, h = rh;
    }
    const int rc = triangle_resize(src, w, h, stride, &sx, &sy, C, dst, W, H);
    free(tmp);
    return rc;
}

int image_resize(const uint8_t *src, int w, int h, size_t stride, int C, uint8_t *dst, int W, int H) {
    return resize_spans(src, w, h, stride, C, (Span){.extent = w, .full = W},
                        (Span){.extent = h, .full = H}, dst, W, H);
}

// ---- headers checked against the file's size ----------------------------------------------

// The next decimal number of a PNM header at *p (whitespace and # comments skipped), or -1.
static int64_t pnm_number(const uint8_t *buf, size_t size, size_t *p) {
    for (;;) {
        while (*p < size && (buf[*p] == ' ' || (buf[*p] >= '\t' && buf[*p] <= '\r'))) (*p)++;
        if (*p < size && buf[*p] == '#') {
            while (*p < size && buf[*p] != '\n' && buf[*p] != '\r') (*p)++;
            continue;
        }
        break;
    }
    int64_t v = -1;
    while (*p < size && buf[*p] >= '0' && buf[*p] <= '9' && v < (1LL << 40))
        v = (v < 0 ? 0 : v * 10) + (buf[(*p)++] - '0');
    return v;
}

static uint8_t luma(int r, int g, int b) { return (uint8_t)((r * 77 + g * 150 + b * 29) >> 8); }

static bool is_pnm(const uint8_t *buf, size_t size) {
    return size >= 2 && buf[0] == 'P' && (buf[1] == '5' || buf[1] == '6');
}

// A binary PNM's header (P5 gray, P6 RGB): width, height, maxval and where the samples
// start (after one whitespace byte). Any of them -1 when missing.
static void pnm_header(const uint8_t *buf, size_t size, int64_t *w, int64_t *h, int64_t *maxval, size_t *data) {
    size_t p = 2;
    *w = pnm_number(buf, size, &p), *h = pnm_number(buf, size, &p), *maxval = pnm_number(buf, size, &p);
    *data = p + 1;
}

// A binary PNM whose header check_declared_size has checked, to C channels, malloc'd (NULL
// and errno ENOMEM when out of memory): 8- or 16-bit big-endian samples scaled by
// 255 / maxval, rounded; gray replicated, or RGB to luma. (stb_image 2.27 reads 16-bit
// samples in the wrong byte order, then past its buffer when it converts their channels.)
static uint8_t *pnm_decode(const uint8_t *buf, size_t size, int C) {
    int64_t w, h, maxval;
    size_t p;
    pnm_header(buf, size, &w, &h, &maxval, &p);
    const int n = buf[1] == '6' ? 3 : 1, bytes = maxval > 255 ? 2 : 1;
    const size_t count = (size_t)w * (size_t)h;
    uint8_t *px = malloc(count * (size_t)C);
    if (!px) {
        errno = ENOMEM;
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        int v[3];
        for (int k = 0; k < n; k++) {
            const uint8_t *q = buf + p + (i * n + k) * bytes;
            const int64_t x = bytes == 2 ? q[0] << 8 | q[1] : q[0];
            v[k] = (int)((x > maxval ? maxval : x) * 255 + maxval / 2) / (int)maxval;
        }
        if (C == 1) px[i] = n == 3 ? luma(v[0], v[1], v[2]) : (uint8_t)v[0];
        else for (int k = 0; k < 3; k++) px[3 * i + k] = (uint8_t)v[n == 3 ? k : 0];
    }
    return px;
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

// Binary PNM (P5, P6) and uncompressed BMP: the pixel data the header declares must be in
// the file; PNG: every chunk up to IEND (stb_image allocates a chunk's declared length
// before reading it: 2 GB for a forged IDAT of 28 bytes). Returns 0, or DATASET_BAD with err
// (other formats pass: their decoders fail on missing data, or it is not knowable from
// the header).
static int check_declared_size(const char *path, const uint8_t *buf, size_t size, Error *err) {
    if (size >= 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8)) {
        for (size_t p = 8; p + 8 <= size;) {
            const uint32_t len = be32(buf + p);
            if (len > size - p - 8 || size - p - 8 - len < 4) {
                err_set(err, "%s: a PNG chunk at byte %zu declares %u bytes but the file has %zu "
                             "after it: truncated or damaged", path, p, len, size - p - 8);
                return DATASET_BAD;
            }
            if (!memcmp(buf + p + 4, "IEND", 4)) break;
            p += 12 + (size_t)len;
        }
    } else if (is_pnm(buf, size)) {
        int64_t w, h, maxval;
        size_t p;
        pnm_header(buf, size, &w, &h, &maxval, &p);
        if (w < 1 || h < 1 || maxval < 1 || maxval > 65535) {
            err_set(err, "%s: a PNM header with width %lld, height %lld and maxval %lld: not an image",
                    path, (long long)w, (long long)h, (long long)maxval);
            return DATASET_BAD;
        }
        const uint64_t need = (uint64_t)w * (uint64_t)h * (buf[1] == '6' ? 3u : 1u) * (maxval > 255 ? 2u : 1u);
        if (p > size || need > size - p) {
            err_set(err, "%s: the PNM header declares %lld x %lld pixels (%llu bytes) but the file "
                         "holds %zu bytes after it: truncated", path, (long long)w, (long long)h,
                    (unsigned long long)need, p < size ? size - p : 0);
            return DATASET_BAD;
        }
    } else if (size >= 2 && buf[0] == 'B' && buf[1] == 'M') {
        if (size < 30) {
            err_set(err, "%s: a BMP of %zu bytes, shorter than its header: truncated", path, size);
            return DATASET_BAD;
        }
        const uint32_t off = le32(buf + 10), dib = le32(buf + 14);
        int64_t w, h;
        uint32_t bpp, compression = 0;
        if (dib == 12) {
            w = le16(buf + 18), h = le16(buf + 20), bpp = le16(buf + 24);
        } else {
            if (size < 34) {
                err_set(err, "%s: a BMP of %zu bytes, shorter than its header: truncated", path, size);
                return DATASET_BAD;
            }
            w = (int32_t)le32(buf + 18), h = (int32_t)le32(buf + 22), bpp = le16(buf + 28);
            compression = le32(buf + 30);
        }
        if (h < 0) h = -h;
        if (w < 1 || h < 1) {
            err_set(err, "%s: a BMP header with width %lld and height %lld: not an image", path,
                    (long long)w, (long long)h);
            return DATASET_BAD;
        }
        if (compression == 0 || compression == 3 || compression == 6) {  // uncompressed rows
            const uint64_t need = ((uint64_t)w * bpp + 31) / 32 * 4 * (uint64_t)h;
            if (off > size || need > size - off) {
                err_set(err, "%s: the BMP header declares %lld x %lld pixels at %u bits (%llu bytes "
                             "from byte %u) but the file has %zu bytes: truncated", path,
                        (long long)w, (long long)h, bpp, (unsigned long long)need, off, size);
                return DATASET_BAD;
            }
        }
    }
    return 0;
}

// ---- where the sample lies in the image ---------------------------------------------------

#define IMAGE_MAX_RESIZED (1 << 24)  // resize = shorter: a longer side beyond is a bad file

Shape image_fit_shape(const ImageFit *fit) {
    const int crop = fit->center_crop;
    return (Shape){.c = fit->channels, .h = crop ? crop : fit->height, .w = crop ? crop : fit->width};
}

int image_fit_check(const ImageFit *fit, Error *err) {
    const int crop = fit->center_crop;
    if (fit->channels != 1 && fit->channels != 3)
        return err_set(err, "channels = %d: images are converted to 1 (gray) or 3 (RGB) channels",
                       fit->channels);
    if (fit->resize == RESIZE_SHORTER) {
        if (fit->short_side < 1 || fit->short_side > INPUT_MAX_SIDE || crop < 1 || crop > fit->short_side)
            return err_set(err, "short_side = %d, center_crop = %d: resize = shorter takes the "
                           "shorter side to short_side (1 to %d) and the centre crop, at most "
                           "short_side, as the sample", fit->short_side, crop, INPUT_MAX_SIDE);
        return 0;
    }
    if (fit->resize != RESIZE_STRETCH)
        return err_set(err, "resize mode %d: stretch or shorter", (int)fit->resize);
    if (fit->width < 1 || fit->height < 1 || fit->width > INPUT_MAX_SIDE || fit->height > INPUT_MAX_SIDE)
        return err_set(err, "width = %d, height = %d: an image folder needs the size its images are "
                       "resized to, 1 to %d each (width and height in [data])", fit->width,
                       fit->height, INPUT_MAX_SIDE);
    if (crop < 0 || crop > fit->width || crop > fit->height)
        return err_set(err, "center_crop = %d: the centre crop of the %d x %d resized image must "
                       "fit in it", crop, fit->width, fit->height);
    return 0;
}

// Where a sample lies in an image of w0 x h0 pixels: the box [x, x + bw) x [y, y + bh) of
// its pixels is resized to rw x rh, and the sample is the window of that at (ox, oy).
typedef struct Placement {
    int x, y, bw, bh;
    int64_t rw, rh;
    int ox, oy;
} Placement;

// The placement of image_load (crop NULL: Resize, then CenterCrop) or image_load_crop (the
// crop's box, resized to the sample). 0, or DATASET_BAD for an image that resize = shorter
// would make longer than IMAGE_MAX_RESIZED.
static int place(const char *path, const ImageFit *fit, const ResizedCrop *crop, uint64_t key,
                 int w0, int h0, Placement *p, Error *err) {
    const Shape s = image_fit_shape(fit);
    if (crop) {
        const CropBox b = resized_crop_box(crop, key, w0, h0);
        *p = (Placement){.x = b.x, .y = b.y, .bw = b.w, .bh = b.h, .rw = s.w, .rh = s.h};
        return 0;
    }
    *p = (Placement){.bw = w0, .bh = h0, .rw = fit->width, .rh = fit->height};
    if (fit->resize == RESIZE_SHORTER) {
        resize_shorter(w0, h0, fit->short_side, &p->rw, &p->rh);
        if (p->rw > IMAGE_MAX_RESIZED || p->rh > IMAGE_MAX_RESIZED) {
            err_set(err, "%s: %d x %d pixels would be %lld x %lld with its shorter side at %d "
                    "(resize = shorter): too elongated", path, w0, h0, (long long)p->rw,
                    (long long)p->rh, fit->short_side);
            return DATASET_BAD;
        }
    }
    if (fit->center_crop)
        p->ox = center_crop_offset((int)p->rw, s.w), p->oy = center_crop_offset((int)p->rh, s.h);
    return 0;
}

// The smallest JPEG DCT scale M/8 (M = 1..8) at which the box still has rw x rh pixels (full
// size when the image is smaller): libjpeg-turbo's output size, ceil(side * M / 8).
static int dct_scale(const Placement *p) {
    int M = 1;
    while (M < 8 && (((int64_t)p->bw * M + 7) / 8 < p->rw || ((int64_t)p->bh * M + 7) / 8 < p->rh)) M++;
    return M;
}

// The spans of resize_spans for a placement in an image decoded at scale M/8: a pixel of the
// decode covers 8 / M of the image's (the last one part of it).
static void place_spans(const Placement *p, int M, Span *sx, Span *sy) {
    const double f = M / 8.0;
    *sx = (Span){.x0 = p->x * f, .extent = p->bw * f, .full = (int)p->rw, .first = p->ox};
    *sy = (Span){.x0 = p->y * f, .extent = p->bh * f, .full = (int)p->rh, .first = p->oy};
}

// ---- JPEG: libjpeg-turbo at a DCT scale ------------------------------------------------

typedef struct JpegError {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} JpegError;

// Errors and warnings alike end the decode: a warning is corrupt or missing data.
static void jpeg_fail(j_common_ptr cinfo) {
    JpegError *e = (JpegError *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jump, 1);
}

static void jpeg_message(j_common_ptr cinfo, int level) {
    if (level < 0) jpeg_fail(cinfo);  // a warning; trace messages (level >= 0) are ignored
}

// Decodes the JPEG in buf to fit->channels (1 or 3) at the smallest scale M/8 at which the
// sample's placement *p in it still has its pixels (dct_scale), into *px (malloc'd, *w x *h).
// Grayscale output of a colour JPEG is its luma channel Y; CMYK (Adobe's inverted or
// plain) is converted to RGB as K times each of C, M, Y. Every buffer is sized from what
// the decoder says it writes (output_components), never from C alone: the decoder's rows
// go straight into *px only when it writes C bytes a pixel.
static int jpeg_load(const char *path, const uint8_t *buf, size_t size, const ImageFit *fit,
                     const ResizedCrop *crop, uint64_t key, Placement *p, int *M, uint8_t **px,
                     int *w, int *h, Error *err) {
    const int C = fit->channels;
    struct jpeg_decompress_struct cinfo;
    JpegError e = {0};
    uint8_t *volatile out = NULL, *volatile row = NULL;
    cinfo.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpeg_fail;
    e.mgr.emit_message = jpeg_message;
    *px = NULL;
    if (setjmp(e.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(out);
        free(row);
        err_set(err, "%s: not a readable JPEG (libjpeg-turbo: %s)", path, e.msg);
        return DATASET_BAD;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, buf, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : C == 1 ? JCS_GRAYSCALE : JCS_RGB;
    const int placed = place(path, fit, crop, key, (int)cinfo.image_width, (int)cinfo.image_height, p, err);
    if (placed) {
        jpeg_destroy_decompress(&cinfo);
        return placed;
    }
    *M = dct_scale(p);
    cinfo.scale_num = (unsigned)*M, cinfo.scale_denom = 8;
    jpeg_calc_output_dimensions(&cinfo);
    if ((int64_t)cinfo.output_width * cinfo.output_height > IMAGE_MAX_PIXELS) {
        jpeg_destroy_decompress(&cinfo);
        err_set(err, "%s: %u x %u pixels after scaling, more than the %lld the loader decodes",
                path, cinfo.output_width, cinfo.output_height, IMAGE_MAX_PIXELS);
        return DATASET_BAD;
    }
    const int ow = (int)cinfo.output_width, oh = (int)cinfo.output_height, n = cinfo.output_components;
    if (n != C && n != 4) {  // libjpeg-turbo writes 1 (gray), 3 (RGB) or 4 (CMYK) a pixel
        jpeg_destroy_decompress(&cinfo);
        err_set(err, "%s: libjpeg-turbo decodes it to %d components a pixel, not %d", path, n, C);
        return DATASET_BAD;
    }
    out = malloc((size_t)ow * oh * C);
    // At 1/8 scale the DC path gives libjpeg-turbo's bytes in less than half its time, or
    // declines and leaves the file to it. It writes output_components bytes a pixel.
    const int fast = !out || cinfo.scale_num != 1 || n != C ? JPEG_EIGHTH_DECLINED
                                                            : jpeg_eighth_decode(&cinfo, out);
    if (fast == 0) {
        jpeg_destroy_decompress(&cinfo);
        *px = out, *w = ow, *h = oh;
        return 0;
    }
    if (fast == JPEG_EIGHTH_DECLINED) {
        jpeg_start_decompress(&cinfo);
        row = malloc((size_t)ow * n);
    }
    if (!out || !row) {
        jpeg_destroy_decompress(&cinfo);
        free(out), free(row);
        return err_set(err, "%s: out of memory decoding %d x %d pixels", path, ow, oh);
    }
    while ((int)cinfo.output_scanline < oh) {
        const int y = (int)cinfo.output_scanline;
        JSAMPROW r = n == C ? out + (size_t)y * ow * C : row;
        jpeg_read_scanlines(&cinfo, &r, 1);
        if (n == C) continue;
        uint8_t *o = out + (size_t)y * ow * C;  // CMYK to RGB (and to luma for C = 1)
        for (int x = 0; x < ow; x++) {
            const uint8_t *q = row + (size_t)x * 4;
            int k = q[3], rgb[3];
            for (int c = 0; c < 3; c++)
                rgb[c] = cinfo.saw_Adobe_marker ? q[c] * k / 255 : (255 - q[c]) * (255 - k) / 255;
            if (C == 1) o[x] = luma(rgb[0], rgb[1], rgb[2]);
            else o[3 * x] = (uint8_t)rgb[0], o[3 * x + 1] = (uint8_t)rgb[1], o[3 * x + 2] = (uint8_t)rgb[2];
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    *px = out, *w = ow, *h = oh;
    return 0;
}

// ---- any image ----------------------------------------------------------------------------

// The whole file, malloc'd. DATASET_BAD when it cannot be read or is too large to be an
// image; -1 when out of memory.
static int read_file(const char *path, uint8_t **out, size_t *size, Error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set(err, "%s: cannot open: %s", path, strerror(errno));
        return DATASET_BAD;
    }
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || st.st_size > IMAGE_MAX_FILE_BYTES) {
        err_set(err, "%s: %s", path, !S_ISREG(st.st_mode) ? "not a regular file" : "larger than 1 GB: not an image to train on");
        fclose(f);
        return DATASET_BAD;
    }
    uint8_t *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!buf) {
        fclose(f);
        return err_set(err, "%s: out of memory reading %lld bytes", path, (long long)st.st_size);
    }
    const size_t n = fread(buf, 1, (size_t)st.st_size, f);
    const bool failed = ferror(f);
    fclose(f);
    if (failed || n != (size_t)st.st_size) {
        free(buf);
        err_set(err, "%s: cannot read: %s", path, failed ? strerror(errno) : "the file changed size");
        return DATASET_BAD;
    }
    *out = buf, *size = n;
    return 0;
}

// Whether libjpeg-turbo reads the file: SOI, or fill bytes FF before it, which stb_image
// would take for a JPEG too (its own JPEG decoder, never used: it writes past its Huffman
// tables on some damaged files). libjpeg-turbo calls the second kind not a JPEG.
static bool is_jpeg(const uint8_t *buf, size_t size) {
    return size >= 2 && buf[0] == 0xFF && (buf[1] == 0xD8 || buf[1] == 0xFF);
}

// ---- what a decode holds, from the header alone ------------------------------------------

// The frame header of a JPEG in buf: width, height, components, progressive, and the
// bytes of the coefficients of the whole image (what a progressive decode holds: each
// component's 8x8 blocks of 64 16-bit values, at its sampling, rounded up to whole MCUs as
// libjpeg-turbo allocates them). 0, or -1 if the bytes end first or are not a JPEG.
static int jpeg_frame(const uint8_t *buf, size_t size, int *w, int *h, int *comps, bool *progressive,
                      size_t *coef_bytes) {
    size_t p = 2;
    while (p + 4 <= size) {
        if (buf[p] != 0xFF) return -1;
        const uint8_t m = buf[p + 1];
        if (m == 0xFF) {  // fill bytes
            p++;
            continue;
        }
        const size_t len = (size_t)buf[p + 2] << 8 | buf[p + 3];
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            if (p + 10 > size) return -1;
            *h = buf[p + 5] << 8 | buf[p + 6], *w = buf[p + 7] << 8 | buf[p + 8], *comps = buf[p + 9];
            *progressive = m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE;
            // Component i: id, sampling (H << 4 | V), table, at p + 10 + 3 i. Unreadable
            // factors count as full size (an estimate from above; the decode reports them).
            int hmax = 1, vmax = 1, hs[256], vs[256];
            const bool whole = p + 10 + 3 * (size_t)*comps <= size;
            for (int i = 0; i < *comps; i++) {
                hs[i] = whole ? buf[p + 11 + 3 * i] >> 4 : 1, vs[i] = whole ? buf[p + 11 + 3 * i] & 15 : 1;
                if (hs[i] < 1 || hs[i] > 4 || vs[i] < 1 || vs[i] > 4) hs[i] = vs[i] = 1;
                if (hs[i] > hmax) hmax = hs[i];
                if (vs[i] > vmax) vmax = vs[i];
            }
            *coef_bytes = 0;
            for (int i = 0; i < *comps; i++) {
                // Blocks across: ceil(ceil(w * H / Hmax) / 8), rounded up to H (and V down).
                const uint64_t bw = ((uint64_t)*w * hs[i] + 8 * (uint64_t)hmax - 1) / (8 * (uint64_t)hmax);
                const uint64_t bh = ((uint64_t)*h * vs[i] + 8 * (uint64_t)vmax - 1) / (8 * (uint64_t)vmax);
                const uint64_t blocks = (bw + hs[i] - 1) / hs[i] * hs[i] * ((bh + vs[i] - 1) / vs[i] * vs[i]);
                *coef_bytes += (size_t)blocks * 128;
            }
            return 0;
        }
        if (m == 0xD9 || m == 0xDA || len < 2) return -1;  // no frame before the scan
        p += 2 + len;
    }
    return -1;
}

// The widest span of taps taps_make allocates for a span of `extent` input pixels to `full`.
static int taps_span(double extent, int full) {
    const double scale = full / extent, r = scale < 1 ? 1 / scale : 1;
    return (int)ceil(2 * r) + 2;
}

// The heap image_load takes for an image of w x h with n components (the file, the decoded
// pixels, stb_image's or libjpeg-turbo's own buffers), then for resizing it (the decoded
// pixels, the boxes, the filter's taps and float rows): the larger of the two phases, for
// the placement p at the DCT scale M/8 (8: full size, as every other format), and the
// sample's shape t. With any_box, any box of the image at that scale (a random crop's): the
// boxes of the whole image and the filter's widest taps, 10 (the factor left for it is
// below 4).
// Measured against a counting malloc (bench/RESULTS.md, "The loader's bytes"): within a
// few KB above what the decode holds for sequential JPEGs, the DC path and progressive
// files, the fixed 32 KB taking libjpeg-turbo's own tables and malloc's rounding.
static size_t load_bytes(size_t file, int w, int h, int n, bool jpeg, bool progressive, size_t coef,
                         int M, const Placement *p, bool any_box, Shape t) {
    const size_t C = (size_t)t.c;
    size_t decode = file;
    if (jpeg) {
        const int ow = (int)(((int64_t)w * M + 7) / 8), oh = (int)(((int64_t)h * M + 7) / 8);
        // libjpeg-turbo at scale M/8: about 20 KB of tables and state, then per output row a
        // few rows of each component at the output width (up to 12 bytes a value measured,
        // with 4:2:0 upsampling), our row of ow x n for CMYK, and a progressive file's
        // coefficients of the whole image; before it, at 1/8 scale, the DC path's tables,
        // planes and unstuffed copy of the data.
        size_t libjpeg = (size_t)ow * n * 17;
        if (progressive) libjpeg += coef;
        const size_t eighth = M == 1 && !progressive ? jpeg_eighth_bytes(w, h, n, file) : 0;
        decode += (size_t)ow * oh * C + 32768 + (libjpeg > eighth ? libjpeg : eighth);
        w = ow, h = oh;
    } else {
        // stb_image: its decode at the file's components, then converted to C; a PNG also
        // inflates its rows (16-bit at most) before unfiltering them; 32 KB of its state
        // (a 28 x 28 PNG held 19 KB besides the pixels, measured).
        decode += (size_t)w * h * (size_t)n * 4 + (size_t)w * h * C + 32768;
    }
    // resize_spans: the decoded pixels the box touches, boxes of kx x ky first when shrinking
    // by 4 or more, then the triangle filter over the reduced bw x bh to the sample: its
    // taps, a ring of its widest vertical span of filtered float rows, a row of sums and one
    // input row in floats.
    Span sx, sy;
    place_spans(p, M, &sx, &sy);
    const int kx = reduce_factor(&sx), ky = reduce_factor(&sy);
    const size_t px = (size_t)ceil(sx.extent) + 1, py = (size_t)ceil(sy.extent) + 1;
    const size_t bw = ((px < (size_t)w ? px : (size_t)w) + kx - 1) / kx;
    const size_t bh = ((py < (size_t)h ? py : (size_t)h) + ky - 1) / ky;
    const int tx = any_box ? 10 : taps_span(sx.extent / kx, sx.full);
    const int ty = any_box ? 10 : taps_span(sy.extent / ky, sy.full);
    size_t resize = (size_t)w * h * C;
    if (any_box || !spans_copy(&sx, &sy))
        resize += (kx > 1 || ky > 1 ? bw * bh * C : 0) + ((size_t)ty + 1) * t.w * C * sizeof(float) +
                  bw * C * sizeof(float) + ((size_t)t.w * tx + (size_t)t.h * ty) * 8 + 32768;
    return decode > resize ? decode : resize;
}

// The size and channels of a file that is not a JPEG, from its header: a binary PNM's own
// (cnn.c decodes those), stb_image's for the rest. false when no decoder reads it.
static bool image_dims(const uint8_t *buf, size_t size, int *w, int *h, int *n) {
    if (refused_format(buf, size)) return false;
    if (is_pnm(buf, size)) {
        int64_t pw, ph, maxval;
        size_t data;
        pnm_header(buf, size, &pw, &ph, &maxval, &data);
        if (pw < 0 || ph < 0 || pw > INT32_MAX || ph > INT32_MAX) return false;
        *w = (int)pw, *h = (int)ph, *n = buf[1] == '6' ? 3 : 1;
        return true;
    }
    return size <= INT32_MAX && stbi_info_from_memory(buf, (int)size, w, h, n);
}

// The heap of a load of this w x h image (n components): image_load's placement, or (crop)
// the most of any box: at each DCT scale from the whole image's to the smallest box's (the
// DC path of 1/8 holds more than some larger scales), the decode and the resize of any box.
static size_t placed_bytes(size_t file, int w, int h, int n, bool jpeg, bool progressive, size_t coef,
                           const ImageFit *fit, const ResizedCrop *crop) {
    const Shape s = image_fit_shape(fit);
    Placement p = {.bw = w, .bh = h, .rw = s.w, .rh = s.h};
    Error ignored;
    if (crop) {
        const CropBox least = resized_crop_smallest(crop, w, h);
        const Placement smallest = {.bw = least.w, .bh = least.h, .rw = s.w, .rh = s.h};
        size_t most = 0;
        for (int M = jpeg ? dct_scale(&p) : 8; M <= (jpeg ? dct_scale(&smallest) : 8); M++) {
            const size_t b = load_bytes(file, w, h, n, jpeg, progressive, coef, M, &p, true, s);
            most = b > most ? b : most;
        }
        return most;
    }
    if (place("", fit, NULL, 0, w, h, &p, &ignored)) return 0;  // a bad file: not decoded
    return load_bytes(file, w, h, n, jpeg, progressive, coef, jpeg ? dct_scale(&p) : 8, &p, false, s);
}

// Whether load decodes an image (not a JPEG) of w x h pixels declared in a file of `size`
// bytes: 0, or DATASET_BAD with err.
static int check_pixels(const char *path, int w, int h, size_t size, Error *err) {
    if (w < 1 || h < 1 || (int64_t)w * h > IMAGE_MAX_PIXELS) {
        err_set(err, "%s: %d x %d pixels: %s", path, w, h,
                w < 1 || h < 1 ? "not an image" : "more than the 134 million the loader decodes");
        return DATASET_BAD;
    }
    if ((int64_t)w * h > IMAGE_MAX_PIXELS_PER_BYTE * (int64_t)size + 65536) {
        // A header that promises far more than the file can hold (a 28-byte RLE TGA of
        // 65280 x 1220 pixels took seconds to expand): no format compresses that much.
        err_set(err, "%s: %d x %d pixels declared in %zu bytes, more than any image format "
                     "compresses to: a damaged or forged file", path, w, h, size);
        return DATASET_BAD;
    }
    return 0;
}

// The charge of files that load refuses by their header is 0, as of those whose header
// does not read: a forged header (a BMP of 100 bytes declaring 60000 x 60000 pixels) must
// not make the plan refuse a run whose loader skips the file (skip_bad).
size_t image_load_bytes(const char *path, const ImageFit *fit, const ResizedCrop *crop) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    struct stat st;
    uint8_t head[1 << 16];
    size_t n = 0, bytes = 0;
    if (!fstat(fileno(f), &st) && S_ISREG(st.st_mode)) n = fread(head, 1, sizeof head, f);
    int w, h, comps;
    bool progressive = false;
    size_t coef = 0;
    Error ignored;
    if (is_jpeg(head, n)) {
        if (!jpeg_frame(head, n, &w, &h, &comps, &progressive, &coef) && w > 0 && h > 0 &&
            (int64_t)w * h <= IMAGE_MAX_PIXELS)  // as jpeg_load
            bytes = placed_bytes((size_t)st.st_size, w, h, comps, true, progressive, coef, fit, crop);
    } else if (n && image_dims(head, n, &w, &h, &comps) &&
               !check_pixels(path, w, h, (size_t)st.st_size, &ignored)) {
        bytes = placed_bytes((size_t)st.st_size, w, h, comps, false, false, 0, fit, crop);
    }
    fclose(f);
    return bytes;
}

// image_load (crop NULL) and image_load_crop.
static int load(const char *path, const ImageFit *fit, const ResizedCrop *crop, uint64_t key,
                uint8_t *out, Error *err) {
    if (image_fit_check(fit, err)) return err_wrap(err, "%s: cannot decode", path);
    const Shape s = image_fit_shape(fit);
    const int C = s.c;
    uint8_t *buf, *px = NULL;
    size_t size = 0;
    int rc = read_file(path, &buf, &size, err), w = 0, h = 0, M = 8;
    if (rc) return rc;
    Placement p;
    const bool jpeg = is_jpeg(buf, size);
    const char *refused = refused_format(buf, size);
    if (jpeg) {
        rc = jpeg_load(path, buf, size, fit, crop, key, &p, &M, &px, &w, &h, err);
    } else if (refused) {
        err_set(err, "%s: a %s file; the loader reads PNG, JPEG, BMP, GIF, TGA and PNM (convert it "
                     "to one of those)", path, refused);
        rc = DATASET_BAD;
    } else if (!(rc = check_declared_size(path, buf, size, err))) {
        int n;
        if (!image_dims(buf, size, &w, &h, &n)) {
            err_set(err, "%s: not a readable image (stb_image: %s)", path,
                    size > INT32_MAX ? "too large" : stbi_failure_reason());
            rc = DATASET_BAD;
        } else if (!(rc = check_pixels(path, w, h, size, err)) &&
                   !(rc = place(path, fit, crop, key, w, h, &p, err)) &&
                   (errno = 0, !(px = is_pnm(buf, size) ? pnm_decode(buf, size, C)
                                                         : stbi_load_from_memory(buf, (int)size, &w, &h, &n, C)))) {
            // stb_image's reason is the last of the formats it tried; an allocation that
            // failed leaves ENOMEM.
            const char *why = stbi_failure_reason();
            if (errno == ENOMEM || (why && !strcmp(why, "outofmem"))) {
                rc = err_set(err, "%s: out of memory decoding %d x %d pixels", path, w, h);
            } else {
                err_set(err, "%s: cannot decode: %s (stb_image); the file is damaged or not an image",
                        path, why ? why : "unknown reason");
                rc = DATASET_BAD;
            }
        }
    }
    free(buf);
    if (rc) return rc;
    Span sx, sy;
    place_spans(&p, M, &sx, &sy);
    if (resize_spans(px, w, h, (size_t)w * C, C, sx, sy, out, s.w, s.h))
        rc = err_set(err, "%s: out of memory resizing %d x %d to %d x %d", path, w, h, s.w, s.h);
    free(px);
    return rc;
}

int image_load(const char *path, const ImageFit *fit, uint8_t *out, Error *err) {
    return load(path, fit, NULL, 0, out, err);
}

int image_load_crop(const char *path, const ImageFit *fit, const ResizedCrop *crop, uint64_t key,
                    uint8_t *out, Error *err) {
    return load(path, fit, crop, key, out, err);
}
