#include "file.h"

#include <errno.h>
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
