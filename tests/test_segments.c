// test_segments.c: activation checkpointing and the memory plan (DESIGN.md decisions 2
// and 6): checkpointed backward equals plain backward bit for bit, dropout included, and
// with compressed activations (which a recomputation rounds as the first forward did); the
// plan is what is allocated; the budget chooser's choices.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../data/dataset.h"
#include "../nn/budget.h"
#include "../nn/cost.h"
#include "../nn/cfg.h"
#include "../nn/net.h"
#include "testutil.h"

// The seed network, dropout included.
static const char *seed_net =
    "[conv]\nname = conv1\nfilters = 8\nsize = 3\nactivation = relu\n"
    "[conv]\nname = conv2\nfilters = 16\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n[dropout]\np = 0.25\n[flatten]\n"
    "[linear]\nname = fc1\noutputs = 32\nactivation = relu\n[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 10\n[log_softmax]\n";

// A small ResNet: a stem (conv without bias, batchnorm + ReLU, padded max pooling), an
// identity block, a downsampling block, dropout, global average pooling and a classifier.
static const char *resnet =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[maxpool]\nname = maxpool\nsize = 3\nstride = 2\npad = 1\n"
    "[residual]\nname = layer1.0\nfilters = 4\n"
    "[residual]\nname = layer2.0\nfilters = 6\nstride = 2\n"
    "[dropout]\np = 0.2\n"
    "[batchnorm]\nname = bn2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n";

// MobileNetV2's pieces: a stem, an inverted residual's depthwise convolution (stride 2)
// with batchnorm and ReLU, a pointwise projection, a depthwise convolution with two filters
// per channel and a ReLU of its own, pooling and a classifier.
static const char *mobile =
    "[conv]\nname = features.0.0\nfilters = 8\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = features.0.1\nactivation = relu\n"
    "[conv]\nname = features.1.conv.0.0\nfilters = 8\nsize = 3\nstride = 2\npad = 1\ngroups = 8\nbias = 0\n"
    "[batchnorm]\nname = features.1.conv.0.1\nactivation = relu\n"
    "[conv]\nname = features.1.conv.1\nfilters = 6\nsize = 1\nbias = 0\n"
    "[batchnorm]\nname = features.1.conv.2\n"
    "[conv]\nname = dw2\nfilters = 12\nsize = 3\npad = 1\ngroups = 6\nactivation = relu\n"
    "[global_avgpool]\n[flatten]\n"
    "[linear]\nname = classifier\noutputs = classes\n[log_softmax]\n";

// torchvision's other blocks and a written-out one: a Bottleneck with a downsample, an
// identity Bottleneck, an InvertedResidual with its identity (ReLU6, depthwise), a [block] whose body ends in a dropout and whose shortcut is an
// average pooling, with a ReLU on the sum.
static const char *blocks_net =
    "[conv]\nname = conv1\nfilters = 8\nsize = 3\npad = 1\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[residual]\nname = layer1.0\nblock = bottleneck\nfilters = 3\nstride = 2\n"
    "[residual]\nname = layer1.1\nblock = bottleneck\nfilters = 3\n"
    "[residual]\nname = features.1\nblock = inverted\nexpand = 2\nfilters = 12\n"
    "[block]\nname = mix\nactivation = relu\n"
    "[conv]\nfilters = 12\nsize = 3\nstride = 2\npad = 1\n[batchnorm]\nactivation = relu\n"
    "[conv]\nfilters = 12\nsize = 1\n[dropout]\np = 0.2\n"
    "[shortcut]\n[avgpool]\nsize = 2\n[end]\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n";

// A deep plain net with dropout between convolutions (so that masks are recomputed inside
// segments) and a standalone relu.
static char deep_net[8192];

static void make_deep(void) {
    size_t n = 0;
    for (int i = 1; i <= 16; i++) {
        n += (size_t)snprintf(deep_net + n, sizeof deep_net - n,
                              "[conv]\nfilters = 6\nsize = 3\npad = 1\n%s", i % 2 ? "activation = relu\n" : "");
        if (i % 2 == 0) n += (size_t)snprintf(deep_net + n, sizeof deep_net - n, "[relu]\n");
        if (i % 5 == 0) n += (size_t)snprintf(deep_net + n, sizeof deep_net - n, "[dropout]\np = 0.2\n");
    }
    snprintf(deep_net + n, sizeof deep_net - n,
             "[maxpool]\n[flatten]\n[linear]\noutputs = 10\n[log_softmax]\n");
}

// The scratch a sweep's chunk may take in the networks build() makes (0: the default).
static size_t g_sweep_bytes;

// Whether build makes networks whose input holds bytes (NetOptions.input_bytes), and
// fill_batch fills them with bytes.
static bool g_bytes;

// The width build's networks compress activations to (NetOptions.compress; 0: none). A
// compressing network is built with sweeps, as the trainer builds it, with or without
// segments, so that the plain and checkpointed runs have the same nodes.
static int g_compress;
static bool g_recompute_1x1;  // NetOptions.recompute_1x1
static Matmul g_matmul;       // NetOptions.matmul
static bool g_apart;          // NetOptions.apart
static bool g_workspace_apart;  // NetOptions.workspace_apart
static const Kernels *g_kernels;  // build's kernels (NULL: cpu_kernels())
// When set, build's networks take these parameters (g_nparams floats) instead of their
// initialisation: two networks whose layers differ by a layer without parameters.
static const float *g_params;
static int64_t g_nparams;

static void build(Net *net, Cfg *cfg, const char *text, Shape in, int batch, int segments,
                  DType precision) {
    Error err = {{0}};
    if (cfg_parse(cfg, text, "test.cfg", &err)) fail_msg("%s", err.msg);
    const NetOptions opt = {.batch = batch, .precision = precision, .segments = segments,
                            .sweep = segments != 0 || g_compress, .sweep_bytes = g_sweep_bytes,
                            .input_bytes = g_bytes, .compress = g_compress,
                            .recompute_1x1 = g_recompute_1x1, .matmul = g_matmul, .apart = g_apart,
                            .workspace_apart = g_workspace_apart};
    if (net_create(net, cfg, in, 10, &opt, g_kernels ? g_kernels : cpu_kernels(), &err)) fail_msg("%s", err.msg);
    if (net_init_params(net, 7, &err)) fail_msg("%s", err.msg);
    if (g_params) {
        assert_int_equal(net->nparams, g_nparams);
        memcpy(net->params, g_params, (size_t)g_nparams * sizeof(float));
    }
}

// The lifetimes of the activation plan, checked by every step below: each event begins
// with the bytes of the activation block that no buffer live at it holds set to a pattern,
// and each step runs twice, with 0xff (NaN in F32 and F16) and 0x3c (0.0115 in F32, 1.06 in
// F16: positive, so a ReLU mask read from it differs from one read from NaN). A layer that
// reads a buffer outside the spans the plan gave it then gets gradients that are not
// finite or differ between the two patterns.
static const Net *poisoned;
static int poison_event;
static char poison_byte;

