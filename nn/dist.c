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
#include <pthread.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void exchange_stop(Dist *d);
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
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return err_set(err, "MPI_Init failed");
    d->threaded = provided >= MPI_THREAD_SERIALIZED;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    // A failed call returns its error to the trainer, which says what it was doing, instead
    // of MPI's own text ending every process.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
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
    exchange_stop(d);
    int started = 0, done = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&done);
    if (started && !done) MPI_Finalize();
#endif
    free(d->scratch);
    d->scratch = NULL;
}

void dist_abort(const Dist *d, int code) {
#ifdef CNN_MPI
    if (d->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)d, (void)code;
#endif
}

#ifdef CNN_MPI
static int grow(Dist *d, size_t bytes, Error *err) {
    if (d->scratch_bytes >= bytes) return 0;
    void *p = realloc(d->scratch, bytes);
    if (!p) return err_set(err, "out of memory for the gradient exchange (%zu bytes)", bytes);
    d->scratch = p, d->scratch_bytes = bytes;
    return 0;
}

// Rank r sums slice r (of `size` near-equal slices) of everyone's x in rank order; then
// every rank gathers the summed slices. elem: 4 (float) or 8 (double).
// Waits for request r: in MPI_Wait, or (polled: the exchange thread) testing it every 20 us
// and sleeping between, so that the thread leaves the CPUs to the computation while the
// network works. 0, or -1 when it failed.
static int finish(MPI_Request *r, bool polled) {
    if (!polled) return MPI_Wait(r, MPI_STATUS_IGNORE) == MPI_SUCCESS ? 0 : -1;
    for (;;) {
        int done = 0;
        if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
        if (done) return 0;
        nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    }
}

static int sum_in_order(Dist *d, void *x, size_t n, size_t elem, bool polled, Error *err) {
    const int P = d->size;
    int counts[P], displs[P];
    for (int r = 0, at = 0; r < P; r++) {
        counts[r] = (int)(n / (size_t)P + ((size_t)r < n % (size_t)P));
        displs[r] = at, at += counts[r];
    }
    if (n > (size_t)0x7fffffff) return err_set(err, "dist: %zu values are too many for one exchange", n);
    const int mine = counts[d->rank];
    if (grow(d, (size_t)P * (size_t)(mine ? mine : 1) * elem, err)) return -1;
    // Everyone's slice r goes to rank r: recv[q * mine ...] holds rank q's part.
    int scounts[P], sdispls[P], rcounts[P], rdispls[P];
    for (int r = 0; r < P; r++) {
        scounts[r] = counts[r], sdispls[r] = displs[r];
        rcounts[r] = mine, rdispls[r] = r * mine;
    }
    const MPI_Datatype t = elem == 4 ? MPI_FLOAT : MPI_DOUBLE;
    MPI_Request req;
    if (MPI_Ialltoallv(x, scounts, sdispls, t, d->scratch, rcounts, rdispls, t, MPI_COMM_WORLD,
                       &req) != MPI_SUCCESS ||
        finish(&req, polled))
        return err_set(err, "MPI_Ialltoallv failed (the gradient sum's exchange)");
    char *out = (char *)x + (size_t)displs[d->rank] * elem;
    if (elem == 4) {
        const float *in = d->scratch;
        float *o = (float *)out;
        for (int i = 0; i < mine; i++) {
            float s = in[i];
            for (int q = 1; q < P; q++) s += in[(size_t)q * mine + i];
            o[i] = s;
        }
    } else {
        const double *in = d->scratch;
        double *o = (double *)out;
        for (int i = 0; i < mine; i++) {
            double s = in[i];
            for (int q = 1; q < P; q++) s += in[(size_t)q * mine + i];
            o[i] = s;
        }
    }
    if (MPI_Iallgatherv(MPI_IN_PLACE, 0, t, x, counts, displs, t, MPI_COMM_WORLD, &req) !=
            MPI_SUCCESS ||
        finish(&req, polled))
        return err_set(err, "MPI_Iallgatherv failed (the gradient sum's gather)");
    return 0;
}

// ---- sums during backward: the exchange thread ---------------------------------------------

// One started sum.
typedef struct Span {
    float *x;
    size_t n;
} Span;

