// cuda_loader.c: the CUDA backend is a shared library (libcnn_cuda.so, built from gpu/
// when nvcc is found) loaded on the first use of device=cuda. A CPU run never maps the
// CUDA runtime and cuBLAS, which would cost it some 200 MB of resident memory.
//
// The library is looked for next to the executable, then where this build put it
// (CNN_CUDA_LIB, set by the Makefile), then on the loader's path.
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "file.h"
#include "kernels.h"

#ifndef CNN_CUDA_LIB
#define CNN_CUDA_LIB "libcnn_cuda.so"
#endif

typedef const Kernels *(*TableFn)(Error *err);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static TableFn table_fn;
static char load_error[512];

static void load(void) {
    char path[PATH_MAX], tried[3][PATH_MAX + 32];
    int ntried = 0;
    if (!file_exe_dir(path, sizeof path))
        snprintf(tried[ntried++], sizeof tried[0], "%s/libcnn_cuda.so", path);
    snprintf(tried[ntried++], sizeof tried[0], "%s", CNN_CUDA_LIB);
    snprintf(tried[ntried++], sizeof tried[0], "libcnn_cuda.so");
    const char *why = "";
    for (int i = 0; i < ntried; i++) {
        void *h = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            why = dlerror();
            continue;
        }
        table_fn = (TableFn)(uintptr_t)dlsym(h, "cnn_cuda_kernels");
        if (table_fn) return;
        why = dlerror();
        dlclose(h);
    }
    snprintf(load_error, sizeof load_error, "%s", why ? why : "not found");
}

const Kernels *cuda_kernels(Error *err) {
    pthread_once(&once, load);
    if (table_fn) return table_fn(err);
    err_set(err, "device=cuda: this build of cnn.c has no CUDA backend (libcnn_cuda.so: %s); "
                 "install the CUDA toolkit (nvcc) and rebuild with `make clean all`, or use "
                 "device=cpu", load_error);
    return NULL;
}
