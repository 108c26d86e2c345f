// profile.c: the timing kernel table of profile.h.
#include "profile.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// Columns of the table: what the kernels do.
typedef enum ProfKind {
    K_GEMM,
    K_IM2COL,
    K_COL2IM,
    K_WINOGRAD,  // Winograd transforms of inputs, outputs and weights, and their adjoints
    K_DIRECT,    // direct convolution (and grouped or depthwise), forward or backward
    K_BIAS_ACT,  // bias, ReLU (fused or not), their backward
    K_POOL,
    K_NORM,  // batchnorm
    K_DROPOUT,
    K_LAYOUT,  // NHWC <-> NCHW (flatten)
    K_LOSS,    // log_softmax, NLL
    K_FP16,    // conversions and the loss-scale check
    K_INPUT,   // the byte input read as floats (u8_to_f32): the normalisation the loader did before
    K_OPTIM,
    K_MEMORY,  // upload, download, zero, copy
    K_KINDS
} ProfKind;

static const char *const kind_names[K_KINDS] = {"gemm", "im2col", "col2im", "winograd", "direct", "bias+act", "pool", "norm", "dropout",
                                                "layout", "loss", "fp16", "input", "optimizer", "memory"};

static const char *const fixed_names[PROF_FIXED_SCOPES] = {"step (upload, zero)", "loss", "optimizer",
                                                           "loader wait", "idle"};

static struct {
    const Kernels *inner;
    Kernels table;
    const Net *net;
    int nscopes;       // PROF_FIXED_SCOPES + 2 per layer (forward, backward)
    int scope;         // current
    double since;      // when the current scope began
    double *wall;      // (nscopes) seconds in each scope
    double *kernel;    // (nscopes * K_KINDS) seconds in kernels of each kind
    double gemm_flops;  // outside PROF_IDLE
} P;

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void prof_switch(int scope) {
    const double t = prof_now();
    P.wall[P.scope] += t - P.since;
    P.scope = scope, P.since = t;
}

void profile_enter(ProfScope scope) {
    if (P.wall) prof_switch(scope);
}

int profile_scope(void) { return P.wall ? P.scope : -1; }

void profile_return(int scope) {
    if (P.wall && scope >= 0) prof_switch(scope);
}

// Outside training (evaluation runs the same layers) everything stays idle.
void profile_layer(int layer, bool backward) {
    if (P.wall && P.scope != PROF_IDLE) prof_switch(PROF_FIXED_SCOPES + 2 * layer + backward);
}

// Every wrapper runs the inner kernel and charges its time to (scope, kind). A device
// with queues is synchronised so that the time is the kernel's, not its launch's.
// Kernels that a layer's shards (kernels.h) run on several threads at once each charge
// their share, the time over the number of threads, atomically: the kernel times of a
// layer then add up to its wall time.
#define TIMED(kind, call)                                                \
    do {                                                                 \
        const double t0_ = prof_now();                                   \
        call;                                                            \
        if (!P.inner->host_memory) P.inner->sync();                      \
        const double dt_ = (prof_now() - t0_) / omp_get_num_threads();   \
        double *at_ = &P.kernel[P.scope * K_KINDS + (kind)];             \
        _Pragma("omp atomic") *at_ += dt_;                               \
    } while (0)

static void w_upload(void *d, const void *s, size_t b) { TIMED(K_MEMORY, P.inner->upload(d, s, b)); }
static void w_download(void *d, const void *s, size_t b) { TIMED(K_MEMORY, P.inner->download(d, s, b)); }
static void w_zero(void *p, size_t b) { TIMED(K_MEMORY, P.inner->zero(p, b)); }
static void w_copy(void *d, const void *s, size_t b) { TIMED(K_MEMORY, P.inner->copy(d, s, b)); }