// The thread that runs started sums in order (dist_sum_start) while the caller computes.
// It alone calls MPI between dist_sum_start and dist_sum_wait (MPI_THREAD_SERIALIZED).
struct DistExchange {
    Dist *d;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work, idle;  // a span was queued (or quit); the queue ran empty
    Span *queue;                // [head, tail) still to sum; [0, head) summed
    int head, tail, cap;
    bool quit, failed;
    Error err;  // the first failure's
};

static void *exchange_main(void *arg) {
    DistExchange *ex = arg;
    pthread_mutex_lock(&ex->lock);
    for (;;) {
        while (ex->head == ex->tail && !ex->quit) pthread_cond_wait(&ex->work, &ex->lock);
        if (ex->head == ex->tail) break;  // quit, nothing left
        const Span s = ex->queue[ex->head];
        const bool skip = ex->failed;
        pthread_mutex_unlock(&ex->lock);
        Error err = {{0}};
        const double t0 = now();
        const int rc = skip ? 0 : sum_in_order(ex->d, s.x, s.n, sizeof *s.x, true, &err);
        const double took = now() - t0;
        pthread_mutex_lock(&ex->lock);
        ex->d->exchange_seconds += took;
        if (rc && !ex->failed) ex->failed = true, ex->err = err;
        if (++ex->head == ex->tail) pthread_cond_broadcast(&ex->idle);
    }
    pthread_mutex_unlock(&ex->lock);
    return NULL;
}

static void exchange_stop(Dist *d) {
    DistExchange *ex = d->exchange;
    if (!ex) return;
    pthread_mutex_lock(&ex->lock);
    ex->quit = true;
    pthread_cond_signal(&ex->work);
    pthread_mutex_unlock(&ex->lock);
    pthread_join(ex->thread, NULL);
    pthread_mutex_destroy(&ex->lock);
    pthread_cond_destroy(&ex->work);
    pthread_cond_destroy(&ex->idle);
    free(ex->queue);
    free(ex);
    d->exchange = NULL;
}

static DistExchange *exchange_start(Dist *d, Error *err) {
    DistExchange *ex = xcalloc(1, sizeof *ex, err);
    if (!ex) return NULL;
    ex->d = d;
    pthread_mutex_init(&ex->lock, NULL);
    pthread_cond_init(&ex->work, NULL);
    pthread_cond_init(&ex->idle, NULL);
    if (pthread_create(&ex->thread, NULL, exchange_main, ex)) {
        pthread_mutex_destroy(&ex->lock);
        pthread_cond_destroy(&ex->work);
        pthread_cond_destroy(&ex->idle);
        free(ex);
        err_set(err, "cannot start the gradient exchange's thread");
        return NULL;
    }
    return d->exchange = ex;
}
#endif

// The sum of n values of elem bytes (4: float, 8: double), timed.
static int sum(Dist *d, void *x, size_t n, size_t elem, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    const int rc = sum_in_order(d, x, n, elem, false, err);
    d->comm_seconds += now() - t0, d->exchange_seconds += now() - t0;
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
    if (!d->threaded) return dist_sum_floats(d, x, n, err);  // no thread may call MPI: now
    DistExchange *ex = d->exchange ? d->exchange : exchange_start(d, err);
    if (!ex) return -1;
    pthread_mutex_lock(&ex->lock);
    int rc = 0;
    if (ex->tail == ex->cap) {
        const int cap = ex->cap ? 2 * ex->cap : 64;
        Span *q = realloc(ex->queue, (size_t)cap * sizeof *q);
        if (q) ex->queue = q, ex->cap = cap;
        else rc = err_set(err, "out of memory for the gradient exchange's queue");
    }
    if (!rc) {
        ex->queue[ex->tail++] = (Span){x, n};
        pthread_cond_signal(&ex->work);
    }
    pthread_mutex_unlock(&ex->lock);
    return rc;
#else
    (void)x, (void)err;
    return 0;
#endif
}

int dist_sum_wait(Dist *d, Error *err) {
#ifdef CNN_MPI
    DistExchange *ex = d->exchange;
    if (!ex) return 0;
    const double t0 = now();
    pthread_mutex_lock(&ex->lock);
    while (ex->head != ex->tail) pthread_cond_wait(&ex->idle, &ex->lock);
    ex->head = ex->tail = 0;
    const bool failed = ex->failed;
    if (failed) *err = ex->err, ex->failed = false;
    pthread_mutex_unlock(&ex->lock);
    d->comm_seconds += now() - t0;
    return failed ? -1 : 0;
#else
    (void)d, (void)err;
    return 0;
#endif
}
