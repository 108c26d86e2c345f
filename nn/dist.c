// dist.c: dist.h over MPI (CNN_MPI, set by the Makefile when mpicc is found), or alone.
#include "dist.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef CNN_MPI
#include <mpi.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// One sum of x[0..n) in progress (Sums). Rank r sums slice r (of `size` near-equal slices)
// of everyone's x in rank order: every rank sends slice r to rank r (MPI_Ialltoallv, on
// the `slices` communicator), which adds the P copies, rank 0's first; then every rank
// gathers the summed slices (MPI_Iallgatherv, on `gather`).
typedef struct Sum {
    void *x;
    size_t n, elem;       // values of elem bytes: 4 (float) or 8 (double)
    int *counts;          // (4P): the slices' counts and offsets, then the received ones';
                          // the slot's own, kept from step to step
    void *recv;           // (P x this rank's slice) everyone's copy of this rank's slice
    bool own_recv;        // recv is malloc'd, not in the arena
    MPI_Request req;
    int phase;            // 0: slices travel, 1: sums gather, 2: done
} Sum;

// The sums of a step, started in order (dist_sum_start) and advanced by the caller's
// dist_sum_progress until dist_sum_wait. A sum's gather is posted only after every earlier
// sum's (MPI wants collectives in the same order on every rank, and the slices' arrival
// order differs between ranks), on a communicator of its own.
struct DistExchange {
    MPI_Comm slices, gather;
    Sum one;              // a blocking sum's slot
    Sum *sums;
    int n, cap, done;     // sums[0..done) are done
    char *arena;          // the received slices' memory, reused step after step
    size_t arena_bytes, used, wanted;  // wanted: what this step's sums took in all
};

static void exchange_free(Dist *d);

// Keeps a gradient sum's time waited for (dist_exposed); one that cannot be kept (no memory)
// counts as none.
static void note_wait(Dist *d, double seconds) {
    if (d->nwaits == d->cap_waits) {
        const int cap = d->cap_waits ? 2 * d->cap_waits : 256;
        double *w = realloc(d->waits, (size_t)cap * sizeof *w);
        if (!w) return;
        d->waits = w, d->cap_waits = cap;
    }
    d->waits[d->nwaits++] = seconds;
}
#endif

int dist_available(void) {
#ifdef CNN_MPI
    return 1;
#else
    return 0;
#endif
}

// The number of ranks the launcher says this process is one of (1 when started alone).
// Slurm's count is the step's (srun's tasks), not the job's SLURM_NTASKS: a batch script of
// an allocation of 2 tasks that runs ./train itself runs one process.
static int launched_size(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

int dist_init(Dist *d, int *argc, char ***argv, Error *err) {
    memset(d, 0, sizeof *d);
    d->size = 1;
#ifdef CNN_MPI
    if (launched_size() <= 1 && !getenv("OMPI_COMM_WORLD_SIZE")) return 0;  // alone: no MPI at all
    // srun's tasks find each other through the PMI server srun starts with --mpi=pmix (or
    // pmi2). Without one, OpenMPI's MPI_Init fails in every task with a message about how
    // OpenMPI was built; Debian's OpenMPI takes PMIx only, not PMI-2.
#ifdef OPEN_MPI
    const int pmi = getenv("PMIX_RANK") != NULL;
#else
    const int pmi = getenv("PMIX_RANK") || getenv("PMI_RANK");
#endif
    if (getenv("SLURM_STEP_NUM_TASKS") && !getenv("OMPI_COMM_WORLD_SIZE") && !pmi)
        return err_set(err, "started by srun as one of %d tasks without PMIx, so the tasks cannot "
                            "find each other: run srun --mpi=pmix (srun --mpi=list lists the plugins "
                            "of this Slurm), or set MpiDefault=pmix in slurm.conf", launched_size());
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return err_set(err, "MPI_Init failed");
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    // A failed call returns its error to the trainer, which says what it was doing, instead
    // of MPI's own text ending every process.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!(d->exchange = xcalloc(1, sizeof *d->exchange, err))) return -1;
    d->exchange->slices = d->exchange->gather = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &d->exchange->slices) != MPI_SUCCESS ||
        MPI_Comm_dup(MPI_COMM_WORLD, &d->exchange->gather) != MPI_SUCCESS)
        return err_set(err, "MPI_Comm_dup failed");
    return 0;
