// budget.c: the plans of a memory budget and the choice between them (budget.h).
#include "budget.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

// Plans choice c (its micro-batch from q's batch) without allocating.
static int plan_of(const BudgetQuery *q, FitChoice *c, Error *err) {
    c->net.batch = q->batch / c->accumulate;
    c->net.plan_only = true;
    Net net;
    if (net_create(&net, q->cfg, q->input, q->classes, &c->net, q->k, err)) return -1;
    c->plan = net.plan;
    c->coupled = net_batch_coupled(&net);
    c->fits = mem_plan_on(&c->plan, q->k) + q->overhead <= q->budget;
    c->seconds = -1;
    net_free(&net);
    return 0;
}

// The plans being listed.
typedef struct List {
    FitChoice *p;
    int n, cap;
} List;

static int list_add(List *l, const FitChoice *c, Error *err) {
    for (int i = 0; i < l->n; i++)  // the same plan twice (the configured segments)
        if (l->p[i].accumulate == c->accumulate && l->p[i].net.segments == c->net.segments &&
            l->p[i].net.precision == c->net.precision && l->p[i].net.fused_update == c->net.fused_update &&
            l->p[i].net.recompute_1x1 == c->net.recompute_1x1 &&
            l->p[i].net.opt_format == c->net.opt_format && l->p[i].net.compress == c->net.compress)
            return 0;
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 32;
        FitChoice *p = realloc(l->p, (size_t)cap * sizeof *p);
        if (!p) return err_set(err, "out of host memory listing the budget's plans");
        l->p = p, l->cap = cap;
    }
    l->p[l->n++] = *c;
    return 0;
}

// Every segment count for one precision and micro-batch count: none, then 2, 3, 4, 6,
// round(sqrt(nodes)) and twice that (and the configured), each with its sweeps, and each
// without and with the fused update where it may run (one fp32 or bf16 batch; only with it when
// the run asks for it), and without and with recompute_1x1 where the network has such
// convolutions (only with it when the run asks for it); `exact` says whether they change
// nothing but rounding. Returns the plans added that fit, or -1.
static int add_segmentings(const BudgetQuery *q, List *l, NetOptions opt, int accumulate, int nodes,
                           bool widening_1x1, bool exact, Error *err) {
    const int r = (int)lround(sqrt((double)nodes));
    const int counts[] = {q->base.segments, 0, 2, 3, 4, 6, r, 2 * r};
    const bool fusable = accumulate == 1 && opt.precision != DT_F16 && !q->all_grads;
    int fit = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        for (int fused = q->base.fused_update && fusable; fused <= fusable; fused++)
            for (int re = q->base.recompute_1x1; re <= (q->base.recompute_1x1 || widening_1x1); re++) {
                int S = counts[i] == NET_SEGMENTS_SQRT ? r : counts[i];
                if (S == 1) S = 0;
                if (S > nodes) continue;
                FitChoice c = {.net = opt, .accumulate = accumulate, .exact = exact};
                c.net.segments = S;
                c.net.sweep = S != 0 || opt.compress;  // compression's stem runs as a sweep
                c.net.fused_update = fused;
                c.net.recompute_1x1 = re;
                if (plan_of(q, &c, err) || list_add(l, &c, err)) return -1;
                fit += c.fits;
            }
    return fit;
}

