// checkpoint.c: training checkpoints as safetensors files. The format and the contracts
// are in checkpoint.h; the file I/O (validation, atomic writes) is safetensors.c's.
#include "checkpoint.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cfg.h"
#include "optim.h"
#include "safetensors.h"

#define OPT_PREFIX CHECKPOINT_OPTIMIZER_PREFIX
#define OPT_PREFIX_LEN (sizeof OPT_PREFIX - 1)

// The metadata keys of the TrainState fields; `absent`: the value of a key that
// checkpoints written before it existed do not have (NULL: every checkpoint has it).
enum { NUM_INT, NUM_UINT, NUM_DOUBLE };
typedef struct StateField {
    const char *key;
    int kind;
    size_t offset;
    const char *absent;
} StateField;
static const StateField state_fields[] = {
    {"epoch", NUM_INT, offsetof(TrainState, epoch), NULL},
    {"batch", NUM_INT, offsetof(TrainState, batch), NULL},
    {"step", NUM_UINT, offsetof(TrainState, step), NULL},
    {"seed", NUM_UINT, offsetof(TrainState, seed), NULL},
    {"best_val_acc", NUM_DOUBLE, offsetof(TrainState, best_val_acc), NULL},
    {"epoch_loss", NUM_DOUBLE, offsetof(TrainState, epoch_loss), NULL},
    {"epoch_correct", NUM_DOUBLE, offsetof(TrainState, epoch_correct), NULL},
    {"epoch_seen", NUM_INT, offsetof(TrainState, epoch_seen), NULL},
    {"loss_scale", NUM_DOUBLE, offsetof(TrainState, loss_scale), NULL},
    {"scaler_good_steps", NUM_INT, offsetof(TrainState, scaler_good_steps), NULL},
    {"scaler_skipped", NUM_INT, offsetof(TrainState, scaler_skipped), NULL},
    {"plateau_best", NUM_DOUBLE, offsetof(TrainState, plateau.best), "inf"},
    {"plateau_bad_epochs", NUM_INT, offsetof(TrainState, plateau.bad_epochs), "0"},
    {"lr_reductions", NUM_INT, offsetof(TrainState, plateau.reductions), "0"},
    {"best_val_loss", NUM_DOUBLE, offsetof(TrainState, best_val_loss), "inf"},
    {"best_val_loss_epoch", NUM_INT, offsetof(TrainState, best_val_loss_epoch), "0"},
};
#define NSTATE ((int)(sizeof state_fields / sizeof state_fields[0]))
static_assert(sizeof(TrainState) == 8 * sizeof(int64_t) + 2 * sizeof(uint64_t) + 6 * sizeof(double),
              "state_fields must list every TrainState field");

void checkpoint_info_free(CheckpointInfo *info) {
    if (!info) return;
    free(info->cfg_text);
    for (int i = 0; info->class_names && i < info->classes; i++) free(info->class_names[i]);
    free(info->class_names);
    memset(info, 0, sizeof *info);
}

// ---- the network's tensors --------------------------------------------------------------

// One tensor of the model's state_dict: a parameter or a buffer (batchnorm's running
// statistics and counter). A trained parameter has optimizer state.
typedef struct ModelTensor {
    const Tensor *t;
    bool param;
    const Layer *l;  // a parameter's module, and its index there
    int j;
    bool trained;    // a parameter with optimizer state (net_opt_state(net, l, j, s))
} ModelTensor;

// The model's tensors in state_dict order (module after module: its parameters, then its
// buffers): a malloc'd array of *n (caller frees), *ntrained of them trained parameters;
// NULL with err.
static ModelTensor *list_model(const Net *net, int *n, int *ntrained, Error *err) {
    *n = *ntrained = 0;
    for (int i = 0; i < net->nmodules; i++) {
        *n += net->modules[i]->nparams + net->modules[i]->nbuffers;
        if (!net->modules[i]->frozen) *ntrained += net->modules[i]->nparams;
    }
    ModelTensor *m = xcalloc((size_t)*n ? (size_t)*n : 1, sizeof *m, err);
    if (!m) return NULL;
    int k = 0;
    for (int i = 0; i < net->nmodules; i++) {
        const Layer *l = net->modules[i];
        for (int j = 0; j < l->nparams; j++)
            m[k++] = (ModelTensor){&l->params[j], true, l, j, l->train_off[j] >= 0};
        for (int j = 0; j < l->nbuffers; j++) m[k++] = (ModelTensor){&l->buffers[j], false, l, j, false};
    }
    return m;
}

// Where a tensor's data lives: the counters (I64) on the host, the rest on the device.
static bool on_host(const Net *net, const Tensor *t) { return net->k->host_memory || t->dtype != DT_F32; }

// Floats of all the F32 buffers.
static size_t buffer_floats(const ModelTensor *m, int n) {
    size_t f = 0;
    for (int i = 0; i < n; i++)
        if (!m[i].param && m[i].t->dtype == DT_F32) f += (size_t)tensor_numel(m[i].t);
    return f;
}

// "optimizer.<param>.<the net's state s>" into out; -1 if it does not fit.
static int opt_key(const Net *net, char *out, size_t cap, const char *param, int s) {
    int w = snprintf(out, cap, "%s%s.%s", OPT_PREFIX, param, net->state_names[s]);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

static bool is_opt_key(const char *key) { return strncmp(key, OPT_PREFIX, OPT_PREFIX_LEN) == 0; }

// The dtype of each StateFormat's values in a file.
static const DType state_dtypes[STATE_FORMAT_COUNT] = {DT_F32, DT_BF16, DT_U8};

// Tensors that hold one optimizer state of a trained parameter: 1, or 2 with int8 state.
static int state_tensor_count(const Net *net) { return net->opt_format == STATE_INT8 ? 2 : 1; }

// State h of trained model tensor m as a file holds it, in out[0 .. state_tensor_count):
// its values (F32, BF16 or U8 codes, the parameter's shape) under opt_key, and with int8
// its blocks' absmax (F32, one per block) under opt_key + "_absmax"; data: where they are
// on the device. -1 if a key does not fit.
static int state_tensors(const Net *net, const ModelTensor *m, int h, Tensor *out) {
    const PackedState ps = net_opt_state(net, m->l, m->j, h);
    out[0] = *m->t;
    out[0].dtype = state_dtypes[net->opt_format];
    out[0].data = ps.codes;
    if (opt_key(net, out[0].name, sizeof out[0].name, m->t->name, h)) return -1;
    if (net->opt_format != STATE_INT8) return 0;
    out[1] = (Tensor){.dtype = DT_F32, .ndim = 1, .data = ps.absmax};
    out[1].shape[0] = quant_blocks(tensor_numel(m->t));
    const int w = snprintf(out[1].name, sizeof out[1].name, "%s_absmax", out[0].name);
    return w < 0 || (size_t)w >= sizeof out[1].name ? -1 : 0;
}

// The int8 state that is stored as its square root (the averages of squares: PackedPlan in
// kernels.h), its names joined by ',' into buf ("" without int8 state), as checkpoints
// record it under "int8_roots"; legacy: as the builds before that key stored it (AdamW's
// exp_avg_sq only), which a checkpoint without the key was written by.
static const char *int8_roots(const Net *net, bool legacy, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int h = 0; net->opt_format == STATE_INT8 && h < net->nstates; h++) {
        const char *name = net->state_names[h];
        if (!optim_state_nonnegative(name) || (legacy && strcmp(name, "exp_avg_sq"))) continue;
        const int w = snprintf(buf + n, cap - n, "%s%s", n ? "," : "", name);
        if (w < 0 || (size_t)w >= cap - n) break;
        n += (size_t)w;
    }
    return buf;
}

