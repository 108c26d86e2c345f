// test_layers.c: every layer type and the loss on the CPU backend, against plain
// double-precision references written here with direct loops in the same layouts
// (activations (N, H, W, C), conv weights (OC, C, K, K), linear weights (OUT, IN)).
//
// For each layer:
//   forward   the float output equals the double reference within 1e-5 of the output's
//             largest magnitude;
//   backward  with the scalar objective L = sum(out * R) for a fixed random R, the float
//             din, dW, db equal central finite differences of L computed on the double
//             reference (h = 1e-6, so the differences are exact to ~1e-9 for these
//             piecewise-linear or smooth functions) within 1e-4 * max(1, max|grad|);
//             inputs are kept away from the kinks of relu (and relu6's at 6) and max;
//   contract  parameter gradients accumulate (a second backward doubles them), din is
//             overwritten (a second backward over garbage gives the same bits), and
//             din = NULL still gives the parameter gradients.
// Where finite differences would be too slow (the conv batch that im2col splits into
// chunks) the reference is an analytic double backward with direct loops, which the small
// cases check against finite differences first.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/cfg.h"
#include "../nn/exec.h"
#include "../nn/kernels.h"
#include "../nn/layer.h"
#include "../nn/rng.h"

#define FD_H 1e-6
#define FWD_TOL 1e-5   // forward: max abs error / max |reference|
#define GRAD_TOL 1e-4  // backward: max abs error / max(1, max |gradient|)
#define MAXNODES 16
#define MAXP 24  // parameter tensors of a layer and its children

// The CPU table's chunk_bytes (nn/cpu_kernels.c): the im2col workspace of one chunk of
// images; the workspace tests check that the table says so.
#define CONV_COL_BYTES ((size_t)2 << 20)

// ---- random numbers for test data (independent of the library's RNG) ------------------

static uint64_t g_rng = 1;

static void rng_seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ULL + 12345; }

static double urand(void) {  // [0, 1)
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_mix64(g_rng) >> 11) * (1.0 / 9007199254740992.0);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)urand(); }

static void fill_uniform(float *p, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) p[i] = frand(lo, hi);
}

// Distinct values 0.01 apart in random order: no ties and no near-ties for max pooling,
// and none within 0.005 of 0 for relu.
static void fill_distinct(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)((double)i - (double)n / 2 + 0.5) * 0.01f;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(urand() * (double)(i + 1));
        float t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static void fill_nan(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
}

// ---- a layer under test ------------------------------------------------------------------

typedef struct Case Case;
// out (N, out shape) from the double copies c->x and c->w[].
typedef void (*RefFwd)(const Case *c, double *out);
// dx = dL/dx, dw[i] = dL/dw[i] for L = sum(out * R), analytically.
typedef void (*RefBwd)(const Case *c, const double *R, double *dx, double **dw);

struct Case {
    Layer *l;
    int N;
    int nt;  // parameter tensors of l and its children, in state_dict order
    const Tensor *t[MAXP];
    int64_t nin, nout, np[MAXP];
    int K, stride, pad;  // conv and pooling
    bool relu;           // conv, linear and batchnorm with activation = relu (or relu6)
    bool relu6;          // with relu: activation = relu6, clipped at 6 as well
    bool nobias;         // conv with bias = 0
    int groups;          // conv: channel groups (1 or 0: none)
    RefFwd ref;
    RefBwd refb;  // analytic double backward, or NULL
    bool fd;      // check against finite differences (small cases only)
    // What the layer sees (plain malloc: the CPU backend's pointers are host pointers).
    float *in, *out, *dout, *din, *p[MAXP], *g[MAXP], *rf;  // rf: R in float
    float *out_fwd;  // the forward's out: a backward may use out as scratch (LayerOps)
    void *ws;
    Exec exec;     // fp32: the layer runs as the network runs it (batch passes, children)
    void *mem[3 * MAXP];  // buffers, state, inner activations
    int nmem;
    NodeList nl;  // a container's nodes, their outputs and output gradients (case_expand)
    float *node_out[MAXNODES], *node_grad[MAXNODES];
    // What the reference sees; finite differences perturb these.
    double *x, *w[MAXP], *R;
};

static Layer *layer_from_text(const LayerOps *ops, const char *text, Shape in) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text, "<test>", &err)) fail_msg("cfg_parse: %s", err.msg);
    Layer *l = NULL;
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = in};
    if (ops->create(&l, &a, &err)) fail_msg("create: %s", err.msg);
    cfg_free(&cfg);  // the layer keeps what it needs
    return l;
}

static void *case_mem(Case *c, size_t bytes) {
    assert_true(c->nmem < (int)(sizeof c->mem / sizeof c->mem[0]));
    return c->mem[c->nmem++] = xmalloc(bytes);
}

// Gives l and its children what the network would: parameters and gradients (into the
// case's arrays, in state_dict order), buffers at their start values, state.
static void case_attach(Case *c, Layer *l) {
    for (int i = 0; i < l->nparams; i++) {
        assert_true(c->nt < MAXP);
        const int j = c->nt++;
        c->t[j] = &l->params[i];
        c->np[j] = tensor_numel(&l->params[i]);
        c->p[j] = xmalloc((size_t)c->np[j] * sizeof(float));
        c->g[j] = xmalloc((size_t)c->np[j] * sizeof(float));
        c->w[j] = xmalloc((size_t)c->np[j] * sizeof(double));
        l->params[i].data = c->p[j];
        l->grads[i] = c->g[j];
    }
    for (int i = 0; i < l->nbuffers; i++) {
        if (l->buffers[i].dtype != DT_F32) continue;  // host counters live in the layer
        const int64_t n = tensor_numel(&l->buffers[i]);
        float *b = case_mem(c, (size_t)n * sizeof(float));
        for (int64_t e = 0; e < n; e++) b[e] = l->buffer_fill[i];
        l->buffers[i].data = b;
    }
    if (l->ops->state_bytes) l->state = case_mem(c, l->ops->state_bytes(l));
    for (int i = 0; i < l->nchildren; i++) case_attach(c, l->children[i]);
}

static size_t case_workspace(const Layer *l, int N) {
    size_t w = layer_workspace_bytes(l, cpu_kernels(), N);
    for (int i = 0; i < l->nchildren; i++) {
        const size_t cw = case_workspace(l->children[i], N);
        if (cw > w) w = cw;
    }
    return w;
}

// A container's nodes (LayerOps.expand), each with an output and an output gradient of
// its own (fp32), and the inner activations of its leaves.
static void case_expand(Case *c) {
    Error err = {{0}};
    c->nl = (NodeList){.input = c->l->in};
    if (c->l->ops->expand(c->l, &c->nl, NODE_INPUT, &err) < 0) fail_msg("expand: %s", err.msg);
    assert_true(c->nl.n <= MAXNODES);
    for (int j = 0; j < c->nl.n; j++) {
        const size_t bytes = (size_t)c->N * (size_t)shape_numel(c->nl.node[j].out) * sizeof(float);
        c->node_out[j] = xmalloc(bytes);
        c->node_grad[j] = xmalloc(bytes);
        const Layer *l = c->nl.node[j].l;
        if (l && l->ops->inner_bytes) c->nl.node[j].l->inner = xmalloc((size_t)c->N * l->ops->inner_bytes(l, DT_F32));
    }
}

static void case_init(Case *c, const LayerOps *ops, const char *text, Shape in, int N) {
    memset(c, 0, sizeof *c);
    c->l = layer_from_text(ops, text, in);
    c->N = N;
    c->nin = N * shape_numel(c->l->in);
    c->nout = N * shape_numel(c->l->out);
    c->in = xmalloc((size_t)c->nin * sizeof(float));
    c->din = xmalloc((size_t)c->nin * sizeof(float));
    c->x = xmalloc((size_t)c->nin * sizeof(double));
    c->out = xmalloc((size_t)c->nout * sizeof(float));
    c->out_fwd = xmalloc((size_t)c->nout * sizeof(float));
    c->dout = xmalloc((size_t)c->nout * sizeof(float));
    c->rf = xmalloc((size_t)c->nout * sizeof(float));
    c->R = xmalloc((size_t)c->nout * sizeof(double));
    case_attach(c, c->l);
    // Exactly the bytes the layer asks for, so that ASan sees any overrun.
    c->ws = xmalloc(case_workspace(c->l, N));
    c->exec.precision = DT_F32;
    if (c->l->ops->inner_bytes) c->l->inner = case_mem(c, (size_t)N * c->l->ops->inner_bytes(c->l, DT_F32));
    if (c->l->ops->expand) case_expand(c);
}

static void case_free(Case *c) {
    void *bufs[] = {c->in, c->din, c->x, c->out, c->out_fwd, c->dout, c->rf, c->R, c->ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int j = 0; j < c->nl.n; j++) {
        free(c->node_out[j]);
        free(c->node_grad[j]);
        if (c->nl.node[j].l) free(c->nl.node[j].l->inner);
    }
    free(c->nl.node);
    for (int i = 0; i < c->nmem; i++) free(c->mem[i]);
    for (int i = 0; i < MAXP; i++) {
        free(c->p[i]);
        free(c->g[i]);
        free(c->w[i]);
    }
    layer_free(c->l);
}

// Copies the float data into the reference's doubles (the reference starts from exactly
// the numbers the layer sees).
static void case_sync(Case *c) {
    for (int64_t i = 0; i < c->nin; i++) c->x[i] = c->in[i];
    for (int j = 0; j < c->nt; j++)
        for (int64_t i = 0; i < c->np[j]; i++) c->w[j][i] = c->p[j][i];
    for (int64_t i = 0; i < c->nout; i++) c->R[i] = c->rf[i];
}

// Inputs, parameters and R uniform in [-1, 1).
static void case_fill(Case *c, uint64_t seed) {
    rng_seed(seed);
    fill_uniform(c->in, c->nin, -1, 1);
    for (int j = 0; j < c->nt; j++) fill_uniform(c->p[j], c->np[j], -1, 1);
    fill_uniform(c->rf, c->nout, -1, 1);
    case_sync(c);
}

// The activation of a case, and its reference in double: relu6 clips at 0 and at 6.
static Activation case_act(const Case *c) { return c->relu6 ? ACT_RELU6 : c->relu ? ACT_RELU : ACT_NONE; }
static double act_ref(Activation act, double z) {
    if (act != ACT_NONE && z < 0) return 0;
    return act == ACT_RELU6 && z > 6 ? 6 : z;
}
// Whether the gradient passes at pre-activation z: PyTorch's rule, ReLU where z > 0, ReLU6
// where 0 < z < 6.
static bool act_ref_passes(Activation act, double z) {
    return act == ACT_NONE || (z > 0 && (act == ACT_RELU || z < 6));
}

// For relu6, the first parameter tensor (the weights; batchnorm's gamma) is scaled by this,
// so that pre-activations land below 0, between 0 and 6, and above 6.
#define RELU6_SPREAD 4.0f

// For layers with a relu activation: refills until no pre-activation lies within margin of
// 0 (nor of 6 with relu6, where some must lie on each side of both kinks), so that neither
// float rounding nor a step of FD_H crosses a kink.
static void case_fill_away_from_kinks(Case *c, uint64_t seed, double margin) {
    double *z = xmalloc((size_t)c->nout * sizeof(double));
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        case_fill(c, seed + (uint64_t)tries);
        if (!c->relu) break;
        if (c->relu6) {
            for (int64_t i = 0; i < c->np[0]; i++) c->p[0][i] *= RELU6_SPREAD;
            case_sync(c);
        }
        const bool relu6 = c->relu6;
        c->relu = c->relu6 = false;
        c->ref(c, z);
        c->relu = true, c->relu6 = relu6;
        double m = INFINITY;
        int64_t below = 0, between = 0, above = 0;
        for (int64_t i = 0; i < c->nout; i++) {
            m = fmin(m, fabs(z[i]));
            if (relu6) m = fmin(m, fabs(z[i] - 6));
            below += z[i] < 0, between += z[i] > 0 && z[i] < 6, above += z[i] > 6;
        }
        if (m >= margin && (!relu6 || (below && between && above))) break;
    }
    free(z);
}

static LayerCtx case_ctx(const Case *c) {
    return (LayerCtx){.k = cpu_kernels(), .exec = &c->exec, .workspace = c->ws, .seed = 1,
                      .step = 0, .sample0 = 0, .train = true};
}

static Stored f32(const void *p) { return (Stored){.p = (void *)p, .kind = STORED_F32}; }

// A container's node p's output (NODE_INPUT: the case's input).
static const float *node_value(const Case *c, int p) { return p == NODE_INPUT ? c->in : c->node_out[p]; }

// The layer's forward and backward as the network runs them (exec.h): with its batch
// passes (batchnorm); a container as its nodes, forward in order and backward in reverse,
// the gradient of each node's output summed over the nodes that read it.
static void case_forward(const Case *c, const LayerCtx *ctx, float *out, const float *in) {
    if (!c->l->ops->expand) {
        exec_forward(ctx, c->l, f32(out), f32(in), c->N);
        return;
    }
    for (int j = 0; j < c->nl.n; j++) {
        const NetNode *n = &c->nl.node[j];
        if (n->l) exec_forward(ctx, n->l, f32(c->node_out[j]), f32(node_value(c, n->in[0])), c->N);
        else exec_add_act(ctx, f32(c->node_out[j]), f32(node_value(c, n->in[0])),
                          f32(node_value(c, n->in[1])), shape_numel(n->out), c->N, n->act);
    }
    memcpy(out, c->node_out[c->nl.n - 1], (size_t)c->nout * sizeof(float));
}

// grad (of node p, or din for NODE_INPUT) += v, n values.
static void add_into(const Case *c, float *din, int p, const float *v, int64_t n) {
    float *g = p == NODE_INPUT ? din : c->node_grad[p];
    if (!g) return;
    for (int64_t i = 0; i < n; i++) g[i] += v[i];
}

static void case_backward(const Case *c, const LayerCtx *ctx, float *din, float *dout) {
    if (!c->l->ops->expand) {
        exec_backward(ctx, c->l, f32(din), f32(dout), f32(c->in), f32(c->out), c->N, DIN_WRITE);
        return;
    }
    const int last = c->nl.n - 1;
    for (int j = 0; j < last; j++)
        memset(c->node_grad[j], 0, (size_t)c->N * (size_t)shape_numel(c->nl.node[j].out) * sizeof(float));
    memcpy(c->node_grad[last], dout, (size_t)c->nout * sizeof(float));
    if (din) memset(din, 0, (size_t)c->nin * sizeof(float));
    for (int j = last; j >= 0; j--) {
        const NetNode *n = &c->nl.node[j];
        const int64_t values = (int64_t)c->N * shape_numel(n->out);
        if (!n->l) {
            exec_act_backward(ctx, f32(c->node_grad[j]), f32(c->node_out[j]), shape_numel(n->out), c->N, n->act);
            for (int k = 0; k < 2; k++) add_into(c, din, n->in[k], c->node_grad[j], values);
            continue;
        }
        const int64_t nin = (int64_t)c->N * shape_numel(n->l->in);
        float *d = xmalloc((size_t)nin * sizeof(float));
        exec_backward(ctx, n->l, f32(d), f32(c->node_grad[j]), f32(node_value(c, n->in[0])),
                      f32(c->node_out[j]), c->N, DIN_WRITE);
        add_into(c, din, n->in[0], d, nin);
        free(d);
    }
}

// Fails if max |got - want| > tol * max(floor, max |want|).
static void expect_close(const char *what, const float *got, const double *want, int64_t n,
                         double tol, double floor) {
    double err = 0, big = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = e, at = i;  // catches NaN
        big = fmax(big, fabs(want[i]));
    }
    double lim = tol * fmax(floor, big);
    if (!(err <= lim))
        fail_msg("%s: max error %.3g at [%lld] (got %.9g, want %.9g), limit %.3g", what, err,
                 (long long)at, (double)got[at], want[at], lim);
}

static void expect_close_dd(const char *what, const double *got, const double *want, int64_t n,
                            double tol) {
    double err = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        big = fmax(big, fabs(want[i]));
    }
    if (!(err <= tol * fmax(1.0, big))) fail_msg("%s: max error %.3g, max %.3g", what, err, big);
}

static double objective(const Case *c, double *scratch) {
    c->ref(c, scratch);
    double s = 0;
    for (int64_t i = 0; i < c->nout; i++) s += scratch[i] * c->R[i];
    return s;
}

