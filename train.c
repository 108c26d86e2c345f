// train.c: the trainer. ./train CFG [key=value ...]
//
// Reads the cfg, applies command-line overrides, opens the data, builds the network on
// the chosen device and trains it with Adadelta on the NLL loss, evaluating on the test
// set after each epoch. Prints a line per epoch and appends it to SAVE/metrics.jsonl.
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/data_cfg.h"
#include "nn/cfg.h"
#include "nn/file.h"
#include "nn/budget.h"
#include "nn/checkpoint.h"
#include "nn/dist.h"
#include "nn/kernels.h"
#include "nn/net.h"
#include "nn/optim.h"
#include "nn/profile.h"
#include "nn/scaler.h"

// The processes of a data-parallel run (nn/dist.h): rank 0 of 1 without mpirun.
static Dist dist;
static int train_main(int argc, char **argv);

// ---- the [train] and [data] sections -------------------------------------------------------

static const CfgKey train_keys[] = {
    {"epochs", "14", "passes over the training set"},
    {"batch", "64", "samples per optimizer step"},
    {"accumulate", "1", "micro-batches per step: activations are sized for batch/accumulate"},
    {"precision", "fp32", "fp32, or fp16: activations and their gradients stored as halves"},
    {"checkpoint", "none", "activation checkpointing: none, sqrt, or a number of segments"},
    {"memory", "", "a budget (512M, 2G, ...): choose checkpointing, then accumulation, then "
                   "(with auto_fp16) fp16, until the plan fits"},
    {"auto_fp16", "0", "1: memory may also switch precision to fp16"},
    {"tf32", "0", "1: GEMM inputs rounded to 10 mantissa bits in fp32 runs too, as fp16 runs "
                  "always do (TF32 tensor cores on CUDA; the CPU computes in fp32 either way)"},
    {"loss_scale", "dynamic", "fp16: dynamic (PyTorch's GradScaler), or a fixed scale"},
    {"init_scale", "65536", "fp16: the dynamic loss scale's initial value"},
    {"growth_interval", "2000", "fp16: clean steps before the dynamic scale doubles"},
    {"optimizer", "adadelta", "adadelta, sgd or adamw: PyTorch's updates and defaults"},
    {"lr", "by optimizer", "learning rate: adadelta 1.0, sgd 0.01, adamw 0.001"},
    {"rho", "0.9", "adadelta: the running averages' coefficient"},
    {"eps", "by optimizer", "adadelta 1e-6, adamw 1e-8: added to the denominator"},
    {"momentum", "0", "sgd: momentum"},
    {"dampening", "0", "sgd: dampening of the momentum"},
    {"nesterov", "0", "sgd: 1 for Nesterov momentum"},
    {"betas", "0.9, 0.999", "adamw: the coefficients of the running averages"},
    {"weight_decay", "by optimizer", "adadelta and sgd (0): L2 penalty added to the gradient; "
                                     "adamw (0.01): decoupled decay"},
    {"decay_skip_norm_bias", "0", "1: no weight decay for biases and batchnorm parameters"},
    {"schedule", "step", "step (StepLR: lr_gamma each epoch) or cosine (annealed each step to "
                         "lr_min over the run)"},
    {"lr_gamma", "0.7", "step: the learning rate is multiplied by this after each epoch"},
    {"lr_min", "0", "cosine: the learning rate at the end of the run"},
    {"warmup", "0", "steps of linear warmup first, from warmup_start * lr (PyTorch's LinearLR)"},
    {"warmup_start", "0.3333333333333333", "warmup: the fraction of lr at the first step"},
    {"freeze", "", "layers whose parameters stay fixed, names or prefixes, comma-separated "
                   "(conv1, layer1): no gradients, no optimizer state"},
    {"freeze_bn", "1", "1: frozen layers' batchnorms normalise by their running statistics, "
                       "which stay; 0: by the batch's, updating them"},
    {"device", "cpu", "cpu, or cuda in builds with the CUDA backend"},
    {"threads", "0", "CPU threads for OpenBLAS and the kernels; 0 = all cores"},
    {"seed", "1", "seeds initialisation (the weights PyTorch draws after torch.manual_seed), shuffling and dropout"},
    {"save", "runs/<cfg name>", "folder for checkpoints (last, best) and metrics.jsonl"},
    {"save_every", "0", "also write the last checkpoint every N batches; 0 = each epoch only"},
    {"stop_after", "0", "stop after this many optimizer steps in all, with a checkpoint, as on "
                        "Ctrl-C (for time-boxed sessions); 0 = never"},
    {"resume", "", "a checkpoint to continue training from exactly: ./train resume=CKPT takes "
                   "the cfg stored in it; settings that change the run are refused"},
    {"resume_force", "0", "1: resume although settings that change the run differ from the "
                          "checkpoint's"},
    {"init", "", "weights that start this run (optimizer starts fresh): a checkpoint, or any "
                 "safetensors state_dict with the network's names (PyTorch's)"},
    {"init_skip", "", "layers that init leaves at their fresh initialisation, comma-separated "
                      "(fc: a new classifier head; layer4: a whole stage)"},
    {"profile", "0", "1: time every kernel and layer and print where the training time went "
                     "(milliseconds per step) after each epoch"},
};
enum { NTRAIN_KEYS = sizeof train_keys / sizeof train_keys[0] };

// A comma-separated list of layer names of the cfg: names[0..n) point into text.
typedef struct NameList {
    char text[1024];
    const char *names[64];
    int n;
} NameList;

typedef struct Options {
    int epochs, batch, threads, accumulate;
    int64_t save_every, stop_after;
    int segments;        // NetOptions.segments
    size_t memory;       // budget in bytes; 0 = none
    int auto_fp16;
    int tf32;
    int profile;         // print the profile table (nn/profile.h) after each epoch
    bool plan, json;     // --plan [--json]
    const char *resume, *init;
    int resume_force;
    NameList init_skip, freeze;
    int freeze_bn;
    DType precision;
    ScalerRules scaling;  // the loss scaler (fp16)
    double init_scale;    // its first scale
    Optimizer optim;
    Schedule schedule;  // total is set when the data is open
    const char *device;
    char save[1024];
    uint64_t seed;
    DataConfig data;
} Options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./train CFG [key=value ...]\n"
            "\n"
            "Trains the network described by the cfg file CFG (see models/mnist.cfg).\n"
            "Any cfg key can be overridden on the command line:\n"
            "  key=value          a key of [train] or [data]   (epochs=1 batch=128)\n"
            "  train.key=value    a key of a named section     (data.shuffle=0)\n"
            "  LAYER.key=value    a key of the layer named LAYER (conv1.filters=16)\n"
            "  key=               (empty) the key's default, as if the cfg did not set it\n"
            "\n"
            "Options:\n"
            "  --plan             print the memory plan for the cfg and stop (no training)\n"
            "  --plan --json      the same as one JSON object of byte counts\n"
            "  -h, --help         this text, with every cfg key\n"
            "\n"
            "usage: ./train --eval WEIGHTS [--cfg CFG] [--json] [key=value ...]\n"
            "  evaluates a checkpoint (SAVE/best.safetensors) on the test set of the cfg stored\n"
            "  in it (the held-out part with val_split), or on another: test=PATH\n"
            "  test_labels=PATH. Prints loss, accuracy, top-5, each class's accuracy and the\n"
            "  confusion matrix (--json: one JSON object). Plain weights (any safetensors\n"
            "  state_dict, PyTorch's) need the network's cfg: --cfg CFG\n"
            "\n"
            "usage: ./train --predict WEIGHTS [--cfg CFG] [--json] [--top K] IMAGE|FOLDER...\n"
            "  the K (5) most likely classes of each image file (PNG, JPEG, BMP, GIF, TGA, PNM)\n"
            "  and of every image in the folders, decoded, resized to the network's input and\n"
            "  normalised as in training (--json: one JSON object per line). Files that do not\n"
            "  decode are reported and the exit status is 1\n"
            "\n");
    cfg_print_keys(f, "train", train_keys, NTRAIN_KEYS);
    fprintf(f, "\n");
    cfg_print_keys(f, "data", data_keys, data_nkeys);
    fprintf(f, "\nLayer sections, in network order after [train] and [data]:\n");
    for (int i = 0; i < layer_ntypes; i++) {
        fprintf(f, "\n# %s\n", layer_types[i]->summary);
        cfg_print_keys(f, layer_types[i]->type, layer_types[i]->keys, layer_types[i]->nkeys);
    }
}

static bool has_key(const CfgKey *keys, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(keys[i].key, key) == 0) return true;
    return false;
}

// Applies one command-line override "key=value", "section.key=value" or "layer.key=value".
static int apply_override(Cfg *cfg, const char *arg, Error *err) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return err_set(err, "command line: '%s' is not key=value (see ./train --help)", arg);
    char key[256];
    if ((size_t)(eq - arg) >= sizeof key) return err_set(err, "command line: key too long in '%s'", arg);
    memcpy(key, arg, (size_t)(eq - arg));
    key[eq - arg] = '\0';
    const char *value = eq + 1;
    CfgSection *s = NULL;
    const char *k = key;
    char *dot = strrchr(key, '.');  // layer names may hold dots (layer1.0), keys never do
    if (dot) {
        *dot = '\0';
        k = dot + 1;
        s = cfg_section(cfg, key);
        if (s && strcmp(key, "train") != 0 && strcmp(key, "data") != 0) s = NULL;
        if (!s) s = layer_find_section(cfg, key);
        if (!s) return err_set(err, "command line: '%s': no section or layer named '%s' in %s", arg, key, cfg->path);
    } else if (has_key(train_keys, NTRAIN_KEYS, key)) {
        s = cfg_section(cfg, "train");
    } else if (has_key(data_keys, data_nkeys, key)) {
        s = cfg_section(cfg, "data");
    } else {
        return err_set(err, "command line: unknown key '%s': not a key of [train] or [data] "
                            "(for a layer's key write LAYER.%s=...; see ./train --help)", key, key);
    }
    if (!s) return err_set(err, "command line: '%s': %s has no [%s] section", arg, cfg->path,
                           has_key(train_keys, NTRAIN_KEYS, key) ? "train" : "data");
    if (!*value) {  // key= : back to the default (test= turns a cfg's test set off)
        cfg_unset(s, k);
        return 0;
    }
    return cfg_set(s, k, value, err);
}

// key = a, b: the names, trimmed, into *list.
static int read_names(const Cfg *cfg, const CfgSection *t, const char *key, NameList *list,
                      Error *err) {
    const char *text;
    if (cfg_str(cfg, t, key, "", &text, err)) return -1;
    list->n = 0;
    if (strlen(text) >= sizeof list->text)
        return err_set(err, "%s: [train] %s is too long", cfg->path, key);
    strcpy(list->text, text);
    for (char *p = list->text; *p;) {
        p += strspn(p, " \t,");
        if (!*p) break;
        char *end = p + strcspn(p, ",");
        char *next = *end ? end + 1 : end;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t')) end--;
        *end = '\0';
        if (list->n == (int)(sizeof list->names / sizeof list->names[0]))
            return err_set(err, "%s: [train] %s names more than %d layers", cfg->path, key,
                           (int)(sizeof list->names / sizeof list->names[0]));
        list->names[list->n++] = p;
        p = next;
    }
    return 0;
}

