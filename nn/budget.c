#include "budget.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static int plan_of(const Cfg *cfg, Shape input, int classes, NetOptions opt, const Kernels *k,
                   MemPlan *plan, Error *err) {
    Net net;
    opt.plan_only = true;
    if (net_create(&net, cfg, input, classes, &opt, k, err)) return -1;
    *plan = net.plan;
    net_free(&net);
    return 0;
}

typedef struct Search {
    const Cfg *cfg;
    const Kernels *k;
    Shape input;
    int classes, batch;
    size_t overhead, budget, smallest;
    bool fused;  // the base asks for the fused update
    FitChoice *out;
    bool *fits;
} Search;

// Sets c's micro-batch and plans it. The fused update stays where the base has it and c
// allows it (one batch, fp32).
static int plan_choice(const Search *s, FitChoice *c, Error *err) {
    c->net.batch = s->batch / c->accumulate;
    c->net.fused_update = s->fused && c->accumulate == 1 && c->net.precision == DT_F32;
    return plan_of(s->cfg, s->input, s->classes, c->net, s->k, &c->plan, err);
}

// Plans candidate *c (its plan stays in it); returns 1 if it fits (and takes it), 0 if
// not, -1 on error.
static int try_choice(Search *s, FitChoice *c, Error *err) {
    if (plan_choice(s, c, err)) return -1;
    const size_t total = mem_plan_on(&c->plan, s->k) + s->overhead;
    if (total <= s->budget) {
        *s->out = *c;
        *s->fits = true;
        return 1;
    }
    if (total < s->smallest) s->smallest = total, *s->out = *c;
    return 0;
}

// Tries `c` with accumulate = base, then each larger divisor of the batch.
static int try_accumulations(Search *s, FitChoice c, Error *err) {
    const int base = c.accumulate;
    for (int acc = base; acc <= s->batch; acc++) {
        if (s->batch % acc) continue;
        c.accumulate = acc;
        const int r = try_choice(s, &c, err);
        if (r) return r;
    }
    return 0;
}

// Checkpointing for *c (planned: plan_choice; unless base has it already) where it makes
// the plan smaller: a network whose peak lies in the backward of its largest layers gains
// nothing from recomputing, and would only slow down.
static int checkpoint_if_smaller(const Search *s, FitChoice *c, NetOptions base, Error *err) {
    FitChoice ckpt = *c;
    ckpt.net.segments = base.segments > 1 ? base.segments : NET_SEGMENTS_SQRT;
    if (plan_choice(s, &ckpt, err)) return -1;
    if (mem_plan_on(&ckpt.plan, s->k) < mem_plan_on(&c->plan, s->k)) *c = ckpt;
    return 0;
}

int fit_budget(const Cfg *cfg, const Kernels *k, Shape input, int classes, int batch,
               NetOptions base, int base_accumulate, size_t overhead, size_t budget,
               bool allow_fp16, FitChoice *out, bool *fits, Error *err) {
    Search s = {.cfg = cfg, .k = k, .input = input, .classes = classes, .batch = batch,
                .overhead = overhead, .budget = budget, .smallest = SIZE_MAX,
                .fused = base.fused_update, .out = out, .fits = fits};
    *fits = false;
    FitChoice c = {.net = base, .accumulate = base_accumulate};
    int r = try_choice(&s, &c, err);  // 1. as configured
    if (r) return r < 0 ? -1 : 0;
    if (checkpoint_if_smaller(&s, &c, base, err)) return -1;  // 2. checkpointing
    r = try_accumulations(&s, c, err);  // 3. then accumulation
    if (r || !allow_fp16 || base.precision == DT_F16) return r < 0 ? -1 : 0;
    c = (FitChoice){.net = base, .accumulate = base_accumulate};
    c.net.precision = DT_F16;
    if (plan_choice(&s, &c, err) || checkpoint_if_smaller(&s, &c, base, err)) return -1;
    r = try_accumulations(&s, c, err);  // 4. then fp16
    return r < 0 ? -1 : 0;
}

// The value of `field` (in kB) in a /proc file such as /proc/meminfo, in bytes; 0 if absent.
static size_t proc_kb(const char *file, const char *field) {
    FILE *f = fopen(file, "r");
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

// One number from a cgroup file ("max" and unreadable files give SIZE_MAX).
static size_t cgroup_value(const char *file) {
    FILE *f = fopen(file, "r");
    if (!f) return SIZE_MAX;
    unsigned long long v;
    const int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok ? (size_t)v : SIZE_MAX;
}

size_t budget_machine_bytes(const char **source) {
    size_t best = SIZE_MAX;
    *source = "unknown";
    const size_t avail = proc_kb("/proc/meminfo", "MemAvailable:");
    if (avail) best = avail, *source = "the machine's available memory (MemAvailable)";
    const size_t max = cgroup_value("/sys/fs/cgroup/memory.max"),
                 cur = cgroup_value("/sys/fs/cgroup/memory.current");
    if (max != SIZE_MAX && cur != SIZE_MAX) {
        const size_t left = max > cur ? max - cur : 0;
        if (left < best) best = left, *source = "the cgroup's memory.max less its use";
    }
    const struct {
        int resource;
        const char *status, *name;
    } limits[] = {{RLIMIT_AS, "VmSize:", "the address-space limit (ulimit -v) less the mapped"},
                  {RLIMIT_DATA, "VmData:", "the data limit (ulimit -d) less the data in use"}};
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        struct rlimit rl;
        if (getrlimit(limits[i].resource, &rl) || rl.rlim_cur == RLIM_INFINITY) continue;
        const size_t used = proc_kb("/proc/self/status", limits[i].status);
        const size_t left = rl.rlim_cur > used ? (size_t)rl.rlim_cur - used : 0;
        if (left < best) best = left, *source = limits[i].name;
    }
    return best;
}
