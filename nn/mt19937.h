// mt19937.h: the Mersenne Twister as PyTorch's CPU generator runs it, for initialisation.
//
// torch.manual_seed(s) seeds MT19937 with the low 32 bits of s; uniform_(from, to) on a
// float tensor draws one 32-bit word per element, in order, and returns
// (word & 0xffffff) / 2^24 * (to - from) + from computed in double from float bounds.
// With the same draws in the same order, net_init_params gives the very weights
// torch.manual_seed(seed) followed by building the same modules gives.
#ifndef NN_MT19937_H
#define NN_MT19937_H

#include <stdint.h>

#define MT19937_N 624

typedef struct {
    uint32_t state[MT19937_N];
    int next;  // index of the next word of state to temper; MT19937_N: regenerate first
} Mt19937;

void mt19937_seed(Mt19937 *mt, uint32_t seed);
uint32_t mt19937_u32(Mt19937 *mt);
// PyTorch's uniform_(from, to) for one float element.
float mt19937_uniform(Mt19937 *mt, float from, float to);

#endif