static void w_gemm(float *C, const float *A, const float *B, int M, int N, int K, bool ta, bool tb,
                   float alpha, float beta) {
    TIMED(K_GEMM, P.inner->gemm(C, A, B, M, N, K, ta, tb, alpha, beta));
    if (P.scope != PROF_IDLE) P.gemm_flops += 2.0 * M * N * K;
}
static void w_im2col(float *col, const float *in, int N, int H, int W, int C, int K, int stride, int pad,
                     int OH, int OW) {
    TIMED(K_IM2COL, P.inner->im2col(col, in, N, H, W, C, K, stride, pad, OH, OW));
}
static void w_col2im(float *din, const float *col, int N, int H, int W, int C, int K, int stride,
                     int pad, int OH, int OW) {
    TIMED(K_COL2IM, P.inner->col2im(din, col, N, H, W, C, K, stride, pad, OH, OW));
}
// A convolution's GEMMs reading its columns and weight where they lie.
static void w_conv_gemm_forward(float *out, const float *in, const float *w, ConvGeometry g) {
    TIMED(K_GEMM, P.inner->conv_gemm_forward(out, in, w, g));
    if (P.scope != PROF_IDLE) P.gemm_flops += 2.0 * g.N * g.OH * g.OW * g.OC * g.C * g.K * g.K;
}
static void w_conv_gemm_weight_grad(float *dw, const float *dy, const float *in, ConvGeometry g) {
    TIMED(K_GEMM, P.inner->conv_gemm_weight_grad(dw, dy, in, g));
    if (P.scope != PROF_IDLE) P.gemm_flops += 2.0 * g.N * g.OH * g.OW * g.OC * g.C * g.K * g.K;
}
static void w_conv_gemm_data_grad(float *din, const float *dy, const float *w, ConvGeometry g) {
    TIMED(K_GEMM, P.inner->conv_gemm_data_grad(din, dy, w, g));
    if (P.scope != PROF_IDLE) P.gemm_flops += 2.0 * g.N * g.H * g.W * g.C * g.K * g.K * g.OC;
}
static void w_gemm_batched(float *C, const float *A, const float *B, int count, int M, int N, int K,
                           bool ta, bool tb, float alpha, float beta, int64_t sc, int64_t sa,
                           int64_t sb) {
    TIMED(K_GEMM, P.inner->gemm_batched(C, A, B, count, M, N, K, ta, tb, alpha, beta, sc, sa, sb));
    if (P.scope != PROF_IDLE) P.gemm_flops += 2.0 * count * M * N * K;
}
static void w_winograd_input(float *V, const float *in, ConvGeometry g) {
    TIMED(K_WINOGRAD, P.inner->winograd_input(V, in, g));
}
static void w_winograd_input_backward(float *din, const float *dV, ConvGeometry g) {
    TIMED(K_WINOGRAD, P.inner->winograd_input_backward(din, dV, g));
}
static void w_winograd_output(float *out, const float *M, ConvGeometry g) {
    TIMED(K_WINOGRAD, P.inner->winograd_output(out, M, g));
}
static void w_winograd_output_backward(float *dM, const float *dout, ConvGeometry g) {
    TIMED(K_WINOGRAD, P.inner->winograd_output_backward(dM, dout, g));
}
static void w_winograd_weights(float *U, const float *w, int OC, int C) {
    TIMED(K_WINOGRAD, P.inner->winograd_weights(U, w, OC, C));
}
static void w_winograd_weights_backward(float *dw, const float *dU, int OC, int C) {
    TIMED(K_WINOGRAD, P.inner->winograd_weights_backward(dw, dU, OC, C));
}
static void w_conv_direct_forward(float *out, const float *in, const float *w, const float *bias,
                                  ConvGeometry g, Activation act) {
    TIMED(K_DIRECT, P.inner->conv_direct_forward(out, in, w, bias, g, act));
}
static void w_conv_direct_backward(float *din, float *dw, float *dbias, float *partial, const float *dout,
                                   const float *in, const float *out, const float *w, ConvGeometry g,
                                   Activation act) {
    TIMED(K_DIRECT, P.inner->conv_direct_backward(din, dw, dbias, partial, dout, in, out, w, g, act));
}
static void w_conv_grouped_forward(float *out, const float *in, const float *w, const float *bias,
                                   ConvGeometry g, int groups, Activation act) {
    TIMED(K_DIRECT, P.inner->conv_grouped_forward(out, in, w, bias, g, groups, act));
}
static void w_conv_grouped_backward_data(float *din, const float *dy, const float *w, ConvGeometry g,
                                         int groups) {
    TIMED(K_DIRECT, P.inner->conv_grouped_backward_data(din, dy, w, g, groups));
}
static void w_conv_grouped_backward_weight(float *dw, float *scratch, const float *dy, const float *in,
                                           ConvGeometry g, int groups) {
    TIMED(K_DIRECT, P.inner->conv_grouped_backward_weight(dw, scratch, dy, in, g, groups));
}
static void w_bias_act_forward(float *out, const float *bias, int64_t rows, int cols, Activation act) {
    TIMED(K_BIAS_ACT, P.inner->bias_act_forward(out, bias, rows, cols, act));
}
static void w_bias_act_backward(float *dbias, float *dout, const float *y, int64_t rows, int cols,
                                Activation act) {
    TIMED(K_BIAS_ACT, P.inner->bias_act_backward(dbias, dout, y, rows, cols, act));
}
static void w_relu_forward(float *out, const float *in, int64_t n, Activation act) {
    TIMED(K_BIAS_ACT, P.inner->relu_forward(out, in, n, act));
}
static void w_relu_backward(float *din, const float *dout, const float *out, int64_t n, Activation act) {
    TIMED(K_BIAS_ACT, P.inner->relu_backward(din, dout, out, n, act));
}
static void w_add_act(float *out, const float *a, const float *b, int64_t n, Activation act) {
    TIMED(K_BIAS_ACT, P.inner->add_act(out, a, b, n, act));
}
static void w_maxpool_forward(float *out, uint8_t *argmax, const float *in, int N, int H, int W, int C,
                              int K, int stride, int pad, int OH, int OW) {
    TIMED(K_POOL, P.inner->maxpool_forward(out, argmax, in, N, H, W, C, K, stride, pad, OH, OW));
}
static void w_maxpool_backward(float *din, const float *dout, const uint8_t *argmax, int N, int H, int W,
                               int C, int K, int stride, int pad, int OH, int OW) {
    TIMED(K_POOL, P.inner->maxpool_backward(din, dout, argmax, N, H, W, C, K, stride, pad, OH, OW));
}
static void w_avgpool_forward(float *out, const float *in, int N, int H, int W, int C, int K, int stride,
                              int pad, int OH, int OW) {
    TIMED(K_POOL, P.inner->avgpool_forward(out, in, N, H, W, C, K, stride, pad, OH, OW));
}
static void w_avgpool_backward(float *din, const float *dout, int N, int H, int W, int C, int K,
                               int stride, int pad, int OH, int OW) {
    TIMED(K_POOL, P.inner->avgpool_backward(din, dout, N, H, W, C, K, stride, pad, OH, OW));
}
static void w_global_avgpool_forward(float *out, const float *in, int N, int64_t HW, int C) {
    TIMED(K_POOL, P.inner->global_avgpool_forward(out, in, N, HW, C));
}
static void w_global_avgpool_backward(float *din, const float *dout, int N, int64_t HW, int C) {
    TIMED(K_POOL, P.inner->global_avgpool_backward(din, dout, N, HW, C));
}
static void w_bn_sums(double *acc, const float *x, int64_t rows, int64_t sample_rows, int C) {
    TIMED(K_NORM, P.inner->bn_sums(acc, x, rows, sample_rows, C));
}
static void w_bn_batch_stats(float *mean, float *invstd, float *rm, float *rv, const double *acc, int C,
                             int64_t count, double eps, double momentum) {
    TIMED(K_NORM, P.inner->bn_batch_stats(mean, invstd, rm, rv, acc, C, count, eps, momentum));
}
static void w_bn_eval_stats(float *mean, float *invstd, const float *rm, const float *rv, int C,
                            double eps) {
    TIMED(K_NORM, P.inner->bn_eval_stats(mean, invstd, rm, rv, C, eps));
}
static void w_bn_forward(float *out, const float *x, const float *mean, const float *invstd,
                         const float *gamma, const float *beta, int64_t rows, int C, Activation act) {
    TIMED(K_NORM, P.inner->bn_forward(out, x, mean, invstd, gamma, beta, rows, C, act));
}
static void w_bn_backward_sums(double *acc, const float *dout, const float *x, const float *out,
                               const float *mean, const float *invstd, const float *gamma,
                               const float *beta, int64_t rows, int64_t sample_rows, int C, Activation act) {
    TIMED(K_NORM, P.inner->bn_backward_sums(acc, dout, x, out, mean, invstd, gamma, beta, rows, sample_rows, C, act));
}
static void w_bn_backward(float *din, const float *dout, const float *x, const float *out, const float *mean,
                          const float *invstd, const float *gamma, const float *beta, const double *acc,
                          int64_t rows, int C, int64_t count, Activation act) {
    TIMED(K_NORM, P.inner->bn_backward(din, dout, x, out, mean, invstd, gamma, beta, acc, rows, C, count, act));
}
static void w_bn_param_grads(float *dgamma, float *dbeta, const double *acc, int C) {
    TIMED(K_NORM, P.inner->bn_param_grads(dgamma, dbeta, acc, C));
}
static void w_dropout_forward(float *out, const float *in, int64_t n, float p, uint64_t key, uint64_t off) {
    TIMED(K_DROPOUT, P.inner->dropout_forward(out, in, n, p, key, off));
}
static void w_dropout_backward(float *din, const float *dout, int64_t n, float p, uint64_t key,
                               uint64_t off) {
    TIMED(K_DROPOUT, P.inner->dropout_backward(din, dout, n, p, key, off));
}
static void w_nhwc_to_nchw(float *out, const float *in, int N, int H, int W, int C) {
    TIMED(K_LAYOUT, P.inner->nhwc_to_nchw(out, in, N, H, W, C));
}
static void w_nchw_to_nhwc(float *out, const float *in, int N, int H, int W, int C) {
    TIMED(K_LAYOUT, P.inner->nchw_to_nhwc(out, in, N, H, W, C));
}
static void w_log_softmax_forward(float *out, const float *in, int N, int C) {
    TIMED(K_LOSS, P.inner->log_softmax_forward(out, in, N, C));
}
static void w_log_softmax_backward(float *din, const float *dout, const float *out, int N, int C) {
    TIMED(K_LOSS, P.inner->log_softmax_backward(din, dout, out, N, C));
}
static void w_nll_loss(float *dlogp, float *metrics, const float *logp, const int32_t *labels, int N,
                       int C, float scale, float smoothing, const ScalerState *scaler) {
    TIMED(K_LOSS, P.inner->nll_loss(dlogp, metrics, logp, labels, N, C, scale, smoothing, scaler));
}
static void w_f32_to_f16(uint16_t *out, const float *in, int64_t n) {
    TIMED(K_FP16, P.inner->f32_to_f16(out, in, n));
}
static void w_f16_to_f32(float *out, const uint16_t *in, int64_t n) {
    TIMED(K_FP16, P.inner->f16_to_f32(out, in, n));
}
static void w_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
    TIMED(K_FP16, P.inner->f32_to_bf16(out, in, n));
}
static void w_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
    TIMED(K_FP16, P.inner->bf16_to_f32(out, in, n));
}
static void w_u8_to_f32(float *out, const uint8_t *in, int64_t n, int C, const float *lut) {
    TIMED(K_INPUT, P.inner->u8_to_f32(out, in, n, C, lut));
}
static void w_unscale_check(float *g, int64_t n, ScalerState *s) {
    TIMED(K_FP16, P.inner->unscale_check(g, n, s));
}
static void w_scaler_update(ScalerState *s, ScalerRules r) {
    TIMED(K_FP16, P.inner->scaler_update(s, r));
}
static void w_adadelta_step(float *p, float *sq, float *acc, const float *g, int64_t n, float lr,
                            float rho, float eps, float wd, const ScalerState *gate) {
    TIMED(K_OPTIM, P.inner->adadelta_step(p, sq, acc, g, n, lr, rho, eps, wd, gate));
}

