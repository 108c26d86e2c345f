// test_net.c: the network as a whole (nn/net.c with the layers, the loss and Adadelta).
//
//   - the seed network of models/mnist.cfg: shapes, names, 609,354 parameters;
//   - the memory plan: every category equals a sum computed here from the shapes, and
//     the blocks are that large (written end to end: ASan catches a short block);
//   - cfg errors name the line;
//   - whole-network gradients against central differences of a double-precision
//     reference of the same network;
//   - micro-batches accumulate to the full batch's gradients;
//   - determinism: the same seed gives the same bits after 20 training steps;
//   - a short training run on a synthetic IDX data set through the loader: the loss falls
//     and the accuracy exceeds 90%.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../data/dataset.h"
#include "../nn/cfg.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/mt19937.h"
#include "../nn/rng.h"
#include "testutil.h"

// The suite's optimizer (PyTorch's Adadelta defaults) and the options of its networks.
static const Optimizer adadelta = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};

static const NetOptions *netopts_as(int batch, bool bytes) {
    static NetOptions o;
    o = (NetOptions){.batch = batch, .precision = DT_F32, .input_bytes = bytes};
    optim_plan(&adadelta, &o);
    return &o;
}

static const NetOptions *netopts(int batch) { return netopts_as(batch, false); }

static char g_root[PATH_MAX] = ".";  // the repository, for models/mnist.cfg
static char g_dir[PATH_MAX];         // a temporary directory for the IDX files

// ---- helpers ------------------------------------------------------------------------------


static Cfg parse(const char *text) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, text, "t.cfg", &err)) fail_msg("cfg_parse: %s", err.msg);
    return cfg;
}

// bytes: the input holds bytes, as the trainer's (NetOptions.input_bytes).
static void make_net_as(Net *net, const char *text, Shape input, int classes, int batch, bool bytes) {
    Cfg cfg = parse(text);
    Error err = {{0}};
    if (net_create(net, &cfg, input, classes, netopts_as(batch, bytes), cpu_kernels(), &err))
        fail_msg("net_create: %s", err.msg);
    cfg_free(&cfg);  // the network keeps what it needs
}

static void make_net(Net *net, const char *text, Shape input, int classes, int batch) {
    make_net_as(net, text, input, classes, batch, false);
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

static int64_t sum_numel(const Net *net) {
    int64_t n = 0;
    for (int i = 0; i < net->nlayers; i++)
        for (int j = 0; j < net->layers[i]->nparams; j++) n += tensor_numel(&net->layers[i]->params[j]);
    return n;
}

// ---- the seed network --------------------------------------------------------------------

static void load_mnist_cfg(Cfg *cfg) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/models/mnist.cfg", g_root);
    Error err = {{0}};
    if (cfg_load(cfg, path, &err)) fail_msg("%s", err.msg);
}

typedef struct LayerWant {
    const char *name, *type;
    int c, h, w;
    int64_t params;
} LayerWant;

// DESIGN.md's seed network for 1x28x28 input.
static const LayerWant mnist_layers[] = {
    {"conv1", "conv", 32, 26, 26, 32 * 1 * 9 + 32},
    {"conv2", "conv", 64, 24, 24, 64 * 32 * 9 + 64},
    {"maxpool1", "maxpool", 64, 12, 12, 0},
    {"dropout1", "dropout", 64, 12, 12, 0},
    {"flatten1", "flatten", 9216, 1, 1, 0},
    {"fc1", "linear", 64, 1, 1, 9216 * 64 + 64},
    {"dropout2", "dropout", 64, 1, 1, 0},
    {"fc2", "linear", 10, 1, 1, 64 * 10 + 10},
    {"log_softmax1", "log_softmax", 10, 1, 1, 0},
};
#define MNIST_NLAYERS ((int)(sizeof mnist_layers / sizeof mnist_layers[0]))

