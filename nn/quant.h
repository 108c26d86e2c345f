// quant.h: compressed optimizer state (NetOptions.opt_format): bf16 values, or 8-bit codes
// of block-wise dynamic quantization (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization", ICLR 2022).
//
// int8: each trained tensor's state is cut into blocks of QUANT_BLOCK values from its first
// element (a block never spans two tensors, so a module's update never touches another's
// codes: the fused update stays the unfused one, bit for bit). A block keeps one float, the
// largest magnitude of its values (absmax), and a byte per value, the index of the nearest
// entry of a 256-value map of [-1, 1] (or [0, 1]) to value / absmax. The map is the paper's
// dynamic tree: 7 decades (1e-6 .. 1) with 1, 2, 4, ... 64 linearly spaced values each (the
// signed map, both signs, plus 0 and 1), or 2, 4, ... 128 (the unsigned map, for state that
// averages squares, which is never negative: its sign bit buys a bit of fraction). A value
// reads back as map[code] * absmax. Rounding is to the nearest map value (ties to the
// lower), deterministic, so a resumed run sees the same state; a value below half the
// smallest code rounds to 0 (the paper's kernels keep a momentum's sign instead, which
// keeps a momentum whose gradients stopped from ever decaying to 0; without it the
// accuracies are the same). State that averages squares (AdamW's second moment, both of
// Adadelta's averages) is stored as its square root (PackedPlan in kernels.h): stored as
// it is, AdamW's values 1e-7 below their block's largest became 0 under a momentum that was
// not, and the step momentum / eps threw runs of fashion.cfg off (81.7% and 10% against
// 88.0%); Adadelta's lay in the map's coarse lower decades (bench/RESULTS.md).
//
// bf16: each value rounded to bfloat16 (fp32's top 16 bits, round to nearest even).
//
// Compressed activations (NetOptions.compress; ActNN, Chen et al., ICML 2021): what backward
// reads of a node's output is kept as `bits`-wide codes (2, 4 or 8) in groups of ACT_GROUP
// values of one sample (a group never spans two samples; a sample's last may be shorter).
// A group's record is its two floats, base and step, then its codes, ACT_GROUP * bits / 8
// bytes (bits packed from a byte's low end). A value x reads back as base + code * step, its
// code rounded stochastically from (x - base) / step, so that the value read back is x in
// expectation (up to 2^-17 of a step: the uniform has 16 bits). The group's range is its
// smallest and largest value; a group of values >= 0 that holds an exact 0 (a ReLU's output)
// keeps its zeros and its positive values apart: code 0 is exactly 0, and codes 1 .. 2^bits
// - 1 span the positive values from the smallest (step stored negated: the sign says which
// form), so a ReLU's mask read from the values is exact (batchnorm + ReLU reads its mask
// from its output for that reason where its input is compressed: Layer.in_compressed;
// ReLU6's edge at 6 is not kept apart, and values near it read back on either side). The
// random bits are 16 of rng_u64(key, sample * 2^32 + i / 4) for value i of a sample (its
// index in the step's batch), the key the seed's, the step's and the layer's (net.c), so a
// recomputed segment, a resumed run and a GPU run round every value the same way.
//
// The functions are HOST_DEVICE: the CPU, the CUDA kernels and their host replay run the
// same code (nn/hostdevice.h).
#ifndef NN_QUANT_H
#define NN_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hostdevice.h"
#include "rng.h"

typedef enum StateFormat { STATE_F32, STATE_BF16, STATE_INT8, STATE_FORMAT_COUNT } StateFormat;
extern const char *const state_format_names[STATE_FORMAT_COUNT];  // "fp32", "bf16", "int8"

enum {
    QUANT_BLOCK = 2048,   // values per absmax (the paper's block)
    QUANT_SIGNED = 0,     // the maps' offsets in a QUANT_MAP_FLOATS table
    QUANT_UNSIGNED = 256,
    QUANT_MAP_FLOATS = 512,
    QUANT_SIGNED_ZERO = 127,  // the signed map's 0 (the unsigned map's is code 0)
};