static void w_sgd_step(float *p, float *buf, const float *g, int64_t n, float lr, float mom, float omd,
                       float wd, bool nesterov, const ScalerState *gate, uint64_t step) {
    TIMED(K_OPTIM, P.inner->sgd_step(p, buf, g, n, lr, mom, omd, wd, nesterov, gate, step));
}
static void w_adamw_step(float *p, float *m, float *v, const float *g, int64_t n, AdamWHyper h,
                         const ScalerState *gate, uint64_t step) {
    TIMED(K_OPTIM, P.inner->adamw_step(p, m, v, g, n, h, gate, step));
}

int profile_start(Net *net, Error *err) {
    P.inner = net->k;
    P.net = net;
    P.nscopes = PROF_FIXED_SCOPES + 2 * net->nlayers;
    P.wall = xcalloc((size_t)P.nscopes, sizeof *P.wall, err);
    P.kernel = P.wall ? xcalloc((size_t)P.nscopes * K_KINDS, sizeof *P.kernel, err) : NULL;
    if (!P.kernel) {
        free(P.wall);
        P.wall = NULL;
        return -1;
    }
    P.table = *P.inner;  // alloc, release and sync pass through
    P.table.upload = w_upload, P.table.download = w_download, P.table.zero = w_zero;
    P.table.copy = w_copy, P.table.gemm = w_gemm, P.table.im2col = w_im2col;
    P.table.col2im = w_col2im, P.table.bias_act_forward = w_bias_act_forward;
    P.table.gemm_batched = w_gemm_batched;
    if (P.inner->conv_gemm_usable) {
        P.table.conv_gemm_forward = w_conv_gemm_forward;
        P.table.conv_gemm_weight_grad = w_conv_gemm_weight_grad;
        P.table.conv_gemm_data_grad = w_conv_gemm_data_grad;
    }
    P.table.winograd_input = w_winograd_input;
    P.table.winograd_input_backward = w_winograd_input_backward;
    P.table.winograd_output = w_winograd_output;
    P.table.winograd_output_backward = w_winograd_output_backward;
    P.table.winograd_weights = w_winograd_weights;
    P.table.winograd_weights_backward = w_winograd_weights_backward;
    P.table.conv_direct_forward = w_conv_direct_forward;
    P.table.conv_direct_backward = w_conv_direct_backward;
    P.table.conv_grouped_forward = w_conv_grouped_forward;
    P.table.conv_grouped_backward_data = w_conv_grouped_backward_data;
    P.table.conv_grouped_backward_weight = w_conv_grouped_backward_weight;
    P.table.bias_act_backward = w_bias_act_backward;
    P.table.relu_forward = w_relu_forward, P.table.relu_backward = w_relu_backward;
    P.table.add_act = w_add_act;
    P.table.maxpool_forward = w_maxpool_forward, P.table.maxpool_backward = w_maxpool_backward;
    P.table.avgpool_forward = w_avgpool_forward, P.table.avgpool_backward = w_avgpool_backward;
    P.table.global_avgpool_forward = w_global_avgpool_forward;
    P.table.global_avgpool_backward = w_global_avgpool_backward;
    P.table.bn_sums = w_bn_sums, P.table.bn_batch_stats = w_bn_batch_stats;
    P.table.bn_eval_stats = w_bn_eval_stats, P.table.bn_forward = w_bn_forward;
    P.table.bn_backward_sums = w_bn_backward_sums, P.table.bn_backward = w_bn_backward;
    P.table.bn_param_grads = w_bn_param_grads;
    P.table.dropout_forward = w_dropout_forward, P.table.dropout_backward = w_dropout_backward;
    P.table.nhwc_to_nchw = w_nhwc_to_nchw, P.table.nchw_to_nhwc = w_nchw_to_nhwc;
    P.table.log_softmax_forward = w_log_softmax_forward;
    P.table.log_softmax_backward = w_log_softmax_backward, P.table.nll_loss = w_nll_loss;
    P.table.f32_to_f16 = w_f32_to_f16, P.table.f16_to_f32 = w_f16_to_f32;
    P.table.f32_to_bf16 = w_f32_to_bf16, P.table.bf16_to_f32 = w_bf16_to_f32;
    P.table.u8_to_f32 = w_u8_to_f32;
    P.table.unscale_check = w_unscale_check, P.table.scaler_update = w_scaler_update;
    P.table.adadelta_step = w_adadelta_step;
    P.table.sgd_step = w_sgd_step, P.table.adamw_step = w_adamw_step;
    P.scope = PROF_IDLE;
    P.since = prof_now();
    P.gemm_flops = 0;
    net->k = &P.table;
    net->on_layer = profile_layer;
    return 0;
}

