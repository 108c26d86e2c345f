// test_faults.c: the trainer under faults from outside (issue 20), run as a user runs it.
//
//   - SIGKILL at random moments while it writes a checkpoint every batch, 20 times: the
//     last checkpoint always loads (the writes are atomic), and the temporary files of the
//     killed processes are removed at the next start (only the trainer's own pattern);
//   - a full disk and a read-only save folder (tests/fault_inject.c, preloaded: root
//     ignores permissions, so chmod cannot make one): a clear error, exit status 1, the old
//     checkpoint unchanged byte for byte; a disk that fills while metrics.jsonl or
//     curves.svg is written: the old copies whole;
//   - kill -9 at each rename of a run moved aside (an earlier run in the save folder): the
//     next start finishes the move, the old run whole in previous-1/;
//   - an allocation that fails (the network's blocks, an image to decode): a message with
//     the size asked for, exit status 1, never an abort, and before any training.
// Under AddressSanitizer the preloaded library is the files-only build and ASan's own
// allocator limit (max_allocation_size_mb) makes the allocations fail.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stb/stb_image_write.h>

#include "../nn/file.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static char dir[512], shim[PATH_MAX + 16], cfg[PATH_MAX + 16];
#define run(...) test_sh(dir, __VA_ARGS__)
#define output() test_sh_output(dir)

static void expect_output(const char *s) {
    if (!strstr(output(), s)) fail_msg("expected \"%s\" in:\n%s", s, output());
}

// The preload prefix of a faulty run: the library, and under ASan its options.
static const char *preload(void) {
    static char p[PATH_MAX + 128];
    snprintf(p, sizeof p, "LD_PRELOAD=%s%s", shim,
             SANITIZED ? " ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0" : "");
    return p;
}

// The files of folder d whose names hold ".tmp.".
static int count_temporaries(const char *d) {
    DIR *dd = opendir(d);
    if (!dd) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(dd));) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(dd);
    return n;
}

static int group_setup(void **state) {
    if (access("./train", X_OK) != 0) return 0;  // the tests skip
    if (test_tmpdir_make(dir, sizeof dir, "test_faults")) return -1;
    char images[PATH_MAX], labels[PATH_MAX];
    write_squares(dir, "train", 512, 1, images, labels);
    write_squares(dir, "test", 128, 2, images, labels);
    snprintf(cfg, sizeof cfg, "%s/net.cfg", dir);
    if (write_squares_cfg(cfg, dir, 16,
                          "[conv]\nname = conv1\nfilters = 8\nsize = 3\npad = 1\nactivation = relu\n"
                          "[maxpool]\n[flatten]\n[linear]\nname = fc1\noutputs = 4\n[log_softmax]\n"))
        return -1;
    // The library next to this suite's binary: build/tests or build/san/tests.
    char self[PATH_MAX];
    if (file_exe_dir(self, sizeof self)) return -1;
    snprintf(shim, sizeof shim, "%s/libfault.so", self);
    return 0;
}

static int group_teardown(void **state) { return dir[0] ? test_remove_tree(dir) : 0; }

static void need_train(void) {
    if (access("./train", X_OK) != 0 || access(shim, R_OK) != 0) {
        print_message("skipped: ./train or %s is not built (make test builds them)\n", shim);
        skip();
    }
}

// SIGKILL at random moments of a run that writes a checkpoint after every batch, resumed
// each time from what the last one left: the checkpoint always loads.
static void test_kill_loop(void **state) {
    need_train();
    char save[PATH_MAX], last[PATH_MAX + 32];
    snprintf(save, sizeof save, "%s/kill", dir);
    snprintf(last, sizeof last, "%s/last.safetensors", save);
    srand((unsigned)time(NULL));
    int loaded = 0;
    pid_t pids[20];
    for (int i = 0; i < 20; i++) {
        char cmd[4 * PATH_MAX];
        snprintf(cmd, sizeof cmd, "exec ./train %s epochs=1000 save_every=1 save=%s%s%s > /dev/null 2>&1",
                 cfg, save, access(last, R_OK) ? "" : " resume=", access(last, R_OK) ? "" : last);
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (!pid) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        pids[i] = pid;
        usleep((useconds_t)((SANITIZED ? 300000 : 100000) + rand() % 400000));
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        if (access(last, R_OK)) continue;  // killed before its first checkpoint
        if (run("./train --eval %s", last) != 0) fail_msg("kill %d: %s does not load:\n%s", i, last, output());
        loaded++;
    }
    print_message("20 kills: the last checkpoint loaded after %d of them (the others came before "
                  "the first)\n", loaded);
    assert_true(loaded >= 15);
    // A temporary file of a dead process (the killed ones may have left some): removed at the
    // next start; another file that only looks like one is not the trainer's and stays.
    char stale[PATH_MAX + 64], other[PATH_MAX + 64];
    snprintf(stale, sizeof stale, "%s/last.safetensors.tmp.%ld", save, (long)pids[0]);
    snprintf(other, sizeof other, "%s/notes.tmp.%ld", save, (long)pids[0]);
    FILE *f = fopen(stale, "w");
    assert_non_null(f);
    fclose(f);
    assert_non_null(f = fopen(other, "w"));
    fclose(f);
    assert_int_equal(run("./train %s epochs=1000 stop_after=1 save=%s resume=%s", cfg, save, last), 0);
    expect_output("which no longer runs");
    assert_int_equal(count_temporaries(save), 1);
    assert_int_equal(access(other, F_OK), 0);
}

