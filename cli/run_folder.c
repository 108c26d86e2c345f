// run_folder.c: the save folder of a run (run_folder.h).
#include "run_folder.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../nn/file.h"

static const char *const run_files[] = {"last.safetensors", "best.safetensors", "metrics.jsonl",
                                        "curves.svg"};
enum { NRUN_FILES = sizeof run_files / sizeof run_files[0] };

#define MOVING ".moving"

bool run_folder_contains(const char *save, const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else if (snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path) >= (int)sizeof dir) return false;
    struct stat a, b;
    return !stat(dir, &a) && !stat(save, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Removes the temporary files that a trainer killed while writing left in the save folder:
// NAME.tmp.PID (file_write_atomic's pattern) of a run's file and a process that no longer
// runs. Other files are never touched.
static void remove_stale_temporaries(const char *save) {
    DIR *d = opendir(save);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || t == e->d_name) continue;
        char *end;
        const long pid = strtol(t + 5, &end, 10);
        bool ours = false;
        for (int i = 0; i < NRUN_FILES && !ours; i++)
            ours = (size_t)(t - e->d_name) == strlen(run_files[i]) &&
                   !strncmp(e->d_name, run_files[i], strlen(run_files[i]));
        if (!ours || *end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", save, e->d_name) < (int)sizeof path && !unlink(path))
            printf("removed %s, left by process %ld, which no longer runs\n", path, pid);
    }
    closedir(d);
}

// save/name into out (PATH_MAX bytes); an error if it does not fit.
static int join(char *out, const char *save, const char *name, Error *err) {
    if (snprintf(out, PATH_MAX, "%s/%s", save, name) >= PATH_MAX)
        return err_set(err, "the path %s/%s is too long", save, name);
    return 0;
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

// The run's files in save go into folder `into` (renames); *moved counts them.
static int move_files(const char *save, const char *into, int *moved, Error *err) {
    *moved = 0;
    for (int i = 0; i < NRUN_FILES; i++) {
        char from[PATH_MAX], to[PATH_MAX];
        if (join(from, save, run_files[i], err) || join(to, into, run_files[i], err)) return -1;
        if (!exists(from)) continue;
        if (exists(to))
            return err_set(err, "cannot move %s into %s: it already holds a %s; move one of them "
                                "away by hand", from, into, run_files[i]);
        if (rename(from, to))
            return err_set(err, "cannot move %s to %s: %s", from, to, strerror(errno));
        (*moved)++;
    }
    return 0;
}

// The number of the folder an earlier run goes to: one more than the largest of
// previous-N and previous-N.moving.
static long next_number(const char *save, char *moving, size_t cap) {
    long last = 0;
    moving[0] = '\0';
    DIR *d = opendir(save);
    if (!d) return 1;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "previous-", 9)) continue;
        char *end;
        const long n = strtol(e->d_name + 9, &end, 10);
        if (n < 1 || (end[0] && strcmp(end, MOVING))) continue;
        if (!strcmp(end, MOVING) && !moving[0]) snprintf(moving, cap, "%s", e->d_name);
        if (n > last) last = n;
    }
    closedir(d);
    return last + 1;
}

// The epochs an earlier run logged, for the message (its metrics.jsonl's lines).
static long logged_epochs(const char *save) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/metrics.jsonl", save);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long lines = 0;
    for (int c; (c = getc(f)) != EOF;) lines += c == '\n';
    fclose(f);
    return lines;
}

// Syncs folder path (the renames in it last); file systems that cannot are left alone.
static void sync_folder(const char *path) {
    FILE *f = fopen(path, "r");
    if (f) {
        fsync(fileno(f));
        fclose(f);
    }
}

int run_folder_prepare(const char *save, bool continues, Error *err) {
    if (file_mkdirs(save, err)) return -1;
    char moving[256], from[PATH_MAX], to[PATH_MAX];
    long n = next_number(save, moving, sizeof moving);
    int moved;
    if (moving[0]) {  // a trainer was killed while it moved a run aside: finish that first
        if (join(from, save, moving, err) || move_files(save, from, &moved, err)) return -1;
        snprintf(to, sizeof to, "%s", from);
        to[strlen(to) - strlen(MOVING)] = '\0';
        if (rename(from, to)) return err_set(err, "cannot rename %s to %s: %s", from, to, strerror(errno));
        sync_folder(save);
        printf("finished moving an earlier run's files to %s/ (a trainer stopped while it moved "
               "them)\n", to);
        n = next_number(save, moving, sizeof moving);
    }
    remove_stale_temporaries(save);
    if (continues) return 0;
    bool held = false;
    for (int i = 0; i < NRUN_FILES && !held; i++) {
        if (join(from, save, run_files[i], err)) return -1;
        held = exists(from);
    }
    if (!held) return 0;
    const long epochs = logged_epochs(save);
    char name[64];
    snprintf(name, sizeof name, "previous-%ld" MOVING, n);
    if (join(from, save, name, err)) return -1;
    if (mkdir(from, 0777)) return err_set(err, "cannot create the folder %s: %s", from, strerror(errno));
    if (move_files(save, from, &moved, err)) return -1;
    snprintf(to, sizeof to, "%s", from);
    to[strlen(to) - strlen(MOVING)] = '\0';
    if (rename(from, to)) return err_set(err, "cannot rename %s to %s: %s", from, to, strerror(errno));
    sync_folder(save);
    printf("%s held an earlier run", save);
    if (epochs >= 0) printf(" (%ld epoch%s logged)", epochs, epochs == 1 ? "" : "s");
    printf(": moved its files to %s/; resume=%s/last.safetensors would have continued it\n", to, to);
    return 0;
}
