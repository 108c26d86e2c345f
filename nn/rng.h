// rng.h: the counter-based RNG (DESIGN.md decision 3).
//
// A random number is a pure function of (key, counter): no state to save, the same on
// every device, and a recomputed dropout mask equals the original. Keys are derived
// from (seed, stream, index...) with rng_key; counters are element indices.
#ifndef NN_RNG_H
#define NN_RNG_H

#include <stdint.h>

#include "hostdevice.h"

// SplitMix64's finaliser: a bijective 64-bit mixer with full avalanche.
HOST_DEVICE static inline uint64_t rng_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

// A key from a seed, a stream (below) and two indices, e.g. (seed, RNG_STREAM_DROPOUT,
// step, layer) for a dropout mask.
HOST_DEVICE static inline uint64_t rng_key(uint64_t seed, uint64_t stream, uint64_t a,
                                           uint64_t b) {
    uint64_t k = rng_mix64(seed ^ 0x5851f42d4c957f2dULL);
    k = rng_mix64(k ^ (stream * 0xd6e8feb86659fd93ULL));
    k = rng_mix64(k ^ (a + 0x9e3779b97f4a7c15ULL));
    return rng_mix64(k ^ (b * 0xa0761d6478bd642fULL + 1));
}

HOST_DEVICE static inline uint64_t rng_u64(uint64_t key, uint64_t counter) {
    return rng_mix64(key + (counter + 1) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in [0, 1) with 24 bits, exactly representable as a float.
HOST_DEVICE static inline float rng_uniform(uint64_t key, uint64_t counter) {
    return (float)(rng_u64(key, counter) >> 40) * (1.0f / 16777216.0f);
}

// Streams: the `stream` argument of rng_key, so that uses of one seed never collide.
// (Initialisation uses PyTorch's MT19937 instead: nn/mt19937.h.)
enum {
    RNG_STREAM_DROPOUT = 2,
    RNG_STREAM_SHUFFLE = 3,
    RNG_STREAM_AUGMENT = 4,
    RNG_STREAM_SPLIT = 5,  // val_split's choice of held-out samples
    RNG_STREAM_ACTIVATIONS = 6,  // compressed activations' stochastic rounding (nn/quant.h)
};

#endif
