// test_optim.c: the optimizers and the schedule (nn/optim.c and the CPU kernels).
//
// Adadelta is checked three ways: against values that torch.optim.Adadelta (torch 1.13)
// printed for the same numbers, against PyTorch's formula written out here in double, and
// on a vector long enough for the kernel's parallel loop. SGD (momentum, dampening,
// nesterov, weight decay) and AdamW against torch.optim's numbers
// (tests/torch_optim_reference.py), weight decay left out of 1-D parameters, frozen
// parameters left alone; the schedules (StepLR, warmup and cosine, OneCycleLR with its
// cycled momentum, ReduceLROnPlateau) against torch.optim.lr_scheduler's. Tolerance:
// 1e-6 relative, about ten float roundings; a wrong formula (a missing sqrt, rho and 1-rho
// swapped, the state updated in the wrong order) is off by far more.
//
// The fused update (NetOptions.fused_update: each module updated during backward, its
// gradients in its node's buffer of the activation block) against the update after
// backward, bit for bit: every optimizer, with and without weight decay and frozen layers,
// on the seed network, a ResNet and the ResNet checkpointed; parameters, optimizer state
// and batchnorm buffers compared byte for byte after each of 3 steps; no gradient block.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/cfg.h"
#include "../nn/checkpoint.h"
#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "testutil.h"

#define REL_TOL 1e-6

// A network whose parameters are one vector of n: a linear layer from n - 1 features to
// one output, weight (1, n - 1) then bias (1), trained by `o` (its state planned).
typedef struct Params {
    Net net;
    Optimizer o;
} Params;

static void params_init(Params *p, int64_t n, Optimizer o) {
    memset(p, 0, sizeof *p);
    p->o = o;
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, "[linear]\nname = w\noutputs = 1\n[log_softmax]\n", "t.cfg", &err))
        fail_msg("%s", err.msg);
    NetOptions opt = {.batch = 1, .precision = DT_F32};
    optim_plan(&o, &opt);
    if (net_create(&p->net, &cfg, (Shape){.c = (int)(n - 1), .h = 1, .w = 1}, 1, &opt, cpu_kernels(), &err))
        fail_msg("%s", err.msg);
    cfg_free(&cfg);
    assert_int_equal(p->net.nparams, n);  // zero state: PyTorch's initial one
}

static void params_free(Params *p) { net_free(&p->net); }

// Optimizer state s of parameter element i.
// (The weight's state, then the bias's: trained scalars in state_dict order.)
static float opt_state_at(const Params *p, int s, int64_t i) {
    return ((const float *)net_opt_state(&p->net, p->net.modules[0], 0, s).codes)[i];
}

static void expect_rel(const char *what, int i, double got, double want) {
    if (!(fabs(got - want) <= REL_TOL * fabs(want)))
        fail_msg("%s[%d] = %.9g, want %.9g (relative error %.3g)", what, i, got, want,
                 fabs(got - want) / fabs(want));
}

// PyTorch's Adadelta step written out in double (torch/optim/adadelta.py, 1.13):
//   g += wd * p; sq = rho*sq + (1-rho) g^2; std = sqrt(sq + eps);
//   delta = sqrt(acc + eps) / std * g; acc = rho*acc + (1-rho) delta^2; p -= lr * delta.
static void adadelta_ref(double *p, double *sq, double *acc, const double *g, int n, double lr,
                         double rho, double eps, double wd) {
    for (int i = 0; i < n; i++) {
        const double gi = g[i] + wd * p[i];
        sq[i] = rho * sq[i] + (1 - rho) * gi * gi;
        const double std = sqrt(sq[i] + eps);
        const double delta = sqrt(acc[i] + eps) / std * gi;
        acc[i] = rho * acc[i] + (1 - rho) * delta * delta;
        p[i] -= lr * delta;
    }
}

// The four parameters and three gradients given to torch.optim.Adadelta; the zero
// gradient checks that a parameter with g = 0 stays put (without weight decay).
static const float p0[4] = {1.5f, -0.75f, 0.25f, 2.0f};
static const float grads[3][4] = {
    {0.1f, -0.2f, 0.3f, -0.4f},
    {0.5f, 0.5f, -0.1f, 0.0f},
    {-1.0f, 0.02f, 0.3f, 2.0f},
};

// Runs three steps of adadelta_step and checks each against the double formula and the
// final values against torch's.
static void check_three_steps(const Optimizer *opt, double lr, const double want_p[3][4],
                              const double want_sq[4], const double want_acc[4]) {
    Params p;
    params_init(&p, 4, *opt);
    memcpy(p.net.params, p0, sizeof p0);
    double rp[4], rsq[4] = {0}, racc[4] = {0}, rg[4];
    for (int i = 0; i < 4; i++) rp[i] = p0[i];
    for (int s = 0; s < 3; s++) {
        memcpy(p.net.grads, grads[s], sizeof grads[s]);
        for (int i = 0; i < 4; i++) rg[i] = grads[s][i];
        optim_step(&p.net, opt, NULL, lr, s);
        adadelta_ref(rp, rsq, racc, rg, 4, lr, opt->rho, opt->eps, opt->weight_decay);
        for (int i = 0; i < 4; i++) {
            expect_rel("param vs formula", i, p.net.params[i], rp[i]);
            expect_rel("param vs torch 1.13", i, p.net.params[i], want_p[s][i]);
            expect_rel("square_avg vs formula", i, opt_state_at(&p, 0, i), rsq[i]);
            expect_rel("acc_delta vs formula", i, opt_state_at(&p, 1, i), racc[i]);
        }
        // The step reads the gradients, it does not consume them.
        assert_memory_equal(p.net.grads, grads[s], sizeof grads[s]);
    }
    for (int i = 0; i < 4; i++) {
        expect_rel("square_avg vs torch 1.13", i, opt_state_at(&p, 0, i), want_sq[i]);
        expect_rel("acc_delta vs torch 1.13", i, opt_state_at(&p, 1, i), want_acc[i]);
    }
    params_free(&p);
}

