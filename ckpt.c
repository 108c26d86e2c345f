// ckpt.c: the checkpoint tool. ./ckpt ls FILE | diff A B | rename IN OUT OLD=NEW ... |
// export IN OUT
//
// Lists a checkpoint (or any safetensors file), compares two tensor by tensor, renames
// layers in one (keys, optimizer keys and the stored cfg) so that it loads into a renamed
// model, and exports its plain state_dict for PyTorch. Exit status: 0 ok; 1 "different" (diff) or "nothing renamed" (rename); 2 errors,
// with "ckpt: <message>" on stderr.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/cfg.h"
#include "nn/checkpoint.h"
#include "nn/layer.h"
#include "nn/safetensors.h"

#define SYNOPSIS               \
    "usage: ./ckpt ls FILE\n"  \
    "       ./ckpt diff A B\n" \
    "       ./ckpt rename IN OUT OLD=NEW [OLD=NEW ...] [--prefix | --whole]\n" \
    "       ./ckpt export IN OUT\n"

static void usage(FILE *f) {
    fprintf(
        f, SYNOPSIS
        "\n"
        "cnn.c's checkpoint tool, for checkpoints that ./train writes (safetensors files).\n"
        "\n"
        "  ls FILE      every tensor with its dtype, shape and bytes; the parameter and\n"
        "               optimizer totals; the metadata: format, epoch, step, best_val_acc,\n"
        "               classes and the cfg the run used. Any safetensors file can be listed.\n"
        "  diff A B     per tensor the largest absolute and relative difference, or \"only\n"
        "               in A\", \"only in B\", \"shape differs\"; then the metadata that\n"
        "               differs. Exit 0 if the tensors are identical, 1 if not.\n"
        "  rename IN OUT OLD=NEW ...\n"
        "               copies IN to OUT with its layers renamed: in the parameter keys\n"
        "               (conv1.weight), the optimizer keys (optimizer.conv1.weight.square_avg)\n"
        "               and the layer names of the stored cfg, so that OUT loads into the\n"
        "               renamed model. OLD=NEW replaces every occurrence of OLD in a layer\n"
        "               name, like renaming a PyTorch state_dict's keys; rules apply in order.\n"
        "    --prefix   replace OLD only at the start of a layer name\n"
        "    --whole    rename only the layer (module) called exactly OLD, with the layers\n"
        "               inside it (OLD.*: a residual block's)\n"
        "               Refuses a renaming that makes two keys or two layers the same or a\n"
        "               name invalid, and OUT = IN; never modifies IN. Exit 1, writing\n"
        "               nothing, if no key matched.\n"
        "  export IN OUT\n"
        "               writes the model's state_dict of IN to OUT: the parameters and the\n"
        "               batchnorm buffers as stored, no optimizer state and no metadata, the\n"
        "               file PyTorch's load_state_dict(strict=True) takes as is. Refuses\n"
        "               OUT = IN.\n"
        "  -h, --help   this text\n"
        "\n"
        "Exit status: 0 done; 1 the tensors differ (diff) or no key matched (rename);\n"
        "2 an error (the message says which file and what is wrong).\n");
}

static int fail(const char *msg) {
    fprintf(stderr, "ckpt: %s\n", msg);
    return 2;
}

// A usage error: the message, the synopsis, exit status 2.
static int usage_error(const char *what) {
    fprintf(stderr, "ckpt: %s\n" SYNOPSIS "(./ckpt --help says more)\n", what);
    return 2;
}

static bool is_opt(const char *key) {
    return strncmp(key, CHECKPOINT_OPTIMIZER_PREFIX, strlen(CHECKPOINT_OPTIMIZER_PREFIX)) == 0;
}

// "[64, 9216]" into buf (always terminated).
static const char *shape_str(char *buf, size_t cap, const StEntry *e) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < e->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)e->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

// ---- ls -------------------------------------------------------------------------------------