// Floats that a tensor of `bytes` takes in host staging (rounded up to whole floats).
static size_t staged_floats(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

// "[64, 9216]" into buf (always terminated).
static const char *shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i <= ndim && n < cap; i++) {
        int w = i == ndim
                    ? snprintf(buf + n, cap - n, "]")
                    : snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "[", (long long)shape[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (ndim == 0) snprintf(buf, cap, "[]");
    return buf;
}

// ---- saving -------------------------------------------------------------------------------

// The class names joined by '\n' (malloc'd), or NULL with err. A name may not be empty
// or hold a line break: it would not read back as the same list.
static char *join_classes(const CheckpointInfo *info, const char *path, Error *err) {
    size_t size = 1;
    for (int i = 0; i < info->classes; i++) {
        const char *c = info->class_names ? info->class_names[i] : NULL;
        if (!c || !*c || strpbrk(c, "\n\r")) {
            const char *what = !c ? "missing" : !*c ? "empty" : "on several lines";
            err_set(err, "cannot write '%s': class %d's name is %s; a class name must be "
                    "non-empty and on one line", path, i, what);
            return NULL;
        }
        size += strlen(c) + 1;
    }
    char *s = xcalloc(size, 1, err);
    if (!s) return NULL;
    char *p = s;
    for (int i = 0; i < info->classes; i++)
        p += sprintf(p, "%s%s", i ? "\n" : "", info->class_names[i]);
    return s;
}

int checkpoint_save(const char *path, const Net *net, const TrainState *st,
                    const CheckpointInfo *info, Error *err) {
    if (!st || !info || !info->cfg_text || info->classes < 1 ||
        info->classes > CHECKPOINT_MAX_CLASSES)
        return err_set(err,
                       "cannot write '%s': checkpoint_save needs the TrainState, the cfg text "
                       "and 1 to %d class names", path, CHECKPOINT_MAX_CLASSES);
    // What checkpoint_read_info accepts, and nothing else, is written.
    if (!shape_is_input(net->input))
        return err_set(err, "cannot write '%s': the network's input %dx%dx%d is not one that "
                            "images decode to (1 or 3 channels, 1 to %d pixels a side)", path,
                       net->input.c, net->input.h, net->input.w, INPUT_MAX_SIDE);
    int nm = 0, nt = 0, rc = -1;
    const int S = net->nstates, T = state_tensor_count(net);
    Tensor *t = NULL;
    float *host = NULL;
    char *classes = NULL;
    ModelTensor *model = list_model(net, &nm, &nt, err);
    if (!model) goto done;
    classes = join_classes(info, path, err);
    if (!classes) goto done;
    const int ntensors = nm + S * nt * T;
    t = xcalloc((size_t)ntensors, sizeof *t, err);
    if (!t) goto done;
    // Where the device's memory is the host's (the CPU), the tensors are written from it
    // directly: saving then costs no memory beyond the plan.
    const size_t nbuf = buffer_floats(model, nm),
                 nopt = staged_floats(net->plan.optimizer) + (size_t)(S * nt * T);
    if (!net->k->host_memory &&
        !(host = xcalloc((size_t)net->nparams + nopt + nbuf, sizeof *host, err)))
        goto done;

    // Tensors: the model's in state_dict order, then each trained parameter's optimizer
    // states. Host layout: the parameters, the optimizer states, the buffers.
    if (net->k->sync) net->k->sync();
    size_t off = 0, ooff = (size_t)net->nparams, boff = ooff + nopt;
    for (int i = 0, ti = nm; i < nm; i++) {
        const Tensor *p = model[i].t;
        const size_t n = (size_t)tensor_numel(p), bytes = n * sizeof(float);
        t[i] = *p;
        if (!on_host(net, p)) {
            t[i].data = host + (model[i].param ? off : boff);
            if (bytes) net->k->download(t[i].data, p->data, bytes);
            *(model[i].param ? &off : &boff) += n;
        }
        if (!model[i].trained) continue;
        for (int h = 0; h < S; h++, ti += T) {
            if (state_tensors(net, &model[i], h, &t[ti])) {
                err_set(err, "cannot write '%s': the optimizer key of '%s' is too long", path,
                        p->name);
                goto done;
            }
            for (int u = 0; u < T && host; u++) {
                Tensor *o = &t[ti + u];
                const size_t b = tensor_bytes(o);
                if (b) net->k->download(host + ooff, o->data, b);
                o->data = host + ooff;
                ooff += staged_floats(b);
            }
        }
    }

    // Metadata: the format, the cfg, the classes, the input shape, the int8 state stored as
    // square roots and the TrainState as decimal text.
    enum { NINFO = 5 };
    const char *keys[NINFO + NSTATE], *values[NINFO + NSTATE];
    char nums[NSTATE][32], input[64], roots[128];
    snprintf(input, sizeof input, "%d,%d,%d", net->input.c, net->input.h, net->input.w);
    keys[0] = "format", values[0] = CHECKPOINT_FORMAT;
    keys[1] = "cfg", values[1] = info->cfg_text;
    keys[2] = "classes", values[2] = classes;
    keys[3] = "input", values[3] = input;
    keys[4] = "int8_roots", values[4] = int8_roots(net, false, roots, sizeof roots);
    for (int i = 0; i < NSTATE; i++) {
        const StateField *f = &state_fields[i];
        const char *v = (const char *)st + f->offset;
        if (f->kind == NUM_INT) {
            int64_t x;
            memcpy(&x, v, sizeof x);
            snprintf(nums[i], sizeof nums[i], "%lld", (long long)x);
        } else if (f->kind == NUM_UINT) {
            uint64_t x;
            memcpy(&x, v, sizeof x);
            snprintf(nums[i], sizeof nums[i], "%llu", (unsigned long long)x);
        } else {
            double x;
            memcpy(&x, v, sizeof x);
            snprintf(nums[i], sizeof nums[i], "%.17g", x);
        }
        keys[NINFO + i] = f->key, values[NINFO + i] = nums[i];
    }
    rc = st_write(path, t, ntensors, keys, values, NINFO + NSTATE, err);
done:
    free(model);
    free(classes);
    free(t);
    free(host);
    return rc;
}

// ---- metadata -----------------------------------------------------------------------------

// Fails unless f is a cnn.c checkpoint of the format this build reads.
static int check_format(const StFile *f, Error *err) {
    const char *fmt = st_meta(f, "format");
    if (!fmt)
        return err_set(err,
                       "%s is not a cnn.c checkpoint: its metadata has no \"format\" (a "
                       "checkpoint that ./train writes says \"%s\")",
                       f->path, CHECKPOINT_FORMAT);
    if (strcmp(fmt, CHECKPOINT_FORMAT))
        return err_set(err,
                       "%s: format \"%.100s\" is not \"%s\", the checkpoint format this "
                       "build reads",
                       f->path, fmt, CHECKPOINT_FORMAT);
    return 0;
}

static int meta_required(const StFile *f, const char *key, const char **out, Error *err) {
    *out = st_meta(f, key);
    if (!*out)
        return err_set(err,
                       "%s: the checkpoint's metadata has no \"%s\"; the file is damaged or "
                       "was not written by ./train",
                       f->path, key);
    return 0;
}

// Parses metadata key as a number of the given kind into out: decimal text only (no
// sign for unsigned, no white space, nothing after the number, no overflow).
static int meta_number(const StFile *f, const StateField *sf, void *out, Error *err) {
    const char *v = st_meta(f, sf->key);
    if (!v && !(v = sf->absent)) return meta_required(f, sf->key, &v, err);  // names the key
    const char *what = sf->kind == NUM_DOUBLE ? "a number"
                       : sf->kind == NUM_INT  ? "a non-negative integer"
                                              : "an unsigned integer";
    char *end = NULL;
    bool ok;
    errno = 0;
    if (sf->kind == NUM_DOUBLE) {
        // strtod's nan/inf spellings are what %.17g writes for them.
        ok = *v && !strchr(" \t\n\r\f\v+", *v);
        double x = ok ? strtod(v, &end) : 0;
        ok = ok && end != v && !*end;
        if (ok) memcpy(out, &x, sizeof x);
    } else if (sf->kind == NUM_INT) {
        ok = *v >= '0' && *v <= '9';  // epochs, batches and counts are never negative
        long long x = ok ? strtoll(v, &end, 10) : 0;
        ok = ok && !errno && !*end;
        int64_t y = x;
        if (ok) memcpy(out, &y, sizeof y);
    } else {
        ok = *v >= '0' && *v <= '9';
        unsigned long long x = ok ? strtoull(v, &end, 10) : 0;
        ok = ok && !errno && !*end;
        uint64_t y = x;
        if (ok) memcpy(out, &y, sizeof y);
    }
    if (!ok)
        return err_set(err, "%s: metadata \"%s\" = \"%.60s\" is not %s%s", f->path, sf->key, v,
                       what, errno == ERANGE ? " in range" : "");
    return 0;
}

// A count a run can reach is below this: the training state's, and batchnorm's counter.
#define COUNT_LIMIT (INT64_C(1) << 62)

// The training state must be one a run can reach: counts below 2^62 (the step keys the
// dropout masks and the schedule), the epoch's totals consistent (its loss finite: a run
// whose loss was not has diverged, and its weights are no start either), an accuracy in
// percent, a loss scale a scaler can hold. Anything else is a damaged or forged file.
static int check_state(const StFile *f, const TrainState *s, Error *err) {
    const int64_t big = COUNT_LIMIT;
    const char *bad = s->epoch >= INT32_MAX                                ? "epoch"
                      : s->batch >= big                                    ? "batch"
                      : s->step >= (uint64_t)big                           ? "step"
                      : !(s->best_val_acc == -1 || (s->best_val_acc >= 0 && s->best_val_acc <= 100))
                          ? "best_val_acc"
                      : s->epoch_seen >= big                               ? "epoch_seen"
                      : !(s->epoch_loss >= 0 && s->epoch_loss <= DBL_MAX)  ? "epoch_loss"
                      : !(s->epoch_correct >= 0 && s->epoch_correct <= (double)s->epoch_seen)
                          ? "epoch_correct"
                      : !(s->loss_scale > 0 && s->loss_scale <= FLT_MAX)    ? "loss_scale"
                      : s->scaler_good_steps >= big                        ? "scaler_good_steps"
                      : (uint64_t)s->scaler_skipped > s->step              ? "scaler_skipped"
                      : !(s->plateau.best >= 0)                            ? "plateau_best"
                      : s->plateau.bad_epochs > s->epoch                   ? "plateau_bad_epochs"
                      : s->plateau.reductions > s->epoch                   ? "lr_reductions"
                      : !(s->best_val_loss >= 0)                           ? "best_val_loss"
                      : s->best_val_loss_epoch > s->epoch                  ? "best_val_loss_epoch"
                                                                           : NULL;
    if (!bad) return 0;
    return err_set(err, "%s: metadata \"%s\" = \"%.60s\" is not a training state a run can reach "
                        "(counts below 2^62, best_val_acc -1 or 0 to 100, epoch_loss finite and "
                        "at least 0, epoch_correct at most epoch_seen, loss_scale finite and above "
                        "0, scaler_skipped at most step, plateau_best and best_val_loss at least 0 "
                        "or inf, the plateau's counts and best_val_loss_epoch at most epoch); the "
                        "file is damaged", f->path, bad, st_meta(f, bad));
}

static int read_state(const StFile *f, TrainState *st, Error *err) {
    TrainState s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < NSTATE; i++)
        if (meta_number(f, &state_fields[i], (char *)&s + state_fields[i].offset, err)) return -1;
    if (check_state(f, &s, err)) return -1;
    *st = s;
    return 0;
}


