// fuzz.h: what the fuzz targets of tests/fuzz share (make fuzz; README "Fuzzing").
//
// Each target defines LLVMFuzzerTestOneInput. Built with clang's libFuzzer for `make fuzz`,
// and with replay.c's main for `make test`, which runs every target over its seeds
// (seeds.c writes them) and over the crashes found before (tests/fuzz/regress/TARGET/).
#ifndef TESTS_FUZZ_FUZZ_H
#define TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A private folder for the files a target writes (made on first use, per process).
const char *fuzz_dir(void);
// Writes data to fuzz_dir()/name and returns the path (a static buffer per name slot 0-3).
const char *fuzz_file(int slot, const char *name, const void *data, size_t size);

#endif