static void test_mnist_network(void **state) {
    Cfg cfg;
    load_mnist_cfg(&cfg);
    Net net;
    Error err = {{0}};
    if (net_create(&net, &cfg, (Shape){.c = 1, .h = 28, .w = 28}, 10, netopts(64), cpu_kernels(), &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    assert_int_equal(net.nparams, 609354);
    assert_int_equal(sum_numel(&net), 609354);
    assert_int_equal(net.nlayers, MNIST_NLAYERS);
    for (int i = 0; i < MNIST_NLAYERS; i++) {
        const Layer *l = net.layers[i];
        const LayerWant *w = &mnist_layers[i];
        assert_string_equal(l->name, w->name);
        assert_string_equal(l->ops->type, w->type);
        assert_int_equal(l->index, i);
        assert_int_equal(l->out.c, w->c);
        assert_int_equal(l->out.h, w->h);
        assert_int_equal(l->out.w, w->w);
        int64_t p = 0;
        for (int j = 0; j < l->nparams; j++) p += tensor_numel(&l->params[j]);
        assert_int_equal(p, w->params);
        // Each layer's input is the previous layer's output.
        const Shape in = i ? net.layers[i - 1]->out : (Shape){.c = 1, .h = 28, .w = 28};
        assert_memory_equal(&l->in, &in, sizeof in);
    }
    // PyTorch's state_dict names and shapes.
    const Layer *conv1 = net.layers[0], *fc1 = net.layers[5];
    assert_string_equal(conv1->params[0].name, "conv1.weight");
    assert_int_equal(conv1->params[0].ndim, 4);
    const int64_t conv1_shape[4] = {32, 1, 3, 3};
    assert_memory_equal(conv1->params[0].shape, conv1_shape, sizeof conv1_shape);
    assert_string_equal(fc1->params[0].name, "fc1.weight");
    assert_int_equal(fc1->params[0].shape[0], 64);
    assert_int_equal(fc1->params[0].shape[1], 9216);
    assert_string_equal(net.layers[7]->params[1].name, "fc2.bias");
    // Tensors lie in the blocks in layer order, without gaps.
    int64_t off = 0;
    for (int i = 0; i < net.nlayers; i++)
        for (int j = 0; j < net.layers[i]->nparams; j++) {
            assert_ptr_equal(net.layers[i]->params[j].data, net.params + off);
            assert_ptr_equal(net.layers[i]->grads[j], net.grads + off);
            off += tensor_numel(&net.layers[i]->params[j]);
        }
    assert_int_equal(off, net.nparams);
    net_free(&net);
}

// PyTorch's default init: U(-b, b) with b = 1/sqrt(fan_in) for weights and biases alike
// (up to the rounding of kaiming_uniform's arithmetic), a pure function of the seed.
static void test_init_params(void **state) {
    Cfg cfg;
    load_mnist_cfg(&cfg);
    Net a, b;
    Error err = {{0}};
    const Shape in = {.c = 1, .h = 28, .w = 28};
    assert_int_equal(net_create(&a, &cfg, in, 10, netopts(1), cpu_kernels(), &err), 0);
    assert_int_equal(net_create(&b, &cfg, in, 10, netopts(1), cpu_kernels(), &err), 0);
    cfg_free(&cfg);
    assert_int_equal(net_init_params(&a, 1, &err), 0);
    assert_int_equal(net_init_params(&b, 1, &err), 0);
    assert_memory_equal(a.params, b.params, (size_t)a.nparams * sizeof(float));
    const double fan_in[] = {1 * 9, 32 * 9, 9216, 64};
    const int with_params[] = {0, 1, 5, 7};
    for (int k = 0; k < 4; k++) {
        const Layer *l = a.layers[with_params[k]];
        const double bound = (1 + 1e-6) / sqrt(fan_in[k]);
        for (int j = 0; j < l->nparams; j++) {
            const float *p = l->params[j].data;
            const int64_t n = tensor_numel(&l->params[j]);
            double lo = INFINITY, hi = -INFINITY, mean = 0;
            for (int64_t i = 0; i < n; i++) {
                lo = fmin(lo, p[i]), hi = fmax(hi, p[i]);
                mean += p[i] / (double)n;
            }
            if (lo < -bound || hi > bound) fail_msg("%s outside +-%g", l->params[j].name, bound);
            // The large tensors fill their range and centre on 0 (n >= 288 draws).
            if (n >= 288) {
                assert_true(lo < -0.9 * bound && hi > 0.9 * bound);
                assert_true(fabs(mean) < 0.2 * bound);
            }
        }
    }
    assert_int_equal(net_init_params(&b, 2, &err), 0);
    assert_memory_not_equal(a.params, b.params, (size_t)a.nparams * sizeof(float));
    net_free(&a);
    net_free(&b);
}

// MT19937's published check value: the 10,000th output for the default seed 5489.
static void test_mt19937_reference(void **state) {
    (void)state;
    Mt19937 mt;
    mt19937_seed(&mt, 5489);
    uint32_t x = 0;
    for (int i = 0; i < 10000; i++) x = mt19937_u32(&mt);
    assert_int_equal(x, 4123659995u);
}

// The initial weights for seed 1 are PyTorch's for torch.manual_seed(1) and the same
// modules, bit for bit: the first and last element of every tensor, printed by
// tests/torch_init_reference.py from Debian's python3-torch 1.13.
static void test_init_matches_pytorch(void **state) {
    (void)state;
    static const struct {
        const char *name;
        uint32_t first, last;
    } torch_seed1[] = {
        {"conv1.weight", 0x3e2fe063u, 0x3e8f9b60u},  // 0.171754405 .. 0.280482292
        {"conv1.bias", 0xbd815310u, 0x3dfc124bu},  // -0.0631467104 .. 0.123081766
        {"conv2.weight", 0xbc3f1a7bu, 0x3b5caf3du},  // -0.0116640283 .. 0.00336737861
        {"conv2.bias", 0xbcd37b2du, 0xbcd6a69cu},  // -0.0258155707 .. -0.0262024924
        {"fc1.weight", 0x3bb643a3u, 0x3b5083d6u},  // 0.00556226214 .. 0.00318168616
        {"fc1.bias", 0x3c18a46cu, 0x3af8a9b6u},  // 0.00931654498 .. 0.00189714762
        {"fc2.weight", 0xbc64bfc0u, 0x3db8059cu},  // -0.0139617324 .. 0.089854449
        {"fc2.bias", 0x3c4917a0u, 0x3dbf9a40u},  // 0.012273699 .. 0.0935559273
    };
    Cfg cfg;
    load_mnist_cfg(&cfg);
    Net net;
    Error err = {{0}};
    assert_int_equal(net_create(&net, &cfg, (Shape){.c = 1, .h = 28, .w = 28}, 10,
                                netopts(1), cpu_kernels(), &err),
                     0);
    cfg_free(&cfg);
    assert_int_equal(net_init_params(&net, 1, &err), 0);
    size_t checked = 0;
    for (int i = 0; i < net.nlayers; i++) {
        const Layer *l = net.layers[i];
        for (int j = 0; j < l->nparams; j++, checked++) {
            assert_true(checked < sizeof torch_seed1 / sizeof torch_seed1[0]);
            assert_string_equal(l->params[j].name, torch_seed1[checked].name);
            const float *p = l->params[j].data;
            uint32_t first, last;
            memcpy(&first, &p[0], 4);
            memcpy(&last, &p[tensor_numel(&l->params[j]) - 1], 4);
            assert_int_equal(first, torch_seed1[checked].first);
            assert_int_equal(last, torch_seed1[checked].last);
        }
    }
    assert_int_equal(checked, sizeof torch_seed1 / sizeof torch_seed1[0]);
    net_free(&net);
}

// ---- the memory plan --------------------------------------------------------------------

// The plan of the seed network for a batch of B, from its shapes alone:
//   params = grads = 609,354 * 4 bytes; optimizer = 2 * params (square_avg, acc_delta);
//   activations kept from forward for backward (live at the loss):
//               align64(B * 784 * 4)                  the input batch
//             + align64(B * numel(out) * 4)           the outputs that a backward reads:
//               for conv1, conv2, flatten, fc1        conv1's and conv2's (their relu and
//               and the second dropout                the next layer's input), ...; not
//                                                     maxpool's (its backward needs only
//                                                     its argmax), the first dropout's
//                                                     (flatten reads nothing back), fc2's
//             + align64(B * 9,216)                    maxpool's argmax, a byte an output
//             + 2 * align64(B * 10 * 4)               the log-probabilities and dlogp
//             + align64(B * 4) + align64(2 * 4)       labels, metrics
//             + align64(32)                           the loss scaler's state
//   workspace = the larger of conv1's (the direct kernels' partial sums: 64 blocks x (9
//               taps + 1) x 32 filters x 4 = 81,920 bytes) and conv2's Winograd workspace (32 ->
//               64 channels, 24x24 outputs: 144 tiles an image; its transformed weight and
//               gradient 262,144 bytes, and for each of the 2 shards a chunk of 1 image,
//               919,552 bytes, and its dU and dbias, 131,328: winograd_workspace in testutil.c);
//   threads = the GEMM's packing buffers of each thread (cpu_kernels()->thread_scratch).
// The block itself is checked by expect_activation_layout and the poisoned steps of
// test_segments.c.
static void expect_mnist_plan(const Net *net, int B) {
    const size_t f = sizeof(float);
    assert_int_equal(net->plan.params, 609354 * f);
    assert_int_equal(net->plan.grads, 609354 * f);
    assert_int_equal(net->plan.optimizer, 2 * 609354 * f);
    size_t kept = align64((size_t)B * 784 * f);
    const int read_back[] = {0, 1, 4, 5, 6};
    for (int k = 0; k < 5; k++) {
        const LayerWant *w = &mnist_layers[read_back[k]];
        kept += align64((size_t)B * w->c * w->h * w->w * f);
    }
    kept += align64((size_t)B * 9216) + 2 * align64((size_t)B * 10 * f) + align64((size_t)B * sizeof(int32_t)) + align64(NET_METRICS * f) +
            align64(sizeof(ScalerState));  // the metrics, then the loss scaler
    assert_int_equal(net->plan.act_kept, kept);
    const size_t conv1 = 81920, conv2 = winograd_workspace(B, 24, 24, 32, 64);
    // 2 shards (2 threads), 1 image a chunk: a shard's chunk of 2 images would be 1,771,520
    // bytes, over its 1 MB; each shard's dU and dbias 131,328 bytes (no other dU).
    assert_int_equal(cpu_kernels()->shard_count(), 2);
    assert_int_equal(conv2, 131072 + 2 * (919552 + 131328));
    const size_t ws = conv1 > conv2 ? conv1 : conv2;
    assert_int_equal(net->plan.workspace, ws);
    const size_t packing = cpu_kernels()->thread_scratch();  // each thread's, AVX-512 GEMM
    assert_int_equal(net->plan.threads, packing);
    assert_int_equal(net->plan.loader, 0);  // the trainer fills it in
    assert_int_equal(mem_plan_total(&net->plan),
                     4 * 609354 * f + net->plan.activations + ws + packing);
}

static void test_memory_plan(void **state) {
    Cfg cfg;
    load_mnist_cfg(&cfg);
    const int batches[] = {64, 3};  // the seed's batch, and one whose sizes need padding
    for (int k = 0; k < 2; k++) {
        Net net;
        Error err = {{0}};
        const int B = batches[k];
        if (net_create(&net, &cfg, (Shape){.c = 1, .h = 28, .w = 28}, 10, netopts(B), cpu_kernels(), &err))
            fail_msg("%s", err.msg);
        assert_int_equal(net.batch, B);
        expect_mnist_plan(&net, B);
        expect_activation_layout(&net);
        // The blocks are really as large as the plan says: write each end to end (ASan
        // reports a block shorter than its plan).
        memset(net.params, 0x11, net.plan.params);
        memset(net.grads, 0x22, net.plan.grads);
        memset(net.optimizer, 0x33, net.plan.optimizer);
        memset(net.activations, 0x44, net.plan.activations);
        memset(net.workspace, 0x55, net.plan.workspace);
        net_free(&net);
        assert_null(net.layers);
    }
    cfg_free(&cfg);
}

// The seed network runs a full batch inside its plan: forward (training, with dropout) and
// backward touch only planned memory (ASan) and give log-probabilities.
static void test_mnist_forward_backward(void **state) {
    Cfg cfg;
    load_mnist_cfg(&cfg);
    Net net;
    Error err = {{0}};
    const int B = 8;
    if (net_create(&net, &cfg, (Shape){.c = 1, .h = 28, .w = 28}, 10, netopts(B), cpu_kernels(), &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    assert_int_equal(net_init_params(&net, 1, &err), 0);
    test_rng_seed(3);
    for (int64_t i = 0; i < (int64_t)B * 784; i++) net.input_buf[i] = (float)test_urand() * 3 - 0.4f;
    for (int i = 0; i < B; i++) net.labels[i] = i % 10;
    net_zero_grads(&net);
    net_forward(&net, B, true, 1, 0, 0);
    net_loss(&net, B, B, true);
    net_backward(&net, B, 1, 0, 0);
    const float *out = net_output(&net);
    for (int n = 0; n < B; n++) {
        double s = 0;
        for (int k = 0; k < 10; k++) s += exp(out[n * 10 + k]);
        assert_true(fabs(s - 1) < 1e-5);
    }
    // Near-uniform predictions at init: the loss is about log 10 = 2.30.
    const double loss = net.metrics[0] / B;
    assert_true(loss > 1.8 && loss < 2.8);
    double g2 = 0;
    for (int64_t i = 0; i < net.nparams; i++) {
        assert_true(isfinite(net.grads[i]));
        g2 += (double)net.grads[i] * net.grads[i];
    }
    assert_true(g2 > 0);
    net_free(&net);
}

// ---- cfg errors -----------------------------------------------------------------------------

static void expect_net_error(const char *text, int classes, const char *needle1,
                             const char *needle2) {
    Cfg cfg = parse(text);
    Net net;
    Error err = {{0}};
    assert_int_equal(net_create(&net, &cfg, (Shape){.c = 1, .h = 8, .w = 8}, classes, netopts(4),
                                cpu_kernels(), &err), -1);
    cfg_free(&cfg);
    if (!strstr(err.msg, needle1)) fail_msg("message '%s' lacks '%s'", err.msg, needle1);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message '%s' lacks '%s'", err.msg, needle2);
    // A failed net_create leaves nothing behind (LeakSanitizer checks the layers).
    assert_null(net.layers);
    assert_null(net.params);
    assert_null(net.activations);
}

static void test_cfg_errors(void **state) {
    // The last layer is not [log_softmax]: the message names the last section's line.
    expect_net_error("[train]\nepochs = 1\n[flatten]\n[linear]\nname = fc\noutputs = 10\n", 10,
                     "t.cfg:4:", "[log_softmax]");
    // The outputs do not match the classes.
    expect_net_error("[flatten]\n[linear]\noutputs = 10\n[log_softmax]\n", 3, "t.cfg:4:",
                     "10 outputs but the data has 3 classes");
    // A linear layer straight after a conv: it needs [flatten] first.
    expect_net_error("[conv]\nfilters = 2\nsize = 3\n\n[linear]\noutputs = 10\n[log_softmax]\n",
                     10, "t.cfg:5:", "[flatten]");
    // An unknown section.
    expect_net_error("[data]\nmean = 0\n[flatten]\n\n[foo]\nx = 1\n[linear]\noutputs = 10\n"
                     "[log_softmax]\n", 10, "t.cfg:5:", "unknown section [foo]");
    // An unknown key in a layer section names its own line.
    expect_net_error("[conv]\nfilters = 2\nsize = 3\nstrides = 2\n[flatten]\n[linear]\n"
                     "outputs = 10\n[log_softmax]\n", 10, "t.cfg:4:", "strides");
    // Two layers with the same name (their tensors would collide in a checkpoint).
    expect_net_error("[flatten]\n[linear]\nname = fc\noutputs = 4\n[linear]\nname = fc\n"
                     "outputs = 10\n[log_softmax]\n", 10, "t.cfg:5:", "'fc'");
    // A kernel larger than its (padded) input.
    expect_net_error("[conv]\nfilters = 2\nsize = 9\n[flatten]\n[linear]\noutputs = 10\n"
                     "[log_softmax]\n", 10, "t.cfg:1:", "size 9");
    // No layers at all.
    expect_net_error("[train]\nepochs = 1\n", 10, "t.cfg", "no layer sections");
}

// ---- whole-network gradients -------------------------------------------------------------

// conv 1->2 3x3 relu, maxpool 2, flatten, linear 8->3, log_softmax on 1x6x6.
static const char *small_net =
    "[conv]\nname = conv1\nfilters = 2\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[flatten]\n"
    "[linear]\nname = fc\noutputs = 3\n"
    "[log_softmax]\n";
enum { SMALL_NPARAMS = 2 * 9 + 2 + 3 * 8 + 3 };

// The small net in double with the parameter block's layout: conv1.weight (2,1,3,3) at 0,
// conv1.bias at 18, fc.weight (3,8) at 20, fc.bias at 44. x is (N, 6, 6, 1). Returns the
// mean NLL; logp (N, 3) if non-NULL. *zmin is the smallest |pre-activation| and *gapmin
// the smallest gap between the two largest values of a pooling window whose maximum is
// above 0: finite differences are only valid when both exceed their step.
static double small_net_ref(const double *p, const double *x, const int32_t *y, int N,
                            double *logp, double *zmin, double *gapmin) {
    const double *cw = p, *cb = p + 18, *fw = p + 20, *fb = p + 44;
    double loss = 0, zm = INFINITY, gm = INFINITY;
    for (int n = 0; n < N; n++) {
        double a[4][4][2];
        for (int oh = 0; oh < 4; oh++)
            for (int ow = 0; ow < 4; ow++)
                for (int oc = 0; oc < 2; oc++) {
                    double z = cb[oc];
                    for (int kh = 0; kh < 3; kh++)
                        for (int kw = 0; kw < 3; kw++)
                            z += x[(n * 6 + oh + kh) * 6 + ow + kw] * cw[oc * 9 + kh * 3 + kw];
                    zm = fmin(zm, fabs(z));
                    a[oh][ow][oc] = z > 0 ? z : 0;
                }
        double f[8];  // PyTorch's flatten: (c, h, w)
        for (int oc = 0; oc < 2; oc++)
            for (int ph = 0; ph < 2; ph++)
                for (int pw = 0; pw < 2; pw++) {
                    double v[4] = {a[2 * ph][2 * pw][oc], a[2 * ph][2 * pw + 1][oc],
                                   a[2 * ph + 1][2 * pw][oc], a[2 * ph + 1][2 * pw + 1][oc]};
                    double m1 = -INFINITY, m2 = -INFINITY;
                    for (int i = 0; i < 4; i++) {
                        if (v[i] > m1) m2 = m1, m1 = v[i];
                        else if (v[i] > m2) m2 = v[i];
                    }
                    if (m1 > 0) gm = fmin(gm, m1 - m2);
                    f[oc * 4 + ph * 2 + pw] = m1;
                }
        double l[3], m = -INFINITY, s = 0;
        for (int k = 0; k < 3; k++) {
            l[k] = fb[k];
            for (int j = 0; j < 8; j++) l[k] += fw[k * 8 + j] * f[j];
            m = fmax(m, l[k]);
        }
        for (int k = 0; k < 3; k++) s += exp(l[k] - m);
        for (int k = 0; k < 3; k++) {
            const double lp = l[k] - m - log(s);
            if (logp) logp[n * 3 + k] = lp;
            if (k == y[n]) loss -= lp;
        }
    }
    if (zmin) *zmin = zm;
    if (gapmin) *gapmin = gm;
    return loss / N;
}

// Fills the small net's parameters and a batch of 2 so that no relu or max is within
// `margin` of a kink.
static void small_net_data(Net *net, double *p, double *x, int32_t *y, double margin) {
    Error err = {{0}};
    for (int tries = 0;; tries++) {
        assert_true(tries < 200);
        assert_int_equal(net_init_params(net, 100 + (uint64_t)tries, &err), 0);
        test_rng_seed(200 + (uint64_t)tries);
        for (int i = 0; i < 72; i++) net->input_buf[i] = (float)(test_urand() * 2 - 0.5);
        // The init scale 1/3 makes small logits; larger fc weights make a real test of
        // the softmax.
        for (int i = 20; i < SMALL_NPARAMS; i++) net->params[i] *= 3;
        net->labels[0] = 2, net->labels[1] = 0;
        for (int i = 0; i < SMALL_NPARAMS; i++) p[i] = net->params[i];
        for (int i = 0; i < 72; i++) x[i] = net->input_buf[i];
        y[0] = 2, y[1] = 0;
        double zmin, gapmin;
        small_net_ref(p, x, y, 2, NULL, &zmin, &gapmin);
        if (zmin > margin && gapmin > margin) return;
    }
}

// Tolerance: max abs error <= 1e-5 * max(1, max |grad|). The float network's gradients
// carry ~1e-7 of rounding; the differences of the double reference with h = 1e-6 are
// exact to ~1e-9 away from kinks.
static void test_network_gradients(void **state) {
    Net net;
    make_net(&net, small_net, (Shape){.c = 1, .h = 6, .w = 6}, 3, 2);
    assert_int_equal(net.nparams, SMALL_NPARAMS);
    double p[SMALL_NPARAMS], x[72], logp[6];
    int32_t y[2];
    small_net_data(&net, p, x, y, 1e-4);

    net_zero_grads(&net);
    net.metrics[0] = net.metrics[1] = 0;
    net_forward(&net, 2, true, 1, 0, 0);
    net_loss(&net, 2, 2, true);
    net_backward(&net, 2, 1, 0, 0);

    const double loss = small_net_ref(p, x, y, 2, logp, NULL, NULL);
    for (int i = 0; i < 6; i++)
        if (!(fabs(net_output(&net)[i] - logp[i]) <= 1e-5 * fmax(1, fabs(logp[i]))))
            fail_msg("logp[%d] = %.9g, reference %.9g", i, net_output(&net)[i], logp[i]);
    // metrics hold the summed loss; the mean is the reference's.
    assert_true(fabs(net.metrics[0] / 2 - loss) <= 1e-5 * fmax(1, loss));

    double err = 0, big = 0;
    int at = 0;
    for (int i = 0; i < SMALL_NPARAMS; i++) {
        const double keep = p[i], h = 1e-6;
        p[i] = keep + h;
        const double lp = small_net_ref(p, x, y, 2, NULL, NULL, NULL);
        p[i] = keep - h;
        const double lm = small_net_ref(p, x, y, 2, NULL, NULL, NULL);
        p[i] = keep;
        const double fd = (lp - lm) / (2 * h);
        big = fmax(big, fabs(fd));
        if (fabs(net.grads[i] - fd) > err) err = fabs(net.grads[i] - fd), at = i;
    }
    assert_true(big > 0.01);  // the gradients are not trivially zero
    if (!(err <= 1e-5 * fmax(1, big)))
        fail_msg("gradient %d: %.9g, finite differences say otherwise (max error %.3g)", at,
                 net.grads[at], err);
    // Every conv weight gets a gradient (no relu or pooling silences a whole filter).
    for (int i = 0; i < 18; i++) assert_true(net.grads[i] != 0.0f);
    net_free(&net);
}

// DESIGN.md decision 5: two micro-batches of 1 with the batch's denominator accumulate to
// the batch's gradients (up to float rounding).
static void test_microbatches_accumulate(void **state) {
    Net net;
    make_net(&net, small_net, (Shape){.c = 1, .h = 6, .w = 6}, 3, 2);
    double p[SMALL_NPARAMS], x[72];
    int32_t y[2];
    small_net_data(&net, p, x, y, 1e-4);
    float whole[SMALL_NPARAMS], input[72];
    memcpy(input, net.input_buf, sizeof input);
    net_zero_grads(&net);
    net_forward(&net, 2, true, 1, 0, 0);
    net_loss(&net, 2, 2, true);
    net_backward(&net, 2, 1, 0, 0);
    memcpy(whole, net.grads, sizeof whole);

    net_zero_grads(&net);
    for (int s = 0; s < 2; s++) {
        memcpy(net.input_buf, input + 36 * s, 36 * sizeof(float));
        net.labels[0] = y[s];
        net_forward(&net, 1, true, 1, 0, s);
        net_loss(&net, 1, 2, true);
        net_backward(&net, 1, 1, 0, s);
    }
    double big = 0;
    for (int i = 0; i < SMALL_NPARAMS; i++) big = fmax(big, fabs(whole[i]));
    for (int i = 0; i < SMALL_NPARAMS; i++)
        if (!(fabs(net.grads[i] - whole[i]) <= 1e-6 * big))
            fail_msg("grad %d: micro-batches %.9g, whole batch %.9g", i, net.grads[i], whole[i]);
    net_free(&net);
}

// ---- determinism --------------------------------------------------------------------------

// Two convs (the second large enough for the threaded GEMM), pooling, two dropouts.
static const char *det_net =
    "[conv]\nname = conv1\nfilters = 8\nsize = 3\nactivation = relu\n"
    "[conv]\nname = conv2\nfilters = 16\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[dropout]\np = 0.25\n"
    "[flatten]\n"
    "[linear]\nname = fc1\noutputs = 32\nactivation = relu\n"
    "[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 10\n"
    "[log_softmax]\n";

// 20 Adadelta steps on random data; returns the parameters and optimizer state (malloc'd).
static float *train_steps(uint64_t seed, int steps, size_t *bytes, double *last_loss) {
    const int B = 16;
    Net net;
    make_net(&net, det_net, (Shape){.c = 1, .h = 12, .w = 12}, 10, B);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, seed, &err), 0);
    const Optimizer opt = adadelta;
    for (int step = 0; step < steps; step++) {
        test_rng_seed(seed * 1000 + (uint64_t)step);
        for (int i = 0; i < B * 144; i++) net.input_buf[i] = (float)(test_urand() * 2 - 1);
        for (int i = 0; i < B; i++) net.labels[i] = (int32_t)(test_urand() * 10);
        net_zero_grads(&net);
        net.metrics[0] = net.metrics[1] = 0;
        net_forward(&net, B, true, seed, (uint64_t)step, 0);
        net_loss(&net, B, B, true);
        net_backward(&net, B, seed, (uint64_t)step, 0);
        optim_step(&net, &opt, NULL, 1.0, step);
    }
    *last_loss = net.metrics[0] / B;
    *bytes = 3 * (size_t)net.nparams * sizeof(float);
    float *state = malloc(*bytes);
    assert_non_null(state);
    memcpy(state, net.params, net.plan.params);
    memcpy(state + net.nparams, net.optimizer, net.plan.optimizer);
    net_free(&net);
    return state;
}

static void test_determinism(void **state) {
    size_t n1, n2, n3;
    double l1, l2, l3;
    float *a = train_steps(5, 20, &n1, &l1);
    float *b = train_steps(5, 20, &n2, &l2);
    float *c = train_steps(6, 20, &n3, &l3);
    assert_int_equal(n1, n2);
    assert_true(isfinite(l1));
    assert_memory_equal(a, b, n1);         // same seed: the same bits
    assert_memory_not_equal(a, c, n1);     // another seed: another run
    free(a), free(b), free(c);
}

// GEMMs are cut into one slab of rows (or columns, or of K for a small C) per thread: with
// 1, 2 and 3 threads (uneven slabs) every element equals a double-precision product within
// float rounding, for the row, column and K cuts and both transposes; training with 1 and 2 threads
// agrees to rounding, and 2 threads twice give the same bits (DESIGN.md decision 10).
static void check_gemm_slabs(int M, int N, int K, bool ta, bool tb) {
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * N);
    assert_true(A && B && C);
    test_rng_seed((uint64_t)M * 31 + N);
    for (int i = 0; i < M * K; i++) A[i] = (float)(test_urand() * 2 - 1);
    for (int i = 0; i < K * N; i++) B[i] = (float)(test_urand() * 2 - 1);
    for (int threads = 1; threads <= 3; threads++) {
        cpu_set_threads(threads);
        for (int i = 0; i < M * N; i++) C[i] = NAN;
        cpu_kernels()->gemm(C, A, B, M, N, K, ta, tb, 1.0f, 0.0f);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double want = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    const double p = (double)(ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
                    want += p, mag += fabs(p);
                }
                if (!(fabs(C[m * N + n] - want) <= 1e-6 * mag))
                    fail_msg("gemm %dx%dx%d%s%s, %d threads: C[%d,%d] = %g, want %g", M, N, K, ta ? " A^T" : "",
                             tb ? " B^T" : "", threads, m, n, C[m * N + n], want);
            }
    }
    cpu_set_threads(2);
    free(A), free(B), free(C);
}

