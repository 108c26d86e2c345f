// fuzz.h: what the fuzz targets of tests/fuzz share (make fuzz; README "Fuzzing").
//
// Each target defines LLVMFuzzerTestOneInput. Built with clang's libFuzzer for `make fuzz`,
// and with replay.c's main for `make test`, which runs every target over its seeds
// (seeds.c writes them) and over the crashes found before (tests/fuzz/regress/TARGET/).
#ifndef TESTS_FUZZ_FUZZ_H
#define TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "../../nn/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A private folder for the files a target writes (made on first use, per process).
const char *fuzz_dir(void);
// Writes data to fuzz_dir()/name and returns the path (a static buffer per name slot 0-3).
const char *fuzz_file(int slot, const char *name, const void *data, size_t size);

// The small ResNet that the safetensors target loads files into and seeds.c writes its
// checkpoints from (a stem without bias, batchnorm buffers with I64 counters, a
// downsampling block, a classifier; 1x8x8 inputs, 5 classes, batch 2, Adadelta's state):
// its cfg text, and the network built from it on the CPU.
extern const char fuzz_resnet_cfg[];
int fuzz_resnet_create(Net *net, Error *err);

#endif
