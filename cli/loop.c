// loop.c: the training loop (loop.h): steps, epochs, stops and the checkpoints they write.
#include "loop.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/kernels.h"
#include "../nn/profile.h"
#include "report.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void format_eta(char *buf, size_t n, double seconds) {
    int s = (int)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, n, "%d:%02d", s / 60, s % 60);
}

// ---- the step ------------------------------------------------------------------------------

// Every process takes rank 0's batchnorm statistics and counters (PyTorch DDP's
// broadcast_buffers): each normalised its own part of the batch. The F32 buffers lie
// together at the start of the buffer block: one broadcast for them, one for the counters.
static int sync_buffers(Net *net, Dist *dist, Error *err) {
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
    if (dist_broadcast(dist, net->buffers, f32, err) ||
        dist_broadcast(dist, counters, sizeof counters, err))
        return -1;
    for (int m = 0, i = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++)
            if (net->modules[m]->buffers[j].dtype != DT_F32)
                *(int64_t *)net->modules[m]->buffers[j].data = counters[i++];
    return 0;
}

// Floats in a full bucket: bucket_mb's, or (auto, -1) an eighth of the gradients, from
// 64 KB (below, a sum's time is its messages' latency) to DistributedDataParallel's 25 MB.
static size_t bucket_floats(double bucket_mb, int64_t ntrain) {
    const double floats = bucket_mb > 0 ? bucket_mb * 1e6 / sizeof(float)
                                        : fmin(fmax(ntrain / 8.0, 16e3), 25e6 / sizeof(float));
    return (size_t)fmax(1.0, floats);
}

// The fused update's hook (Net.hook, NetOptions.fused_update): module m's gradients are
// complete and nothing later in the step reads its parameters. They are summed across the
// processes (each element in rank order, as the sum of the whole gradient block sums it:
// the same bits) and m takes its optimizer step; the network zeroes a node's gradients
// before its backward (their bytes serve other activations between). The hook lives here,
// not in nn/: no layer and nothing in the network knows about ranks (DESIGN.md decision 14).
//
// With several processes and buckets (Staging), a module's complete gradients are copied
// out at once instead; the copies form buckets whose sums travel while backward goes on,
// and each module takes its step from its summed copy once its bucket's sum is done: the
// same bits again.
typedef struct FusedStep {
    Net *net;
    Dist *dist;
    const Optimizer *optim;
    double lr;
    uint64_t step;
    int updated;  // modules updated this step
    struct Staging *staging;  // several processes and buckets; NULL: sum each module at once
    Error *err;
} FusedStep;

// The fused update's gradient copies with several processes: buf[0..used) holds the step's
// copies since the last flush, the modules' in mods/at; the buckets end at ends[] (module
// counts), the open one starts at `open`. When a copy does not fit, the step waits for the
// sums in flight, updates, and starts over at buf's start.
typedef struct Staging {
    float *buf;
    size_t cap, used, open, most;  // floats: buf's, copied, where the open bucket starts,
                                   // a full bucket
    Layer **mods;
    size_t *at;
    int *ends;
    int nmods, nbuckets, applied;  // applied: buckets whose modules have taken their step
} Staging;

size_t fused_staging_floats(const Net *net, const Options *o, int processes) {
    if (!net->fused_update || processes == 1 || o->bucket_mb == 0) return 0;
    size_t largest = 0;
    for (int i = 0; i < net->nmodules; i++)
        if (layer_trains(net->modules[i]) && (size_t)layer_param_floats(net->modules[i]) > largest)
            largest = (size_t)layer_param_floats(net->modules[i]);
    const size_t four = 4 * bucket_floats(o->bucket_mb, net->ntrain);
    const size_t want = four > largest ? four : largest;
    return want < (size_t)net->ntrain ? want : (size_t)net->ntrain;
}

static void staging_free(Staging *s) {
    if (!s) return;
    free(s->buf);
    free(s->mods);
    free(s->at);
    free(s->ends);
    free(s);
}

static Staging *staging_new(const Net *net, const Options *o, int processes, Error *err) {
    Staging *s = xcalloc(1, sizeof *s, err);
    const size_t n = (size_t)net->ntrained_modules;
    if (!s) return NULL;
    s->cap = fused_staging_floats(net, o, processes);
    s->most = bucket_floats(o->bucket_mb, net->ntrain);
    if (!(s->buf = xcalloc(s->cap, sizeof *s->buf, err)) || !(s->mods = xcalloc(n, sizeof *s->mods, err)) ||
        !(s->at = xcalloc(n, sizeof *s->at, err)) || !(s->ends = xcalloc(n, sizeof *s->ends, err))) {
        staging_free(s);
        return NULL;
    }
    return s;
}

