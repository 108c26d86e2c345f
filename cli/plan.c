// plan.c: the memory plan's report and the budget's choice for ./train (plan.h).
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The budget's report (--plan --json's "budget").
static void budget_report_json(FILE *f, const BudgetReport *r, const Kernels *k) {
    fprintf(f, ", \"budget\": {\"chosen\": %d, \"plain_seconds\": ", r->chosen);
    if (r->chosen >= 0) fprintf(f, "%.4f", r->plain);
    else fprintf(f, "null");
    fprintf(f, ", \"probe_seconds\": %.2f, \"probe_steps\": %d, \"plans\": [", r->probe, r->probe_steps);
    for (int i = 0; i < r->n; i++) {
        const FitChoice *c = &r->plans[i];
        fprintf(f, "%s{\"segments\": %d, \"sweep\": %s, \"fused_update\": %s, \"recompute_1x1\": %s, \"accumulate\": %d, "
                   "\"precision\": \"%s\", \"optimizer_state\": \"%s\", \"compress\": %d, \"bytes\": %zu, "
                   "\"fits\": %s, \"exact\": %s, \"seconds\": ",
                i ? ", " : "", c->net.segments, c->net.sweep ? "true" : "false",
                c->net.fused_update ? "true" : "false", c->net.recompute_1x1 ? "true" : "false", c->accumulate,
                precision_name(c->net.precision), state_format_names[c->net.opt_format],
                c->net.compress, mem_plan_on(&c->plan, k),
                c->fits ? "true" : "false", c->exact ? "true" : "false");
        if (c->seconds >= 0) fprintf(f, "%.4f}", c->seconds);
        else fprintf(f, "null}");
    }
    fprintf(f, "]}");
}