static void poison_dead(int t) {
    const Net *net = poisoned;
    const size_t size = net->plan.activations;
    char *live = calloc(size ? size : 1, 1);
    assert_non_null(live);
    for (int b = 0; b < net->nbufs; b++)
        if (net->bufs[b].bytes && net_buffer_live(net, b, t))
            memset(live + net->bufs[b].offset, 1, net->bufs[b].bytes);
    char *block = net->activations;
    for (size_t i = 0; i < size; i++)
        if (!live[i]) block[i] = poison_byte;
    free(live);
}

static void poison_on_layer(int layer, bool backward) {
    (void)layer, (void)backward;
    poison_dead(poison_event++);
}

// A training forward, loss and backward of `batch` samples (step 3, seed 5) under the
// poisoning with `byte`; the parameter gradients must be finite.
static void poisoned_step(Net *net, int batch, char byte) {
    poisoned = net;
    poison_byte = byte;
    poison_event = 0;
    net->on_layer = poison_on_layer;
    net_zero_grads(net);
    net_forward(net, batch, true, 5, 3, 0);
    assert_int_equal(poison_event, net->nnodes);
    poison_dead(poison_event++);  // the loss
    net_loss(net, batch, batch, true);
    net_backward(net, batch, 5, 3, 0);
    assert_int_equal(poison_event, net->nevents);
    net->on_layer = NULL;
    for (int64_t i = 0; i < net->ntrain; i++)
        if (!isfinite(net->grads[i])) fail_msg("gradient %lld is not finite: a buffer was read outside its span", (long long)i);
}

// What one training forward/backward of a fixed random batch leaves: the parameter
// gradients, the buffer block (running statistics, batch statistics) and every
// batchnorm's num_batches_tracked.
typedef struct StepResult {
    float *grads;
    char *buffers;
    int64_t counters[64];
    int ncounters, nsegments;
    size_t grad_bytes, buffer_bytes;
} StepResult;

// The random batch of train_step and frozen_step, into net.
static void fill_batch(Net *net, Shape in, int batch) {
    srand(11);
    if (net->input_bytes) {
        float lut[3 * 256];
        const float mean[3] = {0.5f, 0.4f, 0.3f}, std[3] = {0.25f, 0.2f, 0.3f};
        normalise_table(lut, in.c, mean, std);
        // The network may read the bytes where they are until the next batch: kept here.
        static uint8_t *px;
        free(px);
        px = malloc((size_t)(batch * shape_numel(in)));
        assert_non_null(px);
        for (int64_t i = 0; i < batch * shape_numel(in); i++) px[i] = (uint8_t)(rand() % 256);
        net_put_input(net, px, lut, batch);
    } else {
        for (int64_t i = 0; i < batch * shape_numel(in); i++) net->input_buf[i] = (float)rand() / RAND_MAX - 0.5f;
    }
    for (int i = 0; i < batch; i++) net->labels[i] = rand() % 10;
}

static StepResult train_step(const char *text, Shape in, int batch, int segments, DType precision) {
    StepResult r = {0};
    for (int pass = 0; pass < 2; pass++) {  // the two poison patterns, the same bits
        Net net;
        Cfg cfg;
        build(&net, &cfg, text, in, batch, segments, precision);
        fill_batch(&net, in, batch);
        poisoned_step(&net, batch, pass ? (char)0x3c : (char)0xff);
        if (pass) {
            if (memcmp(r.grads, net.grads, r.grad_bytes) != 0)
                fail_msg("gradients differ with the block's free bytes poisoned otherwise: a buffer "
                         "was read outside its span (%d segments)", net.nsegments);
        } else {
            r = (StepResult){.nsegments = net.nsegments, .grad_bytes = (size_t)net.nparams * sizeof(float),
                             .buffer_bytes = net.plan.buffers};
            r.grads = malloc(r.grad_bytes);
            r.buffers = malloc(r.buffer_bytes ? r.buffer_bytes : 1);
            assert_non_null(r.grads);
            assert_non_null(r.buffers);
            memcpy(r.grads, net.grads, r.grad_bytes);
            memcpy(r.buffers, net.buffers, r.buffer_bytes);
            for (int m = 0; m < net.nmodules; m++)
                for (int j = 0; j < net.modules[m]->nbuffers; j++)
                    if (net.modules[m]->buffers[j].dtype == DT_I64) {
                        assert_true(r.ncounters < 64);
                        r.counters[r.ncounters++] = *(int64_t *)net.modules[m]->buffers[j].data;
                    }
        }
        net_free(&net);
        cfg_free(&cfg);
    }
    return r;
}

static void step_result_free(StepResult *r) {
    free(r->grads);
    free(r->buffers);
}

// Checkpointed backward gives the plain run's bits: gradients, running statistics (moved
// once: batchnorm does not update them again in the recomputation) and counters.
static void expect_equal_gradients(const char *text, Shape in, int batch, DType precision) {
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, text, in, 1, 0, precision);
    const int nnodes = probe.nnodes;
    net_free(&probe);
    cfg_free(&cfg);
    StepResult plain = train_step(text, in, batch, 0, precision);
    assert_int_equal(plain.nsegments, 1);
    for (int c = 0; c < plain.ncounters; c++) assert_int_equal(plain.counters[c], 1);
    // Each count of segments with sweeps in chunks of as many samples as fit the default
    // scratch (often the whole batch here), then of one sample.
    const int counts[] = {NET_SEGMENTS_SQRT, 2, 3, nnodes};
    for (int chunked = 0; chunked < 2; chunked++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            g_sweep_bytes = chunked;
            StepResult ckpt = train_step(text, in, batch, counts[c], precision);
            g_sweep_bytes = 0;
            assert_true(ckpt.nsegments > 1);
            if (memcmp(plain.grads, ckpt.grads, plain.grad_bytes) != 0)
                fail_msg("gradients differ with %d segments%s", ckpt.nsegments, chunked ? ", sweeps of one sample" : "");
            if (memcmp(plain.buffers, ckpt.buffers, plain.buffer_bytes) != 0)
                fail_msg("running or batch statistics differ with %d segments%s", ckpt.nsegments,
                         chunked ? ", sweeps of one sample" : "");
            assert_int_equal(ckpt.ncounters, plain.ncounters);
            for (int k = 0; k < ckpt.ncounters; k++) assert_int_equal(ckpt.counters[k], 1);
            step_result_free(&ckpt);
        }
    step_result_free(&plain);
}

static void test_seed_network_bitwise(void **state) {
    expect_equal_gradients(seed_net, (Shape){.c = 1, .h = 12, .w = 12}, 6, DT_F32);
}

static void test_deep_network_bitwise(void **state) {
    expect_equal_gradients(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, DT_F32);
}

static void test_fp16_bitwise(void **state) {
    expect_equal_gradients(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, DT_F16);
}