static void test_adadelta_torch_defaults(void **state) {
    // torch.optim.Adadelta([p], lr=1.0, rho=0.9, eps=1e-6, weight_decay=0), torch 1.13,
    // float32, p.grad set to grads[s] before each opt.step(): p after each step, then the
    // state after the third.
    static const double want_p[3][4] = {
        {1.4968392848968506, -0.7468380928039551, 0.24683789908885956, 2.003162145614624},
        {1.4924466609954834, -0.7510189414024353, 0.24832028150558472, 2.003162145614624},
        {1.498018741607666, -0.7512568235397339, 0.2449890673160553, 1.9988722801208496},
    };
    static const double want_sq[4] = {0.12330999970436096, 0.025779999792575836,
                                      0.017190001904964447, 0.4129599928855896};
    static const double want_acc[4] = {5.650511411658954e-06, 2.3886325379862683e-06,
                                       2.117375970556168e-06, 2.6502621039981022e-06};
    const Optimizer opt = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};
    check_three_steps(&opt, 1.0, want_p, want_sq, want_acc);
}

static void test_adadelta_lr_and_weight_decay(void **state) {
    // The same with lr=0.5, weight_decay=0.1 (torch 1.13). The lr argument of
    // optim_step is the scheduled one; opt->lr (the base) must not be used.
    static const double want_p[3][4] = {
        {1.4984190464019775, -0.7484189867973328, 0.24841894209384918, 2.0015809535980225},
        {1.4963185787200928, -0.7503247261047363, 0.24894846975803375, 1.9999583959579468},
        {1.498714804649353, -0.7499902844429016, 0.24730342626571655, 1.997260332107544},
    };
    static const double want_sq[4] = {0.11538160592317581, 0.022696828469634056,
                                      0.01961967907845974, 0.49084383249282837};
    static const double want_acc[4] = {4.6948039198468905e-06, 2.162118107662536e-06,
                                       1.9933377188863233e-06, 4.669367626775056e-06};
    const Optimizer opt = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6, .weight_decay = 0.1};
    check_three_steps(&opt, 0.5, want_p, want_sq, want_acc);
}

static void test_adadelta_first_step_by_hand(void **state) {
    // One parameter, p = 1, g = 0.5, from zero state, lr 1, rho 0.9, eps 1e-6:
    //   sq = 0.1 * 0.25 = 0.025; std = sqrt(0.025001) = 0.158117045...;
    //   delta = sqrt(1e-6) / std * 0.5 = 0.00316221442 (about sqrt(eps / (1 - rho)));
    //   acc = 0.1 * delta^2 = 9.9996000e-7; p = 1 - delta = 0.996837786
    const Optimizer opt = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6};
    Params p;
    params_init(&p, 2, opt);  // the test's parameter and one left at 0
    p.net.params[0] = 1.0f;
    p.net.grads[0] = 0.5f;
    optim_step(&p.net, &opt, NULL, 1.0, 0);
    expect_rel("square_avg", 0, opt_state_at(&p, 0, 0), 0.025);
    expect_rel("param", 0, p.net.params[0], 0.996837786);
    expect_rel("acc_delta", 0, opt_state_at(&p, 1, 0), 9.9996000e-7);
    params_free(&p);
}

static void test_adadelta_many_params(void **state) {
    // 100,003 parameters: the kernel's parallel loop (over 32,768 elements), an odd tail,
    // and every element must follow the formula for its own state.
    const int n = 100003;
    const Optimizer opt = {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6, .weight_decay = 0.01};
    Params p;
    params_init(&p, n, opt);
    double *rp = malloc(n * sizeof(double)), *rsq = calloc(n, sizeof(double));
    double *racc = calloc(n, sizeof(double)), *rg = malloc(n * sizeof(double));
    assert_true(rp && rsq && racc && rg);
    uint64_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        p.net.params[i] = 1.0f + (float)(s >> 40) / 16777216.0f;  // [1, 2): far from 0
        rp[i] = p.net.params[i];
    }
    const Schedule sched = {.kind = SCHEDULE_STEP, .gamma = 0.7};
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            p.net.grads[i] = (float)(s >> 40) / 8388608.0f - 1.0f;  // [-1, 1)
            rg[i] = p.net.grads[i];
        }
        const double lr = schedule_lr(&sched, 1.0, step, step, 0);  // a step an epoch
        optim_step(&p.net, &opt, NULL, lr, step);
        adadelta_ref(rp, rsq, racc, rg, n, lr, opt.rho, opt.eps, opt.weight_decay);
    }
    for (int i = 0; i < n; i++) {
        expect_rel("param", i, p.net.params[i], rp[i]);
        expect_rel("square_avg", i, opt_state_at(&p, 0, i), rsq[i]);
        expect_rel("acc_delta", i, opt_state_at(&p, 1, i), racc[i]);
    }
    free(rp), free(rsq), free(racc), free(rg);
    params_free(&p);
}

static void test_steplr(void **state) {
    // torch.optim.lr_scheduler.StepLR(step_size=1, gamma=0.7) from lr 1.0, torch 1.13:
    // the lr of epochs 0..3 is 1.0, 0.7, 0.48999999999999994, 0.3429999999999999, the
    // products of one multiplication per epoch in double, compared exactly.
    Schedule s = {.kind = SCHEDULE_STEP, .gamma = 0.7};
    assert_true(schedule_lr(&s, 1.0, 0, 0, 0) == 1.0);
    assert_true(schedule_lr(&s, 1.0, 500, 1, 0) == 0.7);  // by epoch, whatever the step
    assert_true(schedule_lr(&s, 1.0, 9, 2, 0) == 0.48999999999999994);
    assert_true(schedule_lr(&s, 1.0, 9, 3, 0) == 0.3429999999999999);
    // Another base and gamma: ((((0.5 * 0.1) * 0.1) * 0.1) * 0.1 in double is
    // 5.0000000000000016e-05, where 0.5 * pow(0.1, 4) is 5.000000000000001e-05.
    s.gamma = 0.1;
    assert_true(schedule_lr(&s, 0.5, 0, 4, 0) == 5.0000000000000016e-05);
    s.gamma = 1.0;
    assert_true(schedule_lr(&s, 2.0, 0, 100, 0) == 2.0);
}