// Whether the stored cfg's [data] key (width, height, channels, center_crop), where it is
// set to a number other than 0 (its default: taken from the data, or none), says v.
static bool data_key_agrees(const Cfg *cfg, const char *key, int v) {
    const CfgSection *d = cfg_section(cfg, "data");
    const CfgEntry *e = d ? cfg_entry(d, key) : NULL;
    if (!e) return true;
    char *end;
    errno = 0;
    const long x = strtol(e->value, &end, 10);
    return end == e->value || *end || errno || x == 0 || x == v;
}

// The metadata besides the TrainState, each value checked against what the code can
// handle: the input one an image decodes to (shape_is_input), 1 to CHECKPOINT_MAX_CLASSES
// class names as checkpoint_save writes them (non-empty, one line each), and a cfg that
// parses and whose [data] agrees with the input. Anything else is a
// damaged or forged file: it never reaches the network, the decoders or the loader.
static int read_info(const StFile *f, CheckpointInfo *info, Error *err) {
    CheckpointInfo in = {0};
    const char *cfg, *classes, *input;
    if (meta_required(f, "cfg", &cfg, err) || meta_required(f, "classes", &classes, err) ||
        meta_required(f, "input", &input, err))
        return -1;
    char end;
    if (sscanf(input, "%d,%d,%d%c", &in.input.c, &in.input.h, &in.input.w, &end) != 3 ||
        !shape_is_input(in.input))
        return err_set(err, "%s: metadata \"input\" = \"%.60s\" is not an input shape C,H,W that "
                            "images decode to (C = 1 or 3 channels, H and W from 1 to %d); the "
                            "file is damaged", f->path, input, INPUT_MAX_SIDE);
    int n = *classes ? 1 : 0;
    for (const char *p = classes; *p && n <= CHECKPOINT_MAX_CLASSES; p++) n += *p == '\n';
    if (n < 1 || n > CHECKPOINT_MAX_CLASSES)
        return err_set(err, "%s: metadata \"classes\" names %s classes, not 1 to %d; the file is "
                            "damaged", f->path, n ? "too many" : "no", CHECKPOINT_MAX_CLASSES);
    for (const char *p = classes, *q; p; p = q ? q + 1 : NULL) {
        q = strchr(p, '\n');
        const size_t len = q ? (size_t)(q - p) : strlen(p);
        if (!len || memchr(p, '\r', len))
            return err_set(err, "%s: metadata \"classes\" holds %s class name; a name is "
                                "non-empty and on one line; the file is damaged", f->path,
                           len ? "a broken" : "an empty");
    }
    Cfg parsed;
    char label[1100];
    snprintf(label, sizeof label, "%s (its stored cfg)", f->path);
    if (cfg_parse(&parsed, cfg, label, err)) return -1;
    // A centre crop, where the cfg takes one, is the input's height and width (width and
    // height are then what the images are stretched to before it).
    const bool cropped = !data_key_agrees(&parsed, "center_crop", 0);
    const char *height = cropped ? "center_crop" : "height", *width = cropped ? "center_crop" : "width";
    const char *differs = !data_key_agrees(&parsed, "channels", in.input.c) ? "channels"
                          : !data_key_agrees(&parsed, height, in.input.h)   ? height
                          : !data_key_agrees(&parsed, width, in.input.w)    ? width
                                                                            : NULL;
    cfg_free(&parsed);
    if (differs)
        return err_set(err, "%s: the stored cfg's [data] %s disagrees with the metadata's input "
                            "%d,%d,%d (channels, height, width); the file is damaged", f->path,
                       differs, in.input.c, in.input.h, in.input.w);
    in.cfg_text = xstrndup(cfg, strlen(cfg), err);
    if (!in.cfg_text) return -1;
    in.class_names = xcalloc((size_t)n, sizeof *in.class_names, err);
    if (!in.class_names) goto fail;
    const char *p = classes;
    for (int i = 0; i < n; i++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        in.class_names[i] = xstrndup(p, len, err);
        if (!in.class_names[i]) goto fail;
        in.classes = i + 1;
        p += len + 1;
    }
    *info = in;
    return 0;
fail:
    checkpoint_info_free(&in);
    return -1;
}