// The optimizer's keys, with its defaults.
static int read_optimizer(Optimizer *o, const Cfg *cfg, const CfgSection *t, Error *err) {
    int kind;
    if (cfg_choice(cfg, t, "optimizer", "adadelta", optim_names, OPTIM_COUNT, &kind, err)) return -1;
    o->kind = (OptimKind)kind;
    static const char *const lr0[] = {"1.0", "0.01", "0.001"}, *const eps0[] = {"1e-6", "1e-6", "1e-8"},
                             *const wd0[] = {"0", "0", "0.01"};
    static_assert(OPTIM_COUNT == 3, "the optimizers' defaults above");
    double betas[2];
    int nbetas;
    int64_t nesterov, skip;
    if (cfg_float(cfg, t, "lr", lr0[kind], 0.0, 1e6, &o->lr, err) ||
        cfg_float(cfg, t, "rho", "0.9", 0.0, 1.0, &o->rho, err) ||
        cfg_float(cfg, t, "eps", eps0[kind], 0.0, 1.0, &o->eps, err) ||
        cfg_float(cfg, t, "momentum", "0", 0.0, 1.0, &o->momentum, err) ||
        cfg_float(cfg, t, "dampening", "0", 0.0, 1.0, &o->dampening, err) ||
        cfg_int(cfg, t, "nesterov", "0", 0, 1, &nesterov, err) ||
        cfg_floats(cfg, t, "betas", "0.9, 0.999", betas, 2, &nbetas, err) ||
        cfg_float(cfg, t, "weight_decay", wd0[kind], 0.0, 1e6, &o->weight_decay, err) ||
        cfg_int(cfg, t, "decay_skip_norm_bias", "0", 0, 1, &skip, err))
        return -1;
    if (nbetas != 2 || !(betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1))
        return err_set(err, "%s: [train] betas: expected two numbers in [0, 1), such as 0.9, 0.999",
                       cfg->path);
    o->beta1 = betas[0], o->beta2 = betas[1];
    o->nesterov = nesterov != 0;
    o->decay_skip_norm_bias = skip != 0;
    if (o->nesterov && (o->momentum == 0 || o->dampening != 0))
        return err_set(err, "%s: [train] nesterov = 1 needs momentum > 0 and dampening = 0 (as "
                            "PyTorch's SGD)", cfg->path);
    return 0;
}

static int read_schedule(Schedule *s, const Cfg *cfg, const CfgSection *t, Error *err) {
    int kind;
    if (cfg_choice(cfg, t, "schedule", "step", schedule_names, SCHEDULE_COUNT, &kind, err) ||
        cfg_float(cfg, t, "lr_gamma", "0.7", 0.0, 1e6, &s->gamma, err) ||
        cfg_float(cfg, t, "lr_min", "0", 0.0, 1e6, &s->lr_min, err) ||
        cfg_int(cfg, t, "warmup", "0", 0, INT64_MAX, &s->warmup, err) ||
        cfg_float(cfg, t, "warmup_start", "0.3333333333333333", 1e-9, 1.0, &s->warmup_start, err))
        return -1;
    s->kind = (ScheduleKind)kind;
    return 0;
}

static int read_options(Options *o, const Cfg *cfg, const char *cfg_path, Error *err) {
    const CfgSection *t = cfg_section(cfg, "train"), *d = cfg_section(cfg, "data");
    if (!t) return err_set(err, "%s: no [train] section (see models/mnist.cfg)", cfg_path);
    if (!d) return err_set(err, "%s: no [data] section (see models/mnist.cfg)", cfg_path);
    if (cfg_check_keys(cfg, t, train_keys, NTRAIN_KEYS, err) || data_cfg_read(&o->data, cfg, d, err))
        return -1;
    int64_t epochs, batch, threads, seed, accumulate, growth_interval, profile;
    double init_scale;
    int precision;
    static const char *const precisions[] = {"fp32", "fp16"};
    const char *save, *loss_scale, *checkpoint, *memory;
    int64_t auto_fp16, tf32, freeze_bn, resume_force;
    if (cfg_int(cfg, t, "epochs", "14", 1, 1000000, &epochs, err) ||
        cfg_int(cfg, t, "batch", "64", 1, 1 << 20, &batch, err) ||
        cfg_int(cfg, t, "accumulate", "1", 1, 1 << 20, &accumulate, err) ||
        cfg_choice(cfg, t, "precision", "fp32", precisions, 2, &precision, err) ||
        cfg_str(cfg, t, "loss_scale", "dynamic", &loss_scale, err) ||
        cfg_str(cfg, t, "checkpoint", "none", &checkpoint, err) ||
        cfg_str(cfg, t, "memory", "", &memory, err) ||
        cfg_int(cfg, t, "auto_fp16", "0", 0, 1, &auto_fp16, err) ||
        cfg_int(cfg, t, "tf32", "0", 0, 1, &tf32, err) ||
        cfg_float(cfg, t, "init_scale", "65536", 1e-30, 1e30, &init_scale, err) ||
        cfg_int(cfg, t, "growth_interval", "2000", 1, INT64_MAX, &growth_interval, err) ||
        read_optimizer(&o->optim, cfg, t, err) || read_schedule(&o->schedule, cfg, t, err) ||
        cfg_str(cfg, t, "device", "cpu", &o->device, err) ||
        cfg_int(cfg, t, "threads", "0", 0, 4096, &threads, err) ||
        cfg_int(cfg, t, "seed", "1", 0, INT64_MAX, &seed, err) ||
        cfg_str(cfg, t, "save", "", &save, err) ||
        cfg_int(cfg, t, "save_every", "0", 0, INT64_MAX, &o->save_every, err) ||
        cfg_int(cfg, t, "stop_after", "0", 0, INT64_MAX, &o->stop_after, err) ||
        cfg_str(cfg, t, "resume", "", &o->resume, err) ||
        cfg_int(cfg, t, "resume_force", "0", 0, 1, &resume_force, err) ||
        cfg_str(cfg, t, "init", "", &o->init, err) ||
        read_names(cfg, t, "init_skip", &o->init_skip, err) ||
        read_names(cfg, t, "freeze", &o->freeze, err) ||
        cfg_int(cfg, t, "freeze_bn", "1", 0, 1, &freeze_bn, err) ||
        cfg_int(cfg, t, "profile", "0", 0, 1, &profile, err))
        return -1;
    o->profile = (int)profile;
    o->epochs = (int)epochs, o->batch = (int)batch, o->threads = (int)threads;
    o->seed = (uint64_t)seed;
    o->accumulate = (int)accumulate;
    if (batch % accumulate != 0)
        return err_set(err, "%s: [train] accumulate = %lld does not divide batch = %lld: the "
                            "micro-batches must be equal", cfg_path, (long long)accumulate, (long long)batch);
    o->precision = precision ? DT_F16 : DT_F32;
    o->auto_fp16 = (int)auto_fp16;
    o->tf32 = (int)tf32;
    if (strcmp(checkpoint, "none") == 0) {
        o->segments = 0;
    } else if (strcmp(checkpoint, "sqrt") == 0) {
        o->segments = NET_SEGMENTS_SQRT;
    } else {
        char *end;
        const long n = strtol(checkpoint, &end, 10);
        if (*end || n < 1 || n > 100000)
            return err_set(err, "%s: [train] checkpoint = '%s': expected none, sqrt or a number "
                                "of segments >= 1", cfg_path, checkpoint);
        o->segments = (int)n;
    }
    o->memory = 0;
    if (memory[0]) {
        char *end;
        const double v = strtod(memory, &end);
        double unit = 1;
        if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
        else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024, end++;
        else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024 * 1024, end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end || !(v > 0) || v * unit > 1e18)
            return err_set(err, "%s: [train] memory = '%s': expected a size such as 512M, 2G "
                                "or 800000K", cfg_path, memory);
        o->memory = (size_t)(v * unit);
    }
    if (strcmp(loss_scale, "dynamic") == 0) {
        o->scaling = scaler_rules(true, growth_interval);
        o->init_scale = init_scale;
    } else {
        char *end;
        const double fixed = strtod(loss_scale, &end);
        if (*end || !(fixed > 0) || !isfinite(fixed))
            return err_set(err, "%s: [train] loss_scale = '%s': expected dynamic or a positive "
                                "number", cfg_path, loss_scale);
        o->scaling = scaler_rules(false, growth_interval);
        o->init_scale = fixed;
    }

    o->freeze_bn = (int)freeze_bn;
    o->resume_force = (int)resume_force;
    if (save[0]) {
        snprintf(o->save, sizeof o->save, "%s", save);
    } else {  // runs/<cfg file name without directory and extension>
        const char *base = strrchr(cfg_path, '/') ? strrchr(cfg_path, '/') + 1 : cfg_path;
        int len = (int)strcspn(base, ".");
        snprintf(o->save, sizeof o->save, "runs/%.*s", len, base);
    }
    return 0;
}

// ---- utilities -----------------------------------------------------------------------------

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A size field of /proc/self/status ("VmHWM:", "VmRSS:") in bytes, or 0 if unknown.
static size_t proc_status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, strlen(field)) == 0) kb = (size_t)atoll(line + strlen(field));
    fclose(f);
    return kb * 1024;
}


static void format_eta(char *buf, size_t n, double seconds) {
    int s = (int)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, n, "%d:%02d", s / 60, s % 60);
}

// ---- the picture of training: SAVE/curves.svg ----------------------------------------------

// One epoch of SAVE/metrics.jsonl as curves.svg draws it (NAN where not logged).
typedef struct EpochPoint {
    int epoch;
    double train_loss, train_acc, val_loss, val_acc, lr;
} EpochPoint;

// The number after "key": in a metrics line; NAN for null or a missing key.
static double json_number(const char *line, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *p = strstr(line, pattern);
    if (!p) return NAN;
    char *end;
    const double v = strtod(p + strlen(pattern), &end);
    return end == p + strlen(pattern) ? NAN : v;
}

// The epochs of metrics.jsonl in order, each from its last line (a run resumed from an
// earlier checkpoint logs epochs again), none after the last line's epoch.
static int read_epoch_points(const char *path, EpochPoint **out, int *n, Error *err) {
    *out = NULL, *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return err_set(err, "cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        const double e = json_number(line, "epoch");
        if (!(e >= 1 && e < 1e7)) continue;
        const EpochPoint p = {(int)e, json_number(line, "train_loss"), json_number(line, "train_acc"),
                              json_number(line, "val_loss"), json_number(line, "val_acc"),
                              json_number(line, "lr")};
        int i = 0;
        while (i < *n && (*out)[i].epoch < p.epoch) i++;
        *n = i;  // epochs after this one are from before a resume
        EpochPoint *q = realloc(*out, (size_t)(i + 1) * sizeof *q);
        if (!q) {
            rc = err_set(err, "out of memory reading %s", path);
            break;
        }
        *out = q;
        (*out)[(*n)++] = p;
    }
    free(line);
    fclose(f);
    return rc;
}

