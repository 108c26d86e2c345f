// predict.c: ./train --predict (predict.h).
#include "predict.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../data/dataset.h"
#include "json.h"
#include "model.h"

// The files --predict reads: each path named that is not a folder, and in folders every
// file with an image extension at any depth (hidden entries left out), in strcmp order.
typedef struct PathList {
    char **paths;
    int n, cap;
} PathList;

static void paths_free(PathList *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
}

static int paths_add(PathList *l, const char *path, Error *err) {
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 64;
        char **p = realloc(l->paths, (size_t)cap * sizeof *p);
        if (!p) return err_set(err, "out of memory listing the images");
        l->paths = p, l->cap = cap;
    }
    return (l->paths[l->n] = xstrdup(path, err)) ? (l->n++, 0) : -1;
}

static int cmp_strings(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int paths_collect(PathList *l, const char *path, bool named, int depth, Error *err) {
    struct stat st;
    const bool found = stat(path, &st) == 0;
    if (!found || !S_ISDIR(st.st_mode)) {
        // A file named on the command line is read whatever its extension (a missing one
        // is reported when it is read); in a folder only image files are (a dangling link
        // is not).
        const bool image = found && S_ISREG(st.st_mode) && image_name_has_ext(path);
        return named || image ? paths_add(l, path, err) : 0;
    }
    if (depth >= 64)
        return err_set(err, "%s: more than 64 folders deep; is there a symbolic link loop?", path);
    DIR *d = opendir(path);
    if (!d) return err_set(err, "%s: cannot open the folder: %s", path, strerror(errno));
    PathList here = {0};
    int rc = 0;
    const size_t len = strlen(path);
    const char *sep = len && path[len - 1] == '/' ? "" : "/";  // "holiday/" names "holiday/a.jpg"
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s%s%s", path, sep, e->d_name) >= (int)sizeof sub)
            rc = err_set(err, "%s/%s: path too long", path, e->d_name);
        else rc = paths_add(&here, sub, err);
    }
    closedir(d);
    if (!rc) qsort(here.paths, (size_t)here.n, sizeof *here.paths, cmp_strings);
    for (int i = 0; !rc && i < here.n; i++) rc = paths_collect(l, here.paths[i], false, depth + 1, err);
    paths_free(&here);
    return rc;
}

// One image's line: its `top` most likely classes from the log-probabilities logp
// (which it overwrites).
static void print_prediction(const char *file, float *logp, int classes, char *const *names,
                             const PredictOptions *po) {
    if (po->json) {
        printf("{\"file\": ");
        json_string(stdout, file);
        printf(", \"top\": [");
    } else {
        printf("%s:", file);
    }
    for (int k = 0; k < po->top && k < classes; k++) {
        int best = 0;
        for (int c = 1; c < classes; c++)
            if (logp[c] > logp[best]) best = c;
        if (po->json) {
            printf("%s{\"class\": ", k ? ", " : "");
            json_string(stdout, names[best]);
            printf(", \"index\": %d, \"prob\": %.6g}", best, exp(logp[best]));
        } else {
            printf("  %s %.1f%%", names[best], 100.0 * exp(logp[best]));
        }
        logp[best] = -INFINITY;
    }
    printf(po->json ? "]}\n" : "\n");
}

