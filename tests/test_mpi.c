// test_mpi.c: data-parallel training over MPI, as a user runs it (mpirun -np 2 ./train),
// on this machine (--oversubscribe; --allow-run-as-root as CI runs as root). Skipped where
// mpirun is missing or ./train was built without MPI (it says so).
//   - 2 processes at batch 32 give, after 10 steps, the parameters of one process at batch
//     32 with accumulate = 2 within float rounding (the network has dropout: its masks are
//     keyed by the sample's place in the whole batch);
//   - two 2-process runs give identical tensors;
//   - with the fused update (each module's gradients summed across the processes, then
//     updated, during backward) 2 processes give the unfused 2-process run's bits, on the
//     network with dropout and on the ResNet;
//   - the gradient sum in buckets during backward gives the one sum's bits (also with
//     micro-batches, fp16, a ResNet, and the fused update from the summed copies);
//   - with compressed activations, 2 processes round every value as one process with
//     accumulate = 2 does;
//   - a 2-process run stopped after 5 steps resumes with 2 processes to the same bits as
//     the uninterrupted run, and with 1 process to within float rounding;
//   - with batchnorm, the evaluation the run logs is the checkpoint's own (rank 0's running
//     statistics everywhere);
//   - a process killed mid-epoch ends the run within 30 s, and the last checkpoint loads;
//   - a batch that does not divide among the processes is refused, naming those that do;
//   - processes that do not run the same training (another seed, lr, layer width, data
//     set or training-set size on one of them, or a file one cannot open) all stop within
//     5 s, the message naming the rank and the keys, without MPI's own error text, and the
//     save folder's checkpoint as it was; another `threads`, or `init` on one process only
//     (every process takes rank 0's weights), trains to the plain run's bits;
//   - SIGINT to mpirun (Ctrl-C): the processes get SIGTERM from it, stop at a step with the
//     checkpoint written, and say so; mpirun itself exits with 1 (OpenMPI's rule). SIGINT to
//     the processes themselves: they stop, and mpirun exits with their 130;
//   - a log redirected from mpirun holds no progress lines (each process's stdout is a
//     pseudo-terminal of mpirun's), and one that goes to a terminal (script) does;
//   - srun -n 2 --mpi=pmix gives mpirun's checkpoint byte for byte, where srun can run
//     (a Slurm that answers: bench/slurm.sh sets one up; skipped otherwise);
//   - over 2 "hosts" (bench/netns.sh: network namespaces whose links are shaped to 1 Gbit/s,
//     OpenMPI over TCP between them; root only, skipped elsewhere) the checkpoint is the
//     one-host 2-process run's, byte for byte.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../nn/safetensors.h"
#include "testutil.h"

static char dir[512], cfg[PATH_MAX + 16], resnet[PATH_MAX + 16];
#define run(...) test_sh(dir, __VA_ARGS__)
#define output() test_sh_output(dir)
static bool usable;  // mpirun and an MPI build of ./train are here

#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np"
// The second program of an MPMD line (mpirun ... : ...): -x holds for its own program only.
#define THEN ": -x ASAN_OPTIONS=detect_leaks=0 -np"

static int group_setup(void **state) {
    if (access("./train", X_OK) != 0 || system("command -v mpirun > /dev/null 2>&1") != 0) return 0;
    if (test_tmpdir_make(dir, sizeof dir, "test_mpi")) return -1;
    char images[PATH_MAX], labels[PATH_MAX];
    write_squares(dir, "train", 512, 1, images, labels);
    write_squares(dir, "test", 128, 2, images, labels);
    snprintf(cfg, sizeof cfg, "%s/net.cfg", dir);
    snprintf(resnet, sizeof resnet, "%s/resnet.cfg", dir);
    if (write_squares_cfg(cfg, dir, 32,
                          "[conv]\nname = conv1\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                          "[maxpool]\n[dropout]\np = 0.3\n[flatten]\n"
                          "[linear]\nname = fc1\noutputs = 16\nactivation = relu\n[dropout]\np = 0.5\n"
                          "[linear]\nname = fc2\noutputs = 4\n[log_softmax]\n") ||
        write_squares_cfg(resnet, dir, 32,
                          "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
                          "[batchnorm]\nname = bn1\nactivation = relu\n"
                          "[residual]\nname = layer1.0\nfilters = 8\nstride = 2\n"
                          "[global_avgpool]\nname = avgpool\n[flatten]\n"
                          "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n"))
        return -1;
    // mpirun must be able to start two processes here at all (a container may forbid it).
    if (run(MPIRUN " 2 /bin/true")) {
        print_message("skipped: mpirun cannot start 2 processes on this machine:\n%s\n", output());
        return 0;
    }
    run(MPIRUN " 2 ./train %s stop_after=1 save=%s/probe", cfg, dir);
    usable = !strstr(output(), "this build has no MPI");
    if (!usable) print_message("skipped: ./train has no MPI (make with mpicc found, or MPI=1)\n");
    return 0;
}