// A curve: the field of EpochPoint it draws.
typedef struct Curve {
    const char *id, *label, *color;
    size_t field;
} Curve;

static double curve_value(const EpochPoint *p, const Curve *c) {
    return *(const double *)((const char *)p + c->field);
}

// One panel of the picture: the curves against the epoch, at x0, with the value axis
// from zero (losses, the learning rate) or around the values (accuracies).
static void svg_panel(FILE *f, double x0, const char *title, const EpochPoint *pts, int n,
                      const Curve *curves, int ncurves, bool from_zero) {
    const double left = x0 + 56, top = 56, w = 250, h = 220;
    double lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < ncurves; c++)
        for (int i = 0; i < n; i++) {
            const double v = curve_value(&pts[i], &curves[c]);
            if (isfinite(v)) lo = fmin(lo, v), hi = fmax(hi, v);
        }
    if (!isfinite(lo)) lo = 0, hi = 1;
    if (from_zero && lo > 0) lo = 0;
    if (hi - lo < 1e-9 * fmax(1.0, fabs(hi))) lo -= 0.5, hi += 0.5;
    // Ticks at a round step (1, 2 or 5 times a power of ten), the axis from tick to tick.
    double tick = pow(10, floor(log10((hi - lo) / 4)));
    if ((hi - lo) / tick > 20) tick *= 5;
    else if ((hi - lo) / tick > 8) tick *= 2;
    lo = floor(lo / tick + 1e-9) * tick, hi = ceil(hi / tick - 1e-9) * tick;
    const int first = pts[0].epoch, last = pts[n - 1].epoch;
#define X(e) (left + (last == first ? w / 2 : ((e) - first) * w / (last - first)))
#define Y(v) (top + h - ((v) - lo) * h / (hi - lo))
    fprintf(f, "<g font-family=\"sans-serif\" font-size=\"11\">\n");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">%s</text>\n",
            left + w / 2, top - 12, title);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n",
            left, top, w, h);
    for (double v = lo; v <= hi + tick / 2; v += tick) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                left, Y(v), left + w, Y(v), left - 4, Y(v) + 4, v);
    }
    const int step = (last - first) / 8 + 1;
    for (int e = first; e <= last; e += step)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", X(e), top + h + 14, e);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">epoch</text>\n", left + w / 2, top + h + 30);
    for (int c = 0, legend = 0; c < ncurves; c++) {
        const Curve *cv = &curves[c];
        int finite = 0;
        for (int i = 0; i < n; i++) finite += isfinite(curve_value(&pts[i], cv));
        if (!finite) continue;  // no test set: no validation curves
        fprintf(f, "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", cv->id, cv->color);
        for (int i = 0, k = 0; i < n; i++) {
            const double v = curve_value(&pts[i], cv);
            if (isfinite(v)) fprintf(f, "%s%.1f,%.1f", k++ ? " " : "", X(pts[i].epoch), Y(v));
        }
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n; i++) {
            const double v = curve_value(&pts[i], cv);
            if (isfinite(v))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>epoch %d: %.6g</title></circle>\n",
                        X(pts[i].epoch), Y(v), cv->color, pts[i].epoch, v);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">&#9679; %s</text>\n", left + 100 * legend++,
                top + h + 48, cv->color, cv->label);
    }
    fprintf(f, "</g>\n");
#undef X
#undef Y
}

// Draws SAVE/curves.svg from SAVE/metrics.jsonl: loss, accuracy and learning rate per
// epoch, one point per epoch, a plain SVG file any browser shows. Written to a temporary
// file and renamed, so that a browser never reads half of it.
static int write_curves(const char *save, const char *title, Error *err) {
    char log[1100], svg[1100], tmp[1140];
    snprintf(log, sizeof log, "%s/metrics.jsonl", save);
    snprintf(svg, sizeof svg, "%s/curves.svg", save);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", svg, (long)getpid());
    EpochPoint *pts;
    int n;
    if (read_epoch_points(log, &pts, &n, err)) return -1;
    if (!n) {
        free(pts);
        return 0;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(pts);
        return err_set(err, "cannot write %s: %s", tmp, strerror(errno));
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"350\" viewBox=\"0 0 960 350\">\n"
               "<rect width=\"960\" height=\"350\" fill=\"white\"/>\n"
               "<text x=\"480\" y=\"18\" font-family=\"sans-serif\" font-size=\"13\" text-anchor=\"middle\">");
    for (const char *c = title; *c; c++) {  // XML text
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else if (*c == '>') fputs("&gt;", f);
        else fputc(*c, f);
    }
    fprintf(f, "</text>\n");
    const Curve loss[] = {{"train_loss", "train", "#1f77b4", offsetof(EpochPoint, train_loss)},
                          {"val_loss", "validation", "#d62728", offsetof(EpochPoint, val_loss)}};
    const Curve acc[] = {{"train_acc", "train", "#1f77b4", offsetof(EpochPoint, train_acc)},
                         {"val_acc", "validation", "#d62728", offsetof(EpochPoint, val_acc)}};
    const Curve lr[] = {{"lr", "at the epoch's end", "#2ca02c", offsetof(EpochPoint, lr)}};
    svg_panel(f, 0, "loss", pts, n, loss, 2, true);
    svg_panel(f, 320, "accuracy (%)", pts, n, acc, 2, false);
    svg_panel(f, 640, "learning rate", pts, n, lr, 1, true);
    fprintf(f, "</svg>\n");
    free(pts);
    if (ferror(f) | fclose(f) || rename(tmp, svg)) {
        remove(tmp);
        return err_set(err, "cannot write %s: %s", svg, strerror(errno));
    }
    return 0;
}

// ---- training ------------------------------------------------------------------------------

typedef struct Totals {
    double loss, correct;
    int64_t seen;         // samples of the epoch (a resumed epoch counts its first part)
    int64_t trained_now;  // samples this process trained (for images per second)
} Totals;

// Copies samples [first, first + n) of a host batch into the network's input and labels.
static void put_batch(Net *net, const Batch *b, int first, int n) {
    const int64_t numel = shape_numel(net->input);
    net->k->upload(net->input_buf, b->x + first * numel, (size_t)n * numel * sizeof(float));
    net->k->upload(net->labels, b->y + first, (size_t)n * sizeof(int32_t));
}

// Every process takes rank 0's batchnorm statistics and counters (PyTorch DDP's
// broadcast_buffers): each normalised its own part of the batch. The F32 buffers lie
// together at the start of the buffer block: one broadcast for them, one for the counters.
static int sync_buffers(Net *net, Error *err) {
    size_t f32 = 0;
    int ncounters = 0;
    for (int m = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++) {
            const Tensor *t = &net->modules[m]->buffers[j];
            if (t->dtype != DT_F32) ncounters++;
            else if ((size_t)((char *)t->data - (char *)net->buffers) + tensor_bytes(t) > f32)
                f32 = (size_t)((char *)t->data - (char *)net->buffers) + tensor_bytes(t);
        }
    if (!ncounters) return 0;  // no batchnorm
    int64_t counters[ncounters];
    for (int m = 0, i = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++)
            if (net->modules[m]->buffers[j].dtype != DT_F32)
                counters[i++] = *(int64_t *)net->modules[m]->buffers[j].data;
    if (dist_broadcast(&dist, net->buffers, f32, err) ||
        dist_broadcast(&dist, counters, sizeof counters, err))
        return -1;
    for (int m = 0, i = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++)
            if (net->modules[m]->buffers[j].dtype != DT_F32)
                *(int64_t *)net->modules[m]->buffers[j].data = counters[i++];
    return 0;
}

// One optimizer step on a batch: forward and backward over micro-batches of net->batch
// samples, the loss averaged over the whole batch (`total` samples across the processes;
// this one's part starts at b->offset, which keys its dropout masks); the gradients are
// summed across the processes; then, with loss scaling, they are unscaled and checked, and
// the step is skipped if they are not finite (the same sum on every process: the same
// decision), on the device without waiting for it (optim_step).
static int train_step(Net *net, const Batch *b, int64_t total, const Options *o, uint64_t step,
                      double lr, Error *err) {
    net_zero_grads(net);
    for (int m0 = 0; m0 < b->n; m0 += net->batch) {
        const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
        profile_enter(PROF_STEP);
        put_batch(net, b, m0, n);
        net_forward(net, n, true, o->seed, step, b->offset + m0);
        profile_enter(PROF_LOSS);
        net_loss(net, n, (int)total, true);
        net_backward(net, n, o->seed, step, b->offset + m0);
    }
    profile_enter(PROF_OPTIMIZER);
    if (dist.size > 1 && (dist_sum_floats(&dist, net->grads, (size_t)net->ntrain, err) ||
                          sync_buffers(net, err)))
        return -1;
    optim_step(net, &o->optim, net->precision == DT_F16 ? &o->scaling : NULL, lr, step);
    return 0;
}

static void read_metrics(Net *net, Totals *t) {
    float m[2];
    net->k->download(m, net->metrics, sizeof m);
    t->loss = m[0], t->correct = m[1];
}

// The loss and correct count of every process summed (of this one alone without MPI).
static int read_metrics_all(Net *net, Totals *t, Error *err) {
    read_metrics(net, t);
    double v[2] = {t->loss, t->correct};
    if (dist_sum_doubles(&dist, v, 2, err)) return -1;
    t->loss = v[0], t->correct = v[1];
    return 0;
}

// What an evaluation finds beyond loss and accuracy: the confusion matrix (rows: the
// true class, columns: the predicted one, the first maximum as the accuracy counts it),
// and how many labels were among the five most likely classes.
typedef struct EvalStats {
    int classes;
    int64_t *confusion;  // (classes, classes)
    int64_t top5;
    float *logp;         // (net batch, classes): a host copy of one forward's output
} EvalStats;

static int eval_stats_init(EvalStats *e, int classes, int batch, Error *err) {
    memset(e, 0, sizeof *e);
    e->classes = classes;
    e->confusion = xcalloc((size_t)classes * (size_t)classes, sizeof *e->confusion, err);
    e->logp = e->confusion ? xcalloc((size_t)batch * (size_t)classes, sizeof *e->logp, err) : NULL;
    return e->logp ? 0 : -1;
}

static void eval_stats_free(EvalStats *e) {
    free(e->confusion);
    free(e->logp);
    memset(e, 0, sizeof *e);
}

