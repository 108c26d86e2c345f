// pingpong.c: how far apart two CPUs are: two threads pinned to CPU a and b (0 and 1 by
// default) pass one cache line back and forth; prints the mean round trip. On the VMs
// here: 70-130 ns most of the time, 360-410 ns when the vCPUs sit far apart, which made
// a 2-thread cnn.c run that shared every kernel's data between the cores 2x slower
// (bench/PROFILE.md, "Where the slow phases came from").
//   build/bench/pingpong [a b]
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROUNDS = 200000 };
static _Alignas(64) atomic_int turn;

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *answer(void *arg) {
    if (pin(*(int *)arg)) return (void *)1;
    for (int i = 0; i < ROUNDS; i++) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&turn, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t t;
    if (pin(a) || pthread_create(&t, NULL, answer, &b)) {
        fprintf(stderr, "pingpong: cannot run threads on CPUs %d and %d\n", a, b);
        return 1;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < ROUNDS; i++) {
        atomic_store_explicit(&turn, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    void *failed;
    pthread_join(t, &failed);
    if (failed) {
        fprintf(stderr, "pingpong: cannot pin a thread to CPU %d\n", b);
        return 1;
    }
    printf("CPUs %d and %d: %.0f ns a cache-line round trip\n", a, b,
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ROUNDS);
    return 0;
}
