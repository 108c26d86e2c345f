// fused_step.c: the fused update's cost per training step, measured in one process (issue
// 30, point 1). Two networks of the same cfg (its layer sections), one with the update
// after backward and one with fused_update, train on the same random batches; their steps
// alternate (A B, then B A, ...), so that the machine's load, which swings by tens of
// percent over seconds on a shared machine, falls on both alike. Each step is timed from
// the zeroing (unfused) or the hook's setting (fused) to the end of the update; the
// loader is not in it, so the ratio is of the compute alone. Prints the median and mean
// step of each and the median of the per-pair ratios; at the end the two networks'
// parameters and optimizer state must be equal (exit status 1 if not).
//
//   build/bench/fused_step CFG CHANNELS SIZE BATCH PAIRS [THREADS] [sgd|adadelta|adamw]
//   build/bench/fused_step models/resnet18.cfg 3 224 32 8 2 sgd
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/cfg.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct Hook {
    Net *net;
    const Optimizer *o;
    double lr;
    uint64_t step;
} Hook;

// train.c's hook, without the ranks.
static int ready(void *arg, Layer *m) {
    Hook *h = arg;
    optim_step_module(h->net, h->o, m, h->lr, h->step);
    return 0;
}

// One step of net on the batch in its buffers; its seconds.
static double step(Net *net, const Optimizer *o, int B, uint64_t t) {
    const double t0 = now();
    Hook h = {net, o, o->lr, t};
    if (net->fused_update) net->hook = (GradHook){.ready = ready, .arg = &h};
    else net_zero_grads(net);
    net_forward(net, B, true, 1, t, 0);
    net_loss(net, B, B, true);
    net_backward(net, B, 1, t, 0);
    net->hook = (GradHook){0};
    if (!net->fused_update) optim_step(net, o, NULL, o->lr, t);
    return now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: fused_step CFG CHANNELS SIZE BATCH PAIRS [THREADS] [sgd|adadelta|adamw]\n");
        return 2;
    }
    const int C = atoi(argv[2]), S = atoi(argv[3]), B = atoi(argv[4]), pairs = atoi(argv[5]);
    cpu_set_threads(argc > 6 ? atoi(argv[6]) : 2);
    const char *kind = argc > 7 ? argv[7] : "sgd";
    Optimizer o = {.kind = OPTIM_SGD, .lr = 0.01, .momentum = 0.9};
    if (!strcmp(kind, "adadelta")) o = (Optimizer){.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};
    else if (!strcmp(kind, "adamw"))
        o = (Optimizer){.kind = OPTIM_ADAMW, .lr = 0.001, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                        .weight_decay = 0.01};
    if (C < 1 || S < 1 || B < 1 || pairs < 1) return 2;
    Cfg cfg;
    Error err = {{0}};
    Net net[2];
    if (cfg_load(&cfg, argv[1], &err)) goto fail;
    for (int f = 0; f < 2; f++) {
        NetOptions opt = {.batch = B, .precision = DT_F32, .fused_update = f == 1};
        optim_plan(&o, &opt);
        if (net_create(&net[f], &cfg, (Shape){.c = C, .h = S, .w = S}, 10, &opt, cpu_kernels(), &err) ||
            net_init_params(&net[f], 1, &err))
            goto fail;
    }
    printf("%s, %dx%dx%d, batch %d, %s: gradients and activations %.1f MB unfused, %.1f MB fused "
           "(its gradients in the activation block)\n", argv[1], C, S, S, B, kind,
           (net[0].plan.grads + net[0].plan.activations) / 1e6, (net[1].plan.grads + net[1].plan.activations) / 1e6);
    double *t[2] = {malloc(sizeof(double) * pairs), malloc(sizeof(double) * pairs)};
    double *ratio = malloc(sizeof(double) * pairs), sum[2] = {0, 0};
    if (!t[0] || !t[1] || !ratio) return 1;
    const int64_t nx = (int64_t)B * C * S * S;
    uint64_t r = 12345;
    for (int p = 0; p <= pairs; p++) {  // pair 0 warms up and is not counted
        for (int64_t i = 0; i < nx; i++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            net[0].input_buf[i] = net[1].input_buf[i] = (float)(r >> 40) / 8388608.0f - 1.0f;
        }
        for (int i = 0; i < B; i++) net[0].labels[i] = net[1].labels[i] = (int32_t)((r >> 20) + i) % 10;
        double d[2];
        const int first = p % 2;  // alternate which goes first
        d[first] = step(&net[first], &o, B, (uint64_t)p);
        d[!first] = step(&net[!first], &o, B, (uint64_t)p);
        if (!p) continue;
        for (int f = 0; f < 2; f++) t[f][p - 1] = d[f], sum[f] += d[f];
        ratio[p - 1] = d[1] / d[0];
        printf("  pair %2d: unfused %8.1f ms, fused %8.1f ms, fused/unfused %.3f\n", p, d[0] * 1e3,
               d[1] * 1e3, d[1] / d[0]);
        fflush(stdout);
    }
    printf("median: unfused %.1f ms, fused %.1f ms; mean: unfused %.1f ms, fused %.1f ms; "
           "median of the pairs' fused/unfused: %.3f\n",
           median(t[0], pairs) * 1e3, median(t[1], pairs) * 1e3, sum[0] / pairs * 1e3,
           sum[1] / pairs * 1e3, median(ratio, pairs));
    const size_t ob = (size_t)net[0].nstates * (size_t)net[0].ntrain * sizeof(float);
    const int same = !memcmp(net[0].params, net[1].params, net[0].plan.params) &&
                     (!ob || !memcmp(net[0].optimizer, net[1].optimizer, ob));
    printf("parameters and optimizer state after %d steps: %s\n", pairs + 1, same ? "identical" : "DIFFERENT");
    net_free(&net[0]), net_free(&net[1]);
    cfg_free(&cfg);
    free(t[0]), free(t[1]), free(ratio);
    return same ? 0 : 1;
fail:
    fprintf(stderr, "fused_step: %s\n", err.msg);
    return 1;
}
