// dist.c: dist.h over MPI (CNN_MPI, set by the Makefile when mpicc is found), or alone.
#include "dist.h"

#include <fcntl.h>
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
static int sum_in_order(Dist *d, void *x, size_t n, size_t elem, Error *err) {
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
    if (MPI_Alltoallv(x, scounts, sdispls, t, d->scratch, rcounts, rdispls, t, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        return err_set(err, "MPI_Alltoallv failed");
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
    if (MPI_Allgatherv(MPI_IN_PLACE, 0, t, x, counts, displs, t, MPI_COMM_WORLD) != MPI_SUCCESS)
        return err_set(err, "MPI_Allgatherv failed");
    return 0;
}
#endif

// The sum of n values of elem bytes (4: float, 8: double), timed.
static int sum(Dist *d, void *x, size_t n, size_t elem, Error *err) {
    if (d->size == 1) return 0;
#ifdef CNN_MPI
    const double t0 = now();
    const int rc = sum_in_order(d, x, n, elem, err);
    d->comm_seconds += now() - t0;
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
