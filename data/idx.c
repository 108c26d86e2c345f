// idx.c: MNIST's IDX format as a lazy Dataset (DESIGN.md decision 8).
//
// The dataset keeps one file descriptor per file and reads a sample with pread when it
// is asked for, so memory does not grow with the set and workers can read concurrently
// (pread has no shared file position). A gzip file is inflated once, at open, into an
// unlinked temporary file and read the same way: the disk holds the inflated set, memory
// never does, and the temporary file disappears with the descriptor.
#include "dataset.h"

#include "../nn/file.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

// Files over 2 GB: every offset below is an off_t/int64_t.
static_assert(sizeof(off_t) == 8, "IDX files over 2 GB need a 64-bit off_t");

enum {
    IDX_IMAGES_MAGIC = 0x00000803,  // unsigned bytes, 3 dimensions: count, rows, cols
    IDX_LABELS_MAGIC = 0x00000801,  // unsigned bytes, 1 dimension: count
    IDX_IMAGES_HEADER = 16,         // magic + 3 big-endian uint32
    IDX_LABELS_HEADER = 8,          // magic + 1 big-endian uint32
};

#define IDX_INFLATE_CHUNK (1 << 20)  // inflated bytes per step (and 1/8 of it read)
#define IDX_SCAN_CHUNK (1 << 16)     // bytes per pread while scanning the labels

// One opened IDX file: a raw file, or the unlinked inflated copy of a gzip file.
typedef struct IdxFile {
    int fd;
    int64_t size;    // bytes (of the inflated copy for gzip)
    int gzip;        // 1 if the file on disk is gzip
    bool inflating;  // the copy is still being inflated: size is what is out so far
} IdxFile;

typedef struct IdxImpl {
    int images_fd;         // (count, rows, cols) bytes after a 16-byte header
    int labels_fd;         // (count) bytes after an 8-byte header
    int64_t sample_bytes;  // rows * cols
    char *labels_path;     // for messages; ds->source is the images path
} IdxImpl;

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Names what a magic number is, for a message: "an IDX labels file", "not an IDX file".
static void idx_describe_magic(char *out, size_t size, uint32_t magic) {
    if (magic == IDX_IMAGES_MAGIC) {
        snprintf(out, size, "an IDX images file");
    } else if (magic == IDX_LABELS_MAGIC) {
        snprintf(out, size, "an IDX labels file");
    } else if ((magic >> 16) == 0 && ((magic >> 8) & 0xff) >= 0x08 &&
               ((magic >> 8) & 0xff) <= 0x0e) {
        snprintf(out, size,
                 "an IDX file of element type 0x%02x with %u dimensions, not unsigned bytes "
                 "(0x08) with 3 (images) or 1 (labels)",
                 (magic >> 8) & 0xff, magic & 0xff);
    } else {
        snprintf(out, size, "not an IDX images or labels file");
    }
}

