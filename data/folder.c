// folder.c: image folders as a lazy Dataset (DESIGN.md decision 8), and their cache.
//
// Open lists the files, never the pixels: the index is the class boundaries and one
// relative path per image (sorted, so the order is the same on every machine), a few
// tens of bytes an image. read decodes one image (image.c: image_load) into the caller's
// buffer; workers call it at once on the same dataset, so it touches nothing shared
// except the cache below.
//
// The cache (cache_dir): one file of uint8 samples, (count, H, W, C) after a header and
// a status byte per sample, written by read as samples are decoded (so the first epoch
// costs no extra pass) into a temporary file that is renamed into place once every
// sample is in. Later epochs, and later runs whose settings and source files (relative
// paths, sizes, mtimes, listed in the file) are unchanged, read it with pread: the page
// cache holds it, not the process, so RSS stays flat. Any difference rebuilds it.
#include "dataset.h"

#include "../nn/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../nn/rng.h"

#define FOLDER_MAX_DEPTH 32             // subfolders below a class folder (symlink loops)

// ---- the cache file --------------------------------------------------------------------

enum { ST_MISSING = 0, ST_GOOD = 1, ST_BAD = 2 };  // a sample's status byte

#define CACHE_MAGIC "CNNCACHE"
// Version 4: the decoding of image.c (libjpeg-turbo for JPEG at a DCT scale, stb_image for
// the rest; box reduction, then the triangle filter over the region the boxes cover, a
// scaled JPEG's picture being its exact fraction of the image), resized as the header's
// fit says. A change of how a sample is made must change the version. (Version 1
// stretched a last partial box to a whole pixel; version 2 decoded JPEGs with stb_image at
// full size; version 3 stretched every image and took a scaled JPEG's whole last pixel.)
#define CACHE_VERSION 4
#define CACHE_ALIGN 4096

// The header, at offset 0, in the writer's byte order (checked by `endian`).
typedef struct CacheHeader {
    char magic[8];
    uint32_t version;
    uint32_t endian;     // 0x01020304
    uint32_t complete;   // 1 once every sample is in (written last, before the rename)
    int32_t width, height, channels, classes;  // the samples' shape
    int32_t resize, short_side, center_crop;     // the rest of the ImageFit that made them
    int32_t pad;
    int64_t count;
    uint64_t fingerprint[2];  // hash of the file list below
    int64_t status_off;       // (count) status bytes
    int64_t list_off, list_bytes;  // "class/relative path\tsize\tmtime\n" per sample
    int64_t data_off;         // (count, H, W, C) bytes
    int64_t file_bytes;
} CacheHeader;

typedef struct Cache {
    char *path;          // the cache file
    char *tmp;           // the temporary file while building; NULL once complete
    int fd;
    int building;        // atomic: 1 until every sample is in
    uint8_t *state;      // (count) ST_*, atomic bytes
    int64_t done;        // atomic: samples whose state is not ST_MISSING
    CacheHeader h;
} Cache;

typedef struct FolderImpl {
    ImageFit fit;     // how each image becomes a sample
    char *root;
    int64_t *first;   // (classes + 1) first entry of each class; first[classes] = count
    int64_t *name;    // (count) offset of the image's path (relative to its class) in pool
    char *pool;       // NUL-terminated relative paths
    Cache *cache;     // NULL without a cache
} FolderImpl;

// ---- small helpers ----------------------------------------------------------------------