static int group_teardown(void **state) { return dir[0] ? test_remove_tree(dir) : 0; }

// The largest relative difference of any tensor of a against b's (max |a - b| / max |b|);
// optimizer state included. 0 when every byte is equal.
static double max_rel_diff(const char *a_name, const char *b_name) {
    char pa[PATH_MAX + 64], pb[PATH_MAX + 64];
    snprintf(pa, sizeof pa, "%s/%s/last.safetensors", dir, a_name);
    snprintf(pb, sizeof pb, "%s/%s/last.safetensors", dir, b_name);
    StFile a, b;
    Error err = {{0}};
    if (st_open(&a, pa, &err) || st_open(&b, pb, &err)) fail_msg("%s", err.msg);
    assert_int_equal(a.count, b.count);
    double worst = 0;
    for (int i = 0; i < a.count; i++) {
        const StEntry *x = &a.entries[i], *y = st_find(&b, x->name);
        assert_non_null(y);
        assert_int_equal(x->bytes, y->bytes);
        if (x->dtype != ST_F32 || !memcmp(x->data, y->data, x->bytes)) continue;
        const float *p = x->data, *q = y->data;
        double diff = 0, scale = 0;
        for (size_t k = 0; k < x->bytes / 4; k++) {
            diff = fmax(diff, fabs((double)p[k] - q[k]));
            scale = fmax(scale, fabs((double)q[k]));
        }
        worst = fmax(worst, scale > 0 ? diff / scale : diff);
        if (diff == 0) worst = fmax(worst, 1e-300);  // bytes differ (signed zeros)
    }
    assert_string_equal(st_meta(&a, "step"), st_meta(&b, "step"));
    st_close(&a);
    st_close(&b);
    return worst;
}

static void need_mpi(void) {
    if (!usable) skip();
}

static void test_two_processes_as_accumulation(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 save=%s/dp", cfg, dir), 0);
    if (!strstr(output(), "over 2 processes (16 samples each)")) fail_msg("%s", output());
    assert_int_equal(run("./train %s stop_after=10 accumulate=2 save=%s/acc", cfg, dir), 0);
    const double d = max_rel_diff("dp", "acc");
    print_message("2 processes against accumulate = 2 after 10 steps: largest relative "
                  "difference %.3g\n", d);
    assert_true(d < 1e-5);
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 save=%s/dp_again", cfg, dir), 0);
    assert_true(max_rel_diff("dp", "dp_again") == 0);
}

// With compressed activations each value is rounded by its sample's place in the whole
// batch, so 2 processes round as one process with accumulate = 2 does: the same bits for
// the same values (only the gradient sums' order differs, as without compression), and
// two 2-process runs give identical tensors.
static void test_compressed_ranks(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 compress=2 save=%s/dp_c2", cfg, dir), 0);
    assert_int_equal(run("./train %s stop_after=10 accumulate=2 compress=2 save=%s/acc_c2", cfg, dir), 0);
    const double d = max_rel_diff("dp_c2", "acc_c2");
    print_message("2-bit activations, 2 processes against accumulate = 2 after 10 steps: largest "
                  "relative difference %.3g\n", d);
    assert_true(d < 1e-5);
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 compress=2 save=%s/dp_c2_again", cfg, dir), 0);
    assert_true(max_rel_diff("dp_c2", "dp_c2_again") == 0);
}