int checkpoint_read_info(const char *path, CheckpointInfo *info, TrainState *st, Error *err) {
    if (info) memset(info, 0, sizeof *info);
    StFile f;
    if (st_open(&f, path, err)) return -1;
    CheckpointInfo in = {0};
    TrainState s;
    int rc = -1;
    // Every value is checked whatever the caller asked for: a file that fails here fails
    // for every use (training, resume, --eval, --predict, ./ckpt).
    if (check_format(&f, err) || read_state(&f, &s, err) || read_info(&f, &in, err)) goto done;
    if (info) *info = in;
    else checkpoint_info_free(&in);
    if (st) *st = s;
    rc = 0;
done:
    st_close(&f);
    return rc;
}

// ---- renaming rules -----------------------------------------------------------------------

// The layer part of a key: [*start, *start + *len). "conv1.weight" -> "conv1" (before the
// last '.'); "optimizer.conv1.weight.square_avg" -> "conv1" (the parameter's layer); a
// key without '.' is all layer.
static void layer_part(const char *key, size_t *start, size_t *len) {
    size_t s = is_opt_key(key) ? OPT_PREFIX_LEN : 0, n = strlen(key + s);
    const char *dot = memrchr(key + s, '.', n);
    if (s && dot) {
        n = (size_t)(dot - (key + s));  // drop the state's name
        dot = memrchr(key + s, '.', n);
    }
    if (dot) n = (size_t)(dot - (key + s));
    *start = s;
    *len = n;
}

// Applies the rules in order to name[0..len) into out (cap bytes). Returns 0, or -1 if a
// result does not fit.
static int rename_layer(const char *name, size_t len, const RenameRule *rules, int nrules,
                        RenameMode mode, char *out, size_t cap) {
    char buf[2][TENSOR_NAME_MAX];
    if (len >= sizeof buf[0]) return -1;
    memcpy(buf[0], name, len);
    buf[0][len] = '\0';
    int cur = 0;
    for (int r = 0; r < nrules; r++) {
        const char *s = buf[cur], *from = rules[r].from, *to = rules[r].to;
        size_t nf = strlen(from), nt = strlen(to), n = 0;
        char *d = buf[!cur];
        // Whole: the module called exactly OLD, and its submodules (OLD.*).
        bool whole = mode == RENAME_WHOLE && !strncmp(s, from, nf) && (!s[nf] || s[nf] == '.');
        bool prefix = mode == RENAME_PREFIX && !strncmp(s, from, nf);
        if (mode != RENAME_SUBSTRING && !whole && !prefix) continue;
        while (*s) {
            bool hit = !strncmp(s, from, nf) && (mode == RENAME_SUBSTRING || s == buf[cur]);
            size_t add = hit ? nt : 1;
            if (n + add >= sizeof buf[0]) return -1;
            memcpy(d + n, hit ? to : s, add);
            n += add;
            s += hit ? nf : 1;
        }
        d[n] = '\0';
        cur = !cur;
    }
    if (strlen(buf[cur]) >= cap) return -1;
    strcpy(out, buf[cur]);
    return 0;
}

static int check_rules(const RenameRule *rules, int nrules, Error *err) {
    if (nrules < 1 || !rules) return err_set(err, "no rename rule given: expected OLD=NEW");
    for (int r = 0; r < nrules; r++) {
        if (!rules[r].from || !rules[r].to)
            return err_set(err, "rename rule %d is incomplete", r + 1);
        if (!*rules[r].from)
            return err_set(err,
                           "rename rule '=%s': OLD is empty; expected OLD=NEW with a non-empty OLD",
                           rules[r].to);
    }
    return 0;
}

int checkpoint_rename_key(const char *key, const RenameRule *rules, int nrules, RenameMode mode,
                          char *out, size_t cap) {
    if (check_rules(rules, nrules, NULL)) return -1;
    size_t start, len;
    layer_part(key, &start, &len);
    char layer[TENSOR_NAME_MAX];
    if (rename_layer(key + start, len, rules, nrules, mode, layer, sizeof layer)) return -1;
    int w = snprintf(out, cap, "%.*s%s%s", (int)start, key, layer, key + start + len);
    if (w < 0 || (size_t)w >= cap) return -1;
    return strcmp(out, key) != 0;
}

// ---- strict loading -----------------------------------------------------------------------

// One tensor the network needs from the file.
typedef struct Want {
    const Tensor *param;  // its model tensor (optimizer state: its parameter's)
    Tensor expect;        // the key, shape and dtype the file must hold; data: where it goes
    bool host;            // expect.data is host memory (on_host), else the device's
    bool optional;        // num_batches_tracked: PyTorch fills it in when it is missing
    bool nonnegative;     // a variance or a counter: no value below 0 can be right
    const StEntry *e;     // the file's entry, or NULL if missing
} Want;

// Whether model tensor `name` holds values that cannot be negative: batchnorm's running
// variance and its counter.
static bool model_nonnegative(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".running_var") || !strcmp(dot, ".num_batches_tracked"));
}

// The values a load would take, in host memory (`data` as read, each tensor's bytes rounded
// up to whole floats), checked before any of them reaches the network: every float finite,
// none below 0 where none can be (variances, counters, optimizer state that averages
// squares), and the counters below 2^62 (as the training state's: batchnorm's counts a
// forward pass on, which must not overflow). A file with such values comes from a run that
// diverged, or was damaged or forged: training from it gives NaN, and evaluation garbage.
// The message names the tensors.
static int check_values(const char *path, const Want *want, int nwant, const float *data,
                        Error *err) {
    int nbad = 0;
    char names[512] = "";
    size_t off = 0;
    for (int i = 0; i < nwant; i++) {
        if (!want[i].e) continue;
        const Tensor *t = &want[i].expect;
        const size_t bytes = tensor_bytes(t);
        const float *x = data + off;
        off += staged_floats(bytes);
        int64_t nonfinite = 0, negative = 0, huge = 0, n = tensor_numel(t);
        if (t->dtype == DT_F32) {
            for (int64_t j = 0; j < n; j++) {
                nonfinite += !isfinite(x[j]);
                negative += want[i].nonnegative && x[j] < 0;
            }
        } else if (t->dtype == DT_BF16) {
            for (int64_t j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, (const char *)x + j * sizeof h, sizeof h);
                const float v = bf16_to_float(h);
                nonfinite += !isfinite(v);
                negative += want[i].nonnegative && v < 0;
            }
        } else if (t->dtype == DT_I64) {
            int64_t v;
            for (int64_t j = 0; j < n; j++) {
                memcpy(&v, (const char *)x + j * sizeof v, sizeof v);
                negative += v < 0;
                huge += v >= COUNT_LIMIT;
            }
        }
        if (!nonfinite && !negative && !huge) continue;
        if (nbad++ < 4) {
            const size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s (%lld of %lld values %s)",
                     nbad > 1 ? ", " : "", want[i].expect.name,
                     (long long)(nonfinite ? nonfinite : negative ? negative : huge), (long long)n,
                     nonfinite ? "NaN or infinite" : negative ? "negative" : "2^62 or more");
        }
    }
    if (!nbad) return 0;
    return err_set(err, "%s holds values no trained network has: %s%s; a run whose loss became "
                        "NaN writes NaN weights (start from an earlier checkpoint, with a lower "
                        "lr); otherwise the file is damaged; nothing was loaded", path, names,
                   nbad > 4 ? ", and more tensors" : "");
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool float_dtype(StDType d) {
    return d == ST_F32 || d == ST_F16 || d == ST_BF16 || d == ST_F64;
}