// The class of entry i: the last class whose first entry is <= i.
static int class_of(const Dataset *ds, int64_t i) {
    const FolderImpl *fi = ds->impl;
    int lo = 0, hi = ds->classes - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (fi->first[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// root/class/relative path of entry i.
static int entry_path(const Dataset *ds, int64_t i, char *out, Error *err) {
    const FolderImpl *fi = ds->impl;
    int c = class_of(ds, i);
    int n = snprintf(out, PATH_MAX, "%s/%s/%s", fi->root, ds->class_names[c],
                     fi->pool + fi->name[i]);
    if (n < 0 || n >= PATH_MAX)
        return err_set(err, "%s/%s/%s: path too long", fi->root, ds->class_names[c],
                       fi->pool + fi->name[i]);
    return 0;
}

// ---- listing the folder -------------------------------------------------------------------

typedef struct Scan {
    char *pool;
    size_t pool_len, pool_cap;
    int64_t *names;  // offsets into pool
    int64_t n, cap;
    int skip_bad;
    int64_t left_out;              // files left out with skip_bad
    char first_left_out[PATH_MAX]; // the first of them, for info
} Scan;

static int scan_add(Scan *sc, const char *rel, Error *err) {
    size_t len = strlen(rel) + 1;
    if (sc->pool_len + len > sc->pool_cap) {
        size_t cap = sc->pool_cap ? sc->pool_cap * 2 : 1 << 16;
        while (cap < sc->pool_len + len) cap *= 2;
        char *p = realloc(sc->pool, cap);
        if (!p) return err_set(err, "out of memory listing the image folder (%zu bytes)", cap);
        sc->pool = p, sc->pool_cap = cap;
    }
    if (sc->n == sc->cap) {
        int64_t cap = sc->cap ? sc->cap * 2 : 4096;
        int64_t *q = realloc(sc->names, (size_t)cap * sizeof *q);
        if (!q) return err_set(err, "out of memory listing the image folder (%" PRId64 " files)",
                               sc->n);
        sc->names = q, sc->cap = cap;
    }
    memcpy(sc->pool + sc->pool_len, rel, len);
    sc->names[sc->n++] = (int64_t)sc->pool_len;
    sc->pool_len += len;
    return 0;
}

// A file that is not an image: an error, or with skip_bad left out and counted.
static int scan_not_image(Scan *sc, const char *path, const char *why, Error *err) {
    if (!sc->skip_bad)
        return err_set(err, "%s: %s; an image folder holds only images (" IMAGE_EXTS "): move "
                       "the file out of the folder, or set skip_bad = 1 to leave such files out",
                       path, why);
    if (sc->left_out++ == 0) snprintf(sc->first_left_out, sizeof sc->first_left_out, "%s", path);
    return 0;
}

static int cmp_pool(const void *a, const void *b, void *pool) {
    return strcmp((const char *)pool + *(const int64_t *)a, (const char *)pool + *(const int64_t *)b);
}

// Lists the images below the folder path[0..plen) (a class folder or a folder in it);
// rel0 is where the path relative to the class folder starts. path has PATH_MAX bytes.
static int scan_dir(Scan *sc, char *path, size_t plen, size_t rel0, int depth, Error *err) {
    path[plen] = 0;
    DIR *d = opendir(path);
    if (!d) return err_set(err, "%s: cannot open the folder: %s", path, strerror(errno));
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) rc = err_set(err, "%s: cannot list the folder: %s", path, strerror(errno));
            break;
        }
        const char *nm = e->d_name;
        if (nm[0] == '.') continue;  // ".", "..", hidden files (.DS_Store, editors' files)
        size_t nl = strlen(nm);
        if (plen + 1 + nl >= PATH_MAX) {
            path[plen] = 0;
            rc = err_set(err, "%s/%s: path too long", path, nm);
            break;
        }
        path[plen] = '/';
        memcpy(path + plen + 1, nm, nl + 1);
        int is_dir = e->d_type == DT_DIR, is_reg = e->d_type == DT_REG;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            struct stat st;
            if (stat(path, &st) != 0) {
                char why[128];
                snprintf(why, sizeof why, "cannot stat (%s)", strerror(errno));
                if ((rc = scan_not_image(sc, path, why, err))) break;
                continue;
            }
            is_dir = S_ISDIR(st.st_mode), is_reg = S_ISREG(st.st_mode);
        }
        if (is_dir) {
            if (depth >= FOLDER_MAX_DEPTH) {
                rc = err_set(err, "%s: more than %d folders deep inside a class folder; is there "
                             "a symbolic link loop?", path, FOLDER_MAX_DEPTH);
                break;
            }
            if ((rc = scan_dir(sc, path, plen + 1 + nl, rel0, depth + 1, err))) break;
        } else if (is_reg && image_name_has_ext(nm)) {
            if ((rc = scan_add(sc, path + rel0, err))) break;
        } else {
            if ((rc = scan_not_image(sc, path, is_reg ? "not an image (by its extension)"
                                                       : "not a regular file", err)))
                break;
        }
    }
    closedir(d);
    path[plen] = 0;
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The class folders of root, sorted. Image files directly in root are an error (they
// have no class); other files there (a README, a labels list) are not data and are not
// read.
static int scan_classes(const char *root, char ***out, int *nout, Error *err) {
    *out = NULL, *nout = 0;
    DIR *d = opendir(root);
    if (!d) return err_set(err, "%s: cannot open the image folder: %s", root, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    char path[PATH_MAX];
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) rc = err_set(err, "%s: cannot list the folder: %s", root, strerror(errno));
            break;
        }
        if (e->d_name[0] == '.') continue;
        if (snprintf(path, sizeof path, "%s/%s", root, e->d_name) >= (int)sizeof path) {
            rc = err_set(err, "%s/%s: path too long", root, e->d_name);
            break;
        }
        int is_dir = e->d_type == DT_DIR;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            struct stat st;
            is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
        }
        if (!is_dir) {
            if (image_name_has_ext(e->d_name)) {
                rc = err_set(err, "%s: an image directly in the image folder has no class: put "
                             "each image in the subfolder of its class (%s/CLASS/%s)",
                             path, root, e->d_name);
                break;
            }
            continue;
        }
        if (strpbrk(e->d_name, "\n\r")) {  // a checkpoint stores the names a line each
            rc = err_set(err, "%s: a class folder's name holds a line break; rename the folder "
                         "(a class name is one line)", path);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **q = realloc(names, (size_t)cap * sizeof *q);
            if (!q) {
                rc = err_set(err, "out of memory listing %s", root);
                break;
            }
            names = q;
        }
        if (!(names[n] = xstrdup(e->d_name, err))) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == 0 && n == 0)
        rc = err_set(err, "%s: no class folders: an image folder holds one subfolder per class, "
                     "named after it, with the class's images inside (%s/cat/1.jpg, "
                     "%s/dog/2.jpg)", root, root, root);
    if (rc) {
        dataset_names_free(names, n);
        return -1;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    *out = names, *nout = n;
    return 0;
}