// Adds n samples of log-probabilities e->logp with their labels.
static void eval_stats_add(EvalStats *e, const int32_t *labels, int n) {
    const int C = e->classes;
    for (int i = 0; i < n; i++) {
        const float *y = e->logp + (size_t)i * C;
        int best = 0, above = 0;
        for (int c = 1; c < C; c++)
            if (y[c] > y[best]) best = c;
        for (int c = 0; c < C; c++) above += y[c] > y[labels[i]];
        e->confusion[(size_t)labels[i] * C + best]++;
        e->top5 += above < 5;
    }
}

static int64_t eval_stats_total(const EvalStats *e, int c) {
    int64_t n = 0;
    for (int j = 0; j < e->classes; j++) n += e->confusion[(size_t)c * e->classes + j];
    return n;
}

// Each class's accuracy in percent as a JSON list (null for a class without samples); null
// without stats.
static void write_per_class(FILE *f, const EvalStats *e) {
    if (!e) {
        fputs("null", f);
        return;
    }
    fputc('[', f);
    for (int c = 0; c < e->classes; c++) {
        const int64_t n = eval_stats_total(e, c);
        if (n) fprintf(f, "%s%.4f", c ? ", " : "", 100.0 * (double)e->confusion[(size_t)c * e->classes + c] / (double)n);
        else fprintf(f, "%snull", c ? ", " : "");
    }
    fputc(']', f);
}

// Loss and accuracy over a whole dataset, without training; with stats (may be NULL), the
// confusion matrix and top-5 as well.
static int evaluate(Net *net, Loader *loader, Totals *t, EvalStats *stats, Error *err) {
    net->k->zero(net->metrics, 2 * sizeof(float));
    if (stats) {
        memset(stats->confusion, 0, (size_t)stats->classes * stats->classes * sizeof *stats->confusion);
        stats->top5 = 0;
    }
    if (loader_start_epoch(loader, 0, 0, err)) return -1;
    t->seen = 0;
    const Batch *b;
    while (1) {
        if (loader_next(loader, &b, err)) return -1;
        if (!b) break;
        for (int m0 = 0; m0 < b->n; m0 += net->batch) {
            const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
            put_batch(net, b, m0, n);
            net_forward(net, n, false, 0, 0, 0);
            net_loss(net, n, n, false);
            if (!stats) continue;
            net->k->download(stats->logp, net_output(net), (size_t)n * stats->classes * sizeof(float));
            eval_stats_add(stats, b->y + m0, n);
        }
        t->seen += b->n;
    }
    // Each process evaluated its part of every batch: the totals of all of them.
    if (read_metrics_all(net, t, err)) return -1;
    double seen = (double)t->seen;
    if (dist_sum_doubles(&dist, &seen, 1, err)) return -1;
    t->seen = (int64_t)seen;
    if (stats && dist.size > 1) {
        const size_t n = (size_t)stats->classes * stats->classes + 1;
        double *v = xcalloc(n, sizeof *v, err);
        if (!v) return -1;
        for (size_t i = 0; i + 1 < n; i++) v[i] = (double)stats->confusion[i];
        v[n - 1] = (double)stats->top5;
        const int rc = dist_sum_doubles(&dist, v, n, err);
        for (size_t i = 0; i + 1 < n; i++) stats->confusion[i] = (int64_t)v[i];
        stats->top5 = (int64_t)v[n - 1];
        free(v);
        if (rc) return -1;
    }
    return 0;
}

// ---- checkpoints and signals ---------------------------------------------------------------

// Removes the temporary files that a trainer killed while writing left in the save folder:
// NAME.tmp.PID (st_write's and curves.svg's pattern) of a process that no longer runs.
// Other files are never touched.
static void remove_stale_temporaries(const char *save) {
    DIR *d = opendir(save);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || t == e->d_name) continue;
        char *end;
        const long pid = strtol(t + 5, &end, 10);
        const bool ours = !strncmp(e->d_name, "last.safetensors.tmp.", 21) ||
                          !strncmp(e->d_name, "best.safetensors.tmp.", 21) ||
                          !strncmp(e->d_name, "curves.svg.tmp.", 15);
        if (!ours || *end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", save, e->d_name) < (int)sizeof path && !unlink(path))
            printf("removed %s, left by process %ld, which no longer runs\n", path, pid);
    }
    closedir(d);
}

// The first SIGINT or SIGTERM asks the training loop to finish its step, write a
// checkpoint and stop; a second one kills as usual (SA_RESETHAND).
static volatile sig_atomic_t stop_signal = 0;
static void on_stop_signal(int sig) { stop_signal = sig; }

static void catch_stop_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

// What a run needs to write its checkpoints.
typedef struct Run {
    const Options *o;
    Net *net;
    Loader *loader;
    TrainState st;
    ScalerState scaler;  // net->scaler as last read (to print or save)
    CheckpointInfo info;
    char last[1100], best[1100];
    EvalStats eval;                 // of the test set after each epoch
    int64_t steps_now, images_now;  // trained by this process (for the profile)
    Schedule schedule;              // the options' with its total: epochs x batches
    double lr;                      // of the last step
} Run;

// Writes the run's state to path (the epoch totals so far come from the device, summed
// over the processes); every process calls it, rank 0 writes.
static int save_checkpoint(Run *r, const char *path, Error *err) {
    Totals t;
    if (read_metrics_all(r->net, &t, err)) return -1;
    if (dist.rank != 0) return 0;
    r->st.epoch_loss = t.loss, r->st.epoch_correct = t.correct;
    r->net->k->download(&r->scaler, r->net->scaler, sizeof r->scaler);
    r->st.loss_scale = r->scaler.scale;
    r->st.scaler_good_steps = r->scaler.good_steps;
    r->st.scaler_skipped = r->scaler.skipped;
    return checkpoint_save(path, r->net, &r->st, &r->info, err);
}

// Trains epoch r->st.epoch from batch r->st.batch to its end, or until a stop signal
// (returns 1 then, with the checkpoint written). Totals t cover the whole epoch.
static int train_epoch(Run *r, Totals *t, double *seconds, Error *err) {
    const Options *o = r->o;
    Net *net = r->net;
    const int epoch = (int)r->st.epoch;
    const int64_t nbatches = loader_batches(r->loader);
    const bool live = isatty(STDOUT_FILENO);
    // A resumed epoch goes on from the totals of its first part (rank 0 holds them).
    const float totals[2] = {dist.rank ? 0.0f : (float)r->st.epoch_loss,
                             dist.rank ? 0.0f : (float)r->st.epoch_correct};
    net->k->upload(net->metrics, totals, sizeof totals);
    if (loader_start_epoch(r->loader, epoch, r->st.batch, err)) return -1;
    const int64_t seen0 = r->st.epoch_seen;
    int64_t mine = 0;  // samples this process trained this epoch (its loss in the progress line)
    const double t0 = now();
    double last_print = t0;
    const Batch *b;
    while (1) {
        profile_enter(PROF_LOADER);
        if (loader_next(r->loader, &b, err)) return -1;
        if (!b) break;
        // Every process's part of the batch, and whether any was asked to stop: all of them
        // take the same steps and stop at the same one.
        int64_t total = b->n;
        bool stop = stop_signal != 0;
        if (dist.size > 1) {
            double v[2] = {b->n, stop};
            if (dist_sum_doubles(&dist, v, 2, err)) return -1;
            total = (int64_t)v[0], stop = v[1] > 0;
        }
        r->st.batch = b->index + 1;
        if (!total) continue;  // every sample of the batch was bad and skipped
        r->lr = schedule_lr(&r->schedule, o->optim.lr, (int64_t)r->st.step, epoch);
        if (train_step(net, b, total, o, r->st.step, r->lr, err)) return -1;
        profile_enter(PROF_STEP);
        r->steps_now++, r->images_now += total;
        r->st.step++;
        r->st.epoch_seen += total;
        mine += b->n;
        const double tn = now();
        const bool step_limit = o->stop_after && r->st.step >= (uint64_t)o->stop_after;
        if (stop || step_limit) {
            if (live) printf("\r\033[K");
            if (save_checkpoint(r, r->last, err)) return -1;
            printf("stopped %s in epoch %d after batch %lld/%lld; wrote %s\n"
                   "resume with: ./train resume=%s\n",
                   step_limit               ? "at stop_after"
                   : stop_signal == SIGINT  ? "by SIGINT"
                   : stop_signal == SIGTERM ? "by SIGTERM"
                                            : "by a signal to another process",
                   epoch + 1, (long long)r->st.batch, (long long)nbatches, r->last, r->last);
            return 1;
        }
        if (o->save_every && r->st.batch % o->save_every == 0 && r->st.batch < nbatches &&
            save_checkpoint(r, r->last, err))
            return -1;
        if (live && (tn - last_print > 0.25 || b->index + 1 == nbatches)) {
            last_print = tn;
            read_metrics(net, t);
            char eta[32];
            const double rate = (r->st.epoch_seen - seen0) / (tn - t0);
            format_eta(eta, sizeof eta, (nbatches - b->index - 1) * (double)o->batch / rate);
            printf("\r\033[K  epoch %d  %lld/%lld  loss %.4f  %.0f img/s  ETA %s", epoch + 1,
                   (long long)b->index + 1, (long long)nbatches, t->loss / (double)(dist.size > 1 ? (mine ? mine : 1) : r->st.epoch_seen),
                   rate, eta);
            fflush(stdout);
        }
    }
    net->k->sync();
    profile_enter(PROF_IDLE);
    *seconds = now() - t0;
    if (live) printf("\r\033[K");
    if (read_metrics_all(net, t, err)) return -1;
    t->seen = r->st.epoch_seen;
    t->trained_now = r->st.epoch_seen - seen0;
    return 0;
}

// The plan for device k, and with `available` (SIZE_MAX: unknown) what the device can
// still give (`source` says whence). `baseline` is the process's own memory before the
// plan (the CPU), or the GPU's use once set up (its context, cuBLAS's workspace).
static void print_plan(const MemPlan *p, const Kernels *k, size_t baseline, size_t available,
                       const char *source, bool json) {
    const size_t need = mem_plan_on(p, k);
    if (json) {
        printf("{\"device\": \"%s\", \"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, "
               "\"buffers\": %zu, \"activations\": %zu, \"activations_kept\": %zu, "
               "\"workspace\": %zu, \"threads\": %zu, \"loader\": %zu, \"total\": %zu, "
               "\"on_device\": %zu, \"baseline\": %zu, \"available\": ",
               k->name, p->params, p->grads, p->optimizer, p->buffers, p->activations, p->act_kept,
               p->workspace, p->threads, p->loader, mem_plan_total(p), need, baseline);
        if (available == SIZE_MAX) printf("null}\n");
        else printf("%zu}\n", available);
        return;
    }
    printf("memory plan (MB):\n");
    printf("  %-34s %10.1f\n", "parameters", p->params / 1e6);
    printf("  %-34s %10.1f\n", "gradients", p->grads / 1e6);
    printf("  %-34s %10.1f\n", "optimizer state", p->optimizer / 1e6);
    printf("  %-34s %10.1f\n", "buffers (batchnorm statistics)", p->buffers / 1e6);
    printf("  %-34s %10.1f\n", "activations", p->activations / 1e6);
    printf("  %-34s %10.1f\n", "  kept from forward for backward", p->act_kept / 1e6);
    printf("  %-34s %10.1f\n", "workspace (im2col, fp16 scratch)", p->workspace / 1e6);
    if (k->host_memory) {
        printf("  %-34s %10.1f\n", "threads (GEMM packing)", p->threads / 1e6);
        printf("  %-34s %10.1f\n", "loader (batches, decoding)", p->loader / 1e6);
        printf("  %-34s %10.1f\n", "total", need / 1e6);
        printf("  %-34s %10.1f\n", "process baseline (libraries)", baseline / 1e6);
    } else {
        printf("  %-34s %10.1f\n", "total on the GPU", need / 1e6);
        printf("  %-34s %10.1f\n", "GPU baseline (context, cuBLAS)", baseline / 1e6);
        printf("  %-34s %10.1f\n", "in host memory: loader", p->loader / 1e6);
    }
    if (available != SIZE_MAX)
        printf("  %-34s %10.1f%s\n", "available", available / 1e6,
               need > available ? "  (the plan does not fit)" : "");
    if (available != SIZE_MAX && need > available) printf("  available is %s\n", source);
}