// Warmup then cosine against torch 1.13's SequentialLR of LinearLR(start_factor 0.25,
// total_iters 3) and CosineAnnealingLR(T_max 7, eta_min 0.01) from lr 0.5, steps 0..9
// (PyTorch computes the cosine recursively; the closed form agrees to 1e-15).
static void test_warmup_cosine(void **state) {
    static const double torch_lr[10] = {
        0.125, 0.25, 0.375, 0.5, 0.47573737263609267, 0.40775500145538973, 0.30951762881929706,
        0.20048237118070303, 0.1022449985446103, 0.034262627363907339};
    const Schedule s = {.kind = SCHEDULE_COSINE, .lr_min = 0.01, .warmup = 3, .warmup_start = 0.25,
                        .total = 10};
    for (int t = 0; t < 10; t++) {
        const double lr = schedule_lr(&s, 0.5, t, 0, 0);
        if (!(fabs(lr - torch_lr[t]) <= 1e-15 * torch_lr[t]))
            fail_msg("step %d: lr %.17g, torch %.17g", t, lr, torch_lr[t]);
    }
    // The floor at the end of the run; warmup on the step schedule scales it.
    assert_true(fabs(schedule_lr(&s, 0.5, 10, 0, 0) - 0.01) < 1e-15);
    const Schedule w = {.kind = SCHEDULE_STEP, .gamma = 0.5, .warmup = 4, .warmup_start = 0.5};
    assert_true(schedule_lr(&w, 1.0, 0, 0, 0) == 0.5);
    assert_true(schedule_lr(&w, 1.0, 2, 0, 0) == 0.75);
    assert_true(schedule_lr(&w, 1.0, 4, 1, 0) == 0.5);
}

// OneCycleLR (torch 1.13): the lr and the cycled momentum of every step, to the last bits
// PyTorch's double arithmetic gives (the same operations in the same order); with the
// defaults (pct_start 0.3, div_factor 25, final_div_factor 1e4, momentum 0.95 to 0.85) and
// with others whose rise ends between two steps (0.25 * 7 - 1 = 0.75).
static void check_onecycle(const Schedule *s, double max_lr, const double *lr, const double *momentum) {
    const Optimizer sgd = {.kind = OPTIM_SGD, .momentum = 0.5}, adamw = {.kind = OPTIM_ADAMW, .beta1 = 0.5};
    for (int t = 0; t < s->total; t++) {
        const double got = schedule_lr(s, max_lr, t, 0, 0);
        const Optimizer a = schedule_optimizer(s, &sgd, t), b = schedule_optimizer(s, &adamw, t);
        if (got != lr[t] || a.momentum != momentum[t] || b.beta1 != momentum[t])
            fail_msg("step %d: lr %.17g, momentum %.17g, beta1 %.17g; torch %.17g, %.17g", t, got,
                     a.momentum, b.beta1, lr[t], momentum[t]);
    }
}

static void test_onecycle(void **state) {
    static const double lr10[10] = {
        0.020000000000000018, 0.26000000000000001, 0.5, 0.47524231600673683, 0.40587282697488153,
        0.30563101096814466, 0.19437098903185537, 0.094129173025118487, 0.024759683993263143,
        1.9999999999999999e-06};
    static const double m10[10] = {
        0.94999999999999996, 0.89999999999999991, 0.84999999999999998, 0.85495155660487898,
        0.86882550990706331, 0.88887395330218422, 0.91112604669781572, 0.93117449009293662,
        0.94504844339512095, 0.94999999999999996};
    static const double lr7[7] = {0.009999999999999995, 0.099442099769945169, 0.086665940997899829,
                                  0.061164920651117907, 0.03180121583289857, 0.0087793732229160659,
                                  0.0001};
    static const double m7[7] = {0.90000000000000002, 0.80055845868874365, 0.81334740640850878,
                                 0.83887395330218428, 0.86826705121831982, 0.89131193871579972,
                                 0.90000000000000002};
    const Schedule defaults = {.kind = SCHEDULE_ONECYCLE, .total = 10, .pct_start = 0.3, .div_factor = 25,
                               .final_div_factor = 1e4, .cycle_momentum = true, .base_momentum = 0.85,
                               .max_momentum = 0.95};
    check_onecycle(&defaults, 0.5, lr10, m10);
    const Schedule other = {.kind = SCHEDULE_ONECYCLE, .total = 7, .pct_start = 0.25, .div_factor = 10,
                            .final_div_factor = 100, .cycle_momentum = true, .base_momentum = 0.8,
                            .max_momentum = 0.9};
    check_onecycle(&other, 0.1, lr7, m7);
    // Without cycle_momentum, and on other schedules, the optimizer is as it was.
    Schedule still = defaults;
    still.cycle_momentum = false;
    const Optimizer sgd = {.kind = OPTIM_SGD, .momentum = 0.5};
    assert_true(schedule_optimizer(&still, &sgd, 3).momentum == 0.5);
    const Schedule cosine = {.kind = SCHEDULE_COSINE, .total = 10, .cycle_momentum = true};
    assert_true(schedule_optimizer(&cosine, &sgd, 3).momentum == 0.5);
}

