// train.c: the trainer. ./train CFG [key=value ...]
//
// Reads the cfg, applies command-line overrides, opens the data, plans and builds the
// network on the chosen device, sets up where training starts (fresh, init= or resume=)
// and trains it (cli/loop.c), evaluating on the test set after each epoch. Its other jobs
// have files of their own in cli/: the options (options.c), the training loop (loop.c),
// what a run prints and logs (report.c, metrics.c), --eval (evaluate.c), --predict
// (predict.c), resuming (resume.c), the save folder (run_folder.c) and the memory plan
// with what `memory =` chooses (plan.c).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/evaluate.h"
#include "cli/loop.h"
#include "cli/metrics.h"
#include "cli/options.h"
#include "cli/plan.h"
#include "cli/predict.h"
#include "cli/report.h"
#include "cli/resume.h"
#include "cli/run_folder.h"
#include "data/data_cfg.h"
#include "nn/budget.h"
#include "nn/cfg.h"
#include "nn/checkpoint.h"
#include "nn/dist.h"
#include "nn/kernels.h"
#include "nn/net.h"
#include "nn/optim.h"
#include "nn/profile.h"

// The exit statuses besides 0 (trained, or done) and 1 (an error).
enum {
    EXIT_USAGE = 2,         // the command line is not one ./train takes
    EXIT_NOTHING_LEFT = 3,  // resume: the checkpoint has trained every epoch asked for
    EXIT_STOPPED = 130,     // a signal stopped it, with a checkpoint to resume (stop_after,
                            // a planned stop, exits with 0)
};

// The processes of a data-parallel run (nn/dist.h): rank 0 of 1 without mpirun.
static Dist dist;

// ---- setting up a run ----------------------------------------------------------------------

// Whether the network has a layer called name, or layers below a module of that name.
static bool has_module(const Net *net, const char *name) {
    const size_t n = strlen(name);
    for (int i = 0; i < net->nmodules; i++) {
        const char *m = net->modules[i]->name;
        if (!strncmp(m, name, n) && (!m[n] || m[n] == '.')) return true;
    }
    return false;
}

// With several processes: the batch and its micro-batches divide among them, on the CPU.
static int check_processes(const Options *o, const Kernels *k, Error *err) {
    if (dist.size == 1) return 0;
    const int each = o->batch / dist.size;
    if (o->batch % dist.size) {
        const int lo = each * dist.size, hi = lo + dist.size;
        return err_set(err, "batch = %d does not divide among %d processes: use %d or %d", o->batch,
                       dist.size, lo ? lo : hi, hi);
    }
    if (each % o->accumulate)
        return err_set(err, "accumulate = %d does not divide the %d samples each of the %d "
                            "processes takes of batch = %d", o->accumulate, each, dist.size, o->batch);
    if (!k->host_memory)
        return err_set(err, "device = %s with %d processes: data parallelism runs on the CPU only "
                            "so far (NCCL for GPUs is not built yet)", o->device, dist.size);
    return 0;
}

// ---- the processes of a data-parallel run agree -------------------------------------------

// What may differ between the processes of one run: each one's threads and readers, the
// paths of its files (their contents must agree: the data's fingerprint compares them, and
// every process takes rank 0's weights), what it profiles and where rank 0 writes.
static const char *const per_process_keys[] = {
    "train.threads", "train.save",        "train.profile", "train.init",     "train.resume",
    "data.train",    "data.train_labels", "data.test",     "data.test_labels", "data.workers",
    "data.prefetch", "data.cache"};
#define PER_PROCESS_ADVICE                                                                    \
    "only threads, save, profile, init, resume, the data files' paths, workers, prefetch and " \
    "cache may differ between processes"

static bool per_process(const char *section, const char *key) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", section, key);
    for (size_t i = 0; i < sizeof per_process_keys / sizeof *per_process_keys; i++)
        if (!strcmp(k, per_process_keys[i])) return true;
    return false;
}