// With `memory = SIZE`: changes *opt and *accumulate to the first choice that fits device
// k with `overhead` beside the plan, and says what it chose and why; an error when nothing
// fits.
static int apply_budget(const Options *o, const Kernels *k, const Cfg *cfg, const Dataset *train,
                        int classes, size_t overhead, NetOptions *opt, int *accumulate, Error *err) {
    FitChoice c;
    bool fits;
    if (fit_budget(cfg, k, train->shape, classes, o->batch, *opt, *accumulate, overhead, o->memory,
                   o->auto_fp16, &c, &fits, err))
        return -1;
    const char *with = k->host_memory ? "with the loader and this process's baseline"
                                      : "on the GPU with its baseline (context, cuBLAS)";
    const double need = (mem_plan_on(&c.plan, k) + overhead) / 1048576.0;
    if (!fits)
        return err_set(err, "memory = %.0f MB: nothing fits; the smallest plan (checkpoint%s, "
                            "accumulate = %d%s) needs %.0f MB %s: raise memory to at least "
                            "%.0fM, lower the batch%s",
                       o->memory / 1048576.0, c.net.segments ? " = sqrt" : " none", c.accumulate,
                       c.net.precision == DT_F16 ? ", fp16" : "", need, with, need + 1,
                       o->auto_fp16 || o->precision == DT_F16 ? "" : " or allow auto_fp16 = 1");
    char what[256] = "";
    if (c.net.segments != opt->segments) snprintf(what + strlen(what), sizeof what - strlen(what), ", checkpoint = sqrt");
    if (c.accumulate != *accumulate)
        snprintf(what + strlen(what), sizeof what - strlen(what), ", accumulate = %d (micro-batch %d)",
                 c.accumulate, c.net.batch);
    if (c.net.precision != opt->precision) snprintf(what + strlen(what), sizeof what - strlen(what), ", precision = fp16");
    FILE *to = o->json ? stderr : stdout;  // --plan --json: stdout is the JSON alone
    if (what[0])
        fprintf(to, "memory = %.0f MB: the run as configured does not fit; chose%s: the plan needs "
                "%.0f MB %s\n", o->memory / 1048576.0, what + 1, need, with);
    else
        fprintf(to, "memory = %.0f MB: the run fits as configured (%.0f MB %s)\n",
                o->memory / 1048576.0, need, with);
    *opt = c.net;
    *accumulate = c.accumulate;
    return 0;
}

// The error for a plan larger than the machine can give: what would fit instead (the
// choices of `memory =`, fp16 included), or that nothing does.
static void refuse_too_big(const Options *o, const Kernels *k, const Cfg *cfg, const Dataset *train,
                           int classes, NetOptions opt, int accumulate, const MemPlan *plan,
                           size_t available, const char *source, Error *err) {
    FitChoice c;
    bool fits = false;
    Error ignored = {{0}};
    opt.plan_only = false;
    const size_t budget = available / 10 * 9;  // room for the process's own memory
    const bool searched = !fit_budget(cfg, k, train->shape, classes, o->batch, opt, accumulate,
                                      k->host_memory ? plan->loader : 0, budget, true, &c, &fits,
                                      &ignored);
    char what[256] = "lower the batch";
    if (searched && fits)
        snprintf(what, sizeof what, "memory=%.0fM chooses what fits: checkpoint = %s, accumulate = "
                 "%d (micro-batch %d), %s", budget / 1048576.0, c.net.segments ? "sqrt" : "none",
                 c.accumulate, c.net.batch, c.net.precision == DT_F16 ? "fp16" : "fp32");
    err_set(err, "the memory plan needs %.1f MB but %.1f MB is %s: the run cannot fit (it would "
                 "be killed when memory runs out); %s%s", mem_plan_on(plan, k) / 1e6, available / 1e6,
            source, what, searched && !fits ? " (even checkpointing, accumulation to a micro-batch "
                                              "of 1 and fp16 do not fit)" : "");
}

// Whether the network has a layer called name, or layers below a module of that name.
static bool has_module(const Net *net, const char *name) {
    const size_t n = strlen(name);
    for (int i = 0; i < net->nmodules; i++) {
        const char *m = net->modules[i]->name;
        if (!strncmp(m, name, n) && (!m[n] || m[n] == '.')) return true;
    }
    return false;
}