// Central differences of the objective with respect to every element of v (n).
static void fd_grad(Case *c, double *v, int64_t n, double *grad) {
    double *scratch = xmalloc((size_t)c->nout * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        const double keep = v[i];
        v[i] = keep + FD_H;
        const double lp = objective(c, scratch);
        v[i] = keep - FD_H;
        const double lm = objective(c, scratch);
        v[i] = keep;
        grad[i] = (lp - lm) / (2 * FD_H);
    }
    free(scratch);
}

static void check_forward(Case *c) {
    LayerCtx ctx = case_ctx(c);
    fill_nan(c->out, c->nout);  // every output element must be written
    case_forward(c, &ctx, c->out, c->in);
    double *ref = xmalloc((size_t)c->nout * sizeof(double));
    c->ref(c, ref);
    double big = 0;
    for (int64_t i = 0; i < c->nout; i++) big = fmax(big, fabs(ref[i]));
    assert_true(big > 0);  // a test whose output is all zeros checks nothing
    expect_close("forward", c->out, ref, c->nout, FWD_TOL, 0.0);
    memcpy(c->out_fwd, c->out, (size_t)c->nout * sizeof(float));
    free(ref);
}

static void run_backward(Case *c, float *din) {
    LayerCtx ctx = case_ctx(c);
    memcpy(c->dout, c->rf, (size_t)c->nout * sizeof(float));  // backward may overwrite dout
    memcpy(c->out, c->out_fwd, (size_t)c->nout * sizeof(float));  // and out
    case_backward(c, &ctx, din, c->dout);
}

// Runs check_forward first (backward needs the forward's out).
static void check_backward(Case *c) {
    const int np = c->nt;
    for (int j = 0; j < np; j++) memset(c->g[j], 0, (size_t)c->np[j] * sizeof(float));
    fill_nan(c->din, c->nin);
    run_backward(c, c->din);

    double *dx = xmalloc((size_t)c->nin * sizeof(double));
    double *dw[MAXP] = {0};
    for (int j = 0; j < np; j++) dw[j] = xmalloc((size_t)c->np[j] * sizeof(double));
    char what[192];
    if (c->fd) {
        fd_grad(c, c->x, c->nin, dx);
        expect_close("din vs finite differences", c->din, dx, c->nin, GRAD_TOL, 1.0);
        for (int j = 0; j < np; j++) {
            fd_grad(c, c->w[j], c->np[j], dw[j]);
            snprintf(what, sizeof what, "%s vs finite differences", c->t[j]->name);
            expect_close(what, c->g[j], dw[j], c->np[j], GRAD_TOL, 1.0);
        }
    }
    if (c->refb) {
        double *rx = xmalloc((size_t)c->nin * sizeof(double));
        double *rw[MAXP] = {0};
        for (int j = 0; j < np; j++) rw[j] = xmalloc((size_t)c->np[j] * sizeof(double));
        c->refb(c, c->R, rx, rw);
        // The analytic reference must itself agree with the finite differences; that is
        // what lets the large cases trust it alone.
        if (c->fd) {
            expect_close_dd("reference din vs finite differences", rx, dx, c->nin, 1e-7);
            for (int j = 0; j < np; j++)
                expect_close_dd("reference dW vs finite differences", rw[j], dw[j], c->np[j], 1e-7);
        }
        expect_close("din vs reference backward", c->din, rx, c->nin, GRAD_TOL, 1.0);
        for (int j = 0; j < np; j++) {
            snprintf(what, sizeof what, "%s vs reference backward", c->t[j]->name);
            expect_close(what, c->g[j], rw[j], c->np[j], GRAD_TOL, 1.0);
            free(rw[j]);
        }
        free(rx);
    }
    free(dx);
    for (int j = 0; j < np; j++) free(dw[j]);

    // Contract: parameter gradients accumulate, din is overwritten.
    float *din1 = xmalloc((size_t)c->nin * sizeof(float));
    float *g1[MAXP] = {0};
    memcpy(din1, c->din, (size_t)c->nin * sizeof(float));
    for (int j = 0; j < np; j++) {
        g1[j] = xmalloc((size_t)c->np[j] * sizeof(float));
        memcpy(g1[j], c->g[j], (size_t)c->np[j] * sizeof(float));
    }
    for (int64_t i = 0; i < c->nin; i++) c->din[i] = 1e30f;
    run_backward(c, c->din);
    if (memcmp(din1, c->din, (size_t)c->nin * sizeof(float)) != 0)
        fail_msg("din of a second backward differs from the first: din must be overwritten");
    for (int j = 0; j < np; j++) {
        double *twice = xmalloc((size_t)c->np[j] * sizeof(double));
        for (int64_t i = 0; i < c->np[j]; i++) twice[i] = 2.0 * g1[j][i];
        snprintf(what, sizeof what, "%s after two backwards (must accumulate)", c->t[j]->name);
        expect_close(what, c->g[j], twice, c->np[j], 1e-6, 0.0);
        free(twice);
    }
    // The first layer of a network gets din = NULL: parameter gradients are still made.
    // (A container is never the first layer.)
    if (np > 0 && !c->l->ops->expand) {
        for (int j = 0; j < np; j++) memset(c->g[j], 0, (size_t)c->np[j] * sizeof(float));
        run_backward(c, NULL);
        for (int j = 0; j < np; j++)
            if (memcmp(g1[j], c->g[j], (size_t)c->np[j] * sizeof(float)) != 0)
                fail_msg("%s with din = NULL differs from the one with din", c->t[j]->name);
    }
    free(din1);
    for (int j = 0; j < np; j++) free(g1[j]);
}

// ---- double references ---------------------------------------------------------------------

// Direct convolution, no im2col: out[n,oh,ow,oc] = b[oc] + sum_{c,kh,kw}
// x[n, oh*S-P+kh, ow*S-P+kw, c] * w[oc,c,kh,kw], zero outside the image; b may be NULL.
static void conv_d(double *out, const double *x, const double *w, const double *b, int N, Shape in,
                   Shape o, int K, int S, int P) {
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int oc = 0; oc < o.c; oc++) {
                    double s = b ? b[oc] : 0.0;
                    for (int ch = 0; ch < in.c; ch++)
                        for (int kh = 0; kh < K; kh++)
                            for (int kw = 0; kw < K; kw++) {
                                const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                                if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                                s += x[(((int64_t)n * in.h + ih) * in.w + iw) * in.c + ch] *
                                     w[((oc * in.c + ch) * K + kh) * K + kw];
                            }
                    out[(((int64_t)n * o.h + oh) * o.w + ow) * o.c + oc] = s;
                }
}

static void conv_ref(const Case *c, double *out) {
    conv_d(out, c->x, c->w[0], c->nobias ? NULL : c->w[1], c->N, c->l->in, c->l->out, c->K,
           c->stride, c->pad);
    for (int64_t i = 0; i < c->nout; i++) out[i] = act_ref(case_act(c), out[i]);
}

// Grouped convolution as PyTorch defines it, by its own loops: output channel oc reads the
// C / G input channels from (oc / (OC / G)) * C / G on; w (OC, C / G, K, K).
static void grouped_ref(const Case *c, double *out) {
    const Shape in = c->l->in, o = c->l->out;
    const int K = c->K, S = c->stride, P = c->pad, Cg = in.c / c->groups, Mg = o.c / c->groups;
    for (int n = 0; n < c->N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int oc = 0; oc < o.c; oc++) {
                    double s = c->nobias ? 0.0 : c->w[1][oc];
                    for (int ci = 0; ci < Cg; ci++)
                        for (int kh = 0; kh < K; kh++)
                            for (int kw = 0; kw < K; kw++) {
                                const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                                if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                                s += c->x[(((int64_t)n * in.h + ih) * in.w + iw) * in.c + oc / Mg * Cg + ci] *
                                     c->w[0][((oc * Cg + ci) * K + kh) * K + kw];
                            }
                    out[(((int64_t)n * o.h + oh) * o.w + ow) * o.c + oc] = act_ref(case_act(c), s);
                }
}

// The adjoint of grouped_ref's loops, as conv_ref_backward's.
static void grouped_ref_backward(const Case *c, const double *R, double *dx, double **dw) {
    const Shape in = c->l->in, o = c->l->out;
    const int K = c->K, S = c->stride, P = c->pad, Cg = in.c / c->groups, Mg = o.c / c->groups;
    double *y = xmalloc((size_t)c->nout * sizeof(double));
    grouped_ref(c, y);
    memset(dx, 0, (size_t)c->nin * sizeof(double));
    memset(dw[0], 0, (size_t)c->np[0] * sizeof(double));
    if (!c->nobias) memset(dw[1], 0, (size_t)c->np[1] * sizeof(double));
    for (int n = 0; n < c->N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int oc = 0; oc < o.c; oc++) {
                    const int64_t oi = (((int64_t)n * o.h + oh) * o.w + ow) * o.c + oc;
                    const double dz = act_ref_passes(case_act(c), y[oi]) ? R[oi] : 0;
                    if (!c->nobias) dw[1][oc] += dz;
                    for (int ci = 0; ci < Cg; ci++)
                        for (int kh = 0; kh < K; kh++)
                            for (int kw = 0; kw < K; kw++) {
                                const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                                if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                                const int64_t xi = (((int64_t)n * in.h + ih) * in.w + iw) * in.c + oc / Mg * Cg + ci;
                                const int wi = ((oc * Cg + ci) * K + kh) * K + kw;
                                dw[0][wi] += dz * c->x[xi];
                                dx[xi] += dz * c->w[0][wi];
                            }
                }
    free(y);
}

// The adjoint of conv_ref's loops, written out: dz = R masked by the activation (read from
// its output y: relu6's y is 0 or 6 exactly where z is on a flat side); db = sum dz;
// dw[oc,c,kh,kw] = sum dz * x; dx[pixel] = sum dz * w.
static void conv_ref_backward(const Case *c, const double *R, double *dx, double **dw) {
    const Shape in = c->l->in, o = c->l->out;
    const int K = c->K, S = c->stride, P = c->pad;
    double *y = xmalloc((size_t)c->nout * sizeof(double));
    conv_ref(c, y);
    memset(dx, 0, (size_t)c->nin * sizeof(double));
    memset(dw[0], 0, (size_t)c->np[0] * sizeof(double));
    if (!c->nobias) memset(dw[1], 0, (size_t)c->np[1] * sizeof(double));
    for (int n = 0; n < c->N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int oc = 0; oc < o.c; oc++) {
                    const int64_t oi = (((int64_t)n * o.h + oh) * o.w + ow) * o.c + oc;
                    const double dz = act_ref_passes(case_act(c), y[oi]) ? R[oi] : 0;
                    if (!c->nobias) dw[1][oc] += dz;
                    for (int ch = 0; ch < in.c; ch++)
                        for (int kh = 0; kh < K; kh++)
                            for (int kw = 0; kw < K; kw++) {
                                const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                                if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                                const int64_t xi = (((int64_t)n * in.h + ih) * in.w + iw) * in.c + ch;
                                const int wi = ((oc * in.c + ch) * K + kh) * K + kw;
                                dw[0][wi] += dz * c->x[xi];
                                dx[xi] += dz * c->w[0][wi];
                            }
                }
    free(y);
}

// out[n,o] = act(b[o] + sum_i x[n,i] w[o,i]).
static void linear_ref(const Case *c, double *out) {
    const int I = c->l->in.c, O = c->l->out.c;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < O; o++) {
            double s = c->w[1][o];
            for (int i = 0; i < I; i++) s += c->x[(int64_t)n * I + i] * c->w[0][(int64_t)o * I + i];
            out[(int64_t)n * O + o] = act_ref(case_act(c), s);
        }
}

static void relu_ref(const Case *c, double *out) {
    for (int64_t i = 0; i < c->nout; i++) out[i] = c->x[i] > 0 ? c->x[i] : 0;
}

// Max (or mean, padding counted as zeros) over K x K windows at stride S with P of padding,
// floor mode; padding never wins the max.
static void pool_ref(const Case *c, double *out, bool mean) {
    const Shape in = c->l->in, o = c->l->out;
    for (int n = 0; n < c->N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int ch = 0; ch < o.c; ch++) {
                    double m = mean ? 0 : -INFINITY;
                    for (int kh = 0; kh < c->K; kh++)
                        for (int kw = 0; kw < c->K; kw++) {
                            const int ih = oh * c->stride - c->pad + kh, iw = ow * c->stride - c->pad + kw;
                            if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                            const double v = c->x[(((int64_t)n * in.h + ih) * in.w + iw) * in.c + ch];
                            m = mean ? m + v : fmax(m, v);
                        }
                    out[(((int64_t)n * o.h + oh) * o.w + ow) * o.c + ch] = mean ? m / (c->K * c->K) : m;
                }
}
static void maxpool_ref(const Case *c, double *out) { pool_ref(c, out, false); }
static void avgpool_ref(const Case *c, double *out) { pool_ref(c, out, true); }

static void global_avgpool_ref(const Case *c, double *out) {
    const Shape in = c->l->in;
    const int64_t hw = (int64_t)in.h * in.w;
    for (int n = 0; n < c->N; n++)
        for (int ch = 0; ch < in.c; ch++) {
            double s = 0;
            for (int64_t p = 0; p < hw; p++) s += c->x[((int64_t)n * hw + p) * in.c + ch];
            out[(int64_t)n * in.c + ch] = s / (double)hw;
        }
}

// The smallest |x| that went into a ReLU in the double references below: finite
// differences are only valid when no step crosses a kink.
static double g_kink_margin;

static void relu_d(double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        g_kink_margin = fmin(g_kink_margin, fabs(v[i]));
        if (v[i] < 0) v[i] = 0;
    }
}

// Batch normalisation in training mode: per channel of x (rows, C), the mean and biased
// variance over the rows; out = (x - mean) / sqrt(var + 1e-5) * g + b; the statistics
// into mean and var (unbiased) if non-NULL.
static void bn_d(double *out, const double *x, const double *g, const double *b, int64_t rows,
                 int C, bool relu, double *mean, double *var_unbiased) {
    for (int ch = 0; ch < C; ch++) {
        double m = 0, v = 0;
        for (int64_t r = 0; r < rows; r++) m += x[r * C + ch];
        m /= (double)rows;
        for (int64_t r = 0; r < rows; r++) v += (x[r * C + ch] - m) * (x[r * C + ch] - m);
        if (mean) mean[ch] = m;
        if (var_unbiased) var_unbiased[ch] = v / (double)(rows - 1);
        v /= (double)rows;
        for (int64_t r = 0; r < rows; r++)
            out[r * C + ch] = (x[r * C + ch] - m) / sqrt(v + 1e-5) * g[ch] + b[ch];
    }
    if (relu) relu_d(out, rows * C);
}

static void bn_ref(const Case *c, double *out) {
    bn_d(out, c->x, c->w[0], c->w[1], c->nin / c->l->in.c, c->l->in.c, c->relu, NULL, NULL);
    for (int64_t i = 0; i < c->nout && c->relu6; i++) out[i] = act_ref(ACT_RELU6, out[i]);
}

// torchvision's BasicBlock (nn/residual.c) from the double parameters in state_dict order:
// conv1, bn1 (weight, bias), conv2, bn2, and with a downsample its conv and batchnorm.
static void residual_ref(const Case *c, double *out) {
    const Shape in = c->l->in, o = c->l->out;
    const int64_t no = c->nout, rows = no / o.c;
    double *a = xmalloc((size_t)no * sizeof(double)), *b = xmalloc((size_t)no * sizeof(double));
    double *s = xmalloc((size_t)no * sizeof(double));
    conv_d(a, c->x, c->w[0], NULL, c->N, in, o, 3, c->stride, 1);
    bn_d(b, a, c->w[1], c->w[2], rows, o.c, true, NULL, NULL);
    conv_d(a, b, c->w[3], NULL, c->N, o, o, 3, 1, 1);
    bn_d(out, a, c->w[4], c->w[5], rows, o.c, false, NULL, NULL);
    if (c->nt == 9) {
        conv_d(a, c->x, c->w[6], NULL, c->N, in, o, 1, c->stride, 0);
        bn_d(s, a, c->w[7], c->w[8], rows, o.c, false, NULL, NULL);
    } else {
        memcpy(s, c->x, (size_t)no * sizeof(double));
    }
    for (int64_t i = 0; i < no; i++) out[i] += s[i];
    relu_d(out, no);
    free(a), free(b), free(s);
}

