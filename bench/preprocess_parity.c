// preprocess_parity.c: cnn.c's evaluation preprocessing against torchvision's, for
// bench/preprocess_parity.sh.
//
//   preprocess_parity SHORT CROP FILE...
//
// Reads each FILE as a folder data set with resize = shorter, short_side = SHORT and
// center_crop = CROP does (image_load, 3 channels), and FILE.ref, the same image through
// torchvision's Resize(SHORT) + CenterCrop(CROP) on PIL (tests/preprocess_reference.py
// resize); prints the largest and the mean absolute difference of their bytes over all
// the files, and the share of bytes that differ.
#include <stdio.h>
#include <stdlib.h>

#include "../data/dataset.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: preprocess_parity SHORT CROP FILE...\n");
        return 2;
    }
    const ImageFit fit = {.channels = 3, .resize = RESIZE_SHORTER, .short_side = atoi(argv[1]),
                          .center_crop = atoi(argv[2])};
    Error err;
    if (image_fit_check(&fit, &err)) {
        fprintf(stderr, "preprocess_parity: %s\n", err.msg);
        return 2;
    }
    const size_t n = (size_t)fit.center_crop * fit.center_crop * 3;
    uint8_t *got = malloc(n), *want = malloc(n + 1);
    if (!got || !want) return 1;
    int largest = 0;
    double sum = 0, differ = 0;
    for (int i = 3; i < argc; i++) {
        if (image_load(argv[i], &fit, got, &err)) {
            fprintf(stderr, "preprocess_parity: %s\n", err.msg);
            return 1;
        }
        char ref[4200];
        snprintf(ref, sizeof ref, "%s.ref", argv[i]);
        FILE *f = fopen(ref, "rb");
        if (!f || fread(want, 1, n + 1, f) != n) {
            fprintf(stderr, "preprocess_parity: %s: missing, or not %zu bytes\n", ref, n);
            return 1;
        }
        fclose(f);
        for (size_t k = 0; k < n; k++) {
            const int d = abs(got[k] - want[k]);
            largest = d > largest ? d : largest;
            sum += d;
            differ += d != 0;
        }
    }
    const double values = (double)n * (argc - 3);
    printf("%d images: largest difference %d, mean %.3f, %.1f%% of the bytes differ\n", argc - 3,
           largest, sum / values, 100 * differ / values);
    free(got), free(want);
    return 0;
}