// This process's cfg after overrides as lines "section.key = value" (a layer's section by
// its name, or by its kind and place), less per_process_keys, and the checkpoint format.
static void cfg_lines(FILE *f, const Cfg *cfg) {
    fprintf(f, "format = %s\n", CHECKPOINT_FORMAT);
    for (int i = 0; i < cfg->nsections; i++) {
        const CfgSection *s = &cfg->sections[i];
        const CfgEntry *name = cfg_entry(s, "name");
        char label[160];
        if (!strcmp(s->name, "train") || !strcmp(s->name, "data")) snprintf(label, sizeof label, "%s", s->name);
        else if (name) layer_section_name(cfg, s, label, sizeof label);  // a block's member under its block
        else snprintf(label, sizeof label, "[%.100s] #%d", s->name, i + 1);
        for (int j = 0; j < s->nentries; j++)
            if (!per_process(s->name, s->entries[j].key))
                fprintf(f, "%s.%s = %s\n", label, s->entries[j].key, s->entries[j].value);
    }
}

// The data sets as lines: each one's samples, shape, classes and index hash.
static int data_lines(FILE *f, const Data *data, Error *err) {
    const Dataset *sets[2] = {data->train, data->test};
    const char *names[2] = {"training set", "test set"};
    for (int i = 0; i < 2; i++) {
        uint64_t hash;
        if (!sets[i]) continue;
        if (dataset_index_hash(sets[i], &hash, err)) return -1;
        fprintf(f, "%s.samples = %lld\n%s.shape = %dx%dx%d\n%s.classes = %d\n%s.labels = %016llx\n",
                names[i], (long long)sets[i]->count, names[i], sets[i]->shape.c, sets[i]->shape.h,
                sets[i]->shape.w, names[i], sets[i]->classes, names[i], (unsigned long long)hash);
    }
    return 0;
}

// What must agree between the processes, as text: the cfg's lines, or (data non-NULL) the
// data's. NULL with err.
static char *fingerprint(const Cfg *cfg, const Data *data, Error *err) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) {
        err_set(err, "out of memory for the processes' fingerprint");
        return NULL;
    }
    int rc = 0;
    if (data) rc = data_lines(f, data, err);
    else cfg_lines(f, cfg);
    if (fclose(f) || !text || rc) {
        if (!rc) err_set(err, "out of memory for the processes' fingerprint");
        free(text);
        return NULL;
    }
    return text;
}

// With several processes: every one runs the same cfg (phase 0) or reads the same data
// (phase 1), or every one stops with the differences named (dist_agree).
static int agree(const Cfg *cfg, const Data *data, Error *err) {
    if (dist.size == 1) return 0;
    char *text = fingerprint(cfg, data, err);
    if (!text) return -1;
    const int rc = dist_agree(&dist, text, PER_PROCESS_ADVICE, err);
    free(text);
    return rc;
}

// DistributedDataParallel's start: every process takes rank 0's parameters, buffers,
// optimizer state, TrainState and loss scale, whatever its own seed drew or its own files
// held, and rank 0's `started` (start_weights's result).
static int share_start(Run *r, int *started, Error *err) {
    if (dist.size == 1) return 0;
    const Net *net = r->net;
    return dist_broadcast(&dist, started, sizeof *started, err) ||
                   dist_broadcast(&dist, net->params, net->plan.params, err) ||
                   dist_broadcast(&dist, net->buffers, net->plan.buffers, err) ||
                   dist_broadcast(&dist, net->optimizer, net->plan.optimizer, err) ||
                   dist_broadcast(&dist, &r->st, sizeof r->st, err) ||
                   dist_broadcast(&dist, &r->scaler, sizeof r->scaler, err)
               ? -1
               : 0;
}

