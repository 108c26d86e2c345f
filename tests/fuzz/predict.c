// A (checkpoint, image) pair through ./train --predict's code path (cli/predict.c): the
// checkpoint's metadata checked, its stored cfg read, the network planned against a
// memory limit, built and loaded, the image decoded to the input the metadata gives (JPEG
// at a DCT scale or by the DC path, PNG, PNM, ...), normalised and classified. Whatever
// the two files hold, the answer is a prediction or an error naming a file: never a crash,
// a write out of bounds or a hang.
//
// Input: a byte of options (bit 0: --json, bits 1-3: --top - 1), the checkpoint's length
// n as 4 bytes little-endian, the checkpoint (n bytes, or what is there), then the image.
#include "fuzz.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../cli/predict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    size_t n = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 | (size_t)data[4] << 24;
    if (n > size - 5) n = size - 5;
    const char *ckpt = fuzz_file(0, "model.safetensors", data + 5, n);
    char *image = (char *)fuzz_file(1, "image", data + 5 + n, size - 5 - n);
    const PredictOptions po = {.json = data[0] & 1, .top = 1 + (data[0] >> 1 & 7),
                               .memory = 256u << 20};
    Error err = {{0}};
    // The predictions are not what is checked: stdout goes to /dev/null meanwhile.
    fflush(stdout);
    const int saved = dup(STDOUT_FILENO), null = open("/dev/null", O_WRONLY);
    if (saved < 0 || null < 0 || dup2(null, STDOUT_FILENO) < 0) abort();
    close(null);
    const int failed = predict(ckpt, &po, 1, &image, &err);
    fflush(stdout);
    if (dup2(saved, STDOUT_FILENO) < 0) abort();
    close(saved);
    if (getenv("FUZZ_PREDICT_VERBOSE"))
        fprintf(stderr, "predict: %s\n", failed < 0 ? err.msg : failed ? "the image is bad" : "ok");
    if (failed < 0 && !err.msg[0]) abort();  // every error says what went wrong
    return 0;
}