// bf16 storage, and its GEMMs on bf16 operands where the CPU has the instructions: the
// same bits checkpointed as plain, through the blocks and the ResNet too.
static void test_bf16_bitwise(void **state) {
    expect_equal_gradients(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, DT_BF16);
    expect_equal_gradients(blocks_net, (Shape){.c = 3, .h = 12, .w = 12}, 6, DT_BF16);
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_BF16);
}

// The GEMMs on bf16 operands over fp32 activations (matmul = bf16): the same bits
// checkpointed as plain.
static void test_bf16_matmul_bitwise(void **state) {
    g_matmul = MATMUL_BF16;
    expect_equal_gradients(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, DT_F32);
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_F32);
    g_matmul = MATMUL_AUTO;
}

static void test_resnet_bitwise(void **state) {
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_F32);
}

static void test_blocks_bitwise(void **state) {
    expect_equal_gradients(blocks_net, (Shape){.c = 3, .h = 12, .w = 12}, 6, DT_F32);
    expect_equal_gradients(blocks_net, (Shape){.c = 3, .h = 12, .w = 12}, 6, DT_F16);
}

// recompute_1x1: the Bottlenecks' conv3 (3 -> 12 channels) and the InvertedResidual's
// expansion (12 -> 24) are computed again in backward (not the narrowing conv1s and
// projection, nor mix's 1x1, which a dropout reads): fewer bytes kept, and the same
// gradients and statistics as without it, plain and under every checkpointing, in fp32
// and fp16.
static void test_recompute_1x1_bitwise(void **state) {
    const Shape in = {.c = 3, .h = 12, .w = 12};
    for (int p = 0; p < 2; p++) {
        const DType precision = p ? DT_F16 : DT_F32;
        Net kept, again;
        Cfg c0, c1;
        build(&kept, &c0, blocks_net, in, 6, 0, precision);
        g_recompute_1x1 = true;
        build(&again, &c1, blocks_net, in, 6, 0, precision);
        assert_int_equal(again.widening_1x1, 3);
        int jit = 0;
        for (int j = 0; j < again.nnodes; j++) jit += again.nodes[j].jit - kept.nodes[j].jit;
        assert_int_equal(jit, 3);
        print_message("recompute_1x1 (%s): kept for backward %zu -> %zu bytes\n", p ? "fp16" : "fp32",
                      kept.plan.act_kept, again.plan.act_kept);
        assert_true(again.plan.act_kept < kept.plan.act_kept);
        net_free(&kept), net_free(&again);
        cfg_free(&c0), cfg_free(&c1);
        StepResult with = train_step(blocks_net, in, 6, 0, precision);
        g_recompute_1x1 = false;
        StepResult without = train_step(blocks_net, in, 6, 0, precision);
        assert_memory_equal(with.grads, without.grads, without.grad_bytes);
        assert_memory_equal(with.buffers, without.buffers, without.buffer_bytes);
        step_result_free(&with), step_result_free(&without);
        g_recompute_1x1 = true;
        expect_equal_gradients(blocks_net, in, 6, precision);
        g_recompute_1x1 = false;
    }
}

// The stem's rule (nn/net.c, stem_jit): a convolution that reads the network's input and
// feeds a batchnorm is computed again in backward instead of kept. The same gradients and
// statistics as the same network (MobileNetV2's pieces: no dropout, whose masks are keyed
// by the layer's place) behind a 1x1 max pooling (an identity, after which the rule does
// not hold and the stem's output is kept) with the same parameters, from floats and from
// bytes, plain and checkpointed; and fewer bytes kept by the stem's output.
static void test_stem_recomputed_bitwise(void **state) {
    char behind[2048];
    snprintf(behind, sizeof behind, "[maxpool]\nsize = 1\nstride = 1\n%s", mobile);
    const Shape in = {.c = 3, .h = 11, .w = 10};
    for (int bytes = 0; bytes < 2; bytes++) {
        g_bytes = bytes;
        Net again, kept;
        Cfg c0, c1;
        build(&again, &c0, mobile, in, 6, 0, DT_F32);
        build(&kept, &c1, behind, in, 6, 0, DT_F32);
        assert_true(again.nodes[0].jit);
        assert_false(kept.nodes[1].jit);
        const size_t stem = (size_t)6 * shape_numel(again.layers[0]->out) * sizeof(float);
        print_message("the stem recomputed (%s): kept for backward %zu -> %zu bytes\n",
                      bytes ? "bytes" : "floats", kept.plan.act_kept, again.plan.act_kept);
        assert_true(again.plan.act_kept + stem <= kept.plan.act_kept);
        float *params = malloc((size_t)again.nparams * sizeof *params);
        assert_non_null(params);
        memcpy(params, again.params, (size_t)again.nparams * sizeof *params);
        g_params = params, g_nparams = again.nparams;
        net_free(&again), net_free(&kept);
        cfg_free(&c0), cfg_free(&c1);
        for (int segments = 0; segments <= 2; segments += 2) {
            StepResult a = train_step(mobile, in, 6, segments, DT_F32);
            StepResult k = train_step(behind, in, 6, segments, DT_F32);
            assert_int_equal(a.grad_bytes, k.grad_bytes);
            assert_memory_equal(a.grads, k.grads, a.grad_bytes);
            assert_memory_equal(a.buffers, k.buffers, a.buffer_bytes);
            step_result_free(&a), step_result_free(&k);
        }
        g_params = NULL;
        free(params);
    }
    g_bytes = false;
}

// fp16 runs every layer over chunks of samples through the fp32 scratch, batchnorm's
// statistics over all the chunks: at 3x180x180 the stem's 4x180x180 outputs make chunks of
// 4 samples, so a batch of 9 runs as 4 + 4 + 1 there (later layers, smaller, in one chunk).
static void test_resnet_fp16_bitwise(void **state) {
    const Shape in = {.c = 3, .h = 180, .w = 180};
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, resnet, in, 9, 0, DT_F16);
    assert_int_equal(exec_chunk(&probe.exec, probe.layers[0], 9), 4);
    net_free(&probe);
    cfg_free(&cfg);
    expect_equal_gradients(resnet, in, 9, DT_F16);
}

// Depthwise convolutions (nn/conv_grouped.c) under checkpointing: each share's weight
// gradient summed over a pass and added in share order, recomputation, fp16 chunks (at
// 3x120x120 the stem's outputs make chunks of several samples).
static void test_mobile_bitwise(void **state) {
    expect_equal_gradients(mobile, (Shape){.c = 3, .h = 11, .w = 10}, 6, DT_F32);
    const Shape in = {.c = 3, .h = 120, .w = 120};
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, mobile, in, 7, 0, DT_F16);
    const int chunk = exec_chunk(&probe.exec, probe.layers[0], 7);
    net_free(&probe);
    cfg_free(&cfg);
    assert_true(chunk > 1 && chunk < 7);
    expect_equal_gradients(mobile, in, 7, DT_F16);
}