int budget_plans(const BudgetQuery *q, FitChoice **plans, int *n, Error *err) {
    *plans = NULL, *n = 0;
    List l = {0};
    // The network's nodes (for round(sqrt)) and whether micro-batches change its result.
    FitChoice probe = {.net = q->base, .accumulate = q->base_accumulate};
    probe.net.plan_only = true;
    Net net;
    probe.net.batch = q->batch / q->base_accumulate;
    if (net_create(&net, q->cfg, q->input, q->classes, &probe.net, q->k, err)) return -1;
    const int nodes = net.nnodes;
    const bool coupled = net_batch_coupled(&net), widening_1x1 = net.widening_1x1 > 0;
    net_free(&net);
    int fit = 0;
    // The exact plans: the configured precision; micro-batches where they change nothing
    // but rounding.
    for (int acc = q->base_accumulate; acc <= q->batch; acc++) {
        if (q->batch % acc || (acc > q->base_accumulate && coupled)) continue;
        const int f = add_segmentings(q, &l, q->base, acc, nodes, widening_1x1, true, err);
        if (f < 0) goto fail;
        fit += f;
    }
    // The lossy ones the leave allows, when no exact plan fits: each precision and state
    // format allowed (the configured pair only with micro-batches that change the result),
    // with every micro-batch count allowed; then, while none of those fits, the same with
    // activations compressed to 8 bits, then 4, then 2 (auto_compress; the least loss that
    // fits).
    const int nstate = q->leave.compress && q->base.opt_states ? STATE_FORMAT_COUNT : 1;
    const int widths[] = {q->base.compress, 8, 4, 2};
    int lossy_fit = 0;
    for (int a = 0; a < 4 && !fit && !lossy_fit; a++) {
        if (a && (!q->leave.compress || (q->base.compress && q->base.compress <= widths[a]))) continue;
        for (int half = 0; half < 2; half++) {
            if (half && (!q->leave.fp16 || precision_is_half(q->base.precision))) break;
            for (int f = 0; f < nstate; f++) {
                NetOptions opt = q->base;
                opt.compress = widths[a];
                if (half) opt.precision = DT_F16;
                if (f) opt.opt_format = (StateFormat)f;
                if (f && opt.opt_format == q->base.opt_format) continue;
                const bool same = !a && !half && !f;  // as configured but for the micro-batches
                for (int acc = q->base_accumulate; acc <= q->batch; acc++) {
                    if (q->batch % acc || (same && (acc == q->base_accumulate || !coupled || !q->leave.microbatch)) ||
                        (!same && acc > q->base_accumulate && coupled && !q->leave.microbatch))
                        continue;
                    const int f2 = add_segmentings(q, &l, opt, acc, nodes, widening_1x1, false, err);
                    if (f2 < 0) goto fail;
                    lossy_fit += f2;
                }
            }
        }
    }
    *plans = l.p, *n = l.n;
    return 0;
fail:
    free(l.p);
    return -1;
}

int budget_smallest(const FitChoice *plans, int n) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        const size_t b = mem_plan_total(&plans[i].plan);
        if (best < 0 || (plans[i].fits && !plans[best].fits) ||
            (plans[i].fits == plans[best].fits && b < mem_plan_total(&plans[best].plan)))
            best = i;
    }
    return best;
}

// Plans c again (plan_only) and costs a step of it from t.
static int estimate(const BudgetQuery *q, const FitChoice *c, const CostTable *t, double *seconds,
                    Error *err) {
    NetOptions opt = c->net;
    opt.plan_only = true;
    Net net;
    if (net_create(&net, q->cfg, q->input, q->classes, &opt, q->k, err)) return -1;
    *seconds = cost_step(t, &net, c->accumulate);
    net_free(&net);
    return 0;
}

int budget_estimate(const BudgetQuery *q, FitChoice *plans, int n, const CostTable *t,
                    double *plain, Error *err) {
    FitChoice base = {.net = q->base, .accumulate = q->base_accumulate};
    base.net.batch = q->batch / q->base_accumulate;
    if (estimate(q, &base, t, plain, err)) return -1;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!plans[i].fits) continue;
        if (estimate(q, &plans[i], t, &plans[i].seconds, err)) return -1;
        // Exact plans first: a lossy one only when none of them fits (budget_plans lists
        // lossy plans only then); of two as fast, the smaller (the fused update costs
        // nothing the estimate sees), but the run as configured (plans[0]) where it fits.
        const bool faster = plans[i].seconds < plans[best < 0 ? i : best].seconds,
                   as_fast = best > 0 && plans[i].seconds == plans[best].seconds;
        if (best < 0 || (plans[i].exact && !plans[best].exact) ||
            (plans[i].exact == plans[best].exact &&
             (faster || (as_fast && mem_plan_total(&plans[i].plan) < mem_plan_total(&plans[best].plan)))))
            best = i;
    }
    return best;
}

