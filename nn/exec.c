// exec.c: the executor of exec.h.
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

void exec_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in, Stored out,
                   int N) {
    const LayerOps *ops = l->ops;
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

// ---- sums -----------------------------------------------------------------------------------

void exec_add_act(const LayerCtx *ctx, Stored out, Stored a, Stored b, int64_t values, int N,
                  Activation act) {
    if (!exec_f16(ctx)) {
        ctx->k->add_act(out.p, a.p, b.p, N * values, act);
        return;
    }
    const int chunk = slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        const float *x = view(ctx, a, values, n0, n, 0);
        float *y = view(ctx, b, values, n0, n, 1);
        ctx->k->add_act(y, x, y, n * values, act);
        store(ctx, out.p, y, values, n0, n);
    }
}

void exec_act_backward(const LayerCtx *ctx, Stored dout, Stored out, int64_t values, int N,
                       Activation act) {
    if (act == ACT_NONE) return;
    if (!exec_f16(ctx)) {
        ctx->k->relu_backward(dout.p, dout.p, out.p, N * values);
        return;
    }
    const int chunk = slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        const float *y = view(ctx, out, values, n0, n, 1);
        float *dy = view(ctx, dout, values, n0, n, 2);
        ctx->k->relu_backward(dy, dy, y, n * values);
        store(ctx, dout.p, dy, values, n0, n);
    }
}
