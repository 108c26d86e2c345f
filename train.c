// train.c: the trainer. ./train CFG [key=value ...]
//
// Reads the cfg, applies command-line overrides, opens the data, builds the network on
// the chosen device and trains it, evaluating on the test set after each epoch. Prints a
// line per epoch and logs it to SAVE/metrics.jsonl. Its other jobs have files of their
// own in cli/: the options (options.c), --eval (evaluate.c), --predict (predict.c), the
// metrics log and curves (metrics.c), resuming (resume.c), the save folder (run_folder.c)
// and the memory plan with what `memory =` chooses (plan.c).
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/evaluate.h"
#include "cli/metrics.h"
#include "cli/options.h"
#include "cli/plan.h"
#include "cli/predict.h"
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
#include "nn/scaler.h"

// The exit statuses besides 0 (trained, or done) and 1 (an error).
enum {
    EXIT_USAGE = 2,         // the command line is not one ./train takes
    EXIT_NOTHING_LEFT = 3,  // resume: the checkpoint has trained every epoch asked for
    EXIT_STOPPED = 130,     // a signal stopped it, with a checkpoint to resume (stop_after,
                            // a planned stop, exits with 0)
};

// The processes of a data-parallel run (nn/dist.h): rank 0 of 1 without mpirun.
static Dist dist;
static int train_main(int argc, char **argv);

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


// ---- training ------------------------------------------------------------------------------

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

// The fused update's hook (Net.hook, NetOptions.fused_update): module m's gradients are
// complete and nothing later in the step reads its parameters. They are summed across the
// processes (each element in rank order, as the sum of the whole gradient block sums it:
// the same bits), m takes its optimizer step, and its gradients are zeroed for the next
// module's backward, which accumulates into the same memory. The hook lives here, not in
// nn/: no layer and nothing in the network knows about ranks (DESIGN.md decision 14).
typedef struct FusedStep {
    Net *net;
    const Optimizer *optim;
    double lr;
    uint64_t step;
    int updated;  // modules updated this step
    Error *err;
} FusedStep;

static int fused_ready(void *arg, Layer *m) {
    FusedStep *f = arg;
    const int scope = profile_scope();
    profile_enter(PROF_OPTIMIZER);
    const int rc = dist.size > 1 ? dist_sum_floats(&dist, m->grads[0], (size_t)layer_param_floats(m), f->err) : 0;
    if (!rc) {
        optim_step_module(f->net, f->optim, m, f->lr, f->step);
        net_zero_module_grads(f->net, m);
        f->updated++;
    }
    profile_return(scope);
    return rc;
}

// One optimizer step on a batch: forward and backward over micro-batches of net->batch
// samples, the loss averaged over the whole batch (`total` samples across the processes;
// this one's part starts at b->offset, which keys its dropout masks); the gradients are
// summed across the processes; then, with loss scaling, they are unscaled and checked, and
// the step is skipped if they are not finite (the same sum on every process: the same
// decision), on the device without waiting for it (optim_step). With the fused update (one
// micro-batch, fp32) the sums and the updates happen module by module during backward
// (fused_ready), and the gradient block starts and ends each step zeroed.
static int train_step(Net *net, const Batch *b, int64_t total, const Options *o, uint64_t step,
                      double lr, Error *err) {
    FusedStep fused = {.net = net, .optim = &o->optim, .lr = lr, .step = step, .err = err};
    if (net->fused_update) net->hook = (GradHook){.ready = fused_ready, .arg = &fused};
    else net_zero_grads(net);
    for (int m0 = 0; m0 < b->n; m0 += net->batch) {
        const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
        profile_enter(PROF_STEP);
        put_batch(net, b, m0, n);
        net_forward(net, n, true, o->seed, step, b->offset + m0);
        profile_enter(PROF_LOSS);
        net_loss(net, n, (int)total, true);
        net_backward(net, n, o->seed, step, b->offset + m0);
    }
    if (net->fused_update) {
        const bool failed = net->hook.failed;
        net->hook = (GradHook){0};
        if (failed) return -1;
        if (fused.updated != net->ntrained_modules)
            return err_set(err, "the fused update updated %d of the %d trained modules in "
                                "backward: a layer's backward did not report (a bug)",
                           fused.updated, net->ntrained_modules);
        profile_enter(PROF_OPTIMIZER);
        return dist.size > 1 ? sync_buffers(net, err) : 0;
    }
    profile_enter(PROF_OPTIMIZER);
    if (dist.size > 1 && (dist_sum_floats(&dist, net->grads, (size_t)net->ntrain, err) ||
                          sync_buffers(net, err)))
        return -1;
    optim_step(net, &o->optim, net->precision == DT_F16 ? &o->scaling : NULL, lr, step);
    return 0;
}

