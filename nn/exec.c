// exec.c: the executor of exec.h.
#include "exec.h"

#include <time.h>

#include "cost.h"

static bool exec_half(const LayerCtx *ctx) { return precision_is_half(ctx->exec->precision); }

// The executor's halves (IEEE binary16 in F16, bfloat16 in BF16) to fp32, and back.
static void halves_to_f32(const LayerCtx *ctx, float *dst, const uint16_t *src, int64_t n) {
    if (ctx->exec->precision == DT_BF16) ctx->k->bf16_to_f32(dst, src, n);
    else ctx->k->f16_to_f32(dst, src, n);
}
static void f32_to_halves(const LayerCtx *ctx, uint16_t *dst, const float *src, int64_t n) {
    if (ctx->exec->precision == DT_BF16) ctx->k->f32_to_bf16(dst, src, n);
    else ctx->k->f32_to_f16(dst, src, n);
}

// Samples [n0, n0 + n) of s.via's output (`numel` values a sample, as many as its input
// has) into dst: its input converted into scratch slot 3 (free while inputs are viewed: it
// takes a backward's input gradient only after), via's forward, then rounded to halves and
// back through slot 3, the values a stored output would give.
static void view_via(const LayerCtx *ctx, Stored s, int64_t numel, int n0, int n, float *dst) {
    float *tmp = ctx->exec->scratch[3];
    halves_to_f32(ctx, tmp, (const uint16_t *)s.p + n0 * numel, n * numel);
    LayerCtx c = *ctx;
    c.sample0 = ctx->sample0 + n0;
    c.n0 = n0;
    s.via->ops->forward(s.via, &c, dst, tmp, n);
    f32_to_halves(ctx, (uint16_t *)tmp, dst, n * numel);
    halves_to_f32(ctx, dst, (const uint16_t *)tmp, n * numel);
}

// fp32 view of samples [n0, n0 + n) of a stored activation of `numel` values a sample: in
// place when it is F32, else converted into scratch slot `slot` (0 to 2; a byte input in
// F32 precision: into Exec.input_f32); NULL for NULL.
static float *view(const LayerCtx *ctx, Stored s, int64_t numel, int n0, int n, int slot) {
    if (!s.p) return NULL;  // not read (LayerOps.backward_reads)
    const Exec *e = ctx->exec;
    switch (s.kind) {
    case STORED_F32: return (float *)s.p + n0 * numel;
    case STORED_HALF: {
        float *dst = e->scratch[slot];
        if (s.via) view_via(ctx, s, numel, n0, n, dst);
        else halves_to_f32(ctx, dst, (const uint16_t *)s.p + n0 * numel, n * numel);
        return dst;
    }
    case STORED_U8: {
        float *dst = exec_half(ctx) ? e->scratch[slot] : e->input_f32;
        ctx->k->u8_to_f32(dst, (const uint8_t *)s.p + n0 * numel, n * numel, e->input_c, e->lut);
        return dst;
    }
    case STORED_PACKED:
        ctx->k->act_unpack(e->scratch[slot], (const char *)s.p + n0 * act_sample_bytes(numel, e->pack_bits),
                           numel, n, e->pack_bits);
        return e->scratch[slot];
    }
    return NULL;
}

// Writes n samples of fp32 `src` as samples [n0, n0 + n) of stored halves `dst`.
static void store(const LayerCtx *ctx, void *dst, const float *src, int64_t numel, int n0, int n) {
    f32_to_halves(ctx, (uint16_t *)dst + n0 * numel, src, n * numel);
}

// Samples of `values` each that a scratch slot holds, at least 1, at most N.
static int slot_chunk(const Exec *e, int64_t values, int N) {
    const int64_t fit = e->slot_values / values;
    return fit < 1 ? 1 : fit < N ? (int)fit : N;
}

// Samples of the larger of l's input and output that a scratch slot holds (slot_chunk's).
static int layer_slot_chunk(const Exec *e, const Layer *l, int N) {
    const int64_t in = shape_numel(l->in), out = shape_numel(l->out);
    return slot_chunk(e, in > out ? in : out, N);
}