static void print_entries(const StFile *f, bool optimizer, int width) {
    for (int i = 0; i < f->count; i++) {
        const StEntry *e = &f->entries[i];
        if (is_opt(e->name) != optimizer) continue;
        char shape[160];
        printf("  %-*s  %-7s %-20s %12zu\n", width, e->name, st_dtype_names[e->dtype],
               shape_str(shape, sizeof shape, e), e->bytes);
    }
}

// Prints a metadata value and a line break, continuation lines indented by `indent`
// spaces (empty lines stay empty).
static void print_value(const char *v, int indent) {
    for (const char *p = v; *p; p++) {
        putchar(*p);
        if (*p == '\n' && p[1] && p[1] != '\n') printf("%*s", indent, "");
    }
    if (!*v || v[strlen(v) - 1] != '\n') putchar('\n');
}

static int cmd_ls(const char *file) {
    StFile f;
    Error err = {{0}};
    if (st_open(&f, file, &err)) return fail(err.msg);
    int width = 24;
    for (int i = 0; i < f.count; i++) {
        int n = (int)strlen(f.entries[i].name);
        if (n > width) width = n < 60 ? n : 60;
    }
    int nmodel = 0, nopt = 0;
    int64_t values = 0;
    size_t model_bytes = 0, opt_bytes = 0;
    for (int i = 0; i < f.count; i++) {
        const StEntry *e = &f.entries[i];
        if (is_opt(e->name)) {
            nopt++;
            opt_bytes += e->bytes;
        } else {
            nmodel++;
            values += st_numel(e);
            model_bytes += e->bytes;
        }
    }
    printf("%s: %d tensors, %zu bytes\n", file, f.count, f.file_bytes);
    printf("  %-*s  %-7s %-20s %12s\n", width, "key", "dtype", "shape", "bytes");
    print_entries(&f, false, width);
    print_entries(&f, true, width);
    printf("parameters: %d tensors, %lld values, %zu bytes\n", nmodel, (long long)values,
           model_bytes);
    printf("optimizer:  %d tensors, %zu bytes\n", nopt, opt_bytes);

    if (!f.nmeta) {
        printf("metadata:   none (not a cnn.c checkpoint)\n");
        st_close(&f);
        return 0;
    }
    printf("metadata:\n");
    if (!st_meta(&f, "format")) printf("  (no \"format\": not a cnn.c checkpoint)\n");
    static const char *const known[] = {"format",     "epoch",         "batch",
                                        "step",       "seed",          "best_val_acc",
                                        "epoch_loss", "epoch_correct", "epoch_seen"};
    const int nknown = sizeof known / sizeof known[0];
    for (int k = 0; k < nknown; k++) {
        const char *v = st_meta(&f, known[k]);
        if (!v) continue;
        printf("  %-14s %s%s\n", known[k], v,
               !strcmp(known[k], "best_val_acc") && !strcmp(v, "-1") ? " (none yet)" : "");
    }
    const char *classes = st_meta(&f, "classes");
    if (classes) {
        int n = *classes ? 1 : 0;
        for (const char *p = classes; *p; p++) n += *p == '\n';
        printf("  %-14s %d", "classes", n);
        const char *p = classes;
        for (int i = 0; i < n && i < 6; i++) {
            const char *nl = strchr(p, '\n');
            int len = nl ? (int)(nl - p) : (int)strlen(p);
            printf("%s%.*s", i ? ", " : ": ", len, p);
            p += len + 1;
        }
        printf("%s\n", n > 6 ? ", ..." : "");
    }
    // Anything else the file carries, then the cfg.
    for (int i = 0; i < f.nmeta; i++) {
        const char *key = f.meta[i].key;
        bool skip = !strcmp(key, "classes") || !strcmp(key, "cfg");
        for (int k = 0; k < nknown && !skip; k++) skip = !strcmp(key, known[k]);
        if (skip) continue;
        printf("  %-14s ", key);
        print_value(f.meta[i].value, 17);
    }
    const char *cfg = st_meta(&f, "cfg");
    if (cfg) {
        printf("  cfg:\n%s", *cfg && *cfg != '\n' ? "    " : "");
        print_value(cfg, 4);
    }
    const bool is_checkpoint = st_meta(&f, "format") != NULL;
    st_close(&f);
    if (!is_checkpoint) return 0;
    // The metadata as ./train checks it before any use: a file that fails here is refused by
    // every command (exit status 1).
    if (checkpoint_read_info(file, NULL, NULL, &err)) {
        printf("check: the metadata is not one ./train takes: %s\n", err.msg);
        return 1;
    }
    printf("check: the metadata is valid\n");
    return 0;
}