static void test_thread_counts(void **state) {
    check_gemm_slabs(1024, 16, 72, false, false);  // cut by rows
    check_gemm_slabs(1000, 24, 40, true, true);
    check_gemm_slabs(16, 1000, 40, true, false);   // cut by columns
    check_gemm_slabs(24, 1000, 40, false, true);
    check_gemm_slabs(32, 9, 5000, true, false);    // small C, long K: K cut across threads
    check_gemm_slabs(9, 32, 3000, false, true);
    size_t n1, n2, n3;
    double l1, l2, l3;
    cpu_set_threads(1);
    float *a = train_steps(5, 20, &n1, &l1);
    cpu_set_threads(2);
    float *b = train_steps(5, 20, &n2, &l2);
    float *c = train_steps(5, 20, &n3, &l3);
    assert_memory_equal(b, c, n2);
    print_message("20 steps, loss with 1 thread %.9g, with 2 %.9g\n", l1, l2);
    assert_true(fabs(l1 - l2) <= 1e-4 * fabs(l1));
    free(a), free(b), free(c);
}

// ---- end-to-end training -----------------------------------------------------------------


static const char *train_net =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n"
    "[flatten]\n"
    "[linear]\nname = fc\noutputs = 4\n"
    "[log_softmax]\n";

// One pass over the loader's epoch: trains if opt is non-NULL, else evaluates. Returns the
// mean loss and *acc, the fraction right.
static double run_epoch(Net *net, Loader *loader, int epoch, const Optimizer *opt, double *acc) {
    Error err = {{0}};
    if (loader_start_epoch(loader, epoch, 0, &err)) fail_msg("%s", err.msg);
    net->metrics[0] = net->metrics[1] = 0;
    int64_t seen = 0;
    const Batch *b;
    for (;;) {
        if (loader_next(loader, &b, &err)) fail_msg("%s", err.msg);
        if (!b) break;
        net_put_input(net, b->px, b->lut, b->n);
        net->k->upload(net->labels, b->y, (size_t)b->n * sizeof(int32_t));
        const uint64_t step = (uint64_t)(epoch * 1000 + b->index);
        net_forward(net, b->n, opt != NULL, 9, step, 0);
        net_loss(net, b->n, b->n, opt != NULL);
        if (opt) {
            net_zero_grads(net);
            net_backward(net, b->n, 9, step, 0);
            const Schedule steplr = {.kind = SCHEDULE_STEP, .gamma = 0.7};
            optim_step(net, opt, NULL, schedule_lr(&steplr, opt->lr, 0, epoch, 0), 0);
        }
        seen += b->n;
    }
    *acc = net->metrics[1] / (double)seen;
    return net->metrics[0] / (double)seen;
}