// Compressed activations: the records live from the forward (or recomputation) that
// writes them to the last backward that reads them (the poisoned steps), a recomputed
// segment rounds each value as the first forward did (the same random bits: checkpointed
// and plain gradients are bit-identical), in F32 and F16, with batchnorm (whose jit outputs
// are then kept compressed instead of recomputed), dropout, standalone ReLUs and a byte
// input whose stem runs as a sweep. And it compresses: the plan keeps codes, and the
// gradients differ from the exact ones.
static void test_compressed_bitwise(void **state) {
    const int widths[] = {2, 8};
    for (int w = 0; w < 2; w++) {
        g_compress = widths[w];
        expect_equal_gradients(seed_net, (Shape){.c = 1, .h = 12, .w = 12}, 6, DT_F32);
        expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_F32);
        expect_equal_gradients(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, DT_F16);
        g_bytes = true;
        expect_equal_gradients(resnet, (Shape){.c = 3, .h = 16, .w = 16}, 4, DT_F32);
        g_bytes = false;
    }
    StepResult packed = train_step(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, 0, DT_F32);
    g_compress = 0;
    StepResult exact = train_step(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, 0, DT_F32);
    assert_int_not_equal(memcmp(packed.grads, exact.grads, exact.grad_bytes), 0);
    step_result_free(&packed);
    step_result_free(&exact);
    Net net;
    Cfg cfg;
    g_compress = 2;
    build(&net, &cfg, resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, 0, DT_F32);
    g_compress = 0;
    assert_true(net.plan.act_packed > 0);
    int packed_nodes = 0;
    for (int j = 0; j < net.nnodes; j++) packed_nodes += net.nodes[j].packed;
    assert_true(packed_nodes >= 8);
    net_free(&net);
    cfg_free(&cfg);
}

// Handoffs (nn/net.h's net_handoff: a leaf writing its output over its input, or its input
// gradient over its output gradient, a chunk of samples at a time through the scratch) and
// input gradients added into a gradient in place (NodeBufs.adds) give the bits of the plan
// that keeps every buffer apart (NetOptions.apart): gradients, running statistics. Each
// run goes once with the CPU's scratch (chunks of the whole batch here) and once with 48 KB
// (chunks of one sample and a few), plain and checkpointed. The plan hands over in forward
// and backward and adds at least want_fwd, want_bwd and want_adds times; where `shares`,
// its activation block is smaller than apart's.
typedef struct Sharing {
    int fwd, bwd, adds;  // handoffs in forward (and recomputation) and in backward; adds
} Sharing;

static Sharing sharing(const Net *net) {
    Sharing s = {0};
    int *live = malloc((size_t)net->nbufs * sizeof *live);
    assert_non_null(live);
    for (int t = 0; t < net->nevents; t++) {
        int n = 0;
        for (int b = 0; b < net->nbufs; b++)
            if (net->bufs[b].bytes && net_buffer_live(net, b, t)) live[n++] = b;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < n; k++)
                if (net_handoff(net, live[i], live[k], t) && net->bufs[live[i]].offset == net->bufs[live[k]].offset) {
                    if (net->events[t].kind == EV_BACKWARD) s.bwd++;
                    else s.fwd++;
                }
    }
    for (int j = 0; j < net->nnodes; j++) s.adds += net->nbuf[j].adds;
    free(live);
    return s;
}

static void expect_handoffs_exact(const char *text, Shape in, int batch, int segments, DType precision, Sharing want,
                                  bool shares) {
    static Kernels small;
    small = *cpu_kernels();
    small.fp16_scratch_bytes = 48 << 10;
    g_workspace_apart = true;  // in these small networks the workspace in the block wins over the handoffs
    for (int k = 0; k < 2; k++) {
        g_kernels = k ? &small : NULL;
        Net shared, apart;
        Cfg c1, c2;
        build(&shared, &c1, text, in, batch, segments, precision);
        g_apart = true;
        build(&apart, &c2, text, in, batch, segments, precision);
        g_apart = false;
        const Sharing got = sharing(&shared), none = sharing(&apart);
        assert_int_equal(none.fwd + none.bwd + none.adds, 0);
        print_message("%d segments, %s, %s scratch: %d handoffs in forward, %d in backward, %d gradients "
                      "added; the activation block %zu bytes, apart %zu\n",
                      shared.nsegments, precision_name(precision), k ? "48 KB of" : "the CPU's", got.fwd, got.bwd,
                      got.adds, shared.plan.activations, apart.plan.activations);
        assert_true(got.fwd >= want.fwd && got.bwd >= want.bwd && got.adds >= want.adds);
        if (shares) assert_true(shared.plan.activations < apart.plan.activations);
        net_free(&shared), net_free(&apart);
        cfg_free(&c1), cfg_free(&c2);
        StepResult a = train_step(text, in, batch, segments, precision);
        g_apart = true;
        StepResult b = train_step(text, in, batch, segments, precision);
        g_apart = false;
        if (memcmp(a.grads, b.grads, a.grad_bytes) != 0) fail_msg("gradients differ from the plan apart's");
        if (memcmp(a.buffers, b.buffers, a.buffer_bytes) != 0) fail_msg("statistics differ from the plan apart's");
        step_result_free(&a), step_result_free(&b);
    }
    g_kernels = NULL;
    g_workspace_apart = false;
}

static void test_handoffs_bitwise(void **state) {
    const Shape in = {.c = 3, .h = 20, .w = 18};
    const Sharing all = {1, 1, 1}, handoffs = {1, 1, 0};
    g_compress = 2;  // F32 hands over in backward and adds only where it reads codes back
    expect_handoffs_exact(resnet, in, 6, 0, DT_F32, all, true);
    expect_handoffs_exact(resnet, in, 6, NET_SEGMENTS_SQRT, DT_F32, all, true);
    expect_handoffs_exact(mobile, in, 5, 0, DT_F32, handoffs, false);
    g_compress = 8;
    expect_handoffs_exact(blocks_net, (Shape){.c = 3, .h = 12, .w = 12}, 5, 2, DT_F32, all, false);
    // Exact F32 runs hand over only where that saves more than the scratch it needs: not
    // in these small networks (their forward handoffs run the F32 path above).
    g_compress = 0;
    expect_handoffs_exact(deep_net, (Shape){.c = 2, .h = 8, .w = 8}, 5, 0, DT_F16, handoffs, false);
    expect_handoffs_exact(resnet, in, 6, NET_SEGMENTS_SQRT, DT_F16, all, false);
    expect_handoffs_exact(blocks_net, (Shape){.c = 3, .h = 12, .w = 12}, 5, NET_SEGMENTS_SQRT, DT_BF16, all, false);
}

