// The cfg parser, command-line style overrides, the text a checkpoint stores, and every
// layer's and the [data] section's reading of its keys (a network planned, not allocated).
//
// Input: cfg text, then optionally a line "%%" and override lines KEY=VALUE or
// SECTION.KEY=VALUE (an empty VALUE unsets the key). Properties: no crash, no sanitizer
// report; cfg_to_text of a parsed cfg parses back to the same text.
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "../../data/data_cfg.h"
#include "../../nn/cfg.h"
#include "../../nn/kernels.h"
#include "../../nn/layer.h"
#include "../../nn/net.h"

static void apply(Cfg *cfg, char *line) {
    char *eq = strchr(line, '=');
    if (!eq || eq == line) return;
    *eq = 0;
    char *dot = strrchr(line, '.'), *key = line;
    CfgSection *s = cfg_section(cfg, "train");
    if (dot) {
        *dot = 0;
        key = dot + 1;
        s = cfg_section(cfg, line);
        if (!s) s = layer_find_section(cfg, line);
    }
    if (!s) return;
    Error err = {{0}};
    if (eq[1]) cfg_set(s, key, eq + 1, &err);
    else cfg_unset(s, key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char *overrides = strstr(text, "\n%%\n");
    if (overrides) *overrides = 0, overrides += 4;
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text, "fuzz.cfg", &err) == 0) {
        for (char *line = overrides; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            apply(&cfg, line);
            line = nl ? nl + 1 : NULL;
        }
        char *out = cfg_to_text(&cfg, &err);
        if (out) {
            Cfg again;
            if (cfg_parse(&again, out, "fuzz.cfg (written)", &err)) abort();  // must read back
            char *out2 = cfg_to_text(&again, &err);
            if (!out2 || strcmp(out, out2)) abort();  // and to the same text
            free(out2);
            cfg_free(&again);
            free(out);
        }
        const NetOptions opt = {.batch = 2, .plan_only = true, .segments = 2, .sweep = true};
        Net net;
        if (net_create(&net, &cfg, (Shape){.c = 3, .h = 16, .w = 16}, 5, &opt, &cpu_kernels, &err) == 0)
            net_free(&net);
        const CfgSection *d = cfg_section(&cfg, "data");
        DataConfig dc;
        if (d) data_cfg_read(&dc, &cfg, d, DATA_FILES_ALL, &err);
        cfg_free(&cfg);
    }
    free(text);
    return 0;
}