// ---- diff -----------------------------------------------------------------------------------

static double f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static double e4m3_value(uint8_t b) {  // float8_e4m3fn: no infinities, S.1111.111 is NaN
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(m + 8, e - 10);
    return b & 0x80 ? -v : v;
}

// Element i of an entry, as a double.
static double value_at(const StEntry *e, int64_t i) {
    const unsigned char *p = (const unsigned char *)e->data + (size_t)i * st_dtype_sizes[e->dtype];
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } x;
    memcpy(&x, p, st_dtype_sizes[e->dtype]);
    switch (e->dtype) {
        case ST_BOOL:
        case ST_U8:
            return x.u8;
        case ST_I8:
            return x.i8;
        case ST_F8_E5M2:
            return f16_value((uint16_t)(x.u8 << 8));
        case ST_F8_E4M3:
            return e4m3_value(x.u8);
        case ST_I16:
            return x.i16;
        case ST_U16:
            return x.u16;
        case ST_F16:
            return f16_value(x.u16);
        case ST_BF16: {
            uint32_t bits = (uint32_t)x.u16 << 16;
            float f;
            memcpy(&f, &bits, 4);
            return f;
        }
        case ST_I32:
            return x.i32;
        case ST_U32:
            return x.u32;
        case ST_F32:
            return x.f32;
        case ST_F64:
            return x.f64;
        case ST_I64:
            return (double)x.i64;
        case ST_U64:
            return (double)x.u64;
        default:
            return NAN;
    }
}

// The largest |a - b| and |a - b| / max(|a|, |b|) over the elements (NaN equals NaN).
static void max_diffs(const StEntry *a, const StEntry *b, double *abs_d, double *rel_d) {
    *abs_d = *rel_d = 0;
    int64_t n = st_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = value_at(a, i), y = value_at(b, i);
        if (x == y || (isnan(x) && isnan(y))) continue;
        double d = isnan(x) || isnan(y) ? INFINITY : fabs(x - y);  // x != y: d > 0
        double r = isinf(d) ? INFINITY : d / fmax(fabs(x), fabs(y));
        if (d > *abs_d) *abs_d = d;
        if (r > *rel_d) *rel_d = r;
    }
}