// torchvision's Bottleneck: relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x)),
// conv1 and conv3 1x1, conv2 3x3 with the stride; the shortcut a 1x1 convolution with the
// stride and a batchnorm when it has 12 tensors, else the identity.
static void bottleneck_ref(const Case *c, double *out) {
    const Shape in = c->l->in, o = c->l->out;
    const Shape m1 = {.c = o.c / 4, .h = in.h, .w = in.w}, m2 = {.c = o.c / 4, .h = o.h, .w = o.w};
    const int64_t no = c->nout, rows1 = (int64_t)c->N * in.h * in.w, rows = no / o.c;
    const size_t big = (size_t)(no > rows1 * m1.c ? no : rows1 * m1.c);
    double *a = xmalloc(big * sizeof(double)), *b = xmalloc(big * sizeof(double));
    double *s = xmalloc((size_t)no * sizeof(double));
    conv_d(a, c->x, c->w[0], NULL, c->N, in, m1, 1, 1, 0);
    bn_d(b, a, c->w[1], c->w[2], rows1, m1.c, true, NULL, NULL);
    conv_d(a, b, c->w[3], NULL, c->N, m1, m2, 3, c->stride, 1);
    bn_d(b, a, c->w[4], c->w[5], rows, m2.c, true, NULL, NULL);
    conv_d(a, b, c->w[6], NULL, c->N, m2, o, 1, 1, 0);
    bn_d(out, a, c->w[7], c->w[8], rows, o.c, false, NULL, NULL);
    if (c->nt == 12) {
        conv_d(a, c->x, c->w[9], NULL, c->N, in, o, 1, c->stride, 0);
        bn_d(s, a, c->w[10], c->w[11], rows, o.c, false, NULL, NULL);
    } else {
        memcpy(s, c->x, (size_t)no * sizeof(double));
    }
    for (int64_t i = 0; i < no; i++) out[i] += s[i];
    relu_d(out, no);
    free(a), free(b), free(s);
}

static void relu6_d(double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        g_kink_margin = fmin(g_kink_margin, fmin(fabs(v[i]), fabs(v[i] - 6)));
        v[i] = act_ref(ACT_RELU6, v[i]);
    }
}

// Depthwise 3x3 convolution, padded by 1, without bias: w (C, 1, 3, 3).
static void depthwise_d(double *out, const double *x, const double *w, int N, Shape in, Shape o, int S) {
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < o.h; oh++)
            for (int ow = 0; ow < o.w; ow++)
                for (int ch = 0; ch < o.c; ch++) {
                    double sum = 0;
                    for (int kh = 0; kh < 3; kh++)
                        for (int kw = 0; kw < 3; kw++) {
                            const int ih = oh * S - 1 + kh, iw = ow * S - 1 + kw;
                            if (ih < 0 || ih >= in.h || iw < 0 || iw >= in.w) continue;
                            sum += x[(((int64_t)n * in.h + ih) * in.w + iw) * in.c + ch] * w[(ch * 3 + kh) * 3 + kw];
                        }
                    out[(((int64_t)n * o.h + oh) * o.w + ow) * o.c + ch] = sum;
                }
}

// MobileNetV2's InvertedResidual: with an expansion (9 tensors) conv.0 1x1 to the hidden
// width with its batchnorm and ReLU6, else (6 tensors) none; the depthwise 3x3 with the
// stride, its batchnorm and ReLU6; the linear 1x1 projection and its batchnorm; plus x
// where the shapes agree.
static void inverted_ref(const Case *c, double *out) {
    const Shape in = c->l->in, o = c->l->out;
    const bool expands = c->nt == 9;
    const int hidden = expands ? (int)c->t[0]->shape[0] : in.c;
    const Shape h1 = {.c = hidden, .h = in.h, .w = in.w}, h2 = {.c = hidden, .h = o.h, .w = o.w};
    const int64_t rows1 = (int64_t)c->N * in.h * in.w, rows2 = (int64_t)c->N * o.h * o.w;
    double *a = xmalloc((size_t)(rows1 * hidden) * sizeof(double)), *b = xmalloc((size_t)(rows1 * hidden) * sizeof(double));
    const double *x = c->x;
    int t = 0;
    if (expands) {
        conv_d(a, x, c->w[0], NULL, c->N, in, h1, 1, 1, 0);
        bn_d(b, a, c->w[1], c->w[2], rows1, hidden, false, NULL, NULL);
        relu6_d(b, rows1 * hidden);
        x = b, t = 3;
    }
    depthwise_d(a, x, c->w[t], c->N, h1, h2, c->stride);
    double *d = xmalloc((size_t)(rows2 * hidden) * sizeof(double));
    bn_d(d, a, c->w[t + 1], c->w[t + 2], rows2, hidden, false, NULL, NULL);
    relu6_d(d, rows2 * hidden);
    conv_d(a, d, c->w[t + 3], NULL, c->N, h2, o, 1, 1, 0);
    bn_d(out, a, c->w[t + 4], c->w[t + 5], rows2, o.c, false, NULL, NULL);
    if (c->stride == 1 && in.c == o.c)
        for (int64_t i = 0; i < c->nout; i++) out[i] += c->x[i];
    free(a), free(b), free(d);
}

// A general [block] without a shortcut's layers: body conv 3x3 (pad 1, with a bias) and
// batchnorm with a ReLU, then a 1x1 convolution; out = body(x) + x, no activation.
static void block_ref(const Case *c, double *out) {
    const Shape in = c->l->in;
    const Shape m = {.c = c->t[0]->shape[0], .h = in.h, .w = in.w};
    const int64_t no = c->nout, rows = no / in.c;
    double *a = xmalloc((size_t)(rows * m.c) * sizeof(double)), *b = xmalloc((size_t)(rows * m.c) * sizeof(double));
    conv_d(a, c->x, c->w[0], c->w[1], c->N, in, m, 3, 1, 1);
    bn_d(b, a, c->w[2], c->w[3], rows, m.c, true, NULL, NULL);
    conv_d(out, b, c->w[4], NULL, c->N, m, in, 1, 1, 0);
    for (int64_t i = 0; i < no; i++) out[i] += c->x[i];
    free(a), free(b);
}

// PyTorch's flatten of (N, C, H, W): out[n, (c*H + h)*W + w] = x[n, h, w, c].
static void flatten_ref(const Case *c, double *out) {
    const Shape in = c->l->in;
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < in.h; h++)
            for (int w = 0; w < in.w; w++)
                for (int ch = 0; ch < in.c; ch++)
                    out[(int64_t)n * shape_numel(in) + ((int64_t)ch * in.h + h) * in.w + w] =
                        c->x[(((int64_t)n * in.h + h) * in.w + w) * in.c + ch];
}

// log_softmax over the C features of each row, stable: x - max - log(sum exp(x - max)).
static void log_softmax_rows(double *out, const double *x, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *r = x + (int64_t)n * C;
        double m = -INFINITY, s = 0;
        for (int i = 0; i < C; i++) m = fmax(m, r[i]);
        for (int i = 0; i < C; i++) s += exp(r[i] - m);
        for (int i = 0; i < C; i++) out[(int64_t)n * C + i] = r[i] - m - log(s);
    }
}

static void log_softmax_ref(const Case *c, double *out) {
    log_softmax_rows(out, c->x, c->N, c->l->in.c);
}

// ---- conv ------------------------------------------------------------------------------------

typedef struct ConvSpec {
    int N, C, H, W, OC, K, stride, pad;
    bool relu, nobias;
    bool relu6;             // activation = relu6 (relu need not be set)
    const char *algorithm;  // NULL: auto
} ConvSpec;

static void conv_text(char *text, size_t n, const ConvSpec *s) {
    snprintf(text, n, "[conv]\nname = c\nfilters = %d\nsize = %d\nstride = %d\npad = %d\n"
             "activation = %s\nbias = %d\nalgorithm = %s\n", s->OC, s->K, s->stride, s->pad,
             s->relu6 ? "relu6" : s->relu ? "relu" : "none", !s->nobias, s->algorithm ? s->algorithm : "auto");
}

static void check_conv(const ConvSpec *s, bool fd, uint64_t seed) {
    char text[256];
    conv_text(text, sizeof text, s);
    Case c;
    case_init(&c, &conv_ops, text, (Shape){.c = s->C, .h = s->H, .w = s->W}, s->N);
    // The output shape is PyTorch's floor((H + 2P - K) / S) + 1.
    assert_int_equal(c.l->out.c, s->OC);
    assert_int_equal(c.l->out.h, (s->H + 2 * s->pad - s->K) / s->stride + 1);
    assert_int_equal(c.l->out.w, (s->W + 2 * s->pad - s->K) / s->stride + 1);
    assert_int_equal(c.l->nparams, s->nobias ? 1 : 2);
    assert_string_equal(c.l->params[0].name, "c.weight");
    assert_int_equal(c.l->params[0].ndim, 4);
    assert_int_equal(c.l->params[0].shape[0], s->OC);
    assert_int_equal(c.l->params[0].shape[1], s->C);
    assert_int_equal(c.l->params[0].shape[2], s->K);
    assert_int_equal(c.l->params[0].shape[3], s->K);
    if (!s->nobias) {
        assert_string_equal(c.l->params[1].name, "c.bias");
        assert_int_equal(c.l->params[1].shape[0], s->OC);
    }
    c.K = s->K, c.stride = s->stride, c.pad = s->pad, c.relu = s->relu || s->relu6, c.nobias = s->nobias;
    c.relu6 = s->relu6;
    c.ref = conv_ref;
    c.refb = conv_ref_backward;
    c.fd = fd;
    case_fill_away_from_kinks(&c, seed, fd ? 1e-4 : 1e-6);
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

// A conv with C * K * K <= CONV_DIRECT_MAX_TAPS (32) runs the direct kernels, a larger
// one im2col and GEMMs: the cases below take both paths (C = 2 and C = 4 at 3x3).
static void test_conv_stride2_pad1_relu(void **state) {
    // Non-square input, stride 2 with an odd extent (floor), padding, C > 1.
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 2,
                           .pad = 1, .relu = true}, true, 10);
    check_conv(&(ConvSpec){.N = 2, .C = 4, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 2,
                           .pad = 1, .relu = true}, true, 11);
}

static void test_conv_c1_no_activation(void **state) {
    check_conv(&(ConvSpec){.N = 3, .C = 1, .H = 5, .W = 8, .OC = 4, .K = 3, .stride = 1,
                           .pad = 0, .relu = false}, true, 20);
}

static void test_conv_direct_vector_blocks(void **state) {
    // The direct kernels' vector paths: 40 channels are a block of 32 and one of 8, 13 are
    // one of 8 and 5 left over, 59 are blocks of 32, 16 (AVX-512's) and 8 and 3 left over;
    // 25 and 35 output pixels are not multiples of 4.
    check_conv(&(ConvSpec){.N = 1, .C = 1, .H = 8, .W = 6, .OC = 40, .K = 3, .stride = 1,
                           .pad = 1, .relu = true}, true, 21);
    check_conv(&(ConvSpec){.N = 1, .C = 1, .H = 5, .W = 7, .OC = 59, .K = 3, .stride = 1,
                           .pad = 1, .relu = true}, true, 23);
    check_conv(&(ConvSpec){.N = 1, .C = 3, .H = 7, .W = 7, .OC = 13, .K = 3, .stride = 1,
                           .pad = 0, .relu = true}, false, 22);
}

static void test_conv_pointwise(void **state) {
    // 1x1, stride 1, no padding: the layer skips im2col and multiplies the input directly.
    check_conv(&(ConvSpec){.N = 2, .C = 5, .H = 4, .W = 3, .OC = 3, .K = 1, .stride = 1,
                           .pad = 0, .relu = true}, true, 30);
    check_conv(&(ConvSpec){.N = 3, .C = 4, .H = 2, .W = 5, .OC = 2, .K = 1, .stride = 1,
                           .pad = 0, .relu = false}, true, 31);
}

// activation = relu6 on every path: the direct kernels (their vector blocks of 32, 16 and 8
// and the scalar remainder), im2col + GEMM, the pointwise 1x1, Winograd, without bias.
static void test_conv_relu6(void **state) {
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 2,
                           .pad = 1, .relu6 = true}, true, 90);
    check_conv(&(ConvSpec){.N = 1, .C = 1, .H = 8, .W = 6, .OC = 40, .K = 3, .stride = 1,
                           .pad = 1, .relu6 = true}, true, 91);
    check_conv(&(ConvSpec){.N = 1, .C = 1, .H = 5, .W = 7, .OC = 59, .K = 3, .stride = 1,
                           .pad = 1, .relu6 = true}, true, 97);
    check_conv(&(ConvSpec){.N = 1, .C = 3, .H = 7, .W = 7, .OC = 13, .K = 3, .stride = 1,
                           .pad = 0, .relu6 = true}, false, 92);
    check_conv(&(ConvSpec){.N = 2, .C = 4, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 2,
                           .pad = 1, .relu6 = true}, true, 93);
    check_conv(&(ConvSpec){.N = 2, .C = 5, .H = 4, .W = 3, .OC = 3, .K = 1, .stride = 1,
                           .pad = 0, .relu6 = true}, true, 94);
    check_conv(&(ConvSpec){.N = 2, .C = 5, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 1,
                           .pad = 1, .relu6 = true, .algorithm = "winograd"}, true, 95);
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 6, .W = 5, .OC = 3, .K = 3, .stride = 1,
                           .pad = 1, .relu6 = true, .nobias = true}, true, 96);
}

static void test_conv_1x1_strided_and_padded(void **state) {
    // K = 1 that is not pointwise: im2col with stride 2, and with padding (zero border).
    check_conv(&(ConvSpec){.N = 2, .C = 3, .H = 5, .W = 5, .OC = 2, .K = 1, .stride = 2,
                           .pad = 0, .relu = false}, true, 40);
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 3, .W = 4, .OC = 2, .K = 1, .stride = 1,
                           .pad = 1, .relu = false}, true, 41);
}

static void test_conv_k5_pad2(void **state) {
    check_conv(&(ConvSpec){.N = 2, .C = 3, .H = 9, .W = 7, .OC = 2, .K = 5, .stride = 1,
                           .pad = 2, .relu = false}, true, 50);
    check_conv(&(ConvSpec){.N = 2, .C = 1, .H = 6, .W = 10, .OC = 3, .K = 5, .stride = 2,
                           .pad = 1, .relu = true}, true, 51);
}

static void test_conv_without_bias(void **state) {
    // bias = 0, as ResNets put convolutions before a batchnorm: no bias tensor; on both
    // paths (direct kernels and im2col + GEMM), with and without an activation.
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 6, .W = 5, .OC = 3, .K = 3, .stride = 1,
                           .pad = 1, .relu = true, .nobias = true}, true, 55);
    check_conv(&(ConvSpec){.N = 2, .C = 4, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 2,
                           .pad = 1, .relu = false, .nobias = true}, true, 56);
    check_conv(&(ConvSpec){.N = 2, .C = 3, .H = 4, .W = 4, .OC = 2, .K = 1, .stride = 2,
                           .pad = 0, .relu = false, .nobias = true}, true, 57);
}

static void test_conv_unused_border(void **state) {
    // (8 - 3) / 2 and (7 - 3) / 2 leave the last input row unread: its din must be 0.
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 8, .W = 7, .OC = 2, .K = 3, .stride = 2,
                           .pad = 0, .relu = true}, true, 60);
    check_conv(&(ConvSpec){.N = 2, .C = 4, .H = 8, .W = 7, .OC = 2, .K = 3, .stride = 2,
                           .pad = 0, .relu = true}, true, 62);
    // Kernel as large as the padded input: a 1x1 output.
    check_conv(&(ConvSpec){.N = 2, .C = 2, .H = 3, .W = 2, .OC = 3, .K = 4, .stride = 1,
                           .pad = 1, .relu = false}, true, 61);
}

