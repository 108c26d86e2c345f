// evaluate.c: evaluation of a network over a data set (evaluate.h).
#include "evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "model.h"

void put_batch(Net *net, const Batch *b, int first, int n) {
    net_put_input(net, b->px + (size_t)first * (size_t)shape_numel(net->input), b->lut, n);
    net->k->upload(net->labels, b->y + first, (size_t)n * sizeof(int32_t));
}

void read_metrics(Net *net, Totals *t) {
    float m[2];
    net->k->download(m, net->metrics, sizeof m);
    t->loss = m[0], t->correct = m[1];
}

int read_metrics_all(Net *net, Dist *dist, Totals *t, Error *err) {
    read_metrics(net, t);
    double v[2] = {t->loss, t->correct};
    if (dist && dist_sum_doubles(dist, v, 2, err)) return -1;
    t->loss = v[0], t->correct = v[1];
    return 0;
}

int eval_stats_init(EvalStats *e, int classes, int batch, Error *err) {
    memset(e, 0, sizeof *e);
    e->classes = classes;
    e->confusion = xcalloc((size_t)classes * (size_t)classes, sizeof *e->confusion, err);
    e->logp = e->confusion ? xcalloc((size_t)batch * (size_t)classes, sizeof *e->logp, err) : NULL;
    return e->logp ? 0 : -1;
}

void eval_stats_free(EvalStats *e) {
    free(e->confusion);
    free(e->logp);
    memset(e, 0, sizeof *e);
}

// Adds n samples of log-probabilities e->logp with their labels.
static void eval_stats_add(EvalStats *e, const int32_t *labels, int n) {
    const int C = e->classes;
    for (int i = 0; i < n; i++) {
        const float *y = e->logp + (size_t)i * C;
        int best = 0, above = 0;
        for (int c = 1; c < C; c++)
            if (y[c] > y[best]) best = c;
        for (int c = 0; c < C; c++) above += y[c] > y[labels[i]];
        e->confusion[(size_t)labels[i] * C + best]++;
        e->top5 += above < 5;
    }
}

static int64_t eval_stats_total(const EvalStats *e, int c) {
    int64_t n = 0;
    for (int j = 0; j < e->classes; j++) n += e->confusion[(size_t)c * e->classes + j];
    return n;
}

void write_per_class(FILE *f, const EvalStats *e) {
    if (!e) {
        fputs("null", f);
        return;
    }
    fputc('[', f);
    for (int c = 0; c < e->classes; c++) {
        const int64_t n = eval_stats_total(e, c);
        if (n) fprintf(f, "%s%.4f", c ? ", " : "", 100.0 * (double)e->confusion[(size_t)c * e->classes + c] / (double)n);
        else fprintf(f, "%snull", c ? ", " : "");
    }
    fputc(']', f);
}

int evaluate(Net *net, Loader *loader, Dist *dist, Totals *t, EvalStats *stats, Error *err) {
    net->k->zero(net->metrics, 2 * sizeof(float));
    if (stats) {
        memset(stats->confusion, 0, (size_t)stats->classes * stats->classes * sizeof *stats->confusion);
        stats->top5 = 0;
    }
    if (loader_start_epoch(loader, 0, 0, err)) return -1;
    t->seen = 0;
    const Batch *b;
    while (1) {
        if (loader_next(loader, &b, err)) return -1;
        if (!b) break;
        for (int m0 = 0; m0 < b->n; m0 += net->batch) {
            const int n = b->n - m0 < net->batch ? b->n - m0 : net->batch;
            put_batch(net, b, m0, n);
            net_forward(net, n, false, 0, 0, 0);
            net_loss(net, n, n, false);
            if (!stats) continue;
            net->k->download(stats->logp, net_output(net), (size_t)n * stats->classes * sizeof(float));
            eval_stats_add(stats, b->y + m0, n);
        }
        t->seen += b->n;
    }
    // Each process evaluated its part of every batch: the totals of all of them.
    if (read_metrics_all(net, dist, t, err)) return -1;
    double seen = (double)t->seen;
    if (dist && dist_sum_doubles(dist, &seen, 1, err)) return -1;
    t->seen = (int64_t)seen;
    if (stats && dist && dist->size > 1) {
        const size_t n = (size_t)stats->classes * stats->classes + 1;
        double *v = xcalloc(n, sizeof *v, err);
        if (!v) return -1;
        for (size_t i = 0; i + 1 < n; i++) v[i] = (double)stats->confusion[i];
        v[n - 1] = (double)stats->top5;
        const int rc = dist_sum_doubles(dist, v, n, err);
        for (size_t i = 0; i + 1 < n; i++) stats->confusion[i] = (int64_t)v[i];
        stats->top5 = (int64_t)v[n - 1];
        free(v);
        if (rc) return -1;
    }
    return 0;
}

// The evaluation's report: loss, accuracy, top-5 (more than 5 classes), each class's
// accuracy and the confusion matrix (up to 20 classes; all of it with json).
static void print_evaluation(const char *weights, const char *source, const Totals *t,
                             const EvalStats *e, char *const *names, bool json) {
    const int C = e->classes;
    const double acc = 100.0 * t->correct / t->seen, top5 = 100.0 * (double)e->top5 / t->seen;
    if (json) {
        printf("{\"weights\": ");
        json_string(stdout, weights);
        printf(", \"data\": ");
        json_string(stdout, source);
        printf(", \"images\": %lld, \"loss\": %.6f, \"acc\": %.4f, \"top5\": ",
               (long long)t->seen, t->loss / t->seen, acc);
        if (C > 5) printf("%.4f", top5);  // with 5 classes or fewer it is always 100
        else printf("null");
        printf(", \"classes\": [");
        for (int c = 0; c < C; c++) {
            if (c) printf(", ");
            json_string(stdout, names[c]);
        }
        printf("], \"per_class\": ");
        write_per_class(stdout, e);
        printf(", \"confusion\": [");
        for (int c = 0; c < C; c++) {
            printf("%s[", c ? ", " : "");
            for (int j = 0; j < C; j++) printf("%s%lld", j ? ", " : "", (long long)e->confusion[(size_t)c * C + j]);
            printf("]");
        }
        printf("]}\n");
        return;
    }
    printf("%s on %s: loss %.4f  acc %.2f%% (%lld images)", weights, source,
           t->loss / t->seen, acc, (long long)t->seen);
    if (C > 5) printf("  top5 %.2f%%", top5);
    printf("\n%-24s %9s %8s\n", "class", "accuracy", "images");
    for (int c = 0; c < C; c++) {
        const int64_t n = eval_stats_total(e, c);
        char a[16] = "-";
        if (n) snprintf(a, sizeof a, "%.2f%%", 100.0 * (double)e->confusion[(size_t)c * C + c] / (double)n);
        printf("%-24.24s %9s %8lld\n", names[c], a, (long long)n);
    }
    if (C > 20) {
        printf("confusion matrix: %d classes, see --json\n", C);
        return;
    }
    printf("confusion matrix (rows: true class, columns: predicted, in the order above):\n");
    for (int c = 0; c < C; c++) {
        printf("  %-16.16s", names[c]);
        for (int j = 0; j < C; j++) printf(" %6lld", (long long)e->confusion[(size_t)c * C + j]);
        printf("\n");
    }
}

int eval_weights(const char *weights, const char *cfg_path, bool json, int noverrides,
                 char **overrides, Error *err) {
    Model m;
    EvalStats e = {0};
    int rc = -1;
    // A test set named on the command line is what to evaluate: the cfg's val_split and
    // training data are left alone (the class names come from the checkpoint or the set).
    bool named = false;
    for (int i = 0; i < noverrides; i++) {
        const char *o = overrides[i] + (strncmp(overrides[i], "data.", 5) ? 0 : 5);
        named |= !strncmp(o, "test=", 5) && o[5] != '\0';
    }
    if (model_open(&m, weights, cfg_path, noverrides, overrides, named ? DATA_FILES_TEST : DATA_FILES_ALL, err))
        goto done;
    const bool split = m.o.data.val_split > 0;
    if (split || (!m.is_checkpoint && !named) ? data_open(&m.data, &m.o.data, m.o.batch, m.o.seed, err)
                                              : data_open_test(&m.data, &m.o.data, m.o.batch, err))
        goto done;
    if (!m.data.test) {
        err_set(err, "%s: [data] has no test set (test, test_labels or val_split) to evaluate on",
                m.name);
        goto done;
    }
    const int classes = m.is_checkpoint ? m.info.classes : m.data.classes;
    const DataConfig *dc = &m.o.data;
    const char *labels = split ? (dc->train_folder ? dc->train : dc->train_labels)
                               : (dc->test_folder ? dc->test : dc->test_labels);
    if (m.data.test->classes > classes) {
        err_set(err, "%s has labels up to %d but %s knows %d classes", labels,
                m.data.test->classes - 1, weights, classes);
        goto done;
    }
    const Shape in = m.data.test->shape;
    if (m.is_checkpoint && (in.c != m.info.input.c || in.h != m.info.input.h || in.w != m.info.input.w)) {
        err_set(err, "%s holds %dx%dx%d images but %s was trained on %dx%dx%d (channels x height x "
                     "width)", m.data.test->source, in.c, in.h, in.w, weights, m.info.input.c,
                m.info.input.h, m.info.input.w);
        goto done;
    }
    if (model_load(&m, weights, m.data.test->shape, classes, m.o.batch, 0, err) ||
        eval_stats_init(&e, classes, m.net.batch, err))
        goto done;
    Totals t = {0};
    if (evaluate(&m.net, m.data.test_loader, NULL, &t, &e, err)) goto done;
    char *const *names = m.is_checkpoint ? m.info.class_names : m.data.class_names;
    print_evaluation(weights, m.data.test->source, &t, &e, names, json);
    rc = 0;
done:
    eval_stats_free(&e);
    model_close(&m);
    return rc;
}
