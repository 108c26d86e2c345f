#include "file.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int64_t file_pread_full(int fd, void *buf, size_t n, int64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (uint8_t *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

// One loop for both writes: off < 0 means the file position.
static int write_at(int fd, const void *buf, size_t n, int64_t off) {
    size_t done = 0;
    while (done < n) {
        const uint8_t *p = (const uint8_t *)buf + done;
        ssize_t w = off < 0 ? write(fd, p, n - done) : pwrite(fd, p, n - done, (off_t)(off + (int64_t)done));
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

int file_pwrite_full(int fd, const void *buf, size_t n, int64_t off) { return write_at(fd, buf, n, off); }
int file_write_full(int fd, const void *buf, size_t n) { return write_at(fd, buf, n, -1); }

int file_mkdirs(const char *path, Error *err) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return err_set(err, "the folder name %.200s... is too long", path);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            const char c = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return err_set(err, "cannot create the folder %s: %s", p, strerror(errno));
            *s = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) return err_set(err, "%s exists and is not a folder", p);
    return 0;
}

// The folder of path, synced after a rename there: "." if path has no '/'.
static int sync_dir(const char *path, Error *err) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return err_set(err, "wrote '%s' but its folder name is too long to sync", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, "wrote '%s' but cannot open its folder '%s' to sync it: %s", path, dir,
                       strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    // Some file systems cannot fsync a folder (EINVAL): the rename is as durable as they allow.
    if (rc && e != EINVAL)
        return err_set(err, "wrote '%s' but syncing its folder '%s' failed: %s", path, dir,
                       strerror(e));
    return 0;
}

int file_write_atomic(const char *path, int (*fill)(FILE *f, void *arg), void *arg, Error *err) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return err_set(err, "cannot write '%.200s...': the path is too long", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return err_set(err, "cannot create '%s' (to write '%s'): %s; check that the folder exists "
                            "and is writable", tmp, path, strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        err_set(err, "cannot write '%s': %s", tmp, strerror(errno));
        close(fd);
        goto fail;
    }
    errno = 0;
    if (fill(f, arg) || fflush(f) || ferror(f)) {
        err_set(err, "cannot write '%s': %s", tmp, strerror(errno ? errno : EIO));
        goto fail;
    }
    if (fsync(fileno(f))) {
        err_set(err, "cannot sync '%s' to disk: %s", tmp, strerror(errno));
        goto fail;
    }
    const int closed = fclose(f);
    f = NULL;
    if (closed) {
        err_set(err, "cannot write '%s': %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path)) {
        err_set(err, "cannot rename '%s' onto '%s': %s", tmp, path, strerror(errno));
        goto fail;
    }
    return sync_dir(path, err);
fail:
    if (f) fclose(f);
    unlink(tmp);
    if (err) {  // the point of the temporary file: say so
        const size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; '%s' is unchanged", path);
    }
    return -1;
}

int file_exe_dir(char *dir, size_t cap) {
    if (cap < 2) return -1;
    const ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
    Dl_info info;
    if (n > 0)
        dir[n] = '\0';
    else if (dladdr((void *)(uintptr_t)file_exe_dir, &info) && info.dli_fname &&
             strlen(info.dli_fname) < cap)
        strcpy(dir, info.dli_fname);
    else
        return -1;
    char *slash = strrchr(dir, '/');
    if (!slash) return -1;  // found on the PATH: the folder is unknown
    slash[slash == dir] = '\0';  // "/train" -> "/"
    return 0;
}