// Winograd F(2x2, 3x3): odd and even output extents (tiles cut at the edge), padding 0,
// 1 and 2, channels that are not a multiple of the transform's 8-channel vectors, a tiny
// image (one tile), and the choice of `algorithm = auto`.
static void test_conv_winograd(void **state) {
    const char *w = "winograd";
    check_conv(&(ConvSpec){.N = 2, .C = 5, .H = 7, .W = 6, .OC = 3, .K = 3, .stride = 1,
                           .pad = 1, .relu = true, .algorithm = w}, true, 80);
    check_conv(&(ConvSpec){.N = 2, .C = 3, .H = 6, .W = 9, .OC = 18, .K = 3, .stride = 1,
                           .pad = 0, .relu = false, .algorithm = w}, true, 81);
    check_conv(&(ConvSpec){.N = 1, .C = 17, .H = 4, .W = 5, .OC = 2, .K = 3, .stride = 1,
                           .pad = 2, .relu = true, .nobias = true, .algorithm = w}, true, 82);
    check_conv(&(ConvSpec){.N = 3, .C = 2, .H = 3, .W = 3, .OC = 2, .K = 3, .stride = 1,
                           .pad = 0, .relu = false, .algorithm = w}, true, 83);
    // 40 channels at 20x20, 2 shards (the suite's 2 threads): a batch of 9 runs as images
    // 0-3 and 4-8, in chunks of 2, 2 and 2, 2, 1. A chunk of n images has 100n tiles and
    // takes 16 matrices of V (100n x 40) and of M (100n x 32), each rounded up to 4 KB plus
    // 64 bytes (winograd_stride): 2 images 16 x (8,208 + 7,184) floats = 985,088 bytes, 3
    // images 1,443,840, over a shard's 1 MB. Each shard also sums its own dU and dbias,
    // 16 x 32 x 40 + 32 = 20,512 floats, over the pass (there is no other dU).
    const ConvSpec big = {.N = 9, .C = 40, .H = 20, .W = 20, .OC = 32, .K = 3, .stride = 1,
                          .pad = 1, .relu = true};
    char text[256];
    conv_text(text, sizeof text, &big);
    Layer *l = layer_from_text(&conv_ops, text, (Shape){.c = big.C, .h = big.H, .w = big.W});
    const size_t weights = (size_t)16 * 32 * 40 * sizeof(float);  // U
    assert_int_equal(cpu_kernels()->shard_count(), 2);
    assert_int_equal(l->ops->workspace_bytes(l, cpu_kernels(), big.N),
                     weights + 2 * ((size_t)16 * (8208 + 7184) + 20512) * sizeof(float));
    layer_free(l);
    check_conv(&big, false, 84);
    // auto: Winograd from 16 channels in and out and 100 output pixels (the workspace says
    // which path it took: the transformed weights and each shard's chunk and sums, or the
    // im2col rows).
    const struct { int OC, H; size_t floats; } autos[] = {
        {16, 10, 16 * 16 * 16 + 2 * (16 * 2 * (1024 + 16) + 16 * 16 * 16 + 16)},  // Winograd, 25 tiles
        {16, 9, 81 * 144},                // 81 pixels: im2col
        {15, 10, 100 * 144},              // 15 filters: im2col
    };
    for (size_t i = 0; i < sizeof autos / sizeof autos[0]; i++) {
        const ConvSpec a = {.N = 1, .C = 16, .H = autos[i].H, .W = autos[i].H, .OC = autos[i].OC,
                            .K = 3, .stride = 1, .pad = 1};
        conv_text(text, sizeof text, &a);
        l = layer_from_text(&conv_ops, text, (Shape){.c = a.C, .h = a.H, .w = a.W});
        assert_int_equal(l->ops->workspace_bytes(l, cpu_kernels(), 1), autos[i].floats * sizeof(float));
        layer_free(l);
    }
}

// A pass over the batch in calls of unequal size (the executor's chunks, the last one
// short), as fp16 and compressed reads run a Winograd convolution's backward: the shards'
// weight-gradient sums, kept in the workspace from the pass's first call to its last, stay
// where the first call put them although the last call, of fewer images, cuts its shards'
// chunks smaller. Against one call over the whole batch: the input gradient to the bit
// (each image's is its own), the parameter gradients to rounding (the shards sum other
// images).
static void test_conv_winograd_pass(void **state) {
    const ConvSpec s = {.N = 9, .C = 40, .H = 20, .W = 20, .OC = 32, .K = 3, .stride = 1,
                        .pad = 1, .relu = true, .algorithm = "winograd"};
    char text[256];
    conv_text(text, sizeof text, &s);
    Case c;
    case_init(&c, &conv_ops, text, (Shape){.c = s.C, .h = s.H, .w = s.W}, s.N);
    case_fill(&c, 85);
    const LayerCtx ctx = case_ctx(&c);
    c.l->ops->forward(c.l, &ctx, c.out, c.in, s.N);
    memcpy(c.dout, c.rf, (size_t)c.nout * sizeof(float));
    const int64_t in_img = shape_numel(c.l->in), out_img = shape_numel(c.l->out);
    float *want[3], *got[3];  // din, dw, dbias
    const int64_t n[3] = {c.nin, c.np[0], c.np[1]};
    for (int run = 0; run < 2; run++) {
        float **r = run ? got : want;
        for (int j = 0; j < 2; j++) memset(c.g[j], 0, (size_t)n[j + 1] * sizeof(float));
        float *dout = xmalloc((size_t)c.nout * sizeof(float));  // backward may use it as scratch
        memcpy(dout, c.dout, (size_t)c.nout * sizeof(float));
        r[0] = xmalloc((size_t)c.nin * sizeof(float));
        if (!run) {
            c.l->ops->backward(c.l, &ctx, r[0], dout, c.in, c.out, s.N);
        } else {  // images 0-7 (shards of 4: chunks of 2), then image 8 (a shard of 1)
            const int cut[] = {0, 8, s.N};
            for (int k = 0; k < 2; k++) {
                LayerCtx part = ctx;
                part.n0 = cut[k], part.after_first = k > 0, part.before_last = k == 0;
                c.l->ops->backward(c.l, &part, r[0] + cut[k] * in_img, dout + cut[k] * out_img,
                                   c.in + cut[k] * in_img, c.out + cut[k] * out_img, cut[k + 1] - cut[k]);
            }
        }
        for (int j = 0; j < 2; j++) {
            r[j + 1] = xmalloc((size_t)n[j + 1] * sizeof(float));
            memcpy(r[j + 1], c.g[j], (size_t)n[j + 1] * sizeof(float));
        }
        free(dout);
    }
    static const char *const names[] = {"din", "dw", "dbias"};
    assert_memory_equal(got[0], want[0], (size_t)c.nin * sizeof(float));
    for (int j = 0; j < 3; j++) {
        double *w = xmalloc((size_t)n[j] * sizeof(double));
        for (int64_t i = 0; i < n[j]; i++) w[i] = want[j][i];
        expect_close(names[j], got[j], w, n[j], 1e-5, 1.0);
        free(w), free(want[j]), free(got[j]);
    }
    case_free(&c);
}

static void test_conv_chunked_batch(void **state) {
    // 16 channels, 3x3, 12x12 padded: one image's im2col rows take 12*12*144*4 = 82,944
    // bytes, so 2 MB hold 25 images and a batch of 30 runs as chunks of 25 and 5.
    const ConvSpec s = {.N = 30, .C = 16, .H = 12, .W = 12, .OC = 2, .K = 3, .stride = 1,
                        .pad = 1, .relu = true, .algorithm = "gemm"};
    char text[256];
    conv_text(text, sizeof text, &s);
    Layer *l = layer_from_text(&conv_ops, text, (Shape){.c = s.C, .h = s.H, .w = s.W});
    const size_t per_image = (size_t)12 * 12 * 16 * 9 * sizeof(float);
    // The im2col chunk alone: the weight and its gradient are permuted to (OC, K, K, C) in
    // place, through it.
    assert_int_equal(cpu_kernels()->chunk_bytes, CONV_COL_BYTES);
    assert_int_equal(l->ops->workspace_bytes(l, cpu_kernels(), s.N), (CONV_COL_BYTES / per_image) * per_image);
    assert_true(l->ops->workspace_bytes(l, cpu_kernels(), s.N) < s.N * per_image);  // it really is chunked
    assert_true(s.N % (CONV_COL_BYTES / per_image) != 0);  // with a partial chunk
    // A small batch is not chunked: its workspace is all of its im2col.
    assert_int_equal(l->ops->workspace_bytes(l, cpu_kernels(), 3), 3 * per_image);
    layer_free(l);
    // Against the double reference, forward and backward (finite differences over
    // 69,120 inputs would take too long; the reference backward is checked against them
    // in the small cases).
    check_conv(&s, false, 70);
}

// ---- grouped and depthwise conv -------------------------------------------------------------

typedef struct GroupSpec {
    int N, C, H, W, OC, K, stride, pad, groups;
    bool relu, nobias;
    bool relu6;  // activation = relu6 (relu need not be set)
} GroupSpec;

static void grouped_text(char *text, size_t n, const GroupSpec *s) {
    snprintf(text, n, "[conv]\nname = features.2.conv.1.0\nfilters = %d\nsize = %d\nstride = %d\npad = %d\n"
             "activation = %s\nbias = %d\ngroups = %d\n", s->OC, s->K, s->stride, s->pad,
             s->relu6 ? "relu6" : s->relu ? "relu" : "none", !s->nobias, s->groups);
}

static void check_grouped(const GroupSpec *s, bool fd, uint64_t seed) {
    char text[256];
    grouped_text(text, sizeof text, s);
    Case c;
    case_init(&c, &conv_ops, text, (Shape){.c = s->C, .h = s->H, .w = s->W}, s->N);
    assert_string_equal(c.l->ops->type, "conv");
    assert_int_equal(c.l->out.c, s->OC);
    assert_int_equal(c.l->out.h, (s->H + 2 * s->pad - s->K) / s->stride + 1);
    assert_int_equal(c.l->out.w, (s->W + 2 * s->pad - s->K) / s->stride + 1);
    assert_int_equal(c.l->nparams, s->nobias ? 1 : 2);
    // PyTorch's names and shapes: weight (OC, C / groups, K, K).
    assert_string_equal(c.l->params[0].name, "features.2.conv.1.0.weight");
    assert_int_equal(c.l->params[0].ndim, 4);
    assert_int_equal(c.l->params[0].shape[0], s->OC);
    assert_int_equal(c.l->params[0].shape[1], s->C / s->groups);
    assert_int_equal(c.l->params[0].shape[2], s->K);
    assert_int_equal(c.l->params[0].shape[3], s->K);
    assert_int_equal(c.l->fan_in, s->C / s->groups * s->K * s->K);
    if (!s->nobias) assert_string_equal(c.l->params[1].name, "features.2.conv.1.0.bias");
    c.K = s->K, c.stride = s->stride, c.pad = s->pad, c.relu = s->relu || s->relu6, c.relu6 = s->relu6;
    c.nobias = s->nobias, c.groups = s->groups;
    c.ref = grouped_ref;
    c.refb = grouped_ref_backward;
    c.fd = fd;
    case_fill_away_from_kinks(&c, seed, fd ? 1e-4 : 1e-6);
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

// Depthwise (groups = C): the CPU's channel-last kernels for one filter per channel, with
// channel counts that take their vectors of 32 and 8 channels and the scalar rest (43 =
// 32 + 8 + 3), stride 1 and 2, odd extents (the unread last row and column of a stride-2
// window), bias or none, ReLU, ReLU6 or none; a multiplier of 2 (filters = 2C) and a 5x5
// window.
static void test_conv_depthwise(void **state) {
    check_grouped(&(GroupSpec){.N = 2, .C = 43, .H = 7, .W = 6, .OC = 43, .K = 3, .stride = 1, .pad = 1,
                               .groups = 43, .nobias = true}, true, 90);
    check_grouped(&(GroupSpec){.N = 2, .C = 43, .H = 7, .W = 8, .OC = 43, .K = 3, .stride = 2, .pad = 1,
                               .groups = 43, .relu = true}, true, 91);
    check_grouped(&(GroupSpec){.N = 3, .C = 8, .H = 8, .W = 7, .OC = 8, .K = 3, .stride = 2, .pad = 0,
                               .groups = 8, .relu = false}, true, 92);
    check_grouped(&(GroupSpec){.N = 2, .C = 5, .H = 6, .W = 5, .OC = 10, .K = 3, .stride = 1, .pad = 1,
                               .groups = 5, .relu = true}, true, 93);
    check_grouped(&(GroupSpec){.N = 2, .C = 6, .H = 7, .W = 7, .OC = 12, .K = 3, .stride = 2, .pad = 1,
                               .groups = 6, .nobias = true}, true, 94);
    check_grouped(&(GroupSpec){.N = 2, .C = 9, .H = 9, .W = 8, .OC = 9, .K = 5, .stride = 1, .pad = 2,
                               .groups = 9, .relu = true}, true, 95);
    check_grouped(&(GroupSpec){.N = 2, .C = 43, .H = 6, .W = 7, .OC = 43, .K = 3, .stride = 1, .pad = 1,
                               .groups = 43, .relu6 = true}, true, 98);
    check_grouped(&(GroupSpec){.N = 2, .C = 5, .H = 6, .W = 5, .OC = 10, .K = 3, .stride = 2, .pad = 1,
                               .groups = 5, .relu6 = true}, true, 99);
    // Larger, against the reference backward alone (finite differences would take too long;
    // the small cases check the reference against them): a MobileNetV2 block's shape, and
    // one whose images are each a chunk of backward (2 * 64 x 48 x 48 floats of input and
    // output gradient per image, past the CPU's 2 MB chunk_bytes), 3 chunks in each of the
    // 2 threads' shares, the weight gradient summed over them.
    check_grouped(&(GroupSpec){.N = 4, .C = 96, .H = 14, .W = 14, .OC = 96, .K = 3, .stride = 1, .pad = 1,
                               .groups = 96, .nobias = true}, false, 96);
    check_grouped(&(GroupSpec){.N = 6, .C = 64, .H = 48, .W = 48, .OC = 64, .K = 3, .stride = 2, .pad = 1,
                               .groups = 64, .relu = true}, false, 97);
}

// Groups of several channels: 2 and 4 groups, with as many and with more filters than
// input channels, stride 2.
static void test_conv_grouped(void **state) {
    check_grouped(&(GroupSpec){.N = 2, .C = 4, .H = 6, .W = 5, .OC = 6, .K = 3, .stride = 1, .pad = 1,
                               .groups = 2, .relu = true}, true, 100);
    check_grouped(&(GroupSpec){.N = 2, .C = 8, .H = 7, .W = 6, .OC = 8, .K = 3, .stride = 2, .pad = 1,
                               .groups = 4, .nobias = true}, true, 101);
    check_grouped(&(GroupSpec){.N = 2, .C = 8, .H = 5, .W = 5, .OC = 12, .K = 1, .stride = 1, .pad = 0,
                               .groups = 4}, true, 102);
}

// Errors name the key: groups must divide both channel counts, and `algorithm` is conv's.
static void test_conv_grouped_errors(void **state) {
    const struct { const char *text; const char *says; } bad[] = {
        {"[conv]\nfilters = 6\nsize = 3\ngroups = 4\n", "groups = 4 must divide the input channels (8) and filters (6)"},
        {"[conv]\nfilters = 8\nsize = 3\ngroups = 3\n", "groups = 3 must divide"},
        {"[conv]\nfilters = 8\nsize = 3\ngroups = 8\nalgorithm = winograd\n", "algorithm = winograd is for groups = 1"},
        {"[conv]\nfilters = 8\nsize = 3\ngroups = 0\n", "groups"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Cfg cfg;
        Error err = {{0}};
        if (cfg_parse(&cfg, bad[i].text, "<test>", &err)) fail_msg("cfg_parse: %s", err.msg);
        Layer *l = NULL;
        const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 8, .h = 6, .w = 6}};
        assert_int_equal(conv_ops.create(&l, &a, &err), -1);
        if (!strstr(err.msg, bad[i].says)) fail_msg("'%s' does not say '%s'", err.msg, bad[i].says);
        cfg_free(&cfg);
    }
}

// Forward and din do not depend on the thread count (each output is its own sum); the
// weight gradient's shares do, and a given count repeats its bits. 1 thread and 2 against
// each other and themselves, through the layer.
static void test_conv_grouped_threads(void **state) {
    const GroupSpec s = {.N = 5, .C = 40, .H = 9, .W = 9, .OC = 40, .K = 3, .stride = 1, .pad = 1, .groups = 40,
                         .relu = true};
    char text[256];
    grouped_text(text, sizeof text, &s);
    float *out[3], *din[3], *dw[3];
    for (int run = 0; run < 3; run++) {
        cpu_set_threads(run == 0 ? 1 : 2);
        Case c;
        case_init(&c, &conv_ops, text, (Shape){.c = s.C, .h = s.H, .w = s.W}, s.N);
        case_fill(&c, 110);
        LayerCtx ctx = case_ctx(&c);
        case_forward(&c, &ctx, c.out, c.in);
        out[run] = xmalloc((size_t)c.nout * sizeof(float));
        memcpy(out[run], c.out, (size_t)c.nout * sizeof(float));
        memcpy(c.dout, c.rf, (size_t)c.nout * sizeof(float));
        memset(c.g[0], 0, (size_t)c.np[0] * sizeof(float));
        memset(c.g[1], 0, (size_t)c.np[1] * sizeof(float));
        case_backward(&c, &ctx, c.din, c.dout);
        din[run] = xmalloc((size_t)c.nin * sizeof(float));
        memcpy(din[run], c.din, (size_t)c.nin * sizeof(float));
        dw[run] = xmalloc((size_t)c.np[0] * sizeof(float));
        memcpy(dw[run], c.g[0], (size_t)c.np[0] * sizeof(float));
        const int64_t nout = c.nout, nin = c.nin, nw = c.np[0];
        case_free(&c);
        if (run == 0) continue;
        assert_memory_equal(out[0], out[run], (size_t)nout * sizeof(float));
        assert_memory_equal(din[0], din[run], (size_t)nin * sizeof(float));
        if (run == 2) assert_memory_equal(dw[1], dw[2], (size_t)nw * sizeof(float));
    }
    cpu_set_threads(2);
    for (int run = 0; run < 3; run++) free(out[run]), free(din[run]), free(dw[run]);
}