// ReduceLROnPlateau (torch 1.13), factor 0.3, patience 1, min_lr 0.01, from lr 0.5, stepped
// on a fixed sequence of losses: an epoch improves only below best * (1 - 1e-4) (0.89995
// after 0.9 does not), the count starts again after each reduction, the floor holds and a
// change of 1e-8 or less is none. Its lr after each step, exactly.
static void test_plateau(void **state) {
    static const double losses[14] = {1.0, 0.9, 0.95, 0.9, 0.89995, 0.91, 0.5,
                                      0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2};
    static const double torch_lr[14] = {
        0.5, 0.5, 0.5, 0.14999999999999999, 0.14999999999999999, 0.044999999999999998,
        0.044999999999999998, 0.044999999999999998, 0.0135, 0.0135, 0.01, 0.01, 0.01, 0.01};
    const Schedule s = {.kind = SCHEDULE_PLATEAU, .factor = 0.3, .patience = 1, .lr_min = 0.01};
    Plateau p = {.best = INFINITY};
    int64_t reductions = 0;
    for (int e = 0; e < 14; e++) {
        const bool reduced = plateau_step(&s, &p, 0.5, losses[e]);
        assert_int_equal(reduced, p.reductions > reductions);
        reductions = p.reductions;
        const double lr = schedule_lr(&s, 0.5, 1000, e + 1, p.reductions);  // whatever the step
        if (lr != torch_lr[e])
            fail_msg("after loss %d (%g): lr %.17g, torch %.17g", e, losses[e], lr, torch_lr[e]);
    }
    assert_int_equal(p.reductions, 4);  // the floor's last step (0.0135 -> 0.01) counts; 0 -> 0 not
    assert_true(p.best == 0.5);
}

// Three steps of `o` on p0 with the test's gradients (under schedule sched, or at o->lr with
// NULL), against torch.optim's parameters (tests/torch_optim_reference.py: the values
// printed as float bits).
static void check_torch_scheduled(const Optimizer *o, const Schedule *sched, const uint32_t want[3][4],
                                  const char *what) {
    Params p;
    params_init(&p, 4, *o);
    memcpy(p.net.params, p0, sizeof p0);
    for (int s = 0; s < 3; s++) {
        memcpy(p.net.grads, grads[s], sizeof grads[s]);
        const Optimizer stepped = sched ? schedule_optimizer(sched, o, s) : *o;
        optim_step(&p.net, &stepped, NULL, sched ? schedule_lr(sched, o->lr, s, 0, 0) : o->lr, s);
        for (int i = 0; i < 4; i++) {
            float w;
            memcpy(&w, &want[s][i], sizeof w);
            char m[96];
            snprintf(m, sizeof m, "%s, step %d, param vs torch 1.13", what, s + 1);
            expect_rel(m, i, p.net.params[i], w);
        }
    }
    params_free(&p);
}

static void check_torch(const Optimizer *o, const uint32_t want[3][4], const char *what) {
    check_torch_scheduled(o, NULL, want, what);
}

static void test_sgd(void **state) {
    static const uint32_t dampened[3][4] = {
        {0x3fbe872bu, 0xbf3ab021u, 0x3e610625u, 0x40026e98u},
        {0x3fb74590u, 0xbf41425au, 0x3e4e28b9u, 0x400480e0u},
        {0x3fbc189cu, 0xbf4775cau, 0x3e2158dcu, 0x3ff574f5u}};
    static const uint32_t nesterov[3][4] = {
        {0x3fbd3405u, 0xbf35e83eu, 0x3e452546u, 0x40049eedu},
        {0x3faf7dccu, 0xbf499430u, 0x3e3f22efu, 0x400656b8u},
        {0x3fc1114fu, 0xbf508451u, 0x3debeac1u, 0x3fdedba7u}};
    static const uint32_t plain[3][4] = {
        {0x3fbeb852u, 0xbf3ae148u, 0x3e6147aeu, 0x40028f5cu},
        {0x3fb851ecu, 0xbf47ae15u, 0x3e6b851fu, 0x40028f5cu},
        {0x3fc51eb9u, 0xbf483127u, 0x3e4ccccdu, 0x3feb851eu}};
    check_torch(&(Optimizer){.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1,
                             .weight_decay = 0.01}, dampened, "SGD momentum 0.9 dampening 0.1");
    check_torch(&(Optimizer){.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = true,
                             .weight_decay = 0.01}, nesterov, "SGD nesterov");
    check_torch(&(Optimizer){.kind = OPTIM_SGD, .lr = 0.1}, plain, "SGD");
    const Optimizer sgd = {.kind = OPTIM_SGD};
    assert_int_equal(optim_nstates(&sgd), 0);  // no momentum: no state
}

static void test_adamw(void **state) {
    static const uint32_t defaults[3][4] = {
        {0x3fbeb368u, 0xbf3d6bbau, 0x3e75bc01u, 0x4000a090u},
        {0x3fbd9460u, 0xbf3e88afu, 0x3e719c90u, 0x40010b0du},
        {0x3fbde6fdu, 0xbf3f7339u, 0x3e6ac929u, 0x4000b1bdu}};
    static const uint32_t custom[3][4] = {
        {0x3fbe872cu, 0xbf3d3f7eu, 0x3e758109u, 0x40008312u},
        {0x3fbd323cu, 0xbf3e538cu, 0x3e71b088u, 0x4000c969u},
        {0x3fbd706fu, 0xbf3f1f14u, 0x3e6a93d2u, 0x40004574u}};
    check_torch(&(Optimizer){.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                             .eps = 1e-8, .weight_decay = 0.01}, defaults, "AdamW defaults");
    check_torch(&(Optimizer){.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.8, .beta2 = 0.99,
                             .eps = 1e-6, .weight_decay = 0.1}, custom, "AdamW betas 0.8, 0.99");
}

