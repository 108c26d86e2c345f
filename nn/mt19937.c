// mt19937.c: MT19937 (Matsumoto and Nishimura, 1998) and PyTorch's float uniform draw.
#include "mt19937.h"

enum { MT_M = 397 };
#define MT_MATRIX_A 0x9908b0dfU
#define MT_UPPER 0x80000000U
#define MT_LOWER 0x7fffffffU

void mt19937_seed(Mt19937 *mt, uint32_t seed) {
    mt->state[0] = seed;
    for (uint32_t i = 1; i < MT19937_N; i++)
        mt->state[i] = 1812433253U * (mt->state[i - 1] ^ (mt->state[i - 1] >> 30)) + i;
    mt->next = MT19937_N;
}

static uint32_t mt_twist(uint32_t upper, uint32_t lower, uint32_t far) {
    const uint32_t y = (upper & MT_UPPER) | (lower & MT_LOWER);
    return far ^ (y >> 1) ^ ((y & 1U) ? MT_MATRIX_A : 0U);
}

static void mt_regenerate(Mt19937 *mt) {
    uint32_t *s = mt->state;
    for (int i = 0; i < MT19937_N; i++)
        s[i] = mt_twist(s[i], s[(i + 1) % MT19937_N], s[(i + MT_M) % MT19937_N]);
    mt->next = 0;
}

uint32_t mt19937_u32(Mt19937 *mt) {
    if (mt->next >= MT19937_N) mt_regenerate(mt);
    uint32_t y = mt->state[mt->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= y >> 18;
    return y;
}

float mt19937_uniform(Mt19937 *mt, float from, float to) {
    const double x = (double)(mt19937_u32(mt) & 0xffffffU) / 16777216.0;
    return (float)(x * ((double)to - (double)from) + (double)from);
}
