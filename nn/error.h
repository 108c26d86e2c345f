// error.h: errors for people (DESIGN.md decision 9).
//
// Contract: library functions that can fail take an `Error *err` last and return 0 on
// success, -1 on failure with err->msg filled in. Only the CLI prints and exits.
// A message says which file, which line or key, what was expected and what to do.
#ifndef NN_ERROR_H
#define NN_ERROR_H

#include <stddef.h>
#include <string.h>

typedef struct Error {
    char msg[1024];
} Error;

// Formats the message into err (if err is non-NULL); always returns -1 so callers can
// write `return err_set(err, "...")`.
int err_set(Error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prepends "prefix: " to an existing message (for adding the file name or layer name
// as an error travels up). Returns -1.
int err_wrap(Error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Allocation that reports failures with the caller's file and line. Returns NULL and
// sets err on failure. Memory is zeroed (calloc semantics).
#define xcalloc(n, size, err) xcalloc_at((n), (size), (err), __FILE__, __LINE__)
void *xcalloc_at(size_t n, size_t size, Error *err, const char *file, int line);

// A malloc'd copy of s[0..n) with a terminating NUL, or of the string s; NULL with err
// (naming the caller's file and line) when out of memory.
#define xstrndup(s, n, err) xstrndup_at((s), (n), (err), __FILE__, __LINE__)
#define xstrdup(s, err) xstrndup_at((s), strlen(s), (err), __FILE__, __LINE__)
char *xstrndup_at(const char *s, size_t n, Error *err, const char *file, int line);

#endif