// ---- the cache ------------------------------------------------------------------------------

static void hash_bytes(uint64_t h[2], const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i < 8 ? n - i : 8);
        h[0] = rng_mix64(h[0] ^ w) + 0x9e3779b97f4a7c15ULL;
        h[1] = rng_mix64(h[1] + w * 0xff51afd7ed558ccdULL) ^ (h[0] >> 17);
    }
    h[0] = rng_mix64(h[0] ^ n);
    h[1] = rng_mix64(h[1] + n);
}

// Entry i's line of the cache's file list: "class/relative path\tsize\tmtime\n".
static int list_line(const Dataset *ds, int64_t i, char *line, size_t size, int *len, Error *err) {
    const FolderImpl *fi = ds->impl;
    char path[PATH_MAX];
    if (entry_path(ds, i, path, err)) return -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(err, "%s: cannot stat: %s", path, strerror(errno));
    int c = class_of(ds, i);
    *len = snprintf(line, size, "%s/%s\t%lld\t%lld.%09ld\n", ds->class_names[c],
                    fi->pool + fi->name[i], (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                    (long)st.st_mtim.tv_nsec);
    if (*len < 0 || (size_t)*len >= size) return err_set(err, "%s: path too long", path);
    return 0;
}

static CacheHeader cache_want(const Dataset *ds) {
    const FolderImpl *fi = ds->impl;
    CacheHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.version = CACHE_VERSION;
    h.endian = 0x01020304;
    h.width = ds->shape.w, h.height = ds->shape.h, h.channels = ds->shape.c;
    h.resize = (int32_t)fi->fit.resize, h.short_side = fi->fit.short_side;
    h.center_crop = fi->fit.center_crop;
    h.classes = ds->classes;
    h.count = ds->count;
    return h;
}

// Is the existing cache at fd usable? 1 yes (h filled), 0 no (why says why), -1 error.
static int cache_check(const Dataset *ds, int fd, CacheHeader *h, char *why, size_t wsize,
                       Error *err) {
    const CacheHeader want = cache_want(ds);
    struct stat st;
    if (fstat(fd, &st) != 0) return err_set(err, "cache: cannot stat: %s", strerror(errno));
    if (file_pread_full(fd, h, sizeof *h, 0) != (int64_t)sizeof *h ||
        memcmp(h->magic, CACHE_MAGIC, 8) != 0 || h->endian != want.endian) {
        snprintf(why, wsize, "not a cache file of this program");
        return 0;
    }
    if (h->version != want.version) {
        snprintf(why, wsize, "written by another version (%u, now %u)", h->version, want.version);
        return 0;
    }
    if (h->width != want.width || h->height != want.height || h->channels != want.channels) {
        snprintf(why, wsize, "written for %dx%dx%d samples (width x height x channels), now "
                 "%dx%dx%d", h->width, h->height, h->channels, want.width, want.height,
                 want.channels);
        return 0;
    }
    if (h->resize != want.resize || h->short_side != want.short_side ||
        h->center_crop != want.center_crop) {
        snprintf(why, wsize, "written for resize = %s, short_side = %d, center_crop = %d; now "
                 "%s, %d, %d", h->resize == RESIZE_SHORTER ? "shorter" : "stretch", h->short_side,
                 h->center_crop, want.resize == RESIZE_SHORTER ? "shorter" : "stretch",
                 want.short_side, want.center_crop);
        return 0;
    }
    if (h->count != want.count || h->classes != want.classes) {
        snprintf(why, wsize, "source files changed: %" PRId64 " images in %d classes then, "
                 "%" PRId64 " in %d now", h->count, h->classes, want.count, want.classes);
        return 0;
    }
    const int64_t sample = shape_numel(ds->shape);
    if (!h->complete || h->status_off != (int64_t)sizeof *h || h->list_off != h->status_off + h->count ||
        h->data_off < h->list_off + h->list_bytes ||
        h->file_bytes != h->data_off + h->count * sample || st.st_size != h->file_bytes) {
        snprintf(why, wsize, "incomplete or damaged (%lld bytes)", (long long)st.st_size);
        return 0;
    }
    // The file list, line by line against the folder now: the first difference is named.
    FILE *old = NULL;
    int dfd = dup(fd);
    if (dfd < 0 || !(old = fdopen(dfd, "r"))) {
        if (dfd >= 0) close(dfd);
        return err_set(err, "cache: cannot read the file list: %s", strerror(errno));
    }
    int rc = 1;
    char *oline = NULL;
    size_t ocap = 0;
    uint64_t fp[2] = {1, 2};
    if (fseeko(old, (off_t)h->list_off, SEEK_SET) != 0) rc = err_set(err, "cache: seek failed");
    for (int64_t i = 0; rc == 1 && i < ds->count; i++) {
        char line[PATH_MAX + 64];
        int len;
        if (list_line(ds, i, line, sizeof line, &len, err)) {
            rc = -1;
            break;
        }
        hash_bytes(fp, line, (size_t)len);
        ssize_t olen = getline(&oline, &ocap, old);
        if (olen != len || memcmp(oline, line, (size_t)len) != 0) {
            char *tab = strchr(line, '\t');
            if (tab) *tab = 0;
            snprintf(why, wsize, "source files changed since it was written (the first: %s%s)",
                     line, olen == len ? "" : ", or its size or time");
            rc = 0;
        }
    }
    if (rc == 1 && (fp[0] != h->fingerprint[0] || fp[1] != h->fingerprint[1])) {
        snprintf(why, wsize, "its file list does not match its fingerprint");
        rc = 0;
    }
    free(oline);
    fclose(old);
    return rc;
}

static void cache_free(Cache *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    if (c->tmp && c->building) unlink(c->tmp);  // an unfinished cache is never left behind
    free(c->tmp);
    free(c->path);
    free(c->state);
    free(c);
}

// Creates the temporary cache file: header (complete = 0), zero status bytes, the file
// list, and room for the samples (allocated now, so a full disk says so at once).
static int cache_create(const Dataset *ds, Cache *c, Error *err) {
    size_t tl = strlen(c->path) + 16;
    if (!(c->tmp = xcalloc(tl, 1, err))) return -1;
    snprintf(c->tmp, tl, "%s.tmp-XXXXXX", c->path);
    c->fd = mkostemp(c->tmp, O_CLOEXEC);
    if (c->fd < 0) {
        err_set(err, "cache: cannot create %s: %s; check the cache key of [data]", c->tmp,
                strerror(errno));
        free(c->tmp);
        c->tmp = NULL;
        return -1;
    }
    // mkostemp makes the file 0600; give it the mode any other file of the user gets. (The
    // umask can only be read by setting it; datasets are opened before any worker starts.)
    mode_t mask = umask(0);
    umask(mask);
    fchmod(c->fd, 0666 & ~mask);
    CacheHeader h = cache_want(ds);
    h.status_off = (int64_t)sizeof h;
    h.list_off = h.status_off + h.count;
    int dfd = dup(c->fd);
    FILE *f = dfd >= 0 ? fdopen(dfd, "w") : NULL;
    if (!f) {
        if (dfd >= 0) close(dfd);
        return err_set(err, "cache: %s: %s", c->tmp, strerror(errno));
    }
    h.fingerprint[0] = 1, h.fingerprint[1] = 2;
    int rc = fseeko(f, (off_t)h.list_off, SEEK_SET) == 0 ? 0 : -1;
    if (rc) err_set(err, "cache: %s: cannot seek: %s", c->tmp, strerror(errno));
    for (int64_t i = 0; rc == 0 && i < ds->count; i++) {
        char line[PATH_MAX + 64];
        int len;
        if ((rc = list_line(ds, i, line, sizeof line, &len, err))) break;
        hash_bytes(h.fingerprint, line, (size_t)len);
        if (fwrite(line, 1, (size_t)len, f) != (size_t)len) {
            rc = err_set(err, "cache: cannot write %s: %s", c->tmp, strerror(errno));
            break;
        }
        h.list_bytes += len;
    }
    if (fclose(f) != 0 && rc == 0)
        rc = err_set(err, "cache: cannot write %s: %s", c->tmp, strerror(errno));
    if (rc) return -1;
    const int64_t sample = shape_numel(ds->shape);
    h.data_off = (h.list_off + h.list_bytes + CACHE_ALIGN - 1) / CACHE_ALIGN * CACHE_ALIGN;
    h.file_bytes = h.data_off + h.count * sample;
    int e = posix_fallocate(c->fd, 0, (off_t)h.file_bytes);
    if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(c->fd, (off_t)h.file_bytes) ? errno : 0;
    if (e)
        return err_set(err, "cache: cannot make room for %" PRId64 " bytes in %s: %s; free space "
                       "there, or remove the cache key", h.file_bytes, c->tmp, strerror(e));
    if (file_pwrite_full(c->fd, &h, sizeof h, 0))
        return err_set(err, "cache: cannot write %s: %s", c->tmp, strerror(errno));
    c->h = h;
    c->building = 1;
    return 0;
}

// Every sample is in: status bytes, then the header marked complete, then the rename.
// Called once, by the thread whose sample completed the cache.
static int cache_finish(Cache *c, Error *err) {
    if (file_pwrite_full(c->fd, c->state, (size_t)c->h.count, c->h.status_off) || fdatasync(c->fd))
        goto fail;
    c->h.complete = 1;
    if (file_pwrite_full(c->fd, &c->h, sizeof c->h, 0) || fsync(c->fd)) goto fail;
    if (rename(c->tmp, c->path) != 0) goto fail;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", c->path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        int dfd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);  // the rename itself; a failure here loses nothing but the cache
            close(dfd);
        }
    }
    // c->tmp stays (other threads may name it in a message) until cache_free.
    __atomic_store_n(&c->building, 0, __ATOMIC_RELEASE);
    return 0;