// The workspace: each share's weight gradient (2 shares, the suite's 2 threads), rounded to
// 16 floats; nothing else on the CPU.
static void test_conv_grouped_workspace(void **state) {
    const GroupSpec s = {.N = 8, .C = 30, .H = 10, .W = 10, .OC = 30, .K = 3, .stride = 1, .pad = 1, .groups = 30};
    char text[256];
    grouped_text(text, sizeof text, &s);
    Layer *l = layer_from_text(&conv_ops, text, (Shape){.c = s.C, .h = s.H, .w = s.W});
    assert_int_equal(cpu_kernels()->shard_count(), 2);
    assert_int_equal(l->ops->workspace_bytes(l, cpu_kernels(), s.N), 2 * 272 * sizeof(float));  // 270 -> 272
    assert_int_equal(l->ops->din_over_in(l), true);
    assert_int_equal(l->ops->backward_reads(l), BACKWARD_READS_IN);
    layer_free(l);
}

// im2col and col2im on their own, against direct loops: im2col exactly (it only copies),
// col2im (which sums overlapping patches) within float rounding; col2im overwrites.
static void test_im2col_col2im(void **state) {
    const int N = 2, H = 5, W = 7, C = 3, K = 3, S = 2, P = 1;
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, ckk = C * K * K;
    const int64_t nx = (int64_t)N * H * W * C, ncol = (int64_t)N * OH * OW * ckk;
    float *x = xmalloc(nx * sizeof(float)), *col = xmalloc(ncol * sizeof(float));
    float *back = xmalloc(nx * sizeof(float));
    double *want = xmalloc(nx * sizeof(double));
    rng_seed(80);
    fill_uniform(x, nx, -1, 1);
    fill_nan(col, ncol);
    cpu_kernels()->im2col(col, x, N, H, W, C, K, S, P, OH, OW);
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int ch = 0; ch < C; ch++)
                    for (int kh = 0; kh < K; kh++)
                        for (int kw = 0; kw < K; kw++) {
                            const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                            const float v = ih < 0 || ih >= H || iw < 0 || iw >= W
                                                ? 0.0f
                                                : x[(((int64_t)n * H + ih) * W + iw) * C + ch];
                            const int64_t r = ((int64_t)n * OH + oh) * OW + ow;
                            // Row: one output pixel; columns (kh, kw, c).
                            assert_true(col[r * ckk + (kh * K + kw) * C + ch] == v);
                        }
    fill_uniform(col, ncol, -1, 1);
    memset(want, 0, nx * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int ch = 0; ch < C; ch++)
                    for (int kh = 0; kh < K; kh++)
                        for (int kw = 0; kw < K; kw++) {
                            const int ih = oh * S - P + kh, iw = ow * S - P + kw;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            const int64_t r = ((int64_t)n * OH + oh) * OW + ow;
                            want[(((int64_t)n * H + ih) * W + iw) * C + ch] +=
                                col[r * ckk + (kh * K + kw) * C + ch];
                        }
    for (int64_t i = 0; i < nx; i++) back[i] = 1e30f;
    cpu_kernels()->col2im(back, col, N, H, W, C, K, S, P, OH, OW);
    expect_close("col2im", back, want, nx, 1e-6, 1.0);
    free(x), free(col), free(back), free(want);
}

// ---- linear ----------------------------------------------------------------------------------

static void check_linear(int N, int I, int O, Activation act, uint64_t seed) {
    char text[160];
    snprintf(text, sizeof text, "[linear]\nname = fc\noutputs = %d\nactivation = %s\n", O,
             activation_names[act]);
    Case c;
    case_init(&c, &linear_ops, text, (Shape){.c = I, .h = 1, .w = 1}, N);
    assert_int_equal(c.l->out.c, O);
    assert_int_equal(c.l->out.h, 1);
    assert_int_equal(c.l->out.w, 1);
    assert_string_equal(c.l->params[0].name, "fc.weight");
    assert_int_equal(c.l->params[0].ndim, 2);
    assert_int_equal(c.l->params[0].shape[0], O);  // PyTorch's (OUT, IN)
    assert_int_equal(c.l->params[0].shape[1], I);
    assert_string_equal(c.l->params[1].name, "fc.bias");
    c.relu = act != ACT_NONE, c.relu6 = act == ACT_RELU6;
    c.ref = linear_ref;
    c.fd = true;
    case_fill_away_from_kinks(&c, seed, 1e-4);
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

static void test_linear(void **state) {
    check_linear(3, 7, 5, ACT_NONE, 100);
    check_linear(4, 9, 6, ACT_RELU, 101);
    check_linear(1, 1, 1, ACT_NONE, 102);
    check_linear(5, 40, 3, ACT_RELU, 103);
    check_linear(4, 9, 6, ACT_RELU6, 104);  // MobileNetV2's classifier activation
    check_linear(6, 40, 9, ACT_RELU6, 105);
}

// ---- bf16 GEMMs (matmul = bf16; precision = bf16) ------------------------------------------
//
// Under gemm_arith(GEMM_BF16) a GEMM rounds both operands to bf16 (8 significant bits: each
// within 2^-9 of itself) and sums the products in fp32, so each output of a product is
// within 2^-8 of the sum of its products' magnitudes, plus fp32's summation error. Held
// here for every element of the forward output, din and the weight gradient against the
// double reference: |got - ref| <= 2^-7 * S + 1e-6 * max |ref|, where S is the same
// reference computed on the magnitudes |x|, |w| and |R| (every term positive). The
// Winograd path rounds transformed values (sums of inputs, of weights), whose products S
// does not bound term by term: it is held to 2^-6 * S, twice the direct bound (measured on
// AMX: 32% of the direct bound, as the direct products' 13-54%). Where the CPU has BF16
// instructions the largest error of each product must also exceed fp32's (FWD_TOL of the
// largest value): the operands were rounded. The bias gradient is a sum in fp32: fp32's.

// dx = W^T R, dW = R^T x, db = sum R (linear_ref without an activation).
static void linear_ref_backward(const Case *c, const double *R, double *dx, double **dw) {
    const int I = c->l->in.c, O = c->l->out.c;
    memset(dx, 0, (size_t)c->nin * sizeof(double));
    memset(dw[0], 0, (size_t)c->np[0] * sizeof(double));
    memset(dw[1], 0, (size_t)c->np[1] * sizeof(double));
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < O; o++) {
            const double r = R[(int64_t)n * O + o];
            dw[1][o] += r;
            for (int i = 0; i < I; i++) {
                dw[0][(int64_t)o * I + i] += r * c->x[(int64_t)n * I + i];
                dx[(int64_t)n * I + i] += r * c->w[0][(int64_t)o * I + i];
            }
        }
}

// Each element within `bound` * mag[i] + 1e-6 * max |ref| of ref; `rounded`: the largest
// error beyond fp32's where the CPU has BF16 instructions.
static void expect_bf16_bound(const char *what, const float *got, const double *ref, const double *mag,
                                int64_t n, double bound, bool rounded) {
    double big = 0, worst = 0, used = 0;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]), lim = bound * mag[i] + 1e-6 * big;
        if (!(e <= lim)) fail_msg("%s: [%lld] got %.9g, want %.9g: error %.3g over the bound %.3g", what,
                                  (long long)i, (double)got[i], ref[i], e, lim);
        worst = fmax(worst, e);
        used = fmax(used, e / lim);
    }
    print_message("bf16 %s: max error %.3g of the largest value, %.0f%% of the bound\n", what, worst / big,
                  100 * used);
    if (rounded && cpu_bf16_gemm_name() && !(worst > FWD_TOL * big))
        fail_msg("%s: max error %.3g of the largest value is fp32's: the GEMM did not round", what, worst / big);
}

// A case filled (no activation) and its analytic backward: forward, din and the
// parameter gradients under GEMM_BF16 against the double references and their magnitudes.
static void check_bf16(Case *c, RefBwd refb, double bound, const char *what) {
    double *ref = xmalloc((size_t)c->nout * sizeof(double)), *mag = xmalloc((size_t)c->nout * sizeof(double));
    double *rx = xmalloc((size_t)c->nin * sizeof(double)), *mx = xmalloc((size_t)c->nin * sizeof(double));
    double *rw[MAXP] = {0}, *mw[MAXP] = {0};
    for (int j = 0; j < c->nt; j++) {
        rw[j] = xmalloc((size_t)c->np[j] * sizeof(double));
        mw[j] = xmalloc((size_t)c->np[j] * sizeof(double));
    }
    c->ref(c, ref);
    refb(c, c->R, rx, rw);
    // The magnitudes: the references on |x|, |w| and |R|.
    for (int64_t i = 0; i < c->nin; i++) c->x[i] = fabs(c->x[i]);
    for (int j = 0; j < c->nt; j++)
        for (int64_t i = 0; i < c->np[j]; i++) c->w[j][i] = fabs(c->w[j][i]);
    for (int64_t i = 0; i < c->nout; i++) c->R[i] = fabs(c->R[i]);
    c->ref(c, mag);
    refb(c, c->R, mx, mw);
    case_sync(c);

    const Kernels *k = cpu_kernels();
    k->gemm_arith(GEMM_BF16);
    LayerCtx ctx = case_ctx(c);
    case_forward(c, &ctx, c->out, c->in);
    memcpy(c->out_fwd, c->out, (size_t)c->nout * sizeof(float));
    for (int j = 0; j < c->nt; j++) memset(c->g[j], 0, (size_t)c->np[j] * sizeof(float));
    run_backward(c, c->din);
    k->gemm_arith(GEMM_FP32);
    char name[160];
    snprintf(name, sizeof name, "%s forward", what);
    expect_bf16_bound(name, c->out, ref, mag, c->nout, bound, true);
    snprintf(name, sizeof name, "%s din", what);
    expect_bf16_bound(name, c->din, rx, mx, c->nin, bound, true);
    for (int j = 0; j < c->nt; j++) {
        snprintf(name, sizeof name, "%s %s", what, c->t[j]->name);
        expect_bf16_bound(name, c->g[j], rw[j], mw[j], c->np[j], bound, j == 0);
        free(rw[j]), free(mw[j]);
    }
    free(ref), free(mag), free(rx), free(mx);
}

static void check_conv_bf16(const ConvSpec *s, uint64_t seed, const char *what) {
    char text[256];
    conv_text(text, sizeof text, s);
    Case c;
    case_init(&c, &conv_ops, text, (Shape){.c = s->C, .h = s->H, .w = s->W}, s->N);
    c.K = s->K, c.stride = s->stride, c.pad = s->pad, c.nobias = s->nobias;
    c.ref = conv_ref;
    case_fill(&c, seed);
    const bool winograd = s->algorithm && !strcmp(s->algorithm, "winograd");
    check_bf16(&c, conv_ref_backward, winograd ? 0x1p-6 : 0x1p-7, what);
    case_free(&c);
}

static void test_bf16_gemm_layers(void **state) {
    // im2col + GEMM (3x3, padded; strided), the bf16 GEMM's views (channels in and out
    // multiples of 32: stride 1, with the input gradient as a convolution, and stride 2),
    // a 1x1 convolution read in place, a strided 1x1 (a ResNet's downsample), Winograd, the
    // linear layer. Products of at least 32 columns over at least 32 k (thinner ones the
    // CPU runs in fp32: nn/cpu_kernels.c bf16_product).
    check_conv_bf16(&(ConvSpec){.N = 2, .C = 8, .H = 7, .W = 6, .OC = 32, .K = 3, .stride = 1, .pad = 1,
                                .algorithm = "gemm"}, 300, "conv 3x3");
    check_conv_bf16(&(ConvSpec){.N = 3, .C = 6, .H = 9, .W = 8, .OC = 36, .K = 3, .stride = 2, .pad = 1,
                                .nobias = true}, 301, "conv 3x3 stride 2");
    check_conv_bf16(&(ConvSpec){.N = 2, .C = 32, .H = 6, .W = 7, .OC = 32, .K = 3, .stride = 1, .pad = 1,
                                .algorithm = "gemm"}, 306, "conv 3x3 views");
    check_conv_bf16(&(ConvSpec){.N = 2, .C = 32, .H = 7, .W = 8, .OC = 64, .K = 3, .stride = 2, .pad = 1,
                                .nobias = true}, 307, "conv 3x3 stride 2 views");
    check_conv_bf16(&(ConvSpec){.N = 2, .C = 40, .H = 5, .W = 5, .OC = 33, .K = 1, .stride = 1, .pad = 0},
                    302, "conv 1x1");
    check_conv_bf16(&(ConvSpec){.N = 2, .C = 48, .H = 8, .W = 8, .OC = 32, .K = 1, .stride = 2, .pad = 0,
                                .nobias = true}, 303, "conv 1x1 stride 2");
    check_conv_bf16(&(ConvSpec){.N = 4, .C = 32, .H = 12, .W = 12, .OC = 40, .K = 3, .stride = 1, .pad = 1,
                                .algorithm = "winograd"}, 304, "conv winograd");
    Case c;
    case_init(&c, &linear_ops, "[linear]\nname = fc\noutputs = 32\n", (Shape){.c = 64, .h = 1, .w = 1}, 40);
    c.ref = linear_ref;
    case_fill(&c, 305);
    check_bf16(&c, linear_ref_backward, 0x1p-7, "linear");
    case_free(&c);
}

// ---- relu, maxpool, flatten, log_softmax ----------------------------------------------------

static void test_relu(void **state) {
    Case c;
    case_init(&c, &relu_ops, "[relu]\n", (Shape){.c = 3, .h = 4, .w = 5}, 2);
    assert_string_equal(c.l->name, "relu1");  // the default name: type and count
    assert_int_equal(c.l->nparams, 0);
    rng_seed(200);
    fill_distinct(c.in, c.nin);  // at least 0.005 from the kink at 0
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.ref = relu_ref;
    c.fd = true;
    check_forward(&c);
    for (int64_t i = 0; i < c.nout; i++)  // exact, not just close
        assert_true(c.out[i] == (c.in[i] > 0 ? c.in[i] : 0.0f));
    check_backward(&c);
    case_free(&c);
}

static void relu6_ref(const Case *c, double *out) {
    for (int64_t i = 0; i < c->nout; i++) out[i] = act_ref(ACT_RELU6, c->x[i]);
}

// [relu6], PyTorch's nn.ReLU6: inputs 0.2 apart over [-12, 12], at least 0.1 from 0 and 6.
static void test_relu6(void **state) {
    Case c;
    case_init(&c, &relu6_ops, "[relu6]\n", (Shape){.c = 3, .h = 4, .w = 5}, 2);
    assert_string_equal(c.l->name, "relu61");  // the default name: type and count
    assert_int_equal(c.l->nparams, 0);
    rng_seed(201);
    fill_distinct(c.in, c.nin);
    for (int64_t i = 0; i < c.nin; i++) c.in[i] *= 20;
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.ref = relu6_ref;
    c.fd = true;
    check_forward(&c);
    for (int64_t i = 0; i < c.nout; i++)  // exact, not just close
        assert_true(c.out[i] == (c.in[i] > 6 ? 6.0f : c.in[i] > 0 ? c.in[i] : 0.0f));
    check_backward(&c);
    case_free(&c);
}