static void test_training_loss_falls(void **state) {
    char images[PATH_MAX], labels[PATH_MAX], timages[PATH_MAX], tlabels[PATH_MAX];
    write_squares(g_dir, "train", 512, 1, images, labels);
    write_squares(g_dir, "test", 200, 2, timages, tlabels);
    Dataset *ds, *tds;
    Loader *loader = open_squares_loader(images, labels, &ds, 1);
    Loader *tloader = open_squares_loader(timages, tlabels, &tds, 0);

    Net net;
    make_net_as(&net, train_net, (Shape){.c = 1, .h = 8, .w = 8}, 4, 30, true);
    Error err = {{0}};
    assert_int_equal(net_init_params(&net, 1, &err), 0);
    const Optimizer opt = adadelta;
    const int epochs = 4;
    double loss[4], acc[4];
    for (int e = 0; e < epochs; e++) loss[e] = run_epoch(&net, loader, e, &opt, &acc[e]);
    double test_acc;
    const double test_loss = run_epoch(&net, tloader, 0, NULL, &test_acc);
    print_message("epoch losses %.4f %.4f %.4f %.4f, accuracies %.3f %.3f %.3f %.3f; held out "
                  "loss %.4f accuracy %.3f\n", loss[0], loss[1], loss[2], loss[3], acc[0],
                  acc[1], acc[2], acc[3], test_loss, test_acc);
    // Chance is log 4 = 1.39 and 25%.
    assert_true(loss[0] < 1.6);
    assert_true(loss[epochs - 1] < 0.5 * loss[0]);
    assert_true(acc[epochs - 1] > 0.9);
    assert_true(test_acc > 0.9);
    net_free(&net);
    loader_destroy(loader);
    loader_destroy(tloader);
    dataset_close(ds);
    dataset_close(tds);
}

