// file.h: file helpers shared by the data sets, the cache and the trainer.
#ifndef NN_FILE_H
#define NN_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

// Reads n bytes at off, retrying short reads and EINTR. Returns the bytes read (less
// than n only at end of file), or -1 with errno set.
int64_t file_pread_full(int fd, void *buf, size_t n, int64_t off);
// Writes n bytes at off (pwrite) or at the file position (write), retrying short writes
// and EINTR. Return 0, or -1 with errno set.
int file_pwrite_full(int fd, const void *buf, size_t n, int64_t off);
int file_write_full(int fd, const void *buf, size_t n);
// Replaces the file at path atomically: fill writes the new contents into a temporary file
// PATH.tmp.PID (returning 0, or -1 with errno set), which is then flushed, synced to disk
// and renamed onto path, and the folder is synced. On any failure the temporary file is
// removed and path is as it was, which err says. A process killed on the way leaves path
// whole, the old contents or the new, and at most the temporary file.
int file_write_atomic(const char *path, int (*fill)(FILE *f, void *arg), void *arg, Error *err);
// Creates the folder path and its missing parents (mkdir -p). Errors name the folder
// that could not be made, or a path that exists and is not a folder.
int file_mkdirs(const char *path, Error *err);
// The folder of this process's executable (no trailing slash) into dir: /proc/self/exe on
// Linux; elsewhere the file that the dynamic loader says holds this code (dladdr), which
// may be relative to the starting folder. -1 when neither says.
int file_exe_dir(char *dir, size_t cap);

#endif
