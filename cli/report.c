// report.c: a run's header and epoch reports (report.h).
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/budget.h"
#include "../nn/kernels.h"
#include "../nn/profile.h"
#include "metrics.h"

void report_header(const Run *r, int accumulate) {
    const Options *o = r->o;
    const Net *net = r->net;
    const Kernels *k = net->k;
    const Dataset *train = r->data->train, *test = r->data->test;
    char device[128];
    snprintf(device, sizeof device, "%s%s%s%s", k->name, k->host_memory ? " (" : "",
             k->host_memory ? cpu_kernels_name() : "", k->host_memory ? ")" : "");
    printf("cnn.c: %s on %s, %lld training images%s, %d classes; batch %d", r->cfg->path, device,
           (long long)train->count, test ? "" : " (no test set)", r->data->classes, o->batch);
    if (r->dist->size > 1)
        printf(" over %d processes (%d samples each)", r->dist->size, o->batch / r->dist->size);
    if (accumulate > 1) printf(" as %d micro-batches of %d", accumulate, net->batch);
    // The activations' storage, then the GEMMs' arithmetic (matmul) where it is not the
    // storage's own: where bf16 GEMMs run on bf16, and where they do not.
    printf(", %s", net->precision == DT_BF16 ? "bf16 activations" : net->precision == DT_F16 ? "fp16 activations" : "fp32");
    if (net->gemm_arith == GEMM_BF16) {
        const char *gemm = !k->host_memory ? "bf16 tensor cores" : cpu_bf16_gemm_name();
        printf(", GEMMs on %s", gemm ? gemm : "fp32 (no BF16 instructions in the CPU's table)");
        if (gemm && net->precision != DT_BF16) printf(" (bf16 operands: changes the result)");
    } else if (net->gemm_arith == GEMM_TF32 && net->precision != DT_F16) {
        printf(", %s", k->host_memory ? "TF32 GEMMs in fp32 (the CPU has no TF32)" : "GEMMs on TF32 tensor cores");
    } else if (net->gemm_arith == GEMM_FP32 && net->precision != DT_F32) {
        printf(", fp32 GEMMs");
    }
    if (net->nsegments > 1) printf(", %d checkpoint segments", net->nsegments);
    if (net->fused_update) printf(", fused update");
    if (net->recompute_1x1 && net->widening_1x1) printf(", %d 1x1 convolutions recomputed", net->widening_1x1);
    if (net->opt_format != STATE_F32)
        printf(", %s optimizer state (changes the result)", state_format_names[net->opt_format]);
    if (net->exec.pack_bits) printf(", %d-bit activations for backward (changes the result)", net->exec.pack_bits);
    if (o->label_smoothing > 0) printf(", label smoothing %g", o->label_smoothing);
    printf("\n");
    // With val_split both parts carry the split's one line: said once, as validation.
    const bool split = o->data.val_split > 0.0;
    if (test) printf("       %lld %s images\n", (long long)test->count, split ? "validation" : "test");
    if (train->info) printf("       %s: %s\n", split ? "split" : "train", train->info);
    if (test && test->info && !split) printf("       test: %s\n", test->info);
    net_print(net, stdout);
}

// The learning rate of the steps taken so far, for curves.svg: every step, or LR_POINTS
// of them evenly spread (always the first and the last); x, y: LR_POINTS each. Not for
// the plateau schedule, whose lr follows the validation losses: curves.svg draws the
// log's lr of each epoch instead.
enum { LR_POINTS = 1024 };
static LrSteps lr_curve(const Run *r, double *x, double *y) {
    const int64_t steps_per_epoch = loader_batches(r->data->train_loader);
    const int64_t steps = (int64_t)r->st.step;
    const int n = steps < LR_POINTS ? (int)steps : LR_POINTS;
    for (int i = 0; i < n; i++) {
        const int64_t t = n > 1 ? (int64_t)((double)i * (double)(steps - 1) / (n - 1) + 0.5) : 0;
        x[i] = (double)(t + 1) / (double)steps_per_epoch;
        y[i] = schedule_lr(&r->schedule, r->o->optim.lr, t, (int)(t / steps_per_epoch), 0);
    }
    return (LrSteps){x, y, n};
}

