// fuzz_util.c: files and the small ResNet for the fuzz targets (fuzz.h).
#include "fuzz.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../nn/kernels.h"

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

const char fuzz_resnet_cfg[] =
    "[train]\nbatch = 2\n"
    "[conv]\nname = conv1\nfilters = 3\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nfilters = 4\nstride = 2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 5\n[log_softmax]\n";

int fuzz_resnet_create(Net *net, Error *err) {
    Cfg cfg;
    static const char *const states[] = {"square_avg", "acc_delta"};  // Adadelta's
    const NetOptions opt = {.batch = 2, .opt_states = 2, .opt_state_names = states};
    if (cfg_parse(&cfg, fuzz_resnet_cfg, "fuzz", err)) return -1;
    const int rc = net_create(net, &cfg, (Shape){.c = 1, .h = 8, .w = 8}, 5, &opt, cpu_kernels(), err);
    cfg_free(&cfg);
    return rc;
}