fail:
    return err_set(err, "cache: cannot finish %s: %s; free space there, or remove the cache key",
                   c->tmp, strerror(errno));
}

// Opens or starts the cache of ds in dir/name; note says what happened, for ds->info.
static int cache_open(Dataset *ds, const char *dir, const char *name, char *note, size_t nsize,
                      Error *err) {
    FolderImpl *fi = ds->impl;
    if (file_mkdirs(dir, err)) return err_wrap(err, "cache (the cache key of [data])");
    Cache *c = xcalloc(1, sizeof *c, err);
    if (!c) return -1;
    c->fd = -1;
    size_t pl = strlen(dir) + strlen(name) + 2;
    if (!(c->path = xcalloc(pl, 1, err)) || !(c->state = xcalloc((size_t)ds->count, 1, err))) {
        cache_free(c);
        return -1;
    }
    snprintf(c->path, pl, "%s/%s", dir, name);
    char why[PATH_MAX + 200] = "none yet";
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        int ok = cache_check(ds, fd, &c->h, why, sizeof why, err);
        if (ok < 0) {
            close(fd);
            cache_free(c);
            return -1;
        }
        if (ok) {
            int64_t got = file_pread_full(fd, c->state, (size_t)ds->count, c->h.status_off);
            int64_t bad = 0;
            for (int64_t i = 0; got == ds->count && i < ds->count; i++) {
                if (c->state[i] == ST_BAD) bad++;
                else if (c->state[i] != ST_GOOD) got = -1;
            }
            if (got == ds->count) {
                c->fd = fd;
                c->done = ds->count;
                fi->cache = c;
                snprintf(note, nsize, "cache %s: up to date, read from it (%" PRId64 " samples, "
                         "%" PRId64 " bad)", c->path, ds->count, bad);
                return 0;
            }
            snprintf(why, sizeof why, "its status bytes are damaged");
            memset(c->state, 0, (size_t)ds->count);
        }
        close(fd);
    } else if (errno != ENOENT) {
        snprintf(why, sizeof why, "cannot open it (%s)", strerror(errno));
    }
    if (cache_create(ds, c, err)) {
        cache_free(c);
        return -1;
    }
    fi->cache = c;
    snprintf(note, nsize, "cache %s: being written as the samples are read (%s)", c->path, why);
    return 0;
}