// Module m's step from its gradients' summed copy g: a copy of the module whose gradients
// point there.
static void update_from(FusedStep *f, const Layer *m, float *g) {
    Layer copy = *m;
    for (int j = 0; j < m->nparams; j++)
        if (m->grads[j]) copy.grads[j] = g + (m->grads[j] - m->grads[0]);
    optim_step_module(f->net, f->optim, &copy, f->lr, f->step);
    f->updated++;
}

// The modules of the buckets whose sums are done, up to bucket `done`, take their steps.
static void staging_apply(FusedStep *f, int done) {
    Staging *s = f->staging;
    for (; s->applied < done; s->applied++)
        for (int i = s->applied ? s->ends[s->applied - 1] : 0; i < s->ends[s->applied]; i++)
            update_from(f, s->mods[i], s->buf + s->at[i]);
}

// The open bucket's sum starts (if it holds anything).
static int staging_close(FusedStep *f) {
    Staging *s = f->staging;
    if (s->used == s->open) return 0;
    s->ends[s->nbuckets++] = s->nmods;
    const size_t from = s->open;
    s->open = s->used;
    return dist_sum_start(f->dist, s->buf + from, s->used - from, f->err);
}

// Every copy summed and its module updated; the buffer empty again.
static int staging_flush(FusedStep *f) {
    Staging *s = f->staging;
    if (staging_close(f) || dist_sum_wait(f->dist, f->err)) return -1;
    staging_apply(f, s->nbuckets);
    s->used = s->open = 0;
    s->nmods = s->nbuckets = s->applied = 0;
    return 0;
}

static int staging_ready(FusedStep *f, Layer *m) {
    Staging *s = f->staging;
    const size_t n = (size_t)layer_param_floats(m);
    if (s->used + n > s->cap && staging_flush(f)) return -1;
    memcpy(s->buf + s->used, m->grads[0], n * sizeof(float));
    s->mods[s->nmods] = m, s->at[s->nmods++] = s->used;
    s->used += n;
    if (s->used - s->open >= s->most && staging_close(f)) return -1;
    if (dist_sum_progress(f->dist, f->err)) return -1;
    staging_apply(f, dist_sums_done(f->dist));
    return 0;
}

static int fused_ready(void *arg, Layer *m) {
    FusedStep *f = arg;
    const int scope = profile_scope();
    profile_enter(PROF_OPTIMIZER);
    int rc;
    if (f->staging) {
        rc = staging_ready(f, m);
    } else {
        rc = f->dist->size > 1
                 ? dist_sum_floats(f->dist, m->grads[0], (size_t)layer_param_floats(m), f->err)
                 : 0;
        if (!rc) {
            optim_step_module(f->net, f->optim, m, f->lr, f->step);
            f->updated++;
        }
    }
    profile_return(scope);
    return rc;
}

// The gradient sum during backward (Options.bucket_mb; DistributedDataParallel's buckets):
// backward completes each trained module's gradients in turn, and they join the open
// bucket; a bucket of bucket_mb, or one the next module's gradients do not adjoin in the
// gradient block, starts its sum across the processes (dist_sum_start), which the network
// carries while backward computes the layers before it, each module's end moving the
// started sums on (dist_sum_progress). Backward completes the modules in reverse, so a
// bucket grows towards the block's start. Each value is summed as the sum after backward
// sums it: the same bits.
typedef struct Buckets {
    Dist *dist;
    float *lo, *hi;  // the open bucket, [lo, hi) of the gradient block (lo == hi: none)
    size_t most;     // floats in a full bucket
    int64_t summed;  // floats whose sum started this step
    Error *err;
} Buckets;

static int bucket_close(Buckets *b) {
    const size_t n = (size_t)(b->hi - b->lo);
    b->summed += (int64_t)n;
    b->lo = b->hi;
    return n ? dist_sum_start(b->dist, b->hi - n, n, b->err) : 0;
}

static int bucket_ready(void *arg, Layer *m) {
    Buckets *b = arg;
    float *g = m->grads[0];
    const int64_t n = layer_param_floats(m);
    if (b->lo != b->hi && g + n != b->lo && bucket_close(b)) return -1;
    if (b->lo == b->hi) b->hi = g + n;
    b->lo = g;
    if ((size_t)(b->hi - b->lo) >= b->most && bucket_close(b)) return -1;
    return dist_sum_progress(b->dist, b->err);
}

