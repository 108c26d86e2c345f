// jpeg_eighth.c: a baseline JPEG decoded at 1/8 scale, the bytes libjpeg-turbo's own 1/8
// decode gives, in less than half its time.
//
// At 1/8 scale an 8x8 block becomes one pixel: its DC coefficient over 8 (libjpeg-turbo's
// 1x1 IDCT). A subsampled component that libjpeg-turbo enlarges by IDCT scaling instead of
// upsampling (4:2:0 chroma: 2x2 pixels a block) needs the block's low frequencies too
// (its 2x2 IDCT). Every AC code must still be read to find where the next block starts,
// and that entropy decoding is nearly all of the work. libjpeg-turbo reads one code at a
// time; here one lookup in a table of the next 12 bits skips every whole code (Huffman
// code and value bits) that starts inside them, two or three on photos.
//
// The scope is what encoders write for photos: one interleaved sequential Huffman scan of
// 8-bit gray or YCbCr, restart markers where they belong, the scan ending at EOI. Anything
// else is declined before the output is trusted (progressive or arithmetic coding, CMYK
// or RGB, several scans, a marker out of place, a code no table has, data that ends early
// or leaves whole bytes over, a DC sum far outside 16 bits, a 2x2 block whose coefficients
// leave the range where every implementation of the IDCT's integer arithmetic agrees):
// libjpeg-turbo then decodes the file from its start and reports what is wrong with it.
// tests/test_jpeg_eighth.c checks the equality with libjpeg-turbo over subsamplings, sizes,
// qualities, restart intervals, Huffman tables, extreme coefficients and damaged data.
#include "jpeg_eighth.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FAST_BITS 12  // codes up to this long decode in one lookup; skips cover this many bits
#define FAST_SIZE (1 << FAST_BITS)
#define PAD 512       // zero bytes after a segment: a block reads at most 256 bytes past its end
#define IDCT2_MAX 2048  // the largest dequantized coefficient a 2x2 block may hold (above)

typedef struct Huff {
    uint16_t fast[FAST_SIZE];  // (length << 8) | symbol of the code that starts the index; 0
                               // when that code is longer than FAST_BITS or no code
    int32_t maxcode[17];       // the largest code of each length, -1 for none
    int32_t valoffset[17];     // a code's symbol is huffval[code + valoffset[its length]]
    uint8_t huffval[256];
} Huff;

// What the codes that start within FAST_BITS bits of an AC stream do, as one entry: the bits
// they take (codes and value bits), the coefficients they advance (run + 1 per value, 16 per
// ZRL) and whether the last is EOB. `lim` is the advance plus 1 for an EOB (the block must
// not end before it), or SKIP_NONE when the first code is longer than FAST_BITS: the entry
// applies at coefficient k when k + lim <= 64.
#define SKIP(bits, adv, eob) (uint16_t)((bits) | ((adv) + (eob)) << 6 | (eob) << 13)
#define SKIP_NONE (127 << 6)
#define SKIP_BITS(e) ((e) & 63)
#define SKIP_LIM(e) (((e) >> 6) & 127)
#define SKIP_EOB(e) ((e) >> 13)
#define SKIP_ADV(e) (SKIP_LIM(e) - SKIP_EOB(e))

// The decoding tables of the files a thread decoded last, by table slot (0..3) as scans
// name them, with the file's tables each was built from: photos from one camera or encoder
// share their tables, so most files build none. One per thread that decodes (loader workers
// decode concurrently), made at its first JPEG and freed when it ends; jpeg_eighth_bytes
// counts it for each reader.
typedef struct Tables {
    JHUFF_TBL from[2][NUM_HUFF_TBLS];  // what huff[0][i] (DC) and huff[1][i] (AC) were built from
    bool built[2][NUM_HUFF_TBLS], skip_built[NUM_HUFF_TBLS];
    Huff huff[2][NUM_HUFF_TBLS];
    uint16_t skip[NUM_HUFF_TBLS][FAST_SIZE];  // of huff[1][i]
    uint16_t memo[FAST_SIZE];                 // skip_build's entries for shorter windows
} Tables;