// The gradient sum in buckets during backward (here every module a bucket of its own:
// bucket_mb = 1e-6, on the ResNet a residual block's branches out of the block's order)
// gives the bits of the one sum after backward (bucket_mb = 0), also with micro-batches and
// with fp16's loss scaling.
static void test_buckets(void **state) {
    need_mpi();
    const char *sgd = "optimizer=sgd lr=0.05 momentum=0.9 stop_after=6";
    const char *runs[][2] = {{"fused_update=0", "dropout"}, {"accumulate=2", "dropout_acc"},
                             {"precision=fp16", "dropout_fp16"}};
    char a[64], b[64];
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "b0_%s", runs[i][1]), snprintf(b, sizeof b, "b1_%s", runs[i][1]);
        assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=6 %s bucket_mb=0 save=%s/%s", cfg, runs[i][0], dir, a), 0);
        assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=6 %s bucket_mb=1e-6 save=%s/%s", cfg, runs[i][0], dir, b), 0);
        if (!(max_rel_diff(a, b) == 0)) fail_msg("%s: the sum in buckets differs from the one sum", runs[i][1]);
    }
    assert_int_equal(run(MPIRUN " 2 ./train %s %s fused_update=0 bucket_mb=0 save=%s/b0_res", resnet, sgd, dir), 0);
    assert_int_equal(run(MPIRUN " 2 ./train %s %s fused_update=0 bucket_mb=1e-6 save=%s/b1_res", resnet, sgd, dir), 0);
    if (!(max_rel_diff("b0_res", "b1_res") == 0)) fail_msg("ResNet: the sum in buckets differs from the one sum");
    // The fused update from summed copies: each module a bucket (its copies then fill the
    // buffer at every module: a wait each time), and auto (several modules a bucket).
    const char *buckets[] = {"1e-6", "auto", "0"};
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "fused_%d", i);
        assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=6 fused_update=1 bucket_mb=%s save=%s/%s",
                             cfg, buckets[i], dir, b), 0);
        if (!(max_rel_diff("b0_dropout", b) == 0)) fail_msg("fused, bucket_mb = %s: other bits", buckets[i]);
        snprintf(b, sizeof b, "fused_res_%d", i);
        assert_int_equal(run(MPIRUN " 2 ./train %s %s fused_update=1 bucket_mb=%s save=%s/%s", resnet,
                             sgd, buckets[i], dir, b), 0);
        if (!(max_rel_diff("b0_res", b) == 0)) fail_msg("ResNet fused, bucket_mb = %s: other bits", buckets[i]);
    }
}

static void test_fused_update(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 fused_update=0 save=%s/dp_unfused", cfg, dir), 0);
    if (strstr(output(), ", fused update")) fail_msg("%s", output());
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 fused_update=1 save=%s/dp_fused", cfg, dir), 0);
    if (!strstr(output(), ", fused update")) fail_msg("%s", output());
    if (!(max_rel_diff("dp_unfused", "dp_fused") == 0)) fail_msg("the fused 2-process run differs from the unfused one");
    const char *sgd = "optimizer=sgd lr=0.05 momentum=0.9 weight_decay=0.001 stop_after=10";
    assert_int_equal(run(MPIRUN " 2 ./train %s %s fused_update=0 save=%s/res_unfused", resnet, sgd, dir), 0);
    assert_int_equal(run(MPIRUN " 2 ./train %s %s fused_update=1 save=%s/res_fused", resnet, sgd, dir), 0);
    if (!(max_rel_diff("res_unfused", "res_fused") == 0))
        fail_msg("the fused 2-process ResNet run differs from the unfused one");
}

static void test_resume_any_count(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=5 save=%s/half", cfg, dir), 0);
    assert_int_equal(run(MPIRUN " 2 ./train resume=%s/half/last.safetensors stop_after=10 save=%s/two",
                         dir, dir), 0);
    assert_true(max_rel_diff("dp", "two") == 0);
    assert_int_equal(run("./train resume=%s/half/last.safetensors stop_after=10 save=%s/one", dir, dir), 0);
    const double d = max_rel_diff("dp", "one");
    print_message("resumed with 1 process instead of 2: largest relative difference %.3g\n", d);
    assert_true(d < 1e-5);
    // And the whole epoch with its evaluation, from the half-way checkpoint.
    assert_int_equal(run(MPIRUN " 2 ./train resume=%s/half/last.safetensors save=%s/end", dir, dir), 0);
    if (!strstr(output(), "epoch 1/1") || !strstr(output(), "comm ")) fail_msg("%s", output());
}