// Whether argument a is a key=value override (KEY: letters, digits, '_' and '.', not a
// digit first) rather than a path: a file or folder of that name is always a path.
static bool is_override(const char *a) {
    const char *eq = strchr(a, '=');
    struct stat st;
    if (!eq || eq == a || (a[0] >= '0' && a[0] <= '9') || stat(a, &st) == 0) return false;
    for (const char *c = a; c < eq; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.'))
            return false;
    return true;
}

int predict(const char *weights, const PredictOptions *po, int nargs, char **args, Error *err) {
    Model m = {0};
    PathList files = {0};
    int failed = -1, nover = 0;
    uint8_t *pixels = NULL;  // (batch, H, W, C) the decoded images, as the loader's bytes
    float *lut = NULL, *logp = NULL;
    int *slot_file = NULL;  // the file of each image of the batch
    char **overrides = xcalloc((size_t)nargs + 1, sizeof *overrides, err);
    if (!overrides) goto done;
    for (int i = 0; i < nargs; i++) {
        if (is_override(args[i])) overrides[nover++] = args[i];
        else if (paths_collect(&files, args[i], true, 0, err)) goto done;
    }
    if (!files.n) {
        err_set(err, "no image files in %s", nargs > nover ? "the paths given" : "the arguments "
                     "(key=value ones are settings: give an image or a folder)");
        goto done;
    }
    if (model_open(&m, weights, po->cfg, nover, overrides, DATA_FILES_NONE, err)) goto done;
    Shape input = m.info.input;
    int classes = m.info.classes;
    char *const *names = m.info.class_names;
    if (!m.is_checkpoint) {
        if (data_open(&m.data, &m.o.data, 1, m.o.seed, err)) {
            err_wrap(err, "%s: the input size and class names of plain weights come from the "
                          "cfg's training data", m.name);
            goto done;
        }
        input = m.data.train->shape;
        classes = m.data.classes;
        names = m.data.class_names;
    }
    const int batch = m.o.batch < files.n ? m.o.batch : files.n;
    if (model_load(&m, weights, input, classes, batch, po->memory, err)) goto done;
    const int64_t numel = shape_numel(input);
    const DataConfig *dc = &m.o.data;
    // The test set's preprocessing, for the network's input (image_load checks the fit).
    const ImageFit fit = data_image_fit(dc, input);
    const Shape made = image_fit_shape(&fit);
    if (made.h != input.h || made.w != input.w) {
        err_set(err, "%s: [data] makes %d x %d samples (center_crop = %d), but the network takes "
                     "%d x %d inputs", m.name, made.w, made.h, fit.center_crop, input.w, input.h);
        goto done;
    }
    float mean[DATASET_MAX_CHANNELS], std[DATASET_MAX_CHANNELS];
    if (data_normalisation(dc, input.c, mean, std, err)) {
        err_wrap(err, "%s", m.name);
        goto done;
    }
    if (!(pixels = xcalloc((size_t)batch * (size_t)numel, 1, err)) ||
        !(lut = xcalloc((size_t)input.c * 256, sizeof *lut, err)) ||
        !(logp = xcalloc((size_t)batch * classes, sizeof *logp, err)) ||
        !(slot_file = xcalloc((size_t)batch, sizeof *slot_file, err)))
        goto done;
    normalise_table(lut, input.c, mean, std);  // the loader's, bit for bit
    failed = 0;
    for (int next = 0; next < files.n;) {
        int n = 0;  // images of this batch that decoded
        for (; n < batch && next < files.n; next++) {
            Error why = {0};
            const int r = image_load(files.paths[next], &fit, pixels + (size_t)n * numel, &why);
            if (r < 0) {
                *err = why;
                failed = -1;
                goto done;
            }
            if (r == DATASET_BAD) {
                if (n) break;  // the batch so far first: the output keeps the files' order
                failed++;
                if (po->json) {
                    printf("{\"file\": ");
                    json_string(stdout, files.paths[next]);
                    printf(", \"error\": ");
                    json_string(stdout, why.msg);
                    printf("}\n");
                } else {
                    fprintf(stderr, "train: %s\n", why.msg);
                }
                continue;
            }
            slot_file[n++] = next;
        }
        if (!n) continue;
        net_put_input(&m.net, pixels, lut, n);
        net_forward(&m.net, n, false, 0, 0, 0);
        m.k->download(logp, net_output(&m.net), (size_t)n * classes * sizeof *logp);
        for (int j = 0; j < n; j++)
            print_prediction(files.paths[slot_file[j]], logp + (size_t)j * classes, classes, names, po);
        fflush(stdout);
    }
    if (failed)
        fprintf(stderr, "train: %d of %d files could not be read as images\n", failed, files.n);
done:
    model_close(&m);
    paths_free(&files);
    free(slot_file);
    free(pixels);
    free(lut);
    free(logp);
    free(overrides);
    return failed;
}