// A full disk and a read-only folder: exit status 1, a message saying so, and the last
// checkpoint as it was.
static void test_full_disk_and_read_only(void **state) {
    need_train();
    char save[PATH_MAX], last[PATH_MAX + 32];
    snprintf(save, sizeof save, "%s/full", dir);
    snprintf(last, sizeof last, "%s/last.safetensors", save);
    assert_int_equal(run("./train %s save=%s", cfg, save), 0);
    size_t n0, n1;
    char *before = test_read_file(last, &n0);
    assert_non_null(before);
    // The epoch's log line, then the checkpoint: the first write fails.
    assert_int_equal(run("FAULT_ENOSPC_DIR=%s %s ./train %s epochs=2 save=%s resume=%s", save,
                         preload(), cfg, save, last), 1);
    expect_output("No space left on device");
    // A checkpoint every batch: st_write fails first.
    assert_int_equal(run("FAULT_ENOSPC_DIR=%s %s ./train %s epochs=2 save_every=1 save=%s resume=%s",
                         save, preload(), cfg, save, last), 1);
    expect_output("No space left on device");
    expect_output("last.safetensors");
    assert_int_equal(run("FAULT_EROFS_DIR=%s %s ./train %s epochs=2 save=%s resume=%s", save,
                         preload(), cfg, save, last), 1);
    expect_output("Read-only file system");
    char *after = test_read_file(last, &n1);
    assert_non_null(after);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    assert_int_equal(count_temporaries(save), 0);
    free(before), free(after);
}

// The four files a run leaves, read into bufs (sizes in n); missing ones NULL.
static const char *const run_files[] = {"last.safetensors", "best.safetensors", "metrics.jsonl",
                                        "curves.svg"};
static void read_run(const char *folder, char *bufs[4], size_t n[4]) {
    for (int i = 0; i < 4; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s", folder, run_files[i]);
        bufs[i] = access(path, R_OK) ? NULL : test_read_file(path, &n[i]);
    }
}

static void expect_same_run(char *a[4], size_t na[4], char *b[4], size_t nb[4]) {
    for (int i = 0; i < 4; i++) {
        if (!a[i] || !b[i]) fail_msg("%s: %s", run_files[i], a[i] ? "missing" : "unexpected");
        assert_int_equal(na[i], nb[i]);
        assert_memory_equal(a[i], b[i], na[i]);
    }
}

// A run started in a folder that holds another run moves that run into previous-1/ by
// renames; killed (kill -9) at each of them, and at the first atomic write after them, the
// next start finishes the move: previous-1 holds the old run whole, byte for byte, and the
// new run trains in the folder.
static void test_kill_during_move_aside(void **state) {
    need_train();
    char ref[PATH_MAX], save[PATH_MAX], prev[PATH_MAX + 32];
    snprintf(ref, sizeof ref, "%s/move-ref", dir);
    snprintf(save, sizeof save, "%s/move", dir);
    snprintf(prev, sizeof prev, "%s/previous-1", save);
    assert_int_equal(run("./train %s epochs=1 save=%s", cfg, ref), 0);
    char *old[4], *moved[4];
    size_t nold[4], nmoved[4];
    read_run(ref, old, nold);
    for (int n = 1; n <= 6; n++) {
        assert_int_equal(run("rm -rf %s && mkdir %s && cp %s/* %s/", save, save, ref, save), 0);
        const int rc = run("FAULT_KILL_RENAME=%d %s ./train %s epochs=1 save=%s", n, preload(), cfg, save);
        if (rc != 137 && rc != -1) fail_msg("rename %d: not killed (exit status %d):\n%s", n, rc, output());
        assert_int_equal(run("./train %s epochs=1 save=%s", cfg, save), 0);
        if (n <= 5) expect_output("finished moving an earlier run's files");
        read_run(prev, moved, nmoved);
        expect_same_run(old, nold, moved, nmoved);
        for (int i = 0; i < 4; i++) free(moved[i]);
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/previous-2", save);
        assert_int_not_equal(access(path, F_OK), 0);
        snprintf(path, sizeof path, "%s/last.safetensors", save);
        assert_int_equal(access(path, R_OK), 0);
        assert_int_equal(count_temporaries(save), 0);
    }
    for (int i = 0; i < 4; i++) free(old[i]);
}

