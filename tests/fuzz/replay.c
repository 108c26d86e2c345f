// replay.c: runs a fuzz target over files and folders of inputs without libFuzzer, for
// `make test` (the seeds and the crashes found before) and to reproduce one crash:
//   build/tests/fuzz_replay_image tests/fuzz/regress/image/crash-...
#include "fuzz.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 1;
}

// Files directly in a folder (libFuzzer's corpus layout), in any order.
static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st)) return 0;  // a target without regressions yet
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        const int r = run_file(p);
        if (r < 0) {
            closedir(d);
            return -1;
        }
        n += r;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const int r = run_path(argv[i]);
        if (r < 0) return 1;
        n += r;
    }
    printf("%s: %d inputs ran\n", argv[0], n);
    return 0;
}
