// The IDX reader, raw and gzip (a file starting with 1f 8b is inflated), through the data
// set: open, then the first and the last sample and their labels.
//
// Input: two bytes n (little-endian), then the images file (the next n % (size - 1) bytes)
// and the labels file (the rest).
#include "fuzz.h"

#include <stdlib.h>

#include "../../data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const size_t cut = ((size_t)data[0] | (size_t)data[1] << 8) % (size - 2);
    const char *images = fuzz_file(0, "images", data + 2, cut);
    const char *labels = fuzz_file(1, "labels", data + 2 + cut, size - 2 - cut);
    Dataset *ds;
    Error err = {{0}};
    if (idx_dataset_open(&ds, images, labels, &err)) return 0;
    const int64_t n = (int64_t)ds->shape.c * ds->shape.h * ds->shape.w;
    uint8_t *px = n > 0 && n < (1 << 24) ? malloc((size_t)n) : NULL;
    const int64_t which[2] = {0, ds->count - 1};
    for (int i = 0; i < 2 && px && ds->count > 0; i++) {
        int32_t y;
        if (ds->ops->read(ds, which[i], px, &y, &err) == 0 && (y < 0 || y >= ds->classes)) abort();
        if (ds->ops->label(ds, which[i], &y, &err) == 0 && (y < 0 || y >= ds->classes)) abort();
    }
    free(px);
    dataset_close(ds);
    return 0;
}
