// test_torchvision.c: models/resnet18.cfg, resnet34.cfg, resnet50.cfg and mobilenet_v2.cfg
// against torchvision's models (issues 14 and 32).
//
// tests/torchvision_reference.py (Debian's python3-torch and python3-torchvision, which
// `make test` installs) writes torchvision.models.MODEL(num_classes=10) as a plain
// safetensors state_dict, with random batchnorm parameters and running statistics, two
// random images and its results. Here cnn.c loads those weights with init='s loader into
// the cfg network and must give:
//   - evaluation logits of 224x224 images within 1e-4 of torchvision's (absolute);
//   - training-mode logits, and every parameter's gradient of the mean cross-entropy,
//     within 1e-3 relative (the largest difference against the tensor's largest value, or
//     GRAD_FLOOR if that is smaller),
//     on images whose ReLU inputs all stay away from their kinks (the script says why);
//     the running statistics after that forward within 1e-5 relative, and the counters;
//   - after one step of SGD (lr 0.1, momentum 0.9, weight decay 1e-4), every parameter
//     within 1e-3 relative of torchvision's;
// and the checkpoint cnn.c writes then, exported (./ckpt export's plain state_dict), loads
// back into torchvision as is with load_state_dict(strict=True), where it gives cnn.c's
// evaluation logits within 1e-4 and the same predictions (checked by the script).
// MobileNetV2's classifier dropout is set to 0 on both sides: the two draw different masks.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../nn/checkpoint.h"
#include "../nn/layer.h"
#include "../nn/net.h"
#include "../nn/optim.h"
#include "../nn/safetensors.h"
#include "testutil.h"

enum { N = 2, CLASSES = 10 };
// A gradient is compared relative to its largest value, or to this where all are smaller:
// resnet50's bn1.bias has gradients below 1e-7 (the sum of its channel's nearly cancelling
// terms), where the two implementations' roundings are of the values' own size.
#define GRAD_FLOOR 1e-4
static const Optimizer sgd = {.kind = OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4};
static char g_root[PATH_MAX] = ".", g_dir[PATH_MAX];

static const char *in_dir(const char *name) {
    static char buf[4][PATH_MAX + 64];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

// Runs the reference script; returns its exit status.
static int script(const char *args) {
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/torchvision_reference.py' %s", g_root, args);
    const int rc = system(cmd);
    return rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
}

static const StEntry *entry(const StFile *f, const char *name) {
    const StEntry *e = st_find(f, name);
    if (!e) fail_msg("%s: no tensor '%s'", f->path, name);
    return e;
}

// max |got - want| over n floats, and max |want|.
static double max_diff(const float *got, const float *want, int64_t n, double *big) {
    double d = 0, b = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]);
        d = e > d || e != e ? e : d;
        b = fmax(b, fabs(want[i]));
    }
    *big = b;
    return d;
}

static const float *fc_out(const Net *net) { return (const float *)net->acts[net->nnodes - 2]; }

// The cfg network for S x S images with the reference weights, and the images of tensor
// `images` (N, 3, S, S) of x in its input (N, S, S, 3), and the labels.
static void load_net(Net *net, const Cfg *cfg, int S, const StFile *x, const char *images) {
    Error err = {{0}};
    const Shape in = {.c = 3, .h = S, .w = S};
    NetOptions opt = {.batch = N, .precision = DT_F32};
    optim_plan(&sgd, &opt);
    if (net_create(net, cfg, in, CLASSES, &opt, cpu_kernels(), &err) ||
        checkpoint_load_weights(in_dir("weights.safetensors"), net, NULL, 0, &err))
        fail_msg("%s", err.msg);
    const StEntry *e = entry(x, images);
    assert_int_equal(e->shape[2], S);
    const float *img = e->data;
    const int64_t *lab = entry(x, "labels")->data;
    const int64_t hw = (int64_t)S * S;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < 3; c++)
            for (int64_t p = 0; p < hw; p++)
                net->input_buf[((int64_t)n * hw + p) * 3 + c] = img[((int64_t)n * 3 + c) * hw + p];
    for (int n = 0; n < N; n++) net->labels[n] = (int32_t)lab[n];
}