int exec_chunk(const Exec *e, const Layer *l, int N) {
    return precision_is_half(e->precision) ? layer_slot_chunk(e, l, N) : N;
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

// A clock for the probe (Exec.costs): the device's queued work done first.
static double exec_clock(const LayerCtx *ctx) {
    if (ctx->k->sync) ctx->k->sync();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// When the probe times the step, the seconds since t0 go to layer l's calls of `kind`.
static void exec_charge(const LayerCtx *ctx, const Layer *l, CallKind kind, int n, double t0) {
    if (ctx->exec->costs) cost_record(ctx->exec->costs, l, kind, n, exec_clock(ctx) - t0);
}

static double exec_start(const LayerCtx *ctx) { return ctx->exec->costs ? exec_clock(ctx) : 0; }

// Samples per call of l's pass over N with input `in` and output `out`: as many as a
// scratch slot holds of the larger of them in F16, where one is compressed or where the
// results go through the scratch (`apart`: a handoff, an added input gradient)
// (exec_chunk's), else N; in F32 at most the byte input's chunk (Exec.input_chunk).
static int pass_chunk(const LayerCtx *ctx, const Layer *l, Stored in, Stored out, int N, bool apart) {
    const bool through_scratch = exec_half(ctx) || apart || in.kind == STORED_PACKED || out.kind == STORED_PACKED;
    int chunk = through_scratch ? layer_slot_chunk(ctx->exec, l, N) : N;
    if (!exec_half(ctx) && in.kind == STORED_U8 && ctx->exec->input_chunk < chunk) chunk = ctx->exec->input_chunk;
    return chunk;
}

// The batch pass of forward (reduce) and the forward itself. In F32 a pass that one call
// takes runs in place (a byte input expanded whole into Exec.input_f32); otherwise the
// passes run over chunks, each one's input viewed in fp32 and its results stored back
// where they are not F32, or copied from the scratch where the output takes the input's
// bytes (`over`; F32's batch pass then reads the input whole, as one call does).
static void forward_passes(const LayerCtx *ctx, Layer *l, Stored out, Stored in, int N, bool reduce) {
    const LayerOps *ops = l->ops;
    const int64_t nin = shape_numel(l->in), nout = shape_numel(l->out);
    const bool over = out.p == in.p;
    const int chunk = pass_chunk(ctx, l, in, out, N, over);
    double t0 = exec_start(ctx);
    if (!exec_half(ctx) && chunk >= N && !over) {
        const float *x = view(ctx, in, nin, 0, N, 0);
        if (reduce) {
            ops->forward_reduce(l, ctx, x, 0, N, N);
            exec_charge(ctx, l, CALL_FORWARD_REDUCE, N, t0);
            t0 = exec_start(ctx);
        }
        ops->forward(l, ctx, out.p, x, N);
        exec_charge(ctx, l, CALL_FORWARD, N, t0);
        return;
    }
    if (reduce) {
        const int rchunk = in.kind == STORED_F32 ? N : chunk;
        for (int n0 = 0; n0 < N; n0 += rchunk) {
            const int n = chunk_len(rchunk, n0, N);
            ops->forward_reduce(l, ctx, view(ctx, in, nin, n0, n, 0), n0, n, N);
        }
        exec_charge(ctx, l, CALL_FORWARD_REDUCE, N, t0);
        t0 = exec_start(ctx);
    }
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        LayerCtx c = chunk_ctx(ctx, n0, n, N);
        const float *x = view(ctx, in, nin, n0, n, 0);
        float *y = out.kind == STORED_F32 && !over ? (float *)out.p + n0 * nout : ctx->exec->scratch[1];
        ops->forward(l, &c, y, x, n);
        if (out.kind != STORED_F32) store(ctx, out.p, y, nout, n0, n);
        else if (over) ctx->k->copy((float *)out.p + n0 * nout, y, (size_t)n * nout * sizeof(float));
    }
    exec_charge(ctx, l, CALL_FORWARD, N, t0);
}

void exec_forward_stats(const LayerCtx *ctx, Layer *l, Stored in, int N) {
    const LayerOps *ops = l->ops;
    if (!ops->forward_reduce || (ops->forward_reduces && !ops->forward_reduces(l, ctx))) return;
    const int64_t nin = shape_numel(l->in);
    const int chunk = pass_chunk(ctx, l, in, in, N, false);
    const double t0 = exec_start(ctx);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        ops->forward_reduce(l, ctx, view(ctx, in, nin, n0, n, 0), n0, n, N);
    }
    exec_charge(ctx, l, CALL_FORWARD_REDUCE, N, t0);
}