// ---- signals and checkpoints ---------------------------------------------------------------

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
    const char *stopped;            // why the run stops after this epoch (a stop at its last
                                    // batch), or NULL
    bool signalled;                 // the stop came from a signal (to any process), not from
                                    // stop_after
} Run;

// Why training stops early: stop_after, or a signal to this process or another one.
static const char *stop_reason(bool step_limit) {
    return step_limit               ? "at stop_after"
           : stop_signal == SIGINT  ? "by SIGINT"
           : stop_signal == SIGTERM ? "by SIGTERM"
                                    : "by a signal to another process";
}

// The learning rate of the steps taken so far, for curves.svg: every step, or LR_POINTS
// of them evenly spread (always the first and the last); x, y: LR_POINTS each.
enum { LR_POINTS = 1024 };
static LrSteps lr_curve(const Run *r, int64_t steps_per_epoch, double *x, double *y) {
    const int64_t steps = (int64_t)r->st.step;
    const int n = steps < LR_POINTS ? (int)steps : LR_POINTS;
    for (int i = 0; i < n; i++) {
        const int64_t t = n > 1 ? (int64_t)((double)i * (double)(steps - 1) / (n - 1) + 0.5) : 0;
        x[i] = (double)(t + 1) / (double)steps_per_epoch;
        y[i] = schedule_lr(&r->schedule, r->o->optim.lr, t, (int)(t / steps_per_epoch));
    }
    return (LrSteps){x, y, n};
}

// Writes the run's state to path (the epoch totals so far come from the device, summed
// over the processes); every process calls it, rank 0 writes.
static int save_checkpoint(Run *r, const char *path, Error *err) {
    Totals t;
    if (read_metrics_all(r->net, &dist, &t, err)) return -1;
    if (dist.rank != 0) return 0;
    r->st.epoch_loss = t.loss, r->st.epoch_correct = t.correct;
    r->net->k->download(&r->scaler, r->net->scaler, sizeof r->scaler);
    r->st.loss_scale = r->scaler.scale;
    r->st.scaler_good_steps = r->scaler.good_steps;
    r->st.scaler_skipped = r->scaler.skipped;
    return checkpoint_save(path, r->net, &r->st, &r->info, err);
}