void plan_print(const Net *net, size_t baseline, size_t available, const char *source, bool json,
                const BudgetReport *budget) {
    const MemPlan *p = &net->plan;
    const Kernels *k = net->k;
    const bool fused = net->fused_update;
    const StateFormat format = net->opt_format;
    const int bits = net->exec.pack_bits;
    const size_t need = mem_plan_on(p, k);
    if (json) {
        printf("{\"device\": \"%s\", \"params\": %zu, \"grads\": %zu, \"grads_unfused\": %zu, "
               "\"fused_update\": %s, \"recompute_1x1\": %d, \"optimizer\": %zu, \"optimizer_state\": \"%s\", "
               "\"buffers\": %zu, \"activations\": %zu, \"activations_kept\": %zu, "
               "\"compress\": %d, \"activations_compressed\": %zu, \"activations_workspace\": %zu, \"workspace\": %zu, \"threads\": %zu, \"loader\": %zu, \"exchange\": %zu, \"total\": %zu, "
               "\"on_device\": %zu, \"baseline\": %zu, \"available\": ",
               k->name, p->params, p->grads, p->grads_unfused, fused ? "true" : "false",
               net->recompute_1x1 ? net->widening_1x1 : 0, p->optimizer,
               state_format_names[format],
               p->buffers, p->activations, p->act_kept, bits, p->act_packed, p->act_workspace, p->workspace, p->threads, p->loader,
               p->exchange, mem_plan_total(p), need, baseline);
        if (available == SIZE_MAX) printf("null");
        else printf("%zu", available);
        if (budget && budget->n) budget_report_json(stdout, budget, k);
        printf("}\n");
        return;
    }
    printf("memory plan (MB):\n");
    printf("  %-34s %10.1f\n", "parameters", p->params / 1e6);
    if (fused)
        printf("  %-34s %10.1f  (fused update: a layer's in the activations during its backward; %.1f unfused)\n",
               "gradients", p->grads / 1e6, p->grads_unfused / 1e6);
    else if (p->grads)  // why every gradient is held at once
        printf("  %-34s %10.1f  (all at once: %s)\n", "gradients", p->grads / 1e6,
               net->precision == DT_F16 ? "fp16's loss scaler reads them all before the step"
                                        : "accumulate, clip_grad_norm or fused_update = 0 keep the "
                                          "fused update off");
    else
        printf("  %-34s %10.1f\n", "gradients", p->grads / 1e6);
    if (format != STATE_F32)
        printf("  %-34s %10.1f  (%s)\n", "optimizer state", p->optimizer / 1e6, state_format_names[format]);
    else
        printf("  %-34s %10.1f\n", "optimizer state", p->optimizer / 1e6);
    printf("  %-34s %10.1f\n", "buffers (batchnorm statistics)", p->buffers / 1e6);
    printf("  %-34s %10.1f\n", "activations", p->activations / 1e6);
    printf("  %-34s %10.1f\n", "  kept from forward for backward", p->act_kept / 1e6);
    if (bits) printf("  %-34s %10.1f  (%d-bit codes)\n", "    of which compressed", p->act_packed / 1e6, bits);
    if (p->act_workspace)
        printf("  %-34s %10.1f  (largest; each layer's during its own events)\n", "  layers' workspace (im2col)",
               p->act_workspace / 1e6);
    printf("  %-34s %10.1f\n", p->act_workspace ? "workspace (executor scratch)" : "workspace (im2col, executor scratch)",
           p->workspace / 1e6);
    if (k->host_memory) {
        printf("  %-34s %10.1f\n", "threads (GEMM packing)", p->threads / 1e6);
        printf("  %-34s %10.1f\n", "loader (batches, decoding)", p->loader / 1e6);
        if (p->exchange) printf("  %-34s %10.1f\n", "gradient exchange (processes)", p->exchange / 1e6);
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

// The user's leave for the savers that change the result (DESIGN decision 17).
static BudgetLeave leave_of(const Options *o) {
    return (BudgetLeave){.fp16 = o->auto_fp16 != 0, .microbatch = o->auto_microbatch != 0,
                         .compress = o->auto_compress != 0};
}

// The keys that allow what choice c changes against the configured `base` and
// `accumulate`: all of them (`given`), or those beyond the leave o gives. sep goes before
// each key after the first (" and ", " "); *count: how many.
static const char *keys_for(const FitChoice *c, const Options *o, const NetOptions *base,
                            int accumulate, bool given, const char *sep, char *buf, size_t cap,
                            int *count) {
    const bool need[] = {c->net.precision == DT_F16 && base->precision != DT_F16,
                         c->accumulate > accumulate && c->coupled,
                         c->net.opt_format != base->opt_format};
    const bool have[] = {o->auto_fp16, o->auto_microbatch, o->auto_compress};
    static const char *const key[] = {"auto_fp16=1", "auto_microbatch=1", "auto_compress=1"};
    size_t n = 0;
    buf[0] = '\0';
    *count = 0;
    for (int i = 0; i < 3; i++)
        if (need[i] && (given || !have[i]) && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", (*count)++ ? sep : "", key[i]);
    return buf;
}

// A plan's savers in words: "checkpoint = 7 segments with sweeps, fused update, accumulate
// = 2 (micro-batch 16), fp16".
static const char *savers_of(const FitChoice *c, char *buf, size_t cap) {
    int n = c->net.segments ? snprintf(buf, cap, "checkpoint = %d segments with sweeps", c->net.segments)
                            : snprintf(buf, cap, "no checkpointing");
    if (c->net.fused_update) n += snprintf(buf + n, cap - (size_t)n, ", fused update");
    if (c->net.recompute_1x1) n += snprintf(buf + n, cap - (size_t)n, ", 1x1 convolutions recomputed");
    if (c->accumulate > 1)
        n += snprintf(buf + n, cap - (size_t)n, ", accumulate = %d (micro-batch %d)", c->accumulate, c->net.batch);
    if (c->net.precision != DT_F32) n += snprintf(buf + n, cap - (size_t)n, ", %s", precision_name(c->net.precision));
    if (c->net.opt_format != STATE_F32)
        n += snprintf(buf + n, cap - (size_t)n, ", %s optimizer state", state_format_names[c->net.opt_format]);
    if (c->net.compress) snprintf(buf + n, cap - (size_t)n, ", %d-bit activations", c->net.compress);
    return buf;
}

int plan_apply_budget(const Options *o, const Kernels *k, const Cfg *cfg, const Dataset *train,
                      int classes, size_t overhead, size_t prefetch1_saves, NetOptions *opt,
                      int *accumulate, BudgetReport *r, Error *err) {
    memset(r, 0, sizeof *r);
    r->chosen = -1;
    const BudgetQuery q = {.cfg = cfg, .k = k, .input = train->shape, .classes = classes,
                           .batch = o->batch, .base = *opt, .base_accumulate = *accumulate,
                           .overhead = overhead, .budget = o->memory, .leave = leave_of(o),
                           .all_grads = o->optim.clip_grad_norm > 0};
    const char *with = k->host_memory ? "with the loader and this process's baseline"
                                      : "on the GPU with its baseline (context, cuBLAS)";
    FILE *to = o->json ? stderr : stdout;  // --plan --json: stdout is the JSON alone
    if (budget_plans(&q, &r->plans, &r->n, err)) return -1;
    const FitChoice *base = r->n ? &r->plans[0] : NULL;  // the run as configured: listed first
    if (base && base->fits) {
        fprintf(to, "memory = %.0f MB: the run fits as configured (%.0f MB %s)\n", o->memory / 1048576.0,
                (mem_plan_on(&base->plan, k) + overhead) / 1048576.0, with);
        return 0;
    }
    const int smallest = budget_smallest(r->plans, r->n);
    const FitChoice *s = smallest >= 0 ? &r->plans[smallest] : NULL;
    char buf[200], keys[96], why[400];
    if (!s || !s->fits) {
        // Would a saver the user has not allowed fit? Say which, and what it would change.
        BudgetQuery any = q;
        any.leave = (BudgetLeave){true, true, true};
        FitChoice *all = NULL;
        int nall = 0;
        char extra[500] = "";
        if (!budget_plans(&any, &all, &nall, err)) {
            const int a = budget_smallest(all, nall);
            int nk;
            if (a >= 0 && all[a].fits)
                snprintf(extra, sizeof extra, "; %s would fit with %s, but %s", savers_of(&all[a], buf, sizeof buf),
                         keys_for(&all[a], o, opt, *accumulate, false, " ", keys, sizeof keys, &nk),
                         fit_changes(&all[a], opt, *accumulate, o->batch, why, sizeof why));
        }
        free(all);
        const double need = s ? (mem_plan_on(&s->plan, k) + overhead) / 1048576.0 : 0;
        char ring[300] = "";
        if (s && prefetch1_saves && mem_plan_on(&s->plan, k) + overhead - prefetch1_saves <= o->memory)
            snprintf(ring, sizeof ring, "; or set prefetch = 1: the loader then keeps one batch "
                     "ahead (%.0f MB less), and that plan fits, at the cost of decoding the next "
                     "batch only after each step", prefetch1_saves / 1048576.0);
        return err_set(err, "memory = %.0f MB: nothing fits that trains as asked; the smallest plan "
                            "(%s) needs %.0f MB %s: raise memory to at least %.0fM or lower the batch%s%s",
                       o->memory / 1048576.0, s ? savers_of(s, buf, sizeof buf) : "none", need, with,
                       need + 1, ring, extra);
    }
    // Time the plans that fit: a probe of the smallest (it fits) on this device.
    CostTable t;
    r->probe_steps = 6;  // a warm-up and two timed steps at the batch and at half of it
    int nfit = 0;
    for (int i = 0; i < r->n; i++) nfit += r->plans[i].fits;
    fprintf(to, "memory = %.0f MB: the run as configured does not fit; timing the %d plan%s that do%s "
                "(a probe of %d steps)...\n", o->memory / 1048576.0, nfit, nfit == 1 ? "" : "s",
            nfit == 1 ? "es" : "", r->probe_steps);
    fflush(to);
    if (budget_probe(&q, s, r->probe_steps, &t, &r->probe, err)) return -1;
    r->chosen = budget_estimate(&q, r->plans, r->n, &t, &r->plain, err);
    cost_free(&t);
    if (r->chosen < 0) return -1;
    const FitChoice *c = &r->plans[r->chosen];
    fprintf(to, "memory = %.0f MB: chose %s: the plan needs %.0f MB %s; about %.2f s a step, %.2fx "
                "the run as configured (%.2f s; estimated from a probe of %d steps, %.1f s)\n",
            o->memory / 1048576.0, savers_of(c, buf, sizeof buf),
            (mem_plan_on(&c->plan, k) + overhead) / 1048576.0, with, c->seconds,
            r->plain > 0 ? c->seconds / r->plain : 0.0, r->plain, r->probe_steps, r->probe);
    if (fit_changes(c, opt, *accumulate, o->batch, why, sizeof why)[0]) {
        int nk;
        keys_for(c, o, opt, *accumulate, true, " and ", keys, sizeof keys, &nk);
        fprintf(to, "memory = %.0f MB: this changes the training, as %s allow%s: %s\n",
                o->memory / 1048576.0, keys, nk == 1 ? "s" : "", why);
    }
    if (opt->fused_update && !c->net.fused_update)
        fprintf(to, "memory = %.0f MB: without the fused update: %s needs every gradient before "
                    "the update\n", o->memory / 1048576.0, c->accumulate > 1 ? "accumulation" : "fp16");
    *opt = c->net;
    opt->plan_only = false;
    *accumulate = c->accumulate;
    return 0;
}

void plan_refuse_too_big(const Options *o, const Kernels *k, const Cfg *cfg,
                         const Dataset *train, int classes, NetOptions opt, int accumulate,
                         const MemPlan *plan, size_t available, const char *source, Error *err) {
    Error ignored = {{0}};
    opt.plan_only = false;
    const size_t budget = available / 10 * 9;  // room for the process's own memory
    const BudgetQuery q = {.cfg = cfg, .k = k, .input = train->shape, .classes = classes,
                           .batch = o->batch, .base = opt, .base_accumulate = accumulate,
                           .overhead = k->host_memory ? plan->loader : 0, .budget = budget,
                           .leave = {true, true, true}, .all_grads = o->optim.clip_grad_norm > 0};
    FitChoice *plans = NULL;
    int n = 0;
    const bool searched = !budget_plans(&q, &plans, &n, &ignored);
    const int s = searched ? budget_smallest(plans, n) : -1;
    const bool fits = s >= 0 && plans[s].fits;
    char what[800] = "lower the batch", keys[96], why[400], buf[200];
    if (fits) {
        int nk;
        keys_for(&plans[s], o, &opt, accumulate, false, " ", keys, sizeof keys, &nk);
        const int w = snprintf(what, sizeof what, "memory=%.0fM%s%s chooses what fits (%s)",
                               budget / 1048576.0, nk ? " " : "", keys, savers_of(&plans[s], buf, sizeof buf));
        if (fit_changes(&plans[s], &opt, accumulate, o->batch, why, sizeof why)[0])
            snprintf(what + w, sizeof what - (size_t)w, " (%s)", why);
    }
    free(plans);
    err_set(err, "the memory plan needs %.1f MB but %.1f MB is %s: the run cannot fit (it would "
                 "be killed when memory runs out); %s%s", mem_plan_on(plan, k) / 1e6, available / 1e6,
            source, what, searched && !fits ? " (even checkpointing, accumulation to a micro-batch "
                                              "of 1, fp16 and int8 optimizer state do not fit)" : "");
}