static pthread_key_t tables_key;
static int tables_key_error;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void tables_key_make(void) { tables_key_error = pthread_key_create(&tables_key, free); }

// This thread's tables; NULL when out of memory.
static Tables *tables_get(void) {
    pthread_once(&tables_once, tables_key_make);
    if (tables_key_error) return NULL;
    Tables *t = pthread_getspecific(tables_key);
    if (!t && (t = calloc(1, sizeof *t)) && pthread_setspecific(tables_key, t)) {
        free(t);
        t = NULL;
    }
    return t;
}

typedef struct Comp {
    int h, v;         // sampling factors
    int ssize;        // pixels a block gives along each side: 1 (DC) or 2 (2x2 IDCT)
    int eh, ev;       // upsampling to the output: max_h / (h * ssize), max_v / (v * ssize)
    bool needed;      // the output uses it (gray output of YCbCr needs Y alone)
    const Huff *dc, *ac;
    const uint16_t *skip;
    int16_t q[DCTSIZE2];  // quantization, natural order, as libjpeg-turbo's 16-bit multipliers
    int32_t last_dc;
    uint8_t *plane;   // (ph, pw) the component's pixels at its scaled size, dummy blocks too
    size_t pw, ph;
} Comp;

// Zigzag position -> natural position, 16 more entries for corrupt runs past the end, as
// libjpeg's jpeg_natural_order: a run that overshoots writes to coefficient 63.
static const uint8_t natural_order[DCTSIZE2 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

// ---- Huffman tables ------------------------------------------------------------------------

// The decoding tables of t, with libjpeg's checks (jpeg_make_d_derived_tbl): at most 256
// symbols, every code fits its length and none is all ones, DC symbols at most 15. false
// when t fails them (libjpeg-turbo stops with an error then).
static bool huff_build(Huff *h, const JHUFF_TBL *t, bool dc) {
    uint8_t length[257];
    uint32_t code[256];
    int n = 0;
    for (int l = 1; l <= 16; l++) {
        if (n + t->bits[l] > 256) return false;
        for (int i = 0; i < t->bits[l]; i++) length[n++] = (uint8_t)l;
    }
    length[n] = 0;
    uint32_t c = 0;
    for (int p = 0, l = length[0]; length[p]; l++) {
        while (length[p] == l) code[p++] = c++;
        if (c >= 1u << l) return false;
        c <<= 1;
    }
    for (int i = 0; dc && i < n; i++)
        if (t->huffval[i] > 15) return false;
    for (int l = 1, p = 0; l <= 16; l++) {
        h->maxcode[l] = -1;
        if (!t->bits[l]) continue;
        h->valoffset[l] = p - (int32_t)code[p];
        p += t->bits[l];
        h->maxcode[l] = (int32_t)code[p - 1];
    }
    memcpy(h->huffval, t->huffval, sizeof h->huffval);
    memset(h->fast, 0, sizeof h->fast);
    for (int i = 0; i < n && length[i] <= FAST_BITS; i++) {
        const int shift = FAST_BITS - length[i];
        const uint16_t e = (uint16_t)(length[i] << 8 | t->huffval[i]);
        for (uint32_t j = code[i] << shift; j < (code[i] + 1) << shift; j++) h->fast[j] = e;
    }
    return true;
}

// The skip table of an AC table: entry v covers the codes that start within the window v of
// FAST_BITS bits. By window length w, shortest first (memo keeps windows of w < FAST_BITS
// at 1 << w): the first code of the window, then the entry of what is left of it.
static void skip_build(uint16_t *skip, uint16_t *memo, const Huff *h) {
    for (int w = 1; w <= FAST_BITS; w++) {
        uint16_t *level = w == FAST_BITS ? skip : memo + (1 << w);
        for (uint32_t v = 0; v < 1u << w; v++) {
            const uint16_t e = h->fast[v << (FAST_BITS - w)];
            const int len = e >> 8, r = (e >> 4) & 15, s = e & 15;
            if (!e || len > w) {
                level[v] = SKIP_NONE;
            } else if (!s && r != 15) {
                level[v] = SKIP(len, 0, 1);
            } else {
                const int bits = len + s, adv = s ? r + 1 : 16;
                const uint16_t rest = bits < w ? memo[(1 << (w - bits)) + (v & ((1u << (w - bits)) - 1))] : SKIP_NONE;
                level[v] = rest != SKIP_NONE && adv + SKIP_LIM(rest) <= DCTSIZE2
                               ? SKIP(bits + SKIP_BITS(rest), adv + SKIP_ADV(rest), SKIP_EOB(rest))
                               : SKIP(bits, adv, 0);
            }
        }
    }
}

// The decoding table of file table t in slot `slot` (kind 0: DC, 1: AC), from the cache
// or built; NULL when t fails libjpeg's checks.
static const Huff *huff_get(Tables *c, int kind, int slot, const JHUFF_TBL *t) {
    const JHUFF_TBL *from = &c->from[kind][slot];
    if (!c->built[kind][slot] || memcmp(from->bits, t->bits, sizeof t->bits) ||
        memcmp(from->huffval, t->huffval, sizeof t->huffval)) {
        c->built[kind][slot] = false;
        if (kind) c->skip_built[slot] = false;
        if (!huff_build(&c->huff[kind][slot], t, kind == 0)) return NULL;
        c->from[kind][slot] = *t;
        c->built[kind][slot] = true;
    }
    return &c->huff[kind][slot];
}

// The skip table of the AC table in slot `slot`, which huff_get has built.
static const uint16_t *skip_get(Tables *c, int slot) {
    if (!c->skip_built[slot]) {
        skip_build(c->skip[slot], c->memo, &c->huff[1][slot]);
        c->skip_built[slot] = true;
    }
    return c->skip[slot];
}

// ---- the bit stream ------------------------------------------------------------------------

// A segment's bytes with the stuffing removed, read 64 bits at a time: acc holds n >= 56
// valid bits at its top after refill (Giesen's branchless refill: the bits below n are
// the stream's next bits or zero).
typedef struct Bits {
    const uint8_t *start, *p;
    uint64_t acc;
    int n;
} Bits;

static inline void refill(Bits *b) {
    uint64_t w;
    memcpy(&w, b->p, sizeof w);
    b->acc |= __builtin_bswap64(w) >> b->n;
    b->p += (63 - b->n) >> 3;
    b->n |= 56;
}

static inline size_t consumed_bits(const Bits *b) { return (size_t)(b->p - b->start) * 8 - (size_t)b->n; }

static inline void drop(Bits *b, int k) {
    b->acc <<= k;
    b->n -= k;
}

static inline int take(Bits *b, int s) {  // s >= 1 value bits
    const int x = (int)(b->acc >> (64 - s));
    drop(b, s);
    return x;
}

static inline int extend(int x, int s) { return x < 1 << (s - 1) ? x - (1 << s) + 1 : x; }

// The next symbol (a refill before it), or -1 for bits no code starts (corrupt data).
static inline int huff_decode(Bits *b, const Huff *h) {
    const unsigned e = h->fast[b->acc >> (64 - FAST_BITS)];
    if (e) {
        drop(b, (int)(e >> 8));
        return (int)(e & 255);
    }
    for (int l = FAST_BITS + 1; l <= 16; l++) {
        const int32_t code = (int32_t)(b->acc >> (64 - l));
        if (code <= h->maxcode[l]) {
            drop(b, l);
            return h->huffval[(code + h->valoffset[l]) & 255];
        }
    }
    return -1;
}

// Copies the entropy-coded bytes from *src up to the next marker into dst, unstuffed as
// libjpeg reads them (FF 00 is a data byte FF; fill bytes FF before a marker are skipped;
// FF FF 00 is a data byte too). Returns the marker's code with *src after it and *n the
// bytes written, or -1 when the data ends without a marker.
static int unstuff(const uint8_t **src, const uint8_t *end, uint8_t *dst, size_t *n) {
    const uint8_t *p = *src;
    uint8_t *o = dst;
    for (;;) {
        const uint8_t *ff = memchr(p, 0xFF, (size_t)(end - p));
        if (!ff) return -1;
        memcpy(o, p, (size_t)(ff - p));
        o += ff - p;
        p = ff + 1;
        while (p < end && *p == 0xFF) p++;
        if (p == end) return -1;
        if (*p++ == 0) {
            *o++ = 0xFF;
            continue;
        }
        *n = (size_t)(o - dst);
        *src = p;
        return p[-1];
    }
}

// ---- blocks ----------------------------------------------------------------------------------

// libjpeg-turbo's range limit after an IDCT: x + 128 clamped to 0..255 for x in
// [-512, 511], and what its 1,024-entry table gives beyond (it wraps).
static inline uint8_t idct_limit(int32_t x) {
    const int i = (int)(x & 1023);
    return (uint8_t)(i < 128 ? i + 128 : i < 512 ? 255 : i < 896 ? 0 : i - 896);
}

// The AC codes of one block passed over; false on corrupt data. Two table lookups a refill:
// each takes at most FAST_BITS + 15 of the 56 bits.
static inline bool ac_skip(Bits *b, const Huff *h, const uint16_t *skip) {
    for (int k = 1;;) {
        refill(b);
        for (int i = 0; i < 2; i++) {
            const unsigned e = skip[b->acc >> (64 - FAST_BITS)];
            if (k + (int)SKIP_LIM(e) > DCTSIZE2) goto one_code;
            drop(b, (int)SKIP_BITS(e));
            if (SKIP_EOB(e)) return true;
            k += (int)SKIP_LIM(e);
            if (k == DCTSIZE2) return true;
        }
        continue;
    one_code:
        refill(b);
        const int sym = huff_decode(b, h);
        if (sym < 0) return false;
        const int r = sym >> 4, s = sym & 15;
        if (s) {
            k += r + 1;
            drop(b, s);
        } else if (r == 15) {
            k += 16;
        } else {
            return true;
        }
        if (k >= DCTSIZE2) return true;
    }
}

// The AC coefficients of one block into coef (natural order, zeroed before): how many it
// wrote, or -1 on corrupt data.
static inline int ac_values(Bits *b, const Huff *h, int16_t *coef) {
    int written = 0;
    for (int k = 1; k < DCTSIZE2; k++) {
        refill(b);
        const int sym = huff_decode(b, h);
        if (sym < 0) return -1;
        const int r = sym >> 4, s = sym & 15;
        if (s) {
            k += r;
            coef[natural_order[k]] = (int16_t)extend(take(b, s), s);
            written++;
        } else if (r == 15) {
            k += 15;
        } else {
            break;
        }
    }
    return written;
}

// libjpeg's reduced 2x2 IDCT (jidctred.c: rows and columns 0, 1, 3, 5, 7 of the block) into
// dst (2 x 2, rows `stride` apart); false when a coefficient it reads dequantizes to more
// than IDCT2_MAX, where 16-bit SIMD versions of it could differ from this one. Within that
// bound every sum fits 31 bits.
static bool idct2(const int16_t *coef, const int16_t *q, uint8_t *dst, size_t stride) {
    enum { C1 = 29692, C3 = -10426, C5 = 6967, C7 = -5906 };  // FIX(x) at 13 bits
    static const int used[5] = {0, 1, 3, 5, 7};
    int32_t ws[2][5];
    for (int i = 0; i < 5; i++) {
        const int c = used[i];
        const int32_t z0 = coef[c] * q[c], z1 = coef[8 + c] * q[8 + c], z3 = coef[24 + c] * q[24 + c],
                      z5 = coef[40 + c] * q[40 + c], z7 = coef[56 + c] * q[56 + c];
#define BEYOND(z) ((uint32_t)((z) + IDCT2_MAX) > 2 * IDCT2_MAX)
        if (BEYOND(z0) | BEYOND(z1) | BEYOND(z3) | BEYOND(z5) | BEYOND(z7)) return false;
#undef BEYOND
        const int32_t even = z0 * 32768, odd = z7 * C7 + z5 * C5 + z3 * C3 + z1 * C1;
        ws[0][i] = (even + odd + (1 << 12)) >> 13;
        ws[1][i] = (even - odd + (1 << 12)) >> 13;
    }
    for (int r = 0; r < 2; r++) {
        const int32_t *w = ws[r], even = w[0] * 32768, odd = w[4] * C7 + w[3] * C5 + w[2] * C3 + w[1] * C1;
        dst[r * stride] = idct_limit((even + odd + (1 << 19)) >> 20);
        dst[r * stride + 1] = idct_limit((even - odd + (1 << 19)) >> 20);
    }
    return true;
}

// One block of component c at block position (bx, by) of its plane; false to decline.
static inline bool block_decode(Bits *b, Comp *c, size_t bx, size_t by) {
    refill(b);
    const int s = huff_decode(b, c->dc);
    if (s < 0) return false;
    const int diff = s ? extend(take(b, s), s) : 0;
    if (!c->needed) return ac_skip(b, c->ac, c->skip);
    const int32_t dc = c->last_dc + diff;
    if (dc > 1 << 30 || dc < -(1 << 30)) return false;  // libjpeg-turbo's overflow handling aside
    c->last_dc = dc;
    const int32_t z0 = (int16_t)dc * c->q[0];
    uint8_t *px = c->plane + by * c->ssize * c->pw + bx * c->ssize;
    if (c->ssize == 1) {
        *px = idct_limit((z0 + 4) >> 3);
        return ac_skip(b, c->ac, c->skip);
    }
    int16_t coef[DCTSIZE2];
    memset(coef, 0, sizeof coef);
    coef[0] = (int16_t)dc;
    const int written = ac_values(b, c->ac, coef);
    if (written < 0) return false;
    if (written) return idct2(coef, c->q, px, c->pw);
    if (z0 > IDCT2_MAX || z0 < -IDCT2_MAX) return false;
    px[0] = px[1] = px[c->pw] = px[c->pw + 1] = idct_limit((z0 + 4) >> 3);  // what idct2 gives
    return true;
}

// ---- the image -------------------------------------------------------------------------------

// Output row y of component c, upsampled by replication into row (or its plane row).
static const uint8_t *comp_row(const Comp *c, int y, int ow, uint8_t *row) {
    const uint8_t *src = c->plane + (size_t)(y / c->ev) * c->pw;
    if (c->eh == 1) return src;
    for (int x = 0, i = 0; x < ow; i++)
        for (int k = 0; k < c->eh && x < ow; k++) row[x++] = src[i];
    return row;
}

static inline uint8_t clamp255(int x) { return (uint8_t)(x < 0 ? 0 : x > 255 ? 255 : x); }

// The planes upsampled and converted to the output colour space, as libjpeg-turbo's
// ycc_rgb_convert (16-bit fixed point, jdcolor.c), or Y alone, or gray replicated.
static void write_output(const Comp *comp, int n, int C, int ow, int oh, uint8_t *rows, uint8_t *out) {
    enum { CR_R = 91881, CB_B = 116130, CR_G = 46802, CB_G = 22554, HALF = 1 << 15 };
    for (int y = 0; y < oh; y++) {
        uint8_t *o = out + (size_t)y * ow * C;
        const uint8_t *Y = comp_row(&comp[0], y, ow, rows);
        if (C == 1) {
            memcpy(o, Y, (size_t)ow);
        } else if (n == 1) {
            for (int x = 0; x < ow; x++) o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = Y[x];
        } else {
            const uint8_t *cb = comp_row(&comp[1], y, ow, rows + ow), *cr = comp_row(&comp[2], y, ow, rows + 2 * ow);
            for (int x = 0; x < ow; x++) {
                const int u = cb[x] - 128, v = cr[x] - 128;
                o[3 * x] = clamp255(Y[x] + ((CR_R * v + HALF) >> 16));
                o[3 * x + 1] = clamp255(Y[x] + ((-CB_G * u + HALF - CR_G * v) >> 16));
                o[3 * x + 2] = clamp255(Y[x] + ((CB_B * u + HALF) >> 16));
            }
        }
    }
}

static size_t planes_bytes(int w, int h, int n) {
    return (size_t)n * ((size_t)(w + 7) / 8 + 4) * ((size_t)(h + 7) / 8 + 4);
}

size_t jpeg_eighth_bytes(int w, int h, int n, size_t file) {
    return sizeof(Tables) + file + PAD + planes_bytes(w, h, n) + 3 * ((size_t)(w + 7) / 8);
}

// The components of cinfo's scan, or false when it is outside the scope.
static bool comps_setup(const struct jpeg_decompress_struct *ci, Comp *comp, int *mcus_x, int *mcus_y) {
    const int n = ci->num_components;
    if (ci->progressive_mode || ci->arith_code || ci->data_precision != 8 || ci->min_DCT_scaled_size != 1 ||
        ci->comps_in_scan != n || ci->Ss != 0 || ci->Se != DCTSIZE2 - 1 || ci->Ah != 0 || ci->Al != 0)
        return false;
    if (!(n == 1 && ci->jpeg_color_space == JCS_GRAYSCALE) && !(n == 3 && ci->jpeg_color_space == JCS_YCbCr))
        return false;
    if (ci->out_color_space != JCS_GRAYSCALE && ci->out_color_space != JCS_RGB) return false;
    const int mh = ci->max_h_samp_factor, mv = ci->max_v_samp_factor;
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        const jpeg_component_info *info = &ci->comp_info[i];
        Comp *c = &comp[i];
        c->h = info->h_samp_factor, c->v = info->v_samp_factor, c->ssize = info->DCT_scaled_size;
        if (c->ssize != 1 && c->ssize != 2) return false;
        if (mh % (c->h * c->ssize) || mv % (c->v * c->ssize)) return false;  // libjpeg: an error
        c->eh = mh / (c->h * c->ssize), c->ev = mv / (c->v * c->ssize);
        c->needed = i == 0 || ci->out_color_space == JCS_RGB;
        // Table numbers come from the file as they are; libjpeg-turbo checks them when it
        // starts decompressing (an error).
        if (info->quant_tbl_no < 0 || info->quant_tbl_no >= NUM_QUANT_TBLS || info->dc_tbl_no < 0 ||
            info->dc_tbl_no >= NUM_HUFF_TBLS || info->ac_tbl_no < 0 || info->ac_tbl_no >= NUM_HUFF_TBLS)
            return false;
        const JQUANT_TBL *q = ci->quant_tbl_ptrs[info->quant_tbl_no];
        if (!q) return false;
        for (int k = 0; k < DCTSIZE2; k++) c->q[k] = (int16_t)q->quantval[k];
        blocks += c->h * c->v;
    }
    if (n == 1) {  // a non-interleaved scan: one block an MCU, only the image's blocks coded
        comp[0].h = comp[0].v = 1;
        *mcus_x = (int)ci->comp_info[0].width_in_blocks, *mcus_y = (int)ci->comp_info[0].height_in_blocks;
    } else {
        if (blocks > D_MAX_BLOCKS_IN_MCU) return false;  // libjpeg: an error
        *mcus_x = (int)((ci->image_width + 8 * mh - 1) / (8 * mh));
        *mcus_y = (int)((ci->image_height + 8 * mv - 1) / (8 * mv));
    }
    return true;
}

