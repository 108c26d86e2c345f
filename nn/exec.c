// exec.c: the executor of exec.h and the layer_run_* helpers of layer.h.
#include "exec.h"

static bool exec_f16(const LayerCtx *ctx) { return ctx->exec->precision == DT_F16; }

// fp32 view of samples [n0, n0 + n) of a stored activation of `numel` values a sample: in
// place when it is F32, else converted into scratch slot `slot`; NULL for NULL.
static float *view(const LayerCtx *ctx, Stored s, int64_t numel, int n0, int n, int slot) {
    if (!s.p) return NULL;  // not read (LayerOps.backward_reads)
    if (s.f32) return (float *)s.p + n0 * numel;
    float *dst = ctx->exec->scratch[slot];
    ctx->k->f16_to_f32(dst, (const uint16_t *)s.p + n0 * numel, n * numel);
    return dst;
}

// Writes n samples of fp32 `src` as samples [n0, n0 + n) of stored F16 `dst`.
static void store(const LayerCtx *ctx, void *dst, const float *src, int64_t numel, int n0, int n) {
    ctx->k->f32_to_f16((uint16_t *)dst + n0 * numel, src, n * numel);
}

// Samples of `values` each that a scratch slot holds, at least 1, at most N.
static int slot_chunk(const Exec *e, int64_t values, int N) {
    const int64_t fit = e->slot_values / values;
    return fit < 1 ? 1 : fit < N ? (int)fit : N;
}

int exec_chunk(const Exec *e, const Layer *l, int N) {
    if (e->precision != DT_F16) return N;
    const int64_t in = shape_numel(l->in), out = shape_numel(l->out);
    return slot_chunk(e, in > out ? in : out, N);
}

// The length of the chunk that starts at n0, of chunks of `chunk` samples over N.
static int chunk_len(int chunk, int n0, int N) { return N - n0 < chunk ? N - n0 : chunk; }

// The context of the chunk [n0, n0 + n) of a pass over N samples.
static LayerCtx chunk_ctx(const LayerCtx *ctx, int n0, int n, int N) {
    LayerCtx c = *ctx;
    c.sample0 = ctx->sample0 + n0;
    c.n0 = n0;
    c.after_first = n0 > 0;
    c.before_last = n0 + n < N;
    return c;
}

void exec_forward(const LayerCtx *ctx, Layer *l, Stored out, Stored in, int N) {
    const LayerOps *ops = l->ops;
    if (ops->run_forward) {
        ops->run_forward(l, ctx, out.p, in.p, N);
        return;
    }
    const bool reduce = ops->forward_reduce && (!ops->forward_reduces || ops->forward_reduces(l, ctx));
    if (!exec_f16(ctx)) {
        if (reduce) ops->forward_reduce(l, ctx, in.p, 0, N, N);
        ops->forward(l, ctx, out.p, in.p, N);
        return;
    }
    const int64_t nin = shape_numel(l->in), nout = shape_numel(l->out);
    const int chunk = exec_chunk(ctx->exec, l, N);
    if (reduce)
        for (int n0 = 0; n0 < N; n0 += chunk) {
            const int n = chunk_len(chunk, n0, N);
            ops->forward_reduce(l, ctx, view(ctx, in, nin, n0, n, 0), n0, n, N);
        }
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        LayerCtx c = chunk_ctx(ctx, n0, n, N);
        const float *x = view(ctx, in, nin, n0, n, 0);
        float *y = out.f32 ? (float *)out.p + n0 * nout : ctx->exec->scratch[1];
        ops->forward(l, &c, y, x, n);
        if (!out.f32) store(ctx, out.p, y, nout, n0, n);
    }
}

// Layer l's backward is done: a trained module's gradients are complete and its
// parameters read for the last time this step (GradHook).
static void backward_done(const LayerCtx *ctx, Layer *l) {
    GradHook *h = ctx->hook;
    if (!h || h->failed || !layer_trains(l)) return;
    if (h->ready(h->arg, l)) h->failed = true;
}