void exec_forward(const LayerCtx *ctx, Layer *l, Stored out, Stored in, int N) {
    const LayerOps *ops = l->ops;
    const bool reduce = ops->forward_reduce && (!ops->forward_reduces || ops->forward_reduces(l, ctx));
    forward_passes(ctx, l, out, in, N, reduce);
}

// Adds the n samples of fp32 `dx` (rounded to halves first where din holds halves) to
// samples [n0, n0 + n) of din; `tmp`: a free scratch slot.
static void add_din(const LayerCtx *ctx, Stored din, float *dx, int64_t numel, int n0, int n, float *tmp) {
    if (din.kind == STORED_F32) {
        float *d = (float *)din.p + n0 * numel;
        ctx->k->add_act(d, d, dx, n * numel, ACT_NONE);
        return;
    }
    f32_to_halves(ctx, (uint16_t *)tmp, dx, n * numel);
    halves_to_f32(ctx, dx, (const uint16_t *)tmp, n * numel);
    halves_to_f32(ctx, tmp, (const uint16_t *)din.p + n0 * numel, n * numel);
    ctx->k->add_act(dx, tmp, dx, n * numel, ACT_NONE);
    store(ctx, din.p, dx, numel, n0, n);
}

void exec_backward(const LayerCtx *ctx, Layer *l, Stored din, Stored dout, Stored in, Stored out,
                   int N, DinMode mode) {
    const LayerOps *ops = l->ops;
    const int64_t nin = shape_numel(l->in), nout = shape_numel(l->out);
    const bool apart = din.p && mode != DIN_WRITE;  // din's chunks through the scratch
    const int chunk = pass_chunk(ctx, l, in, out, N, apart);
    double t0 = exec_start(ctx);
    if (!exec_half(ctx) && chunk >= N && !apart) {  // F32 in one call (a compressed one read whole)
        const float *x = view(ctx, in, nin, 0, N, 0), *y = view(ctx, out, nout, 0, N, 1);
        if (ops->backward_reduce) {
            ops->backward_reduce(l, ctx, dout.p, x, y, 0, N, N);
            exec_charge(ctx, l, CALL_BACKWARD_REDUCE, N, t0);
            t0 = exec_start(ctx);
        }
        ops->backward(l, ctx, din.p, dout.p, x, y, N);
        exec_charge(ctx, l, CALL_BACKWARD, N, t0);
        return;
    }
    if (ops->backward_reduce) {
        for (int n0 = 0; n0 < N; n0 += chunk) {
            const int n = chunk_len(chunk, n0, N);
            LayerCtx c = *ctx;
            c.sample0 = ctx->sample0 + n0;
            c.n0 = n0;
            ops->backward_reduce(l, &c, view(ctx, dout, nout, n0, n, 2), view(ctx, in, nin, n0, n, 0),
                                 view(ctx, out, nout, n0, n, 1), n0, n, N);
        }
        exec_charge(ctx, l, CALL_BACKWARD_REDUCE, N, t0);
        t0 = exec_start(ctx);
    }
    // din's chunk: in place in F32 but apart; else in the last slot (F32's slot 2 is free:
    // its output gradient is read where it is).
    float *const slot = ctx->exec->scratch[exec_half(ctx) ? 3 : 2];
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        LayerCtx c = chunk_ctx(ctx, n0, n, N);
        const float *x = view(ctx, in, nin, n0, n, 0);
        const float *y = view(ctx, out, nout, n0, n, 1);
        float *dy = view(ctx, dout, nout, n0, n, 2);
        float *dx = !din.p ? NULL : din.kind == STORED_F32 && !apart ? (float *)din.p + n0 * nin : slot;
        ops->backward(l, &c, dx, dy, x, y, n);
        if (!dx) continue;
        if (mode == DIN_ADD) add_din(ctx, din, dx, nin, n0, n, ctx->exec->scratch[exec_half(ctx) ? 2 : 1]);
        else if (din.kind != STORED_F32) store(ctx, din.p, dx, nin, n0, n);
        else if (apart) ctx->k->copy((float *)din.p + n0 * nin, dx, (size_t)n * nin * sizeof(float));
    }
    exec_charge(ctx, l, CALL_BACKWARD, N, t0);
}