// The weights, optimizer state and TrainState of the checkpoint resume= names, which must
// have been trained on data of the same classes and shape. 0; 1 when it has trained every
// epoch asked for (said on stdout); -1 with err.
static int resume_weights(Run *r, Error *err) {
    const Options *o = r->o;
    const Dataset *train = r->data->train;
    CheckpointInfo ci;
    if (checkpoint_read_info(o->resume, &ci, NULL, err)) return -1;
    const bool same_data = ci.classes == r->data->classes && ci.input.c == train->shape.c &&
                           ci.input.h == train->shape.h && ci.input.w == train->shape.w;
    if (!same_data)
        err_set(err, "%s was trained on %d classes of %dx%dx%d images, but %s has %d classes of "
                     "%dx%dx%d: resume continues the same run on the same data", o->resume,
                ci.classes, ci.input.c, ci.input.h, ci.input.w, train->source, r->data->classes,
                train->shape.c, train->shape.h, train->shape.w);
    checkpoint_info_free(&ci);
    if (!same_data || checkpoint_load_all(o->resume, r->net, &r->st, err)) return -1;
    r->st.seed = o->seed;  // resume_check made them equal, or resume_force changed it
    if (r->net->precision == DT_F16) r->scaler.scale = r->st.loss_scale;
    r->scaler.good_steps = r->st.scaler_good_steps;
    r->scaler.skipped = r->st.scaler_skipped;
    printf("resuming from %s: epoch %lld, batch %lld, step %llu\n", o->resume,
           (long long)r->st.epoch + 1, (long long)r->st.batch, (unsigned long long)r->st.step);
    if (r->st.epoch >= o->epochs) {
        printf("nothing left to train: %s has finished %lld epoch%s and epochs = %d; give "
               "epochs=%lld (or more) to train on\n", o->resume, (long long)r->st.epoch,
               r->st.epoch == 1 ? "" : "s", o->epochs, (long long)r->st.epoch + 1);
        return 1;
    }
    if (r->st.batch == 0 && run_stopped_early(o, &r->st)) {
        printf("nothing left to train: %s stopped early after epoch %lld (val_loss lowest at "
               "epoch %lld, patience = %lld); give patience=%lld (or 0) to train on\n", o->resume,
               (long long)r->st.epoch, (long long)r->st.best_val_loss_epoch, (long long)o->patience,
               (long long)(r->st.epoch - r->st.best_val_loss_epoch + 1));
        return 1;
    }
    return 0;
}

// Where training starts: fresh weights (net_init_params has drawn them), or init's (less
// the layers init_skip names), or everything a resumed checkpoint holds (resume_weights),
// with its TrainState and loss scale into r. 0; 1 when the checkpoint has trained every
// epoch asked for (said on stdout); -1 with err.
static int start_weights(Run *r, Error *err) {
    const Options *o = r->o;
    Net *net = r->net;
    r->st = (TrainState){.seed = o->seed, .best_val_acc = -1, .plateau = {.best = INFINITY},
                         .best_val_loss = INFINITY};
    r->scaler = (ScalerState){.scale = net->precision == DT_F16 ? o->init_scale : 1.0};
    // A resumed run takes every weight from its checkpoint: init (its first start's) is not
    // read, and may be gone.
    if (o->init[0] && !o->resume[0]) {
        for (int i = 0; i < o->init_skip.n; i++)
            if (!has_module(net, o->init_skip.names[i]))
                return err_set(err, "%s: init_skip names '%s', but the network has no layer of "
                                    "that name (see the table of layers: ./train CFG --plan)",
                               r->cfg->path, o->init_skip.names[i]);
        if (checkpoint_load_weights(o->init, net, o->init_skip.names, o->init_skip.n, err)) return -1;
        printf("initial weights from %s%s%s\n", o->init, o->init_skip.n ? "; fresh: " : "",
               o->init_skip.n ? o->init_skip.text : "");
    } else if (o->init_skip.n && !o->init[0]) {
        return err_set(err, "%s: init_skip is set but init is not: init_skip says which layers "
                            "of the init weights to leave out", r->cfg->path);
    }
    return o->resume[0] ? resume_weights(r, err) : 0;
}

// What the device can give, and what it holds before anything of the plan exists: the
// process's own memory (libraries, OpenBLAS) on the CPU, the GPU's context and cuBLAS's
// workspace on a GPU; `source` says where `available` comes from.
typedef struct Machine {
    size_t baseline, available;
    const char *source;
} Machine;

static Machine machine_memory(const Kernels *k) {
    Machine m = {.source = "the GPU's free memory (cudaMemGetInfo)"};
    if (k->host_memory) {
        m.baseline = proc_status_bytes("VmRSS:");
        m.available = budget_machine_bytes(&m.source);
    } else {
        size_t none_yet;  // nothing of the run is allocated yet
        k->device_memory(&m.available, &none_yet, &m.baseline);
    }
    return m;
}