// The entropy-coded segments between restart markers, one at a time.
typedef struct Segment {
    const uint8_t *src, *end;  // the file's bytes not read yet
    uint8_t *clean;            // the segment unstuffed, PAD zero bytes after it
    size_t len;
    int marker;                // the code of the marker that ends it
} Segment;

// The next segment into g->clean, its bits from the start into *b.
static inline bool segment_start(Segment *g, Bits *b) {
    g->marker = unstuff(&g->src, g->end, g->clean, &g->len);
    if (g->marker < 0) return false;
    memset(g->clean + g->len, 0, PAD);
    *b = (Bits){g->clean, g->clean, 0, 0};
    return true;
}

// A segment ends within its last byte (whole bytes left over are a libjpeg-turbo warning),
// at the marker `expected`.
static inline bool segment_end(const Segment *g, const Bits *b, int expected) {
    return consumed_bits(b) + 8 > 8 * g->len && g->marker == expected;
}

int jpeg_eighth_decode(const struct jpeg_decompress_struct *ci, uint8_t *out) {
    Comp comp[3];
    int mcus_x, mcus_y;
    if (!comps_setup(ci, comp, &mcus_x, &mcus_y)) return JPEG_EIGHTH_DECLINED;
    const int n = ci->num_components, ow = (int)ci->output_width, oh = (int)ci->output_height;
    const uint8_t *src = ci->src->next_input_byte, *end = src + ci->src->bytes_in_buffer;
    const size_t data = ci->src->bytes_in_buffer;
    Tables *t = tables_get();
    if (!t) return -1;
    for (int i = 0; i < n; i++) {
        Comp *c = &comp[i];
        const jpeg_component_info *info = &ci->comp_info[i];
        const JHUFF_TBL *dc = ci->dc_huff_tbl_ptrs[info->dc_tbl_no], *ac = ci->ac_huff_tbl_ptrs[info->ac_tbl_no];
        if (!dc || !ac) return JPEG_EIGHTH_DECLINED;  // libjpeg-turbo: the standard tables
        if (!(c->dc = huff_get(t, 0, info->dc_tbl_no, dc)) || !(c->ac = huff_get(t, 1, info->ac_tbl_no, ac)))
            return JPEG_EIGHTH_DECLINED;
        c->skip = c->ssize == 1 || !c->needed ? skip_get(t, info->ac_tbl_no) : NULL;
    }
    uint8_t *mem = malloc(data + PAD + planes_bytes((int)ci->image_width, (int)ci->image_height, n) + 3 * (size_t)ow);
    if (!mem) return -1;
    uint8_t *clean = mem, *p = clean + data + PAD;
    for (int i = 0; i < n; i++) {
        comp[i].pw = (size_t)mcus_x * comp[i].h * comp[i].ssize, comp[i].ph = (size_t)mcus_y * comp[i].v * comp[i].ssize;
        comp[i].plane = p;
        p += comp[i].pw * comp[i].ph;
    }
    int rc = JPEG_EIGHTH_DECLINED;
    Comp *scan[3];
    for (int i = 0; i < n; i++) scan[i] = &comp[ci->cur_comp_info[i] - ci->comp_info];
    Segment g = {.src = src, .end = end, .clean = clean};
    Bits b;
    int64_t left = ci->restart_interval ? ci->restart_interval : INT64_MAX;  // MCUs to the next marker
    if (!segment_start(&g, &b)) goto done;
    for (int i = 0; i < n; i++) comp[i].last_dc = 0;
    for (size_t my = 0, rst = 0; my < (size_t)mcus_y; my++)
        for (size_t mx = 0; mx < (size_t)mcus_x; mx++, left--) {
            if (!left) {
                if (!segment_end(&g, &b, 0xD0 + (int)rst) || !segment_start(&g, &b)) goto done;
                for (int i = 0; i < n; i++) comp[i].last_dc = 0;
                rst = (rst + 1) & 7;
                left = ci->restart_interval;
            }
            for (int i = 0; i < n; i++) {
                Comp *c = scan[i];
                for (int y = 0; y < c->v; y++)
                    for (int x = 0; x < c->h; x++)
                        if (!block_decode(&b, c, mx * c->h + x, my * c->v + y) || consumed_bits(&b) > 8 * g.len)
                            goto done;
            }
        }
    if (!segment_end(&g, &b, 0xD9)) goto done;
    write_output(comp, n, (int)ci->out_color_components, ow, oh, p, out);
    rc = 0;
done:
    free(mem);
    return rc;
}