// Batchnorm: every process takes rank 0's running statistics, so the evaluation each does of
// its part of the test set is the one a single process does with the checkpoint (rank 1's
// own statistics gave another loss).
static void test_batchnorm_statistics(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s save=%s/bn", resnet, dir), 0);
    const char *v = strstr(output(), "val_loss ");
    assert_non_null(v);
    char logged[32];
    snprintf(logged, sizeof logged, "loss %.6s", v + 9);
    assert_int_equal(run("./train --eval %s/bn/last.safetensors", dir), 0);
    if (!strstr(output(), logged)) fail_msg("expected '%s' in: %s", logged, output());
}

// A process killed mid-epoch: mpirun ends the other within 30 s, naming the rank, and the
// last checkpoint (written every 5 batches) loads.
static void test_killed_process(void **state) {
    need_mpi();
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "(" MPIRUN " 2 ./train %s epochs=1000 save_every=5 save=%s/kill > %s/kill.txt 2>&1 &) ; "
             "for i in $(seq 300); do [ -f %s/kill/last.safetensors ] && break; sleep 0.1; done; "
             "victim=$(pgrep -f '^./train .*save=%s/kill' | tail -n 1); kill -9 $victim; "
             "start=$(date +%%s); while pgrep -f '^(mpirun|./train) .*save=%s/kill' > /dev/null; do "
             "[ $(($(date +%%s) - start)) -gt 30 ] && exit 1; sleep 0.2; done; "
             "echo ended after $(($(date +%%s) - start)) s",
             cfg, dir, dir, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/kill.txt", dir);
    assert_int_equal(run("grep -a 'exited on signal 9' %s", path), 0);
    assert_int_equal(run("./train --eval %s/kill/last.safetensors", dir), 0);
}

static void test_batch_must_divide(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s batch=33 save=%s/odd", cfg, dir), 1);
    if (!strstr(output(), "batch = 33 does not divide among 2 processes: use 32 or 34"))
        fail_msg("%s", output());
    assert_int_equal(run(MPIRUN " 2 ./train --eval %s/dp/last.safetensors", dir), 1);
    if (!strstr(output(), "runs as one process")) fail_msg("%s", output());
}

// A 2-process run whose rank 1 gets `extra` too must stop within 5 s with exit status 1,
// saying each of `says` and no MPI error text, into the folder of the run "dp", which it
// leaves as it was.
static void refused(const char *extra, const char *const *says, int nsays) {
    assert_int_equal(run("cp %s/dp/last.safetensors %s/dp_before.safetensors", dir, dir), 0);
    assert_int_equal(run("(start=$(date +%%s%%N); " MPIRUN " 1 ./train %s save=%s/dp " THEN " 1 ./train %s "
                         "save=%s/dp %s; rc=$?; echo took $((($(date +%%s%%N) - start) / 1000000)) ms; "
                         "exit $rc)", cfg, dir, cfg, dir, extra),
                     1);
    const char *out = output();
    for (int i = 0; i < nsays; i++)
        if (!strstr(out, says[i])) fail_msg("rank 1 with %s: no \"%s\" in:\n%s", extra, says[i], out);
    if (strstr(out, "MPI_ERR") || strstr(out, "MPI_ABORT") || strstr(out, "ORTE_ERROR"))
        fail_msg("rank 1 with %s: MPI's error text reached the user:\n%s", extra, out);
    const char *took = strstr(out, "took ");
    assert_non_null(took);
    print_message("rank 1 with %s: refused in %s", extra, took + 5);
    assert_true(atol(took + 5) < 5000);
    assert_int_equal(run("cmp %s/dp/last.safetensors %s/dp_before.safetensors", dir, dir), 0);
}