// A disk that fills while metrics.jsonl, then curves.svg, is written after an epoch: exit
// status 1 naming the file, and the old log, picture and checkpoints whole, byte for byte.
static void test_full_disk_metrics(void **state) {
    need_train();
    char save[PATH_MAX];
    snprintf(save, sizeof save, "%s/fullm", dir);
    assert_int_equal(run("./train %s epochs=1 save=%s", cfg, save), 0);
    char *before[4], *after[4];
    size_t nb[4], na[4];
    read_run(save, before, nb);
    const char *names[] = {"metrics.jsonl", "curves.svg"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run("FAULT_ENOSPC_DIR=%s FAULT_ENOSPC_NAME=%s %s ./train %s epochs=2 save=%s "
                             "resume=%s/last.safetensors", save, names[i], preload(), cfg, save, save), 1);
        expect_output("No space left on device");
        expect_output(names[i]);
        expect_output("is unchanged");
        if (i == 1) expect_output("epoch 2/2");  // the log was written: the picture failed
        read_run(save, after, na);
        if (i == 0) {
            expect_same_run(before, nb, after, na);
        } else {  // the log has the new epoch; the picture and the checkpoints are as before
            assert_int_equal(nb[3], na[3]);
            assert_memory_equal(before[3], after[3], nb[3]);
            assert_memory_equal(before[0], after[0], nb[0]);
            assert_true(na[2] > nb[2] && !memcmp(before[2], after[2], nb[2]));
        }
        for (int k = 0; k < 4; k++) free(after[k]);
        assert_int_equal(count_temporaries(save), 0);
    }
    for (int k = 0; k < 4; k++) free(before[k]);
}

// Allocations that fail: the network's blocks (batch 4096: 8 MB of activations, over a
// limit of 4 MB), and an image of 2000 x 2000 RGB (12 MB) under a limit of 8 MB. A message
// naming the size, exit status 1, no epoch started.
static void test_allocation_failure(void **state) {
    need_train();
    char limit4[PATH_MAX + 64], limit8[PATH_MAX + 64];
    if (SANITIZED) {
        snprintf(limit4, sizeof limit4, "ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=4:detect_leaks=0");
        snprintf(limit8, sizeof limit8, "ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=8:detect_leaks=0");
    } else {
        snprintf(limit4, sizeof limit4, "LD_PRELOAD=%s FAULT_MALLOC_LIMIT=%d", shim, 4 << 20);
        snprintf(limit8, sizeof limit8, "LD_PRELOAD=%s FAULT_MALLOC_LIMIT=%d", shim, 8 << 20);
    }
    assert_int_equal(run("%s ./train %s batch=4096 conv1.filters=32 save=%s/alloc", limit4, cfg, dir), 1);
    expect_output("out of cpu memory");
    expect_output(" MB");
    if (strstr(output(), "epoch 1/")) fail_msg("training started:\n%s", output());
    // An image folder whose one image is too large to decode under the limit.
    char img[PATH_MAX + 64];
    snprintf(img, sizeof img, "%s/photos", dir);
    mkdir(img, 0777);
    snprintf(img, sizeof img, "%s/photos/a", dir);
    mkdir(img, 0777);
    snprintf(img, sizeof img, "%s/photos/b", dir);
    mkdir(img, 0777);
    uint8_t *px = calloc(2000 * 2000, 3);
    assert_non_null(px);
    snprintf(img, sizeof img, "%s/photos/a/big.png", dir);
    assert_true(stbi_write_png(img, 2000, 2000, 3, px, 2000 * 3));
    snprintf(img, sizeof img, "%s/photos/b/small.png", dir);
    assert_true(stbi_write_png(img, 8, 8, 3, px, 8 * 3));
    free(px);
    assert_int_equal(run("%s ./train %s train=%s/photos train_labels= test= test_labels= width=8 "
                         "height=8 channels=1 workers=0 fc1.outputs=2 save=%s/alloc", limit8, cfg, dir, dir), 1);
    expect_output("out of memory decoding 2000 x 2000 pixels");
    expect_output("big.png");
}

// A plan is arithmetic: --plan at batch 1,048,576 (a 2 TB plan) allocates nothing of it
// (it took 81 s and 818 MB once).
static void test_plan_allocates_nothing(void **state) {
    need_train();
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (!pid) {
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        execl("./train", "./train", cfg, "batch=1048576", "conv1.filters=512", "--plan", (char *)NULL);
        _exit(127);
    }
    int status;
    struct rusage ru;
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    print_message("--plan at batch 1048576: peak RSS %.1f MB\n", ru.ru_maxrss / 1024.0);
    assert_true(ru.ru_maxrss < (SANITIZED ? 300 : 100) * 1024);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_loop),
        cmocka_unit_test(test_full_disk_and_read_only),
        cmocka_unit_test(test_kill_during_move_aside),
        cmocka_unit_test(test_full_disk_metrics),
        cmocka_unit_test(test_allocation_failure),
        cmocka_unit_test(test_plan_allocates_nothing),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
