// Image decoding as a folder data set reads an image (image_load): PNG, JPEG (libjpeg-turbo
// at a DCT scale), BMP, GIF, TGA, PNM, ...; gray, RGB, alpha; resized to the target.
//
// Input: a byte: bit 0 the channels (1 or 3), bits 1-7 the target's side (1 to 128); then
// the file, read three ways: stretched to the side, its shorter side resized to the side
// and the centre half of that cropped (resize = shorter), and a random resized crop of it
// at the side (torchvision's ranges). A bad file is DATASET_BAD with a message naming it;
// never a crash, never a hang. A JPEG is
// also decoded at 1/8 scale by libjpeg-turbo and by the DC path (data/jpeg_eighth.c), which
// must accept only what libjpeg-turbo decodes without a warning, to the same bytes.
#include "fuzz.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "../../data/dataset.h"
#include "../jpeg_reference.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Shape s = {.c = data[0] & 1 ? 3 : 1, .h = (data[0] >> 1) + 1, .w = (data[0] >> 1) + 1};
    const char *path = fuzz_file(0, "image", data + 1, size - 1);
    uint8_t *out = malloc((size_t)s.c * s.h * s.w);
    if (!out) return 0;
    const ImageFit stretch = {.channels = s.c, .width = s.w, .height = s.h};
    const ImageFit shorter = {.channels = s.c, .resize = RESIZE_SHORTER, .short_side = s.w,
                              .center_crop = (s.w + 1) / 2};
    const ResizedCrop crop = {.scale = {0.08, 1}, .ratio = {3.0 / 4.0, 4.0 / 3.0}};
    Error err = {{0}};
    // Every error names the file.
    if (image_load(path, &stretch, out, &err) && !strstr(err.msg, path)) abort();
    if (image_load(path, &shorter, out, &err) && !strstr(err.msg, path)) abort();
    if (image_load_crop(path, &stretch, &crop, size, out, &err) && !strstr(err.msg, path)) abort();
    free(out);
    if (size >= 3 && data[1] == 0xFF && data[2] == 0xD8) {
        static uint8_t a[1 << 22], b[1 << 22];
        int fast;
        bool clean;
        if (!jpeg_reference_agree(data + 1, size - 1, s.c, a, b, sizeof a, &fast, &clean)) abort();
    }
    return 0;
}
