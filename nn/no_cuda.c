// no_cuda.c: stands in for gpu/ in builds without the CUDA toolkit.
#include "kernels.h"

const Kernels *cuda_kernels(Error *err) {
    err_set(err, "device=cuda: this build of cnn.c has no CUDA backend; install the CUDA "
                 "toolkit (nvcc) and rebuild with `make clean all CUDA=1`, or use device=cpu");
    return NULL;
}
