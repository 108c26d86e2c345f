// depthwise.c: the depthwise convolution (nn/conv_grouped.c) and batchnorm against this machine's memory
// bandwidth, for `make bench-depthwise`.
//
// A 3x3 depthwise convolution does 9 products for every value it reads or writes, so it is
// bound by memory: its yardstick is the bandwidth, measured here as STREAM does (copy and
// triad over arrays of 128 MB each, far past the caches, on the same threads). Each of
// MobileNetV2's depthwise shapes at batch 32, 224 px, runs through the layer as training
// runs it (forward; backward: the weight gradient, then the input gradient, each thread its
// share of the images), and its compulsory traffic over the time is printed as a fraction
// of the triad's bandwidth: forward reads the input and writes the output; backward reads
// the output gradient and the input and writes the input gradient (what a single pass must
// move; the kernels move more: backward reads the output gradient twice). Weights and
// their gradients are a few KB. Then batchnorm with ReLU6 (nn/batchnorm.c's kernels) on
// MobileNetV2's tensors, as bandwidth-bound: forward's compulsory traffic reads the input
// and writes the output, backward's reads the output gradient and the input and writes the
// input gradient (the kernels read each twice: the sums, then the elementwise pass). Best
// of REPS runs each.
//   build/bench/depthwise [threads]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../nn/exec.h"
#include "../nn/layer.h"

enum { REPS = 8, BATCH = 32 };
#define STREAM_FLOATS ((size_t)32 << 20)  // 128 MB an array

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *xalloc(size_t bytes) {
    void *p = cpu_kernels()->alloc(bytes);
    if (!p) {
        fprintf(stderr, "depthwise: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes);  // touched: no page faults in the timings
    return p;
}

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + seed) % 2001) / 1000.0f - 1.0f;
}

// STREAM's copy (a = b: 8 bytes an element) and triad (a = b + s c: 12 bytes), GB/s.
static void stream(double *copy, double *triad) {
    float *a = xalloc(STREAM_FLOATS * 4), *b = xalloc(STREAM_FLOATS * 4), *c = xalloc(STREAM_FLOATS * 4);
    fill(b, STREAM_FLOATS, 1), fill(c, STREAM_FLOATS, 2);
    const int64_t n = (int64_t)STREAM_FLOATS;
    *copy = *triad = 0;
    for (int r = 0; r < REPS; r++) {
        double t = now();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i];
        t = now() - t;
        if (8.0 * n / t / 1e9 > *copy) *copy = 8.0 * n / t / 1e9;
        t = now();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        t = now() - t;
        if (12.0 * n / t / 1e9 > *triad) *triad = 12.0 * n / t / 1e9;
    }
    free(a), free(b), free(c);
}

typedef struct DwShape {
    int C, H, stride;
} DwShape;

static void run(const DwShape *s, double bandwidth) {
    char text[256];
    snprintf(text, sizeof text, "[conv]\nname = dw\nfilters = %d\nsize = 3\nstride = %d\npad = 1\nbias = 0\ngroups = %d\n",
             s->C, s->stride, s->C);
    Cfg cfg;
    Error err = {{0}};
    Layer *l = NULL;
    if (cfg_parse(&cfg, text, "<bench>", &err) ||
        conv_ops.create(&l, &(LayerArgs){.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = s->C, .h = s->H, .w = s->H}},
                        &err)) {
        fprintf(stderr, "depthwise: %s\n", err.msg);
        exit(1);
    }
    cfg_free(&cfg);
    const Kernels *k = cpu_kernels();
    const size_t nin = (size_t)BATCH * shape_numel(l->in), nout = (size_t)BATCH * shape_numel(l->out);
    const size_t nw = (size_t)tensor_numel(&l->params[0]);
    float *in = xalloc(nin * 4), *out = xalloc(nout * 4), *dout = xalloc(nout * 4), *din = xalloc(nin * 4);
    l->params[0].data = xalloc(nw * 4);
    l->grads[0] = xalloc(nw * 4);
    fill(in, nin, 3), fill(dout, nout, 4), fill(l->params[0].data, nw, 5);
    const size_t ws = layer_workspace_bytes(l, k, BATCH);
    Exec exec = {.precision = DT_F32};
    const LayerCtx ctx = {.k = k, .exec = &exec, .workspace = ws ? xalloc(ws) : NULL, .train = true};
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t = now();
        l->ops->forward(l, &ctx, out, in, BATCH);
        fwd = fmin(fwd, now() - t);
        t = now();
        l->ops->backward(l, &ctx, din, dout, in, out, BATCH);
        bwd = fmin(bwd, now() - t);
    }
    const double fbytes = 4.0 * (nin + nout), bbytes = 4.0 * (2 * nin + nout);
    printf("%4d ch %3dx%-3d stride %d  forward %6.2f ms %6.2f GB/s %4.0f%%   backward %6.2f ms %6.2f GB/s %4.0f%%\n",
           s->C, s->H, s->H, s->stride, fwd * 1e3, fbytes / fwd / 1e9, 100 * fbytes / fwd / 1e9 / bandwidth,
           bwd * 1e3, bbytes / bwd / 1e9, 100 * bbytes / bwd / 1e9 / bandwidth);
    free(in), free(out), free(dout), free(din), free(l->params[0].data), free(l->grads[0]);
    free(ctx.workspace);
    layer_free(l);
}


