// fault_inject.c: a preloaded library (LD_PRELOAD) that makes the file system and the
// allocator fail on request, for tests/test_faults.c. Built without sanitizers.
//
//   FAULT_ENOSPC_DIR=DIR   files under DIR opened for writing behave as a full disk:
//                          every write fails with ENOSPC (open/openat write to /dev/full,
//                          fopen opens /dev/full)
//   FAULT_ENOSPC_NAME=N    with FAULT_ENOSPC_DIR: only files whose name (after the last
//                          '/') starts with N (a disk that fills while one file is written)
//   FAULT_EROFS_DIR=DIR    opening a file under DIR for writing fails with EROFS (a
//                          read-only folder; root ignores permissions, so chmod cannot)
//   FAULT_KILL_RENAME=N    the process kills itself with SIGKILL at its Nth rename (1, 2,
//                          ...), before it happens: a kill -9 at that point of a sequence
//                          of renames (moving a run aside, an atomic write)
//   FAULT_MALLOC_LIMIT=N   malloc, calloc, realloc and the aligned allocators return NULL
//                          (ENOMEM) for N bytes or more (not in the FAULT_FILES_ONLY build,
//                          which AddressSanitizer's binaries preload: their allocator is
//                          ASan's, limited by ASAN_OPTIONS=max_allocation_size_mb instead)
//
// DIR is compared with the path as given (the tests give absolute paths).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static const char *enospc_dir, *enospc_name, *erofs_dir;
static long kill_rename;
#ifndef FAULT_FILES_ONLY
static size_t malloc_limit = (size_t)-1;
#endif

__attribute__((constructor)) static void fault_init(void) {
    enospc_dir = getenv("FAULT_ENOSPC_DIR");
    enospc_name = getenv("FAULT_ENOSPC_NAME");
    erofs_dir = getenv("FAULT_EROFS_DIR");
    const char *k = getenv("FAULT_KILL_RENAME");
    if (k && *k) kill_rename = strtol(k, NULL, 10);
#ifndef FAULT_FILES_ONLY
    const char *m = getenv("FAULT_MALLOC_LIMIT");
    if (m && *m) malloc_limit = strtoull(m, NULL, 10);
#endif
}

static bool under(const char *path, const char *dir) {
    if (!dir || !*dir || !path) return false;
    const size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || !path[n]);
}

// What to do with a path opened with these flags: 0 as asked, 1 write to /dev/full, -1 EROFS.
static int fault_for(const char *path, bool writing) {
    if (!writing) return 0;
    if (under(path, erofs_dir)) return -1;
    if (under(path, enospc_dir)) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        return !enospc_name || !*enospc_name || !strncmp(base, enospc_name, strlen(enospc_name));
    }
    return 0;
}


static bool flags_write(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT); }

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef FILE *(*fopen_fn)(const char *, const char *);

static int open_common(open_fn real, const char *path, int flags, mode_t mode) {
    const int f = fault_for(path, flags_write(flags));
    if (f < 0) {
        errno = EROFS;
        return -1;
    }
    return f ? real("/dev/full", O_WRONLY | (flags & O_CLOEXEC)) : real(path, flags, mode);
}

int open(const char *path, int flags, ...) {
    REAL(open, open_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return open_common(real_open, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    REAL(open64, open_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    return open_common(real_open64, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL(openat, openat_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    const int f = fault_for(path, flags_write(flags));
    if (f < 0) {
        errno = EROFS;
        return -1;
    }
    return f ? real_openat(AT_FDCWD, "/dev/full", O_WRONLY | (flags & O_CLOEXEC)) : real_openat(dirfd, path, flags, mode);
}

static FILE *fopen_common(fopen_fn real, const char *path, const char *mode) {
    const int f = fault_for(path, strpbrk(mode, "wa+") != NULL);
    if (f < 0) {
        errno = EROFS;
        return NULL;
    }
    return real(f ? "/dev/full" : path, f ? "w" : mode);
}

FILE *fopen(const char *path, const char *mode) {
    REAL(fopen, fopen_fn);
    return fopen_common(real_fopen, path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    REAL(fopen64, fopen_fn);
    return fopen_common(real_fopen64, path, mode);
}

typedef int (*rename_fn)(const char *, const char *);

int rename(const char *from, const char *to) {
    REAL(rename, rename_fn);
    static long renames;
    if (kill_rename && ++renames == kill_rename) raise(SIGKILL);
    return real_rename(from, to);
}

#ifndef FAULT_FILES_ONLY
// glibc's own entry points: no dlsym (it allocates) inside the allocator.
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static void *refuse(void) {
    errno = ENOMEM;
    return NULL;
}

void *malloc(size_t n) { return n >= malloc_limit ? refuse() : __libc_malloc(n); }
void *calloc(size_t n, size_t size) {
    return size && n >= malloc_limit / size ? refuse() : __libc_calloc(n, size);
}
void *realloc(void *p, size_t n) { return n >= malloc_limit ? refuse() : __libc_realloc(p, n); }
void *aligned_alloc(size_t align, size_t n) { return n >= malloc_limit ? refuse() : __libc_memalign(align, n); }
void *memalign(size_t align, size_t n) { return n >= malloc_limit ? refuse() : __libc_memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    if (n >= malloc_limit) return ENOMEM;
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif
