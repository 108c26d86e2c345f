// The safetensors reader, and a file loaded as weights, as a checkpoint and as its metadata
// into a small ResNet (fuzz.h's), strictly: what does not fit is an error, never a crash;
// the file exported (./ckpt export) and renamed (./ckpt rename), the same.
#include "fuzz.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../nn/checkpoint.h"
#include "../../nn/kernels.h"
#include "../../nn/net.h"
#include "../../nn/safetensors.h"

static Net *network(void) {
    static Net net;
    static bool made;
    if (!made) {
        Error err = {{0}};
        if (fuzz_resnet_create(&net, &err)) abort();
        made = true;
    }
    return &net;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StFile f;
    Error err = {{0}};
    if (st_open_buffer(&f, data, size, "fuzz.safetensors", &err) == 0) {
        for (int i = 0; i < f.count; i++) {
            Tensor t;
            st_as_tensor(&f, &f.entries[i], &t, &err);
            (void)st_numel(&f.entries[i]);
            (void)st_find(&f, f.entries[i].name);
        }
        (void)st_meta(&f, "format");
        st_close(&f);
    }
    const char *path = fuzz_file(0, "in.safetensors", data, size);
    Net *net = network();
    checkpoint_load_weights(path, net, NULL, 0, &err);
    const char *skip[] = {"fc", "layer1"};
    checkpoint_load_weights(path, net, skip, 2, &err);
    TrainState st;
    checkpoint_load_all(path, net, &st, &err);
    CheckpointInfo info;
    if (checkpoint_read_info(path, &info, &st, &err) == 0) checkpoint_info_free(&info);
    bool is_checkpoint;
    checkpoint_probe(path, &is_checkpoint, &err);
    char out[4096];
    snprintf(out, sizeof out, "%s/out.safetensors", fuzz_dir());
    int n;
    checkpoint_export(path, out, &n, &err);
    static const RenameRule rules[] = {{"layer1", "stage1"}, {"fc", "head"}};
    for (int mode = RENAME_SUBSTRING; mode <= RENAME_WHOLE; mode++)
        checkpoint_rename(path, out, rules, 2, (RenameMode)mode, &n, &err);
    return 0;
}