// One optimizer step on a batch: forward and backward over micro-batches of net->batch
// samples, the loss averaged over the whole batch (`total` samples across the processes;
// this one's part starts at b->offset, which keys its dropout masks); the gradients are
// summed across the processes (in buckets during the last micro-batch's backward:
// Buckets); then, with loss scaling, they are unscaled and checked, and
// the step is skipped if they are not finite (the same sum on every process: the same
// decision), on the device without waiting for it (optim_step), by the optimizer as the
// schedule has it for this step (onecycle's momentum). With the fused update (one
// micro-batch, fp32) the sums and the updates happen module by module during backward
// (fused_ready), from each node's gradients in the activation block.
static int train_step(const Run *r, const Batch *b, int64_t total, double lr, Error *err) {
    Net *net = r->net;
    const Options *o = r->o;
    const uint64_t step = r->st.step;
    const Optimizer optim = schedule_optimizer(&r->schedule, &o->optim, (int64_t)step);
    FusedStep fused = {.net = net, .dist = r->dist, .optim = &optim, .lr = lr, .step = step,
                       .staging = r->staging, .err = err};
    const bool buckets_on = !net->fused_update && r->dist->size > 1 && o->bucket_mb != 0;
    Buckets buckets = {.dist = r->dist, .err = err, .most = bucket_floats(o->bucket_mb, net->ntrain)};
    if (net->fused_update) net->hook = (GradHook){.ready = fused_ready, .arg = &fused};
    else net_zero_grads(net);
    for (int m0 = 0; m0 < b->n; m0 += net->batch) {
        const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
        if (buckets_on && m0 + n == b->n) net->hook = (GradHook){.ready = bucket_ready, .arg = &buckets};
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
        if (fused.staging) {  // the last copies' sums and updates
            if (failed) {  // every started sum ends before anything returns: MPI writes them
                dist_sum_wait(r->dist, &(Error){{0}});
                return -1;
            }
            if (staging_flush(&fused)) return -1;
        }
        if (failed) return -1;
        if (fused.updated != net->ntrained_modules)
            return err_set(err, "the fused update updated %d of the %d trained modules in "
                                "backward: a layer's backward did not report (a bug)",
                           fused.updated, net->ntrained_modules);
        profile_enter(PROF_OPTIMIZER);
        return r->dist->size > 1 ? sync_buffers(net, r->dist, err) : 0;
    }
    profile_enter(PROF_OPTIMIZER);
    if (buckets_on) {
        const bool failed = net->hook.failed;
        net->hook = (GradHook){0};
        // Every started sum ends before anything returns: MPI writes into the block.
        const int closed = failed ? -1 : bucket_close(&buckets);
        if (dist_sum_wait(r->dist, err) || closed) return -1;
        if (buckets.summed != net->ntrain)
            return err_set(err, "the gradient sum during backward summed %lld of the %lld "
                                "gradients: a layer's backward did not report (a bug)",
                           (long long)buckets.summed, (long long)net->ntrain);
    } else if (r->dist->size > 1 &&
               dist_sum_floats(r->dist, net->grads, (size_t)net->ntrain, err)) {
        return -1;
    }
    if (r->dist->size > 1 && sync_buffers(net, r->dist, err)) return -1;
    optim_step(net, &optim, net->precision == DT_F16 ? &o->scaling : NULL, lr, step);
    return 0;
}

// ---- signals and checkpoints ---------------------------------------------------------------

// The first SIGINT or SIGTERM asks the training loop to finish its step, write a
// checkpoint and stop; a second of the same kind kills as usual (SA_RESETHAND). The first
// one names the stop, with the process that sent it (0: the kernel, as for a terminal's
// Ctrl-C); the other kind then changes nothing.
static volatile sig_atomic_t stop_signal = 0, stop_sender = 0;
static void on_stop_signal(int sig, siginfo_t *info, void *context) {
    (void)context;
    if (stop_signal) return;
    stop_sender = info ? (sig_atomic_t)info->si_pid : 0;
    stop_signal = sig;
}