// Checks the magic, dimensions and exact size of an opened IDX file; is_images selects
// images (count, rows, cols) or labels (count). dims receives the dimensions, *expected
// the size they declare. While the file is inflating (f->inflating, its header out),
// everything but the size.
static int idx_check_header(const IdxFile *f, const char *path, int is_images, uint32_t dims[3],
                            int64_t *expected_size, Error *err) {
    const char *kind = is_images ? "images" : "labels";
    const uint32_t want = is_images ? IDX_IMAGES_MAGIC : IDX_LABELS_MAGIC;
    const int64_t header = is_images ? IDX_IMAGES_HEADER : IDX_LABELS_HEADER;
    const char *inflated = f->gzip ? " (after inflating the gzip)" : "";

    if (f->size == 0)
        return err_set(err, "%s: file is empty (0 bytes%s); expected an IDX %s file (magic 0x%08x)",
                       path, inflated, kind, want);
    if (f->size < 4)
        return err_set(err,
                       "%s: %" PRId64 " bytes%s, too short for an IDX %s header (%" PRId64
                       " bytes); the file is truncated or not IDX",
                       path, f->size, inflated, kind, header);
    uint8_t h[IDX_IMAGES_HEADER];
    int64_t n = f->size < header ? f->size : header;
    errno = 0;
    if (file_pread_full(f->fd, h, (size_t)n, 0) != n)
        return err_set(err, "%s: cannot read the IDX header: %s", path,
                       errno ? strerror(errno) : "short read");
    uint32_t magic = be32(h);
    if (magic != want) {
        char what[160];
        idx_describe_magic(what, sizeof what, magic);
        const char *hint = (magic == IDX_IMAGES_MAGIC || magic == IDX_LABELS_MAGIC)
                               ? "; are the images and labels paths swapped?"
                               : "; check the path";
        return err_set(err, "%s: magic 0x%08x%s is %s, expected an IDX %s file (magic 0x%08x)%s",
                       path, magic, inflated, what, kind, want, hint);
    }
    if (f->size < header)
        return err_set(err,
                       "%s: truncated IDX %s header: expected %" PRId64 " bytes, found %" PRId64
                       "%s; fetch the file again",
                       path, kind, header, f->size, inflated);
    dims[0] = be32(h + 4);
    dims[1] = is_images ? be32(h + 8) : 1;
    dims[2] = is_images ? be32(h + 12) : 1;
    if (is_images && (dims[0] == 0 || dims[1] == 0 || dims[2] == 0))
        return err_set(err,
                       "%s: a dimension is zero (count %u, rows %u, cols %u); an IDX images "
                       "file needs count, rows and cols > 0",
                       path, dims[0], dims[1], dims[2]);
    if (!is_images && dims[0] == 0)
        return err_set(err, "%s: count is zero; an IDX labels file needs at least one label",
                       path);
    if (is_images && (dims[1] > INPUT_MAX_SIDE || dims[2] > INPUT_MAX_SIDE))
        return err_set(err, "%s: image size %u x %u is too large (at most %d a side)", path,
                       dims[1], dims[2], INPUT_MAX_SIDE);
    // rows * cols < 2^62 fits; count * that may not.
    int64_t sample = (int64_t)dims[1] * dims[2];
    if (sample > (INT64_MAX - header) / dims[0])
        return err_set(err, "%s: dimensions %u x %u x %u overflow a 64-bit file size", path,
                       dims[0], dims[1], dims[2]);
    int64_t expected = header + (int64_t)dims[0] * sample;
    *expected_size = expected;
    if (f->size != expected && !f->inflating) {
        char layout[96];
        if (is_images)
            snprintf(layout, sizeof layout, "%" PRId64 "-byte header + %u images x %u x %u",
                     header, dims[0], dims[1], dims[2]);
        else
            snprintf(layout, sizeof layout, "%" PRId64 "-byte header + %u labels", header,
                     dims[0]);
        if (f->size < expected)
            return err_set(err,
                           "%s: truncated: expected %" PRId64 " bytes (%s), found %" PRId64
                           "%s; fetch or re-create the file",
                           path, expected, layout, f->size, inflated);
        return err_set(err,
                       "%s: %" PRId64 " bytes of trailing data: expected %" PRId64
                       " bytes (%s), found %" PRId64 "%s; the header does not match the file",
                       path, f->size - expected, expected, layout, f->size, inflated);
    }
    return 0;
}

