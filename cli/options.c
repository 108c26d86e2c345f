// options.c: the [train] section and ./train's command line (options.h).
#include "options.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/layer.h"
#include "../nn/net.h"

const CfgKey train_keys[] = {
    {"epochs", "14", "passes over the training set"},
    {"batch", "64", "samples per optimizer step"},
    {"accumulate", "1", "micro-batches per step: activations are sized for batch/accumulate"},
    {"precision", "fp32", "fp32; fp16: activations and their gradients stored as IEEE halves "
                          "(with loss scaling); bf16: stored as bfloat16, and the GEMMs on bf16 "
                          "operands where the CPU has BF16 instructions (AMX, AVX512-BF16) or on "
                          "a GPU"},
    {"matmul", "auto", "the GEMMs' arithmetic (convolutions, linear layers), accumulating in fp32: "
                       "auto follows precision (fp16: tf32, bf16: bf16, fp32: fp32); fp32; tf32 "
                       "(inputs rounded to 10 mantissa bits: TF32 tensor cores on CUDA, fp32 on the "
                       "CPU); bf16 (inputs rounded to bf16: on AMX or AVX512-BF16, or bf16 tensor "
                       "cores; fp32 on other CPUs), also with fp32 activations (changes the result)"},
    {"checkpoint", "none", "activation checkpointing: none, sqrt, or a number of segments"},
    {"fused_update", "auto", "each layer's optimizer update runs during backward once its "
                             "gradient is complete, so the gradient memory holds a layer's at a "
                             "time, not all of them; the same bits. auto: wherever it may run "
                             "(fp32 or bf16, accumulate = 1, no clip_grad_norm); 1: required; 0: off"},
    {"recompute_1x1", "1", "a block's 1x1 convolutions that do not narrow (a Bottleneck's conv3, "
                           "an InvertedResidual's expansion) are computed again in backward "
                           "instead of kept: the same bits, for a GEMM more; 0: kept"},
    {"memory", "", "a budget (512M, 2G, ...): when the run does not fit, the fastest plan of "
                   "the fused update, recompute_1x1, checkpoint segments, sweeps and exact micro-batches that does, timed by a probe "
                   "of a few steps; fp16, micro-batches under batchnorm and compressed optimizer "
                   "state or activations only with auto_fp16, auto_microbatch and auto_compress"},
    {"auto_fp16", "0", "1: memory may also switch precision to fp16 (a different result)"},
    {"auto_compress", "0", "1: memory may also store the optimizer state as bf16 or int8 "
                           "(optimizer_state) and, when that is not enough, compress the "
                           "activations to 8, 4 or 2 bits (compress; a different result)"},
    {"auto_microbatch", "0", "1: memory may also split the batch into micro-batches on a network "
                             "with batchnorm, which then normalises each micro-batch by its own "
                             "statistics (a different training)"},
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
    {"compress", "0", "2, 4 or 8: what backward reads of the activations is kept as codes of "
                      "that many bits in groups of 256 values, stochastically rounded "
                      "(ActNN); forward stays exact; 0 = off. Changes the result"},
    {"compress_skip", "", "compress: layers whose outputs stay exact, names or prefixes, "
                          "comma-separated (conv1, layer4)"},
    {"optimizer_state", "fp32", "how the optimizer's state is stored: fp32, bf16 (half the "
                                "memory) or int8 (a quarter: block-wise 8-bit quantization); "
                                "bf16 and int8 change the result"},
    {"clip_grad_norm", "0", "scale the gradients down to this 2-norm when theirs is larger, as "
                            "torch.nn.utils.clip_grad_norm_ before the step; 0 = never (it "
                            "turns the fused update off, which updates before every gradient "
                            "exists)"},
    {"label_smoothing", "0", "the training loss's label smoothing, as PyTorch's "
                             "CrossEntropyLoss(label_smoothing): the target puts e / classes on "
                             "every class and 1 - e more on the label (0 to 1; the test loss "
                             "stays plain)"},
    {"schedule", "step", "step (StepLR: lr_gamma each epoch), cosine (annealed each step to "
                         "lr_min over the run), onecycle (OneCycleLR: up to lr and down again "
                         "over the run, each step) or plateau (ReduceLROnPlateau: lr times "
                         "plateau_factor when the validation loss stops falling)"},
    {"lr_gamma", "0.7", "step: the learning rate is multiplied by this after each epoch"},
    {"lr_min", "0", "cosine: the learning rate at the end of the run; plateau: the least it "
                    "reduces to"},
    {"warmup", "0", "step, cosine: steps of linear warmup first, from warmup_start * lr "
                    "(PyTorch's LinearLR)"},
    {"warmup_start", "0.3333333333333333", "warmup: the fraction of lr at the first step"},
    {"pct_start", "0.3", "onecycle: the share of the run's steps over which the lr rises from "
                         "lr / div_factor to lr"},
    {"div_factor", "25", "onecycle: the first lr is lr / div_factor"},
    {"final_div_factor", "1e4", "onecycle: the last lr is lr / div_factor / final_div_factor"},
    {"cycle_momentum", "1", "onecycle: 1 cycles sgd's momentum or adamw's beta1 (in place of "
                            "momentum and betas' first) from max_momentum down to "
                            "base_momentum and back, as OneCycleLR; adadelta needs 0"},
    {"base_momentum", "0.85", "onecycle, cycle_momentum: the momentum at the lr's peak"},
    {"max_momentum", "0.95", "onecycle, cycle_momentum: the momentum at the start and the end"},
    {"plateau_factor", "0.1", "plateau: the lr is multiplied by this when the validation loss "
                              "has not improved (by 1e-4 relative) for more than "
                              "plateau_patience epochs"},
    {"plateau_patience", "10", "plateau: epochs without improvement that it waits for"},
    {"patience", "0", "early stopping: stop (exit status 0) when the validation loss has not "
                      "fallen below its lowest for this many epochs; 0 = never"},
    {"freeze", "", "layers whose parameters stay fixed, names or prefixes, comma-separated "
                   "(conv1, layer1): no gradients, no optimizer state"},
    {"freeze_bn", "1", "1: frozen layers' batchnorms normalise by their running statistics, "
                       "which stay; 0: by the batch's, updating them"},
    {"device", "cpu", "cpu, or cuda in builds with the CUDA backend"},
    {"threads", "0", "CPU threads for OpenBLAS and the kernels; 0 = all cores"},
    {"bucket_mb", "auto", "with several processes: the gradients are summed across them in "
                          "buckets of this many MB, each while backward computes the layers "
                          "before it; auto = an eighth of the gradients, 0.064 to 25 MB; 0 = "
                          "one sum after backward"},
    {"seed", "1", "seeds initialisation (the weights PyTorch draws after torch.manual_seed), shuffling and dropout"},
    {"save", "runs/<cfg name>", "folder for checkpoints (last, best), metrics.jsonl and "
                                "curves.svg; another run's files there move to previous-N/"},
    {"save_every", "0", "also write the last checkpoint every N batches; 0 = each epoch only"},
    {"stop_after", "0", "stop after this many optimizer steps in all, with a checkpoint to "
                        "resume, and exit with 0 (for time-boxed sessions); 0 = never"},
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
const int train_nkeys = sizeof train_keys / sizeof train_keys[0];

void options_usage(FILE *f) {
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
    cfg_print_keys(f, "train", train_keys, train_nkeys);
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
int options_override(Cfg *cfg, const char *arg, Error *err) {
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
    } else if (has_key(train_keys, train_nkeys, key)) {
        s = cfg_section(cfg, "train");
    } else if (has_key(data_keys, data_nkeys, key)) {
        s = cfg_section(cfg, "data");
    } else {
        return err_set(err, "command line: unknown key '%s': not a key of [train] or [data] "
                            "(for a layer's key write LAYER.%s=...; see ./train --help)", key, key);
    }
    if (!s) return err_set(err, "command line: '%s': %s has no [%s] section", arg, cfg->path,
                           has_key(train_keys, train_nkeys, key) ? "train" : "data");
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
    int kind, format;
    if (cfg_choice(cfg, t, "optimizer", "adadelta", optim_names, OPTIM_COUNT, &kind, err) ||
        cfg_choice(cfg, t, "optimizer_state", "fp32", state_format_names, STATE_FORMAT_COUNT,
                   &format, err))
        return -1;
    o->kind = (OptimKind)kind;
    o->state_format = (StateFormat)format;
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
        cfg_int(cfg, t, "decay_skip_norm_bias", "0", 0, 1, &skip, err) ||
        cfg_float(cfg, t, "clip_grad_norm", "0", 0.0, 1e12, &o->clip_grad_norm, err))
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

// OneCycleLR's keys (schedule = onecycle). With cycle_momentum the optimizer's momentum
// starts at max_momentum, as OneCycleLR sets it (sgd's momentum state is then planned).
static int read_onecycle(Schedule *s, Optimizer *o, const Cfg *cfg, const CfgSection *t,
                         Error *err) {
    int64_t cycle;
    if (cfg_float(cfg, t, "pct_start", "0.3", 0.0, 1.0, &s->pct_start, err) ||
        cfg_float(cfg, t, "div_factor", "25", 1e-12, 1e12, &s->div_factor, err) ||
        cfg_float(cfg, t, "final_div_factor", "1e4", 1e-12, 1e12, &s->final_div_factor, err) ||
        cfg_int(cfg, t, "cycle_momentum", "1", 0, 1, &cycle, err) ||
        cfg_float(cfg, t, "base_momentum", "0.85", 0.0, 1.0, &s->base_momentum, err) ||
        cfg_float(cfg, t, "max_momentum", "0.95", 0.0, 1.0, &s->max_momentum, err))
        return -1;
    s->cycle_momentum = cycle != 0;
    if (s->kind != SCHEDULE_ONECYCLE || !s->cycle_momentum) return 0;
    if (o->kind == OPTIM_ADADELTA)
        return err_set(err, "%s: [train] schedule = onecycle cycles the momentum (cycle_momentum "
                            "= 1, as PyTorch's OneCycleLR), which adadelta has not: set "
                            "cycle_momentum = 0, or optimizer = sgd or adamw", cfg->path);
    if (o->kind == OPTIM_SGD && !(s->base_momentum > 0 && s->max_momentum > 0))
        return err_set(err, "%s: [train] schedule = onecycle with cycle_momentum = 1 and sgd needs "
                            "base_momentum and max_momentum above 0: the momentum buffer is kept "
                            "for every step; or set cycle_momentum = 0", cfg->path);
    if (o->kind == OPTIM_SGD) o->momentum = s->max_momentum;
    else o->beta1 = s->max_momentum;
    return 0;
}

// The schedule's keys; after read_optimizer (onecycle may set its momentum).
static int read_schedule(Schedule *s, Optimizer *o, const Cfg *cfg, const CfgSection *t,
                         Error *err) {
    int kind;
    if (cfg_choice(cfg, t, "schedule", "step", schedule_names, SCHEDULE_COUNT, &kind, err) ||
        cfg_float(cfg, t, "lr_gamma", "0.7", 0.0, 1e6, &s->gamma, err) ||
        cfg_float(cfg, t, "lr_min", "0", 0.0, 1e6, &s->lr_min, err) ||
        cfg_int(cfg, t, "warmup", "0", 0, INT64_MAX, &s->warmup, err) ||
        cfg_float(cfg, t, "warmup_start", "0.3333333333333333", 1e-9, 1.0, &s->warmup_start, err) ||
        cfg_float(cfg, t, "plateau_factor", "0.1", 0.0, 1.0, &s->factor, err) ||
        cfg_int(cfg, t, "plateau_patience", "10", 0, INT64_MAX, &s->patience, err))
        return -1;
    s->kind = (ScheduleKind)kind;
    if (s->warmup && (s->kind == SCHEDULE_ONECYCLE || s->kind == SCHEDULE_PLATEAU))
        return err_set(err, "%s: [train] warmup = %lld goes with schedule = step or cosine: "
                            "onecycle rises from lr / div_factor itself (pct_start), and plateau "
                            "reduces the lr it is given; set warmup = 0", cfg->path,
                       (long long)s->warmup);
    if (!(s->factor < 1))
        return err_set(err, "%s: [train] plateau_factor = %g: it multiplies the learning rate "
                            "down, so it must be below 1 (PyTorch's factor)", cfg->path, s->factor);
    return read_onecycle(s, o, cfg, t, err);
}

// checkpoint = none | sqrt | N: the segments (NetOptions.segments).
static int parse_segments(const char *text, int *segments, const char *cfg_path, Error *err) {
    if (strcmp(text, "none") == 0) {
        *segments = 0;
    } else if (strcmp(text, "sqrt") == 0) {
        *segments = NET_SEGMENTS_SQRT;
    } else {
        char *end;
        const long n = strtol(text, &end, 10);
        if (*end || n < 1 || n > 100000)
            return err_set(err, "%s: [train] checkpoint = '%s': expected none, sqrt or a number "
                                "of segments >= 1", cfg_path, text);
        *segments = (int)n;
    }
    return 0;
}

// memory = 512M, 2G, 800000K, ...: bytes into *bytes; "" = no budget (0).
static int parse_memory(const char *text, size_t *bytes, const char *cfg_path, Error *err) {
    *bytes = 0;
    if (!text[0]) return 0;
    char *end;
    const double v = strtod(text, &end);
    double unit = 1;
    if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || !(v > 0) || v * unit > 1e18)
        return err_set(err, "%s: [train] memory = '%s': expected a size such as 512M, 2G "
                            "or 800000K", cfg_path, text);
    *bytes = (size_t)(v * unit);
    return 0;
}

