// test_optim.c: Adadelta and StepLR (nn/optim.c, the CPU kernel adadelta_step).
//
// Adadelta is checked three ways: against values that torch.optim.Adadelta (torch 1.13)
// printed for the same numbers, against PyTorch's formula written out here in double, and
// on a vector long enough for the kernel's parallel loop. Tolerance: 1e-6 relative, about
// ten float roundings; a wrong formula (a missing sqrt, rho and 1-rho swapped, the state
// updated in the wrong order) is off by far more.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/kernels.h"
#include "../nn/net.h"
#include "../nn/optim.h"

#define REL_TOL 1e-6

// A Net with only what adadelta_step reads: the kernel table, the parameter, gradient and
// optimizer blocks (square_avg then acc_delta), and the count. Host memory: CPU backend.
typedef struct Params {
    Net net;
    float *block;  // one allocation: params, grads, square_avg, acc_delta
} Params;

static void params_init(Params *p, int64_t n) {
    memset(p, 0, sizeof *p);
    p->block = calloc((size_t)(4 * n), sizeof(float));
    assert_non_null(p->block);
    p->net.k = &cpu_kernels;
    p->net.nparams = n;
    p->net.params = p->block;
    p->net.grads = p->block + n;
    p->net.optimizer = p->block + 2 * n;  // zero: PyTorch's initial state
}

static void params_free(Params *p) { free(p->block); }

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
static void check_three_steps(const Adadelta *opt, double lr, const double want_p[3][4],
                              const double want_sq[4], const double want_acc[4]) {
    Params p;
    params_init(&p, 4);
    memcpy(p.net.params, p0, sizeof p0);
    double rp[4], rsq[4] = {0}, racc[4] = {0}, rg[4];
    for (int i = 0; i < 4; i++) rp[i] = p0[i];
    for (int s = 0; s < 3; s++) {
        memcpy(p.net.grads, grads[s], sizeof grads[s]);
        for (int i = 0; i < 4; i++) rg[i] = grads[s][i];
        adadelta_step(&p.net, opt, lr);
        adadelta_ref(rp, rsq, racc, rg, 4, lr, opt->rho, opt->eps, opt->weight_decay);
        for (int i = 0; i < 4; i++) {
            expect_rel("param vs formula", i, p.net.params[i], rp[i]);
            expect_rel("param vs torch 1.13", i, p.net.params[i], want_p[s][i]);
            expect_rel("square_avg vs formula", i, net_square_avg(&p.net)[i], rsq[i]);
            expect_rel("acc_delta vs formula", i, net_acc_delta(&p.net)[i], racc[i]);
        }
        // The step reads the gradients, it does not consume them.
        assert_memory_equal(p.net.grads, grads[s], sizeof grads[s]);
    }
    for (int i = 0; i < 4; i++) {
        expect_rel("square_avg vs torch 1.13", i, net_square_avg(&p.net)[i], want_sq[i]);
        expect_rel("acc_delta vs torch 1.13", i, net_acc_delta(&p.net)[i], want_acc[i]);
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
    const Adadelta opt = {.lr = 1.0, .rho = 0.9, .eps = 1e-6, .weight_decay = 0};
    check_three_steps(&opt, 1.0, want_p, want_sq, want_acc);
}

static void test_adadelta_lr_and_weight_decay(void **state) {
    // The same with lr=0.5, weight_decay=0.1 (torch 1.13). The lr argument of
    // adadelta_step is the scheduled one; opt->lr (the base) must not be used.
    static const double want_p[3][4] = {
        {1.4984190464019775, -0.7484189867973328, 0.24841894209384918, 2.0015809535980225},
        {1.4963185787200928, -0.7503247261047363, 0.24894846975803375, 1.9999583959579468},
        {1.498714804649353, -0.7499902844429016, 0.24730342626571655, 1.997260332107544},
    };
    static const double want_sq[4] = {0.11538160592317581, 0.022696828469634056,
                                      0.01961967907845974, 0.49084383249282837};
    static const double want_acc[4] = {4.6948039198468905e-06, 2.162118107662536e-06,
                                       1.9933377188863233e-06, 4.669367626775056e-06};
    const Adadelta opt = {.lr = 1.0, .rho = 0.9, .eps = 1e-6, .weight_decay = 0.1};
    check_three_steps(&opt, 0.5, want_p, want_sq, want_acc);
}

static void test_adadelta_first_step_by_hand(void **state) {
    // One parameter, p = 1, g = 0.5, from zero state, lr 1, rho 0.9, eps 1e-6:
    //   sq = 0.1 * 0.25 = 0.025; std = sqrt(0.025001) = 0.158117045...;
    //   delta = sqrt(1e-6) / std * 0.5 = 0.00316221442 (about sqrt(eps / (1 - rho)));
    //   acc = 0.1 * delta^2 = 9.9996000e-7; p = 1 - delta = 0.996837786
    Params p;
    params_init(&p, 1);
    p.net.params[0] = 1.0f;
    p.net.grads[0] = 0.5f;
    const Adadelta opt = {.lr = 1.0, .rho = 0.9, .eps = 1e-6};
    adadelta_step(&p.net, &opt, 1.0);
    expect_rel("square_avg", 0, net_square_avg(&p.net)[0], 0.025);
    expect_rel("param", 0, p.net.params[0], 0.996837786);
    expect_rel("acc_delta", 0, net_acc_delta(&p.net)[0], 9.9996000e-7);
    params_free(&p);
}

static void test_adadelta_many_params(void **state) {
    // 100,003 parameters: the kernel's parallel loop (over 32,768 elements), an odd tail,
    // and every element must follow the formula for its own state.
    const int n = 100003;
    Params p;
    params_init(&p, n);
    double *rp = malloc(n * sizeof(double)), *rsq = calloc(n, sizeof(double));
    double *racc = calloc(n, sizeof(double)), *rg = malloc(n * sizeof(double));
    assert_true(rp && rsq && racc && rg);
    uint64_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        p.net.params[i] = 1.0f + (float)(s >> 40) / 16777216.0f;  // [1, 2): far from 0
        rp[i] = p.net.params[i];
    }
    const Adadelta opt = {.lr = 1.0, .rho = 0.9, .eps = 1e-6, .weight_decay = 0.01};
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            p.net.grads[i] = (float)(s >> 40) / 8388608.0f - 1.0f;  // [-1, 1)
            rg[i] = p.net.grads[i];
        }
        const double lr = steplr(1.0, 0.7, step);
        adadelta_step(&p.net, &opt, lr);
        adadelta_ref(rp, rsq, racc, rg, n, lr, opt.rho, opt.eps, opt.weight_decay);
    }
    for (int i = 0; i < n; i++) {
        expect_rel("param", i, p.net.params[i], rp[i]);
        expect_rel("square_avg", i, net_square_avg(&p.net)[i], rsq[i]);
        expect_rel("acc_delta", i, net_acc_delta(&p.net)[i], racc[i]);
    }
    free(rp), free(rsq), free(racc), free(rg);
    params_free(&p);
}