// Inflates the gzip file at path into a new unlinked temporary file in $TMPDIR (or
// /tmp) and sets *out_fd to it. Memory holds one chunk at a time, never the set. The
// header is checked as soon as it is out (is_images as idx_check_header), and the copy
// never grows past the size it declares: a gzip file of 100 KB can inflate to 100 MB of
// zeros after a header of one image, and one of a GB to a full disk.
static int idx_inflate(int *out_fd, const char *path, int is_images, Error *err) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char tmpl[PATH_MAX];
    int len = snprintf(tmpl, sizeof tmpl, "%s/cnn-idx-XXXXXX", dir);
    if (len < 0 || (size_t)len >= sizeof tmpl)
        return err_set(err, "%s: TMPDIR is too long a path (%s); set TMPDIR to a shorter one",
                       path, dir);
    int fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd < 0)
        return err_set(err,
                       "%s: cannot create a temporary file in %s to inflate the gzip file "
                       "into: %s; set TMPDIR to a writable directory",
                       path, dir, strerror(errno));
    // Unlinked at once: the copy lives as long as the descriptor, and no crash leaves it.
    if (unlink(tmpl) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, "%s: cannot unlink the temporary file %s: %s", path, tmpl,
                       strerror(e));
    }

    // zlib's inflate rather than gzread: gzread ignores bytes after the last gzip member,
    // which here is a damaged file. Concatenated members (gzip's own format) are one file.
    uint8_t *in = NULL, *out = NULL;
    z_stream z = {0};
    bool zinit = false;
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set(err, "%s: cannot open the gzip file: %s", path, strerror(errno));
        goto fail;
    }
    in = xcalloc(IDX_INFLATE_CHUNK / 8, 1, err);
    out = xcalloc(IDX_INFLATE_CHUNK, 1, err);
    if (!in || !out) goto fail;
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {  // gzip headers only
        err_set(err, "%s: cannot start zlib: out of memory", path);
        goto fail;
    }
    zinit = true;
    int64_t total = 0, read_bytes = 0, declared = -1;  // declared: once the header is out
    const int64_t header = is_images ? IDX_IMAGES_HEADER : IDX_LABELS_HEADER;
    bool member_done = false;
    for (;;) {
        if (z.avail_in == 0) {
            const size_t n = fread(in, 1, IDX_INFLATE_CHUNK / 8, f);
            if (n == 0) {
                if (ferror(f)) {
                    err_set(err, "%s: cannot read: %s", path, strerror(errno));
                    goto fail;
                }
                break;
            }
            z.next_in = in, z.avail_in = (uInt)n;
            read_bytes += (int64_t)n;
        }
        if (member_done) {  // bytes after a whole member: another member, or damage
            if (z.next_in[0] != 0x1f) {
                const int64_t at = read_bytes - z.avail_in;
                fseek(f, 0, SEEK_END);
                err_set(err, "%s: %lld bytes after the end of the gzip stream (from byte %" PRId64
                             "): the file is damaged or more than a gzip file; fetch it again",
                        path, (long long)(ftell(f) - at), at);
                goto fail;
            }
            inflateReset(&z);
            member_done = false;
        }
        z.next_out = out, z.avail_out = IDX_INFLATE_CHUNK;
        const int r = inflate(&z, Z_NO_FLUSH);
        const size_t produced = IDX_INFLATE_CHUNK - z.avail_out;
        if (produced && file_write_full(fd, out, produced) != 0) {
            err_set(err,
                    "%s: cannot write the inflated copy (%" PRId64 " bytes so far) to a "
                    "temporary file in %s: %s; free space there or set TMPDIR to a "
                    "directory with room",
                    path, total + (int64_t)produced, dir, strerror(errno));
            goto fail;
        }
        total += (int64_t)produced;
        if (declared < 0 && total >= header) {
            const IdxFile part = {.fd = fd, .size = total, .gzip = 1, .inflating = true};
            uint32_t dims[3];
            if (idx_check_header(&part, path, is_images, dims, &declared, err)) goto fail;
        }
        if (declared >= 0 && total > declared) {
            err_set(err, "%s: the gzip stream inflates to more than the %" PRId64 " bytes its IDX "
                         "header declares; the file is damaged or forged", path, declared);
            goto fail;
        }
        if (r == Z_STREAM_END) member_done = true;
        else if (r != Z_OK && r != Z_BUF_ERROR) {
            err_set(err, "%s: corrupt gzip stream (zlib: %s) after %" PRId64 " inflated bytes; "
                         "fetch the file again", path, z.msg ? z.msg : "error", total);
            goto fail;
        }
    }
    if (!member_done) {
        err_set(err, "%s: truncated gzip stream: the file ends after %" PRId64 " inflated bytes; "
                     "fetch the file again", path, total);
        goto fail;
    }
    inflateEnd(&z);
    fclose(f);
    free(in);
    free(out);
    *out_fd = fd;
    return 0;

fail:
    if (zinit) inflateEnd(&z);
    if (f) fclose(f);
    free(in);
    free(out);
    close(fd);
    return -1;
}

// Opens path, inflating it first if it starts with the gzip magic 1f 8b (the content
// decides, not the name). On success f->fd is open and f->size is its size.
static int idx_file_open(IdxFile *f, const char *path, int is_images, Error *err) {
    f->fd = -1;
    f->size = 0;
    f->gzip = 0;
    f->inflating = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, "%s: cannot open: %s; check the path (the [data] section of the cfg)",
                       path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return err_set(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, "%s: not a regular file; expected an IDX file (raw or gzip)", path);
    }
    uint8_t magic[2];
    int64_t got = file_pread_full(fd, magic, sizeof magic, 0);
    if (got < 0) {
        int e = errno;
        close(fd);
        return err_set(err, "%s: cannot read: %s", path, strerror(e));
    }
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        close(fd);  // zlib opens the file itself
        if (idx_inflate(&fd, path, is_images, err) != 0) return -1;
        if (fstat(fd, &st) != 0) {
            int e = errno;
            close(fd);
            return err_set(err, "%s: cannot stat the inflated copy: %s", path, strerror(e));
        }
        f->gzip = 1;
    }
    f->fd = fd;
    f->size = (int64_t)st.st_size;
    return 0;
}