// Bytes a value of state takes (the codes; int8 adds a float per block).
static inline size_t state_format_bytes(StateFormat f) {
    return f == STATE_F32 ? 4 : f == STATE_BF16 ? 2 : 1;
}
// Blocks of a tensor of n values.
HOST_DEVICE static inline int64_t quant_blocks(int64_t n) { return (n + QUANT_BLOCK - 1) / QUANT_BLOCK; }

// Value `code` of the signed (is_signed) or unsigned map, computed in double from exact
// decades and rounded once to float: every backend builds the same table from it.
static inline float quant_map_value(int is_signed, int code) {
    const double decade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    if (code == 255) return 1.0f;
    int k = code;
    double sign = 1.0;
    if (is_signed) {
        if (code == QUANT_SIGNED_ZERO) return 0.0f;
        // codes 0..126: the negative values, largest magnitude first; 128..254: positive.
        if (code < QUANT_SIGNED_ZERO) k = 126 - code, sign = -1.0;
        else k = code - 128;
        // k: 0 .. 126, decade i holds 2^i values: k in [2^i - 1, 2^(i+1) - 1).
        int i = 0;
        while (k >= (2 << i) - 1) i++;
        const int j = k - ((1 << i) - 1), items = 1 << i;
        return (float)(sign * decade[i] * (0.1 + 0.9 * (j + 0.5) / items));
    }
    if (code == 0) return 0.0f;
    k = code - 1;  // 0 .. 253: decade i holds 2^(i+1) values: k in [2^(i+1) - 2, 2^(i+2) - 2)
    int i = 0;
    while (k >= (4 << i) - 2) i++;
    const int j = k - ((2 << i) - 2), items = 2 << i;
    return (float)(decade[i] * (0.1 + 0.9 * (j + 0.5) / items));
}

// Fills map[QUANT_MAP_FLOATS]: the signed map, then the unsigned one, each ascending.
static inline void quant_map_fill(float *map) {
    for (int c = 0; c < 256; c++) {
        map[QUANT_SIGNED + c] = quant_map_value(1, c);
        map[QUANT_UNSIGNED + c] = quant_map_value(0, c);
    }
}

// The code of x (a value already divided by its block's absmax, so in [-1, 1]) in the map
// m (256 ascending values): the nearest, ties to the lower; outside the map, its end (a NaN
// takes code 1). A search without branches (each step adds its half when the map there is
// <= x: the largest code at or below x, then that or the next), so that the compiler
// vectorises it. The differences are exact-rounded float subtractions (sub: the caller's,
// so that CUDA uses its _rn intrinsic and nothing contracts).
#define QUANT_STEP_(m, x, lo, step) (lo) += (m)[(lo) + (step)] <= (x) ? (step) : 0
#define QUANT_NEAREST(m, x, sub, out)                                          \
    do {                                                                       \
        int lo_ = 0;                                                           \
        QUANT_STEP_(m, x, lo_, 128), QUANT_STEP_(m, x, lo_, 64);               \
        QUANT_STEP_(m, x, lo_, 32), QUANT_STEP_(m, x, lo_, 16);                \
        QUANT_STEP_(m, x, lo_, 8), QUANT_STEP_(m, x, lo_, 4);                  \
        QUANT_STEP_(m, x, lo_, 2), QUANT_STEP_(m, x, lo_, 1);                  \
        const int hi_ = lo_ < 255 ? lo_ + 1 : 255;                             \
        (out) = sub((x), (m)[lo_]) <= sub((m)[hi_], (x)) ? lo_ : hi_;          \
    } while (0)

// bfloat16: round to nearest even; NaN stays a quiet NaN.
HOST_DEVICE static inline uint16_t bf16_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