static void test_steplr(void **state) {
    // torch.optim.lr_scheduler.StepLR(step_size=1, gamma=0.7) from lr 1.0, torch 1.13:
    // the lr of epochs 0..3 is 1.0, 0.7, 0.48999999999999994, 0.3429999999999999, the
    // products of one multiplication per epoch in double, compared exactly.
    assert_true(steplr(1.0, 0.7, 0) == 1.0);
    assert_true(steplr(1.0, 0.7, 1) == 0.7);
    assert_true(steplr(1.0, 0.7, 2) == 0.48999999999999994);
    assert_true(steplr(1.0, 0.7, 3) == 0.3429999999999999);
    // Another base and gamma: ((((0.5 * 0.1) * 0.1) * 0.1) * 0.1 in double is
    // 5.0000000000000016e-05, where 0.5 * pow(0.1, 4) is 5.000000000000001e-05.
    assert_true(steplr(0.5, 0.1, 4) == 5.0000000000000016e-05);
    assert_true(steplr(2.0, 1.0, 100) == 2.0);
}

int main(void) {
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adadelta_torch_defaults),
        cmocka_unit_test(test_adadelta_lr_and_weight_decay),
        cmocka_unit_test(test_adadelta_first_step_by_hand),
        cmocka_unit_test(test_adadelta_many_params),
        cmocka_unit_test(test_steplr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