static int run(const Options *o, const Cfg *cfg, Error *err) {
    int rc = -1;
    Data data = {0};
    Net net = {0};
    FILE *log = NULL;
    Run r = {.o = o, .net = &net};

    const Kernels *k = kernels_for_device(o->device, err);
    if (!k) return -1;
    cpu_set_threads(o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN));

    // Several processes (mpirun): each reads, computes and holds its part of every batch.
    Options mine = *o;  // this process's share of the run
    mine.batch = o->batch / dist.size;
    if (dist.size > 1) {
        if (o->batch % dist.size) {
            const int lo = o->batch / dist.size * dist.size, hi = lo + dist.size;
            err_set(err, "batch = %d does not divide among %d processes: use %d or %d", o->batch,
                    dist.size, lo ? lo : hi, hi);
            goto done;
        }
        if (mine.batch % o->accumulate) {
            err_set(err, "accumulate = %d does not divide the %d samples each of the %d processes "
                         "takes of batch = %d", o->accumulate, mine.batch, dist.size, o->batch);
            goto done;
        }
        if (!k->host_memory) {
            err_set(err, "device = %s with %d processes: data parallelism runs on the CPU only so "
                         "far (NCCL for GPUs is not built yet)", o->device, dist.size);
            goto done;
        }
    }
    DataConfig dc = o->data;
    dc.shard = dist.rank, dc.nshards = dist.size;

    // What the device can give, and what it holds before anything of the plan exists: the
    // process's own memory (libraries, OpenBLAS) on the CPU, the GPU's context and cuBLAS's
    // workspace on a GPU.
    const char *source = "the GPU's free memory (cudaMemGetInfo)";
    size_t baseline, available;
    if (k->host_memory) {
        baseline = proc_status_bytes("VmRSS:");
        available = budget_machine_bytes(&source);
    } else {
        size_t none_yet;  // nothing of the run is allocated yet
        k->device_memory(&available, &none_yet, &baseline);
    }
    if (data_open(&data, &dc, o->batch, o->seed, err)) goto done;
    const Dataset *train = data.train, *test = data.test;
    r.loader = data.train_loader;
    r.schedule = o->schedule;
    r.schedule.total = (int64_t)o->epochs * loader_batches(r.loader);
    NetOptions net_opt = {.batch = mine.batch / o->accumulate, .precision = o->precision,
                          .segments = o->segments, .freeze = o->freeze.names,
                          .nfreeze = o->freeze.n, .freeze_stats = o->freeze_bn != 0,
                          .tf32 = o->tf32 != 0};
    optim_plan(&o->optim, &net_opt);
    int accumulate = o->accumulate;
    if (o->memory && apply_budget(&mine, k, cfg, train, data.classes,
                                  (k->host_memory ? data_loader_bytes(&data) : 0) + baseline,
                                  &net_opt, &accumulate, err))
        goto done;
    // The plan before anything of it is allocated, against what the machine can still give:
    // a run that cannot fit stops here, not in the kernel's OOM killer minutes later.
    net_opt.plan_only = true;
    if (net_create(&net, cfg, train->shape, data.classes, &net_opt, k, err)) goto done;
    net.plan.loader = data_loader_bytes(&data);
    if (o->plan) {
        print_plan(&net.plan, k, baseline, available, source, o->json);
        rc = 0;
        goto done;
    }
    if (mem_plan_on(&net.plan, k) > available) {
        refuse_too_big(&mine, k, cfg, train, data.classes, net_opt, accumulate, &net.plan, available,
                       source, err);
        goto done;
    }
    net_free(&net);
    net_opt.plan_only = false;
    if (net_create(&net, cfg, train->shape, data.classes, &net_opt, k, err)) goto done;
    if (!net.ntrain) {
        err_set(err, "%s: freeze leaves no parameter to train", cfg->path);
        goto done;
    }
    if (net_init_params(&net, o->seed, err)) goto done;
    if (o->profile && profile_start(&net, err)) goto done;
    net.plan.loader = data_loader_bytes(&data);
    r.st = (TrainState){.seed = o->seed, .best_val_acc = -1};
    r.scaler = (ScalerState){.scale = net.precision == DT_F16 ? o->init_scale : 1.0};
    if (o->init[0]) {
        for (int i = 0; i < o->init_skip.n; i++)
            if (!has_module(&net, o->init_skip.names[i])) {
                err_set(err, "%s: init_skip names '%s', but the network has no layer of that "
                             "name (see the table of layers: ./train CFG --plan)", cfg->path,
                        o->init_skip.names[i]);
                goto done;
            }
        if (checkpoint_load_weights(o->init, &net, o->init_skip.names, o->init_skip.n, err)) goto done;
        printf("initial weights from %s%s%s\n", o->init, o->init_skip.n ? "; fresh: " : "",
               o->init_skip.n ? o->init_skip.text : "");
    } else if (o->init_skip.n) {
        err_set(err, "%s: init_skip is set but init is not: init_skip says which layers of the "
                     "init weights to leave out", cfg->path);
        goto done;
    }
    if (o->resume[0]) {
        CheckpointInfo ci;
        if (checkpoint_read_info(o->resume, &ci, NULL, err)) goto done;
        const bool same_data = ci.classes == train->classes && ci.input.c == train->shape.c &&
                               ci.input.h == train->shape.h && ci.input.w == train->shape.w;
        if (!same_data)
            err_set(err, "%s was trained on %d classes of %dx%dx%d images, but %s has %d classes of "
                         "%dx%dx%d: resume continues the same run on the same data", o->resume,
                    ci.classes, ci.input.c, ci.input.h, ci.input.w, train->source, train->classes,
                    train->shape.c, train->shape.h, train->shape.w);
        checkpoint_info_free(&ci);
        if (!same_data || checkpoint_load_all(o->resume, &net, &r.st, err)) goto done;
        r.st.seed = o->seed;  // resume_check made them equal, or resume_force changed it
        if (net.precision == DT_F16) r.scaler.scale = r.st.loss_scale;
        r.scaler.good_steps = r.st.scaler_good_steps;
        r.scaler.skipped = r.st.scaler_skipped;
        printf("resuming from %s: epoch %lld, batch %lld, step %llu\n", o->resume,
               (long long)r.st.epoch + 1, (long long)r.st.batch, (unsigned long long)r.st.step);
    }
    net.k->upload(net.scaler, &r.scaler, sizeof r.scaler);
    if (!(r.info.cfg_text = cfg_to_text(cfg, err))) goto done;
    r.info.class_names = train->class_names;
    r.info.classes = train->classes;

    char device[64];
    snprintf(device, sizeof device, "%s%s%s%s", k->name, k->host_memory ? " (" : "",
             k->host_memory ? cpu_gemm_kernels() : "", k->host_memory ? " kernels)" : "");
    printf("cnn.c: %s on %s, %lld training images%s, %d classes; batch %d", cfg->path, device,
           (long long)train->count, test ? "" : " (no test set)", data.classes, o->batch);
    if (dist.size > 1) printf(" over %d processes (%d samples each)", dist.size, mine.batch);
    if (accumulate > 1) printf(" as %d micro-batches of %d", accumulate, net.batch);
    printf(", %s", net.precision == DT_F16 ? "fp16 activations" : "fp32");
    if (net.nsegments > 1) printf(", %d checkpoint segments", net.nsegments);
    printf("\n");
    if (test) printf("       %lld test images\n", (long long)test->count);
    if (train->info) printf("       train: %s\n", train->info);
    if (test && test->info) printf("       test: %s\n", test->info);
    net_print(&net, stdout);
    print_plan(&net.plan, k, baseline, available, source, false);

    if (test && eval_stats_init(&r.eval, data.classes, net.batch, err)) goto done;
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->save);
    snprintf(r.last, sizeof r.last, "%s/last.safetensors", o->save);
    snprintf(r.best, sizeof r.best, "%s/best.safetensors", o->save);
    // Rank 0 writes the files; a resumed run appends to the log of the run it continues.
    if (dist.rank == 0) {
        if (file_mkdirs(o->save, err)) goto done;
        remove_stale_temporaries(o->save);
        if (!(log = fopen(path, o->resume[0] ? "a" : "w"))) {
            err_set(err, "cannot write %s: %s", path, strerror(errno));
            goto done;
        }
    }
    catch_stop_signals();
    while (r.st.epoch < o->epochs) {
        const int epoch = (int)r.st.epoch;
        Totals tr = {0}, te = {0};
        double seconds;
        const double comm0 = dist.comm_seconds;
        const int stopped = train_epoch(&r, &tr, &seconds, err);
        if (stopped < 0) goto done;
        if (stopped) {
            if (o->profile) profile_print(stdout, r.steps_now, r.images_now);
            rc = 1;
            goto done;
        }
        if (test && evaluate(&net, data.test_loader, &te, &r.eval, err)) goto done;
        const double img_s = tr.trained_now / seconds, rss = proc_status_bytes("VmHWM:") / 1048576.0;
        const double lr = r.lr;
        const double val_acc = test ? 100.0 * te.correct / te.seen : -1;
        char val[128] = "";
        if (test) snprintf(val, sizeof val, "  val_loss %.4f  val_acc %.2f%%", te.loss / te.seen, val_acc);
        if (test && data.classes > 5)
            snprintf(val + strlen(val), sizeof val - strlen(val), "  val_top5 %.2f%%",
                     100.0 * (double)r.eval.top5 / (double)te.seen);
        LoaderStats ls;
        loader_stats(data.train_loader, &ls);
        net.k->download(&r.scaler, net.scaler, sizeof r.scaler);
        char wait[96];
        snprintf(wait, sizeof wait, "  data wait %.1f s (%.0f%%)", ls.wait_seconds,
                 seconds > 0 ? 100.0 * ls.wait_seconds / seconds : 0.0);
        if (ls.skipped) snprintf(wait + strlen(wait), sizeof wait - strlen(wait), "  skipped %lld bad", (long long)ls.skipped);
        char scale[160] = "";
        if (net.precision == DT_F16)
            snprintf(scale, sizeof scale, "  loss_scale %g  skipped %lld", r.scaler.scale,
                     (long long)r.scaler.skipped);
        if (dist.size > 1)
            snprintf(scale + strlen(scale), sizeof scale - strlen(scale), "  comm %.1f s (%.0f%%)",
                     dist.comm_seconds - comm0,
                     seconds > 0 ? 100.0 * (dist.comm_seconds - comm0) / seconds : 0.0);
        // On a GPU: the device memory the run's allocations take (measured), the plan's,
        // and with the GPU's baseline (context, cuBLAS) what the process holds there.
        double gpu_mb = -1, gpu_total_mb = -1;
        if (!k->host_memory) {
            size_t avail, taken, base;
            k->device_memory(&avail, &taken, &base);
            gpu_mb = taken / 1e6, gpu_total_mb = (taken + base) / 1e6;
            snprintf(scale + strlen(scale), sizeof scale - strlen(scale),
                     "  gpu %.0f MB (plan %.0f MB), %.0f MB with the context", gpu_mb,
                     mem_plan_blocks(&net.plan) / 1e6, gpu_total_mb);
        }
        printf("epoch %d/%d  train_loss %.4f  train_acc %.2f%%%s  lr %.4g  %.0f img/s  %.1f s  "
               "peak %.0f MB%s%s\n",
               epoch + 1, o->epochs, tr.loss / tr.seen, 100.0 * tr.correct / tr.seen, val, lr,
               img_s, seconds, rss, wait, scale);
        if (o->profile) profile_print(stdout, r.steps_now, r.images_now);
        fflush(stdout);
        char gpu_json[32] = "null", gpu_plan_json[32] = "null", gpu_total_json[32] = "null";
        if (gpu_mb >= 0) {
            snprintf(gpu_json, sizeof gpu_json, "%.1f", gpu_mb);
            snprintf(gpu_plan_json, sizeof gpu_plan_json, "%.1f", mem_plan_blocks(&net.plan) / 1e6);
            snprintf(gpu_total_json, sizeof gpu_total_json, "%.1f", gpu_total_mb);
        }
        char val_loss[32] = "null", val_acc_s[32] = "null", val_top5[32] = "null";
        if (dist.rank == 0 && test) {
            snprintf(val_loss, sizeof val_loss, "%.6f", te.loss / te.seen);
            snprintf(val_acc_s, sizeof val_acc_s, "%.4f", val_acc);
            snprintf(val_top5, sizeof val_top5, "%.4f", 100.0 * (double)r.eval.top5 / (double)te.seen);
        }
        if (dist.rank == 0) fprintf(log,
                "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %.4f, \"val_loss\": %s, "
                "\"val_acc\": %s, \"val_top5\": %s, \"val_per_class\": ",
                epoch + 1, tr.loss / tr.seen, 100.0 * tr.correct / tr.seen, val_loss, val_acc_s,
                val_top5);
        if (dist.rank == 0) write_per_class(log, test ? &r.eval : NULL);
        if (dist.rank == 0) fprintf(log,
                ", \"lr\": %.6g, \"img_per_s\": %.1f, \"seconds\": %.3f, \"peak_rss_mb\": %.1f, "
                "\"data_wait_s\": %.3f, \"skipped_bad\": %lld, \"loss_scale\": %g, "
                "\"skipped_steps\": %lld, \"gpu_mb\": %s, \"gpu_plan_mb\": %s, \"gpu_total_mb\": %s}\n",
                lr, img_s, seconds, rss, ls.wait_seconds, (long long)ls.skipped, r.scaler.scale,
                (long long)r.scaler.skipped, gpu_json, gpu_plan_json, gpu_total_json);
        if (dist.rank == 0 && (fflush(log) || ferror(log))) {
            err_set(err, "cannot write %s/metrics.jsonl: %s; the checkpoints are as before", o->save,
                    strerror(errno));
            goto done;
        }
        char title[1200];
        snprintf(title, sizeof title, "%s: %s", cfg->path, o->save);
        if (dist.rank == 0 && write_curves(o->save, title, err)) goto done;

        // The epoch is done: the checkpoint starts the next one from scratch.
        r.st.epoch = epoch + 1;
        r.st.batch = 0;
        r.st.epoch_seen = 0;
        net.k->zero(net.metrics, 2 * sizeof(float));
        const bool improved = test && val_acc > r.st.best_val_acc;
        if (improved) r.st.best_val_acc = val_acc;
        if (save_checkpoint(&r, r.last, err) || (improved && save_checkpoint(&r, r.best, err)))
            goto done;
    }
    printf("wrote %s%s%s\n", r.last, test ? " and " : "", test ? r.best : "");
    rc = 0;
done:
    free(r.info.cfg_text);
    eval_stats_free(&r.eval);
    if (log) fclose(log);
    profile_stop(&net);
    net_free(&net);
    data_close(&data);
    return rc;
}

// ---- evaluation and prediction --------------------------------------------------------------

// A trained network for --eval and --predict: its cfg (the one stored in a cnn.c
// checkpoint, or the one given with --cfg, which plain weights need) and its weights.
typedef struct Model {
    bool is_checkpoint;  // a cnn.c checkpoint (info is read), not a plain state_dict
    CheckpointInfo info;
    Cfg cfg;
    Options o;
    const Kernels *k;
    Net net;
    Data data;
    char name[1100];  // the cfg's name in messages
} Model;

static void model_close(Model *m) {
    net_free(&m->net);
    data_close(&m->data);
    cfg_free(&m->cfg);
    checkpoint_info_free(&m->info);
}

