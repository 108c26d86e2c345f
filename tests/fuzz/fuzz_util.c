// fuzz_util.c: files for the fuzz targets (fuzz.h).
#include "fuzz.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char dir[64];

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "fuzz: could not remove %s\n", dir);
}

const char *fuzz_dir(void) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/cnn-fuzz-%ld", (long)getpid());
        char cmd[128];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
        if (system(cmd)) abort();
        atexit(remove_dir);
    }
    return dir;
}

const char *fuzz_file(int slot, const char *name, const void *data, size_t size) {
    static char path[4][PATH_MAX];
    snprintf(path[slot], sizeof path[slot], "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path[slot], "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
    return path[slot];
}