// SGD and AdamW under OneCycleLR over three steps (pct_start 0.5: a rise of one step),
// momentum and beta1 cycled in place of the optimizer's own, against torch's parameters.
static void test_onecycle_steps(void **state) {
    static const uint32_t sgd_want[3][4] = {
        {0x3fbff0edu, 0xbf3fc99bu, 0x3e7ec2ceu, 0x400018e7u},
        {0x3fba07fau, 0xbf45c1f8u, 0x3e71ebffu, 0x400198e2u},
        {0x3fba07fbu, 0xbf45c1fau, 0x3e71ebf3u, 0x400198dfu}};
    static const uint32_t adamw_want[3][4] = {
        {0x3fbff2b3u, 0xbf3fe597u, 0x3e7f96e1u, 0x4000066cu},
        {0x3fbf2c93u, 0xbf4109e0u, 0x3e7f7a85u, 0x40002469u},
        {0x3fbf2c93u, 0xbf4109e1u, 0x3e7f7a84u, 0x40002469u}};
    const Schedule s = {.kind = SCHEDULE_ONECYCLE, .total = 3, .pct_start = 0.5, .div_factor = 25,
                        .final_div_factor = 1e4, .cycle_momentum = true, .base_momentum = 0.85,
                        .max_momentum = 0.95};
    // (The options set momentum and beta1 to max_momentum, as OneCycleLR does.)
    check_torch_scheduled(&(Optimizer){.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.95, .weight_decay = 0.01},
                          &s, sgd_want, "SGD under OneCycleLR");
    check_torch_scheduled(&(Optimizer){.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.95, .beta2 = 0.999,
                                       .eps = 1e-8, .weight_decay = 0.01},
                          &s, adamw_want, "AdamW under OneCycleLR");
}

// decay_skip_norm_bias: the bias (1-D) steps as without weight decay, the weight with it;
// and a frozen layer's parameters stay as they are.
// Gradient clipping (issue 33): the gradients scaled by max_norm / (norm + 1e-6) when that
// is below 1, as torch.nn.utils.clip_grad_norm_ does, before the update; above the limit
// nothing changes; the squared norm left in grad_sumsq. A parallel-sized vector too (its
// sum in blocks).
static void test_clip_grad_norm(void **state) {
    for (int big = 0; big < 2; big++) {
        const int64_t n = big ? 300001 : 5;
        Optimizer o = {.kind = OPTIM_SGD, .lr = 1.0, .clip_grad_norm = 1.0};
        Params p;
        params_init(&p, n, o);
        double sumsq = 0;
        for (int64_t i = 0; i < n; i++) {
            p.net.params[i] = 1.0f;
            p.net.grads[i] = big ? (float)((i % 7) - 3) * 0.01f : (float)(i == 0 ? 3 : i == 1 ? 4 : 0);
            sumsq += (double)p.net.grads[i] * p.net.grads[i];
        }
        float *g0 = malloc((size_t)n * 4);
        memcpy(g0, p.net.grads, (size_t)n * 4);
        const float norm = (float)sqrt(sumsq), coef = 1.0f / (norm + 1e-6f);
        optim_step(&p.net, &o, NULL, 1.0, 0);
        const double got = (float)sqrt(*p.net.grad_sumsq);
        assert_true(got == norm && norm > 1.0f);
        if (!big) assert_true(fabs(got - 5.0) < 1e-6);
        for (int64_t i = 0; i < n; i++) {
            const float g = g0[i] * coef;
            if (p.net.grads[i] != g || p.net.params[i] != 1.0f + -1.0f * g)
                fail_msg("n %lld: element %lld: gradient %g, parameter %g; want %g, %g", (long long)n,
                         (long long)i, p.net.grads[i], p.net.params[i], g, 1.0f - g);
        }
        // A limit above the norm: the gradients as they are.
        o.clip_grad_norm = 2.0 * norm;
        memcpy(p.net.grads, g0, (size_t)n * 4);
        optim_step(&p.net, &o, NULL, 1.0, 1);
        assert_memory_equal(p.net.grads, g0, (size_t)n * 4);
        free(g0);
        params_free(&p);
    }
}

static void test_decay_skip_and_frozen(void **state) {
    const Optimizer with = {.kind = OPTIM_SGD, .lr = 0.1, .weight_decay = 0.5};
    Optimizer skip = with;
    skip.decay_skip_norm_bias = true;
    Params a, b;
    params_init(&a, 3, with);
    params_init(&b, 3, skip);
    for (int i = 0; i < 3; i++) a.net.params[i] = b.net.params[i] = 1.0f, a.net.grads[i] = b.net.grads[i] = 0.25f;
    optim_step(&a.net, &with, NULL, 0.1, 0);
    optim_step(&b.net, &skip, NULL, 0.1, 0);
    // weight: 1 - 0.1 * (0.25 + 0.5) = 0.925 in both; bias: 0.925 with decay, 0.975 without.
    for (int i = 0; i < 2; i++) assert_true(fabsf(a.net.params[i] - 0.925f) < 1e-6 && a.net.params[i] == b.net.params[i]);
    assert_true(fabsf(a.net.params[2] - 0.925f) < 1e-6);
    assert_true(fabsf(b.net.params[2] - 0.975f) < 1e-6);
    params_free(&a), params_free(&b);
    // Frozen: no gradient, no state, no step.
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, "[linear]\nname = a\noutputs = 2\n[linear]\nname = b\noutputs = 1\n[log_softmax]\n",
                  "t.cfg", &err))
        fail_msg("%s", err.msg);
    const char *freeze[] = {"a"};
    NetOptions opt = {.batch = 1, .precision = DT_F32, .freeze = freeze, .nfreeze = 1};
    optim_plan(&with, &opt);
    Net net;
    if (net_create(&net, &cfg, (Shape){.c = 3, .h = 1, .w = 1}, 1, &opt, cpu_kernels(), &err)) fail_msg("%s", err.msg);
    assert_int_equal(net.nparams, 3 * 2 + 2 + 2 + 1);
    assert_int_equal(net.ntrain, 2 + 1);  // b only
    assert_null(net.layers[0]->grads[0]);
    assert_int_equal(net.first_trained, 1);
    for (int64_t i = 0; i < net.nparams; i++) net.params[i] = 1.0f;
    for (int64_t i = 0; i < net.ntrain; i++) net.grads[i] = 1.0f;
    optim_step(&net, &with, NULL, 0.1, 0);
    for (int i = 0; i < 8; i++) assert_true(net.params[i] == 1.0f);
    for (int64_t i = 8; i < net.nparams; i++) assert_true(fabsf(net.params[i] - 0.85f) < 1e-6);
    net_free(&net);
    cfg_free(&cfg);
}