int budget_probe(const BudgetQuery *q, const FitChoice *c, int steps, CostTable *t, double *seconds,
                 Error *err) {
    NetOptions opt = c->net;
    opt.plan_only = false;
    Net net;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (net_create(&net, q->cfg, q->input, q->classes, &opt, q->k, err)) return -1;
    int rc = net_init_params(&net, 1, err) || cost_init(t, &net, err) ||
                     cost_probe(t, &net, q->classes, steps, err)
                 ? -1
                 : 0;
    net_free(&net);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return rc;
}

const char *fit_changes(const FitChoice *c, const NetOptions *base, int base_accumulate, int batch,
                        char *why, size_t cap) {
    why[0] = '\0';
    size_t n = 0;
    if (c->net.precision == DT_F16 && base->precision != DT_F16)
        n += (size_t)snprintf(why + n, cap - n, "fp16 stores activations and their gradients as "
                              "halves (rounded to 11 significant bits)");
    if (c->net.opt_format != base->opt_format && n < cap)
        n += (size_t)snprintf(why + n, cap - n, "%sthe optimizer state is stored as %s (%s)",
                              n ? "; " : "", state_format_names[c->net.opt_format],
                              c->net.opt_format == STATE_INT8
                                  ? "block-wise 8-bit codes, rounded each step"
                                  : "rounded to 8 significant bits each step");
    if (c->net.compress != base->compress && n < cap)
        n += (size_t)snprintf(why + n, cap - n, "%swhat backward reads of the activations is kept as "
                              "%d-bit codes, stochastically rounded (the gradients are exact in "
                              "expectation only)", n ? "; " : "", c->net.compress);
    if (c->accumulate > base_accumulate && c->coupled && n < cap)
        snprintf(why + n, cap - n, "%sbatchnorm normalises each micro-batch of %d by its own "
                 "statistics and moves its running statistics %d times a step: a different "
                 "training from batch %d", n ? "; " : "", c->net.batch, c->accumulate, batch);
    return why;
}

// The value of `field` (in kB) in root's `file`, a file of "Name:  N kB" lines such as
// /proc/meminfo, in bytes; 0 if the file or the field is missing.
static size_t proc_kb(const char *root, const char *file, const char *field) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s", root, file);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t v = 0;
    const size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) {
            unsigned long long kb;
            if (sscanf(line + n, " %llu", &kb) == 1) v = (size_t)kb * 1024;
            break;
        }
    fclose(f);
    return v;
}

// A size field of root's /proc/self/status; where there is none (not Linux), the peak
// resident size from getrusage (ru_maxrss: bytes on macOS, kB elsewhere).
static size_t status_bytes(const char *root, const char *field) {
    const size_t v = proc_kb(root, "/proc/self/status", field);
    struct rusage ru;
    if (v || getrusage(RUSAGE_SELF, &ru)) return v;
#ifdef __APPLE__
    return (size_t)ru.ru_maxrss;
#else
    return (size_t)ru.ru_maxrss * 1024;
#endif
}

size_t proc_status_bytes(const char *field) { return status_bytes("", field); }

