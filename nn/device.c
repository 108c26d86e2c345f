// device.c: picks a kernel table by device name.
#include <string.h>

#include "kernels.h"

const Kernels *kernels_for_device(const char *device, Error *err) {
    if (strcmp(device, "cpu") == 0) return cpu_kernels();
    if (strcmp(device, "cuda") == 0) return cuda_kernels(err);
    err_set(err, "unknown device '%s': expected cpu or cuda", device);
    return NULL;
}
