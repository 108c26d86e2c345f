// test_segments.c: activation checkpointing and the memory plan (DESIGN.md decisions 2
// and 6): checkpointed backward equals plain backward bit for bit, dropout included; the
// plan is what is allocated; the budget chooser's choices.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/budget.h"
#include "../nn/cfg.h"
#include "../nn/net.h"

// The seed network, dropout included.
static const char *seed_net =
    "[conv]\nname = conv1\nfilters = 8\nsize = 3\nactivation = relu\n"
    "[conv]\nname = conv2\nfilters = 16\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n[dropout]\np = 0.25\n[flatten]\n"
    "[linear]\nname = fc1\noutputs = 32\nactivation = relu\n[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 10\n[log_softmax]\n";

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

// Parameter gradients after one forward/backward of a fixed random batch in train mode.
static float *gradients(const char *text, Shape in, int batch, int segments, DType precision,
                        int *nsegments) {
    Net net;
    Cfg cfg;
    build(&net, &cfg, text, in, batch, segments, precision);
    srand(11);
    for (int64_t i = 0; i < batch * shape_numel(in); i++) net.input_buf[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < batch; i++) net.labels[i] = rand() % 10;
    net_zero_grads(&net);
    net_forward(&net, batch, true, 5, 3, 0);
    net_loss(&net, batch, batch, true);
    net_backward(&net, batch, 5, 3, 0);
    float *g = malloc((size_t)net.nparams * sizeof(float));
    assert_non_null(g);
    memcpy(g, net.grads, (size_t)net.nparams * sizeof(float));
    *nsegments = net.nsegments;
    net_free(&net);
    cfg_free(&cfg);
    return g;
}

static void expect_equal_gradients(const char *text, Shape in, int batch, DType precision) {
    Net probe;
    Cfg cfg;
    build(&probe, &cfg, text, in, 1, 0, precision);
    const size_t bytes = (size_t)probe.nparams * sizeof(float);
    const int nlayers = probe.nlayers;
    net_free(&probe);
    cfg_free(&cfg);
    int s0, s;
    float *plain = gradients(text, in, batch, 0, precision, &s0);
    assert_int_equal(s0, 1);
    const int counts[] = {NET_SEGMENTS_SQRT, 2, 3, nlayers};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        float *ckpt = gradients(text, in, batch, counts[c], precision, &s);
        assert_true(s > 1);
        if (memcmp(plain, ckpt, bytes) != 0) fail_msg("gradients differ with %d segments", s);
        free(ckpt);
    }
    free(plain);
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

// The plan is the allocation: plan-only and allocated nets agree, every activation buffer
// lies inside the block (ASan checks the writes), and segment scratch is shared.
static void test_plan_is_allocation(void **state) {
    for (int segments = 0; segments <= 4; segments++) {
        Net p, n;
        Cfg cfg;
        Error err = {{0}};
        const Shape in = {.c = 2, .h = 8, .w = 8};
        if (cfg_parse(&cfg, deep_net, "test.cfg", &err)) fail_msg("%s", err.msg);
        const NetOptions plan = {.batch = 3, .precision = DT_F32, .segments = segments, .plan_only = true};
        NetOptions real = plan;
        real.plan_only = false;
        assert_int_equal(net_create(&p, &cfg, in, 10, &plan, &cpu_kernels, &err), 0);
        assert_int_equal(net_create(&n, &cfg, in, 10, &real, &cpu_kernels, &err), 0);
        assert_memory_equal(&p.plan, &n.plan, sizeof p.plan);
        const char *lo = n.activations, *hi = lo + n.plan.activations;
        size_t distinct = 0;
        for (int i = 0; i < n.nlayers; i++) {
            const size_t bytes = (size_t)3 * shape_numel(n.layers[i]->out) *
                                 (i == n.nlayers - 1 ? 4 : dtype_sizes[n.precision]);
            assert_true((const char *)n.acts[i] >= lo && (const char *)n.acts[i] + bytes <= hi);
            memset(n.acts[i], 0xff, bytes);
            distinct += bytes;
        }
        // Without segments every output has its own buffer; with them they share.
        if (segments <= 1) assert_true(n.plan.act_scratch == 0);
        else assert_true(n.plan.act_saved + n.plan.act_scratch < distinct);
        net_free(&p);
        net_free(&n);
        cfg_free(&cfg);
    }
}

// The chooser on a table of budgets for the seed network at batch 64: the ladder is
// as configured, checkpointing, then accumulation, then fp16 (when allowed).
static void test_budget_chooser(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, seed_net, "test.cfg", &err)) fail_msg("%s", err.msg);
    const Shape in = {.c = 1, .h = 28, .w = 28};
    const NetOptions base = {.batch = 64, .precision = DT_F32};
    MemPlan plain, ckpt;
    Net n;
    assert_int_equal(net_create(&n, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .plan_only = true}, &cpu_kernels, &err), 0);
    plain = n.plan;
    net_free(&n);
    assert_int_equal(net_create(&n, &cfg, in, 10, &(NetOptions){.batch = 64, .precision = DT_F32, .segments = NET_SEGMENTS_SQRT, .plan_only = true}, &cpu_kernels, &err), 0);
    ckpt = n.plan;
    net_free(&n);
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
        assert_int_equal(fit_budget(&cfg, in, 10, 64, base, 1, 0, table[t].budget,
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
    assert_int_equal(fit_budget(&cfg, in, 10, 64, base, 1, 0, 1, false, &smallest32, &fits, &err), 0);
    const size_t below = mem_plan_total(&smallest32.plan) - 1;
    FitChoice c;
    assert_int_equal(fit_budget(&cfg, in, 10, 64, base, 1, 0, below, false, &c, &fits, &err), 0);
    assert_false(fits);
    assert_int_equal(fit_budget(&cfg, in, 10, 64, base, 1, 0, below, true, &c, &fits, &err), 0);
    if (fits) assert_int_equal(c.net.precision, DT_F16);
    cfg_free(&cfg);
}

int main(void) {
    cpu_set_threads(2);
    make_deep();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_network_bitwise),
        cmocka_unit_test(test_deep_network_bitwise),
        cmocka_unit_test(test_fp16_bitwise),
        cmocka_unit_test(test_deep_cfg_saving),
        cmocka_unit_test(test_plan_is_allocation),
        cmocka_unit_test(test_budget_chooser),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