// Reads the cfg of `weights` (or cfg_path) with the overrides and the options.
static int model_open(Model *m, const char *weights, const char *cfg_path, int noverrides,
                      char **overrides, Error *err) {
    memset(m, 0, sizeof *m);
    if (checkpoint_probe(weights, &m->is_checkpoint, err) ||
        (m->is_checkpoint && checkpoint_read_info(weights, &m->info, NULL, err)))
        return -1;
    if (cfg_path) {
        snprintf(m->name, sizeof m->name, "%s", cfg_path);
        if (cfg_load(&m->cfg, cfg_path, err)) return -1;
    } else if (m->is_checkpoint) {
        snprintf(m->name, sizeof m->name, "%s (its stored cfg)", weights);
        if (cfg_parse(&m->cfg, m->info.cfg_text, m->name, err)) return -1;
    } else {
        return err_set(err, "%s holds plain weights (a state_dict without cnn.c's metadata): give "
                            "the network's cfg with --cfg CFG", weights);
    }
    for (int i = 0; i < noverrides; i++)
        if (apply_override(&m->cfg, overrides[i], err)) return -1;
    if (read_options(&m->o, &m->cfg, m->name, err) || !(m->k = kernels_for_device(m->o.device, err)))
        return -1;
    cpu_set_threads(m->o.threads > 0 ? m->o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}

// Builds the network for batches of `batch` inputs of `shape` and loads the weights.
static int model_load(Model *m, const char *weights, Shape shape, int classes, int batch, Error *err) {
    const NetOptions opt = {.batch = batch, .precision = m->o.precision, .tf32 = m->o.tf32 != 0};
    return net_create(&m->net, &m->cfg, shape, classes, &opt, m->k, err) ||
                   checkpoint_load_weights(weights, &m->net, NULL, 0, err)
               ? -1
               : 0;
}

// A JSON string of s (class names may hold quotes and backslashes).
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

// The evaluation's report: loss, accuracy, top-5 (more than 5 classes), each class's
// accuracy and the confusion matrix (up to 20 classes; all of it with json).
static void print_evaluation(const char *weights, const char *source, const Totals *t,
                             const EvalStats *e, char *const *names, bool json) {
    const int C = e->classes;
    const double acc = 100.0 * t->correct / t->seen, top5 = 100.0 * (double)e->top5 / t->seen;
    if (json) {
        printf("{\"weights\": ");
        json_string(stdout, weights);
        printf(", \"data\": ");
        json_string(stdout, source);
        printf(", \"images\": %lld, \"loss\": %.6f, \"acc\": %.4f, \"top5\": %.4f, \"classes\": [",
               (long long)t->seen, t->loss / t->seen, acc, top5);
        for (int c = 0; c < C; c++) {
            if (c) printf(", ");
            json_string(stdout, names[c]);
        }
        printf("], \"per_class\": ");
        write_per_class(stdout, e);
        printf(", \"confusion\": [");
        for (int c = 0; c < C; c++) {
            printf("%s[", c ? ", " : "");
            for (int j = 0; j < C; j++) printf("%s%lld", j ? ", " : "", (long long)e->confusion[(size_t)c * C + j]);
            printf("]");
        }
        printf("]}\n");
        return;
    }
    printf("%s on %s: loss %.4f  acc %.2f%% (%lld images)", weights, source,
           t->loss / t->seen, acc, (long long)t->seen);
    if (C > 5) printf("  top5 %.2f%%", top5);
    printf("\n%-24s %9s %8s\n", "class", "accuracy", "images");
    for (int c = 0; c < C; c++) {
        const int64_t n = eval_stats_total(e, c);
        char a[16] = "-";
        if (n) snprintf(a, sizeof a, "%.2f%%", 100.0 * (double)e->confusion[(size_t)c * C + c] / (double)n);
        printf("%-24.24s %9s %8lld\n", names[c], a, (long long)n);
    }
    if (C > 20) {
        printf("confusion matrix: %d classes, see --json\n", C);
        return;
    }
    printf("confusion matrix (rows: true class, columns: predicted, in the order above):\n");
    for (int c = 0; c < C; c++) {
        printf("  %-16.16s", names[c]);
        for (int j = 0; j < C; j++) printf(" %6lld", (long long)e->confusion[(size_t)c * C + j]);
        printf("\n");
    }
}

// ./train --eval WEIGHTS [--cfg CFG] [--json] [key=value ...]: the network and weights,
// evaluated on the test set of the cfg (or another: test=PATH test_labels=PATH), or on the
// held-out part of a val_split run, split as training split it (the cfg's seed). A
// checkpoint's class names and count are its own; plain weights take them from the
// cfg's data.
static int eval_weights(const char *weights, const char *cfg_path, bool json, int noverrides,
                        char **overrides, Error *err) {
    Model m;
    EvalStats e = {0};
    int rc = -1;
    if (model_open(&m, weights, cfg_path, noverrides, overrides, err)) goto done;
    const bool split = m.o.data.val_split > 0;
    if (split || !m.is_checkpoint ? data_open(&m.data, &m.o.data, m.o.batch, m.o.seed, err)
                                  : data_open_test(&m.data, &m.o.data, m.o.batch, err))
        goto done;
    if (!m.data.test) {
        err_set(err, "%s: [data] has no test set (test, test_labels or val_split) to evaluate on",
                m.name);
        goto done;
    }
    const int classes = m.is_checkpoint ? m.info.classes : m.data.classes;
    const DataConfig *dc = &m.o.data;
    const char *labels = split ? (dc->train_folder ? dc->train : dc->train_labels)
                               : (dc->test_folder ? dc->test : dc->test_labels);
    if (m.data.test->classes > classes) {
        err_set(err, "%s has labels up to %d but %s knows %d classes", labels,
                m.data.test->classes - 1, weights, classes);
        goto done;
    }
    const Shape in = m.data.test->shape;
    if (m.is_checkpoint && (in.c != m.info.input.c || in.h != m.info.input.h || in.w != m.info.input.w)) {
        err_set(err, "%s holds %dx%dx%d images but %s was trained on %dx%dx%d (channels x height x "
                     "width)", m.data.test->source, in.c, in.h, in.w, weights, m.info.input.c,
                m.info.input.h, m.info.input.w);
        goto done;
    }
    if (model_load(&m, weights, m.data.test->shape, classes, m.o.batch, err) ||
        eval_stats_init(&e, classes, m.net.batch, err))
        goto done;
    Totals t = {0};
    if (evaluate(&m.net, m.data.test_loader, &t, &e, err)) goto done;
    char *const *names = m.is_checkpoint ? m.info.class_names
                         : m.data.train && m.data.train->classes == classes ? m.data.train->class_names
                                                                           : m.data.test->class_names;
    print_evaluation(weights, m.data.test->source, &t, &e, names, json);
    rc = 0;
done:
    eval_stats_free(&e);
    model_close(&m);
    return rc;
}

// How --predict reports: --cfg CFG (plain weights need it), --json, --top K.
typedef struct PredictOptions {
    const char *cfg;
    bool json;  // one JSON object per line and image
    int top;    // classes listed per image
} PredictOptions;

// The files --predict reads: each path named that is not a folder, and in folders every
// file with an image extension at any depth (hidden entries left out), in strcmp order.
typedef struct PathList {
    char **paths;
    int n, cap;
} PathList;

static void paths_free(PathList *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
}

static int paths_add(PathList *l, const char *path, Error *err) {
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 64;
        char **p = realloc(l->paths, (size_t)cap * sizeof *p);
        if (!p) return err_set(err, "out of memory listing the images");
        l->paths = p, l->cap = cap;
    }
    return (l->paths[l->n] = xstrdup(path, err)) ? (l->n++, 0) : -1;
}

static int cmp_strings(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int paths_collect(PathList *l, const char *path, bool named, int depth, Error *err) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        // A file named on the command line is read whatever its extension (a missing one
        // is reported when it is read); in a folder only image files are.
        return named || (S_ISREG(st.st_mode) && image_name_has_ext(path)) ? paths_add(l, path, err) : 0;
    }
    if (depth >= 64)
        return err_set(err, "%s: more than 64 folders deep; is there a symbolic link loop?", path);
    DIR *d = opendir(path);
    if (!d) return err_set(err, "%s: cannot open the folder: %s", path, strerror(errno));
    PathList here = {0};
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub)
            rc = err_set(err, "%s/%s: path too long", path, e->d_name);
        else rc = paths_add(&here, sub, err);
    }
    closedir(d);
    if (!rc) qsort(here.paths, (size_t)here.n, sizeof *here.paths, cmp_strings);
    for (int i = 0; !rc && i < here.n; i++) rc = paths_collect(l, here.paths[i], false, depth + 1, err);
    paths_free(&here);
    return rc;
}

// One image's line: its `top` most likely classes from the log-probabilities logp
// (which it overwrites).
static void print_prediction(const char *file, float *logp, int classes, char *const *names,
                             const PredictOptions *po) {
    if (po->json) {
        printf("{\"file\": ");
        json_string(stdout, file);
        printf(", \"top\": [");
    } else {
        printf("%s:", file);
    }
    for (int k = 0; k < po->top && k < classes; k++) {
        int best = 0;
        for (int c = 1; c < classes; c++)
            if (logp[c] > logp[best]) best = c;
        if (po->json) {
            printf("%s{\"class\": ", k ? ", " : "");
            json_string(stdout, names[best]);
            printf(", \"index\": %d, \"prob\": %.6g}", best, exp(logp[best]));
        } else {
            printf("  %s %.1f%%", names[best], 100.0 * exp(logp[best]));
        }
        logp[best] = -INFINITY;
    }
    printf(po->json ? "]}\n" : "\n");
}

// ./train --predict WEIGHTS [--cfg CFG] [--json] [--top K] IMAGE|FOLDER...: the top
// classes of each image, decoded and resized to the network's input as a folder data set
// does and normalised with the cfg's mean and std, in batches of the cfg's batch size.
// Plain weights take the input shape and the class names from the cfg's training data.
// A file that cannot be read or decoded is reported (on stderr, or as a JSON line with
// "error") and the others go on. Returns the number of such files, or -1.
static int predict(const char *weights, const PredictOptions *po, int nargs, char **args, Error *err) {
    Model m = {0};
    PathList files = {0};
    int failed = -1;
    uint8_t *pixels = NULL;
    float *x = NULL, *logp = NULL;
    int *slot_file = NULL;  // the file of each image of the batch
    for (int i = 0; i < nargs; i++)
        if (paths_collect(&files, args[i], true, 0, err)) goto done;
    if (!files.n) {
        err_set(err, "no image files in %s%s", args[0], nargs > 1 ? " and the other paths" : "");
        goto done;
    }
    if (model_open(&m, weights, po->cfg, 0, NULL, err)) goto done;
    Shape input = m.info.input;
    int classes = m.info.classes;
    char *const *names = m.info.class_names;
    if (!m.is_checkpoint) {
        if (data_open(&m.data, &m.o.data, 1, m.o.seed, err)) {
            err_wrap(err, "%s: the input size and class names of plain weights come from the "
                          "cfg's training data", m.name);
            goto done;
        }
        input = m.data.train->shape;
        classes = m.data.classes;
        names = m.data.train->class_names;
    }
    const int batch = m.o.batch < files.n ? m.o.batch : files.n;
    if (model_load(&m, weights, input, classes, batch, err)) goto done;
    const int64_t numel = shape_numel(input);
    const DataConfig *dc = &m.o.data;
    if ((dc->nmean != 1 && dc->nmean != input.c) || (dc->nstd != 1 && dc->nstd != input.c)) {
        err_set(err, "%s: mean and std do not match the %d input channels", m.name, input.c);
        goto done;
    }
    if (!(pixels = xcalloc((size_t)numel, 1, err)) ||
        !(x = xcalloc((size_t)(batch * numel), sizeof *x, err)) ||
        !(logp = xcalloc((size_t)batch * classes, sizeof *logp, err)) ||
        !(slot_file = xcalloc((size_t)batch, sizeof *slot_file, err)))
        goto done;
    failed = 0;
    for (int next = 0; next < files.n;) {
        int n = 0;  // images of this batch that decoded
        for (; n < batch && next < files.n; next++) {
            Error why = {0};
            const int r = image_load(files.paths[next], input, pixels, &why);
            if (r < 0) {
                *err = why;
                failed = -1;
                goto done;
            }
            if (r == DATASET_BAD) {
                if (n) break;  // the batch so far first: the output keeps the files' order
                failed++;
                if (po->json) {
                    printf("{\"file\": ");
                    json_string(stdout, files.paths[next]);
                    printf(", \"error\": ");
                    json_string(stdout, why.msg);
                    printf("}\n");
                } else {
                    fprintf(stderr, "train: %s\n", why.msg);
                }
                continue;
            }
            float *xi = x + (size_t)n * numel;
            for (int64_t i = 0; i < numel; i++) {  // (H, W, C): the channel is i % C
                const int c = (int)(i % input.c);
                xi[i] = ((float)pixels[i] / 255.0f - dc->mean[dc->nmean == 1 ? 0 : c]) /
                        dc->std[dc->nstd == 1 ? 0 : c];
            }
            slot_file[n++] = next;
        }
        if (!n) continue;
        m.k->upload(m.net.input_buf, x, (size_t)n * numel * sizeof *x);
        net_forward(&m.net, n, false, 0, 0, 0);
        m.k->download(logp, net_output(&m.net), (size_t)n * classes * sizeof *logp);
        for (int j = 0; j < n; j++)
            print_prediction(files.paths[slot_file[j]], logp + (size_t)j * classes, classes, names, po);
        fflush(stdout);
    }
    if (failed)
        fprintf(stderr, "train: %d of %d files could not be read as images\n", failed, files.n);
done:
    model_close(&m);
    paths_free(&files);
    free(slot_file);
    free(pixels);
    free(x);
    free(logp);
    return failed;
}