static int cmd_diff(const char *pa, const char *pb) {
    StFile a, b;
    Error err = {{0}};
    if (st_open(&a, pa, &err)) return fail(err.msg);
    if (st_open(&b, pb, &err)) {
        st_close(&a);
        return fail(err.msg);
    }
    printf("A = %s\nB = %s\n", pa, pb);
    int width = 24;
    for (int i = 0; i < a.count + b.count; i++) {
        const char *n = i < a.count ? a.entries[i].name : b.entries[i - a.count].name;
        int len = (int)strlen(n);
        if (len > width) width = len < 60 ? len : 60;
    }
    int same = 0, differ = 0, only_a = 0, only_b = 0, shape = 0;
    // Both entry lists are sorted by name: merge them.
    for (int i = 0, j = 0; i < a.count || j < b.count;) {
        int c = i == a.count ? 1 : j == b.count ? -1 : strcmp(a.entries[i].name, b.entries[j].name);
        const StEntry *ea = c <= 0 ? &a.entries[i] : NULL, *eb = c >= 0 ? &b.entries[j] : NULL;
        const char *name = c <= 0 ? a.entries[i].name : b.entries[j].name;
        i += c <= 0;
        j += c >= 0;
        printf("  %-*s  ", width, name);
        if (!eb) {
            printf("only in A\n");
            only_a++;
            continue;
        }
        if (!ea) {
            printf("only in B\n");
            only_b++;
            continue;
        }
        bool same_shape = ea->ndim == eb->ndim;
        for (int d = 0; same_shape && d < ea->ndim; d++) same_shape = ea->shape[d] == eb->shape[d];
        if (!same_shape) {
            char sa[160], sb[160];
            printf("shape differs: %s in A, %s in B\n", shape_str(sa, sizeof sa, ea),
                   shape_str(sb, sizeof sb, eb));
            shape++;
            continue;
        }
        bool bits =
            ea->dtype == eb->dtype && (!ea->bytes || !memcmp(ea->data, eb->data, ea->bytes));
        if (bits) {
            printf("identical\n");
            same++;
            continue;
        }
        differ++;
        double ad, rd;
        max_diffs(ea, eb, &ad, &rd);
        if (ea->dtype != eb->dtype)
            printf("%s in A, %s in B: ", st_dtype_names[ea->dtype], st_dtype_names[eb->dtype]);
        if (ad == 0)
            printf("equal values, different bits (-0 and 0, or NaNs)\n");
        else
            printf("max abs %.6g  max rel %.6g\n", ad, rd);
    }
    printf("tensors: %d identical, %d differ, %d shape differs, %d only in A, %d only in B\n", same,
           differ, shape, only_a, only_b);
    // Metadata that differs (informative: the exit status is about the tensors).
    for (int i = 0, j = 0; i < a.nmeta || j < b.nmeta;) {
        int c = i == a.nmeta ? 1 : j == b.nmeta ? -1 : strcmp(a.meta[i].key, b.meta[j].key);
        const StMeta *ma = c <= 0 ? &a.meta[i] : NULL, *mb = c >= 0 ? &b.meta[j] : NULL;
        i += c <= 0;
        j += c >= 0;
        if (ma && mb && !strcmp(ma->value, mb->value)) continue;
        const char *key = ma ? ma->key : mb->key;
        bool multi = (ma && strchr(ma->value, '\n')) || (mb && strchr(mb->value, '\n'));
        if (!ma || !mb)
            printf("metadata \"%s\": only in %s\n", key, ma ? "A" : "B");
        else if (multi)
            printf("metadata \"%s\" differs\n", key);
        else
            printf("metadata \"%s\": %s in A, %s in B\n", key, ma->value, mb->value);
    }
    st_close(&a);
    st_close(&b);
    return differ || only_a || only_b || shape ? 1 : 0;
}

// ---- rename ---------------------------------------------------------------------------------

// The layer names of a checkpoint's stored cfg, in section order (NULL for [train] and
// [data]); *n sections. Returns NULL if the cfg cannot be read (the caller skips them).
static char **cfg_layer_names(const char *file, int *n) {
    CheckpointInfo info;
    Error err = {{0}};
    *n = 0;
    if (checkpoint_read_info(file, &info, NULL, &err)) return NULL;
    Cfg cfg;
    char **names = NULL;
    if (!cfg_parse(&cfg, info.cfg_text, file, &err)) {
        names = calloc((size_t)cfg.nsections + 1, sizeof *names);
        for (int i = 0; names && i < cfg.nsections; i++) {
            const CfgSection *s = &cfg.sections[i];
            if (!layer_is_section(s)) continue;
            names[i] = malloc(LAYER_NAME_MAX);
            if (names[i]) layer_section_name(&cfg, s, names[i], LAYER_NAME_MAX);
        }
        if (names) *n = cfg.nsections;
        cfg_free(&cfg);
    }
    checkpoint_info_free(&info);
    return names;
}