// ---- reading a sample -------------------------------------------------------------------

static int folder_label(const Dataset *ds, int64_t i, int32_t *label, Error *err) {
    if (i < 0 || i >= ds->count)
        return err_set(err, "%s: sample %" PRId64 " is out of range (the set has %" PRId64 ")",
                       ds->source, i, ds->count);
    *label = class_of(ds, i);
    return 0;
}

static int folder_read(const Dataset *ds, int64_t i, uint8_t *pixels, int32_t *label, Error *err) {
    if (folder_label(ds, i, label, err)) return -1;
    const FolderImpl *fi = ds->impl;
    Cache *c = fi->cache;
    const int64_t sample = shape_numel(ds->shape);
    if (c && __atomic_load_n(&c->state[i], __ATOMIC_ACQUIRE) == ST_GOOD) {
        int64_t off = c->h.data_off + i * sample;
        errno = 0;
        if (file_pread_full(c->fd, pixels, (size_t)sample, off) != sample)
            return err_set(err, "cache %s: cannot read sample %" PRId64 " at byte %" PRId64
                           ": %s; remove the file to rebuild it", c->path, i, off,
                           errno ? strerror(errno) : "end of file");
        return 0;
    }
    char path[PATH_MAX];
    if (entry_path(ds, i, path, err)) return DATASET_BAD;
    int rc = image_load(path, &fi->fit, pixels, err);
    if (rc < 0 || !c || !__atomic_load_n(&c->building, __ATOMIC_ACQUIRE)) return rc;
    // Into the cache. Two threads may decode the same sample (a sample borrowed by two
    // batches); both write the same bytes, and one of them sets its status.
    if (rc == 0 && file_pwrite_full(c->fd, pixels, (size_t)sample, c->h.data_off + i * sample))
        return err_set(err, "cache %s: cannot write sample %" PRId64 ": %s; free space there, "
                       "or remove the cache key", c->tmp, i, strerror(errno));
    uint8_t expect = ST_MISSING;
    if (__atomic_compare_exchange_n(&c->state[i], &expect, rc == 0 ? ST_GOOD : ST_BAD, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        __atomic_add_fetch(&c->done, 1, __ATOMIC_ACQ_REL) == ds->count) {
        Error ferr;
        if (cache_finish(c, &ferr)) {
            *err = ferr;
            return -1;
        }
    }
    return rc;
}

// A random crop of the file: decoded anew every time, never cached.
static int folder_read_crop(const Dataset *ds, int64_t i, const ResizedCrop *crop, uint64_t key,
                            uint8_t *pixels, int32_t *label, Error *err) {
    if (folder_label(ds, i, label, err)) return -1;
    const FolderImpl *fi = ds->impl;
    char path[PATH_MAX];
    if (entry_path(ds, i, path, err)) return DATASET_BAD;
    return image_load_crop(path, &fi->fit, crop, key, pixels, err);
}

static void folder_close(Dataset *ds) {
    FolderImpl *fi = ds->impl;
    if (fi) {
        cache_free(fi->cache);
        free(fi->root);
        free(fi->first);
        free(fi->name);
        free(fi->pool);
        free(fi);
    }
    dataset_names_free(ds->class_names, ds->classes);
    free(ds->source);
    free(ds->info);
    free(ds);
}

static const DatasetOps folder_ops = {.read = folder_read, .read_crop = folder_read_crop,
                                      .label = folder_label, .close = folder_close};

int folder_dataset_open(Dataset **out, const char *dir, const FolderOptions *opt, Error *err) {
    *out = NULL;
    if (image_fit_check(&opt->fit, err)) return err_wrap(err, "%s", dir);
    struct stat st;
    if (stat(dir, &st) != 0)
        return err_set(err, "%s: cannot open: %s; check the path (the [data] section of the cfg)",
                       dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return err_set(err, "%s: not a folder; an image folder holds one subfolder per class",
                       dir);
    Dataset *ds = xcalloc(1, sizeof *ds, err);
    FolderImpl *fi = ds ? xcalloc(1, sizeof *fi, err) : NULL;
    Scan *sc = fi ? xcalloc(1, sizeof *sc, err) : NULL;
    if (!sc) {
        free(ds), free(fi);
        return -1;
    }
    ds->ops = &folder_ops;
    ds->impl = fi;
    fi->fit = opt->fit;
    ds->shape = image_fit_shape(&opt->fit);
    // The root without trailing slashes, so messages read ROOT/class/file.
    size_t rl = strlen(dir);
    while (rl > 1 && dir[rl - 1] == '/') rl--;
    if (!(ds->source = xstrdup(dir, err)) || !(fi->root = xstrdup(dir, err))) goto fail;
    fi->root[rl] = 0;
    if (scan_classes(fi->root, &ds->class_names, &ds->classes, err)) goto fail;
    if (!(fi->first = xcalloc((size_t)ds->classes + 1, sizeof *fi->first, err))) goto fail;
    sc->skip_bad = opt->skip_bad;
    char path[PATH_MAX];
    for (int c = 0; c < ds->classes; c++) {
        int n = snprintf(path, sizeof path, "%s/%s", fi->root, ds->class_names[c]);
        if (n < 0 || n >= (int)sizeof path) {
            err_set(err, "%s/%s: path too long", fi->root, ds->class_names[c]);
            goto fail;
        }
        fi->first[c] = sc->n;
        if (scan_dir(sc, path, (size_t)n, (size_t)n + 1, 0, err)) goto fail;
        if (sc->n == fi->first[c]) {
            err_set(err, "%s: the class folder '%s' has no images (" IMAGE_EXTS "); add its "
                    "images or remove the folder (classes are the subfolders, in sorted order)",
                    path, ds->class_names[c]);
            goto fail;
        }
        qsort_r(sc->names + fi->first[c], (size_t)(sc->n - fi->first[c]), sizeof *sc->names,
                cmp_pool, sc->pool);
    }
    fi->first[ds->classes] = sc->n;
    ds->count = sc->n;
    // Keep exactly what the index needs.
    fi->name = realloc(sc->names, (size_t)sc->n * sizeof *fi->name);
    if (!fi->name) fi->name = sc->names;
    fi->pool = realloc(sc->pool, sc->pool_len);
    if (!fi->pool) fi->pool = sc->pool;
    sc->names = NULL, sc->pool = NULL;

    char info[2 * PATH_MAX + 400], note[PATH_MAX + 400] = "";
    int len = snprintf(info, sizeof info, "%" PRId64 " images in %d classes", ds->count,
                       ds->classes);
    if (sc->left_out)
        len += snprintf(info + len, sizeof info - (size_t)len, "; %" PRId64 " files that are "
                        "not images left out (skip_bad), the first %s", sc->left_out,
                        sc->first_left_out);
    if (opt->cache_dir && opt->cache_dir[0] && opt->crop) {
        snprintf(info + len, sizeof info - (size_t)len, "; not cached: crop_scale decodes a new "
                 "crop of each image every epoch");
    } else if (opt->cache_dir && opt->cache_dir[0]) {
        if (cache_open(ds, opt->cache_dir, opt->cache_name ? opt->cache_name : "data.cache", note,
                       sizeof note, err))
            goto fail;
        snprintf(info + len, sizeof info - (size_t)len, "; %s", note);
    }
    // What a read decodes at most, from every image's header (not needed once the cache
    // holds every sample: reads come from it).
    if (!fi->cache || fi->cache->tmp) {
        for (int64_t i = 0; i < ds->count; i++) {
            char path[PATH_MAX];
            if (entry_path(ds, i, path, err)) goto fail;
            const size_t b = image_load_bytes(path, &fi->fit, opt->crop);
            if (b > ds->read_bytes) ds->read_bytes = b;
        }
    }
    if (!(ds->info = xstrdup(info, err))) goto fail;
    free(sc);
    *out = ds;
    return 0;
fail:
    free(sc->names);
    free(sc->pool);
    free(sc);
    folder_close(ds);
    return -1;
}