// What the machine can give: MemAvailable; where it is missing (not Linux, or Linux before
// 3.14), sysconf's free pages, which leave out the cache the kernel would give up (too
// little rather than too much), or all of the memory where no count of free pages exists.
// SIZE_MAX when nothing says.
static size_t machine_free(const char *root, const char **source) {
    const size_t avail = proc_kb(root, "/proc/meminfo", "MemAvailable:");
    *source = "the machine's available memory (MemAvailable)";
    if (avail) return avail;
#ifdef _SC_AVPHYS_PAGES
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    *source = "the machine's free memory (sysconf)";
#else
    const long pages = sysconf(_SC_PHYS_PAGES);
    *source = "the machine's memory (sysconf)";
#endif
    const long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return (size_t)pages * (size_t)page;
    *source = "unknown";
    return SIZE_MAX;
}

// One number from the cgroup file dir/name ("max" and unreadable files give SIZE_MAX).
static size_t cgroup_value(const char *dir, const char *name) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return SIZE_MAX;
    FILE *f = fopen(path, "r");
    if (!f) return SIZE_MAX;
    unsigned long long v;
    const int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok && v < SIZE_MAX ? (size_t)v : SIZE_MAX;
}

// The least that this process's memory cgroup and its parents leave it (each one's limit
// less its use), from the v2 hierarchy (memory.max) or v1's memory controller
// (memory.limit_in_bytes) where root's /proc/self/cgroup places it; SIZE_MAX when none is
// limited. A container's own cgroup may be mounted as the hierarchy's root: the parents'
// folders are tried up to the root, and the ones that do not exist are passed over.
static size_t cgroup_left(const char *root, const char **source) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return SIZE_MAX;
    size_t best = SIZE_MAX;
    char line[PATH_MAX];
    while (fgets(line, sizeof line, f)) {  // "ID:CONTROLLERS:PATH"
        char *ctl = strchr(line, ':'), *cg = ctl ? strchr(ctl + 1, ':') : NULL;
        if (!cg || cg[1] != '/') continue;
        *ctl++ = '\0', *cg++ = '\0';
        cg[strcspn(cg, "\n")] = '\0';
        const bool v2 = !strcmp(line, "0") && !*ctl;
        if (!v2 && strcmp(ctl, "memory")) continue;
        for (;;) {
            char dir[PATH_MAX];
            if (snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s%s", root, v2 ? "" : "/memory", cg) >=
                (int)sizeof dir)
                break;
            const size_t max = cgroup_value(dir, v2 ? "memory.max" : "memory.limit_in_bytes"),
                         cur = cgroup_value(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
            const size_t left =
                max == SIZE_MAX || cur == SIZE_MAX ? SIZE_MAX : max > cur ? max - cur : 0;
            if (left < best)
                best = left, *source = v2 ? "the cgroup's memory.max less its use"
                                          : "the cgroup's memory.limit_in_bytes less its use";
            if (!cg[1]) break;  // the hierarchy's root was the last
            char *slash = strrchr(cg, '/');
            slash[slash == cg] = '\0';  // "/a/b" -> "/a" -> "/"
        }
    }
    fclose(f);
    return best;
}

size_t budget_machine_bytes_in(const char *root, const char **source) {
    size_t best = machine_free(root, source);
    const char *cgroup = NULL;
    const size_t left = cgroup_left(root, &cgroup);
    if (left < best) best = left, *source = cgroup;
    // Lacking /proc, status_bytes's peak resident size stands in for what is mapped.
    const struct {
        int resource;
        const char *status, *name;
    } limits[] = {{RLIMIT_AS, "VmSize:", "the address-space limit (ulimit -v) less the mapped"},
                  {RLIMIT_DATA, "VmData:", "the data limit (ulimit -d) less the data in use"}};
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        struct rlimit rl;
        if (getrlimit(limits[i].resource, &rl) || rl.rlim_cur == RLIM_INFINITY) continue;
        const size_t used = status_bytes(root, limits[i].status);
        const size_t left = rl.rlim_cur > used ? (size_t)rl.rlim_cur - used : 0;
        if (left < best) best = left, *source = limits[i].name;
    }
    return best;
}

size_t budget_machine_bytes(const char **source) { return budget_machine_bytes_in("", source); }