// The byte input (the trainer's): the fp32 expansion of the first layer's input lives at
// that layer's events only (the poisoned steps check it), whole (the direct convolution of
// `resnet`), in chunks of 3 images (a 7x7 GEMM stem at 3x64x64: 602 KB of im2col an image)
// or through the fp16 scratch; checkpointed backward gives the plain run's bits.
static void test_byte_input_bitwise(void **state) {
    char stem7[1024];
    snprintf(stem7, sizeof stem7, "[conv]\nname = conv1\nfilters = 4\nsize = 7\nstride = 2\npad = 3\nbias = 0\n%s",
             strstr(resnet, "[batchnorm]"));
    g_bytes = true;
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_F32);
    expect_equal_gradients(seed_net, (Shape){.c = 1, .h = 12, .w = 12}, 6, DT_F32);
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, stem7, (Shape){.c = 3, .h = 64, .w = 64}, 7, 0, DT_F32);
    assert_int_equal(probe.exec.input_chunk, 3);
    net_free(&probe);
    cfg_free(&cfg);
    expect_equal_gradients(stem7, (Shape){.c = 3, .h = 64, .w = 64}, 7, DT_F32);
    expect_equal_gradients(stem7, (Shape){.c = 3, .h = 64, .w = 64}, 7, DT_F16);
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 180, .w = 180}, 9, DT_F16);
    g_bytes = false;
}

// models/deep.cfg's layers: sqrt checkpointing cuts the activation bytes by 4x or more.
static void test_deep_cfg_saving(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_load(&cfg, "models/deep.cfg", &err)) skip();  // run from the repository root
    Net a, b;
    const Shape in = {.c = 1, .h = 28, .w = 28};
    assert_int_equal(net_create(&a, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .plan_only = true}, cpu_kernels(), &err), 0);
    assert_int_equal(net_create(&b, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .segments = NET_SEGMENTS_SQRT, .sweep = true, .plan_only = true}, cpu_kernels(), &err), 0);
    assert_true(a.nlayers >= 32);
    assert_true(a.plan.activations >= 4 * b.plan.activations);
    print_message("deep.cfg: %d layers, %d segments, activations %.1f MB -> %.1f MB\n",
                  b.nlayers, b.nsegments, a.plan.activations / 1e6, b.plan.activations / 1e6);
    net_free(&a);
    net_free(&b);
    cfg_free(&cfg);
}

// One step of the ResNet with `freeze`: the gradients of the trained parameters (net
// order) into *g, the frozen batchnorms' running statistics and counters checked.
static Net frozen_step(const char *const *freeze, int nfreeze, bool stats, Cfg *cfg, int segments) {
    Net net;
    Error err = {{0}};
    const Shape in = {.c = 3, .h = 10, .w = 9};
    if (cfg_parse(cfg, resnet, "test.cfg", &err)) fail_msg("%s", err.msg);
    const NetOptions opt = {.batch = 6, .precision = DT_F32, .segments = segments, .sweep = segments != 0, .freeze = freeze,
                            .nfreeze = nfreeze, .freeze_stats = stats, .opt_states = 2};
    if (net_create(&net, cfg, in, 10, &opt, cpu_kernels(), &err) || net_init_params(&net, 7, &err))
        fail_msg("%s", err.msg);
    fill_batch(&net, in, 6);
    poisoned_step(&net, 6, (char)0x3c);
    return net;
}

// freeze: the frozen layers get no gradient and no optimizer memory, backward stops at the
// first trained layer, and the trained parameters get the gradients they get without
// freezing, bit for bit (freeze_bn = 0: every batchnorm normalises by the batch). With
// freeze_bn, the frozen batchnorms use and keep their running statistics.
static void test_freeze(void **state) {
    Cfg c0, c1, c2;
    Net full = frozen_step(NULL, 0, false, &c0, 0);
    const char *freeze[] = {"conv1", "bn1", "layer1"};
    for (int segments = 0; segments <= 3; segments += 3) {
        Net part = frozen_step(freeze, 3, false, &c1, segments);
        assert_string_equal(part.nodes[part.first_trained].l->name, "layer2.0.conv1");
        assert_true(part.ntrain < full.ntrain);
        assert_int_equal(part.plan.grads, (size_t)part.ntrain * 4);
        assert_int_equal(part.plan.optimizer, 2 * (size_t)part.ntrain * 4);
        int compared = 0;
        for (int m = 0; m < full.nmodules; m++)
            for (int j = 0; j < full.modules[m]->nparams; j++) {
                const Layer *f = full.modules[m], *p = part.modules[m];
                assert_string_equal(f->params[j].name, p->params[j].name);
                const bool frozen = !strncmp(p->name, "conv1", 5) || !strncmp(p->name, "bn1", 3) ||
                                    !strncmp(p->name, "layer1", 6);
                assert_int_equal(p->grads[j] == NULL, frozen);
                if (frozen) continue;
                const size_t bytes = (size_t)tensor_numel(&f->params[j]) * sizeof(float);
                if (memcmp(f->grads[j], p->grads[j], bytes) != 0)
                    fail_msg("%s: its gradient differs when the stem and layer1 are frozen (%d segments)",
                             p->params[j].name, segments);
                compared++;
            }
        assert_int_equal(compared, 9 + 2 + 2);  // layer2.0, bn2, fc
        net_free(&part);
        cfg_free(&c1);
    }
    // With their running statistics: the frozen batchnorms count no batch and keep their
    // statistics; the trained ones move.
    Net ev = frozen_step(freeze, 3, true, &c2, 0);
    for (int m = 0; m < ev.nmodules; m++) {
        const Layer *l = ev.modules[m];
        if (l->ops != &batchnorm_ops) continue;
        const int64_t tracked = *(const int64_t *)l->buffers[2].data;
        const float *rv = l->buffers[1].data;
        assert_int_equal(tracked, l->frozen ? 0 : 1);
        assert_int_equal(l->frozen_stats, l->frozen);
        if (l->frozen) assert_true(rv[0] == 1.0f);
        else assert_true(rv[0] != 1.0f);
    }
    net_free(&ev);
    cfg_free(&c2);
    net_free(&full);
    cfg_free(&c0);
    // A name that is no layer's.
    Net bad;
    Cfg c3;
    Error err = {{0}};
    if (cfg_parse(&c3, resnet, "test.cfg", &err)) fail_msg("%s", err.msg);
    const char *nope[] = {"layer9"};
    const NetOptions opt = {.batch = 2, .precision = DT_F32, .freeze = nope, .nfreeze = 1};
    assert_int_equal(net_create(&bad, &c3, (Shape){.c = 3, .h = 10, .w = 9}, 10, &opt, cpu_kernels(), &err), -1);
    assert_non_null(strstr(err.msg, "freeze names 'layer9'"));
    cfg_free(&c3);
}

