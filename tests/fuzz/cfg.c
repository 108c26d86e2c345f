// The cfg parser, command-line style overrides, the text a checkpoint stores, and every
// layer's, [train]'s and [data]'s reading of its keys (a network planned, not allocated).
//
// Input: cfg text, then optionally a line "%%" and override lines KEY=VALUE or
// SECTION.KEY=VALUE (an empty VALUE unsets the key), applied by ./train's own override
// parser (cli/options.c). Properties: no crash, no sanitizer report; cfg_to_text of a
// parsed cfg parses back to the same text.
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "../../cli/options.h"
#include "../../data/data_cfg.h"
#include "../../nn/cfg.h"
#include "../../nn/kernels.h"
#include "../../nn/layer.h"
#include "../../nn/net.h"

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
            options_override(&cfg, line, &err);  // ./train's own parser; a refusal is fine
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
        if (net_create(&net, &cfg, (Shape){.c = 3, .h = 16, .w = 16}, 5, &opt, cpu_kernels(), &err) == 0)
            net_free(&net);
        // [train] and [data] as ./train reads them; [data] alone where [train] is missing.
        Options o;
        const CfgSection *d = cfg_section(&cfg, "data");
        if (options_read(&o, &cfg, "fuzz.cfg", DATA_FILES_ALL, &err) && d)
            data_cfg_read(&o.data, &cfg, d, DATA_FILES_ALL, &err);
        cfg_free(&cfg);
    }
    free(text);
    return 0;
}