// Batchnorm (+ ReLU6) as training runs it on one of MobileNetV2's tensors: forward (the
// batch's sums, statistics, the normalisation), backward (the sums, the input gradient).
static void run_bn(int C, int H, double bandwidth) {
    const Kernels *k = cpu_kernels();
    const int64_t rows = (int64_t)BATCH * H * H;
    const size_t n = (size_t)rows * C;
    float *x = xalloc(n * 4), *out = xalloc(n * 4), *dout = xalloc(n * 4), *din = xalloc(n * 4);
    fill(x, n, 3), fill(dout, n, 4);
    float *ch = xalloc(8 * (size_t)C * 4);
    double *acc = xalloc(2 * (size_t)C * 8);
    float *mean = ch, *invstd = ch + C, *gamma = ch + 2 * C, *beta = ch + 3 * C, *rm = ch + 4 * C, *rv = ch + 5 * C;
    for (int c = 0; c < C; c++) gamma[c] = 1.0f, rv[c] = 1.0f;
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t = now();
        memset(acc, 0, 2 * (size_t)C * 8);
        k->bn_sums(acc, x, rows, (int64_t)H * H, C);
        k->bn_batch_stats(mean, invstd, rm, rv, acc, C, rows, 1e-5, 0.1);
        k->bn_forward(out, x, mean, invstd, gamma, beta, rows, C, ACT_RELU6);
        fwd = fmin(fwd, now() - t);
        t = now();
        memset(acc, 0, 2 * (size_t)C * 8);
        k->bn_backward_sums(acc, dout, x, NULL, mean, invstd, gamma, beta, rows, (int64_t)H * H, C, ACT_RELU6);
        k->bn_backward(din, dout, x, NULL, mean, invstd, gamma, beta, acc, rows, C, rows, ACT_RELU6);
        bwd = fmin(bwd, now() - t);
    }
    const double fbytes = 8.0 * n, bbytes = 12.0 * n;
    printf("%4d ch %3dx%-3d           forward %6.2f ms %6.2f GB/s %4.0f%%   backward %6.2f ms %6.2f GB/s %4.0f%%\n",
           C, H, H, fwd * 1e3, fbytes / fwd / 1e9, 100 * fbytes / fwd / 1e9 / bandwidth,
           bwd * 1e3, bbytes / bwd / 1e9, 100 * bbytes / bwd / 1e9 / bandwidth);
    free(x), free(out), free(dout), free(din), free(ch), free(acc);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    cpu_set_threads(threads > 0 ? threads : 2);
    double copy, triad;
    stream(&copy, &triad);
    printf("%s, %d threads: memory bandwidth copy %.2f GB/s, triad %.2f GB/s (the yardstick)\n",
           cpu_kernels_name(), threads, copy, triad);
    printf("depthwise 3x3, batch %d, MobileNetV2's shapes at 224 px (%% of the triad's bandwidth):\n", BATCH);
    static const DwShape shapes[] = {{32, 112, 1}, {144, 56, 1}, {144, 56, 2}, {192, 28, 2}, {576, 14, 1}, {960, 7, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run(&shapes[i], triad);
    printf("batchnorm + ReLU6, batch %d, MobileNetV2's tensors at 224 px:\n", BATCH);
    static const int bn_shapes[][2] = {{32, 112}, {16, 112}, {96, 112}, {144, 56}, {24, 56}, {192, 28}, {576, 14}, {960, 7}};
    for (size_t i = 0; i < sizeof bn_shapes / sizeof bn_shapes[0]; i++) run_bn(bn_shapes[i][0], bn_shapes[i][1], triad);
    return 0;
}