// ---- byte input (NetOptions.input_bytes) ---------------------------------------------------

// First layers of three kinds: a GEMM convolution without bias, whose chunks of images give
// the bits of one call (a ResNet's 7x7 stride-2 stem: at 3x64x64 one image's im2col takes
// 602 KB, 3 images a chunk of the CPU's 2 MB), so the bytes are read 3 images at a time;
// the same with a trained bias (its sums over the pass: whole); the direct convolution
// (fixed blocks of the pass's pixels: whole).
static const char *byte_nets[] = {
    "[conv]\nname = conv1\nfilters = 8\nsize = 7\nstride = 2\npad = 3\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n[maxpool]\nsize = 3\nstride = 2\npad = 1\n"
    "[global_avgpool]\n[flatten]\n[linear]\nname = fc\noutputs = 5\n[log_softmax]\n",
    "[conv]\nname = conv1\nfilters = 8\nsize = 7\nstride = 2\npad = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n[flatten]\n[linear]\nname = fc\noutputs = 5\n[log_softmax]\n",
    "[conv]\nname = conv1\nfilters = 6\nsize = 3\npad = 1\nactivation = relu\n[maxpool]\nsize = 4\n"
    "[dropout]\np = 0.3\n[flatten]\n[linear]\nname = fc\noutputs = 5\n[log_softmax]\n",
};
static const int byte_chunks[] = {3, 7, 7};  // Exec.input_chunk in F32 at batch 7