static void free_names(char **names, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

static int cmd_rename(int argc, char **argv) {
    RenameMode mode = RENAME_SUBSTRING;
    const char *mode_flag = NULL, *in = NULL, *out = NULL;
    RenameRule *rules = calloc((size_t)argc, sizeof *rules);
    if (!rules) return fail("out of memory");
    int nrules = 0, rc = 2;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--prefix") || !strcmp(a, "--whole")) {
            if (mode_flag && strcmp(mode_flag, a)) {
                rc = usage_error("rename: --prefix and --whole exclude each other");
                goto done;
            }
            mode_flag = a;
            mode = a[2] == 'p' ? RENAME_PREFIX : RENAME_WHOLE;
        } else if (a[0] == '-' && a[1] == '-') {
            char msg[256];
            snprintf(msg, sizeof msg, "rename: unknown option '%.100s'", a);
            rc = usage_error(msg);
            goto done;
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            char *eq = strchr(a, '=');
            if (!eq || eq == a) {
                char msg[256];
                snprintf(msg, sizeof msg,
                         "rename: '%.100s' is not a rule OLD=NEW (with a non-empty OLD)", a);
                rc = usage_error(msg);
                goto done;
            }
            *eq = '\0';  // argv is ours to split
            rules[nrules++] = (RenameRule){a, eq + 1};
        }
    }
    if (!in || !out || !nrules) {
        rc = usage_error("rename needs IN, OUT and at least one rule OLD=NEW");
        goto done;
    }
    int renamed = 0;
    Error err = {{0}};
    if (checkpoint_rename(in, out, rules, nrules, mode, &renamed, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    if (!renamed) {
        fprintf(stderr, "ckpt: no key matched %s",
                mode == RENAME_WHOLE    ? "the whole-name rule"
                : mode == RENAME_PREFIX ? "the prefix rule"
                                        : "the rule");
        for (int r = 0; r < nrules; r++)
            fprintf(stderr, "%s%s=%s", r ? ", " : " ", rules[r].from, rules[r].to);
        fprintf(stderr, " in %s; nothing was written (`./ckpt ls %s` lists its keys)\n", in, in);
        rc = 1;
        goto done;
    }
    // Tell what changed: every key, then the layers of the stored cfg.
    StFile f;
    if (st_open(&f, in, &err)) {
        rc = fail(err.msg);
        goto done;
    }
    for (int i = 0; i < f.count; i++) {
        char to[TENSOR_NAME_MAX];
        if (checkpoint_rename_key(f.entries[i].name, rules, nrules, mode, to, sizeof to) == 1)
            printf("  %s -> %s\n", f.entries[i].name, to);
    }
    st_close(&f);
    int na, nb;
    char **la = cfg_layer_names(in, &na), **lb = cfg_layer_names(out, &nb);
    if (la && lb && na == nb)
        for (int i = 0; i < na; i++)
            if (la[i] && lb[i] && strcmp(la[i], lb[i]))
                printf("  cfg layer %s -> %s\n", la[i], lb[i]);
    free_names(la, na);
    free_names(lb, nb);
    printf("renamed %d key%s; wrote %s\n", renamed, renamed == 1 ? "" : "s", out);
    rc = 0;
done:
    free(rules);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage_error("no command given");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "ls")) {
        if (argc != 3) return usage_error("ls takes one FILE");
        return cmd_ls(argv[2]);
    }
    if (!strcmp(cmd, "diff")) {
        if (argc != 4) return usage_error("diff takes two files, A and B");
        return cmd_diff(argv[2], argv[3]);
    }
    if (!strcmp(cmd, "rename")) return cmd_rename(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) {
        if (argc != 4) return usage_error("export takes IN and OUT");
        int n;
        Error err = {{0}};
        if (checkpoint_export(argv[2], argv[3], &n, &err)) return fail(err.msg);
        printf("wrote %s: %d tensors, the state_dict without optimizer state or metadata\n", argv[3], n);
        return 0;
    }
    char msg[256];
    snprintf(msg, sizeof msg, "unknown command '%.100s' (ls, diff, rename, export)", cmd);
    return usage_error(msg);
}
