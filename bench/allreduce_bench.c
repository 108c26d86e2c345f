// allreduce_bench.c: the time of the gradient sum (nn/dist.c: reduce-scatter in rank order,
// then allgather) for a given number of floats, over whatever links mpirun gives.
//   mpirun -np 2 build/bench/allreduce_bench 609354 11200000
// Prints, per size, the median of 20 sums after 3 warm-up ones, and the bus bandwidth the
// standard ring model implies: 2 (N - 1) / N x bytes / time. With 2 processes that is what
// each link carries each way while the two send to each other at once.
//   mpirun -np 2 build/bench/allreduce_bench --broadcast 4 1000000
// --broadcast times rank 0's broadcast of the bytes instead (and a barrier after it), and
// prints bytes / time: with 2 processes, one link one way (bench/netns.sh's shaped rate);
// the smallest sizes show its round trips.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/dist.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    Dist d;
    Error err = {{0}};
    if (dist_init(&d, &argc, &argv, &err)) {
        fprintf(stderr, "allreduce_bench: %s\n", err.msg);
        return 1;
    }
    const int broadcast = argc > 1 && !strcmp(argv[1], "--broadcast");
    for (int a = 1 + broadcast; a < argc; a++) {
        const size_t n = strtoull(argv[a], NULL, 10);
        float *x = malloc(n * sizeof *x);
        if (!x) return 1;
        for (size_t i = 0; i < n; i++) x[i] = (float)(i % 97) * 0.01f;
        double t[20];
        for (int r = 0; r < 23; r++) {
            dist_barrier(&d, &err);
            const double t0 = now();
            if (broadcast ? dist_broadcast(&d, x, n * sizeof *x, &err) || dist_barrier(&d, &err)
                          : dist_sum_floats(&d, x, n, &err)) {
                fprintf(stderr, "allreduce_bench: %s\n", err.msg);
                dist_abort(&d, 1);
                return 1;
            }
            if (r >= 3) t[r - 3] = now() - t0;
        }
        qsort(t, 20, sizeof *t, cmp);
        const double med = (t[9] + t[10]) / 2, bytes = (double)n * sizeof *x;
        if (d.rank == 0 && broadcast)
            printf("%d processes, broadcast of %zu floats (%.3f MB): %.3f ms median, %.1f MB/s (%.0f Mbit/s)\n",
                   d.size, n, bytes / 1e6, 1e3 * med, bytes / med / 1e6, 8 * bytes / med / 1e6);
        else if (d.rank == 0)
            printf("%d processes, %zu floats (%.1f MB): %.3f ms median, bus bandwidth %.2f GB/s\n",
                   d.size, n, bytes / 1e6, 1e3 * med,
                   2.0 * (d.size - 1) / d.size * bytes / med / 1e9);
        free(x);
    }
    dist_finalize(&d);
    return 0;
}