// What the gradient sums hold with several processes (nn/dist.c): each sum's received
// slices, P copies of this process's 1/P of it, 64-byte aligned, for every gradient at
// once (the buckets of a step are in flight together); with the fused update and buckets,
// for its gradient copies in flight, and the copies themselves (fused_staging_floats).
static size_t exchange_bytes(const Net *net, const Options *o) {
    if (dist.size == 1) return 0;
    const size_t staged = fused_staging_floats(net, o, dist.size) * sizeof(float);
    return (staged ? 2 * staged : (size_t)net->ntrain * sizeof(float)) +
           (size_t)net->ntrained_modules * (64 + (size_t)dist.size * sizeof(float));
}

// Plans the run's network for device k with what `memory =` chooses (*accumulate: the
// micro-batches then), against what the machine can give: a run that cannot fit stops
// here, not in the kernel's OOM killer minutes later. With --plan prints the plan and
// returns 1; otherwise allocates the network into *net and returns 0; -1 with err.
static int build_network(Net *net, const Options *o, const Cfg *cfg, Data *data, const Kernels *k,
                         const Machine *m, int *accumulate, Error *err) {
    Options mine = *o;  // this process's share of the run
    mine.batch = o->batch / dist.size;
    const Dataset *train = data->train;
    BudgetReport budget = {.chosen = -1};
    NetOptions net_opt = {.batch = mine.batch / o->accumulate, .precision = o->precision,
                          .segments = o->segments, .sweep = o->segments != 0 || o->compress,
                          .freeze = o->freeze.names, .nfreeze = o->freeze.n, .freeze_stats = o->freeze_bn != 0,
                          .matmul = o->matmul, .input_bytes = true, .fused_update = o->fused_update,
                          .recompute_1x1 = o->recompute_1x1, .compress = o->compress, .compress_skip = o->compress_skip.names,
                          .ncompress_skip = o->compress_skip.n};
    optim_plan(&o->optim, &net_opt);
    *accumulate = o->accumulate;
    const size_t loader = k->host_memory ? data_loader_bytes(data) : 0,
                 loader1 = k->host_memory ? data_loader_bytes_at(data, 1) : 0;
    int rc = -1;
    if (o->memory && plan_apply_budget(&mine, k, cfg, train, data->classes, loader + m->baseline,
                                       loader - loader1, &net_opt, accumulate, &budget, err))
        goto done;
    net_opt.plan_only = true;
    if (net_create(net, cfg, train->shape, data->classes, &net_opt, k, err)) goto done;
    net->plan.loader = data_loader_bytes(data);
    net->plan.exchange = exchange_bytes(net, o);
    if (o->plan) {
        plan_print(net, m->baseline, m->available, m->source, o->json, &budget);
        rc = 1;
        goto done;
    }
    if (mem_plan_on(&net->plan, k) > m->available) {
        plan_refuse_too_big(&mine, k, cfg, train, data->classes, net_opt, *accumulate, &net->plan,
                            m->available, m->source, err);
        goto done;
    }
    net_free(net);
    net_opt.plan_only = false;
    if (net_create(net, cfg, train->shape, data->classes, &net_opt, k, err)) goto done;
    net->plan.loader = data_loader_bytes(data);
    net->plan.exchange = exchange_bytes(net, o);
    if (!net->ntrain) {
        err_set(err, "%s: freeze leaves no parameter to train", cfg->path);
        goto done;
    }
    rc = 0;
done:
    free(budget.plans);
    return rc;
}