// ---- the fused update ------------------------------------------------------------------------

// The seed network's layers (dropout included), small: input 1x10x10.
static const char *fused_seed =
    "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n"
    "[conv]\nname = conv2\nfilters = 8\nsize = 3\nactivation = relu\n"
    "[maxpool]\nsize = 2\n[dropout]\np = 0.25\n[flatten]\n"
    "[linear]\nname = fc1\noutputs = 16\nactivation = relu\n[dropout]\np = 0.5\n"
    "[linear]\nname = fc2\noutputs = 10\n[log_softmax]\n";

// A ResNet: stem (a GEMM conv without bias, batchnorm + ReLU, max pooling), an identity
// block, a downsampling block, dropout, a batchnorm, the classifier; input 3x12x12.
static const char *fused_resnet =
    "[conv]\nname = conv1\nfilters = 4\nsize = 5\npad = 2\nbias = 0\n"
    "[batchnorm]\nname = bn1\nactivation = relu\n"
    "[maxpool]\nname = maxpool\nsize = 3\nstride = 2\npad = 1\n"
    "[residual]\nname = layer1.0\nfilters = 4\n"
    "[residual]\nname = layer2.0\nfilters = 8\nstride = 2\n"
    "[dropout]\np = 0.2\n"
    "[batchnorm]\nname = bn2\n"
    "[global_avgpool]\nname = avgpool\n[flatten]\n"
    "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n";

enum { FUSED_B = 8, FUSED_STEPS = 3 };

typedef struct FusedCase {
    const char *what, *text;
    Shape in;
    int segments;
    const char *const *freeze;  // NULL: none
    int nfreeze;
    bool freeze_stats;
} FusedCase;

static void fused_build(Net *net, Cfg *cfg, const FusedCase *c, const Optimizer *o, bool fused) {
    // (o->state_format: the state's format, which optim_plan passes on)
    Error err = {{0}};
    if (cfg_parse(cfg, c->text, "fused.cfg", &err)) fail_msg("%s", err.msg);
    // Under checkpointing with sweeps of one sample where they may (sweep_bytes 1): a
    // sweep's trained members (the stem's conv1 and bn1, bn2) backpropagate chunk by chunk
    // into the node's gradients before the hook sees them.
    NetOptions opt = {.batch = FUSED_B, .precision = DT_F32, .segments = c->segments,
                      .sweep = c->segments != 0, .sweep_bytes = 1, .freeze = c->freeze,
                      .nfreeze = c->nfreeze, .freeze_stats = c->freeze_stats, .fused_update = fused};
    optim_plan(o, &opt);
    // GEMM chunks of 2 images of a 5x5 conv on 3x12x12 (its im2col, 144 x 75 floats an
    // image): the stem's sweep runs over 4 chunks.
    static Kernels small;
    small = *cpu_kernels();
    small.chunk_bytes = 2 * 144 * 75 * sizeof(float);
    if (net_create(net, cfg, c->in, 10, &opt, &small, &err)) fail_msg("%s", err.msg);
    if (net_init_params(net, 7, &err)) fail_msg("%s", err.msg);
}

// The batchnorm counters (num_batches_tracked, on the host) of net, into out; their count.
static int fused_counters(const Net *net, int64_t *out, int cap) {
    int n = 0;
    for (int m = 0; m < net->nmodules; m++)
        for (int j = 0; j < net->modules[m]->nbuffers; j++)
            if (net->modules[m]->buffers[j].dtype == DT_I64) {
                assert_true(n < cap);
                out[n++] = *(const int64_t *)net->modules[m]->buffers[j].data;
            }
    return n;
}