// Scans every label once: *max_label = the largest. Labels are one byte each, so this
// is cheap and bounded by the count, and it saves keeping them in memory.
static int idx_scan_labels(int fd, const char *path, int64_t count, int *max_label, Error *err) {
    uint8_t *buf = xcalloc(IDX_SCAN_CHUNK, 1, err);
    if (!buf) return -1;
    int max = 0;
    for (int64_t done = 0; done < count;) {
        size_t n = (size_t)(count - done < IDX_SCAN_CHUNK ? count - done : IDX_SCAN_CHUNK);
        int64_t got = file_pread_full(fd, buf, n, IDX_LABELS_HEADER + done);
        if (got != (int64_t)n) {
            err_set(err, "%s: cannot read the labels at byte %" PRId64 ": %s", path,
                    IDX_LABELS_HEADER + done, got < 0 ? strerror(errno) : "file shrank");
            free(buf);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            if (buf[i] > max) max = buf[i];
        done += (int64_t)n;
    }
    free(buf);
    *max_label = max;
    return 0;
}

static int idx_label(const Dataset *ds, int64_t i, int32_t *label, Error *err) {
    const IdxImpl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the set has %" PRId64 ")",
                       im->labels_path, i, ds->count);
    uint8_t b;
    int64_t got = file_pread_full(im->labels_fd, &b, 1, IDX_LABELS_HEADER + i);
    if (got != 1)
        return err_set(err, "%s: sample %" PRId64 ": cannot read its label: %s; was the file "
                       "changed while training?",
                       im->labels_path, i, got < 0 ? strerror(errno) : "end of file");
    if (b >= ds->classes)
        return err_set(err, "%s: sample %" PRId64 ": label %d, but the file had %d classes at "
                       "open; was the file changed while training?",
                       im->labels_path, i, b, ds->classes);
    *label = b;
    return 0;
}

static int idx_read(const Dataset *ds, int64_t i, uint8_t *pixels, int32_t *label, Error *err) {
    const IdxImpl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the set has %" PRId64 ")",
                       ds->source, i, ds->count);
    int64_t off = IDX_IMAGES_HEADER + i * im->sample_bytes;
    int64_t got = file_pread_full(im->images_fd, pixels, (size_t)im->sample_bytes, off);
    if (got != im->sample_bytes)
        return err_set(err, "%s: sample %" PRId64 ": cannot read %" PRId64 " bytes at %" PRId64
                       ": %s; was the file changed while training?",
                       ds->source, i, im->sample_bytes, off,
                       got < 0 ? strerror(errno) : "end of file");
    return idx_label(ds, i, label, err);
}

// Frees everything, the Dataset included; works on a partly built one.
static void idx_close(Dataset *ds) {
    IdxImpl *im = ds->impl;
    if (im) {
        if (im->images_fd >= 0) close(im->images_fd);
        if (im->labels_fd >= 0) close(im->labels_fd);
        free(im->labels_path);
        free(im);
    }
    dataset_names_free(ds->class_names, ds->classes);
    free(ds->info);
    free(ds->source);
    free(ds);
}

static const DatasetOps idx_ops = {.read = idx_read, .label = idx_label, .close = idx_close};


int idx_dataset_open(Dataset **out, const char *images_path, const char *labels_path,
                     Error *err) {
    *out = NULL;
    Dataset *ds = xcalloc(1, sizeof *ds, err);
    if (!ds) return -1;
    ds->ops = &idx_ops;
    IdxImpl *im = xcalloc(1, sizeof *im, err);
    if (!im) {
        free(ds);
        return -1;
    }
    im->images_fd = im->labels_fd = -1;
    ds->impl = im;
    if (!(ds->source = xstrdup(images_path, err))) goto fail;
    if (!(im->labels_path = xstrdup(labels_path, err))) goto fail;

    IdxFile images, labels;
    uint32_t idims[3], ldims[3];
    int64_t size;
    if (idx_file_open(&images, images_path, 1, err) != 0) goto fail;
    im->images_fd = images.fd;
    if (idx_check_header(&images, images_path, 1, idims, &size, err) != 0) goto fail;
    if (idx_file_open(&labels, labels_path, 0, err) != 0) goto fail;
    im->labels_fd = labels.fd;
    if (idx_check_header(&labels, labels_path, 0, ldims, &size, err) != 0) goto fail;
    if (idims[0] != ldims[0]) {
        err_set(err, "%s has %u images but %s has %u labels; the two files must describe the "
                "same samples (check the [data] paths)",
                images_path, idims[0], labels_path, ldims[0]);
        goto fail;
    }
    int max_label;
    if (idx_scan_labels(im->labels_fd, labels_path, ldims[0], &max_label, err) != 0) goto fail;

    ds->count = idims[0];
    ds->shape = (Shape){.c = 1, .h = (int)idims[1], .w = (int)idims[2]};
    ds->classes = max_label + 1;
    if (!(ds->class_names = dataset_names_numbers(ds->classes, err))) goto fail;
    im->sample_bytes = (int64_t)idims[1] * idims[2];
    *out = ds;
    return 0;

fail:
    idx_close(ds);
    return -1;
}