static void run_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in,
                         Stored out, int N);

void exec_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in, Stored out,
                   int N) {
    run_backward(ctx, l, din, dout, in, out, N);
    backward_done(ctx, l);
}

static void run_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in,
                         Stored out, int N) {
    const LayerOps *ops = l->ops;
    if (ops->run_backward) {
        ops->run_backward(l, ctx, din.p, dout.p, in.p, out.p, N);
        return;
    }
    if (!exec_f16(ctx)) {
        if (ops->backward_reduce) ops->backward_reduce(l, ctx, dout.p, in.p, out.p, 0, N, N);
        ops->backward(l, ctx, din.p, dout.p, in.p, out.p, N);
        return;
    }
    const int64_t nin = shape_numel(l->in), nout = shape_numel(l->out);
    const int chunk = exec_chunk(ctx->exec, l, N);
    if (ops->backward_reduce)
        for (int n0 = 0; n0 < N; n0 += chunk) {
            const int n = chunk_len(chunk, n0, N);
            LayerCtx c = *ctx;
            c.sample0 = ctx->sample0 + n0;
            c.n0 = n0;
            ops->backward_reduce(l, &c, view(ctx, dout, nout, n0, n, 2), view(ctx, in, nin, n0, n, 0),
                                 view(ctx, out, nout, n0, n, 1), n0, n, N);
        }
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        LayerCtx c = chunk_ctx(ctx, n0, n, N);
        const float *x = view(ctx, in, nin, n0, n, 0);
        const float *y = view(ctx, out, nout, n0, n, 1);
        float *dy = view(ctx, dout, nout, n0, n, 2);
        float *dx = din.p ? ctx->exec->scratch[3] : NULL;
        ops->backward(l, &c, dx, dy, x, y, n);
        if (dx) store(ctx, din.p, dx, nin, n0, n);
    }
}

// ---- layer_run_*: containers' children, all stored in the executor's precision -------------

static Stored stored(const LayerCtx *ctx, const void *p) { return (Stored){(void *)p, !exec_f16(ctx)}; }

void layer_run_forward(const LayerCtx *ctx, Layer *l, void *out, const void *in, int N) {
    exec_forward(ctx, l, stored(ctx, out), stored(ctx, in), N);
}

void layer_run_backward(const LayerCtx *ctx, Layer *l, void *din, void *dout, const void *in,
                        const void *out, int N) {
    exec_backward(ctx, l, stored(ctx, din), stored(ctx, dout), stored(ctx, in), stored(ctx, out), N);
}

void layer_run_add_act(const LayerCtx *ctx, void *out, const void *a, const void *b,
                       int64_t values, int N, Activation act) {
    if (!exec_f16(ctx)) {
        ctx->k->add_act(out, a, b, N * values, act);
        return;
    }
    const int chunk = slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        const float *x = view(ctx, stored(ctx, a), values, n0, n, 0);
        float *y = view(ctx, stored(ctx, b), values, n0, n, 1);
        ctx->k->add_act(y, x, y, n * values, act);
        store(ctx, out, y, values, n0, n);
    }
}

void layer_run_act_backward(const LayerCtx *ctx, void *dout, const void *out, int64_t values,
                            int N, Activation act) {
    if (act == ACT_NONE) return;
    if (!exec_f16(ctx)) {
        ctx->k->relu_backward(dout, dout, out, N * values);
        return;
    }
    const int chunk = slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        const float *y = view(ctx, stored(ctx, out), values, n0, n, 1);
        float *dy = view(ctx, stored(ctx, dout), values, n0, n, 2);
        ctx->k->relu_backward(dy, dy, y, n * values);
        store(ctx, dout, dy, values, n0, n);
    }
}

size_t layer_stored_bytes(const LayerCtx *ctx, int64_t n) {
    return (size_t)n * dtype_sizes[ctx->exec->precision];
}