// The precision, the GEMMs' arithmetic (matmul) and the fp16 loss scaler's keys.
static int read_precision(Options *o, const Cfg *cfg, const CfgSection *t, const char *cfg_path,
                          Error *err) {
    static const char *const precisions[] = {"fp32", "fp16", "bf16"};
    static const DType precision_types[] = {DT_F32, DT_F16, DT_BF16};
    int precision, matmul;
    const char *loss_scale;
    int64_t growth_interval;
    double init_scale;
    if (cfg_choice(cfg, t, "precision", "fp32", precisions, 3, &precision, err) ||
        cfg_choice(cfg, t, "matmul", "auto", matmul_names, MATMUL_COUNT, &matmul, err) ||
        cfg_str(cfg, t, "loss_scale", "dynamic", &loss_scale, err) ||
        cfg_float(cfg, t, "init_scale", "65536", 1e-30, 1e30, &init_scale, err) ||
        cfg_int(cfg, t, "growth_interval", "2000", 1, INT64_MAX, &growth_interval, err))
        return -1;
    o->precision = precision_types[precision];
    o->matmul = (Matmul)matmul;
    if (strcmp(loss_scale, "dynamic") == 0) {
        o->scaling = scaler_rules(true, growth_interval);
        o->init_scale = init_scale;
        return 0;
    }
    char *end;
    const double fixed = strtod(loss_scale, &end);
    if (*end || !(fixed > 0) || !isfinite(fixed))
        return err_set(err, "%s: [train] loss_scale = '%s': expected dynamic or a positive "
                            "number", cfg_path, loss_scale);
    o->scaling = scaler_rules(false, growth_interval);
    o->init_scale = fixed;
    return 0;
}