#else
    (void)argc, (void)argv;
    const int n = launched_size();
    if (n > 1)
        return err_set(err, "started as one of %d processes (mpirun), but this build has no MPI: "
                            "install it (apt-get install libopenmpi-dev openmpi-bin) and rebuild "
                            "(make clean && make, or make MPI=1)", n);
    return 0;
#endif
}

// ---- the launcher ----------------------------------------------------------------------

// The parent of process pid, from /proc/PID/stat (0 where it cannot be read).
static long parent_of(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *end = strrchr(buf, ')');  // past the command's name, which may hold anything
    long ppid = 0;
    return end && sscanf(end + 1, " %*c %ld", &ppid) == 1 ? ppid : 0;
}

int dist_stdout_is_terminal(void) {
    if (!isatty(STDOUT_FILENO)) return 0;
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return 1;
    // Under OpenMPI the terminal is a pseudo-terminal of mpirun's own: the first process up
    // the tree whose stdout is not it (mpirun, or orted on another machine) says where the
    // output goes. A terminal is a character device; anything else (a file, a pipe) is not.
    struct stat mine;
    if (fstat(STDOUT_FILENO, &mine)) return 0;
    long pid = getppid();
    for (int depth = 0; depth < 32 && pid > 1; depth++, pid = parent_of(pid)) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/fd/1", pid);
        struct stat st;
        if (stat(path, &st)) return 0;  // /proc missing or closed to us: no progress line
        if (S_ISCHR(st.st_mode) && st.st_rdev == mine.st_rdev) continue;  // still the same one
        if (!S_ISCHR(st.st_mode)) return 0;
        const int fd = open(path, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) return 0;
        const int tty = isatty(fd);
        close(fd);
        return tty;
    }
    return 0;
}

int dist_sent_by_mpirun(long pid) {
    if (pid <= 1 || !getenv("OMPI_COMM_WORLD_SIZE")) return 0;
    for (long p = getppid(); p > 1; p = parent_of(p))
        if (p == pid) return 1;
    return 0;
}

void dist_finalize(Dist *d) {
#ifdef CNN_MPI
    exchange_free(d);
    free(d->waits);
    d->waits = NULL;
    int started = 0, done = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&done);
    if (started && !done) MPI_Finalize();
#endif
}

void dist_abort(const Dist *d, int code) {
#ifdef CNN_MPI
    if (d->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)d, (void)code;
#endif
}

#ifdef CNN_MPI
// ---- the sum in rank order, in steps ---------------------------------------------------------

// Starts the sum of x[0..n) in slot s (its counts made at the slot's first use; recv from
// the arena when it has room).
static int sum_begin(Dist *d, Sum *s, void *x, size_t n, size_t elem, Error *err) {
    DistExchange *ex = d->exchange;
    const int P = d->size;
    if (n > (size_t)0x7fffffff) return err_set(err, "dist: %zu values are too many for one exchange", n);
    if (!s->counts && !(s->counts = xcalloc(4 * (size_t)P, sizeof *s->counts, err))) return -1;
    *s = (Sum){.x = x, .n = n, .elem = elem, .counts = s->counts};
    int *counts = s->counts, *displs = counts + P, *rcounts = displs + P, *rdispls = rcounts + P;
    for (int r = 0, at = 0; r < P; r++) {
        counts[r] = (int)(n / (size_t)P + ((size_t)r < n % (size_t)P));
        displs[r] = at, at += counts[r];
    }
    const int mine = counts[d->rank];
    for (int r = 0; r < P; r++) rcounts[r] = mine, rdispls[r] = r * mine;
    const size_t bytes = ((size_t)P * (size_t)mine * elem + 63) & ~(size_t)63;
    ex->wanted += bytes;
    if (ex->used + bytes <= ex->arena_bytes) {
        s->recv = ex->arena + ex->used, ex->used += bytes;
    } else if (!(s->recv = malloc(bytes ? bytes : 1))) {
        return err_set(err, "out of memory for the gradient exchange (%zu bytes)", bytes);
    } else {
        s->own_recv = true;
    }
    const MPI_Datatype t = elem == 4 ? MPI_FLOAT : MPI_DOUBLE;
    if (MPI_Ialltoallv(x, counts, displs, t, s->recv, rcounts, rdispls, t, ex->slices, &s->req) !=
        MPI_SUCCESS)
        return err_set(err, "MPI_Ialltoallv failed (the gradient sum's slices)");
    return 0;
}

