// dist.h: data-parallel training across processes (DESIGN.md: one function the trainer
// calls). With MPI (builds where mpicc is found, or MPI=1) a run started by mpirun has N
// ranks; without it, or started alone, it is one process and every call below is a no-op.
//
// Every reduction is deterministic: the sum of a vector is reduce-scattered in rank order
// (each rank sums one slice of everyone's contributions, rank 0's first) and all-gathered,
// so all ranks end with the same bytes and two runs with the same N give the same bits,
// whatever order the network delivers messages in.
#ifndef NN_DIST_H
#define NN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct Dist {
    int rank, size;       // this process, of size (1 without MPI)
    double comm_seconds;  // spent in the calls below so far
    void *scratch;        // the reductions' buffer (MPI only)
    size_t scratch_bytes;
} Dist;

// Starts MPI when the build has it (every rank calls it first). Without MPI, a process that
// the environment says was started as one of several ranks (mpirun, srun) is an error that
// says how to get a build with MPI.
int dist_init(Dist *d, int *argc, char ***argv, Error *err);
void dist_finalize(Dist *d);
// Ends every rank at once after an error (MPI_Abort); returns only without MPI.
void dist_abort(const Dist *d, int code);

// Sums x[0..n) across the ranks, in place, deterministically (above).
int dist_sum_floats(Dist *d, float *x, size_t n, Error *err);
int dist_sum_doubles(Dist *d, double *x, size_t n, Error *err);
// Copies rank 0's bytes to every rank.
int dist_broadcast(Dist *d, void *buf, size_t bytes, Error *err);
// Waits for every rank.
int dist_barrier(Dist *d, Error *err);

// Whether this build has MPI.
int dist_available(void);

// Whether what this process writes to stdout reaches a terminal (where a progress line that
// rewrites itself belongs). OpenMPI's mpirun gives every process a pseudo-terminal of its own
// as stdout, whatever mpirun's stdout is, and copies what comes out of it there: under
// mpirun the answer is whether mpirun's stdout is a terminal (read from /proc; no where it
// cannot be read). Slurm's srun gives its tasks pipes.
int dist_stdout_is_terminal(void);
// Whether process pid is the mpirun (or orted) that started this process: OpenMPI turns a
// Ctrl-C or a SIGTERM to mpirun into SIGTERM to every process it started.
int dist_sent_by_mpirun(long pid);

#endif