// The memory savers (checkpoint, fused_update, recompute_1x1, compress, memory and what it may choose) and
// the combinations that cannot hold; after read_precision and read_optimizer.
static int read_savers(Options *o, const Cfg *cfg, const CfgSection *t, const char *cfg_path,
                       Error *err) {
    const char *checkpoint, *memory;
    int64_t recompute_1x1, auto_fp16, auto_microbatch, auto_compress, compress;
    enum { FUSED_AUTO, FUSED_OFF, FUSED_ON };  // fused_modes' order
    static const char *const fused_modes[] = {"auto", "0", "1"};
    int fused_mode;
    if (cfg_str(cfg, t, "checkpoint", "none", &checkpoint, err) ||
        cfg_choice(cfg, t, "fused_update", "auto", fused_modes, 3, &fused_mode, err) ||
        cfg_int(cfg, t, "recompute_1x1", "1", 0, 1, &recompute_1x1, err) ||
        cfg_int(cfg, t, "compress", "0", 0, 8, &compress, err) ||
        read_names(cfg, t, "compress_skip", &o->compress_skip, err) ||
        cfg_str(cfg, t, "memory", "", &memory, err) ||
        cfg_int(cfg, t, "auto_fp16", "0", 0, 1, &auto_fp16, err) ||
        cfg_int(cfg, t, "auto_microbatch", "0", 0, 1, &auto_microbatch, err) ||
        cfg_int(cfg, t, "auto_compress", "0", 0, 1, &auto_compress, err) ||
        parse_segments(checkpoint, &o->segments, cfg_path, err) ||
        parse_memory(memory, &o->memory, cfg_path, err))
        return -1;
    if (compress && !act_bits_valid((int)compress))
        return err_set(err, "%s: [train] compress = %lld: expected 0 (off), 2, 4 or 8 bits",
                       cfg_path, (long long)compress);
    o->compress = (int)compress;
    // auto: wherever it may run; `memory =` drops it where it chooses fp16 or micro-batches.
    const bool fusable = o->precision != DT_F16 && o->optim.clip_grad_norm <= 0 && o->accumulate == 1;
    o->fused_update = fused_mode == FUSED_ON || (fused_mode == FUSED_AUTO && fusable);
    o->recompute_1x1 = recompute_1x1 != 0;
    o->auto_fp16 = (int)auto_fp16;
    o->auto_microbatch = (int)auto_microbatch;
    o->auto_compress = (int)auto_compress;
    if (fused_mode == FUSED_ON && o->precision == DT_F16)
        return err_set(err, "%s: [train] fused_update = 1 does not run with precision = fp16: its "
                            "loss scaler must see every gradient before it decides whether to "
                            "skip the step; set fused_update = auto or 0", cfg_path);
    if (fused_mode == FUSED_ON && o->optim.clip_grad_norm > 0)
        return err_set(err, "%s: [train] fused_update = 1 and clip_grad_norm = %g: clipping needs "
                            "the norm of every gradient before the first update; set one of "
                            "them to 0", cfg_path, o->optim.clip_grad_norm);
    if (fused_mode == FUSED_ON && o->accumulate > 1)
        return err_set(err, "%s: [train] fused_update = 1 needs accumulate = 1: with %d "
                            "micro-batches every gradient sums them all before the update; set "
                            "fused_update = auto or 0, or accumulate = 1", cfg_path, o->accumulate);
    return 0;
}

