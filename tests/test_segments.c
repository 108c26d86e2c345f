// test_segments.c: activation checkpointing and the memory plan (DESIGN.md decisions 2
// and 6): checkpointed backward equals plain backward bit for bit, dropout included; the
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

#include "../nn/budget.h"
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

static void build(Net *net, Cfg *cfg, const char *text, Shape in, int batch, int segments,
                  DType precision) {
    Error err = {{0}};
    if (cfg_parse(cfg, text, "test.cfg", &err)) fail_msg("%s", err.msg);
    const NetOptions opt = {.batch = batch, .precision = precision, .segments = segments};
    if (net_create(net, cfg, in, 10, &opt, &cpu_kernels, &err)) fail_msg("%s", err.msg);
    if (net_init_params(net, 7, &err)) fail_msg("%s", err.msg);
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
    assert_int_equal(poison_event, net->nlayers);
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
    for (int64_t i = 0; i < batch * shape_numel(in); i++) net->input_buf[i] = (float)rand() / RAND_MAX - 0.5f;
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
    const int nlayers = probe.nlayers;
    net_free(&probe);
    cfg_free(&cfg);
    StepResult plain = train_step(text, in, batch, 0, precision);
    assert_int_equal(plain.nsegments, 1);
    for (int c = 0; c < plain.ncounters; c++) assert_int_equal(plain.counters[c], 1);
    const int counts[] = {NET_SEGMENTS_SQRT, 2, 3, nlayers};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        StepResult ckpt = train_step(text, in, batch, counts[c], precision);
        assert_true(ckpt.nsegments > 1);
        if (memcmp(plain.grads, ckpt.grads, plain.grad_bytes) != 0)
            fail_msg("gradients differ with %d segments", ckpt.nsegments);
        if (memcmp(plain.buffers, ckpt.buffers, plain.buffer_bytes) != 0)
            fail_msg("running or batch statistics differ with %d segments", ckpt.nsegments);
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

static void test_resnet_bitwise(void **state) {
    expect_equal_gradients(resnet, (Shape){.c = 3, .h = 10, .w = 9}, 6, DT_F32);
}

// fp16 runs every layer over chunks of samples through the fp32 scratch, batchnorm's
// statistics over all the chunks: at 3x180x180 the stem's 4x180x180 outputs make chunks of
// 8 samples, so a batch of 9 runs as 8 + 1 there (later layers, smaller, in one chunk).
static void test_resnet_fp16_bitwise(void **state) {
    const Shape in = {.c = 3, .h = 180, .w = 180};
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, resnet, in, 9, 0, DT_F16);
    assert_int_equal(exec_chunk(&probe.exec, probe.layers[0], 9), 8);
    net_free(&probe);
    cfg_free(&cfg);
    expect_equal_gradients(resnet, in, 9, DT_F16);
}

