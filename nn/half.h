// half.h: IEEE 754 binary16 <-> binary32, portable scalar reference.
//
// Round to nearest, ties to even; overflow rounds to infinity; NaN stays a quiet NaN
// with the payload's top bits. These are exactly the results of the F16C instructions
// (vcvtps2ph with round-to-nearest, vcvtph2ps), which the CPU backend uses where the
// build targets them; the tests compare the two over all 65,536 halves.
#ifndef NN_HALF_H
#define NN_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint16_t half_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));  // NaN
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 rounds to inf
    uint32_t k, rem, half;
    if (absx >= 0x38800000u) {  // a normal half: rebias the exponent, keep 10 mantissa bits
        const uint32_t r = absx - 0x38000000u;
        k = r >> 13, rem = r & 0x1fffu, half = 0x1000u;
    } else {  // subnormal (or zero): k units of 2^-24
        if (absx <= 0x33000000u) return (uint16_t)sign;  // <= 2^-25: ties to even, 0
        const uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u, shift = 126u - e;
        k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    }
    if (rem > half || (rem == half && (k & 1u))) k++;  // a carry into the exponent is right
    return (uint16_t)(sign | k);
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);  // inf, or a quiet NaN
    } else if (e) {
        x = sign | ((e + 112u) << 23) | (m << 13);
    } else if (!m) {
        x = sign;
    } else {  // subnormal: normalise
        e = 113u;
        while (!(m & 0x400u)) m <<= 1, e--;
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

#endif