// ---- sums -----------------------------------------------------------------------------------

void exec_add_act(const LayerCtx *ctx, Stored out, Stored a, Stored b, int64_t values, int N,
                  Activation act) {
    if (!exec_half(ctx)) {
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
    if (!exec_half(ctx) && out.kind != STORED_PACKED) {
        ctx->k->relu_backward(dout.p, dout.p, out.p, N * values, act);
        return;
    }
    const int chunk = slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        const float *y = view(ctx, out, values, n0, n, 1);
        float *dy = view(ctx, dout, values, n0, n, 2);
        ctx->k->relu_backward(dy, dy, y, n * values, act);
        if (dout.kind != STORED_F32) store(ctx, dout.p, dy, values, n0, n);
    }
}

void exec_pack(const LayerCtx *ctx, void *dst, Stored src, int64_t values, int N, uint64_t key) {
    const int bits = ctx->exec->pack_bits;
    const int chunk = src.kind == STORED_F32 ? N : slot_chunk(ctx->exec, values, N);
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int n = chunk_len(chunk, n0, N);
        ctx->k->act_pack((char *)dst + n0 * act_sample_bytes(values, bits), view(ctx, src, values, n0, n, 0),
                         values, n, bits, key, ctx->sample0 + n0);
    }
}

// ---- sweeps ----------------------------------------------------------------------------------

// The scratch of a sweep, a chunk's worth: each member's output (fp32), the inner
// activations of those that keep some (max pooling's argmax), two gradients, the chain's
// input in fp32 (where it is stored otherwise), and halves for rounding as the network
// stores.
typedef struct SweepSpace {
    float *out[NODE_CHAIN_MAX];
    void *inner[NODE_CHAIN_MAX];
    float *grad[2], *in;
    uint16_t *half;
} SweepSpace;

static int64_t sweep_largest(const Sweep *s) {
    int64_t m = shape_numel(s->m[0]->in);
    for (int i = 0; i < s->nm; i++)
        if (shape_numel(s->m[i]->out) > m) m = shape_numel(s->m[i]->out);
    return m;
}

static size_t align64_bytes(size_t n) { return (n + 63) & ~(size_t)63; }

// The layout of s's scratch at base (NULL: the bytes only), into *sp; returns the bytes.
static size_t sweep_space(const Exec *e, const Sweep *s, void *base, SweepSpace *sp) {
    const size_t C = (size_t)s->chunk, big = (size_t)sweep_largest(s);
    size_t off = 0;
    char *b = base;
#define TAKE(bytes) (off += align64_bytes(bytes), b ? (void *)(b + off - align64_bytes(bytes)) : NULL)
    for (int i = 0; i < s->nm; i++) {
        const Layer *l = s->m[i];
        sp->out[i] = TAKE(C * (size_t)shape_numel(l->out) * sizeof(float));
        sp->inner[i] = l->ops->inner_bytes ? TAKE(C * l->ops->inner_bytes(l, DT_F32)) : NULL;
    }
    sp->grad[0] = TAKE(C * big * sizeof(float));
    sp->grad[1] = TAKE(C * big * sizeof(float));
    sp->in = precision_is_half(e->precision) || s->bytes_in ? TAKE(C * (size_t)shape_numel(s->m[0]->in) * sizeof(float)) : NULL;
    sp->half = precision_is_half(e->precision) ? TAKE(C * big * sizeof(uint16_t)) : NULL;
#undef TAKE
    return off;
}