static void catch_stop_signals(void) {
    struct sigaction sa = {0};
    sa.sa_sigaction = on_stop_signal;
    sa.sa_flags = SA_RESETHAND | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

// Why training stops early: stop_after, or a signal to this process or another one.
// mpirun answers Ctrl-C (or SIGINT, SIGTERM or SIGHUP to itself) with SIGTERM to every
// process it started, a second later (README, "Several processes").
static const char *stop_reason(bool step_limit) {
    return step_limit               ? "at stop_after"
           : stop_signal == SIGTERM && dist_sent_by_mpirun(stop_sender)
               ? "by SIGTERM from mpirun (its answer to Ctrl-C or a signal to it)"
           : stop_signal == SIGINT  ? "by SIGINT"
           : stop_signal == SIGTERM ? "by SIGTERM"
                                    : "by a signal to another process";
}

// Writes the run's state to path (the epoch totals so far come from the device, summed
// over the processes); every process calls it, rank 0 writes.
static int save_checkpoint(Run *r, const char *path, Error *err) {
    Totals t;
    if (read_metrics_all(r->net, r->dist, &t, err)) return -1;
    if (r->dist->rank != 0) return 0;
    r->st.epoch_loss = t.loss, r->st.epoch_correct = t.correct;
    r->net->k->download(&r->scaler, r->net->scaler, sizeof r->scaler);
    r->st.loss_scale = r->scaler.scale;
    r->st.scaler_good_steps = r->scaler.good_steps;
    r->st.scaler_skipped = r->scaler.skipped;
    return checkpoint_save(path, r->net, &r->st, &r->info, err);
}

// ---- the epoch -----------------------------------------------------------------------------

// The progress line of a terminal: the batch, the loss so far, the speed and the time left.
// mine: the samples this process trained this epoch (its own loss with several processes).
static void print_progress(const Run *r, const Batch *b, int64_t nbatches, int64_t mine,
                           double rate, Totals *t) {
    read_metrics(r->net, t);
    char eta[32];
    format_eta(eta, sizeof eta, (nbatches - b->index - 1) * (double)r->o->batch / rate);
    const double seen = (double)(r->dist->size > 1 ? (mine ? mine : 1) : r->st.epoch_seen);
    printf("\r\033[K  epoch %d  %lld/%lld  loss %.4f  %.0f img/s  ETA %s", (int)r->st.epoch + 1,
           (long long)b->index + 1, (long long)nbatches, t->loss / seen, rate, eta);
    fflush(stdout);
}

// Every process's part of batch b (*total), and whether any was asked to stop: all of them
// take the same steps and stop at the same one.
static int agree_on_batch(const Run *r, const Batch *b, int64_t *total, bool *stop, Error *err) {
    *total = b->n;
    *stop = stop_signal != 0;
    if (r->dist->size == 1) return 0;
    double v[2] = {b->n, *stop};
    if (dist_sum_doubles(r->dist, v, 2, err)) return -1;
    *total = (int64_t)v[0], *stop = v[1] > 0;
    return 0;
}

// Trains epoch r->st.epoch from batch r->st.batch to its end, or until a stop signal or
// stop_after (returns 1 then, with the checkpoint written). A stop at the epoch's last batch
// finishes the epoch instead (evaluation, log, the epoch's checkpoint) and sets r->stopped,
// so that a resumed run starts the next epoch. Totals t cover the whole epoch.
static int train_epoch(Run *r, Totals *t, double *seconds, Error *err) {
    const Options *o = r->o;
    Net *net = r->net;
    const int epoch = (int)r->st.epoch;
    const int64_t nbatches = loader_batches(r->data->train_loader);
    const bool live = dist_stdout_is_terminal();  // isatty, or mpirun's stdout under mpirun
    // A resumed epoch goes on from the totals of its first part (rank 0 holds them).
    const float totals[2] = {r->dist->rank ? 0.0f : (float)r->st.epoch_loss,
                             r->dist->rank ? 0.0f : (float)r->st.epoch_correct};
    net->k->upload(net->metrics, totals, sizeof totals);
    if (loader_start_epoch(r->data->train_loader, epoch, r->st.batch, err)) return -1;
    // The learning rate of the last step taken: what the epoch logs if it has no step left
    // (a checkpoint written after its last batch).
    r->lr = schedule_lr(&r->schedule, o->optim.lr, r->st.step ? (int64_t)r->st.step - 1 : 0, epoch,
                        r->st.plateau.reductions);
    const int64_t seen0 = r->st.epoch_seen;
    int64_t mine = 0;  // samples this process trained this epoch (its loss in the progress line)
    const double t0 = now();
    double last_print = t0;
    const Batch *b;
    while (1) {
        profile_enter(PROF_LOADER);
        if (loader_next(r->data->train_loader, &b, err)) return -1;
        if (!b) break;
        int64_t total;
        bool stop;
        if (agree_on_batch(r, b, &total, &stop, err)) return -1;
        r->st.batch = b->index + 1;
        if (!total) continue;  // every sample of the batch was bad and skipped
        r->lr = schedule_lr(&r->schedule, o->optim.lr, (int64_t)r->st.step, epoch,
                            r->st.plateau.reductions);
        if (train_step(r, b, total, r->lr, err)) return -1;
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
            print_progress(r, b, nbatches, mine, (r->st.epoch_seen - seen0) / (tn - t0), t);
        }
    }
    net->k->sync();
    profile_enter(PROF_IDLE);
    *seconds = now() - t0;
    if (live) printf("\r\033[K");
    if (read_metrics_all(net, r->dist, t, err)) return -1;
    t->seen = r->st.epoch_seen;
    t->trained_now = r->st.epoch_seen - seen0;
    return 0;
}