// The activations' elementwise kernels at and around the kinks: forward exactly clamp(x),
// NaN to 0 as ReLU's; the gradient PyTorch's hardtanh_backward (0 at x <= 0 and x >= 6),
// read from the output; add_act and the in-place mask that a sum's backward uses.
static void test_relu6_kernels(void **state) {
    const Kernels *k = cpu_kernels();
    enum { N = 203 };  // vector blocks and a remainder
    float x[N], a[N], y[N], s[N], d[N], din[N];
    const float special[] = {0.0f, -0.0f, 6.0f, 5.9999995f, 6.0000005f, 1e-30f, -1e-30f,
                             INFINITY, -INFINITY, NAN, 3.0f, 12.0f, -2.0f};
    rng_seed(202);
    for (int i = 0; i < N; i++) {
        x[i] = i < (int)(sizeof special / sizeof *special) ? special[i] : frand(-10, 10);
        a[i] = frand(-4, 4);
        d[i] = frand(-1, 1);
    }
    for (int act = ACT_RELU; act < ACT_COUNT; act++) {
        const float top = act == ACT_RELU6 ? 6.0f : INFINITY;
        k->relu_forward(y, x, N, (Activation)act);
        for (int i = 0; i < N; i++) s[i] = x[i] - a[i];
        k->add_act(s, s, a, N, (Activation)act);  // in place: act(x - a + a)
        for (int i = 0; i < N; i++) {
            const float want = x[i] > 0 ? (x[i] < top ? x[i] : top) : 0.0f;
            if (memcmp(&y[i], &want, 4)) fail_msg("%s forward of %g: %g, want %g", activation_names[act], x[i], y[i], want);
            const float v = (x[i] - a[i]) + a[i], wv = v > 0 ? (v < top ? v : top) : 0.0f;
            if (memcmp(&s[i], &wv, 4)) fail_msg("add_act %s at %d: %g, want %g", activation_names[act], i, s[i], wv);
        }
        k->relu_backward(din, d, y, N, (Activation)act);
        memcpy(s, d, sizeof d);
        k->bias_act_backward(NULL, s, y, N, 1, (Activation)act);  // in place, as a sum's backward
        for (int i = 0; i < N; i++) {
            const bool pass = x[i] > 0 && (act == ACT_RELU || x[i] < 6);
            const float want = pass ? d[i] : 0.0f;
            if (memcmp(&din[i], &want, 4) || memcmp(&s[i], &want, 4))
                fail_msg("%s backward at x = %g: %g and %g, want %g", activation_names[act], x[i], din[i], s[i], want);
        }
    }
}

static void check_pool(const LayerOps *ops, int N, int C, int H, int W, int K, int S, int P,
                       uint64_t seed) {
    char text[96];
    snprintf(text, sizeof text, "[%s]\nsize = %d\nstride = %d\npad = %d\n", ops->type, K, S, P);
    Case c;
    case_init(&c, ops, text, (Shape){.c = C, .h = H, .w = W}, N);
    assert_int_equal(c.l->out.c, C);
    assert_int_equal(c.l->out.h, (H + 2 * P - K) / S + 1);
    assert_int_equal(c.l->out.w, (W + 2 * P - K) / S + 1);
    rng_seed(seed);
    fill_distinct(c.in, c.nin);  // no ties: finite differences see one maximum
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.K = K, c.stride = S, c.pad = P;
    c.ref = ops == &maxpool_ops ? maxpool_ref : avgpool_ref;
    c.fd = true;
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

static void test_maxpool(void **state) {
    check_pool(&maxpool_ops, 2, 3, 7, 8, 2, 2, 0, 300);  // the last row is left out (floor mode)
    check_pool(&maxpool_ops, 2, 2, 9, 7, 3, 2, 0, 301);  // overlapping windows share elements
    check_pool(&maxpool_ops, 1, 4, 4, 4, 2, 1, 0, 302);  // stride 1
    check_pool(&maxpool_ops, 2, 3, 6, 8, 2, 2, 0, 303);  // windows tile the input: din written without zeroing
    check_pool(&maxpool_ops, 2, 3, 7, 8, 3, 2, 1, 304);  // the ResNet stem's 3x3, stride 2, pad 1
    check_pool(&maxpool_ops, 2, 2, 5, 5, 2, 1, 1, 305);  // padding larger than the overhang
    // The default stride is the size.
    Layer *l = layer_from_text(&maxpool_ops, "[maxpool]\nsize = 3\n", (Shape){.c = 2, .h = 9, .w = 7});
    assert_int_equal(l->out.h, 3);
    assert_int_equal(l->out.w, 2);
    layer_free(l);
    // Padding never wins: an all-negative input pools to its own maxima, not to 0.
    l = layer_from_text(&maxpool_ops, "[maxpool]\nsize = 3\nstride = 2\npad = 1\n",
                        (Shape){.c = 1, .h = 3, .w = 3});
    const float in[9] = {-9, -8, -7, -6, -5, -4, -3, -2, -1};
    float out[4];
    uint8_t argmax[4];
    l->inner = argmax;
    LayerCtx ctx = {.k = cpu_kernels(), .train = true};
    l->ops->forward(l, &ctx, out, in, 1);
    const float want[4] = {-5, -4, -2, -1};
    // Each window's argmax, kh * 3 + kw from its padded corner: the centre (1, 1) of the
    // first window is the input's (0, 0) ... the last window's (0, 0) is its (2, 2).
    const uint8_t want_arg[4] = {8, 7, 5, 4};
    for (int i = 0; i < 4; i++) {
        if (out[i] != want[i]) fail_msg("padded maxpool out[%d] = %g, want %g", i, out[i], want[i]);
        if (argmax[i] != want_arg[i]) fail_msg("padded maxpool argmax[%d] = %d, want %d", i, argmax[i], want_arg[i]);
    }
    layer_free(l);
    // The argmax is a byte: windows up to 15 x 15.
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, "[maxpool]\nsize = 16\n", "t.cfg", &err)) fail_msg("%s", err.msg);
    LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 1, .h = 32, .w = 32}};
    assert_int_equal(maxpool_ops.create(&l, &a, &err), -1);
    assert_non_null(strstr(err.msg, "size"));
    cfg_free(&cfg);
}

// Average pooling counts the padding as zeros (PyTorch's count_include_pad): every window
// divides by K * K.
static void test_avgpool(void **state) {
    check_pool(&avgpool_ops, 2, 3, 7, 6, 3, 2, 1, 310);
    check_pool(&avgpool_ops, 2, 2, 5, 5, 2, 2, 0, 311);  // the last row and column left out
    check_pool(&avgpool_ops, 1, 4, 4, 5, 3, 1, 1, 312);  // overlapping, stride 1
    Layer *l = layer_from_text(&avgpool_ops, "[avgpool]\nsize = 2\npad = 1\n", (Shape){.c = 1, .h = 2, .w = 2});
    const float in[4] = {4, 8, 12, 16};
    float out[4];
    LayerCtx ctx = {.k = cpu_kernels(), .train = true};
    l->ops->forward(l, &ctx, out, in, 1);
    for (int i = 0; i < 4; i++) assert_true(out[i] == in[i] / 4);  // one pixel of four
    layer_free(l);
    // A padding over half the window is PyTorch's error too.
    Cfg cfg;
    Error err = {{0}};
    assert_int_equal(cfg_parse(&cfg, "[avgpool]\nsize = 3\npad = 2\n", "t.cfg", &err), 0);
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 1, .h = 8, .w = 8}};
    assert_int_equal(avgpool_ops.create(&l, &a, &err), -1);
    assert_non_null(strstr(err.msg, "pad"));
    cfg_free(&cfg);
}

static void test_global_avgpool(void **state) {
    Case c;
    case_init(&c, &global_avgpool_ops, "[global_avgpool]\nname = avgpool\n",
              (Shape){.c = 4, .h = 5, .w = 3}, 3);
    assert_int_equal(c.l->out.c, 4);
    assert_int_equal(c.l->out.h, 1);
    assert_int_equal(c.l->out.w, 1);
    rng_seed(320);
    fill_uniform(c.in, c.nin, -1, 1);
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.ref = global_avgpool_ref;
    c.fd = true;
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

// ---- batchnorm ----------------------------------------------------------------------------------

static void check_batchnorm(int N, int C, int H, int W, Activation act, uint64_t seed) {
    char text[96];
    snprintf(text, sizeof text, "[batchnorm]\nname = bn\nactivation = %s\n", activation_names[act]);
    Case c;
    case_init(&c, &batchnorm_ops, text, (Shape){.c = C, .h = H, .w = W}, N);
    Layer *l = c.l;
    // PyTorch's state_dict: weight, bias, then the buffers.
    assert_int_equal(l->nparams, 2);
    assert_string_equal(l->params[0].name, "bn.weight");
    assert_string_equal(l->params[1].name, "bn.bias");
    assert_int_equal(l->nbuffers, 3);
    assert_string_equal(l->buffers[0].name, "bn.running_mean");
    assert_string_equal(l->buffers[1].name, "bn.running_var");
    assert_string_equal(l->buffers[2].name, "bn.num_batches_tracked");
    assert_int_equal(l->buffers[1].shape[0], C);
    assert_int_equal(l->buffers[2].dtype, DT_I64);
    assert_int_equal(l->buffers[2].ndim, 0);
    float *rm = l->buffers[0].data, *rv = l->buffers[1].data;
    int64_t *tracked = l->buffers[2].data;
    for (int ch = 0; ch < C; ch++) assert_true(rm[ch] == 0.0f && rv[ch] == 1.0f);
    c.relu = act != ACT_NONE, c.relu6 = act == ACT_RELU6;
    c.ref = bn_ref;
    c.fd = true;
    case_fill_away_from_kinks(&c, seed, 1e-4);
    // Training mode: the batch's statistics, and their gradient.
    check_forward(&c);
    check_backward(&c);

    // The running statistics moved once, by momentum 0.1 with the unbiased variance.
    const int64_t rows = c.nin / C;
    assert_true(C <= 128);
    double *y = xmalloc((size_t)c.nin * sizeof(double)), mean[128], var[128];
    bn_d(y, c.x, c.w[0], c.w[1], rows, C, false, mean, var);
    assert_int_equal(*tracked, 1);
    for (int ch = 0; ch < C; ch++) {
        const double want_m = 0.1 * mean[ch], want_v = 0.9 + 0.1 * var[ch];
        if (!(fabs(rm[ch] - want_m) <= 1e-6 && fabs(rv[ch] - want_v) <= 1e-6))
            fail_msg("channel %d: running_mean %.9g (want %.9g), running_var %.9g (want %.9g)",
                     ch, rm[ch], want_m, rv[ch], want_v);
    }

    // A recomputed forward (checkpointing) of another input reuses the first forward's
    // statistics and moves nothing.
    LayerCtx ctx = case_ctx(&c);
    ctx.recompute = true;
    float *in2 = xmalloc((size_t)c.nin * sizeof(float)), *out2 = xmalloc((size_t)c.nout * sizeof(float));
    for (int64_t i = 0; i < c.nin; i++) in2[i] = c.in[i] * 2 + 1;
    const float rm0 = rm[0], rv0 = rv[0];
    case_forward(&c, &ctx, out2, in2);
    assert_true(rm[0] == rm0 && rv[0] == rv0 && *tracked == 1);
    for (int64_t i = 0; i < c.nin; i++) {
        const int ch = (int)(i % C);
        const double want = act_ref(act, (2 * c.x[i] + 1 - mean[ch]) / sqrt(var[ch] * (rows - 1) / rows + 1e-5) *
                                                 c.w[0][ch] + c.w[1][ch]);
        if (!(fabs(out2[i] - want) <= 1e-4 * fmax(1, fabs(want))))
            fail_msg("recomputed output %lld: %g, want %g", (long long)i, out2[i], want);
    }

    // Evaluation: the running statistics, nothing moves.
    ctx.recompute = false;
    ctx.train = false;
    case_forward(&c, &ctx, out2, c.in);
    assert_true(rm[0] == rm0 && rv[0] == rv0 && *tracked == 1);
    for (int64_t i = 0; i < c.nin; i++) {
        const int ch = (int)(i % C);
        const double want = act_ref(act, (c.x[i] - rm[ch]) / sqrt((double)rv[ch] + 1e-5) * c.w[0][ch] + c.w[1][ch]);
        if (!(fabs(out2[i] - want) <= 1e-5 * fmax(1, fabs(want))))
            fail_msg("evaluation output %lld: %g, want %g", (long long)i, out2[i], want);
    }
    // A second training forward: running = 0.9 * running + 0.1 * batch, counted.
    ctx.train = true;
    case_forward(&c, &ctx, out2, c.in);
    assert_int_equal(*tracked, 2);
    for (int ch = 0; ch < C; ch++) {
        const double want_m = 0.9 * 0.1 * mean[ch] + 0.1 * mean[ch];
        const double want_v = 0.9 * (0.9 + 0.1 * var[ch]) + 0.1 * var[ch];
        if (!(fabs(rm[ch] - want_m) <= 1e-6 && fabs(rv[ch] - want_v) <= 1e-6))
            fail_msg("second step, channel %d: running_mean %.9g (want %.9g), running_var %.9g "
                     "(want %.9g)", ch, rm[ch], want_m, rv[ch], want_v);
    }
    // Frozen with its running statistics (freeze, freeze_bn): training normalises as
    // evaluation does, moves nothing, and its input gradient is the affine map's, dout *
    // gamma / sqrt(running_var + eps) where the ReLU passes.
    l->frozen = l->frozen_stats = true;
    l->grads[0] = l->grads[1] = NULL;
    ctx = case_ctx(&c);
    const float rm2 = rm[0], rv2 = rv[0];
    case_forward(&c, &ctx, c.out, c.in);
    assert_true(rm[0] == rm2 && rv[0] == rv2 && *tracked == 2);
    float *din = xmalloc((size_t)c.nin * sizeof(float));
    memcpy(c.dout, c.rf, (size_t)c.nout * sizeof(float));
    case_backward(&c, &ctx, din, c.dout);
    for (int64_t i = 0; i < c.nin; i++) {
        const int ch = (int)(i % C);
        const double z = (c.x[i] - rm[ch]) / sqrt((double)rv[ch] + 1e-5) * c.w[0][ch] + c.w[1][ch];
        const double want = act_ref_passes(act, z) ? c.R[i] * c.w[0][ch] / sqrt((double)rv[ch] + 1e-5) : 0;
        if (!(fabs(c.out[i] - act_ref(act, z)) <= 1e-5 * fmax(1, fabs(z))))
            fail_msg("frozen output %lld: %g, want %g", (long long)i, c.out[i], z);
        if (!(fabs(din[i] - want) <= 1e-5 * fmax(1, fabs(want))))
            fail_msg("frozen din %lld: %g, want %g", (long long)i, din[i], want);
    }
    free(din);
    free(y), free(in2), free(out2);
    case_free(&c);
}

// The batch sums go sample after sample (kernels.h): over consecutive chunks of 1, 3 and
// the rest of the samples they give one call's bits, for x's sums and backward's (with and
// without ReLU), at sample sizes of one row (BatchNorm1d), a few, and more than a block's.
static void test_batchnorm_sums_chunked(void **state) {
    static const int shapes[][3] = {{9, 5, 1}, {7, 70, 49}, {5, 16, 12544}, {6, 130, 2100}};  // samples, C, rows
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int N = shapes[t][0], C = shapes[t][1];
        const int64_t sr = shapes[t][2], rows = N * sr, n = rows * C;
        rng_seed(77 + t);
        float *x = xmalloc((size_t)n * sizeof(float)), *dy = xmalloc((size_t)n * sizeof(float));
        float *st = xmalloc(4 * (size_t)C * sizeof(float));
        fill_uniform(x, n, -2, 3);
        fill_uniform(dy, n, -1, 1);
        fill_uniform(st, 4 * (int64_t)C, 0.5, 1.5);  // mean, invstd, gamma, beta
        for (int pass = 0; pass < 3; pass++) {  // x's sums; backward's, ReLU and none
            double *one = calloc(2 * (size_t)C, sizeof(double)), *chunked = calloc(2 * (size_t)C, sizeof(double));
            assert_true(one && chunked);
            const Activation act = pass == 1 ? ACT_RELU : ACT_NONE;
            for (int way = 0; way < 2; way++)
                for (int64_t s0 = 0, i = 0; s0 < N;) {
                    int64_t k = way == 0 ? N : i == 0 ? 1 : i == 1 ? 3 : N;
                    if (s0 + k > N) k = N - s0;
                    i++;
                    double *acc = way ? chunked : one;
                    const float *xs = x + s0 * sr * C, *ds = dy + s0 * sr * C;
                    if (pass == 0) cpu_kernels()->bn_sums(acc, xs, k * sr, sr, C);
                    else cpu_kernels()->bn_backward_sums(acc, ds, xs, NULL, st, st + C, st + 2 * C, st + 3 * C, k * sr, sr, C, act);
                    s0 += k;
                }
            if (memcmp(one, chunked, 2 * (size_t)C * sizeof(double)))
                fail_msg("batchnorm sums, %d samples of %lld rows, C = %d, pass %d: chunks differ from one call",
                         N, (long long)sr, C, pass);
            free(one), free(chunked);
        }
        free(x), free(dy), free(st);
    }
}