// What an epoch's line and its log both show.
typedef struct EpochFacts {
    double train_loss, train_acc;
    double val_loss, val_acc, val_top5;  // NAN where there is none (no test set, top-5 with
                                         // 5 classes or fewer)
    double img_s;                        // NAN when the epoch trained nothing now (resumed
                                         // after its last batch)
    double seconds, rss_mb;
    LoaderStats loader;
    double gpu_mb, gpu_plan_mb, gpu_total_mb;  // NAN on the CPU
    double exposed;  // several processes: of the gradient sums' time, what the steps waited
} EpochFacts;

// x as JSON with printf format fmt, into buf: null where it is not finite (none, or a
// speed over no time).
static const char *json_or_null(char *buf, size_t n, const char *fmt, double x) {
    if (!isfinite(x)) snprintf(buf, n, "null");
    else snprintf(buf, n, fmt, x);
    return buf;
}

// The epoch's line on stdout (and the profile after it).
static void print_epoch(Run *r, const EpochFacts *f, double seconds, const Dist *dist0) {
    const Options *o = r->o;
    char val[128] = "";
    if (!isnan(f->val_loss))
        snprintf(val, sizeof val, "  val_loss %.4f  val_acc %.2f%%", f->val_loss, f->val_acc);
    if (!isnan(f->val_top5))
        snprintf(val + strlen(val), sizeof val - strlen(val), "  val_top5 %.2f%%", f->val_top5);
    char wait[96];
    snprintf(wait, sizeof wait, "  data wait %.1f s (%.0f%%)", f->loader.wait_seconds,
             seconds > 0 ? 100.0 * f->loader.wait_seconds / seconds : 0.0);
    if (f->loader.skipped)
        snprintf(wait + strlen(wait), sizeof wait - strlen(wait), "  skipped %lld bad",
                 (long long)f->loader.skipped);
    char scale[192] = "";
    if (r->net->precision == DT_F16)
        snprintf(scale, sizeof scale, "  loss_scale %g  skipped %lld", r->scaler.scale,
                 (long long)r->scaler.skipped);
    const Dist *dist = r->dist;
    // comm: what the gradient sums cost the steps, the network's share (dist_exposed); waits:
    // all this process waited for the others (the sums, a slower process, the statistics,
    // the metrics).
    if (dist->size > 1)
        snprintf(scale + strlen(scale), sizeof scale - strlen(scale),
                 "  comm %.2f s (%.1f%%)  waits %.1f s", f->exposed,
                 seconds > 0 ? 100.0 * f->exposed / seconds : 0.0,
                 dist->comm_seconds - dist0->comm_seconds);
    // On a GPU: the device memory the run's allocations take (measured), the plan's,
    // and with the GPU's baseline (context, cuBLAS) what the process holds there.
    if (!isnan(f->gpu_mb))
        snprintf(scale + strlen(scale), sizeof scale - strlen(scale),
                 "  gpu %.0f MB (plan %.0f MB), %.0f MB with the context", f->gpu_mb,
                 f->gpu_plan_mb, f->gpu_total_mb);
    char speed[32] = "- img/s";
    if (isfinite(f->img_s)) snprintf(speed, sizeof speed, "%.0f img/s", f->img_s);
    printf("epoch %d/%d  train_loss %.4f  train_acc %.2f%%%s  lr %.4g  %s  %.1f s  "
           "peak %.0f MB%s%s\n",
           (int)r->st.epoch + 1, o->epochs, f->train_loss, f->train_acc, val, r->lr, speed,
           seconds, f->rss_mb, wait, scale);
    if (o->profile) profile_print(stdout, r->steps_now, r->images_now);
    fflush(stdout);
}