// models/resnet18.cfg at batch 32 on 224x224: the segments are cut by bytes, so the stem's
// 112x112 activations get a segment of their own, and the activation block shrinks by
// more than 1.5x.
static void test_resnet18_cfg_saving(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_load(&cfg, "models/resnet18.cfg", &err)) skip();  // run from the repository root
    Net a, b;
    const Shape in = {.c = 3, .h = 224, .w = 224};
    assert_int_equal(net_create(&a, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F32, .plan_only = true}, cpu_kernels(), &err), 0);
    assert_int_equal(net_create(&b, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F32, .segments = NET_SEGMENTS_SQRT, .sweep = true, .plan_only = true}, cpu_kernels(), &err), 0);
    assert_int_equal(a.nparams, 11181642);  // torchvision.models.resnet18(num_classes=10)
    assert_int_equal(a.nnodes, 53);  // 3 stem, 8 blocks of 5, 3 downsamples of 2, 4 head
    assert_int_equal(b.nsegments, 7);
    char cuts[128] = "";
    for (int g = 1; g < b.nsegments; g++)
        snprintf(cuts + strlen(cuts), sizeof cuts - strlen(cuts), "%s%s", g > 1 ? ", " : "",
                 b.nodes[b.seg_first[g] - 1].l ? b.nodes[b.seg_first[g] - 1].l->name : "a sum");
    print_message("resnet18.cfg at batch 32: cut after %s; kept for backward %.1f MB -> %.1f MB, "
                  "the activation block %.1f MB -> %.1f MB\n", cuts, a.plan.act_kept / 1e6,
                  b.plan.act_kept / 1e6, a.plan.activations / 1e6, b.plan.activations / 1e6);
    assert_true(2 * a.plan.act_kept >= 4 * b.plan.act_kept);
    assert_true(2 * a.plan.activations >= 3 * b.plan.activations);
    // The byte input (the trainer's): the input's 19.27 MB of floats become 4.82 MB of bytes
    // (and 3 KB of table); conv1 (a GEMM, no bias) reads them an image at a time through 0.6 MB.
    Net c;
    assert_int_equal(net_create(&c, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F32, .plan_only = true, .input_bytes = true}, cpu_kernels(), &err), 0);
    assert_int_equal(c.exec.input_chunk, 1);
    print_message("with the byte input: the activation block %.1f MB, kept %.1f MB\n", c.plan.activations / 1e6,
                  c.plan.act_kept / 1e6);
    assert_true(c.plan.activations + 14000000 <= a.plan.activations);
    assert_true(c.plan.act_kept + 14000000 <= a.plan.act_kept);
    // fp16: the executor's 4 scratch slots hold the largest tensor of a layer outside a
    // sweep, as many samples as fit 8 MB (at least one): without sweeps the stem's
    // 64x112x112 (one sample), with them layer1's 64x56x56 (two); the swept stem converts
    // in the sweep's own scratch.
    Net h, hs;
    assert_int_equal(net_create(&h, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F16, .plan_only = true, .input_bytes = true}, cpu_kernels(), &err), 0);
    assert_int_equal(net_create(&hs, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F16, .segments = NET_SEGMENTS_SQRT, .sweep = true, .plan_only = true, .input_bytes = true, .workspace_apart = true}, cpu_kernels(), &err), 0);
    assert_int_equal(h.scratch_bytes, (size_t)4 * 64 * 112 * 112 * 4);  // multiples of 64 bytes
    assert_int_equal(hs.scratch_bytes, (size_t)4 * 2 * 64 * 56 * 56 * 4);
    // fp16: each block's bn1 output exists only in conv2's scratch (NetNode.virt), and a
    // leaf writes its input gradient over its output gradient: layer1's segments keep 4
    // tensors of 12.8 MB at their backward, not 5 (64.2 MB before).
    int virt = 0;
    for (int j = 0; j < hs.nnodes; j++)
        if (hs.nodes[j].virt) {
            virt++;
            assert_non_null(strstr(hs.nodes[j].l->name, ".bn1"));
        }
    assert_int_equal(virt, 8);
    print_message("fp16 with checkpoint=sqrt: the activation block %.1f MB\n", hs.plan.activations / 1e6);
    assert_true(hs.plan.activations < 60000000);
    // The layers' workspace in the activation block's holes (the default) costs no more
    // than beside it, and here less: layer1's Winograd fits beside the sweep's tensors.
    Net hw;
    assert_int_equal(net_create(&hw, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F16, .segments = NET_SEGMENTS_SQRT, .sweep = true, .plan_only = true, .input_bytes = true}, cpu_kernels(), &err), 0);
    print_message("  the layers' workspace in it: %.1f MB and %.1f MB of workspace, against %.1f and %.1f\n",
                  hw.plan.activations / 1e6, hw.plan.workspace / 1e6, hs.plan.activations / 1e6, hs.plan.workspace / 1e6);
    assert_true(hw.plan.act_workspace > 0 && hw.plan.workspace == hw.scratch_bytes);
    assert_true(hw.plan.activations + hw.plan.workspace < hs.plan.activations + hs.plan.workspace);
    net_free(&hw);
    net_free(&h);
    net_free(&hs);
    net_free(&c);
    net_free(&a);
    net_free(&b);
    cfg_free(&cfg);
}