// models/deep.cfg's layers: sqrt checkpointing cuts the activation bytes by 4x or more.
static void test_deep_cfg_saving(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_load(&cfg, "models/deep.cfg", &err)) skip();  // run from the repository root
    Net a, b;
    const Shape in = {.c = 1, .h = 28, .w = 28};
    assert_int_equal(net_create(&a, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .plan_only = true}, &cpu_kernels, &err), 0);
    assert_int_equal(net_create(&b, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .segments = NET_SEGMENTS_SQRT, .plan_only = true}, &cpu_kernels, &err), 0);
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
    const NetOptions opt = {.batch = 6, .precision = DT_F32, .segments = segments, .freeze = freeze,
                            .nfreeze = nfreeze, .freeze_stats = stats, .opt_states = 2};
    if (net_create(&net, cfg, in, 10, &opt, &cpu_kernels, &err) || net_init_params(&net, 7, &err))
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
        assert_int_equal(part.first_trained, 4);  // layer2.0
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
    assert_int_equal(net_create(&bad, &c3, (Shape){.c = 3, .h = 10, .w = 9}, 10, &opt, &cpu_kernels, &err), -1);
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
    assert_int_equal(net_create(&a, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F32, .plan_only = true}, &cpu_kernels, &err), 0);
    assert_int_equal(net_create(&b, &cfg, in, 10, &(NetOptions){.batch = 32, .precision = DT_F32, .segments = NET_SEGMENTS_SQRT, .plan_only = true}, &cpu_kernels, &err), 0);
    assert_int_equal(a.nparams, 11181642);  // torchvision.models.resnet18(num_classes=10)
    assert_int_equal(b.nsegments, 4);
    // conv1 and bn1 (whose 112x112 outputs are the largest), with or without the max pooling
    assert_true(b.seg_first[1] == 2 || b.seg_first[1] == 3);
    print_message("resnet18.cfg at batch 32: cut after layers %d, %d, %d; kept for backward "
                  "%.1f MB -> %.1f MB, the activation block %.1f MB -> %.1f MB\n",
                  b.seg_first[1], b.seg_first[2], b.seg_first[3], a.plan.act_kept / 1e6,
                  b.plan.act_kept / 1e6, a.plan.activations / 1e6, b.plan.activations / 1e6);
    assert_true(2 * a.plan.act_kept >= 4 * b.plan.act_kept);
    assert_true(2 * a.plan.activations >= 3 * b.plan.activations);
    net_free(&a);
    net_free(&b);
    cfg_free(&cfg);
}