// Trains epoch r->st.epoch from batch r->st.batch to its end, or until a stop signal or
// stop_after (returns 1 then, with the checkpoint written). A stop at the epoch's last batch
// finishes the epoch instead (evaluation, log, the epoch's checkpoint) and sets r->stopped,
// so that a resumed run starts the next epoch. Totals t cover the whole epoch.
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
    // The learning rate of the last step taken: what the epoch logs if it has no step left
    // (a checkpoint written after its last batch).
    r->lr = schedule_lr(&r->schedule, o->optim.lr, r->st.step ? (int64_t)r->st.step - 1 : 0, epoch);
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
        r->signalled = stop;
        if ((stop || step_limit) && r->st.batch == nbatches) {
            r->stopped = stop_reason(step_limit);
            break;
        }
        if (stop || step_limit) {
            if (live) printf("\r\033[K");
            if (save_checkpoint(r, r->last, err)) return -1;
            printf("stopped %s in epoch %d after batch %lld/%lld; wrote %s\n"
                   "resume with: ./train resume=%s\n",
                   stop_reason(step_limit), epoch + 1, (long long)r->st.batch, (long long)nbatches,
                   r->last, r->last);
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
    if (read_metrics_all(net, &dist, t, err)) return -1;
    t->seen = r->st.epoch_seen;
    t->trained_now = r->st.epoch_seen - seen0;
    return 0;
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

// The epoch's report: its line on stdout (and the profile), and on rank 0 its line of
// SAVE/metrics.jsonl and curves.svg. tr, te: the epoch's training and test totals (te
// unused without a test set), seconds and comm0 (dist's communication time before it) its
// timing; *val_acc_out: its test accuracy (-1 without a test set). -1 with err.
static int report_epoch(Run *r, const Cfg *cfg, Loader *train_loader, int classes, bool test,
                        const Totals *tr, const Totals *te, int epoch, double seconds,
                        double comm0, double *val_acc_out, Error *err) {
    const Options *o = r->o;
    Net *net = r->net;
    const Kernels *k = net->k;
    // An epoch resumed after its last batch trained nothing now: no speed to report.
    const double img_s = tr->trained_now ? tr->trained_now / seconds : NAN;
    const double rss = proc_status_bytes("VmHWM:") / 1048576.0;
    const double lr = r->lr;
    const double val_acc = test ? 100.0 * te->correct / te->seen : -1;
    *val_acc_out = val_acc;
    char val[128] = "";
    if (test) snprintf(val, sizeof val, "  val_loss %.4f  val_acc %.2f%%", te->loss / te->seen, val_acc);
    if (test && classes > 5)
        snprintf(val + strlen(val), sizeof val - strlen(val), "  val_top5 %.2f%%",
                 100.0 * (double)r->eval.top5 / (double)te->seen);
    LoaderStats ls;
    loader_stats(train_loader, &ls);
    net->k->download(&r->scaler, net->scaler, sizeof r->scaler);
    char wait[96];
    snprintf(wait, sizeof wait, "  data wait %.1f s (%.0f%%)", ls.wait_seconds,
             seconds > 0 ? 100.0 * ls.wait_seconds / seconds : 0.0);
    if (ls.skipped) snprintf(wait + strlen(wait), sizeof wait - strlen(wait), "  skipped %lld bad", (long long)ls.skipped);
    char scale[160] = "";
    if (net->precision == DT_F16)
        snprintf(scale, sizeof scale, "  loss_scale %g  skipped %lld", r->scaler.scale,
                 (long long)r->scaler.skipped);
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
                 mem_plan_blocks(&net->plan) / 1e6, gpu_total_mb);
    }
    char speed[32] = "- img/s", speed_json[32] = "null";
    if (isfinite(img_s)) {
        snprintf(speed, sizeof speed, "%.0f img/s", img_s);
        snprintf(speed_json, sizeof speed_json, "%.1f", img_s);
    }
    printf("epoch %d/%d  train_loss %.4f  train_acc %.2f%%%s  lr %.4g  %s  %.1f s  "
           "peak %.0f MB%s%s\n",
           epoch + 1, o->epochs, tr->loss / tr->seen, 100.0 * tr->correct / tr->seen, val, lr,
           speed, seconds, rss, wait, scale);
    if (o->profile) profile_print(stdout, r->steps_now, r->images_now);
    fflush(stdout);
    char gpu_json[32] = "null", gpu_plan_json[32] = "null", gpu_total_json[32] = "null";
    if (gpu_mb >= 0) {
        snprintf(gpu_json, sizeof gpu_json, "%.1f", gpu_mb);
        snprintf(gpu_plan_json, sizeof gpu_plan_json, "%.1f", mem_plan_blocks(&net->plan) / 1e6);
        snprintf(gpu_total_json, sizeof gpu_total_json, "%.1f", gpu_total_mb);
    }
    char val_loss[32] = "null", val_acc_s[32] = "null", val_top5[32] = "null";
    if (dist.rank == 0 && test) {
        snprintf(val_loss, sizeof val_loss, "%.6f", te->loss / te->seen);
        snprintf(val_acc_s, sizeof val_acc_s, "%.4f", val_acc);
        if (classes > 5)  // with 5 classes or fewer it is always 100: null
            snprintf(val_top5, sizeof val_top5, "%.4f", 100.0 * (double)r->eval.top5 / (double)te->seen);
    }
    if (dist.rank == 0) {
        char *line = NULL;
        size_t nline = 0;
        FILE *f = open_memstream(&line, &nline);
        if (!f) {
            err_set(err, "out of memory writing the epoch's line of %s/metrics.jsonl", o->save);
            return -1;
        }
        fprintf(f, "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %.4f, \"val_loss\": %s, "
                   "\"val_acc\": %s, \"val_top5\": %s, \"val_per_class\": ",
                epoch + 1, tr->loss / tr->seen, 100.0 * tr->correct / tr->seen, val_loss, val_acc_s,
                val_top5);
        write_per_class(f, test ? &r->eval : NULL);
        fprintf(f, ", \"lr\": %.6g, \"img_per_s\": %s, \"seconds\": %.3f, \"peak_rss_mb\": %.1f, "
                   "\"data_wait_s\": %.3f, \"skipped_bad\": %lld, \"loss_scale\": %g, "
                   "\"skipped_steps\": %lld, \"gpu_mb\": %s, \"gpu_plan_mb\": %s, "
                   "\"gpu_total_mb\": %s}\n",
                lr, speed_json, seconds, rss, ls.wait_seconds, (long long)ls.skipped,
                r->scaler.scale, (long long)r->scaler.skipped, gpu_json, gpu_plan_json,
                gpu_total_json);
        const bool ok = !fclose(f) && line;
        // The title names the cfg file, not a resumed checkpoint's stored cfg.
        char title[1200];
        snprintf(title, sizeof title, "%s%s%s", o->cfg_stored ? "" : cfg->path,
                 o->cfg_stored ? "" : ": ", o->save);
        double lr_x[LR_POINTS], lr_y[LR_POINTS];
        const LrSteps lr_steps = lr_curve(r, loader_batches(r->loader), lr_x, lr_y);
        const int logged = ok ? metrics_log_epoch(o->save, line, title, &lr_steps, err)
                              : err_set(err, "out of memory writing the epoch's line of %s/metrics.jsonl", o->save);
        free(line);
        if (logged) {
            const size_t len = strlen(err->msg);
            snprintf(err->msg + len, sizeof err->msg - len, "; the checkpoints are as before");
            return -1;
        }
    }
    return 0;
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