static void test_batchnorm(void **state) {
    check_batchnorm(4, 3, 3, 2, ACT_NONE, 330);  // BatchNorm2d: statistics over samples and pixels
    check_batchnorm(3, 5, 2, 2, ACT_RELU, 331);  // with a ReLU after it
    check_batchnorm(6, 4, 1, 1, ACT_NONE, 332);  // BatchNorm1d, after a linear layer
    check_batchnorm(2, 70, 2, 3, ACT_RELU, 333); // more channels than the kernels' blocks of 64
    check_batchnorm(3, 5, 2, 2, ACT_RELU6, 334); // MobileNetV2's BN + ReLU6
    check_batchnorm(2, 70, 2, 3, ACT_RELU6, 335);
}

// ---- residual blocks -----------------------------------------------------------------------

static void check_residual(int N, int C, int H, int W, int filters, int stride, const char *ds,
                           int nt, uint64_t seed) {
    char text[160];
    snprintf(text, sizeof text, "[residual]\nname = layer2.0\nfilters = %d\nstride = %d\n"
             "downsample = %s\n", filters, stride, ds);
    Case c;
    case_init(&c, &residual_ops, text, (Shape){.c = C, .h = H, .w = W}, N);
    // torchvision's names, in its state_dict order.
    static const char *const names[] = {
        "layer2.0.conv1.weight", "layer2.0.bn1.weight", "layer2.0.bn1.bias",
        "layer2.0.conv2.weight", "layer2.0.bn2.weight", "layer2.0.bn2.bias",
        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
        "layer2.0.downsample.1.bias"};
    assert_int_equal(c.nt, nt);
    for (int j = 0; j < nt; j++) assert_string_equal(c.t[j]->name, names[j]);
    assert_string_equal(c.l->children[3]->buffers[0].name, "layer2.0.bn2.running_mean");
    assert_int_equal(c.l->out.c, filters);
    assert_int_equal(c.l->out.h, (H + 2 - 3) / stride + 1);
    c.stride = stride;
    c.ref = residual_ref;
    c.fd = true;
    double *z = xmalloc((size_t)c.nout * sizeof(double));
    for (int tries = 0;; tries++) {  // no ReLU input within reach of a finite-difference step
        assert_true(tries < 100);
        case_fill(&c, seed + (uint64_t)tries);
        g_kink_margin = INFINITY;
        c.ref(&c, z);
        if (g_kink_margin > 1e-4) break;
    }
    free(z);
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

// Finite differences through a block, its batchnorms' gammas scaled by gamma_spread (so
// that ReLU6 inputs land on both sides of 6 too).
static void check_block_fd(Case *c, uint64_t seed, float gamma_spread) {
    c->fd = true;
    double *z = xmalloc((size_t)c->nout * sizeof(double));
    for (int tries = 0;; tries++) {  // no ReLU input within reach of a finite-difference step
        assert_true(tries < 100);
        case_fill(c, seed + (uint64_t)tries);
        for (int j = 0; j < c->nt; j++)
            if (c->t[j]->ndim == 1 && strstr(c->t[j]->name, ".weight"))
                for (int64_t i = 0; i < c->np[j]; i++) c->p[j][i] *= gamma_spread;
        case_sync(c);
        g_kink_margin = INFINITY;
        c->ref(c, z);
        if (g_kink_margin > 1e-4) break;
    }
    free(z);
    check_forward(c);
    check_backward(c);
}

static void check_bottleneck(int N, int C, int H, int W, int planes, int stride, int nt, uint64_t seed) {
    char text[160];
    snprintf(text, sizeof text, "[residual]\nname = layer1.0\nblock = bottleneck\nfilters = %d\n"
             "stride = %d\n", planes, stride);
    Case c;
    case_init(&c, &residual_ops, text, (Shape){.c = C, .h = H, .w = W}, N);
    static const char *const names[] = {
        "layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
        "layer1.0.conv2.weight", "layer1.0.bn2.weight", "layer1.0.bn2.bias",
        "layer1.0.conv3.weight", "layer1.0.bn3.weight", "layer1.0.bn3.bias",
        "layer1.0.downsample.0.weight", "layer1.0.downsample.1.weight", "layer1.0.downsample.1.bias"};
    assert_int_equal(c.nt, nt);
    for (int j = 0; j < nt; j++) assert_string_equal(c.t[j]->name, names[j]);
    assert_string_equal(c.l->children[5]->buffers[0].name, "layer1.0.bn3.running_mean");
    assert_int_equal(c.l->out.c, 4 * planes);
    assert_int_equal(c.l->out.h, (H + 2 - 3) / stride + 1);
    c.stride = stride;
    c.ref = bottleneck_ref;
    check_block_fd(&c, seed, 1);
    case_free(&c);
}

static void check_inverted(int N, int C, int H, int W, int filters, double expand, int stride,
                           const char *const *names, int nt, uint64_t seed) {
    char text[200];
    snprintf(text, sizeof text, "[residual]\nname = features.2\nblock = inverted\nexpand = %g\n"
             "filters = %d\nstride = %d\n", expand, filters, stride);
    Case c;
    case_init(&c, &residual_ops, text, (Shape){.c = C, .h = H, .w = W}, N);
    assert_int_equal(c.nt, nt);
    for (int j = 0; j < nt; j++) assert_string_equal(c.t[j]->name, names[j]);
    assert_int_equal(c.l->out.c, filters);
    assert_int_equal(c.l->out.h, (H + 2 - 3) / stride + 1);
    c.stride = stride;
    c.ref = inverted_ref;
    check_block_fd(&c, seed, RELU6_SPREAD);
    case_free(&c);
}

static void test_inverted_residual(void **state) {
    static const char *const expanded[] = {
        "features.2.conv.0.0.weight", "features.2.conv.0.1.weight", "features.2.conv.0.1.bias",
        "features.2.conv.1.0.weight", "features.2.conv.1.1.weight", "features.2.conv.1.1.bias",
        "features.2.conv.2.weight", "features.2.conv.3.weight", "features.2.conv.3.bias"};
    static const char *const unexpanded[] = {
        "features.2.conv.0.0.weight", "features.2.conv.0.1.weight", "features.2.conv.0.1.bias",
        "features.2.conv.1.weight", "features.2.conv.2.weight", "features.2.conv.2.bias"};
    check_inverted(2, 4, 5, 4, 4, 2, 1, expanded, 9, 360);    // the identity added
    check_inverted(2, 4, 5, 5, 6, 3, 2, expanded, 9, 361);    // stride 2: nothing added
    check_inverted(2, 3, 4, 4, 5, 1.5, 1, expanded, 9, 362);  // hidden round(4.5) = 4 (even)
    check_inverted(2, 4, 4, 3, 4, 1, 1, unexpanded, 6, 363);  // expand 1, as features.1
}

// The general block: the same bits whether written out or made by [residual]; members named
// under the block, by their place where they have no name; errors for lists that cannot be.
static void test_block(void **state) {
    check_bottleneck(2, 3, 4, 4, 2, 1, 12, 350);  // 3 channels into 8: downsample
    check_bottleneck(2, 8, 5, 4, 2, 2, 12, 351);  // stride 2
    check_bottleneck(2, 8, 4, 3, 2, 1, 9, 352);   // identity shortcut

    Case c;
    case_init(&c, &block_ops,
              "[block]\nname = blk\n[conv]\nfilters = 5\nsize = 3\npad = 1\n[batchnorm]\nactivation = relu\n"
              "[conv]\nname = proj\nfilters = 3\nsize = 1\nbias = 0\n[end]\n",
              (Shape){.c = 3, .h = 4, .w = 3}, 2);
    static const char *const names[] = {"blk.0.weight", "blk.0.bias", "blk.1.weight", "blk.1.bias",
                                        "blk.proj.weight"};
    assert_int_equal(c.nt, 5);
    for (int j = 0; j < 5; j++) assert_string_equal(c.t[j]->name, names[j]);
    c.ref = block_ref;
    check_block_fd(&c, 353, 1);
    case_free(&c);

    static const struct {
        const char *text, *says;
    } bad[] = {
        {"[block]\n[conv]\nfilters = 3\nsize = 1\n", "has no [end]"},
        {"[block]\n[end]\n", "has no body"},
        {"[block]\n[conv]\nfilters = 4\nsize = 1\n[end]\n", "cannot add"},
        {"[block]\nadd = 0\n[conv]\nfilters = 4\nsize = 1\n[shortcut]\n[conv]\nfilters = 4\nsize = 1\n[end]\n",
         "nothing would read it"},
        {"[block]\n[conv]\nfilters = 3\nsize = 1\n[shortcut]\n[end]\n", "no layers after it"},
        {"[block]\n[conv]\nfilters = 3\nsize = 1\n[shortcut]\n[shortcut]\n[conv]\nfilters = 3\nsize = 1\n[end]\n",
         "a second [shortcut]"},
        {"[block]\nadd = auto\nactivation = relu\n[conv]\nfilters = 4\nsize = 1\n[end]\n", "adds nothing"},
        {"[block]\n[train]\n[end]\n", "inside the [block]"},
        {"[block]\n[pool]\n[end]\n", "unknown section [pool]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Cfg cfg;
        Error err = {{0}};
        assert_int_equal(cfg_parse(&cfg, bad[i].text, "t.cfg", &err), 0);
        Layer *l = NULL;
        const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 3, .h = 4, .w = 4}};
        assert_int_equal(block_ops.create(&l, &a, &err), -1);
        if (!strstr(err.msg, bad[i].says)) fail_msg("%s: %s", bad[i].text, err.msg);
        assert_non_null(strstr(err.msg, "t.cfg:"));
        cfg_free(&cfg);
    }
}

static void test_residual(void **state) {
    check_residual(2, 3, 4, 4, 3, 1, "auto", 6, 340);  // identity shortcut
    check_residual(2, 3, 5, 4, 4, 2, "auto", 9, 341);  // stride 2 and more channels: downsample
    check_residual(2, 2, 3, 3, 4, 1, "auto", 9, 342);  // more channels only
    check_residual(2, 3, 4, 3, 3, 1, "1", 9, 343);     // a downsample asked for
    // An identity shortcut cannot add different shapes.
    Cfg cfg;
    Error err = {{0}};
    assert_int_equal(cfg_parse(&cfg, "[residual]\nfilters = 8\nstride = 2\ndownsample = 0\n",
                               "t.cfg", &err), 0);
    Layer *l = NULL;
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 4, .h = 8, .w = 8}};
    assert_int_equal(residual_ops.create(&l, &a, &err), -1);
    assert_non_null(strstr(err.msg, "t.cfg:1:"));
    assert_non_null(strstr(err.msg, "downsample"));
    cfg_free(&cfg);
}

// PyTorch's tie rule: the gradient goes to the first maximum of the window in (kh, kw)
// order, and windows that share their maximum each add to it.
static void test_maxpool_ties(void **state) {
    Layer *l = layer_from_text(&maxpool_ops, "[maxpool]\nsize = 2\n", (Shape){.c = 1, .h = 2, .w = 4});
    // Two windows: all equal, and the maximum 7 at (0, 1) and (1, 0).
    const float in[8] = {5, 5, 1, 7, 5, 5, 7, 2};
    float out[2], dout[2] = {1.5f, -2.0f}, din[8];
    uint8_t argmax[2];
    l->inner = argmax;
    LayerCtx ctx = {.k = cpu_kernels(), .train = true};
    l->ops->forward(l, &ctx, out, in, 1);
    assert_true(out[0] == 5.0f && out[1] == 7.0f);
    assert_int_equal(l->ops->backward_reads(l), 0);
    l->ops->backward(l, &ctx, din, dout, NULL, NULL, 1);  // from the argmax alone
    const float want[8] = {1.5f, 0, 0, -2.0f, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++)
        if (din[i] != want[i]) fail_msg("din[%d] = %g, want %g", i, din[i], want[i]);
    layer_free(l);

    // Size 3, stride 2 on one row of 5: the shared centre column is both windows' max.
    l = layer_from_text(&maxpool_ops, "[maxpool]\nsize = 3\nstride = 2\n", (Shape){.c = 1, .h = 3, .w = 5});
    float in2[15] = {0}, out2[2], dout2[2] = {0.25f, 0.5f}, din2[15];
    in2[5 + 2] = 9;  // row 1, column 2
    l->inner = argmax;
    l->ops->forward(l, &ctx, out2, in2, 1);
    assert_true(out2[0] == 9.0f && out2[1] == 9.0f);
    l->ops->backward(l, &ctx, din2, dout2, NULL, NULL, 1);
    for (int i = 0; i < 15; i++) assert_true(din2[i] == (i == 7 ? 0.75f : 0.0f));
    layer_free(l);

    // A padded window of -inf alone (an fp16 overflow upstream): its gradient goes to the
    // window's first pixel inside the image, as in PyTorch, never to the padding.
    l = layer_from_text(&maxpool_ops, "[maxpool]\nsize = 3\nstride = 2\npad = 1\n", (Shape){.c = 1, .h = 2, .w = 2});
    const float inf4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float out3[1], dout3[1] = {2.5f}, din3[4];
    l->inner = argmax;
    l->ops->forward(l, &ctx, out3, inf4, 1);
    assert_true(out3[0] == -INFINITY);
    assert_int_equal(argmax[0], 4);  // (1, 1) from the padded corner: the image's (0, 0)
    l->ops->backward(l, &ctx, din3, dout3, NULL, NULL, 1);
    for (int i = 0; i < 4; i++) assert_true(din3[i] == (i == 0 ? 2.5f : 0.0f));
    layer_free(l);
}

static void test_flatten_permutation(void **state) {
    const int N = 2, H = 3, W = 4, C = 5;
    Case c;
    case_init(&c, &flatten_ops, "[flatten]\n", (Shape){.c = C, .h = H, .w = W}, N);
    assert_int_equal(c.l->out.c, C * H * W);
    assert_int_equal(c.l->out.h, 1);
    assert_int_equal(c.l->out.w, 1);
    // Each value names its own (n, h, w, c), exactly representable.
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++)
                for (int ch = 0; ch < C; ch++)
                    c.in[((n * H + h) * W + w) * C + ch] = (float)(n * 1000 + h * 100 + w * 10 + ch);
    LayerCtx ctx = case_ctx(&c);
    c.l->ops->forward(c.l, &ctx, c.out, c.in, N);
    // PyTorch's x.view(N, -1) of (N, C, H, W): feature (c * H + h) * W + w.
    for (int n = 0; n < N; n++)
        for (int ch = 0; ch < C; ch++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++) {
                    const float got = c.out[n * C * H * W + (ch * H + h) * W + w];
                    if (got != (float)(n * 1000 + h * 100 + w * 10 + ch))
                        fail_msg("feature (n %d, c %d, h %d, w %d) = %g", n, ch, h, w, got);
                }
    // Backward is the inverse permutation: din at (n, h, w, c) is dout at that feature.
    for (int64_t i = 0; i < c.nout; i++) c.dout[i] = (float)i;
    c.l->ops->backward(c.l, &ctx, c.din, c.dout, c.in, c.out, N);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++)
                for (int ch = 0; ch < C; ch++)
                    assert_true(c.din[((n * H + h) * W + w) * C + ch] ==
                                (float)(n * C * H * W + (ch * H + h) * W + w));
    // And the generic checks (finite differences of a permutation are exact).
    rng_seed(400);
    fill_uniform(c.in, c.nin, -1, 1);
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.ref = flatten_ref;
    c.fd = true;
    check_forward(&c);
    check_backward(&c);
    case_free(&c);
}

static void test_log_softmax(void **state) {
    Case c;
    case_init(&c, &log_softmax_ops, "[log_softmax]\n", (Shape){.c = 6, .h = 1, .w = 1}, 3);
    rng_seed(500);
    fill_uniform(c.in, c.nin, -3, 3);
    fill_uniform(c.rf, c.nout, -1, 1);
    case_sync(&c);
    c.ref = log_softmax_ref;
    c.fd = true;
    check_forward(&c);
    check_backward(&c);
    // Rows of probabilities sum to 1.
    for (int n = 0; n < 3; n++) {
        double s = 0;
        for (int i = 0; i < 6; i++) s += exp(c.out[n * 6 + i]);
        assert_true(fabs(s - 1) < 1e-6);
    }
    case_free(&c);

    // Large logits do not overflow: exp(1000) is inf in float and in double.
    Layer *l = layer_from_text(&log_softmax_ops, "[log_softmax]\n", (Shape){.c = 3, .h = 1, .w = 1});
    const float in[6] = {1000, 999, 998, -1000, -1001, -1002};
    float out[6];
    LayerCtx ctx = {.k = cpu_kernels(), .train = true};
    l->ops->forward(l, &ctx, out, in, 2);
    // log(1 + e^-1 + e^-2) = 0.40760596444...; the rows differ only by a shift.
    const double lse = 0.4076059644443806;
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            if (!(fabs(out[r * 3 + i] - (-i - lse)) < 1e-4))
                fail_msg("log_softmax of large logits: out[%d] = %g, want %g", r * 3 + i,
                         out[r * 3 + i], -i - lse);
    layer_free(l);

    // A flat input is required: the message says to add [flatten].
    Cfg cfg;
    Error err = {{0}};
    assert_int_equal(cfg_parse(&cfg, "\n[log_softmax]\n", "t.cfg", &err), 0);
    l = (Layer *)1;
    const LayerArgs a = {.cfg = &cfg, .s = &cfg.sections[0], .in = {.c = 2, .h = 3, .w = 3}};
    assert_int_equal(log_softmax_ops.create(&l, &a, &err), -1);
    assert_non_null(strstr(err.msg, "t.cfg:2:"));
    assert_non_null(strstr(err.msg, "[flatten]"));
    cfg_free(&cfg);
}