size_t exec_sweep_bytes(const Exec *e, const Sweep *s) {
    SweepSpace sp;
    return sweep_space(e, s, NULL, &sp);
}

// In F16 and BF16 runs the network stores what passes between two layers as halves: the sweep
// rounds it the same way, so its members compute on the values they would see unswept.
static void sweep_round(const LayerCtx *ctx, const SweepSpace *sp, float *x, int64_t n) {
    if (!exec_half(ctx)) return;
    f32_to_halves(ctx, sp->half, x, n);
    halves_to_f32(ctx, x, sp->half, n);
}

// The context of member l's call on the chunk [n0, n0 + n) of a pass over N samples: a
// member that keeps inner activations keeps the chunk's alone, at the start of its slot.
static LayerCtx sweep_ctx(const LayerCtx *ctx, Layer *l, const SweepSpace *sp, int i, int n0, int n,
                          int N) {
    LayerCtx c = chunk_ctx(ctx, n0, n, N);
    if (sp->inner[i]) {
        l->inner = sp->inner[i];
        c.n0 = 0;
    }
    return c;
}

// The chain's input for the chunk, as fp32.
static const float *sweep_input(const LayerCtx *ctx, const Sweep *s, const SweepSpace *sp, Stored in,
                                int n0, int n) {
    const int64_t numel = shape_numel(s->m[0]->in);
    switch (in.kind) {
    case STORED_F32: return (const float *)in.p + n0 * numel;
    case STORED_HALF: halves_to_f32(ctx, sp->in, (const uint16_t *)in.p + n0 * numel, n * numel); break;
    case STORED_U8:
        ctx->k->u8_to_f32(sp->in, (const uint8_t *)in.p + n0 * numel, n * numel, ctx->exec->input_c,
                          ctx->exec->lut);
        break;
    case STORED_PACKED: assert(!"a sweep's input is never compressed (net.c, packed_node)"); break;
    }
    return sp->in;
}

// Members 0 .. upto forward on the chunk into their output slots (rounded as stored).
static void sweep_run(const LayerCtx *ctx, const Sweep *s, const SweepSpace *sp, const float *x, int upto,
                      int n0, int n, int N) {
    for (int i = 0; i <= upto; i++) {
        Layer *l = s->m[i];
        const LayerCtx c = sweep_ctx(ctx, l, sp, i, n0, n, N);
        const double t0 = exec_start(ctx);
        l->ops->forward(l, &c, sp->out[i], x, n);
        exec_charge(ctx, l, CALL_FORWARD, n, t0);
        if (i < s->nm - 1) sweep_round(ctx, sp, sp->out[i], n * shape_numel(l->out));
        x = sp->out[i];
    }
}

void exec_sweep_forward(const LayerCtx *ctx, const Sweep *s, Stored out, Stored in, int N) {
    SweepSpace sp;
    sweep_space(ctx->exec, s, s->scratch, &sp);
    // Each member's batch pass, with the members before it run chunk by chunk for its input.
    for (int q = 0; q < s->nm; q++) {
        Layer *l = s->m[q];
        const LayerOps *ops = l->ops;
        if (!ops->forward_reduce || (ops->forward_reduces && !ops->forward_reduces(l, ctx))) continue;
        for (int n0 = 0; n0 < N; n0 += s->chunk) {
            const int n = chunk_len(s->chunk, n0, N);
            const float *x = sweep_input(ctx, s, &sp, in, n0, n);
            sweep_run(ctx, s, &sp, x, q - 1, n0, n, N);
            const LayerCtx c = sweep_ctx(ctx, l, &sp, q, n0, n, N);
            const double t0 = exec_start(ctx);
            ops->forward_reduce(l, &c, q ? sp.out[q - 1] : x, n0, n, N);
            exec_charge(ctx, l, CALL_FORWARD_REDUCE, n, t0);
        }
    }
    const int last = s->nm - 1;
    const int64_t nout = shape_numel(s->m[last]->out);
    for (int n0 = 0; n0 < N; n0 += s->chunk) {
        const int n = chunk_len(s->chunk, n0, N);
        sweep_run(ctx, s, &sp, sweep_input(ctx, s, &sp, in, n0, n), last, n0, n, N);
        if (out.kind == STORED_F32) ctx->k->copy((float *)out.p + n0 * nout, sp.out[last], (size_t)n * nout * sizeof(float));
        else store(ctx, out.p, sp.out[last], nout, n0, n);
    }
}