// Where training starts: fresh weights (net_init_params has drawn them), or init's (less
// the layers init_skip names), or everything a resumed checkpoint holds, with its
// TrainState and loss scale into r. 0; 1 when the checkpoint has trained every epoch asked
// for (said on stdout); -1 with err.
static int start_weights(Run *r, Net *net, const Cfg *cfg, const Dataset *train, Error *err) {
    const Options *o = r->o;
    r->st = (TrainState){.seed = o->seed, .best_val_acc = -1};
    r->scaler = (ScalerState){.scale = net->precision == DT_F16 ? o->init_scale : 1.0};
    // A resumed run takes every weight from its checkpoint: init (its first start's) is not
    // read, and may be gone.
    if (o->init[0] && !o->resume[0]) {
        for (int i = 0; i < o->init_skip.n; i++)
            if (!has_module(net, o->init_skip.names[i])) {
                err_set(err, "%s: init_skip names '%s', but the network has no layer of that "
                             "name (see the table of layers: ./train CFG --plan)", cfg->path,
                        o->init_skip.names[i]);
                return -1;
            }
        if (checkpoint_load_weights(o->init, net, o->init_skip.names, o->init_skip.n, err)) return -1;
        printf("initial weights from %s%s%s\n", o->init, o->init_skip.n ? "; fresh: " : "",
               o->init_skip.n ? o->init_skip.text : "");
    } else if (o->init_skip.n && !o->init[0]) {
        err_set(err, "%s: init_skip is set but init is not: init_skip says which layers of the "
                     "init weights to leave out", cfg->path);
        return -1;
    }
    if (o->resume[0]) {
        CheckpointInfo ci;
        if (checkpoint_read_info(o->resume, &ci, NULL, err)) return -1;
        const bool same_data = ci.classes == train->classes && ci.input.c == train->shape.c &&
                               ci.input.h == train->shape.h && ci.input.w == train->shape.w;
        if (!same_data)
            err_set(err, "%s was trained on %d classes of %dx%dx%d images, but %s has %d classes of "
                         "%dx%dx%d: resume continues the same run on the same data", o->resume,
                    ci.classes, ci.input.c, ci.input.h, ci.input.w, train->source, train->classes,
                    train->shape.c, train->shape.h, train->shape.w);
        checkpoint_info_free(&ci);
        if (!same_data || checkpoint_load_all(o->resume, net, &r->st, err)) return -1;
        r->st.seed = o->seed;  // resume_check made them equal, or resume_force changed it
        if (net->precision == DT_F16) r->scaler.scale = r->st.loss_scale;
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
    }
    return 0;
}