// Trains the run that o and cfg describe (--plan: prints its plan). Returns a RUN_ value, or
// -1 with err.
static int run(const Options *o, const Cfg *cfg, Error *err) {
    int rc = -1;
    Data data = {0};
    Net net = {0};
    Run r = {.o = o, .cfg = cfg, .dist = &dist, .net = &net, .data = &data};
    const Kernels *k = kernels_for_device(o->device, err);
    if (!k) return -1;
    cpu_set_threads(o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    // Several processes (mpirun): each reads, computes and holds its part of every batch.
    if (agree(cfg, NULL, err) || check_processes(o, k, err)) return -1;
    DataConfig dc = o->data;
    dc.shard = dist.rank, dc.nshards = dist.size;
    const Machine m = machine_memory(k);
    if (dist_any_failed(&dist, data_open(&data, &dc, o->batch, o->seed, err) != 0, err) ||
        agree(cfg, &data, err))
        goto done;
    if (!data.test && (o->schedule.kind == SCHEDULE_PLATEAU || o->patience)) {
        err_set(err, "%s: [train] %s watches the validation loss, and there is no test set: give "
                     "test and test_labels, or val_split", cfg->path,
                o->patience ? "patience" : "schedule = plateau");
        goto done;
    }
    int accumulate;
    const int built = build_network(&net, o, cfg, &data, k, &m, &accumulate, err);
    if (built) {
        if (built > 0) rc = RUN_TRAINED;  // the plan, printed
        goto done;
    }
    if (net_init_params(&net, o->seed, err) || (o->profile && profile_start(&net, err))) goto done;
    int started = start_weights(&r, err);
    if (dist_any_failed(&dist, started < 0, err) || share_start(&r, &started, err)) goto done;
    if (started) {
        if (started > 0) rc = RUN_NOTHING_LEFT;
        goto done;
    }
    net.k->upload(net.scaler, &r.scaler, sizeof r.scaler);
    net.label_smoothing = (float)o->label_smoothing;
    if (!(r.info.cfg_text = cfg_to_text(cfg, err))) goto done;
    r.info.class_names = data.class_names;
    r.info.classes = data.classes;
    r.schedule = o->schedule;
    r.schedule.total = (int64_t)o->epochs * loader_batches(data.train_loader);
    report_header(&r, accumulate);
    plan_print(&net, m.baseline, m.available, m.source, false, NULL);
    if (data.test && eval_stats_init(&r.eval, data.classes, net.batch, err)) goto done;
    snprintf(r.last, sizeof r.last, "%s/last.safetensors", o->save);
    snprintf(r.best, sizeof r.best, "%s/best.safetensors", o->save);
    // Rank 0 writes the files: a run resumed from a checkpoint of its folder continues the
    // log there; any other run moves an earlier run's files aside first. The log is written
    // now (empty, or as it was) so that a folder that cannot be written stops the run here.
    if (dist.rank == 0 &&
        (run_folder_prepare(o->save, o->resume[0] && run_folder_contains(o->save, o->resume), err) ||
         metrics_log_line(o->save, "", err)))
        goto done;
    rc = run_epochs(&r, err);
done:
    free(r.info.cfg_text);
    eval_stats_free(&r.eval);
    profile_stop(&net);
    net_free(&net);
    data_close(&data);
    return rc;
}

// ---- the command line ----------------------------------------------------------------------

// ./train --eval WEIGHTS ... or ./train --predict WEIGHTS ...: WEIGHTS, then the options
// (--cfg CFG, --json, --top K) anywhere among the rest: overrides for --eval; overrides,
// images and folders for --predict. Returns the exit status, or -1 with err.
static int weights_command(int argc, char **argv, Error *err) {
    const bool eval = argv[1][2] == 'e';
    if (dist.size > 1) return err_set(err, "%s runs as one process: start it without mpirun", argv[1]);
    PredictOptions po = {.top = 5};
    int nrest = 0;
    char **rest = argv + 3;  // the other arguments, moved to the front
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) po.json = true;
        else if (!strcmp(argv[i], "--cfg") && i + 1 < argc) po.cfg = argv[++i];
        else if (!eval && !strcmp(argv[i], "--top") && i + 1 < argc) {
            char *end;
            const long k = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || k < 1 || k > 1000000)
                return err_set(err, "--top %s: expected a number of classes >= 1", argv[i]);
            po.top = (int)k;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            return err_set(err, "unknown or incomplete option %s (see ./train --help)", argv[i]);
        } else rest[nrest++] = argv[i];
    }
    if (argc < 3 || (!eval && !nrest)) {
        fprintf(stderr, eval ? "usage: ./train --eval WEIGHTS [--cfg CFG] [--json] [key=value ...]\n"
                             : "usage: ./train --predict WEIGHTS [--cfg CFG] [--json] [--top K] "
                               "[key=value ...] IMAGE|FOLDER...\n");
        return EXIT_USAGE;
    }
    if (eval) return eval_weights(argv[2], po.cfg, po.json, nrest, rest, err) ? -1 : 0;
    const int failed = predict(argv[2], &po, nrest, rest, err);
    return failed < 0 ? -1 : failed ? 1 : 0;
}