// Where the run starts and what it leaves: seed, save folder, resume, init, stops, profile.
static int read_run(Options *o, const Cfg *cfg, const CfgSection *t, const char *cfg_path,
                    Error *err) {
    int64_t seed, resume_force, profile;
    const char *save;
    if (cfg_int(cfg, t, "seed", "1", 0, INT64_MAX, &seed, err) ||
        cfg_str(cfg, t, "save", "", &save, err) ||
        cfg_int(cfg, t, "save_every", "0", 0, INT64_MAX, &o->save_every, err) ||
        cfg_int(cfg, t, "stop_after", "0", 0, INT64_MAX, &o->stop_after, err) ||
        cfg_str(cfg, t, "resume", "", &o->resume, err) ||
        cfg_int(cfg, t, "resume_force", "0", 0, 1, &resume_force, err) ||
        cfg_str(cfg, t, "init", "", &o->init, err) ||
        read_names(cfg, t, "init_skip", &o->init_skip, err) ||
        cfg_int(cfg, t, "profile", "0", 0, 1, &profile, err))
        return -1;
    o->seed = (uint64_t)seed;
    o->resume_force = (int)resume_force;
    o->profile = (int)profile;
    if (save[0]) {
        snprintf(o->save, sizeof o->save, "%s", save);
    } else {  // runs/<cfg file name without directory and extension>
        const char *base = strrchr(cfg_path, '/') ? strrchr(cfg_path, '/') + 1 : cfg_path;
        int len = (int)strcspn(base, ".");
        snprintf(o->save, sizeof o->save, "runs/%.*s", len, base);
    }
    return 0;
}