// How a run ends (train_main turns it into the exit status).
// What run() did: trained to the end, stopped by a signal or at stop_after (a checkpoint
// written either way), or found nothing left to train.
enum { RUN_TRAINED, RUN_STOPPED, RUN_STOPPED_AFTER, RUN_NOTHING_LEFT };

// Trains the run that o and cfg describe (--plan: prints its plan). Returns a RUN_ value, or
// -1 with err.
static int run(const Options *o, const Cfg *cfg, Error *err) {
    int rc = -1;
    Data data = {0};
    Net net = {0};
    Run r = {.o = o, .net = &net};
    BudgetReport budget = {.chosen = -1};

    const Kernels *k = kernels_for_device(o->device, err);
    if (!k) return -1;
    cpu_set_threads(o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN));

    // Several processes (mpirun): each reads, computes and holds its part of every batch.
    Options mine = *o;  // this process's share of the run
    mine.batch = o->batch / dist.size;
    if (check_processes(o, k, err)) goto done;
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
                          .segments = o->segments, .sweep = o->segments != 0 || o->compress,
                          .freeze = o->freeze.names, .nfreeze = o->freeze.n, .freeze_stats = o->freeze_bn != 0,
                          .tf32 = o->tf32 != 0, .input_bytes = true, .fused_update = o->fused_update,
                          .compress = o->compress, .compress_skip = o->compress_skip.names,
                          .ncompress_skip = o->compress_skip.n};
    optim_plan(&o->optim, &net_opt);
    int accumulate = o->accumulate;
    const size_t loader = k->host_memory ? data_loader_bytes(&data) : 0,
                 loader1 = k->host_memory ? data_loader_bytes_at(&data, 1) : 0;
    if (o->memory && plan_apply_budget(&mine, k, cfg, train, data.classes, loader + baseline, loader - loader1,
                                  &net_opt, &accumulate, &budget, err))
        goto done;
    // The plan before anything of it is allocated, against what the machine can still give:
    // a run that cannot fit stops here, not in the kernel's OOM killer minutes later.
    net_opt.plan_only = true;
    if (net_create(&net, cfg, train->shape, data.classes, &net_opt, k, err)) goto done;
    net.plan.loader = data_loader_bytes(&data);
    if (o->plan) {
        plan_print(&net, baseline, available, source, o->json, &budget);
        rc = 0;
        goto done;
    }
    if (mem_plan_on(&net.plan, k) > available) {
        plan_refuse_too_big(&mine, k, cfg, train, data.classes, net_opt, accumulate, &net.plan, available,
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
    const int started = start_weights(&r, &net, cfg, train, err);
    if (started) {
        if (started > 0) rc = RUN_NOTHING_LEFT;
        goto done;
    }
    net.k->upload(net.scaler, &r.scaler, sizeof r.scaler);
    net.label_smoothing = (float)o->label_smoothing;
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
    if (net.fused_update) printf(", fused update");
    if (net.opt_format != STATE_F32)
        printf(", %s optimizer state (changes the result)", state_format_names[net.opt_format]);
    if (net.exec.pack_bits) printf(", %d-bit activations for backward (changes the result)", net.exec.pack_bits);
    if (o->label_smoothing > 0) printf(", label smoothing %g", o->label_smoothing);
    printf("\n");
    // With val_split both parts carry the split's one line: said once, as validation.
    const bool split = dc.val_split > 0.0;
    if (test) printf("       %lld %s images\n", (long long)test->count, split ? "validation" : "test");
    if (train->info) printf("       %s: %s\n", split ? "split" : "train", train->info);
    if (test && test->info && !split) printf("       test: %s\n", test->info);
    net_print(&net, stdout);
    plan_print(&net, baseline, available, source, false, NULL);

    if (test && eval_stats_init(&r.eval, data.classes, net.batch, err)) goto done;
    snprintf(r.last, sizeof r.last, "%s/last.safetensors", o->save);
    snprintf(r.best, sizeof r.best, "%s/best.safetensors", o->save);
    // Rank 0 writes the files: a run resumed from a checkpoint of its folder continues the
    // log there; any other run moves an earlier run's files aside first. The log is written
    // now (empty, or as it was) so that a folder that cannot be written stops the run here.
    if (dist.rank == 0 &&
        (run_folder_prepare(o->save, o->resume[0] && run_folder_contains(o->save, o->resume), err) ||
         metrics_log_line(o->save, "", err)))
        goto done;
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
            rc = r.signalled ? RUN_STOPPED : RUN_STOPPED_AFTER;
            goto done;
        }
        if (test && evaluate(&net, data.test_loader, &dist, &te, &r.eval, err)) goto done;
        double val_acc;
        if (report_epoch(&r, cfg, data.train_loader, data.classes, test != NULL, &tr, &te, epoch,
                         seconds, comm0, &val_acc, err))
            goto done;

        // The epoch is done: the checkpoint starts the next one from scratch.
        r.st.epoch = epoch + 1;
        r.st.batch = 0;
        r.st.epoch_seen = 0;
        net.k->zero(net.metrics, 2 * sizeof(float));
        const bool improved = test && val_acc > r.st.best_val_acc;
        if (improved) r.st.best_val_acc = val_acc;
        if (save_checkpoint(&r, r.last, err) || (improved && save_checkpoint(&r, r.best, err)))
            goto done;
        if (r.stopped) {
            printf("stopped %s at the end of epoch %d; wrote %s\nresume with: ./train resume=%s\n",
                   r.stopped, epoch + 1, r.last, r.last);
            rc = r.signalled ? RUN_STOPPED : RUN_STOPPED_AFTER;
            goto done;
        }
    }
    printf("wrote %s%s%s\n", r.last, test ? " and " : "", test ? r.best : "");
    rc = RUN_TRAINED;