// The plan is the allocation: plan-only and allocated nets agree, and the activation
// block is sound (expect_activation_layout).
static void test_plan_is_allocation(void **state) {
    for (int net_i = 0; net_i < 2; net_i++)
        for (int segments = 0; segments <= 4; segments++) {
            Net p, n;
            Cfg cfg;
            Error err = {{0}};
            const Shape in = {.c = 2, .h = 8, .w = 8};
            if (cfg_parse(&cfg, net_i ? resnet : deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
            const NetOptions plan = {.batch = 3, .precision = DT_F32, .segments = segments, .plan_only = true};
            NetOptions real = plan;
            real.plan_only = false;
            assert_int_equal(net_create(&p, &cfg, in, 10, &plan, &cpu_kernels, &err), 0);
            assert_int_equal(net_create(&n, &cfg, in, 10, &real, &cpu_kernels, &err), 0);
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
    const NetOptions opt = {.batch = 64, .precision = DT_F32, .segments = segments, .plan_only = true};
    if (net_create(&n, cfg, in, 10, &opt, &cpu_kernels, &err)) fail_msg("%s", err.msg);
    const MemPlan p = n.plan;
    net_free(&n);
    return p;
}

// The chooser on a table of budgets for the deep net at batch 64 (on the seed network,
// whose peak is in the backward of its two convolutions, checkpointing saves nothing):
// the ladder is as configured, checkpointing, then accumulation, then fp16 (when
// allowed).
static void test_budget_chooser(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape in = {.c = 2, .h = 16, .w = 16};
    const NetOptions base = {.batch = 64, .precision = DT_F32};
    const MemPlan plain = plan_b64(&cfg, in, 0), ckpt = plan_b64(&cfg, in, NET_SEGMENTS_SQRT);
    assert_true(mem_plan_total(&ckpt) < mem_plan_total(&plain));

    struct {
        size_t budget;
        bool allow_fp16, fits;
        int segments, accumulate;
        DType precision;
    } table[] = {
        {mem_plan_total(&plain), false, true, 0, 1, DT_F32},                  // fits as is
        {mem_plan_total(&plain) - 1, false, true, NET_SEGMENTS_SQRT, 1, DT_F32},  // checkpointing
        {mem_plan_total(&ckpt), false, true, NET_SEGMENTS_SQRT, 1, DT_F32},
        {mem_plan_total(&ckpt) - 1, false, true, NET_SEGMENTS_SQRT, 2, DT_F32},   // + accumulate 2
        {1, false, false, 0, 0, DT_F32},                                          // nothing fits
    };
    for (size_t t = 0; t < sizeof table / sizeof table[0]; t++) {
        FitChoice c;
        bool fits;
        assert_int_equal(fit_budget(&cfg, &cpu_kernels, in, 10, 64, base, 1, 0, table[t].budget,
                                    table[t].allow_fp16, &c, &fits, &err), 0);
        assert_int_equal(fits, table[t].fits);
        if (!fits) {
            assert_true(mem_plan_total(&c.plan) > table[t].budget);  // the smallest it found
            continue;
        }
        assert_int_equal(c.net.segments, table[t].segments);
        assert_int_equal(c.accumulate, table[t].accumulate);
        assert_int_equal(c.net.batch, 64 / table[t].accumulate);
        assert_int_equal(c.net.precision, table[t].precision);
        assert_true(mem_plan_total(&c.plan) <= table[t].budget);
    }
    // fp16 only when allowed, and only after the fp32 ladder: a budget below the
    // smallest fp32 plan (accumulate 64) that the fp16 ladder meets.
    FitChoice smallest32;
    bool fits;
    assert_int_equal(fit_budget(&cfg, &cpu_kernels, in, 10, 64, base, 1, 0, 1, false, &smallest32, &fits, &err), 0);
    const size_t below = mem_plan_total(&smallest32.plan) - 1;
    FitChoice c;
    assert_int_equal(fit_budget(&cfg, &cpu_kernels, in, 10, 64, base, 1, 0, below, false, &c, &fits, &err), 0);
    assert_false(fits);
    assert_int_equal(fit_budget(&cfg, &cpu_kernels, in, 10, 64, base, 1, 0, below, true, &c, &fits, &err), 0);
    if (fits) assert_int_equal(c.net.precision, DT_F16);
    cfg_free(&cfg);
    // The seed network: checkpointing saves nothing there (its peak is in the backward of
    // its convolutions), so a budget just below its plan takes accumulation alone.
    Cfg seed;
    if (cfg_parse(&seed, seed_net, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape mnist = {.c = 1, .h = 28, .w = 28};
    const MemPlan p0 = plan_b64(&seed, mnist, 0), p1 = plan_b64(&seed, mnist, NET_SEGMENTS_SQRT);
    assert_true(mem_plan_total(&p1) >= mem_plan_total(&p0));
    assert_int_equal(fit_budget(&seed, &cpu_kernels, mnist, 10, 64, base, 1, 0, mem_plan_total(&p0) - 1, false, &c, &fits, &err), 0);
    assert_true(fits);
    assert_int_equal(c.net.segments, 0);
    assert_int_equal(c.accumulate, 2);
    // The fused update stays while the batch stays whole and fp32 (its plan the smaller),
    // and goes where the budget takes micro-batches, which need every gradient first.
    NetOptions fused = base;
    fused.fused_update = true;
    assert_int_equal(fit_budget(&seed, &cpu_kernels, mnist, 10, 64, fused, 1, 0, mem_plan_total(&p0) - 1, false, &c, &fits, &err), 0);
    assert_true(fits && c.net.fused_update && c.accumulate == 1 && c.net.segments == 0);
    assert_true(c.plan.grads < c.plan.grads_unfused && c.plan.grads_unfused == p0.grads);
    assert_int_equal(mem_plan_total(&c.plan), mem_plan_total(&p0) - (p0.grads - c.plan.grads));
    const size_t fused_total = mem_plan_total(&c.plan);
    assert_int_equal(fit_budget(&seed, &cpu_kernels, mnist, 10, 64, fused, 1, 0, fused_total - 1, false, &c, &fits, &err), 0);
    assert_true(fits && !c.net.fused_update && c.accumulate == 2);
    cfg_free(&seed);
}

int main(void) {
    cpu_set_threads(2);
    make_deep();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_network_bitwise),
        cmocka_unit_test(test_deep_network_bitwise),
        cmocka_unit_test(test_fp16_bitwise),
        cmocka_unit_test(test_resnet_bitwise),
        cmocka_unit_test(test_resnet_fp16_bitwise),
        cmocka_unit_test(test_deep_cfg_saving),
        cmocka_unit_test(test_resnet18_cfg_saving),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_plan_is_allocation),
        cmocka_unit_test(test_budget_chooser),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