// ---- dropout ----------------------------------------------------------------------------------

// The CPU kernel (vectorised, in parallel blocks) against rng.h's definition element by
// element, bit for bit: a length that ends mid-block and mid-vector, an odd offset, and
// several p, with the in-kernel scaling of kept elements.
static void test_dropout_kernel(void **state) {
    const int64_t n = 100003;
    float *in = xmalloc(n * sizeof(float)), *out = xmalloc(n * sizeof(float));
    rng_seed(601);
    fill_uniform(in, n, -2, 2);
    const float ps[] = {0.0f, 0.1f, 0.25f, 0.5f, 0.9f};
    for (size_t t = 0; t < sizeof ps / sizeof ps[0]; t++) {
        const uint64_t key = rng_key(5, RNG_STREAM_DROPOUT, 11 + t, 2), offset = 12345;
        fill_nan(out, n);
        cpu_kernels()->dropout_forward(out, in, n, ps[t], key, offset);
        const float scale = 1.0f / (1.0f - ps[t]);
        for (int64_t i = 0; i < n; i++) {
            const float want = rng_uniform(key, offset + (uint64_t)i) >= ps[t] ? in[i] * scale : 0.0f;
            if (memcmp(&out[i], &want, sizeof want) != 0)
                fail_msg("p = %g, element %lld: %g, want %g", ps[t], (long long)i, out[i], want);
        }
    }
    free(in), free(out);
}

static void test_dropout(void **state) {
    const int N = 4;
    const float p = 0.3f;
    const Shape shape = {.c = 8, .h = 16, .w = 16};  // 2048 a sample, 8192 in all
    Case c;
    case_init(&c, &dropout_ops, "[dropout]\np = 0.3\n", shape, N);
    c.l->index = 3;  // the network's layer index is part of the key
    rng_seed(600);
    for (int64_t i = 0; i < c.nin; i++)  // never 0: a zero output then means dropped
        c.in[i] = frand(0.5f, 1.5f) * (urand() < 0.5 ? -1.0f : 1.0f);
    fill_uniform(c.rf, c.nout, -1, 1);
    LayerCtx ctx = {.k = cpu_kernels(), .seed = 42, .step = 7, .sample0 = 0, .train = true};
    c.l->ops->forward(c.l, &ctx, c.out, c.in, N);

    // The mask is DESIGN.md's: element i kept iff rng_uniform(key, i) >= p, with
    // key = rng_key(seed, RNG_STREAM_DROPOUT, step, layer index).
    const uint64_t key = rng_key(42, RNG_STREAM_DROPOUT, 7, 3);
    int64_t dropped = 0;
    bool *kept = xmalloc((size_t)c.nin);
    for (int64_t i = 0; i < c.nin; i++) {
        kept[i] = rng_uniform(key, (uint64_t)i) >= p;
        if ((c.out[i] != 0.0f) != kept[i]) fail_msg("element %lld: mask differs from rng.h", (long long)i);
        if (!kept[i]) {
            dropped++;
            continue;
        }
        // Kept elements are scaled by 1/(1-p) (inverted dropout).
        const double want = c.in[i] / (1.0 - (double)p);
        if (!(fabs(c.out[i] - want) <= 1e-6 * fabs(want)))
            fail_msg("element %lld: %g, want %g", (long long)i, c.out[i], want);
    }
    // About p of them: 8192 draws give a standard deviation of 0.005 on the fraction.
    const double frac = (double)dropped / (double)c.nin;
    if (fabs(frac - p) > 0.025) fail_msg("dropped fraction %g, want about %g", frac, p);

    // Backward: the same mask and scale on the gradient.
    memcpy(c.dout, c.rf, (size_t)c.nout * sizeof(float));
    fill_nan(c.din, c.nin);
    c.l->ops->backward(c.l, &ctx, c.din, c.dout, c.in, c.out, N);
    for (int64_t i = 0; i < c.nin; i++) {
        const double want = kept[i] ? c.rf[i] / (1.0 - (double)p) : 0.0;
        if (!(fabs(c.din[i] - want) <= 1e-6 * fabs(want)))
            fail_msg("din[%lld] = %g, want %g", (long long)i, c.din[i], want);
    }

    // A micro-batch of the last two samples (sample0 = 2) draws the same masks as the
    // whole batch did for them: accumulation and recomputation rely on it.
    const int64_t half = 2 * shape_numel(shape);
    float *part = xmalloc((size_t)half * sizeof(float));
    LayerCtx ctx2 = ctx;
    ctx2.sample0 = 2;
    c.l->ops->forward(c.l, &ctx2, part, c.in + half, 2);
    assert_memory_equal(part, c.out + half, (size_t)half * sizeof(float));

    // Another step draws another mask (about 2p(1-p) = 42% of the elements differ).
    ctx2 = ctx;
    ctx2.step = 8;
    float *other = xmalloc((size_t)c.nout * sizeof(float));
    c.l->ops->forward(c.l, &ctx2, other, c.in, N);
    int64_t differ = 0;
    for (int64_t i = 0; i < c.nout; i++) differ += (other[i] == 0.0f) != (c.out[i] == 0.0f);
    assert_true(differ > c.nout / 4);

    // Eval mode is the identity, bit for bit.
    ctx2 = ctx;
    ctx2.train = false;
    c.l->ops->forward(c.l, &ctx2, other, c.in, N);
    assert_memory_equal(other, c.in, (size_t)c.nin * sizeof(float));
    free(part);
    free(other);
    free(kept);
    case_free(&c);

    // p = 0 keeps everything, in forward and backward.
    case_init(&c, &dropout_ops, "[dropout]\np = 0\n", shape, 1);
    fill_uniform(c.in, c.nin, -1, 1);
    fill_uniform(c.dout, c.nout, -1, 1);
    memcpy(c.rf, c.dout, (size_t)c.nout * sizeof(float));
    c.l->ops->forward(c.l, &ctx, c.out, c.in, 1);
    assert_memory_equal(c.out, c.in, (size_t)c.nin * sizeof(float));
    c.l->ops->backward(c.l, &ctx, c.din, c.dout, c.in, c.out, 1);
    assert_memory_equal(c.din, c.rf, (size_t)c.nin * sizeof(float));
    case_free(&c);
}

// ---- NLL loss ----------------------------------------------------------------------------------

// Label smoothing (issue 33): PyTorch's F.cross_entropy(logits, y, label_smoothing=0.1)
// and its gradient in the logits, computed in double by torch 1.13 for these numbers
// (mean over 3 samples), against log_softmax, nll_loss with smoothing 0.1 and
// log_softmax_backward: within float rounding.
static void test_label_smoothing(void **state) {
    const float logits[12] = {0.5f, -1.25f, 2.0f, 0.125f, 1.5f, 0.25f, -0.75f, -2.0f,
                              -0.5f, 3.0f, 0.0f, 1.0f};
    const int32_t labels[3] = {0, 3, 1};
    const double torch_loss = 1.9825268762109236;
    const double torch_grad[12] = {
        -0.255779912049121, 0.0007990819250368061, 0.2271947604449931, 0.027786069679091117,
        0.22606157844851074, 0.05882193325178609, 0.01637170860971963, -0.3012552203100165,
        -5.0908401030031504e-05, -0.0340570883861679, 0.005322076825532191, 0.028785919961665865};
    float logp[12], dlogp[12], din[12], metrics[2] = {0, 0};
    cpu_kernels()->log_softmax_forward(logp, logits, 3, 4);
    cpu_kernels()->nll_loss(dlogp, metrics, logp, labels, 3, 4, 1.0f / 3, 0.1f, NULL);
    cpu_kernels()->log_softmax_backward(din, dlogp, logp, 3, 4);
    if (!(fabs(metrics[0] / 3 - torch_loss) < 1e-6 * torch_loss))
        fail_msg("smoothed loss %.9g, torch %.9g", metrics[0] / 3, torch_loss);
    for (int i = 0; i < 12; i++)
        if (!(fabs(din[i] - torch_grad[i]) < 1e-6))
            fail_msg("gradient [%d]: %.9g, torch %.9g", i, din[i], torch_grad[i]);
    // Without smoothing the targets are one-hot: zeros stay +0.
    cpu_kernels()->nll_loss(dlogp, metrics, logp, labels, 3, 4, 1.0f, 0.0f, NULL);
    for (int i = 0; i < 12; i++) assert_true(dlogp[i] == (i % 4 == labels[i / 4] ? -1.0f : 0.0f) && !signbit(dlogp[i]) == (i % 4 != labels[i / 4]));
}

static void test_nll_loss(void **state) {
    const int N = 5, C = 4;
    float logp[20], dlogp[20];
    double x[20], ref[20];
    const int32_t labels[5] = {0, 3, 1, 1, 2};
    rng_seed(700);
    for (int i = 0; i < N * C; i++) x[i] = frand(-2, 2);
    log_softmax_rows(ref, x, N, C);
    for (int i = 0; i < N * C; i++) logp[i] = (float)ref[i];
    double want_loss = 0;
    int want_correct = 0;
    for (int n = 0; n < N; n++) {
        want_loss -= logp[n * C + labels[n]];
        int best = 0;
        for (int k = 1; k < C; k++)
            if (logp[n * C + k] > logp[n * C + best]) best = k;
        want_correct += best == labels[n];
    }
    // Random data could make the accuracy trivially 0 or N; the test must see both kinds.
    assert_true(want_correct > 0 && want_correct < N);

    // metrics accumulate onto what is there.
    float metrics[2] = {1.5f, 2.0f};
    for (int i = 0; i < N * C; i++) dlogp[i] = NAN;
    const float scale = 1.0f / N;
    cpu_kernels()->nll_loss(dlogp, metrics, logp, labels, N, C, scale, 0.0f, NULL);
    assert_true(fabs(metrics[0] - (1.5 + want_loss)) < 1e-5 * (1.5 + want_loss));
    assert_true(metrics[1] == 2.0f + want_correct);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < C; k++)
            assert_true(dlogp[n * C + k] == (k == labels[n] ? -scale : 0.0f));
    // A loss scaler's scale multiplies the gradient (as a float), not the metrics.
    const ScalerState scaler = {.scale = 3000.5};
    metrics[0] = metrics[1] = 0;
    cpu_kernels()->nll_loss(dlogp, metrics, logp, labels, N, C, scale, 0.0f, &scaler);
    assert_true(fabs(metrics[0] - want_loss) < 1e-5 * want_loss);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < C; k++)
            assert_true(dlogp[n * C + k] == (k == labels[n] ? -(scale * 3000.5f) : 0.0f));

    // Without a gradient buffer: metrics only.
    metrics[0] = metrics[1] = 0;
    cpu_kernels()->nll_loss(NULL, metrics, logp, labels, N, C, scale, 0.0f, NULL);
    assert_true(fabs(metrics[0] - want_loss) < 1e-5 * want_loss);
    assert_true(metrics[1] == (float)want_correct);

    // A hand-made case: log-probabilities of (0.5, 0.25, 0.25) with label 1:
    // loss log 4 = 1.3862944, wrong argmax.
    const float lp[3] = {logf(0.5f), logf(0.25f), logf(0.25f)};
    const int32_t lab = 1;
    metrics[0] = metrics[1] = 0;
    cpu_kernels()->nll_loss(NULL, metrics, lp, &lab, 1, 3, 1.0f, 0.0f, NULL);
    assert_true(fabs(metrics[0] - 1.3862944f) < 1e-6);
    assert_true(metrics[1] == 0.0f);

    // The loss through log_softmax: mean NLL(log_softmax(x)) has the gradient
    // (softmax(x) - onehot) / N; check log_softmax_backward of nll_loss's gradient against
    // central differences of the double loss.
    float xf[20], din[20];
    for (int i = 0; i < N * C; i++) xf[i] = (float)x[i];
    cpu_kernels()->log_softmax_forward(logp, xf, N, C);
    cpu_kernels()->nll_loss(dlogp, metrics, logp, labels, N, C, scale, 0.0f, NULL);
    cpu_kernels()->log_softmax_backward(din, dlogp, logp, N, C);
    double fd[20];
    for (int i = 0; i < N * C; i++) {
        double lv[2];
        for (int s = 0; s < 2; s++) {
            double xs[20];
            memcpy(xs, x, sizeof xs);
            xs[i] += s ? -FD_H : FD_H;
            log_softmax_rows(ref, xs, N, C);
            double l = 0;
            for (int n = 0; n < N; n++) l -= ref[n * C + labels[n]];
            lv[s] = l / N;
        }
        fd[i] = (lv[0] - lv[1]) / (2 * FD_H);
    }
    expect_close("d mean NLL(log_softmax) / dx", din, fd, N * C, GRAD_TOL, 1.0);
}

// The layout kernels move every element to its place: shapes on both sides of the 8 x 8
// blocks (a convolution weight's rows: H = 1, W = K*K; images and their edges).
static void test_layout_transposes(void **state) {
    (void)state;
    const Kernels *k = cpu_kernels();
    static const int shapes[][4] = {{3, 1, 9, 37}, {2, 1, 9, 256}, {2, 5, 7, 16}, {1, 3, 3, 8}, {4, 8, 8, 3},
                                    {1, 16, 17, 24}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], H = shapes[s][1], W = shapes[s][2], C = shapes[s][3];
        const int64_t hw = (int64_t)H * W, n = N * hw * C;
        float *in = malloc(n * sizeof *in), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        assert_non_null(in), assert_non_null(a), assert_non_null(b);
        for (int64_t i = 0; i < n; i++) in[i] = (float)i;
        k->nhwc_to_nchw(a, in, N, H, W, C);
        k->nchw_to_nhwc(b, a, N, H, W, C);
        for (int i = 0; i < N; i++)
            for (int64_t p = 0; p < hw; p++)
                for (int c = 0; c < C; c++) {
                    const int64_t nhwc = (i * hw + p) * C + c, nchw = ((int64_t)i * C + c) * hw + p;
                    if (a[nchw] != in[nhwc] || b[nhwc] != in[nhwc])
                        fail_msg("%dx%dx%dx%d: element (%d, %lld, %d): %g and %g back, expected %g", N, H, W, C, i,
                                 (long long)p, c, a[nchw], b[nhwc], in[nhwc]);
                }
        free(in), free(a), free(b);
    }
}

int main(void) {
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_stride2_pad1_relu),
        cmocka_unit_test(test_conv_c1_no_activation),
        cmocka_unit_test(test_conv_direct_vector_blocks),
        cmocka_unit_test(test_conv_pointwise),
        cmocka_unit_test(test_conv_relu6),
        cmocka_unit_test(test_conv_1x1_strided_and_padded),
        cmocka_unit_test(test_conv_k5_pad2),
        cmocka_unit_test(test_conv_without_bias),
        cmocka_unit_test(test_conv_unused_border),
        cmocka_unit_test(test_conv_chunked_batch),
        cmocka_unit_test(test_conv_winograd),
        cmocka_unit_test(test_conv_winograd_pass),
        cmocka_unit_test(test_layout_transposes),
        cmocka_unit_test(test_conv_depthwise),
        cmocka_unit_test(test_conv_grouped),
        cmocka_unit_test(test_conv_grouped_errors),
        cmocka_unit_test(test_conv_grouped_threads),
        cmocka_unit_test(test_conv_grouped_workspace),
        cmocka_unit_test(test_im2col_col2im),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_bf16_gemm_layers),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_relu6),
        cmocka_unit_test(test_relu6_kernels),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_maxpool_ties),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_global_avgpool),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_residual),
        cmocka_unit_test(test_block),
        cmocka_unit_test(test_inverted_residual),
        cmocka_unit_test(test_batchnorm_sums_chunked),
        cmocka_unit_test(test_flatten_permutation),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_dropout_kernel),
        cmocka_unit_test(test_nll_loss),
        cmocka_unit_test(test_label_smoothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