// The plan is the allocation: plan-only and allocated nets agree, and the activation
// block is sound (expect_activation_layout).
static void test_plan_is_allocation(void **state) {
    for (int net_i = 0; net_i < 4; net_i++)  // 2, 3: with the byte input
        for (int segments = 0; segments <= 4; segments++) {
            Net p, n;
            Cfg cfg;
            Error err = {{0}};
            const Shape in = {.c = 2, .h = 8, .w = 8};
            if (cfg_parse(&cfg, net_i % 2 ? resnet : deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
            const NetOptions plan = {.batch = 3, .precision = DT_F32, .segments = segments, .sweep = segments != 0,
                                     .plan_only = true, .input_bytes = net_i >= 2};
            NetOptions real = plan;
            real.plan_only = false;
            assert_int_equal(net_create(&p, &cfg, in, 10, &plan, cpu_kernels(), &err), 0);
            assert_int_equal(net_create(&n, &cfg, in, 10, &real, cpu_kernels(), &err), 0);
            assert_memory_equal(&p.plan, &n.plan, sizeof p.plan);
            expect_activation_layout(&n);
            memset(n.activations, 0x44, n.plan.activations);  // ASan: the block is that large
            // The buffer block holds every F32 buffer and state.
            const char *blo = n.buffers, *bhi = blo + n.plan.buffers;
            for (int m = 0; m < n.nmodules; m++) {
                const Layer *l = n.modules[m];
                for (int j = 0; j < l->nbuffers; j++)
                    if (l->buffers[j].dtype == DT_F32)
                        assert_true((const char *)l->buffers[j].data >= blo &&
                                    (const char *)l->buffers[j].data + tensor_bytes(&l->buffers[j]) <= bhi);
                if (l->ops->state_bytes)
                    assert_true((const char *)l->state >= blo &&
                                (const char *)l->state + l->ops->state_bytes(l) <= bhi);
            }
            net_free(&p);
            net_free(&n);
            cfg_free(&cfg);
        }
}

// The fp32 plan at batch 64 with `segments`.
static MemPlan plan_b64(const Cfg *cfg, Shape in, int segments) {
    Net n;
    Error err = {{0}};
    const NetOptions opt = {.batch = 64, .precision = DT_F32, .segments = segments, .sweep = segments != 0, .plan_only = true};
    if (net_create(&n, cfg, in, 10, &opt, cpu_kernels(), &err)) fail_msg("%s", err.msg);
    const MemPlan p = n.plan;
    net_free(&n);
    return p;
}

// A cost table for net's layers with every call one microsecond a sample and the
// elementwise work a nanosecond a value: a plan's estimate then counts its calls.
static void flat_costs(CostTable *t, const Cfg *cfg, Shape in) {
    Net net;
    Error err = {{0}};
    const NetOptions opt = {.batch = 2, .precision = DT_F32, .plan_only = true};
    if (net_create(&net, cfg, in, 10, &opt, cpu_kernels(), &err) || cost_init(t, &net, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < t->nlayers; i++)
        for (int k = 0; k < CALL_SWEEP_FORWARD; k++)
            if (!net.modules[i]->ops->expand)
                t->call[i][k] = (CallCost){.calls_at = {1}, .fixed = 1e-5, .per = 1e-6};
    t->value = (CallCost){.calls_at = {1}, .fixed = 1e-6, .per = 1e-9};
    net_free(&net);
}

// The budget's plans and its choice, on the deep net at batch 64 (no batchnorm: micro-batches
// are exact) with a cost table that counts calls: the run as configured first; a budget it
// fits needs nothing else; below it, the fastest plan that fits, checkpointed or with
// micro-batches, never a slower one; below every exact plan, fp16 only with leave.
static void test_budget_chooser(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape in = {.c = 2, .h = 16, .w = 16};
    const MemPlan plain = plan_b64(&cfg, in, 0), ckpt = plan_b64(&cfg, in, NET_SEGMENTS_SQRT);
    assert_true(mem_plan_total(&ckpt) < mem_plan_total(&plain));
    CostTable t;
    flat_costs(&t, &cfg, in);
    BudgetQuery q = {.cfg = &cfg, .k = cpu_kernels(), .input = in, .classes = 10, .batch = 64,
                     .base = {.batch = 64, .precision = DT_F32}, .base_accumulate = 1};
    const size_t budgets[] = {mem_plan_total(&plain), mem_plan_total(&plain) - 1, mem_plan_total(&ckpt),
                              mem_plan_total(&ckpt) - 1};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        q.budget = budgets[b];
        FitChoice *plans;
        int n;
        double plain_seconds;
        assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
        assert_true(n > 1);
        assert_int_equal(plans[0].net.segments, 0);  // the run as configured
        assert_int_equal(plans[0].accumulate, 1);
        assert_int_equal(plans[0].fits, b == 0);
        const int c = budget_estimate(&q, plans, n, &t, &plain_seconds, &err);
        assert_true(c >= 0 && plans[c].fits && plans[c].exact);
        assert_true(mem_plan_total(&plans[c].plan) <= q.budget);
        for (int i = 0; i < n; i++) {
            assert_true(plans[i].exact && plans[i].net.precision == DT_F32);
            if (plans[i].fits) assert_true(plans[i].seconds >= plans[c].seconds);
            // Of two as fast, the smaller (the run as configured is kept where it fits).
            if (c != 0 && plans[i].fits && plans[i].seconds == plans[c].seconds)
                assert_true(mem_plan_total(&plans[c].plan) <= mem_plan_total(&plans[i].plan));
        }
        // A saver costs time, but the fused update: the same arithmetic, module by module.
        // It is what the budget takes first where it is enough.
        if (b == 0) assert_int_equal(c, 0);
        else if (plans[c].net.segments == 0 && plans[c].accumulate == 1)
            assert_true(plans[c].net.fused_update && plans[c].seconds == plain_seconds);
        else assert_true(plans[c].seconds > plain_seconds);
        if (b == 1) assert_true(plans[c].net.fused_update && plans[c].net.segments == 0);
        if (b == 3) assert_true(plans[c].accumulate > 1 || plans[c].net.segments > 0);
        free(plans);
    }
    // A run that asks for the fused update keeps it in every plan of one fp32 batch, and
    // goes without it where micro-batches need every gradient before the update.
    q.base.fused_update = true;
    q.budget = mem_plan_total(&ckpt) - 1;
    FitChoice *fp;
    int nf;
    assert_int_equal(budget_plans(&q, &fp, &nf, &err), 0);
    bool micro = false;
    for (int i = 0; i < nf; i++) {
        assert_int_equal(fp[i].net.fused_update, fp[i].accumulate == 1);
        micro |= fp[i].accumulate > 1;
        if (fp[i].net.fused_update) assert_true(fp[i].plan.grads < fp[i].plan.grads_unfused);
    }
    assert_true(micro);
    free(fp);
    q.base.fused_update = false;
    // Below every exact plan: nothing without leave; with auto_fp16, fp16 plans only.
    q.budget = 1;
    FitChoice *plans;
    int n;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    const int s32 = budget_smallest(plans, n);
    assert_false(plans[s32].fits);
    q.budget = mem_plan_total(&plans[s32].plan) - 1;
    free(plans);
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    for (int i = 0; i < n; i++) assert_false(plans[i].fits);
    free(plans);
    q.leave.fp16 = true;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    for (int i = 0; i < n; i++) assert_true(!plans[i].fits || (plans[i].net.precision == DT_F16 && !plans[i].exact));
    double plain_seconds;
    const int c = budget_estimate(&q, plans, n, &t, &plain_seconds, &err);
    if (c >= 0) assert_int_equal(plans[c].net.precision, DT_F16);
    free(plans);
    cost_free(&t);
    cfg_free(&cfg);
}

// Issue 30: on a network with batchnorm, micro-batches change the training (each is
// normalised by its own statistics): the budget never lists them without the user's leave
// (auto_microbatch), and says what they change when it may. Frozen batchnorms (running
// statistics) couple nothing.
static void test_budget_leave(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, resnet, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape in = {.c = 3, .h = 10, .w = 9};
    BudgetQuery q = {.cfg = &cfg, .k = cpu_kernels(), .input = in, .classes = 10, .batch = 64,
                     .base = {.batch = 64, .precision = DT_F32}, .base_accumulate = 1, .budget = 1};
    FitChoice *plans;
    int n;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    for (int i = 0; i < n; i++) assert_true(plans[i].coupled && plans[i].accumulate == 1);
    const int s = budget_smallest(plans, n);
    q.budget = mem_plan_total(&plans[s].plan) - 1;  // below every exact plan
    free(plans);
    q.leave.microbatch = true;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    int micro = -1;
    for (int i = 0; i < n; i++)
        if (plans[i].fits) {
            assert_true(plans[i].accumulate > 1 && !plans[i].exact);
            micro = i;
        }
    assert_true(micro >= 0);
    char why[300];
    char want[200];
    snprintf(want, sizeof want, "batchnorm normalises each micro-batch of %d by its own statistics and "
             "moves its running statistics %d times a step", plans[micro].net.batch, plans[micro].accumulate);
    assert_non_null(strstr(fit_changes(&plans[micro], &q.base, 1, 64, why, sizeof why), want));
    free(plans);
    // The same network with every batchnorm frozen (freeze_stats): micro-batches are exact
    // up to rounding, and listed without leave.
    const char *all[] = {"conv1", "bn1", "layer1", "layer2", "bn2"};  // all but fc
    q.base.freeze = all, q.base.nfreeze = 5, q.base.freeze_stats = true;
    q.leave.microbatch = false;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    bool any_micro = false;
    for (int i = 0; i < n; i++) {
        assert_false(plans[i].coupled);
        assert_true(plans[i].exact);
        any_micro |= plans[i].accumulate > 1;
        assert_string_equal(fit_changes(&plans[i], &q.base, 1, 64, why, sizeof why), "");
    }
    assert_true(any_micro);
    free(plans);
    // Compressed optimizer state (auto_compress): with SGD momentum's state, a budget
    // between the smallest compressed plan and the smallest exact one lists compressed
    // plans that fit, never as exact, and says what they change; without leave none fits.
    q.base.freeze = NULL, q.base.nfreeze = 0, q.base.freeze_stats = false;
    const Optimizer sgd = {.kind = OPTIM_SGD, .momentum = 0.9};
    optim_plan(&sgd, &q.base);
    q.budget = 1;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    const size_t exact_min = mem_plan_total(&plans[budget_smallest(plans, n)].plan);
    free(plans);
    q.budget = exact_min - 1;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    for (int i = 0; i < n; i++) assert_false(plans[i].fits);
    free(plans);
    q.leave.compress = true;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    int fit = 0, q8 = -1;
    for (int i = 0; i < n; i++) {
        if (!plans[i].fits) continue;
        fit++;
        assert_true(plans[i].net.opt_format != STATE_F32 && !plans[i].exact && plans[i].accumulate == 1);
        if (plans[i].net.opt_format == STATE_INT8) q8 = i;
    }
    assert_true(fit > 0 && q8 >= 0);
    assert_non_null(strstr(fit_changes(&plans[q8], &q.base, 1, 64, why, sizeof why),
                           "the optimizer state is stored as int8"));
    free(plans);
    cfg_free(&cfg);
    // Compressed activations, with the same leave, on a deep network (where the codes of
    // many activations outweigh the scratch they are read back through): below every plan
    // without them, the plans that fit compress the activations, all to one width, the
    // widest that fits (8 bits before 4 before 2), and the message says so.
    if (cfg_parse(&cfg, deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
    q.input = (Shape){.c = 2, .h = 12, .w = 12};
    q.budget = 1;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    size_t least[9];  // by width (0: none)
    for (int w = 0; w <= 8; w++) least[w] = SIZE_MAX;
    for (int i = 0; i < n; i++) {
        size_t *m = &least[plans[i].net.compress];
        if (mem_plan_total(&plans[i].plan) < *m) *m = mem_plan_total(&plans[i].plan);
    }
    free(plans);
    assert_true(least[8] > least[4] && least[4] > least[2] && least[2] < least[0]);
    q.budget = least[0] - 1;
    const int widest = least[8] <= q.budget ? 8 : least[4] <= q.budget ? 4 : 2;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    int width = 0;
    for (int i = 0; i < n; i++) {
        if (!plans[i].fits) continue;
        assert_true(plans[i].net.compress > 0 && !plans[i].exact);
        if (!width) width = plans[i].net.compress;
        assert_int_equal(plans[i].net.compress, width);
        snprintf(want, sizeof want, "kept as %d-bit codes", width);
        assert_non_null(strstr(fit_changes(&plans[i], &q.base, 1, 64, why, sizeof why), want));
    }
    assert_int_equal(width, widest);
    free(plans);
    cfg_free(&cfg);
}

// The probe times every call of a real step: a leaf that ran has a cost, and a plan's
// estimate is about the probe's measured step (on a quiet machine within a few percent;
// here within 3x either way, the machine being shared); checkpointing costs more.
static void test_cost_probe(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, resnet, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape in = {.c = 3, .h = 32, .w = 32};
    BudgetQuery q = {.cfg = &cfg, .k = cpu_kernels(), .input = in, .classes = 10, .batch = 16,
                     .base = {.batch = 16, .precision = DT_F32}, .base_accumulate = 1, .budget = SIZE_MAX};
    FitChoice *plans;
    int n;
    assert_int_equal(budget_plans(&q, &plans, &n, &err), 0);
    // The estimate against the probe's wall time, which anything else on the machine
    // stretches (a CI run beside other work measured 0.0059 s against 0.0265): up to 3
    // probes, the first that agrees within 3x.
    double plain_seconds = 0, measured = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        CostTable t;
        double wall;
        assert_int_equal(budget_probe(&q, &plans[0], 6, &t, &wall, &err), 0);
        Net net;
        NetOptions opt = plans[0].net;
        opt.plan_only = true;
        assert_int_equal(net_create(&net, &cfg, in, 10, &opt, cpu_kernels(), &err), 0);
        for (int j = 0; j < net.nnodes; j++)
            if (net.nodes[j].kind == NODE_LEAF) {
                const CallCost *c = &t.call[net.nodes[j].l->index][CALL_FORWARD];
                assert_true(c->calls_at[0] > 0 && c->calls_at[1] > 0 && c->fixed + c->per > 0);
            }
        net_free(&net);
        assert_true(budget_estimate(&q, plans, n, &t, &plain_seconds, &err) >= 0);
        cost_free(&t);
        measured = wall / 4.5;  // 3 steps of 16 samples, 3 of 8: building and warm-up included
        print_message("resnet 3x32x32 b16: a step estimated %.4f s, the probe's %.4f s a step\n", plain_seconds,
                      measured);
        if (plain_seconds > measured / 3 && plain_seconds < measured * 3) break;
    }
    assert_true(plain_seconds > measured / 3 && plain_seconds < measured * 3);
    for (int i = 1; i < n; i++) assert_true(plans[i].seconds >= plain_seconds * 0.95);
    free(plans);
    cfg_free(&cfg);
}

int main(void) {
    cpu_set_threads(2);
    make_deep();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_network_bitwise),
        cmocka_unit_test(test_deep_network_bitwise),
        cmocka_unit_test(test_fp16_bitwise),
        cmocka_unit_test(test_bf16_bitwise),
        cmocka_unit_test(test_bf16_matmul_bitwise),
        cmocka_unit_test(test_resnet_bitwise),
        cmocka_unit_test(test_blocks_bitwise),
        cmocka_unit_test(test_recompute_1x1_bitwise),
        cmocka_unit_test(test_stem_recomputed_bitwise),
        cmocka_unit_test(test_resnet_fp16_bitwise),
        cmocka_unit_test(test_mobile_bitwise),
        cmocka_unit_test(test_byte_input_bitwise),
        cmocka_unit_test(test_compressed_bitwise),
        cmocka_unit_test(test_handoffs_bitwise),
        cmocka_unit_test(test_deep_cfg_saving),
        cmocka_unit_test(test_resnet18_cfg_saving),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_plan_is_allocation),
        cmocka_unit_test(test_budget_chooser),
        cmocka_unit_test(test_budget_leave),
        cmocka_unit_test(test_cost_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