static void test_processes_must_agree(void **state) {
    need_mpi();
    char images[PATH_MAX], labels[PATH_MAX], other[2 * PATH_MAX + 64], smaller[2 * PATH_MAX + 64];
    write_squares(dir, "other", 512, 3, images, labels);
    snprintf(other, sizeof other, "train=%s train_labels=%s", images, labels);
    write_squares(dir, "smaller", 256, 1, images, labels);
    snprintf(smaller, sizeof smaller, "train=%s train_labels=%s", images, labels);
    refused("seed=2", (const char *[]){"rank 1 has train.seed = 2 (rank 0: 3)", "only threads"}, 2);
    refused("lr=0.5", (const char *[]){"rank 1 has train.lr = 0.5"}, 1);
    refused("fc1.outputs=32", (const char *[]){"rank 1 has fc1.outputs = 32 (rank 0: 16)"}, 1);
    refused(other, (const char *[]){"rank 1 has training set.labels = "}, 1);
    refused(smaller, (const char *[]){"rank 1 has training set.samples = 256 (rank 0: 512)"}, 1);
    refused("init=/nonexistent", (const char *[]){"rank 1 of 2: cannot open '/nonexistent'"}, 1);
    refused("batch=64", (const char *[]){"rank 1 has train.batch = 64 (rank 0: 32)"}, 1);
    // What may differ: threads; init on one process only (rank 0's weights win).
    assert_int_equal(run(MPIRUN " 1 ./train %s stop_after=10 save=%s/threads " THEN " 1 ./train %s "
                         "stop_after=10 threads=2 init=%s/acc/last.safetensors save=%s/threads",
                         cfg, dir, cfg, dir, dir),
                     0);
    assert_true(max_rel_diff("threads", "dp") == 0);
}

// A long run in the background (a checkpoint after every batch) until its first checkpoint,
// then `kill -INT` to what `target` names in the shell ($p: mpirun's pid); returns mpirun's
// exit status, the log in NAME.txt.
static int interrupt(const char *name, const char *target) {
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             MPIRUN " 2 ./train %s train=%s/big-images train_labels=%s/big-labels epochs=100 "
             "save_every=1 save=%s/%s > %s/%s.txt 2>&1 & p=$!; i=0; "
             "while [ ! -e %s/%s/last.safetensors ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
             "kill -INT %s; wait $p",
             cfg, dir, dir, dir, name, dir, name, dir, name, target);
    const int rc = system(cmd);
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The last 600 characters of a log: cmocka cuts a failure's message short (a run's plan
// filled it, and the lines that said what failed were never shown).
static const char *log_end(const char *log) {
    const size_t n = strlen(log);
    return log + (n > 600 ? n - 600 : 0);
}

static char *read_log(const char *name) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s.txt", dir, name);
    size_t n;
    return test_read_file(path, &n);
}

// Issue 35, point 4. Ctrl-C on mpirun reaches mpirun alone (each process has a process
// group of its own); mpirun sends every process SIGCONT, SIGTERM a second later and SIGKILL
// a second after that (odls_base_sigkill_timeout), and exits with 1 whatever they return.
// The processes stop at the same step, write the checkpoint and name the SIGTERM as
// mpirun's: in epoch 1 or 2, since the first epoch (40,000 images at some 39,000 img/s on
// the 2-vCPU machine) may end in the second mpirun waits before its SIGTERM (it did in 1
// run of 5 or so). Signalled themselves, they exit with 130, and so does mpirun.
static void test_interrupted(void **state) {
    need_mpi();
    char images[PATH_MAX], labels[PATH_MAX];
    write_squares(dir, "big", 40000, 5, images, labels);
    const int rc = interrupt("ctrl_c", "$p");
    char *log = read_log("ctrl_c");
    if (rc != 1 || !strstr(log, "stopped by SIGTERM from mpirun (its answer to Ctrl-C or a signal to it) in epoch ") ||
        !strstr(log, "resume with: ./train resume="))
        fail_msg("mpirun's status %d (OpenMPI's is 1 after a signal to it); the log's end:\n%s", rc, log_end(log));
    free(log);
    assert_int_equal(run("./train --eval %s/ctrl_c/last.safetensors", dir), 0);
    // The processes signalled (mpirun's children: the two ranks here).
    assert_int_equal(interrupt("ranks", "$(pgrep -P $p)"), 130);
    log = read_log("ranks");
    if (!strstr(log, "stopped by SIGINT in epoch 1")) fail_msg("the log's end:\n%s", log_end(log));
    free(log);
    assert_int_equal(run("./train --eval %s/ranks/last.safetensors", dir), 0);
}

