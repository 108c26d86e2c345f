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
// accuracies are the same). AdamW's second moment is stored as its square root (PackedPlan
// in kernels.h): stored as it is, a value 1e-7 below its block's largest became 0 under a
// momentum that was not, the step momentum / eps threw runs of fashion.cfg off (81.7% and
// 10% against 88.0%; bench/RESULTS.md).
//
// bf16: each value rounded to bfloat16 (fp32's top 16 bits, round to nearest even).
//
// The functions are HOST_DEVICE: the CPU, the CUDA kernels and their host replay run the
// same code (nn/hostdevice.h).
#ifndef NN_QUANT_H
#define NN_QUANT_H

#include <stdint.h>
#include <string.h>

#include "hostdevice.h"

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

#endif