// FUSED_STEPS steps of o on case c, fused against unfused, from the same weights on the
// same batches: the same bytes after each.
static void check_fused(const FusedCase *c, const Optimizer *o, const char *oname) {
    Net a, b;  // unfused, fused
    Cfg ca, cb;
    fused_build(&a, &ca, c, o, false);
    fused_build(&b, &cb, c, o, true);
    // The plan: no gradient block; each node's trained modules' gradients (a leaf's, or a
    // sweep's members' together, one after the other) lie in the activation block.
    int trained = 0, swept = 0;
    for (int m = 0; m < b.nmodules; m++) trained += layer_trains(b.modules[m]);
    for (int j = 0; j < b.nnodes; j++) {
        const NetNode *nd = &b.nodes[j];
        Layer *const *ls = nd->kind == NODE_LEAF ? &nd->l : nd->chain;
        const int nl = nd->kind == NODE_LEAF ? 1 : nd->kind == NODE_SWEEP ? nd->nchain : 0;
        const float *next = NULL;
        for (int i = 0; i < nl; i++) {
            if (!layer_trains(ls[i])) continue;
            const char *g = (const char *)ls[i]->grads[0], *base = b.activations;
            assert_true(g >= base && g + layer_param_floats(ls[i]) * sizeof(float) <= base + b.plan.activations);
            if (next) assert_ptr_equal(ls[i]->grads[0], next);
            next = ls[i]->grads[0] + layer_param_floats(ls[i]);
        }
        swept += nd->kind == NODE_SWEEP;
    }
    if (c->segments) assert_true(swept > 0);
    // The stem's sweep holds conv1 and bn1, both trained unless the case freezes one.
    if (c->segments && c->text == fused_resnet) {
        assert_int_equal(b.nodes[0].kind, NODE_SWEEP);
        assert_int_equal(b.nodes[0].chunk, 2);
    }
    assert_true(b.fused_update && !a.fused_update);
    assert_int_equal(b.ntrained_modules, trained);
    assert_int_equal(b.plan.grads, 0);
    assert_null(b.grads);
    assert_int_equal(b.plan.grads_unfused, (size_t)b.ntrain * sizeof(float));
    assert_int_equal(a.plan.grads, a.plan.grads_unfused);
    assert_int_equal(a.plan.grads, b.plan.grads_unfused);
    assert_int_equal(a.plan.optimizer, b.plan.optimizer);
    assert_int_equal(a.ntrain, b.ntrain);
    const int64_t nx = FUSED_B * shape_numel(c->in);
    const size_t obytes = a.plan.optimizer;
    for (int s = 0; s < FUSED_STEPS; s++) {
        test_rng_seed(100 + s);
        for (int64_t i = 0; i < nx; i++) a.input_buf[i] = b.input_buf[i] = (float)(test_urand() * 2 - 1);
        for (int i = 0; i < FUSED_B; i++) a.labels[i] = b.labels[i] = (int32_t)(test_urand64() % 10);
        const double lr = o->lr * (1.0 - 0.1 * s);
        assert_int_equal(test_train_step(&a, o, FUSED_B, lr, 5, s), 0);
        assert_int_equal(test_train_step(&b, o, FUSED_B, lr, 5, s), trained);
        char what[256];
        snprintf(what, sizeof what, "%s, %s, optimizer_state %s, step %d", c->what, oname,
                 state_format_names[o->state_format], s + 1);
        if (memcmp(a.params, b.params, a.plan.params))
            fail_msg("%s: the fused update's parameters differ", what);
        if (obytes && memcmp(a.optimizer, b.optimizer, obytes))
            fail_msg("%s: the fused update's optimizer state differs", what);
        if (memcmp(a.buffers, b.buffers, a.plan.buffers))
            fail_msg("%s: the fused update's batchnorm buffers differ", what);
        int64_t ka[16], kb[16];
        const int nk = fused_counters(&a, ka, 16);
        assert_int_equal(fused_counters(&b, kb, 16), nk);
        assert_memory_equal(ka, kb, (size_t)nk * sizeof *ka);
        if (memcmp(a.metrics, b.metrics, NET_METRICS * sizeof(float)))
            fail_msg("%s: the loss differs", what);
    }
    net_free(&a), net_free(&b);
    cfg_free(&ca), cfg_free(&cb);
}