// After an epoch's test: the plateau schedule steps on its validation loss, and the
// lowest validation loss so far (early stopping's) moves; both before the epoch's
// checkpoint, which carries them.
static void watch_val_loss(Run *r, double val_loss) {
    const Schedule *s = &r->schedule;
    Plateau *p = &r->st.plateau;
    const double lr0 = r->o->optim.lr, before = schedule_lr(s, lr0, 0, 0, p->reductions);
    if (s->kind == SCHEDULE_PLATEAU && plateau_step(s, p, lr0, val_loss))
        printf("plateau: val_loss has not improved on %.4f for %lld epoch%s: lr %.4g -> %.4g\n",
               p->best, (long long)s->patience + 1, s->patience ? "s" : "", before,
               schedule_lr(s, lr0, 0, 0, p->reductions));
    if (val_loss < r->st.best_val_loss) {
        r->st.best_val_loss = val_loss;
        r->st.best_val_loss_epoch = r->st.epoch + 1;
    }
}

// The epoch is done, its report written: the checkpoint starts the next one from scratch
// (and is the best one when val_acc, -1 without a test set, beats the best so far).
static int end_epoch(Run *r, double val_acc, Error *err) {
    r->st.epoch++;
    r->st.batch = 0;
    r->st.epoch_seen = 0;
    r->net->k->zero(r->net->metrics, 2 * sizeof(float));
    const bool improved = r->data->test && val_acc > r->st.best_val_acc;
    if (improved) r->st.best_val_acc = val_acc;
    return save_checkpoint(r, r->last, err) || (improved && save_checkpoint(r, r->best, err)) ? -1 : 0;
}

bool run_stopped_early(const Options *o, const TrainState *st) {
    return o->patience && st->best_val_loss_epoch > 0 &&
           st->epoch - st->best_val_loss_epoch >= o->patience;
}

static int train_epochs(Run *r, Error *err);

int run_epochs(Run *r, Error *err) {
    if (fused_staging_floats(r->net, r->o, r->dist->size) &&
        !(r->staging = staging_new(r->net, r->o, r->dist->size, err)))
        return -1;
    const int rc = train_epochs(r, err);
    staging_free(r->staging);
    r->staging = NULL;
    return rc;
}

static int train_epochs(Run *r, Error *err) {
    const Options *o = r->o;
    catch_stop_signals();
    while (r->st.epoch < o->epochs) {
        const int epoch = (int)r->st.epoch;
        Totals tr = {0}, te = {0};
        double seconds;
        const Dist dist0 = *r->dist;
        const int stopped = train_epoch(r, &tr, &seconds, err);
        if (stopped < 0) return -1;
        if (stopped) {
            if (o->profile) profile_print(stdout, r->steps_now, r->images_now);
            return r->signalled ? RUN_STOPPED : RUN_STOPPED_AFTER;
        }
        if (r->data->test && evaluate(r->net, r->data->test_loader, r->dist, &te, &r->eval, err))
            return -1;
        double val_acc;
        if (report_epoch(r, &tr, &te, seconds, &dist0, &val_acc, err)) return -1;
        if (r->data->test) watch_val_loss(r, te.loss / te.seen);
        if (end_epoch(r, val_acc, err)) return -1;
        if (r->st.epoch < o->epochs && run_stopped_early(o, &r->st)) {
            printf("stopped early after epoch %d: val_loss has not fallen below %.4f (epoch %lld) "
                   "for %lld epoch%s (patience = %lld); wrote %s and %s\n", epoch + 1,
                   r->st.best_val_loss, (long long)r->st.best_val_loss_epoch, (long long)o->patience,
                   o->patience == 1 ? "" : "s", (long long)o->patience, r->last, r->best);
            return RUN_TRAINED;
        }
        if (r->stopped) {
            printf("stopped %s at the end of epoch %d; wrote %s\nresume with: ./train resume=%s\n",
                   r->stopped, epoch + 1, r->last, r->last);
            return r->signalled ? RUN_STOPPED : RUN_STOPPED_AFTER;
        }
    }
    printf("wrote %s%s%s\n", r->last, r->data->test ? " and " : "", r->data->test ? r->best : "");
    return RUN_TRAINED;
}
