#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int err_set(Error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int err_wrap(Error *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512], rest[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(rest, err->msg, sizeof rest);
    // A message longer than the buffer is cut: still readable, and never overflows.
    size_t n = 0, cap = sizeof err->msg - 1;
    const char *parts[3] = {prefix, ": ", rest};
    for (int i = 0; i < 3; i++) {
        size_t len = strlen(parts[i]);
        if (len > cap - n) len = cap - n;
        memcpy(err->msg + n, parts[i], len);
        n += len;
    }
    err->msg[n] = '\0';
    return -1;
}

void *xcalloc_at(size_t n, size_t size, Error *err, const char *file, int line) {
    void *p = (n && size) ? calloc(n, size) : calloc(1, 1);
    if (!p) err_set(err, "%s:%d: out of memory allocating %zu x %zu bytes", file, line, n, size);
    return p;
}

char *xstrndup_at(const char *s, size_t n, Error *err, const char *file, int line) {
    char *d = xcalloc_at(n + 1, 1, err, file, line);
    if (d && n) memcpy(d, s, n);
    return d;
}
