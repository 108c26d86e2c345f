// dataset.c: what every Dataset implementation shares (dataset.h): closing one, and its
// class names. idx.c, folder.c and split.c each call these and none calls another's.
#include "dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Contract: ops->close releases everything the dataset owns and the Dataset itself.
void dataset_close(Dataset *ds) {
    if (ds) ds->ops->close(ds);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

int dataset_index_hash(const Dataset *ds, uint64_t *hash, Error *err) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int c = 0; c < ds->classes; c++) h = fnv1a(h, ds->class_names[c], strlen(ds->class_names[c]) + 1);
    for (int64_t i = 0; i < ds->count; i++) {
        int32_t label;
        if (ds->ops->label(ds, i, &label, err)) return -1;
        h = fnv1a(h, &label, sizeof label);
    }
    *hash = h;
    return 0;
}

void dataset_names_free(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

char **dataset_names_copy(char *const *names, int n, Error *err) {
    char **out = xcalloc(n > 0 ? (size_t)n : 1, sizeof *out, err);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]) + 1;
        if (!(out[i] = xcalloc(len, 1, err))) {
            dataset_names_free(out, i);
            return NULL;
        }
        memcpy(out[i], names[i], len);
    }
    return out;
}

char **dataset_names_numbers(int n, Error *err) {
    char **out = xcalloc(n > 0 ? (size_t)n : 1, sizeof *out, err);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        if (!(out[i] = xcalloc(12, 1, err))) {
            dataset_names_free(out, i);
            return NULL;
        }
        snprintf(out[i], 12, "%d", i);
    }
    return out;
}