static void against_torchvision(const char *model, int params) {
    char args[PATH_MAX + 64];
    snprintf(args, sizeof args, "make '%s' %s", g_dir, model);
    const int rc = script(args);
    if (rc == 3) {  // torch or torchvision is missing
        print_message("[  SKIPPED ] torchvision is not installed for /usr/bin/python3\n");
        skip();
    }
    assert_int_equal(rc, 0);

    Cfg cfg;
    Error err = {{0}};
    char cfg_path[PATH_MAX + 32];
    snprintf(cfg_path, sizeof cfg_path, "%s/models/%s.cfg", g_root, model);
    if (cfg_load(&cfg, cfg_path, &err)) fail_msg("%s", err.msg);
    CfgSection *dropout = layer_find_section(&cfg, "classifier.0");
    if (dropout && cfg_set(dropout, "p", "0", &err)) fail_msg("%s", err.msg);
    StFile x, ref;
    if (st_open(&x, in_dir("input.safetensors"), &err) ||
        st_open(&ref, in_dir("reference.safetensors"), &err))
        fail_msg("%s", err.msg);

    // Evaluation at 224x224: the running statistics.
    Net net;
    double big, d;
    load_net(&net, &cfg, 224, &x, "x_eval");
    net_forward(&net, N, false, 1, 0, 0);
    d = max_diff(fc_out(&net), entry(&ref, "eval_logits")->data, N * CLASSES, &big);
    print_message("%s: evaluation logits: max |cnn.c - torchvision| = %.3g (logits up to %.3g)\n",
                  model, d, big);
    assert_true(d <= 1e-4);
    net_free(&net);

    const int S = (int)entry(&x, "x_train")->shape[2];
    load_net(&net, &cfg, S, &x, "x_train");
    // Training: the batch's statistics, the loss and every parameter's gradient.
    net_zero_grads(&net);
    net_forward(&net, N, true, 1, 0, 0);
    d = max_diff(fc_out(&net), entry(&ref, "train_logits")->data, N * CLASSES, &big);
    print_message("%s: training logits (%dx%d): max difference %.3g of %.3g (relative %.3g)\n",
                  model, S, S, d, big, d / big);
    assert_true(d <= 1e-3 * big);
    net_loss(&net, N, N, true);
    net_backward(&net, N, 1, 0, 0);
    double worst = 0;
    const char *worst_name = "";
    int checked = 0;
    for (int m = 0; m < net.nmodules; m++) {
        const Layer *l = net.modules[m];
        for (int j = 0; j < l->nparams; j++, checked++) {
            char name[TENSOR_NAME_MAX + 8];
            snprintf(name, sizeof name, "grad.%s", l->params[j].name);
            const StEntry *e = entry(&ref, name);
            assert_int_equal(st_numel(e), tensor_numel(&l->params[j]));
            d = max_diff(l->grads[j], e->data, st_numel(e), &big);
            big = fmax(big, GRAD_FLOOR);
            if (!(d <= 1e-3 * big)) fail_msg("%s: max difference %.3g of %.3g", name, d, big);
            if (d / big > worst) worst = d / big, worst_name = l->params[j].name;
        }
        for (int j = 0; j < l->nbuffers; j++) {
            char name[TENSOR_NAME_MAX + 8];
            snprintf(name, sizeof name, "after.%s", l->buffers[j].name);
            const StEntry *e = entry(&ref, name);
            if (l->buffers[j].dtype == DT_I64) {
                assert_int_equal(*(int64_t *)l->buffers[j].data, *(const int64_t *)e->data);
                continue;
            }
            d = max_diff(l->buffers[j].data, e->data, st_numel(e), &big);
            if (!(d <= 1e-5 * big)) fail_msg("%s: max difference %.3g of %.3g", name, d, big);
        }
    }
    assert_int_equal(checked, params);  // torchvision's parameter tensors, every one compared
    print_message("%s: gradients of %d parameters: the largest relative difference %.3g (%s)\n",
                  model, checked, worst, worst_name);

    // One SGD step: every parameter against torchvision's after its step.
    optim_step(&net, &sgd, NULL, sgd.lr, 0);
    worst = 0;
    for (int m = 0; m < net.nmodules; m++) {
        const Layer *l = net.modules[m];
        for (int j = 0; j < l->nparams; j++) {
            char name[TENSOR_NAME_MAX + 8];
            snprintf(name, sizeof name, "step.%s", l->params[j].name);
            const StEntry *e = entry(&ref, name);
            d = max_diff(l->params[j].data, e->data, st_numel(e), &big);
            if (!(d <= 1e-3 * big)) fail_msg("%s: max difference %.3g of %.3g", name, d, big);
            if (d / big > worst) worst = d / big, worst_name = l->params[j].name;
        }
    }
    print_message("%s: parameters after one SGD step: the largest relative difference %.3g (%s)\n",
                  model, worst, worst_name);

    // The checkpoint, cnn.c's evaluation of it; torchvision loads it.
    char *text = cfg_to_text(&cfg, &err);
    assert_non_null(text);
    char names[CLASSES][12], *class_names[CLASSES];
    for (int c = 0; c < CLASSES; c++) snprintf(names[c], sizeof names[c], "%d", c), class_names[c] = names[c];
    const TrainState ts = {.step = 1, .seed = 1, .best_val_acc = -1, .loss_scale = 1};
    const CheckpointInfo info = {.cfg_text = text, .class_names = class_names, .classes = CLASSES};
    if (checkpoint_save(in_dir("trained.safetensors"), &net, &ts, &info, &err)) fail_msg("%s", err.msg);
    net_forward(&net, N, false, 1, 0, 0);
    const Tensor logits = {.name = "logits", .dtype = DT_F32, .ndim = 2, .shape = {N, CLASSES},
                           .data = (void *)fc_out(&net)};
    if (st_write(in_dir("cnn_logits.safetensors"), &logits, 1, NULL, NULL, 0, &err)) fail_msg("%s", err.msg);
    int exported;
    if (checkpoint_export(in_dir("trained.safetensors"), in_dir("exported.safetensors"), &exported, &err))
        fail_msg("%s", err.msg);
    snprintf(args, sizeof args, "check '%s' %s '%s' '%s'", g_dir, model, in_dir("exported.safetensors"),
             in_dir("cnn_logits.safetensors"));
    assert_int_equal(script(args), 0);
    free(text);
    st_close(&x);
    st_close(&ref);
    net_free(&net);
    cfg_free(&cfg);
}