// Moves s on as far as its messages allow (wait: until it is done); posts its gather only
// where `may_gather`. 0, or -1 with err.
static int sum_advance(Dist *d, Sum *s, bool wait, bool may_gather, Error *err) {
    DistExchange *ex = d->exchange;
    const int P = d->size;
    for (int done = 0; s->phase < 2 && (s->phase == 1 || may_gather);) {
        const int rc = wait ? MPI_Wait(&s->req, MPI_STATUS_IGNORE)
                            : MPI_Test(&s->req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return err_set(err, "%s failed (the gradient sum)", s->phase ? "MPI_Iallgatherv" : "MPI_Ialltoallv");
        if (!wait && !done) return 0;
        if (s->phase++ == 1) break;
        const int *counts = s->counts, *displs = counts + P, mine = counts[d->rank];
        char *out = (char *)s->x + (size_t)displs[d->rank] * s->elem;
        if (s->elem == 4) {
            const float *in = s->recv;
            float *o = (float *)out;
            for (int i = 0; i < mine; i++) {
                float v = in[i];
                for (int q = 1; q < P; q++) v += in[(size_t)q * mine + i];
                o[i] = v;
            }
        } else {
            const double *in = s->recv;
            double *o = (double *)out;
            for (int i = 0; i < mine; i++) {
                double v = in[i];
                for (int q = 1; q < P; q++) v += in[(size_t)q * mine + i];
                o[i] = v;
            }
        }
        const MPI_Datatype t = s->elem == 4 ? MPI_FLOAT : MPI_DOUBLE;
        if (MPI_Iallgatherv(MPI_IN_PLACE, 0, t, s->x, counts, displs, t, ex->gather, &s->req) !=
            MPI_SUCCESS)
            return err_set(err, "MPI_Iallgatherv failed (the gradient sum's gather)");
    }
    if (s->phase == 2 && s->own_recv) free(s->recv), s->own_recv = false;
    return 0;
}

// Advances every started sum (wait: to its end), in order. 0, or -1 with err.
static int sums_advance(Dist *d, bool wait, Error *err) {
    DistExchange *ex = d->exchange;
    bool may_gather = true;
    for (int k = ex->done; k < ex->n; k++) {
        Sum *s = &ex->sums[k];
        if (sum_advance(d, s, wait, may_gather, err)) return -1;
        may_gather = may_gather && s->phase >= 1;
    }
    while (ex->done < ex->n && ex->sums[ex->done].phase == 2) ex->done++;
    return 0;
}

// After a step's sums: the arena grows to what they took, for the next step.
static void sums_reset(DistExchange *ex) {
    if (ex->wanted > ex->arena_bytes) {
        free(ex->arena);
        ex->arena = malloc(ex->wanted);
        ex->arena_bytes = ex->arena ? ex->wanted : 0;
    }
    ex->n = ex->done = 0;
    ex->used = ex->wanted = 0;
}

static void exchange_free(Dist *d) {
    DistExchange *ex = d->exchange;
    if (!ex) return;
    for (int k = 0; k < ex->cap; k++) {  // an error may have left some in flight
        if (ex->sums[k].own_recv) free(ex->sums[k].recv);
        free(ex->sums[k].counts);
    }
    if (ex->one.own_recv) free(ex->one.recv);
    free(ex->one.counts);
    int done = 0;
    MPI_Finalized(&done);
    for (int i = 0; i < 2 && !done; i++) {
        MPI_Comm *c = i ? &ex->gather : &ex->slices;
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
    free(ex->sums);
    free(ex->arena);
    free(ex);
    d->exchange = NULL;
}
#endif

// The sum of n values of elem bytes (4: float, 8: double), timed.
static int sum(Dist *d, void *x, size_t n, size_t elem, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    DistExchange *ex = d->exchange;
    const int rc = sum_begin(d, &ex->one, x, n, elem, err) || sum_advance(d, &ex->one, true, true, err) ? -1 : 0;
    sums_reset(ex);
    const double took = now() - t0;
    d->comm_seconds += took;
    if (elem == sizeof(float) && !rc) note_wait(d, took);
    return rc;
#else
    (void)x, (void)n, (void)elem, (void)err;
    return 0;
#endif
}

int dist_sum_floats(Dist *d, float *x, size_t n, Error *err) { return sum(d, x, n, sizeof *x, err); }
int dist_sum_doubles(Dist *d, double *x, size_t n, Error *err) { return sum(d, x, n, sizeof *x, err); }

int dist_broadcast(Dist *d, void *buf, size_t bytes, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    int rc = 0;
    for (size_t at = 0; at < bytes && !rc; at += 1 << 30) {
        const size_t n = bytes - at < (1u << 30) ? bytes - at : 1u << 30;
        if (MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
            rc = err_set(err, "MPI_Bcast failed");
    }
    d->comm_seconds += now() - t0;
    return rc;
#else
    (void)buf, (void)bytes, (void)err;
    return 0;
#endif
}

int dist_barrier(Dist *d, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    const int rc = MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : err_set(err, "MPI_Barrier failed");
    d->comm_seconds += now() - t0;
    return rc;
#else
    (void)err;
    return 0;
#endif
}

// ---- agreement -----------------------------------------------------------------------------

#ifdef CNN_MPI
enum { DIFF_BYTES = 400 };  // one rank's differences, as the message lists them

// Appends to out (n bytes, NUL-terminated); what does not fit ends in "...".
static void add(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(char *out, size_t n, const char *fmt, ...) {
    const size_t at = strlen(out);
    if (at + 4 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(out + at, n - at, fmt, ap);
    va_end(ap);
    if (w >= 0 && (size_t)w >= n - at) memcpy(out + n - 4, "...", 4);
}

// The line of text ("key = value" lines) whose key is key[0..klen): its value in *value,
// *vlen; false when there is none.
static bool find_key(const char *text, const char *key, size_t klen, const char **value,
                     size_t *vlen) {
    for (const char *l = text; *l;) {
        const char *end = strchr(l, '\n');
        if (!end) end = l + strlen(l);
        const char *eq = strstr(l, " = ");
        if (eq && eq < end && (size_t)(eq - l) == klen && !memcmp(l, key, klen)) {
            *value = eq + 3, *vlen = (size_t)(end - eq - 3);
            return true;
        }
        l = *end ? end + 1 : end;
    }
    return false;
}

// Equal as text, or as numbers ("1" and "1.0").
static bool same_value(const char *a, size_t na, const char *b, size_t nb) {
    if (na == nb && !memcmp(a, b, na)) return true;
    char x[64], y[64], *ex, *ey;
    if (!na || !nb || na >= sizeof x || nb >= sizeof y) return false;
    memcpy(x, a, na), x[na] = 0;
    memcpy(y, b, nb), y[nb] = 0;
    const double u = strtod(x, &ex), v = strtod(y, &ey);
    return !*ex && !*ey && u == v;
}

// The keys of text that other (rank 0's) lacks or gives another value, each as
// "key = value (rank 0: value)", into out; then other's keys that text lacks.
static void diff_keys(const char *text, const char *other, char *out, size_t n) {
    for (const char *l = text; *l;) {
        const char *end = strchr(l, '\n');
        if (!end) end = l + strlen(l);
        const char *eq = strstr(l, " = ");
        if (eq && eq < end) {
            const char *v = eq + 3, *w;
            const size_t klen = (size_t)(eq - l), vlen = (size_t)(end - v);
            size_t wlen;
            if (!find_key(other, l, klen, &w, &wlen))
                add(out, n, "%s%.*s = %.*s (rank 0: not set)", *out ? ", " : "", (int)klen, l,
                    (int)(vlen > 40 ? 40 : vlen), v);
            else if (!same_value(v, vlen, w, wlen))
                add(out, n, "%s%.*s = %.*s (rank 0: %.*s)", *out ? ", " : "", (int)klen, l,
                    (int)(vlen > 40 ? 40 : vlen), v, (int)(wlen > 40 ? 40 : wlen), w);
        }
        l = *end ? end + 1 : end;
    }
    for (const char *l = other; *l;) {
        const char *end = strchr(l, '\n');
        if (!end) end = l + strlen(l);
        const char *eq = strstr(l, " = "), *v;
        size_t vlen;
        if (eq && eq < end && !find_key(text, l, (size_t)(eq - l), &v, &vlen))
            add(out, n, "%s%.*s not set (rank 0: %.*s)", *out ? ", " : "", (int)(eq - l), l,
                (int)(end - eq - 3 > 40 ? 40 : end - eq - 3), eq + 3);
        l = *end ? end + 1 : end;
    }
}
#endif

int dist_agree(Dist *d, const char *mine, const char *per_rank, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    uint64_t len = d->rank == 0 ? strlen(mine) + 1 : 0;
    char *theirs = NULL, *all = NULL, diff[DIFF_BYTES] = "", msg[sizeof err->msg] = "";
    int rc = -1;
    if (MPI_Bcast(&len, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS || len > 1u << 30) {
        err_set(err, "MPI_Bcast failed (the processes' fingerprints)");
        goto done;
    }
    if (!(theirs = d->rank == 0 ? (char *)mine : xcalloc(len, 1, err))) goto done;
    if (MPI_Bcast(theirs, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        err_set(err, "MPI_Bcast failed (the processes' fingerprints)");
        goto done;
    }
    if (d->rank) {
        theirs[len - 1] = 0;
        diff_keys(mine, theirs, diff, sizeof diff);
    }
    if (!(all = xcalloc((size_t)d->size, DIFF_BYTES, err))) goto done;
    if (MPI_Allgather(diff, DIFF_BYTES, MPI_CHAR, all, DIFF_BYTES, MPI_CHAR, MPI_COMM_WORLD) !=
        MPI_SUCCESS) {
        err_set(err, "MPI_Allgather failed (the processes' fingerprints)");
        goto done;
    }
    for (int r = 1; r < d->size; r++)
        if (all[(size_t)r * DIFF_BYTES])
            add(msg, sizeof msg - 200, "%srank %d has %s", *msg ? "; " : "", r,
                all + (size_t)r * DIFF_BYTES);
    rc = 0;
    if (*msg) {
        err_set(err, "the %d processes were not started on the same training: %s. Start every "
                     "process with the same cfg, overrides and data (%s)", d->size, msg, per_rank);
        if (d->rank) err->msg[0] = 0;
        d->all_failed = true;
        rc = -1;
    }
done:
    if (theirs != mine) free(theirs);
    free(all);
    d->comm_seconds += now() - t0;
    return rc;
#else
    (void)mine, (void)per_rank, (void)err;
    return 0;
#endif
}

int dist_any_failed(Dist *d, bool failed, Error *err) {
    if (d->size == 1) return failed ? -1 : 0;
#ifdef CNN_MPI
    int mine = failed, any = 0;
    if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return err_set(err, "MPI_Allreduce failed (whether every process started)");
    if (!any) return 0;
    d->all_failed = true;
    if (failed) return err_wrap(err, "rank %d of %d", d->rank, d->size);
    err->msg[0] = 0;
    return -1;
#else
    (void)err;
    return failed ? -1 : 0;
#endif
}

int dist_sum_start(Dist *d, float *x, size_t n, Error *err) {
    if (d->size == 1 || !n) return 0;
#ifdef CNN_MPI
    DistExchange *ex = d->exchange;
    if (ex->n == ex->cap) {
        const int cap = ex->cap ? 2 * ex->cap : 64;
        Sum *sums = realloc(ex->sums, (size_t)cap * sizeof *sums);
        if (!sums) return err_set(err, "out of memory for the gradient exchange's sums");
        memset(sums + ex->cap, 0, (size_t)(cap - ex->cap) * sizeof *sums);
        ex->sums = sums, ex->cap = cap;
    }
    if (sum_begin(d, &ex->sums[ex->n], x, n, sizeof *x, err)) return -1;
    ex->n++;
    return sums_advance(d, false, err);
#else
    (void)x, (void)err;
    return 0;
#endif
}

int dist_sum_progress(Dist *d, Error *err) {
#ifdef CNN_MPI
    return d->exchange && d->exchange->n ? sums_advance(d, false, err) : 0;
#else
    (void)d, (void)err;
    return 0;
#endif
}

int dist_sums_done(const Dist *d) {
#ifdef CNN_MPI
    return d->exchange ? d->exchange->done : 0;
#else
    (void)d;
    return 0;
#endif
}

int dist_sum_wait(Dist *d, Error *err) {
#ifdef CNN_MPI
    DistExchange *ex = d->exchange;
    if (!ex || !ex->n) return 0;
    const double t0 = now();
    const int rc = sums_advance(d, true, err);
    const double t1 = now();
    d->comm_seconds += t1 - t0;
    note_wait(d, t1 - t0);
    if (!rc) sums_reset(ex);
    return rc;
#else
    (void)d, (void)err;
    return 0;
#endif
}

int dist_exposed(Dist *d, double *seconds, Error *err) {
    *seconds = 0;
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    int n = d->nwaits, least = 0;
    if (MPI_Allreduce(&n, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS ||
        (least && MPI_Allreduce(MPI_IN_PLACE, d->waits, least, MPI_DOUBLE, MPI_MIN,
                                MPI_COMM_WORLD) != MPI_SUCCESS))
        return err_set(err, "MPI_Allreduce failed (the gradient sums' times)");
    for (int i = 0; i < least; i++) *seconds += d->waits[i];
    d->nwaits = 0;
    return 0;
#else
    (void)err;
    return 0;
#endif
}
