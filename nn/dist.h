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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef struct DistExchange DistExchange;

typedef struct Dist {
    int rank, size;       // this process, of size (1 without MPI)
    double comm_seconds;  // spent in the calls below so far, waiting (dist_sum_wait's: only
                          // the wait for sums that ran while the caller computed)
    double *waits;            // each gradient sum's time waited for since dist_exposed: a
    int nwaits, cap_waits;    // blocking sum's, or dist_sum_wait's for a step's started ones
    DistExchange *exchange;   // the sums in progress and their buffers (MPI only)
    bool all_failed;      // every process stops (dist_agree, dist_any_failed), each one
                          // printing its err if not empty: end them normally, without
                          // dist_abort
} Dist;

// Starts MPI when the build has it (every rank calls it first). Without MPI, a process that
// the environment says was started as one of several ranks (mpirun, srun) is an error that
// says how to get a build with MPI.
int dist_init(Dist *d, int *argc, char ***argv, Error *err);
void dist_finalize(Dist *d);
// Ends every rank at once after an error (MPI_Abort); returns only without MPI.
void dist_abort(const Dist *d, int code);

// Sums x[0..n) across the ranks, in place, deterministically (above). The float sums are
// the gradients' (dist_exposed counts them).
int dist_sum_floats(Dist *d, float *x, size_t n, Error *err);
int dist_sum_doubles(Dist *d, double *x, size_t n, Error *err);
// Sums during backward (DistributedDataParallel's buckets): dist_sum_start starts the sum
// of x[0..n) as dist_sum_floats sums it (to the same bits) with nonblocking MPI, the
// network moving it while the caller computes; dist_sum_progress, called now and then
// (after each layer's backward), moves the started sums on (MPI progresses only inside its
// calls); dist_sum_wait waits until every started sum is done. In between the caller
// neither touches a started x nor calls another dist function. Every rank starts the same
// sums in the same order.
int dist_sum_start(Dist *d, float *x, size_t n, Error *err);
int dist_sum_progress(Dist *d, Error *err);
// How many of the sums started since the last dist_sum_wait are done (they end in the
// order started).
int dist_sums_done(const Dist *d);
int dist_sum_wait(Dist *d, Error *err);
// What the gradient sums since the last call cost the steps: each sum's time waited for as
// the last process to reach it saw it (the least over the processes, sum by sum: the
// network's part, without the waits for a slower process), summed. Every process calls it
// at the same point, after the same sums.
int dist_exposed(Dist *d, double *seconds, Error *err);
// Copies rank 0's bytes to every rank.
int dist_broadcast(Dist *d, void *buf, size_t bytes, Error *err);
// Whether every process runs the same training. `mine` is this process's fingerprint: lines
// "key = value" of what must agree (keys unique). Rank 0's is sent to every rank, which
// names the keys where its own differs (values equal as text or as numbers agree); every
// rank learns every other's differences. 0 when all agree; otherwise -1 on every rank with
// d->all_failed set, and on rank 0 err naming each differing rank and key with both values
// (then `per_rank`, what may differ between processes, as the advice; the others' err empty).
int dist_agree(Dist *d, const char *mine, const char *per_rank, Error *err);
// Whether any process failed, at a point every process reaches (reading its cfg, opening
// its data): 0 when none did; otherwise -1 on every rank with d->all_failed set, err on a
// rank that failed prefixed with its rank, on the others emptied.
int dist_any_failed(Dist *d, bool failed, Error *err);
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