typedef struct ByteStep {
    Net net;
    float *grads, *logp, *buffers;
    float metrics[NET_METRICS];
} ByteStep;

// A training step (2 micro-batches: 7 and 4 samples), then an evaluation forward of 3, of
// net `text` with the input as bytes px with lut, or as the floats lut gives them.
static ByteStep byte_step(const char *text, DType precision, int segments, bool bytes, const uint8_t *px,
                          const float *lut, const int32_t *y) {
    const Shape in = {.c = 3, .h = 64, .w = 64};
    const int64_t numel = shape_numel(in);
    ByteStep r = {0};
    Cfg cfg = parse(text);
    Error err = {{0}};
    NetOptions opt = {.batch = 7, .precision = precision, .segments = segments, .input_bytes = bytes};
    optim_plan(&adadelta, &opt);
    if (net_create(&r.net, &cfg, in, 5, &opt, cpu_kernels(), &err) || net_init_params(&r.net, 3, &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    Net *net = &r.net;
    expect_activation_layout(net);
    net_zero_grads(net);
    net->metrics[0] = net->metrics[1] = 0;
    for (int m0 = 0, m = 0; m0 < 11; m0 += 7, m++) {
        const int n = m ? 4 : 7;
        if (bytes) {
            net_put_input(net, px + m0 * numel, lut, n);
        } else {
            for (int64_t i = 0; i < n * numel; i++) net->input_buf[i] = lut[(i % 3) * 256 + px[m0 * numel + i]];
        }
        memcpy(net->labels, y + m0, (size_t)n * sizeof *y);
        net_forward(net, n, true, 5, 2, m0);
        net_loss(net, n, 11, true);
        net_backward(net, n, 5, 2, m0);
    }
    r.grads = malloc((size_t)net->ntrain * sizeof(float));
    r.buffers = malloc(net->plan.buffers + 1);
    r.logp = malloc(3 * 5 * sizeof(float));
    assert_non_null(r.grads && r.buffers && r.logp);
    memcpy(r.grads, net->grads, (size_t)net->ntrain * sizeof(float));
    memcpy(r.buffers, net->buffers, net->plan.buffers);
    memcpy(r.metrics, net->metrics, sizeof r.metrics);
    if (bytes) net_put_input(net, px, lut, 3);
    else for (int64_t i = 0; i < 3 * numel; i++) net->input_buf[i] = lut[(i % 3) * 256 + px[i]];
    net_forward(net, 3, false, 0, 0, 0);
    memcpy(r.logp, net_output(net), 3 * 5 * sizeof(float));
    return r;
}

static void byte_step_free(ByteStep *r) {
    net_free(&r->net);
    free(r->grads), free(r->logp), free(r->buffers);
}

// The byte input gives the fp32 input's bits: gradients, batch statistics, loss and
// outputs, in F32 (chunked or whole) and F16, with and without checkpointing; its plan
// holds the bytes and the table, and the fp32 expansion only where the first layer runs.
static void test_byte_input(void **state) {
    const int64_t numel = 3 * 64 * 64;
    uint8_t *px = malloc(11 * numel);
    assert_non_null(px);
    test_rng_seed(77);
    for (int64_t i = 0; i < 11 * numel; i++) px[i] = (uint8_t)(test_urand() * 256);
    int32_t y[11];
    for (int i = 0; i < 11; i++) y[i] = i % 5;
    float lut[3 * 256];
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    normalise_table(lut, 3, mean, std);
    for (size_t t = 0; t < sizeof byte_nets / sizeof *byte_nets; t++)
        for (int p = 0; p < 2; p++)
            for (int seg = 0; seg < 2; seg++) {
                const DType precision = p ? DT_F16 : DT_F32;
                const int segments = seg ? NET_SEGMENTS_SQRT : 0;
                ByteStep f = byte_step(byte_nets[t], precision, segments, false, px, lut, y),
                         b = byte_step(byte_nets[t], precision, segments, true, px, lut, y);
                char what[96];
                snprintf(what, sizeof what, "net %zu, %s, segments %d", t, dtype_names[precision], segments);
                assert_int_equal(f.net.ntrain, b.net.ntrain);
                if (memcmp(f.grads, b.grads, (size_t)f.net.ntrain * sizeof(float)))
                    fail_msg("%s: the byte input's gradients differ from the fp32 input's", what);
                if (memcmp(f.buffers, b.buffers, f.net.plan.buffers))
                    fail_msg("%s: the byte input's batchnorm statistics differ", what);
                if (memcmp(f.metrics, b.metrics, sizeof f.metrics) || memcmp(f.logp, b.logp, 3 * 5 * sizeof(float)))
                    fail_msg("%s: the byte input's loss or outputs differ", what);
                // The plan: on the CPU the network reads the caller's bytes where they are
                // (the last batch put, px's first 3 samples) and holds only the 3 KB table;
                // the fp32 expansion is a chunk of the first layer in F32 and nothing in F16
                // (the executor's scratch takes it).
                assert_ptr_equal(b.net.input_u8, px);
                assert_null(b.net.input_buf);
                assert_int_equal(b.net.exec.input_chunk, byte_chunks[t]);
                const ActBuffer *bin = &b.net.bufs[0], *fin = &f.net.bufs[0];
                assert_int_equal(bin->bytes, 3 * 256 * 4);
                assert_int_equal(fin->bytes, 7 * numel * 4);
                assert_int_equal(b.net.bufs[4].bytes, p ? 0 : (size_t)byte_chunks[t] * numel * 4);
                byte_step_free(&f), byte_step_free(&b);
            }
    free(px);
}

// ---- main -----------------------------------------------------------------------------------

static int group_setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "test_net"); }

static int group_teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    (void)argc;
    test_find_root(g_root, sizeof g_root, argv[0], "models/mnist.cfg");
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mnist_network),
        cmocka_unit_test(test_init_params),
        cmocka_unit_test(test_mt19937_reference),
        cmocka_unit_test(test_init_matches_pytorch),
        cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_mnist_forward_backward),
        cmocka_unit_test(test_cfg_errors),
        cmocka_unit_test(test_network_gradients),
        cmocka_unit_test(test_microbatches_accumulate),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_thread_counts),
        cmocka_unit_test(test_training_loss_falls),
        cmocka_unit_test(test_byte_input),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