// ./train CFG [key=value ...] [--plan [--json]], or ./train resume=CKPT [key=value ...]
// (the checkpoint's stored cfg, named stored_name): the cfg with its overrides into *cfg and
// its options into *o, a resumed run's checked against its checkpoint. 0, EXIT_USAGE (the
// usage printed), or -1 with err.
static int read_command_line(int argc, char **argv, Cfg *cfg, Options *o, char *stored_name,
                             size_t cap, Error *err) {
    bool plan = false, json = false;
    const char *cfg_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plan") == 0) plan = true;
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] == '-' && argv[i][1] == '-')
            return err_set(err, "unknown option %s (see ./train --help)", argv[i]);
        else if (!cfg_path && strchr(argv[i], '=')) {  // no cfg file: the checkpoint's
            if (cfg_from_checkpoint(cfg, stored_name, cap, argc, argv, err)) return -1;
            cfg_path = stored_name;
            if (options_override(cfg, argv[i], err)) return -1;
        } else if (!cfg_path) {
            cfg_path = argv[i];
            if (cfg_load(cfg, cfg_path, err)) return -1;
        } else if (options_override(cfg, argv[i], err)) return -1;
    }
    if (!cfg_path) {
        options_usage(stderr);
        return EXIT_USAGE;
    }
    if (json && !plan) return err_set(err, "--json goes with --plan");
    if (options_read(o, cfg, cfg_path, DATA_FILES_ALL, err) ||
        (o->resume[0] && resume_check(cfg, o->resume, o->resume_force, err)))
        return -1;
    o->plan = plan, o->json = json;
    o->cfg_stored = cfg_path == stored_name;
    return 0;
}

// main, once the processes of a data-parallel run know their ranks: rank 0 prints, the
// others print only their errors, and an error ends every process.
static int train_main(int argc, char **argv) {
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) return 1;
    if (argc < 2) {
        options_usage(stderr);
        return EXIT_USAGE;
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            options_usage(stdout);
            return 0;
        }
    Error err = {0};
    Cfg cfg = {0};
    Options o = {0};
    char stored_name[1100];
    int rc;
    if (strcmp(argv[1], "--predict") == 0 || strcmp(argv[1], "--eval") == 0) {
        rc = weights_command(argc, argv, &err);
    } else {
        rc = read_command_line(argc, argv, &cfg, &o, stored_name, sizeof stored_name, &err);
        // A process that cannot start (its cfg, a file) stops every process.
        if (dist_any_failed(&dist, rc != 0, &err) && !rc) rc = -1;
        if (!rc) {
            const int ran = run(&o, &cfg, &err);
            // Stopped by a signal: the checkpoint is written, resume is possible (stop_after,
            // a planned stop, is a success).
            rc = ran < 0                   ? -1
                 : ran == RUN_STOPPED      ? EXIT_STOPPED
                 : ran == RUN_NOTHING_LEFT ? EXIT_NOTHING_LEFT
                                           : 0;
        }
    }
    cfg_free(&cfg);
    if (rc >= 0) return rc;
    if (dist.all_failed) {  // every process stops: each says its own error, none aborts
        if (err.msg[0]) fprintf(stderr, "train: %s\n", err.msg);
    } else if (dist.size > 1) {
        fprintf(stderr, "train: rank %d of %d: %s\n", dist.rank, dist.size, err.msg);
        dist_abort(&dist, 1);  // the others would wait for this one forever
    } else {
        fprintf(stderr, "train: %s\n", err.msg);
    }
    return 1;
}

int main(int argc, char **argv) {
    // A line at a time even when stdout is a file or a pipe (nohup, a notebook, a CI log):
    // the header and each epoch show as they happen.
    setvbuf(stdout, NULL, _IOLBF, 0);
    Error err = {0};
    if (dist_init(&dist, &argc, &argv, &err)) {
        fprintf(stderr, "train: %s\n", err.msg);
        return 1;
    }
    const int rc = train_main(argc, argv);
    dist_finalize(&dist);
    return rc;
}
