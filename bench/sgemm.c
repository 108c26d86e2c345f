// sgemm.c: the sgemm ceiling on this machine, for `make bench`.
//
// Times the GEMMs of one training step of the seed network (batch 64) through the
// project's GEMM (cpu_kernels()->gemm: slabs over OpenMP threads, each on the AVX-512 kernels
// of nn/gemm_avx512.c where the CPU has them, else on single-threaded OpenBLAS)
// and a large square product, and prints GFLOP/s. The step's GEMM FLOPs divided by the
// best rate is the images/s ceiling quoted against the trainer. Where the CPU has
// AVX512-BF16, each shape again with gemm_arith(GEMM_BF16) (nn/gemm_bf16.c: on AMX where
// the CPU has it, and then once more on VDPBF16PS alone) and the ratios to fp32.
//   build/bench/sgemm [threads]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/gemm_bf16.h"
#include "../nn/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct Shape3 {
    const char *what;
    int M, N, K;
    bool ta, tb;
} Shape3;

static double rate(const Shape3 *s, float *A, float *B, float *C) {
    const double flop = 2.0 * s->M * s->N * s->K;
    int reps = (int)(2e9 / flop) + 1;  // about 2 GFLOP a measurement
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        const double t0 = now();
        for (int r = 0; r < reps; r++) cpu_kernels()->gemm(C, A, B, s->M, s->N, s->K, s->ta, s->tb, 1.0f, 0.0f);
        const double g = flop * reps / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    cpu_set_threads(threads);
    // Seed network, batch 64: conv2 forward, its weight gradient and input gradient
    // (im2col chunks of 3 images of 24x24 = 1,728 rows), fc1 forward and gradients.
    const Shape3 shapes[] = {
        {"conv2 forward   (1728x64x288)", 1728, 64, 288, false, true},
        {"conv2 dW        (64x288x1728)", 64, 288, 1728, true, false},
        {"conv2 dcol      (1728x288x64)", 1728, 288, 64, false, false},
        {"fc1 forward     (64x64x9216)", 64, 64, 9216, false, true},
        {"fc1 dW          (64x9216x64)", 64, 9216, 64, true, false},
        {"square          (2048^3)", 2048, 2048, 2048, false, false},
    };
    const size_t max = (size_t)2048 * 2048;  // the largest operand of any shape above
    float *A = malloc(max * sizeof(float)), *B = malloc(max * sizeof(float)), *C = malloc(max * sizeof(float));
    if (!A || !B || !C) return 1;
    for (size_t i = 0; i < max; i++) A[i] = B[i] = (float)(i % 7) * 0.1f, C[i] = 0;
    const bool bf16 = gemm_bf16_available();
    double best = 0, best_bf16 = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const double g = rate(&shapes[i], A, B, C);
        printf("sgemm %-32s %7.1f GFLOP/s", shapes[i].what, g);
        if (g > best) best = g;
        if (bf16) {
            cpu_kernels()->gemm_arith(GEMM_BF16);
            const double h = rate(&shapes[i], A, B, C);
            printf("   bf16 %7.1f GFLOP/s (%.2fx, %s)", h, h / g, gemm_bf16_name());
            if (h > best_bf16) best_bf16 = h;
            if (strcmp(gemm_bf16_name(), "AVX512-BF16") != 0) {
                gemm_bf16_allow_amx(false);
                const double v = rate(&shapes[i], A, B, C);
                gemm_bf16_allow_amx(true);
                printf("   %7.1f (%.2fx, AVX512-BF16)", v, v / g);
            }
            cpu_kernels()->gemm_arith(GEMM_FP32);
        }
        printf("\n");
    }
    printf("{\"sgemm_ceiling_gflops\": %.1f, ", best);
    if (bf16) printf("\"bf16_ceiling_gflops\": %.1f, \"bf16\": \"%s\", ", best_bf16, gemm_bf16_name());
    printf("\"threads\": %d, \"gemm\": \"%s\"}\n", threads, cpu_kernels_name());
    free(A), free(B), free(C);
    return 0;
}
