// Image decoding as a folder data set reads an image (image_load): PNG, JPEG (libjpeg-turbo
// at a DCT scale), BMP, GIF, TGA, PNM, ...; gray, RGB, alpha; resized to the target.
//
// Input: a byte: bit 0 the channels (1 or 3), bits 1-7 the target's side (1 to 128); then
// the file. A bad file is DATASET_BAD with a message; never a crash, never a hang.
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "../../data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Shape s = {.c = data[0] & 1 ? 3 : 1, .h = (data[0] >> 1) + 1, .w = (data[0] >> 1) + 1};
    const char *path = fuzz_file(0, "image", data + 1, size - 1);
    uint8_t *out = malloc((size_t)s.c * s.h * s.w);
    if (!out) return 0;
    Error err = {{0}};
    const int rc = image_load(path, s, out, &err);
    if (rc && !strstr(err.msg, path)) abort();  // every error names the file
    free(out);
    return 0;
}