// The parameter tensors: resnet18's 20 convolutions and 20 batchnorms' 40, fc's 2;
// resnet34's 36 + 72 + 2; resnet50's 53 + 106 + 2; mobilenet_v2's 52 + 104 + 2.
static void test_resnet18(void **state) { against_torchvision("resnet18", 62); }
static void test_resnet34(void **state) { against_torchvision("resnet34", 110); }
static void test_resnet50(void **state) { against_torchvision("resnet50", 161); }
static void test_mobilenet_v2(void **state) { against_torchvision("mobilenet_v2", 158); }

// The README's fine-tuning commands as they stand there (issue 33): its lines after the
// Python line that saves r18.safetensors, up to the blank line, run by sh -e in a folder
// that holds what they name (photos/, photos_test/ and r18.safetensors from the script's
// `photos`; ./train, ./ckpt and models/ linked from the repository). Every line must
// succeed: the fine-tuning from the state_dict (fc fresh), --eval of its checkpoint with a
// test folder alone, ./ckpt export, --eval of those plain weights with the cfg (the same
// accuracy as the checkpoint's), --predict with an override (every test photo listed).
static void test_readme_finetuning(void **state) {
    char dir[PATH_MAX + 16], args[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/readme", g_dir);
    snprintf(args, sizeof args, "photos '%s'", dir);
    const int rc = script(args);
    if (rc == 3) {
        print_message("[  SKIPPED ] torchvision is not installed for /usr/bin/python3\n");
        skip();
    }
    assert_int_equal(rc, 0);
    char root[PATH_MAX];  // absolute: the commands run in dir
    if (!realpath(g_root, root)) fail_msg("%s: %s", g_root, strerror(errno));
    if (test_sh(dir, "cd '%s' && ln -s '%s/train' train && ln -s '%s/ckpt' ckpt && "
                     "ln -s '%s/models' models && (awk '/save_file[(]torchvision[.]models[.]resnet18/"
                     "{f=1; next} f && /^$/{exit} f {sub(/^    /, \"\"); print}' '%s/README.md' > readme.sh)",
                dir, root, root, root, root))
        fail_msg("%s", test_sh_output(dir));
    if (test_sh(dir, "cd '%s' && sh -ex readme.sh", dir) != 0) fail_msg("%s", test_sh_output(dir));
    const char *out = test_sh_output(dir);
    print_message("%s", out);
    assert_non_null(strstr(out, "./train --predict"));  // the README's lines were found and run
    assert_non_null(strstr(out, "fresh: fc"));
    // Both evaluations give the same loss and accuracy: the checkpoint's weights, as plain ones.
    const char *first = strstr(out, ": loss "), *second = first ? strstr(first + 1, ": loss ") : NULL;
    assert_non_null(second);
    assert_int_equal(strncmp(first, second, strcspn(first, "\n")), 0);
    int listed = 0;  // "photos_test/cat/00.jpg:  cat 52.1%  fox 30.2%"
    for (const char *p = out; (p = strstr(p, ".jpg:")) != NULL; p++) listed++;
    assert_int_equal(listed, 12);
    assert_non_null(strstr(out, "\nphotos_test/cat/00.jpg:"));  // the folder's "/" not doubled
}

static int setup(void **state) { return test_tmpdir_make(g_dir, sizeof g_dir, "torchvision"); }
static int teardown(void **state) { return test_remove_tree(g_dir); }

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);  // one test: test_torchvision test_resnet50
    test_find_root(g_root, sizeof g_root, argv[0], "models/resnet18.cfg");
    cpu_set_threads(2);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_resnet18), cmocka_unit_test(test_resnet34),
                                       cmocka_unit_test(test_resnet50), cmocka_unit_test(test_mobilenet_v2),
                                       cmocka_unit_test(test_readme_finetuning)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