// The epoch's line of SAVE/metrics.jsonl as text (the caller frees it), or NULL when out
// of memory.
static char *epoch_json(const Run *r, const EpochFacts *f) {
    char *line = NULL;
    size_t nline = 0;
    FILE *out = open_memstream(&line, &nline);
    if (!out) return NULL;
    char b[7][32];
    fprintf(out, "{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %.4f, \"val_loss\": %s, "
                 "\"val_acc\": %s, \"val_top5\": %s, \"val_per_class\": ",
            (int)r->st.epoch + 1, f->train_loss, f->train_acc,
            json_or_null(b[0], sizeof b[0], "%.6f", f->val_loss), json_or_null(b[1], sizeof b[1], "%.4f", f->val_acc),
            json_or_null(b[2], sizeof b[2], "%.4f", f->val_top5));
    write_per_class(out, r->data->test ? &r->eval : NULL);
    fprintf(out, ", \"lr\": %.6g, \"img_per_s\": %s, \"seconds\": %.3f, \"peak_rss_mb\": %.1f, "
                 "\"data_wait_s\": %.3f, \"skipped_bad\": %lld, \"loss_scale\": %g, "
                 "\"skipped_steps\": %lld, \"gpu_mb\": %s, \"gpu_plan_mb\": %s, "
                 "\"gpu_total_mb\": %s}\n",
            r->lr, json_or_null(b[3], sizeof b[3], "%.1f", f->img_s), f->seconds, f->rss_mb,
            f->loader.wait_seconds, (long long)f->loader.skipped, r->scaler.scale,
            (long long)r->scaler.skipped, json_or_null(b[4], sizeof b[4], "%.1f", f->gpu_mb),
            json_or_null(b[5], sizeof b[5], "%.1f", f->gpu_plan_mb),
            json_or_null(b[6], sizeof b[6], "%.1f", f->gpu_total_mb));
    const bool ok = !fclose(out) && line;
    if (!ok) free(line);
    return ok ? line : NULL;
}

// Rank 0: the epoch's line appended to SAVE/metrics.jsonl, and curves.svg drawn again.
static int log_epoch(const Run *r, const EpochFacts *f, Error *err) {
    const Options *o = r->o;
    char *line = epoch_json(r, f);
    if (!line) return err_set(err, "out of memory writing the epoch's line of %s/metrics.jsonl", o->save);
    // The title names the cfg file, not a resumed checkpoint's stored cfg.
    char title[1200];
    snprintf(title, sizeof title, "%s%s%s", o->cfg_stored ? "" : r->cfg->path,
             o->cfg_stored ? "" : ": ", o->save);
    double lr_x[LR_POINTS], lr_y[LR_POINTS];
    const bool per_step = r->schedule.kind != SCHEDULE_PLATEAU;
    const LrSteps lr_steps = per_step ? lr_curve(r, lr_x, lr_y) : (LrSteps){0};
    const int logged = metrics_log_epoch(o->save, line, title, &lr_steps, err);
    free(line);
    if (logged) {
        const size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; the checkpoints are as before");
        return -1;
    }
    return 0;
}

int report_epoch(Run *r, const Totals *tr, const Totals *te, double seconds, const Dist *dist0,
                 double *val_acc, Error *err) {
    Net *net = r->net;
    const Kernels *k = net->k;
    const bool test = r->data->test != NULL;
    EpochFacts f = {
        .train_loss = tr->loss / tr->seen, .train_acc = 100.0 * tr->correct / tr->seen,
        .val_loss = test ? te->loss / te->seen : NAN, .val_acc = test ? 100.0 * te->correct / te->seen : NAN,
        .val_top5 = test && r->data->classes > 5 ? 100.0 * (double)r->eval.top5 / (double)te->seen : NAN,
        .img_s = tr->trained_now ? tr->trained_now / seconds : NAN,
        .seconds = seconds, .rss_mb = proc_status_bytes("VmHWM:") / 1048576.0,
        .gpu_mb = NAN, .gpu_plan_mb = NAN, .gpu_total_mb = NAN};
    *val_acc = test ? f.val_acc : -1;
    loader_stats(r->data->train_loader, &f.loader);
    k->download(&r->scaler, net->scaler, sizeof r->scaler);
    if (!k->host_memory) {
        size_t avail, taken, base;
        k->device_memory(&avail, &taken, &base);
        f.gpu_mb = taken / 1e6, f.gpu_total_mb = (taken + base) / 1e6;
        f.gpu_plan_mb = mem_plan_blocks(&net->plan) / 1e6;
    }
    if (dist_exposed(r->dist, &f.exposed, err)) return -1;
    print_epoch(r, &f, seconds, dist0);
    return r->dist->rank == 0 ? log_epoch(r, &f, err) : 0;
}