// ---- resuming ----------------------------------------------------------------------------

// Keys that may change when a run resumes: they leave its numbers as they were (threads
// and device change the rounding, not the arithmetic).
static bool resume_may_change(const char *section, const char *key) {
    static const char *const train[] = {"epochs", "save", "save_every", "stop_after", "threads",
                                        "device", "profile", "resume", "resume_force", "init",
                                        "init_skip", "checkpoint"};
    static const char *const data[] = {"workers", "prefetch", "cache"};
    const bool is_train = !strcmp(section, "train"), is_data = !strcmp(section, "data");
    const char *const *keys = is_train ? train : data;
    const size_t n = is_train ? sizeof train / sizeof *train : is_data ? sizeof data / sizeof *data : 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return true;
    return false;
}

// Compares the run's cfg with the one stored in checkpoint `ckpt`: a difference in a
// setting that changes the run is an error, unless force (then it is printed).
static int resume_check(const Cfg *cfg, const char *ckpt, bool force, Error *err) {
    CheckpointInfo info;
    if (checkpoint_read_info(ckpt, &info, NULL, err)) return -1;
    char name[1100];
    snprintf(name, sizeof name, "%s (its stored cfg)", ckpt);
    Cfg stored;
    int rc = -1;
    if (cfg_parse(&stored, info.cfg_text, name, err)) goto done;
    char diffs[900] = "";
    int ndiff = 0;
    if (stored.nsections != cfg->nsections) {
        snprintf(diffs, sizeof diffs, "; the checkpoint's network has %d sections, this cfg %d",
                 stored.nsections, cfg->nsections);
        ndiff++;
    }
    for (int i = 0; i < cfg->nsections && i < stored.nsections; i++) {
        const CfgSection *a = &stored.sections[i], *b = &cfg->sections[i];
        if (strcmp(a->name, b->name)) {
            snprintf(diffs + strlen(diffs), sizeof diffs - strlen(diffs),
                     "; section %d is [%s] in the checkpoint, [%s] here", i + 1, a->name, b->name);
            ndiff++;
            continue;
        }
        for (int pass = 0; pass < 2; pass++) {  // keys of the checkpoint's section, then new ones
            const CfgSection *x = pass ? b : a, *y = pass ? a : b;
            for (int j = 0; j < x->nentries; j++) {
                const CfgEntry *e = &x->entries[j], *f = cfg_entry(y, e->key);
                if ((pass && f) || (f && !strcmp(e->value, f->value)) || resume_may_change(a->name, e->key))
                    continue;
                const char *was = pass ? "(unset)" : e->value, *now = pass ? e->value : f ? f->value : "(unset)";
                snprintf(diffs + strlen(diffs), sizeof diffs - strlen(diffs), "; [%s] %s = %s, now %s",
                         a->name, e->key, was, now);
                ndiff++;
            }
        }
    }
    if (ndiff && !force) {
        err_set(err, "%s was trained with other settings%s: resuming needs the run's own (./train "
                     "resume=%s alone takes them from the checkpoint); resume_force=1 resumes with "
                     "the changes, no longer the same run", ckpt, diffs, ckpt);
        goto done;
    }
    if (ndiff) printf("resume_force: resuming %s with changed settings%s\n", ckpt, diffs);
    rc = 0;
done:
    cfg_free(&stored);
    checkpoint_info_free(&info);
    return rc;
}

// ./train resume=CKPT [key=value ...]: the cfg stored in CKPT, the overrides applied; its
// checkpoints go on in CKPT's folder unless the cfg names one, and a stop_after that ended
// the stored run is dropped (give it again to stop again).
static int cfg_from_checkpoint(Cfg *cfg, char *name, size_t cap, int argc, char **argv, Error *err) {
    const char *ckpt = NULL;
    for (int i = 1; i < argc && !ckpt; i++)
        if (!strncmp(argv[i], "resume=", 7)) ckpt = argv[i] + 7;
    if (!ckpt)
        return err_set(err, "no cfg file: give one (./train CFG [key=value ...]), or resume=CKPT to "
                            "continue a run from its checkpoint alone");
    CheckpointInfo info;
    if (checkpoint_read_info(ckpt, &info, NULL, err)) return -1;
    snprintf(name, cap, "%s (its stored cfg)", ckpt);
    const int rc = cfg_parse(cfg, info.cfg_text, name, err);
    checkpoint_info_free(&info);
    if (rc) return -1;
    CfgSection *t = cfg_section(cfg, "train");
    if (t && cfg_entry(t, "stop_after") && cfg_set(t, "stop_after", "0", err)) return -1;
    if (t && !cfg_entry(t, "save")) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", ckpt);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
        if (cfg_set(t, "save", dir, err)) return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    Error err = {0};
    if (dist_init(&dist, &argc, &argv, &err)) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    const int rc = train_main(argc, argv);
    dist_finalize(&dist);
    return rc;
}

// main, once the processes of a data-parallel run know their ranks: rank 0 prints, the
// others print only their errors, and an error ends every process.
static int train_main(int argc, char **argv) {
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
    Error err = {0};
    Cfg cfg = {0};
    Options o = {0};
    int rc = 1;
    if (strcmp(argv[1], "--predict") == 0 || strcmp(argv[1], "--eval") == 0) {
        const bool eval = argv[1][2] == 'e';
        if (dist.size > 1) {
            err_set(&err, "%s runs as one process: start it without mpirun", argv[1]);
            goto fail;
        }
        // WEIGHTS, then the options (--cfg CFG, --json, --top K) anywhere among the rest:
        // overrides for --eval, images and folders for --predict.
        PredictOptions po = {.top = 5};
        int nrest = 0;
        char **rest = argv + 3;  // the other arguments, moved to the front
        for (int i = 3; i < argc; i++) {
            if (!strcmp(argv[i], "--json")) po.json = true;
            else if (!strcmp(argv[i], "--cfg") && i + 1 < argc) po.cfg = argv[++i];
            else if (!eval && !strcmp(argv[i], "--top") && i + 1 < argc) {
                char *end;
                const long k = strtol(argv[++i], &end, 10);
                if (*end || end == argv[i] || k < 1 || k > 1000000) {
                    err_set(&err, "--top %s: expected a number of classes >= 1", argv[i]);
                    goto fail;
                }
                po.top = (int)k;
            } else if (argv[i][0] == '-' && argv[i][1] == '-') {
                err_set(&err, "unknown or incomplete option %s (see ./train --help)", argv[i]);
                goto fail;
            } else rest[nrest++] = argv[i];
        }
        if (argc < 3 || (!eval && !nrest)) {
            fprintf(stderr, eval ? "usage: ./train --eval WEIGHTS [--cfg CFG] [--json] [key=value ...]\n"
                                 : "usage: ./train --predict WEIGHTS [--cfg CFG] [--json] [--top K] "
                                   "IMAGE|FOLDER...\n");
            return 2;
        }
        if (eval) {
            if (eval_weights(argv[2], po.cfg, po.json, nrest, rest, &err)) goto fail;
            return 0;
        }
        const int failed = predict(argv[2], &po, nrest, rest, &err);
        if (failed < 0) goto fail;
        return failed ? 1 : 0;
    }
    bool plan = false, json = false;
    const char *cfg_path = NULL;
    char stored_name[1100];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plan") == 0) plan = true;
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] == '-' && argv[i][1] == '-') {
            err_set(&err, "unknown option %s (see ./train --help)", argv[i]);
            goto fail;
        } else if (!cfg_path && strchr(argv[i], '=')) {  // no cfg file: the checkpoint's
            if (cfg_from_checkpoint(&cfg, stored_name, sizeof stored_name, argc, argv, &err)) goto fail;
            cfg_path = stored_name;
            if (apply_override(&cfg, argv[i], &err)) goto fail;
        } else if (!cfg_path) {
            cfg_path = argv[i];
            if (cfg_load(&cfg, cfg_path, &err)) goto fail;
        } else if (apply_override(&cfg, argv[i], &err)) goto fail;
    }
    if (!cfg_path) {
        usage(stderr);
        return 2;
    }
    if (json && !plan) {
        err_set(&err, "--json goes with --plan");
        goto fail;
    }
    if (read_options(&o, &cfg, cfg_path, &err)) goto fail;
    if (o.resume[0] && resume_check(&cfg, o.resume, o.resume_force, &err)) goto fail;
    o.plan = plan, o.json = json;
    const int ran = run(&o, &cfg, &err);
    if (ran < 0) goto fail;
    rc = ran ? 130 : 0;  // stopped by a signal: the checkpoint is written, resume is possible
    goto out;
fail:
    if (dist.size > 1) {
        fprintf(stderr, "train: rank %d of %d: %s\n", dist.rank, dist.size, err.msg);
        dist_abort(&dist, 1);  // the others would wait for this one forever
    } else {
        fprintf(stderr, "train: %s\n", err.msg);
    }
out:
    cfg_free(&cfg);
    return rc;
}