int options_read(Options *o, const Cfg *cfg, const char *cfg_path, DataFiles data_files, Error *err) {
    const CfgSection *t = cfg_section(cfg, "train"), *d = cfg_section(cfg, "data");
    if (!t) return err_set(err, "%s: no [train] section (see models/mnist.cfg)", cfg_path);
    if (!d) return err_set(err, "%s: no [data] section (see models/mnist.cfg)", cfg_path);
    if (cfg_check_keys(cfg, t, train_keys, train_nkeys, err) || data_cfg_read(&o->data, cfg, d, data_files, err))
        return -1;
    int64_t epochs, batch, threads, accumulate, freeze_bn;
    if (cfg_int(cfg, t, "epochs", "14", 1, 1000000, &epochs, err) ||
        cfg_int(cfg, t, "batch", "64", 1, 1 << 20, &batch, err) ||
        cfg_int(cfg, t, "accumulate", "1", 1, 1 << 20, &accumulate, err) ||
        cfg_float(cfg, t, "label_smoothing", "0", 0.0, 1.0, &o->label_smoothing, err) ||
        read_optimizer(&o->optim, cfg, t, err) || read_schedule(&o->schedule, &o->optim, cfg, t, err) ||
        cfg_int(cfg, t, "patience", "0", 0, INT64_MAX, &o->patience, err) ||
        read_names(cfg, t, "freeze", &o->freeze, err) ||
        cfg_int(cfg, t, "freeze_bn", "1", 0, 1, &freeze_bn, err) ||
        cfg_str(cfg, t, "device", "cpu", &o->device, err) ||
        cfg_int(cfg, t, "threads", "0", 0, 4096, &threads, err))
        return -1;
    const CfgEntry *bucket = cfg_entry(t, "bucket_mb");
    o->bucket_mb = -1;  // auto
    if (bucket && strcmp(bucket->value, "auto") &&
        cfg_float(cfg, t, "bucket_mb", "auto", 0, 1 << 20, &o->bucket_mb, err))
        return -1;
    o->epochs = (int)epochs, o->batch = (int)batch, o->threads = (int)threads;
    o->accumulate = (int)accumulate;
    o->freeze_bn = (int)freeze_bn;
    if (batch % accumulate != 0)
        return err_set(err, "%s: [train] accumulate = %lld does not divide batch = %lld: the "
                            "micro-batches must be equal", cfg_path, (long long)accumulate, (long long)batch);
    if (read_precision(o, cfg, t, cfg_path, err) || read_savers(o, cfg, t, cfg_path, err) ||
        read_run(o, cfg, t, cfg_path, err))
        return -1;
    return 0;
}
