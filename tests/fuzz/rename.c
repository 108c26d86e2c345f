// The rename rules of ./ckpt rename: the renaming of keys (checkpoint_rename_key) and of a
// whole checkpoint, its optimizer keys and the layer names in its stored cfg
// (checkpoint_rename), which must refuse what would make keys collide or names invalid.
//
// Input lines: the first is the mode (its first byte % 3: substring, prefix, whole), then
// rules OLD=NEW, then after a line "%%" keys to rename.
#include "fuzz.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../nn/checkpoint.h"
#include "../../nn/kernels.h"
#include "../../nn/net.h"
#include "../../nn/safetensors.h"

static const char *cfg_text =
    "[train]\nbatch = 2\n"
    "[conv]\nname = conv1\nfilters = 2\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nfilters = 2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = 3\n[log_softmax]\n";

// A small checkpoint to rename, written once.
static const char *checkpoint(void) {
    static char path[4096];
    if (path[0]) return path;
    snprintf(path, sizeof path, "%s/ckpt.safetensors", fuzz_dir());
    Cfg cfg;
    Net net;
    Error err = {{0}};
    static const char *const states[] = {"square_avg", "acc_delta"};
    const NetOptions opt = {.batch = 2, .opt_states = 2, .opt_state_names = states};
    if (cfg_parse(&cfg, cfg_text, "fuzz", &err) ||
        net_create(&net, &cfg, (Shape){.c = 1, .h = 4, .w = 4}, 3, &opt, cpu_kernels(), &err))
        abort();
    char *names[3] = {"a", "b", "c"};
    const TrainState st = {.loss_scale = 1, .best_val_acc = -1};
    const CheckpointInfo info = {.cfg_text = (char *)cfg_text, .class_names = names, .classes = 3};
    if (checkpoint_save(path, &net, &st, &info, &err)) abort();
    net_free(&net);
    cfg_free(&cfg);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    const RenameMode mode = (RenameMode)((unsigned char)text[0] % 3);
    RenameRule rules[16];
    int nrules = 0;
    char *keys = strstr(text, "\n%%\n");
    if (keys) *keys = 0, keys += 4;
    char *line = strchr(text, '\n');
    for (line = line ? line + 1 : NULL; line && *line && nrules < 16;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *eq = strchr(line, '=');
        if (eq) *eq = 0, rules[nrules++] = (RenameRule){line, eq + 1};
        line = nl ? nl + 1 : NULL;
    }
    for (char *k = keys; k && *k;) {
        char *nl = strchr(k, '\n');
        if (nl) *nl = 0;
        char out[256];
        const int r = checkpoint_rename_key(k, rules, nrules, mode, out, sizeof out);
        if (r == 1 && !strcmp(out, k)) abort();  // "renamed" means changed
        k = nl ? nl + 1 : NULL;
    }
    if (nrules) {
        char out[4200];
        snprintf(out, sizeof out, "%s/renamed.safetensors", fuzz_dir());
        int renamed;
        Error err = {{0}};
        if (checkpoint_rename(checkpoint(), out, rules, nrules, mode, &renamed, &err) == 0 && renamed) {
            CheckpointInfo info;  // what it wrote reads back, its cfg too
            if (checkpoint_read_info(out, &info, NULL, &err)) abort();
            Cfg cfg;
            if (cfg_parse(&cfg, info.cfg_text, out, &err)) abort();
            cfg_free(&cfg);
            checkpoint_info_free(&info);
        }
    }
    free(text);
    return 0;
}