HOST_DEVICE static inline float bf16_to_float(uint16_t h) {
    const uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

// ---- compressed activations -------------------------------------------------------------

enum { ACT_GROUP = 256 };

// Whether `bits` is a width the activations may be compressed to.
static inline int act_bits_valid(int bits) { return bits == 2 || bits == 4 || bits == 8; }

// Bytes of a group's record, and of a sample of `values`.
HOST_DEVICE static inline int64_t act_group_bytes(int bits) { return 8 + ACT_GROUP * bits / 8; }
HOST_DEVICE static inline int64_t act_sample_bytes(int64_t values, int bits) {
    return (values + ACT_GROUP - 1) / ACT_GROUP * act_group_bytes(bits);
}

// The group functions are inlined where they are called with a constant width, so that
// their loops over the codes unroll and vectorise.
#ifdef __CUDACC__
#define ACT_INLINE __forceinline__
#else
#define ACT_INLINE __attribute__((always_inline)) inline
#endif

// Float operations that nvcc must not contract into an FMA (the CPU does not: C11 mode).
#ifdef __CUDA_ARCH__
#define ACT_SUB_(a, b) __fsub_rn(a, b)
#define ACT_MUL_(a, b) __fmul_rn(a, b)
#define ACT_ADD_(a, b) __fadd_rn(a, b)
#else
#define ACT_SUB_(a, b) ((a) - (b))
#define ACT_MUL_(a, b) ((a) * (b))
#define ACT_ADD_(a, b) ((a) + (b))
#endif

// The codes w of values 4k .. 4k+3 (each below 2^bits, value 4k + j's at bit j * bits) into
// a record's code bytes, from a byte's low end (value i at bit i * bits): bits / 2 bytes a quad.
HOST_DEVICE static ACT_INLINE void act_put_quad(unsigned char *codes, int k, uint32_t w, int bits) {
    for (int b = 0; b < bits / 2; b++) codes[k * bits / 2 + b] = (unsigned char)(w >> (8 * b));
}

// Packs the `count` values x (count <= ACT_GROUP) of a group into the record `rec`
// (act_group_bytes(bits), 4-byte aligned); value i's random bits are the (i % 4)-th 16 of
// rng_u64(key, c0 + i / 4). Compare-selects, not fminf: NaNs never take the range (they
// read back as the group's base). A short group is padded with its first value. No arrays:
// on a GPU a thread's array is local memory, which the device reserves for every thread it
// can hold (2.3 KB each took 350 MB of an H200).
HOST_DEVICE static ACT_INLINE void act_pack_group(unsigned char *rec, const float *x, int count, int bits,
                                                  uint64_t key, uint64_t c0) {
    float lo = x[0], hi = x[0], pos = INFINITY;
    for (int i = 0; i < count; i++) {
        const float v = x[i];
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        pos = v > 0.0f && v < pos ? v : pos;
    }
    const int top = (1 << bits) - 1;
    const int zeros = lo == 0.0f && hi > 0.0f;  // a ReLU's output: 0 kept apart
    const float base = ACT_ADD_(zeros ? pos : lo, 0.0f), cap = (float)(top - zeros);  // -0 -> +0
    const float step = ACT_MUL_(ACT_SUB_(hi, base), 1.0f / cap);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    float head[2] = {base, zeros ? -step : step};
    memcpy(rec, head, sizeof head);
    for (int k = 0; k < ACT_GROUP / 4; k++) {
        const uint64_t r = rng_u64(key, c0 + (uint64_t)k);
        uint32_t w = 0;
        for (int j = 0; j < 4; j++) {
            const float v = x[4 * k + j < count ? 4 * k + j : 0];
            const float u = ((float)((r >> (16 * j)) & 0xffff) + 0.5f) * (1.0f / 65536.0f);
            const float t = ACT_ADD_(ACT_MUL_(ACT_SUB_(v, base), inv), u);
            const float q = t >= cap ? cap : t > 0.0f ? floorf(t) : 0.0f;  // a NaN: 0
            w |= (uint32_t)(int)(zeros ? (v > 0.0f ? q + 1.0f : 0.0f) : q) << (j * bits);
        }
        act_put_quad(rec + 8, k, w, bits);
    }
}

// The `count` values of record `rec` into x: each code's level, base + (code - zeros) *
// step in one fused multiply-add (code 0 is 0 where the group kept zeros apart).
HOST_DEVICE static ACT_INLINE void act_unpack_group(float *x, const unsigned char *rec, int count, int bits) {
    float head[2];
    memcpy(head, rec, sizeof head);
    const int zeros = signbit(head[1]) != 0, per = 8 / bits, mask = (1 << bits) - 1;
    const float step = fabsf(head[1]);
    const unsigned char *codes = rec + 8;
    for (int i = 0; i < count; i++) {
        const int q = (codes[i / per] >> (i % per * bits)) & mask;
        x[i] = zeros && q == 0 ? 0.0f : fmaf((float)(q - zeros), step, head[0]);
    }
}

#endif