// The last member whose output backward needs on a chunk: one whose backward reads its
// output or its inner activations, or whose successor's backward reads its input.
static int sweep_needed(const Sweep *s) {
    int upto = -1;
    for (int i = 0; i < s->nm; i++) {
        const Layer *l = s->m[i];
        const unsigned reads = layer_backward_reads(l);
        if ((reads & BACKWARD_READS_OUT) || l->ops->inner_bytes) upto = i;
        if (i > 0 && (reads & BACKWARD_READS_IN) && upto < i - 1) upto = i - 1;
    }
    return upto;
}

void exec_sweep_backward(const LayerCtx *ctx, const Sweep *s, Stored din, Stored dout, Stored in,
                         int N) {
    SweepSpace sp;
    sweep_space(ctx->exec, s, s->scratch, &sp);
    LayerCtx redo = *ctx;  // the forward again, as the first one ran it
    redo.recompute = true;
    const int last = s->nm - 1, upto = sweep_needed(s);
    const int64_t nout = shape_numel(s->m[last]->out), nin = shape_numel(s->m[0]->in);
    // Each member's batch pass (from the last), then the pass that writes din: on each
    // chunk the members' forward where backward reads it, then their backward from the
    // chain's output gradient down to the member.
    for (int q = last; q >= -1; q--) {
        if (q >= 0 && !s->m[q]->ops->backward_reduce) continue;
        for (int n0 = 0; n0 < N; n0 += s->chunk) {
            const int n = chunk_len(s->chunk, n0, N);
            const float *x = sweep_input(ctx, s, &sp, in, n0, n);
            sweep_run(&redo, s, &sp, x, upto, n0, n, N);
            // The chain's output gradient, copied: a backward may scale it in place.
            float *g = sp.grad[0];
            if (dout.kind == STORED_F32) ctx->k->copy(g, (const float *)dout.p + n0 * nout, (size_t)n * nout * sizeof(float));
            else halves_to_f32(ctx, g, (const uint16_t *)dout.p + n0 * nout, n * nout);
            for (int i = last; i > q; i--) {
                Layer *l = s->m[i];
                const LayerCtx c = sweep_ctx(ctx, l, &sp, i, n0, n, N);
                const float *xi = i ? sp.out[i - 1] : x;
                const double t0 = exec_start(ctx);
                if (i == 0 && q < 0) {  // the chain's input gradient
                    float *dx = !din.p ? NULL : din.kind == STORED_F32 ? (float *)din.p + n0 * nin : sp.grad[1];
                    l->ops->backward(l, &c, dx, g, xi, sp.out[i], n);
                    exec_charge(ctx, l, CALL_BACKWARD, n, t0);
                    if (dx && din.kind != STORED_F32) store(ctx, din.p, dx, nin, n0, n);
                    break;
                }
                float *d = l->ops->backward_in_place ? g : (g == sp.grad[0] ? sp.grad[1] : sp.grad[0]);
                l->ops->backward(l, &c, d, g, xi, sp.out[i], n);
                exec_charge(ctx, l, CALL_BACKWARD, n, t0);
                sweep_round(ctx, &sp, d, n * shape_numel(l->in));
                g = d;
            }
            if (q >= 0) {
                Layer *l = s->m[q];
                const LayerCtx c = sweep_ctx(ctx, l, &sp, q, n0, n, N);
                const double t0 = exec_start(ctx);
                l->ops->backward_reduce(l, &c, g, q ? sp.out[q - 1] : x, sp.out[q], n0, n, N);
                exec_charge(ctx, l, CALL_BACKWARD_REDUCE, n, t0);
            }
        }
    }
}