void profile_stop(Net *net) {
    if (!P.wall) return;
    net->k = P.inner;
    net->on_layer = NULL;
    free(P.wall), free(P.kernel);
    memset(&P, 0, sizeof P);
}

// A column is as wide as its name, at least 6.
static int kind_width(int k) {
    const int n = (int)strlen(kind_names[k]);
    return n > 6 ? n : 6;
}

static void print_row(FILE *f, const char *name, const double *wall, const double *kernel, double per) {
    double in_kernels = 0;
    fprintf(f, "| %-22s | %7.2f |", name, *wall * per);
    for (int k = 0; k < K_KINDS; k++) {
        in_kernels += kernel[k];
        if (kernel[k] * per < 0.005) fprintf(f, " %*s |", kind_width(k), "");
        else fprintf(f, " %*.2f |", kind_width(k), kernel[k] * per);
    }
    fprintf(f, " %7.2f |\n", (*wall - in_kernels) * per);
}

void profile_print(FILE *f, int64_t steps, int64_t images) {
    if (!P.wall || steps <= 0) return;
    prof_switch(P.scope);  // charge the current scope up to now
    const double per = 1e3 / (double)steps;
    double total = 0, total_k[K_KINDS] = {0};
    for (int s = 0; s < P.nscopes; s++) {
        if (s == PROF_IDLE) continue;
        total += P.wall[s];
        for (int k = 0; k < K_KINDS; k++) total_k[k] += P.kernel[s * K_KINDS + k];
    }
    fprintf(f, "profile: %lld steps, %lld images, %.1f s training (%.0f img/s); milliseconds per "
               "step; GEMM %.1f GFLOP/s\n",
            (long long)steps, (long long)images, total, images / total,
            total_k[K_GEMM] > 0 ? P.gemm_flops / total_k[K_GEMM] / 1e9 : 0.0);
    fprintf(f, "| %-22s | %7s |", "scope", "total");
    for (int k = 0; k < K_KINDS; k++) fprintf(f, " %*s |", kind_width(k), kind_names[k]);
    fprintf(f, " %7s |\n|---|---:|", "outside");
    for (int k = 0; k < K_KINDS; k++) fprintf(f, "---:|");
    fprintf(f, "---:|\n");
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < P.net->nlayers; j++) {
            const int i = pass ? P.net->nlayers - 1 - j : j;  // backward in backward order
            const int s = PROF_FIXED_SCOPES + 2 * i + pass;
            char name[96];
            snprintf(name, sizeof name, "%s %s", P.net->layers[i]->name, pass ? "backward" : "forward");
            print_row(f, name, &P.wall[s], &P.kernel[s * K_KINDS], per);
        }
    for (int s = 0; s < PROF_FIXED_SCOPES; s++)
        if (s != PROF_IDLE) print_row(f, fixed_names[s], &P.wall[s], &P.kernel[s * K_KINDS], per);
    print_row(f, "total", &total, total_k, per);
}