static void check_fused_optimizers(const FusedCase *c) {
    const struct {
        const char *name;
        Optimizer o;
    } opts[] = {
        {"sgd", {.kind = OPTIM_SGD, .lr = 0.05}},
        {"sgd momentum 0.9 dampening 0.1", {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .dampening = 0.1}},
        {"sgd momentum 0.9 weight_decay 0.01", {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}},
        {"sgd nesterov weight_decay 0.01 decay_skip_norm_bias",
         {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01,
          .decay_skip_norm_bias = true}},
        {"adamw weight_decay 0", {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
        {"adamw weight_decay 0.01", {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999,
                                     .eps = 1e-8, .weight_decay = 0.01}},
        {"adamw weight_decay 0.1 decay_skip_norm_bias",
         {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6,
          .weight_decay = 0.1, .decay_skip_norm_bias = true}},
        {"adadelta", {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6}},
        {"adadelta weight_decay 0.01", {.kind = OPTIM_ADADELTA, .lr = 1.0, .rho = 0.9, .eps = 1e-6,
                                        .weight_decay = 0.01}},
    };
    // Every optimizer with fp32 state; with compressed state (bf16, int8) each kind once.
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        check_fused(c, &opts[i].o, opts[i].name);
        if (i != 2 && i != 5 && i != 8) continue;
        for (int f = STATE_BF16; f < STATE_FORMAT_COUNT; f++) {
            Optimizer o = opts[i].o;
            o.state_format = (StateFormat)f;
            check_fused(c, &o, opts[i].name);
        }
    }
}

static const Shape seed_in = {.c = 1, .h = 10, .w = 10}, resnet_in = {.c = 3, .h = 12, .w = 12};

static void test_fused_seed(void **state) {
    static const char *const frozen[] = {"conv1", "fc1"};  // the first layer, and one between
    const FusedCase plain = {"seed network", fused_seed, seed_in, 0, NULL, 0, false};
    const FusedCase part = {"seed network, conv1 and fc1 frozen", fused_seed, seed_in, 0, frozen, 2, false};
    const FusedCase ckpt = {"seed network, checkpoint = 3", fused_seed, seed_in, 3, NULL, 0, false};
    check_fused_optimizers(&plain);
    check_fused_optimizers(&part);
    check_fused_optimizers(&ckpt);
}

static void test_fused_resnet(void **state) {
    // A stem batchnorm frozen with its statistics, a convolution inside a trained block, a
    // whole block.
    static const char *const frozen[] = {"bn1", "layer2.0.conv1"}, *const block[] = {"layer1"};
    const FusedCase plain = {"resnet", fused_resnet, resnet_in, 0, NULL, 0, false};
    const FusedCase part = {"resnet, bn1 and layer2.0.conv1 frozen", fused_resnet, resnet_in, 0,
                            frozen, 2, true};
    const FusedCase stage = {"resnet, layer1 frozen", fused_resnet, resnet_in, 0, block, 1, false};
    check_fused_optimizers(&plain);
    check_fused_optimizers(&part);
    check_fused_optimizers(&stage);
}

static void test_fused_resnet_checkpointed(void **state) {
    static const char *const frozen[] = {"conv1", "layer2.0.downsample"};
    const FusedCase sqrt_ = {"resnet, checkpoint = sqrt", fused_resnet, resnet_in, NET_SEGMENTS_SQRT,
                             NULL, 0, false};
    const FusedCase part = {"resnet, checkpoint = sqrt, conv1 and layer2.0.downsample frozen",
                            fused_resnet, resnet_in, NET_SEGMENTS_SQRT, frozen, 2, false};
    check_fused_optimizers(&sqrt_);
    check_fused_optimizers(&part);
}

// Checkpoints do not know: a fused network's file is byte for byte an unfused one's after
// the same steps, and each loads into the other kind, which then goes on to the same bits
// (a resume as exact as the uninterrupted run), with the state in format fmt.
static void check_fused_checkpoint(StateFormat fmt) {
    char dir[512];
    assert_int_equal(test_tmpdir_make(dir, sizeof dir, "test_optim"), 0);
    const FusedCase c = {"resnet", fused_resnet, resnet_in, 0, NULL, 0, false};
    const Optimizer o = {.kind = OPTIM_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = 0.01, .state_format = fmt};
    static char *classes[10] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
    const CheckpointInfo info = {.cfg_text = (char *)fused_resnet, .class_names = classes, .classes = 10};
    const TrainState st = {.epoch = 0, .batch = 2, .step = 2, .seed = 5, .best_val_acc = -1, .loss_scale = 1};
    Net net[2], back[2];  // [unfused, fused]; back: the other's checkpoint loaded into each kind
    Cfg cfg[2], cfg_back[2];
    const int64_t nx = FUSED_B * shape_numel(c.in);
    for (int f = 0; f < 2; f++) {
        fused_build(&net[f], &cfg[f], &c, &o, f);
        fused_build(&back[f], &cfg_back[f], &c, &o, f);
    }
    Error err = {{0}};
    for (int s = 0; s < 3; s++) {
        for (int f = 0; f < 2; f++) {
            test_rng_seed(200 + s);
            for (int64_t i = 0; i < nx; i++) net[f].input_buf[i] = back[f].input_buf[i] = (float)(test_urand() * 2 - 1);
            for (int i = 0; i < FUSED_B; i++) net[f].labels[i] = back[f].labels[i] = (int32_t)(test_urand64() % 10);
            if (s == 2) {  // back[f] takes the other kind's checkpoint, then the same step
                const char *from = test_path(dir, f ? "unfused.safetensors" : "fused.safetensors");
                TrainState got;
                if (checkpoint_load_all(from, &back[f], &got, &err)) fail_msg("%s", err.msg);
                test_train_step(&back[f], &o, FUSED_B, o.lr, 5, s);
            }
            test_train_step(&net[f], &o, FUSED_B, o.lr, 5, s);
            if (s == 1 && checkpoint_save(test_path(dir, f ? "fused.safetensors" : "unfused.safetensors"),
                                          &net[f], &st, &info, &err))
                fail_msg("%s", err.msg);
        }
        if (s == 1) {
            size_t na, nb;
            char *a = test_read_file(test_path(dir, "unfused.safetensors"), &na);
            char *b = test_read_file(test_path(dir, "fused.safetensors"), &nb);
            assert_int_equal(na, nb);
            if (memcmp(a, b, na)) fail_msg("the fused network's checkpoint differs from the unfused one's (%s)", dir);
            free(a), free(b);
        }
    }
    const size_t ob = net[0].plan.optimizer;
    for (int f = 0; f < 2; f++)  // against the unfused network that was never saved
        if (memcmp(net[0].params, back[f].params, net[0].plan.params) ||
            memcmp(net[0].optimizer, back[f].optimizer, ob) ||
            memcmp(net[0].buffers, back[f].buffers, net[0].plan.buffers) ||
            memcmp(net[0].params, net[f].params, net[0].plan.params) ||
            memcmp(net[0].optimizer, net[f].optimizer, ob))
            fail_msg("the %s network resumed from the other kind's checkpoint differs "
                     "(optimizer_state %s)", f ? "fused" : "unfused", state_format_names[fmt]);
    for (int f = 0; f < 2; f++) {
        net_free(&net[f]), net_free(&back[f]);
        cfg_free(&cfg[f]), cfg_free(&cfg_back[f]);
    }
    assert_int_equal(test_remove_tree(dir), 0);
}

static void test_fused_checkpoint(void **state) {
    for (int f = 0; f < STATE_FORMAT_COUNT; f++) check_fused_checkpoint((StateFormat)f);
}

// Refused where it cannot hold: fp16's loss scaler decides on every gradient at once.
static void test_fused_refused_fp16(void **state) {
    Cfg cfg;
    Error err = {{0}};
    if (cfg_parse(&cfg, fused_seed, "fused.cfg", &err)) fail_msg("%s", err.msg);
    NetOptions opt = {.batch = 2, .precision = DT_F16, .fused_update = true};
    Net net;
    assert_int_equal(net_create(&net, &cfg, seed_in, 10, &opt, cpu_kernels(), &err), -1);
    if (!strstr(err.msg, "fused update does not run with fp16")) fail_msg("%s", err.msg);
    cfg_free(&cfg);
}

int main(void) {
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adadelta_torch_defaults),
        cmocka_unit_test(test_adadelta_lr_and_weight_decay),
        cmocka_unit_test(test_adadelta_first_step_by_hand),
        cmocka_unit_test(test_adadelta_many_params),
        cmocka_unit_test(test_steplr),
        cmocka_unit_test(test_warmup_cosine),
        cmocka_unit_test(test_onecycle),
        cmocka_unit_test(test_plateau),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_onecycle_steps),
        cmocka_unit_test(test_decay_skip_and_frozen),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_fused_seed),
        cmocka_unit_test(test_fused_resnet),
        cmocka_unit_test(test_fused_resnet_checkpointed),
        cmocka_unit_test(test_fused_checkpoint),
        cmocka_unit_test(test_fused_refused_fp16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