done:
    free(budget.plans);
    free(r.info.cfg_text);
    eval_stats_free(&r.eval);
    profile_stop(&net);
    net_free(&net);
    data_close(&data);
    return rc;
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
    int rc = 1;
    if (strcmp(argv[1], "--predict") == 0 || strcmp(argv[1], "--eval") == 0) {
        const bool eval = argv[1][2] == 'e';
        if (dist.size > 1) {
            err_set(&err, "%s runs as one process: start it without mpirun", argv[1]);
            goto fail;
        }
        // WEIGHTS, then the options (--cfg CFG, --json, --top K) anywhere among the rest:
        // overrides for --eval, overrides, images and folders for --predict.
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
                                   "[key=value ...] IMAGE|FOLDER...\n");
            return EXIT_USAGE;
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
            if (options_override(&cfg, argv[i], &err)) goto fail;
        } else if (!cfg_path) {
            cfg_path = argv[i];
            if (cfg_load(&cfg, cfg_path, &err)) goto fail;
        } else if (options_override(&cfg, argv[i], &err)) goto fail;
    }
    if (!cfg_path) {
        options_usage(stderr);
        return EXIT_USAGE;
    }
    if (json && !plan) {
        err_set(&err, "--json goes with --plan");
        goto fail;
    }
    if (options_read(&o, &cfg, cfg_path, DATA_FILES_ALL, &err)) goto fail;
    if (o.resume[0] && resume_check(&cfg, o.resume, o.resume_force, &err)) goto fail;
    o.plan = plan, o.json = json;
    o.cfg_stored = cfg_path == stored_name;
    const int ran = run(&o, &cfg, &err);
    if (ran < 0) goto fail;
    // Stopped by a signal: the checkpoint is written, resume is possible (stop_after, a
    // planned stop, is a success).
    rc = ran == RUN_STOPPED ? EXIT_STOPPED : ran == RUN_NOTHING_LEFT ? EXIT_NOTHING_LEFT : 0;
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

