// test_budget.c: what the machine can give a run (budget_machine_bytes, nn/budget.h), read
// from a made-up /proc and /sys under a temporary folder: MemAvailable; sysconf where
// /proc/meminfo is missing (not Linux); cgroup v2 and v1 limits less their use, the
// parents' included, the process's own folder missing (a container's cgroup mounted as the
// root); and the executable's folder (file_exe_dir). The planning against that budget is
// test_train's.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../nn/budget.h"
#include "../nn/file.h"
#include "testutil.h"

static char root[PATH_MAX];

// Writes text into root/path, making its folders.
static void put(const char *path, const char *text) {
    char file[PATH_MAX * 2], *slash;
    snprintf(file, sizeof file, "%s/%s", root, path);
    slash = strrchr(file, '/');
    *slash = '\0';
    Error err;
    assert_int_equal(file_mkdirs(file, &err), 0);
    *slash = '/';
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int fresh_root(void **state) { return test_tmpdir_make(root, sizeof root, "test_budget"); }
static int remove_root(void **state) { return test_remove_tree(root); }

static void test_mem_available(void **state) {
    put("proc/meminfo", "MemTotal:       16000 kB\nMemFree:         2000 kB\nMemAvailable:    1000 kB\n");
    const char *source;
    assert_int_equal(budget_machine_bytes_in(root, &source), 1000 * 1024);
    assert_non_null(strstr(source, "MemAvailable"));
}

// No /proc at all: the free pages from sysconf (or a ulimit, where one is set lower).
static void test_no_proc(void **state) {
    const char *source;
    const size_t bytes = budget_machine_bytes_in(root, &source);
    assert_true(bytes > 0 && bytes < SIZE_MAX);
    assert_true(strstr(source, "sysconf") || strstr(source, "ulimit"));
}

// v2: the process's cgroup is unlimited ("max"), its parent leaves 2,000,000 bytes.
static void test_cgroup_v2(void **state) {
    put("proc/meminfo", "MemAvailable:    8000 kB\n");
    put("proc/self/cgroup", "0::/a/b\n");
    put("sys/fs/cgroup/a/b/memory.max", "max\n");
    put("sys/fs/cgroup/a/b/memory.current", "100\n");
    put("sys/fs/cgroup/a/memory.max", "3000000\n");
    put("sys/fs/cgroup/a/memory.current", "1000000\n");
    const char *source;
    assert_int_equal(budget_machine_bytes_in(root, &source), 2000000);
    assert_non_null(strstr(source, "memory.max"));
    put("sys/fs/cgroup/a/memory.current", "4000000\n");  // over its limit: nothing left
    assert_int_equal(budget_machine_bytes_in(root, &source), 0);
}

// v1 beside an empty v2 hierarchy (hybrid, as systemd mounts them): the process's folder
// /docker/c1 is missing, the container's cgroup being mounted as the memory root, whose
// limit decides; v1's "unlimited" (a huge number) never does.
static void test_cgroup_v1(void **state) {
    put("proc/meminfo", "MemAvailable:    8000 kB\n");
    put("proc/self/cgroup", "5:cpu,cpuacct:/docker/c1\n4:memory:/docker/c1\n0::/\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "5000000\n");
    put("sys/fs/cgroup/memory/memory.usage_in_bytes", "1000000\n");
    const char *source;
    assert_int_equal(budget_machine_bytes_in(root, &source), 4000000);
    assert_non_null(strstr(source, "memory.limit_in_bytes"));
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    assert_int_equal(budget_machine_bytes_in(root, &source), 8000 * 1024);
    assert_non_null(strstr(source, "MemAvailable"));
}

static void test_resident(void **state) {
    assert_true(proc_status_bytes("VmRSS:") > 0);
    assert_true(proc_status_bytes("VmHWM:") > 0);
}

static void test_exe_dir(void **state) {
    char dir[PATH_MAX];
    assert_int_equal(file_exe_dir(dir, sizeof dir), 0);
    assert_int_equal(access(test_path(dir, "test_budget"), X_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mem_available, fresh_root, remove_root),
        cmocka_unit_test_setup_teardown(test_no_proc, fresh_root, remove_root),
        cmocka_unit_test_setup_teardown(test_cgroup_v2, fresh_root, remove_root),
        cmocka_unit_test_setup_teardown(test_cgroup_v1, fresh_root, remove_root),
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_exe_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
