// hostdevice.h: HOST_DEVICE marks a function that nvcc compiles for the GPU as well as the
// host (the counter RNG, the loss scaler's rules, AdamW's scalars): the CPU table and the
// CUDA kernels then run the same code. Plain C compilers see nothing.
#ifndef NN_HOSTDEVICE_H
#define NN_HOSTDEVICE_H

#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

#endif