// The progress line rewrites itself with \r and ESC [K: in a log it only adds noise. Under
// mpirun each process's stdout is a pseudo-terminal whatever mpirun's is, so isatty alone
// said yes: the whole epoch's lines went into `mpirun ... > log`. (A full epoch: its last
// batch always prints one where the line shows.)
static void test_progress_lines(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s save=%s/quiet", cfg, dir), 0);
    if (strchr(output(), '\r') || strstr(output(), "\033[K")) fail_msg("%s", output());
    if (!strstr(output(), "epoch 1/1")) fail_msg("%s", output());
    // Where mpirun's stdout is a terminal, the line shows (script(1) gives it one).
    if (system("command -v script > /dev/null 2>&1") != 0) {
        print_message("no script(1) here: the terminal half is not checked\n");
        return;
    }
    assert_int_equal(run("script -qec \"" MPIRUN " 2 ./train %s save=%s/live\" /dev/null", cfg, dir), 0);
    if (!strstr(output(), "\r\033[K  epoch 1  ")) fail_msg("no progress line on a terminal: %s", output());
}

// srun starts the 2 processes (OpenMPI through Slurm's PMIx plugin): mpirun's checkpoint,
// byte for byte, from the same save folder (its path is in the stored cfg).
static void test_srun(void **state) {
    need_mpi();
    if (run("timeout 20 srun -n 2 --mpi=pmix /bin/true")) {
        print_message("skipped: srun -n 2 --mpi=pmix does not run here (no Slurm; bench/slurm.sh "
                      "sets one up, KEEP=1 leaves it running for SLURM_CONF)\n");
        skip();
    }
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=5 save=%s/sr", cfg, dir), 0);
    assert_int_equal(run("mv %s/sr %s/sr_mpirun", dir, dir), 0);
    // srun passes its environment on (MPIRUN's -x: the MPI libraries' leaks under SAN=1).
    assert_int_equal(run("ASAN_OPTIONS=detect_leaks=0 timeout 120 srun -n 2 --mpi=pmix ./train %s "
                         "stop_after=5 save=%s/sr", cfg, dir), 0);
    if (!strstr(output(), "over 2 processes (16 samples each)")) fail_msg("%s", output());
    assert_int_equal(run("cmp %s/sr/last.safetensors %s/sr_mpirun/last.safetensors", dir, dir), 0);
}

// Two network namespaces on a switch, each link shaped to 1 Gbit/s (bench/netns.sh), one
// process in each, talking over TCP only: the same bits as 2 processes on this host, in the
// same file (the same save folder, which the checkpoint names). The hosts are named after
// this process, so that suites running side by side do not meet.
static void test_network_hosts(void **state) {
    need_mpi();
    assert_int_equal(run(MPIRUN " 2 ./train %s stop_after=10 save=%s/hosts", cfg, dir), 0);
    assert_int_equal(run("mv %s/hosts %s/hosts_one", dir, dir), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int rc = run("NETNS_PREFIX=cnn%dh sh bench/netns.sh run 2 1gbit -- "
                       "-x ASAN_OPTIONS=detect_leaks=0 ./train %s stop_after=10 save=%s/hosts",
                       (int)getpid(), cfg, dir);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 77) {
        print_message("skipped: %s", output());
        skip();
    }
    if (rc) fail_msg("%s", output());
    if (run("cmp %s/hosts/last.safetensors %s/hosts_one/last.safetensors", dir, dir))
        fail_msg("2 hosts at 1 Gbit/s differ from 2 processes on one host: %s", output());
    print_message("2 hosts at 1 Gbit/s: the one-host checkpoint, byte for byte (%.1f s with the "
                  "namespaces' setup and teardown)\n",
                  (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_processes_as_accumulation),
        cmocka_unit_test(test_fused_update),
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_compressed_ranks),
        cmocka_unit_test(test_resume_any_count),
        cmocka_unit_test(test_batchnorm_statistics),
        cmocka_unit_test(test_killed_process),
        cmocka_unit_test(test_batch_must_divide),
        cmocka_unit_test(test_processes_must_agree),
        cmocka_unit_test(test_interrupted),
        cmocka_unit_test(test_progress_lines),
        cmocka_unit_test(test_srun),
        cmocka_unit_test(test_network_hosts),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