// Whether the file's dtype can fill tensor t: any float type for F32 (converted), I64 for
// the I64 counters.
static bool dtype_fits(StDType d, const Tensor *t) {
    return t->dtype == DT_F32 ? float_dtype(d) : d == st_dtype_from(t->dtype);
}

static bool same_shape(const StEntry *e, const Tensor *t) {
    if (e->ndim != t->ndim) return false;
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] != t->shape[i]) return false;
    return true;
}

// An error message assembled piece by piece (cut at its end; the caller tries shorter
// lists when it does not fit an Error).
typedef struct Msg {
    char s[4096];
    size_t n;
} Msg;

static void msg_add(Msg *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void msg_add(Msg *m, const char *fmt, ...) {
    if (m->n + 1 >= sizeof m->s) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(m->s + m->n, sizeof m->s - m->n, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    m->n += (size_t)w < sizeof m->s - m->n ? (size_t)w : sizeof m->s - m->n - 1;
}

// "a, b, c and 5 more" into m: at most `limit` of names[0..n).
static void msg_names(Msg *m, const char *const *names, int n, int limit) {
    for (int i = 0; i < n && i < limit; i++) msg_add(m, "%s%s", i ? ", " : "", names[i]);
    if (n > limit) msg_add(m, " and %d more", n - limit);
}

// s, single-quoted for a shell if it holds anything but [A-Za-z0-9_./=+-].
static void msg_shell(Msg *m, const char *s) {
    bool plain = *s != '\0';
    for (const char *p = s; *p && plain; p++)
        plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                strchr("_./=+-", *p);
    if (plain) {
        msg_add(m, "%s", s);
        return;
    }
    msg_add(m, "'");
    for (const char *p = s; *p; p++) {
        if (*p == '\'')
            msg_add(m, "'\\''");
        else
            msg_add(m, "%c", *p);
    }
    msg_add(m, "'");
}

// Does the substring rule from=to turn the file's model keys (sorted) into exactly the
// network's parameter names (sorted, n of each)? names is scratch for n names.
static bool rule_fits(const char *from, const char *to, const char *const *file_keys,
                      const char *const *net_names, int n, char (*names)[TENSOR_NAME_MAX],
                      const char **sorted) {
    RenameRule r = {from, to};
    for (int i = 0; i < n; i++) {
        if (checkpoint_rename_key(file_keys[i], &r, 1, RENAME_SUBSTRING, names[i],
                                  TENSOR_NAME_MAX) < 0)
            return false;
        sorted[i] = names[i];
    }
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
    for (int i = 0; i < n; i++)
        if (strcmp(sorted[i], net_names[i])) return false;
    return true;
}

// The layers whose tensors a load leaves alone (init_skip): names of layers or of modules
// above them ("fc", "layer4").
typedef struct Skip {
    const char *const *names;
    int n;
} Skip;

// Whether key (a model or optimizer key) belongs to a skipped layer: its name starts with
// a skipped name followed by '.'.
static bool skipped(const char *key, const Skip *skip) {
    if (is_opt_key(key)) key += OPT_PREFIX_LEN;
    for (int i = 0; i < skip->n; i++) {
        const size_t n = strlen(skip->names[i]);
        if (n && !strncmp(key, skip->names[i], n) && key[n] == '.') return true;
    }
    return false;
}

// Looks for one substring rule OLD=NEW that maps the file's model keys onto the network's
// parameter names exactly (a pure renaming). Candidates come from pairing the first
// unexpected key with each missing key: their layer names whole, then without their
// common prefix and/or suffix ("conv1"/"embed1" -> "conv"/"embed", which also renames
// conv2). On success from/to (TENSOR_NAME_MAX each) hold the rule.
static bool find_rename(const StFile *f, const Want *want, int nwant, const Skip *skip,
                        const char *unexpected0, char *from, char *to) {
    int nfile = 0;
    for (int i = 0; i < f->count; i++)
        nfile += !is_opt_key(f->entries[i].name) && !skipped(f->entries[i].name, skip);
    if (nfile != nwant || !nwant) return false;
    const char **file_keys = calloc((size_t)nwant, sizeof *file_keys);
    const char **net_names = calloc((size_t)nwant, sizeof *net_names);
    const char **sorted = calloc((size_t)nwant, sizeof *sorted);
    char(*names)[TENSOR_NAME_MAX] = calloc((size_t)nwant, sizeof *names);
    bool found = false;
    if (!file_keys || !net_names || !sorted || !names) goto done;  // no suggestion, no harm
    for (int i = 0, k = 0; i < f->count; i++)
        if (!is_opt_key(f->entries[i].name) && !skipped(f->entries[i].name, skip))
            file_keys[k++] = f->entries[i].name;
    for (int i = 0; i < nwant; i++) net_names[i] = want[i].expect.name;
    qsort(net_names, (size_t)nwant, sizeof *net_names, cmp_str_ptr);

    size_t us, ul, ms, ml;
    layer_part(unexpected0, &us, &ul);
    const char *u = unexpected0 + us;
    for (int i = 0; i < nwant && !found; i++) {
        if (want[i].e) continue;  // not missing
        layer_part(want[i].expect.name, &ms, &ml);
        const char *m = want[i].expect.name + ms;
        size_t pre = 0, suf = 0;
        while (pre < ul && pre < ml && u[pre] == m[pre]) pre++;
        while (suf < ul && suf < ml && u[ul - 1 - suf] == m[ml - 1 - suf]) suf++;
        size_t suf2 = suf;  // the common suffix of what is left after the common prefix
        if (suf2 > ul - pre) suf2 = ul - pre;
        if (suf2 > ml - pre) suf2 = ml - pre;
        // (skip from, length from; skip to, length to) for: whole, -prefix, -suffix, -both.
        const size_t cand[4][4] = {{0, ul, 0, ml},
                                   {pre, ul - pre, pre, ml - pre},
                                   {0, ul - suf, 0, ml - suf},
                                   {pre, ul - pre - suf2, pre, ml - pre - suf2}};
        for (int c = 0; c < 4 && !found; c++) {
            if (!cand[c][1]) continue;  // an empty OLD renames nothing
            snprintf(from, TENSOR_NAME_MAX, "%.*s", (int)cand[c][1], u + cand[c][0]);
            snprintf(to, TENSOR_NAME_MAX, "%.*s", (int)cand[c][3], m + cand[c][2]);
            found = rule_fits(from, to, file_keys, net_names, nwant, names, sorted);
        }
    }
done:
    free(file_keys);
    free(net_names);
    free(sorted);
    free(names);
    return found;
}

// Removes from names[0..*n) the optimizer keys whose parameter is itself in the list
// (keeping the order); returns how many it removed, or -1 out of memory. The parameters
// are looked up in a sorted copy: a file's unexpected keys may be a million.
static int drop_shadowed(const char **names, int *n) {
    const char **params = malloc(((size_t)*n + 1) * sizeof *params);
    if (!params) return -1;
    int nparams = 0, kept = 0, dropped = 0;
    for (int i = 0; i < *n; i++)
        if (!is_opt_key(names[i])) params[nparams++] = names[i];
    qsort(params, (size_t)nparams, sizeof *params, cmp_str_ptr);
    for (int i = 0; i < *n; i++) {
        const char *k = names[i];
        bool dup = false;
        if (is_opt_key(k)) {
            const char *param = k + OPT_PREFIX_LEN, *dot = strrchr(param, '.');
            char name[TENSOR_NAME_MAX];
            snprintf(name, sizeof name, "%.*s", (int)(dot ? dot - param : (ptrdiff_t)strlen(param)), param);
            const char *key = name;
            dup = bsearch(&key, params, (size_t)nparams, sizeof *params, cmp_str_ptr) != NULL;
        }
        if (dup)
            dropped++;
        else
            names[kept++] = k;
    }
    free(params);
    *n = kept;
    return dropped;
}

// Where `./ckpt rename` should write in the suggested command: renamed.safetensors next to
// path (renamed2... if path is that file).
static void suggest_out(char *out, size_t cap, const char *path) {
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path + 1) : 0;
    const char *base = "renamed.safetensors";
    if (!strcmp(path + dir, base)) base = "renamed2.safetensors";
    snprintf(out, cap, "%.*s%s", dir, path, base);
}

// Checks the file against want[0..nwant) (sets want[i].e) and, if optimizer, against the
// optimizer keys too; on a mismatch sets err with everything wrong at once.
static int match(const StFile *f, Want *want, int nwant, int nmodel, bool optimizer,
                 const Skip *skip, Error *err) {
    int rc = -1, nmissing = 0, nunexp = 0, nbad = 0, nopt = 0;
    const char **missing = calloc((size_t)nwant + 1, sizeof *missing);
    const char **unexp = calloc((size_t)f->count + 1, sizeof *unexp);
    int *bad = calloc((size_t)nwant + 1, sizeof *bad);
    const char **sorted = calloc((size_t)nwant + 1, sizeof *sorted);
    if (!missing || !unexp || !bad || !sorted) {
        err_set(err, "%s: out of memory checking the checkpoint's keys", f->path);
        goto done;
    }
    for (int i = 0; i < nwant; i++) {
        want[i].e = st_find(f, want[i].expect.name);
        if (!want[i].e && !want[i].optional)
            missing[nmissing++] = want[i].expect.name;
        else if (want[i].e && (!same_shape(want[i].e, &want[i].expect) ||
                               !dtype_fits(want[i].e->dtype, &want[i].expect)))
            bad[nbad++] = i;
        sorted[i] = want[i].expect.name;
    }
    qsort(sorted, (size_t)nwant, sizeof *sorted, cmp_str_ptr);
    for (int i = 0; i < f->count; i++) {
        const char *k = f->entries[i].name;
        bool opt = is_opt_key(k);
        nopt += opt;
        if ((opt && !optimizer) || skipped(k, skip)) continue;
        if (!bsearch(&k, sorted, (size_t)nwant, sizeof *sorted, cmp_str_ptr)) unexp[nunexp++] = k;
    }
    if (!nmissing && !nunexp && !nbad) {
        rc = 0;
        goto done;
    }

    // A file without any optimizer state whose model fits: say so plainly.
    int model_missing = 0, model_unexp = 0;
    for (int i = 0; i < nmissing; i++) model_missing += !is_opt_key(missing[i]);
    for (int i = 0; i < nunexp; i++) model_unexp += !is_opt_key(unexp[i]);
    bool model_bad = false;
    for (int i = 0; i < nbad; i++) model_bad |= bad[i] < nmodel;
    if (optimizer && !nopt && !model_missing && !model_unexp && !model_bad) {
        err_set(err,
                "%s holds no optimizer state (no \"%s\" keys), so it cannot resume training; "
                "start a new run from its weights instead (init=%s)",
                f->path, OPT_PREFIX, f->path);
        goto done;
    }

    // The optimizer keys of missing, unexpected or misshapen parameters say nothing new:
    // they leave the lists, and the message counts them.
    const int shadowed_missing = drop_shadowed(missing, &nmissing);
    const int shadowed_unexp = drop_shadowed(unexp, &nunexp);
    if (shadowed_missing < 0 || shadowed_unexp < 0) {
        err_set(err, "%s: out of memory checking the checkpoint's keys", f->path);
        goto done;
    }
    int shadowed = shadowed_missing + shadowed_unexp;
    int kept = 0;
    for (int i = 0; i < nbad; i++) {
        bool dup = false;
        for (int j = 0; j < nbad && bad[i] >= nmodel && !dup; j++)
            dup = bad[j] < nmodel && want[bad[j]].param == want[bad[i]].param;
        if (dup)
            shadowed++;
        else
            bad[kept++] = bad[i];
    }
    nbad = kept;

    // Weights alone whose model keys differ only in shape: the layers init_skip would leave
    // fresh (a pretrained classifier for another number of classes).
    // (bad keys are in state_dict order: a layer's are neighbours, listed once)
    char skip_hint[200] = "", last[TENSOR_NAME_MAX] = "";
    for (int i = 0; i < nbad && !optimizer && !model_missing && !model_unexp; i++) {
        if (bad[i] >= nmodel) continue;
        size_t start, len, n = strlen(skip_hint);
        layer_part(want[bad[i]].expect.name, &start, &len);
        char layer[TENSOR_NAME_MAX];
        snprintf(layer, sizeof layer, "%.*s", (int)len, want[bad[i]].expect.name + start);
        if (!strcmp(layer, last)) continue;
        memcpy(last, layer, sizeof last);
        if (n + strlen(layer) + 2 < sizeof skip_hint)
            snprintf(skip_hint + n, sizeof skip_hint - n, "%s%s", n ? "," : "", layer);
    }
    char from[TENSOR_NAME_MAX], to[TENSOR_NAME_MAX], out[4096];
    const char *first_unexp = NULL;  // a model key the network does not have
    for (int i = 0; i < nunexp && !first_unexp; i++)
        if (!is_opt_key(unexp[i])) first_unexp = unexp[i];
    bool rename = model_missing && model_missing == model_unexp &&
                  find_rename(f, want, nmodel, skip, first_unexp, from, to);
    suggest_out(out, sizeof out, f->path);
    static const int limits[] = {8, 4, 2, 1};
    for (size_t li = 0; li < sizeof limits / sizeof limits[0]; li++) {
        int lim = limits[li];
        Msg m = {.n = 0};
        msg_add(&m, "%s does not fit this network:", f->path);
        const char *sep = " ";
        if (nmissing) {
            msg_add(&m, "%smissing keys (%d): ", sep, nmissing);
            msg_names(&m, missing, nmissing, lim);
            sep = "; ";
        }
        if (nunexp) {
            msg_add(&m, "%sunexpected keys (%d): ", sep, nunexp);
            msg_names(&m, unexp, nunexp, lim);
            sep = "; ";
        }
        for (int i = 0; i < nbad && i < (lim + 1) / 2; i++) {
            const Want *w = &want[bad[i]];
            char a[160], b[160];
            if (!dtype_fits(w->e->dtype, &w->expect))
                msg_add(&m, "%s%s is %s in the file, not %s", sep, w->expect.name,
                        st_dtype_names[w->e->dtype],
                        w->expect.dtype == DT_F32 ? "a float type" : dtype_names[w->expect.dtype]);
            else
                msg_add(&m, "%s%s is %s in the file but %s in the network", sep, w->expect.name,
                        shape_str(a, sizeof a, w->e->shape, w->e->ndim),
                        shape_str(b, sizeof b, w->expect.shape, w->expect.ndim));
            sep = "; ";
        }
        if (nbad > (lim + 1) / 2)
            msg_add(&m, "%sand %d more keys of another shape", sep, nbad - (lim + 1) / 2);
        if (shadowed) msg_add(&m, "; their optimizer state likewise (%d keys)", shadowed);
        if (skip_hint[0])
            msg_add(&m, "; with init=, init_skip=%s loads the rest and starts those layers fresh "
                        "(a new classifier for your classes, say)", skip_hint);
        if (rename) {
            msg_add(&m, "; if the layers were renamed: ./ckpt rename ");
            msg_shell(&m, f->path);
            msg_add(&m, " ");
            msg_shell(&m, out);
            msg_add(&m, " ");
            char rule[2 * TENSOR_NAME_MAX + 2];
            snprintf(rule, sizeof rule, "%s=%s", from, to);
            msg_shell(&m, rule);
        }
        if (m.n < sizeof err->msg || li + 1 == sizeof limits / sizeof limits[0]) {
            err_set(err, "%s", m.s);
            break;
        }
    }
done:
    free(missing);
    free(unexp);
    free(bad);
    free(sorted);
    return rc;
}

// The loader behind checkpoint_load_weights (st == NULL: any state_dict, the layers in
// skip left alone) and checkpoint_load_all (a cnn.c checkpoint, optimizer state and
// TrainState included).
static int load(const char *path, Net *net, TrainState *st, const Skip *skip, Error *err) {
    StFile f;
    if (st_open(&f, path, err)) return -1;
    int nm = 0, nt = 0, rc = -1;
    Want *want = NULL;
    float *host = NULL;
    TrainState s;
    ModelTensor *model = list_model(net, &nm, &nt, err);
    if (!model || (st && (check_format(&f, err) || read_state(&f, &s, err)))) goto done;
    const int S = st ? net->nstates : 0, T = state_tensor_count(net);
    want = xcalloc((size_t)(nm + S * nt * T), sizeof *want, err);
    if (!want) goto done;
    // Model keys first (in state_dict order), then each trained parameter's optimizer state.
    int nmodel = 0, nwant;
    for (int i = 0; i < nm; i++) {
        const Tensor *p = model[i].t;
        if (skipped(p->name, skip)) continue;
        Want *w = &want[nmodel++];
        w->param = p;
        w->expect = *p;
        w->host = on_host(net, p);
        w->optional = p->dtype == DT_I64;  // num_batches_tracked
        w->nonnegative = model_nonnegative(p->name);
    }
    nwant = nmodel;
    for (int i = 0; i < nm; i++) {
        if (!model[i].trained) continue;
        for (int h = 0; h < S; h++) {
            Tensor t[2];
            if (state_tensors(net, &model[i], h, t)) {
                err_set(err, "%s: the optimizer key of '%s' is too long", path, model[i].t->name);
                goto done;
            }
            for (int u = 0; u < T; u++) {
                Want *w = &want[nwant++];
                w->param = model[i].t;
                w->expect = t[u];
                w->host = net->k->host_memory;
                w->nonnegative = u == 1 || optim_state_nonnegative(net->state_names[h]);
            }
        }
    }
    // State stored in another format than this run's: say which key sets it.
    if (nwant > nmodel) {
        const StEntry *e = st_find(&f, want[nmodel].expect.name);
        for (int fmt = 0; e && fmt < STATE_FORMAT_COUNT; fmt++)
            if (e->dtype == st_dtype_from(state_dtypes[fmt]) && fmt != (int)net->opt_format) {
                err_set(err, "%s: its optimizer state is stored as %s (optimizer_state = %s), "
                             "this run's as %s: resume with optimizer_state = %s",
                        path, state_format_names[fmt], state_format_names[fmt],
                        state_format_names[net->opt_format], state_format_names[fmt]);
                goto done;
            }
    }
    // int8 state whose values mean something else in the file than in this build (written
    // before Adadelta's averages were stored as square roots): refused, not misread.
    if (st && net->opt_format == STATE_INT8 && nwant > nmodel) {
        char ours[128], theirs[128];
        const char *file = st_meta(&f, "int8_roots");
        if (!file) file = int8_roots(net, true, theirs, sizeof theirs);
        if (strcmp(file, int8_roots(net, false, ours, sizeof ours))) {
            err_set(err, "%s: its int8 optimizer state stores [%.60s] as square roots, this build "
                         "[%s]: it was written by another version of cnn.c, which resumes it",
                    path, file, ours);
            goto done;
        }
    }
    // Host staging: every tensor wanted, each rounded up to whole floats.
    size_t units = 1;
    for (int i = 0; i < nwant; i++) units += staged_floats(tensor_bytes(&want[i].expect));
    host = xcalloc(units, sizeof *host, err);
    if (!host) goto done;
    if (match(&f, want, nwant, nmodel, st != NULL, skip, err)) goto done;

    // Everything fits: read it all to the host, and only then touch the network.
    size_t off = 0;
    for (int i = 0; i < nwant; i++) {
        if (!want[i].e) continue;  // an optional counter the file lacks: 0
        Tensor t = want[i].expect;
        t.data = host + off;
        if (st_read_tensor(&f, &t, err)) goto done;
        off += staged_floats(tensor_bytes(&t));
    }
    if (check_values(path, want, nwant, host, err)) goto done;
    off = 0;
    static const int64_t zero = 0;
    for (int i = 0; i < nwant; i++) {
        const size_t bytes = tensor_bytes(&want[i].expect);
        const void *src = host + off;
        if (!want[i].e) src = &zero;
        else off += staged_floats(bytes);
        if (want[i].host) memcpy(want[i].expect.data, src, bytes);
        else if (bytes) net->k->upload(want[i].expect.data, src, bytes);
    }
    if (net->k->sync) net->k->sync();
    if (st) *st = s;
    rc = 0;
done:
    free(model);
    free(want);
    free(host);
    st_close(&f);
    return rc;
}

int checkpoint_load_weights(const char *path, Net *net, const char *const *skip, int nskip,
                            Error *err) {
    const Skip sk = {skip, nskip};
    return load(path, net, NULL, &sk, err);
}

int checkpoint_load_all(const char *path, Net *net, TrainState *st, Error *err) {
    if (!st) return err_set(err, "%s: checkpoint_load_all needs a TrainState to fill", path);
    const Skip none = {NULL, 0};
    return load(path, net, st, &none, err);
}

int checkpoint_probe(const char *path, bool *is_checkpoint, Error *err) {
    StFile f;
    if (st_open(&f, path, err)) return -1;
    *is_checkpoint = st_meta(&f, "format") != NULL;
    st_close(&f);
    return 0;
}

// ---- renaming -----------------------------------------------------------------------------

typedef struct Renamed {
    char name[TENSOR_NAME_MAX];  // the new name
    const char *old;             // the file's name
} Renamed;

// By name, model keys before optimizer keys (so a clash is reported by its model key).
static int cmp_renamed(const void *a, const void *b) {
    const char *x = ((const Renamed *)a)->name, *y = ((const Renamed *)b)->name;
    int ox = is_opt_key(x), oy = is_opt_key(y);
    return ox != oy ? ox - oy : strcmp(x, y);
}

// Renames the layers of the cfg text (the same rules as the keys); *out is the new text
// (malloc'd) or NULL if no layer name changed.
static int rename_cfg(const char *text, const char *in, const RenameRule *rules, int nrules,
                      RenameMode mode, char **out, Error *err) {
    *out = NULL;
    char label[512];
    snprintf(label, sizeof label, "%s (its stored cfg)", in);
    Cfg cfg;
    if (cfg_parse(&cfg, text, label, err)) return -1;
    int rc = -1, changed = 0;
    // Every layer's name before (olds) and after (names) the renaming, all taken before any
    // section changes: a block member's name follows its block's.
    char(*names)[TENSOR_NAME_MAX] = xcalloc((size_t)cfg.nsections, sizeof *names, err);
    char(*olds)[LAYER_NAME_MAX] = names ? xcalloc((size_t)cfg.nsections, sizeof *olds, err) : NULL;
    if (!olds || layer_section_count(&cfg, err) < 0) goto done;  // blocks as a network takes them
    for (int i = 0; i < cfg.nsections; i++)
        if (layer_is_section(&cfg.sections[i])) layer_section_name(&cfg, &cfg.sections[i], olds[i], sizeof olds[i]);
    for (int i = 0; i < cfg.nsections; i++) {
        CfgSection *s = &cfg.sections[i];
        if (!layer_is_section(s)) continue;
        const char *old = olds[i];
        char tmp[TENSOR_NAME_MAX];
        const char *why = NULL;
        if (rename_layer(old, strlen(old), rules, nrules, mode, tmp, sizeof tmp))
            why = "it is longer than a layer name may be";
        else
            why = layer_name_problem(tmp);
        if (why) {
            err_set(err, "%s: renaming layer '%s' of its cfg (line %d) gives '%s': %s", in, old,
                    s->line, tmp, why);
            goto done;
        }
        snprintf(names[i], sizeof names[i], "%s", tmp);
        for (int j = 0; j < i; j++)
            if (names[j][0] && !strcmp(names[j], names[i])) {
                err_set(err,
                        "%s: the renaming gives two layers of its cfg the name '%s' (lines %d "
                        "and %d); rename them apart",
                        in, names[i], cfg.sections[j].line, s->line);
                goto done;
            }
    }
    for (int i = 0; i < cfg.nsections; i++) {
        CfgSection *s = &cfg.sections[i];
        if (!layer_is_section(s)) continue;
        // A block's member keeps its name under its block's: the part after it.
        const CfgSection *b = layer_section_block(&cfg, s);
        const char *set = names[i];
        if (b) {
            const char *under = names[b - cfg.sections];
            const size_t nb = strlen(under);
            if (strncmp(names[i], under, nb) || names[i][nb] != '.') {
                err_set(err, "%s: renaming layer '%s' of its cfg (line %d) gives '%s', which is not "
                        "under its block's new name '%s' (a prefix rule renames a block with its "
                        "members)", in, olds[i], s->line, names[i], under);
                goto done;
            }
            set = names[i] + nb + 1;
            if (!strcmp(olds[i], names[i]) && !strcmp(olds[b - cfg.sections], under)) continue;
        } else if (!strcmp(olds[i], names[i])) {
            continue;
        }
        if (cfg_set(s, "name", set, err)) goto done;
        changed++;
    }
    if (changed) {
        *out = cfg_to_text(&cfg, err);
        if (!*out) goto done;
    }
    rc = 0;
done:
    free(names);
    free(olds);
    cfg_free(&cfg);
    return rc;
}

// Whether paths a and b name the same file (b may not exist yet).
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return !strcmp(a, b) ||
           (!stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

int checkpoint_export(const char *in, const char *out, int *ntensors, Error *err) {
    *ntensors = 0;
    if (same_file(in, out))
        return err_set(err, "'%s' is the input file: export to another file (the input is "
                            "never modified)", out);
    StFile f;
    if (st_open(&f, in, err)) return -1;
    int rc = -1, n = 0;
    Tensor *t = xcalloc((size_t)f.count + 1, sizeof *t, err);
    if (!t) goto done;
    for (int i = 0; i < f.count; i++) {
        const StEntry *e = &f.entries[i];
        if (strncmp(e->name, CHECKPOINT_OPTIMIZER_PREFIX, strlen(CHECKPOINT_OPTIMIZER_PREFIX)) &&
            st_as_tensor(&f, e, &t[n++], err))
            goto done;
    }
    if (!n) {
        err_set(err, "%s holds no model tensors (only optimizer state): nothing to export", in);
        goto done;
    }
    if (st_write(out, t, n, NULL, NULL, 0, err)) goto done;
    *ntensors = n;
    rc = 0;
done:
    free(t);
    st_close(&f);
    return rc;
}

int checkpoint_rename(const char *in, const char *out, const RenameRule *rules, int nrules,
                      RenameMode mode, int *renamed, Error *err) {
    if (renamed) *renamed = 0;
    if (check_rules(rules, nrules, err)) return -1;
    if ((unsigned)mode > RENAME_WHOLE) return err_set(err, "unknown rename mode %d", (int)mode);
    if (same_file(in, out))
        return err_set(err,
                       "'%s' is the input file: write the renamed checkpoint to another file "
                       "(the input is never modified)",
                       out);
    StFile f;
    if (st_open(&f, in, err)) return -1;
    int rc = -1, count = 0;
    Tensor *t = NULL;
    Renamed *r = NULL;
    char *cfg_text = NULL;
    const char **keys = NULL, **values = NULL;
    const char *cfg = NULL;
    // A cnn.c checkpoint (its stored cfg renamed too), or a plain state_dict (PyTorch's,
    // DataParallel's "module." keys: its metadata copied as it is).
    const bool checkpoint = st_meta(&f, "format") != NULL;
    if (checkpoint && (check_format(&f, err) || meta_required(&f, "cfg", &cfg, err))) goto done;
    t = xcalloc((size_t)f.count, sizeof *t, err);
    r = xcalloc((size_t)f.count, sizeof *r, err);
    keys = xcalloc((size_t)f.nmeta, sizeof *keys, err);
    values = xcalloc((size_t)f.nmeta, sizeof *values, err);
    if (!t || !r || !keys || !values) goto done;

    for (int i = 0; i < f.count; i++) {
        const StEntry *e = &f.entries[i];
        if (st_as_tensor(&f, e, &t[i], err)) goto done;
        int c = checkpoint_rename_key(e->name, rules, nrules, mode, r[i].name, sizeof r[i].name);
        if (c < 0) {
            err_set(err, "%s: renaming key '%s' gives a name longer than %d characters", in,
                    e->name, TENSOR_NAME_MAX - 1);
            goto done;
        }
        r[i].old = e->name;
        if (c) {
            size_t start, len;
            layer_part(r[i].name, &start, &len);
            char layer[TENSOR_NAME_MAX];
            snprintf(layer, sizeof layer, "%.*s", (int)len, r[i].name + start);
            const char *why = layer_name_problem(layer);
            if (why) {
                err_set(err,
                        "%s: renaming key '%s' gives '%s', whose layer name '%s' is invalid: %s",
                        in, e->name, r[i].name, layer, why);
                goto done;
            }
            snprintf(t[i].name, sizeof t[i].name, "%s", r[i].name);
            count++;
        }
    }
    if (!count) {  // nothing to do: out is not written
        rc = 0;
        goto done;
    }
    qsort(r, (size_t)f.count, sizeof *r, cmp_renamed);
    for (int i = 1; i < f.count; i++)
        if (!strcmp(r[i - 1].name, r[i].name)) {
            const char *x = r[i - 1].old, *y = r[i].old, *z = r[i].name;
            if (!strcmp(x, z) || !strcmp(y, z))  // one of them keeps its name
                err_set(err,
                        "%s: renaming '%s' gives '%s', which the file already holds; nothing "
                        "was written",
                        in, strcmp(x, z) ? x : y, z);
            else
                err_set(err,
                        "%s: the renaming makes two keys '%s' (from '%s' and '%s'); nothing "
                        "was written",
                        in, z, x, y);
            goto done;
        }
    if (checkpoint && rename_cfg(cfg, in, rules, nrules, mode, &cfg_text, err)) goto done;
    for (int i = 0; i < f.nmeta; i++) {
        keys[i] = f.meta[i].key;
        values[i] = cfg_text && !strcmp(keys[i], "cfg") ? cfg_text : f.meta[i].value;
    }
    if (st_write(out, t, f.count, keys, values, f.nmeta, err)) goto done;
    if (renamed) *renamed = count;
    rc = 0;
done:
    free(t);
    free(r);
    free(keys);
    free(values);
    free(cfg_text);
    st_close(&f);
    return rc;
}
