// metrics.c: SAVE/metrics.jsonl and SAVE/curves.svg (metrics.h).
#include "metrics.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/file.h"

// One epoch of SAVE/metrics.jsonl as curves.svg draws it (NAN where not logged).
typedef struct EpochPoint {
    int epoch;
    double train_loss, train_acc, val_loss, val_acc, lr;
} EpochPoint;

// The number after "key": in a metrics line; NAN for null or a missing key.
static double json_number(const char *line, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": ", key);
    const char *p = strstr(line, pattern);
    if (!p) return NAN;
    char *end;
    const double v = strtod(p + strlen(pattern), &end);
    return end == p + strlen(pattern) ? NAN : v;
}

// The epochs of metrics.jsonl in order, each from its last line (a run resumed from an
// earlier checkpoint logs epochs again), none after the last line's epoch.
static int read_epoch_points(const char *path, EpochPoint **out, int *n, Error *err) {
    *out = NULL, *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return err_set(err, "cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        const double e = json_number(line, "epoch");
        if (!(e >= 1 && e < 1e7)) continue;
        const EpochPoint p = {(int)e, json_number(line, "train_loss"), json_number(line, "train_acc"),
                              json_number(line, "val_loss"), json_number(line, "val_acc"),
                              json_number(line, "lr")};
        int i = 0;
        while (i < *n && (*out)[i].epoch < p.epoch) i++;
        *n = i;  // epochs after this one are from before a resume
        EpochPoint *q = realloc(*out, (size_t)(i + 1) * sizeof *q);
        if (!q) {
            rc = err_set(err, "out of memory reading %s", path);
            break;
        }
        *out = q;
        (*out)[(*n)++] = p;
    }
    free(line);
    fclose(f);
    return rc;
}

// A curve: the field of EpochPoint it draws.
typedef struct Curve {
    const char *id, *label, *color;
    size_t field;
} Curve;

static double curve_value(const EpochPoint *p, const Curve *c) {
    return *(const double *)((const char *)p + c->field);
}

// One panel of the picture: the curves against the epoch, at x0, with the value axis
// from zero (losses, the learning rate) or around the values (accuracies). With `steps`
// (n > 0) the panel draws that curve instead, a value per step, from epoch 0.
static void svg_panel(FILE *f, double x0, const char *title, const EpochPoint *pts, int n,
                      const Curve *curves, int ncurves, bool from_zero, const LrSteps *steps) {
    const double left = x0 + 56, top = 56, w = 250, h = 220;
    const bool by_step = steps && steps->n > 0;
    double lo = INFINITY, hi = -INFINITY;
    for (int c = 0; c < ncurves && !by_step; c++)
        for (int i = 0; i < n; i++) {
            const double v = curve_value(&pts[i], &curves[c]);
            if (isfinite(v)) lo = fmin(lo, v), hi = fmax(hi, v);
        }
    for (int i = 0; by_step && i < steps->n; i++)
        if (isfinite(steps->lr[i])) lo = fmin(lo, steps->lr[i]), hi = fmax(hi, steps->lr[i]);
    if (!isfinite(lo)) lo = 0, hi = 1;
    if (from_zero && lo > 0) lo = 0;
    if (hi - lo < 1e-9 * fmax(1.0, fabs(hi))) lo -= 0.5, hi += 0.5;
    // Ticks at a round step (1, 2 or 5 times a power of ten), the axis from tick to tick.
    double tick = pow(10, floor(log10((hi - lo) / 4)));
    if ((hi - lo) / tick > 20) tick *= 5;
    else if ((hi - lo) / tick > 8) tick *= 2;
    lo = floor(lo / tick + 1e-9) * tick, hi = ceil(hi / tick - 1e-9) * tick;
    const int first = by_step ? 0 : pts[0].epoch, last = pts[n - 1].epoch;
#define X(e) (left + (last == first ? w / 2 : ((e) - first) * w / (last - first)))
#define Y(v) (top + h - ((v) - lo) * h / (hi - lo))
    fprintf(f, "<g font-family=\"sans-serif\" font-size=\"11\">\n");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">%s</text>\n",
            left + w / 2, top - 12, title);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n",
            left, top, w, h);
    for (double v = lo; v <= hi + tick / 2; v += tick) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                left, Y(v), left + w, Y(v), left - 4, Y(v) + 4, v);
    }
    const int step = (last - first) / 8 + 1;
    for (int e = first; e <= last; e += step)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", X(e), top + h + 14, e);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">epoch</text>\n", left + w / 2, top + h + 30);
    if (by_step) {
        fprintf(f, "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                curves[0].id, curves[0].color);
        for (int i = 0; i < steps->n; i++)
            fprintf(f, "%s%.1f,%.1f", i ? " " : "", X(steps->epoch[i]), Y(steps->lr[i]));
        fprintf(f, "\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">&#9679; each step</text>\n", left,
                top + h + 48, curves[0].color);
        ncurves = 0;
    }
    for (int c = 0, legend = 0; c < ncurves; c++) {
        const Curve *cv = &curves[c];
        int finite = 0;
        for (int i = 0; i < n; i++) finite += isfinite(curve_value(&pts[i], cv));
        if (!finite) continue;  // no test set: no validation curves
        fprintf(f, "<polyline id=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", cv->id, cv->color);
        for (int i = 0, k = 0; i < n; i++) {
            const double v = curve_value(&pts[i], cv);
            if (isfinite(v)) fprintf(f, "%s%.1f,%.1f", k++ ? " " : "", X(pts[i].epoch), Y(v));
        }
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n; i++) {
            const double v = curve_value(&pts[i], cv);
            if (isfinite(v))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>epoch %d: %.6g</title></circle>\n",
                        X(pts[i].epoch), Y(v), cv->color, pts[i].epoch, v);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">&#9679; %s</text>\n", left + 100 * legend++,
                top + h + 48, cv->color, cv->label);
    }
    fprintf(f, "</g>\n");
#undef X
#undef Y
}

// What curves.svg draws: the epochs, the title, the learning rate of each step.
typedef struct Picture {
    const EpochPoint *pts;
    int n;
    const char *title;
    const LrSteps *lr;
} Picture;

static int draw_svg(FILE *f, void *arg) {
    const Picture *p = arg;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"350\" viewBox=\"0 0 960 350\">\n"
               "<rect width=\"960\" height=\"350\" fill=\"white\"/>\n"
               "<text x=\"480\" y=\"18\" font-family=\"sans-serif\" font-size=\"13\" text-anchor=\"middle\">");
    for (const char *c = p->title; *c; c++) {  // XML text
        if (*c == '<') fputs("&lt;", f);
        else if (*c == '&') fputs("&amp;", f);
        else if (*c == '>') fputs("&gt;", f);
        else fputc(*c, f);
    }
    fprintf(f, "</text>\n");
    const Curve loss[] = {{"train_loss", "train", "#1f77b4", offsetof(EpochPoint, train_loss)},
                          {"val_loss", "validation", "#d62728", offsetof(EpochPoint, val_loss)}};
    const Curve acc[] = {{"train_acc", "train", "#1f77b4", offsetof(EpochPoint, train_acc)},
                         {"val_acc", "validation", "#d62728", offsetof(EpochPoint, val_acc)}};
    const Curve lr[] = {{"lr", "at the epoch's end", "#2ca02c", offsetof(EpochPoint, lr)}};
    svg_panel(f, 0, "loss", p->pts, p->n, loss, 2, true, NULL);
    svg_panel(f, 320, "accuracy (%)", p->pts, p->n, acc, 2, false, NULL);
    svg_panel(f, 640, "learning rate", p->pts, p->n, lr, 1, true, p->lr);
    fprintf(f, "</svg>\n");
    return 0;
}

// Draws SAVE/curves.svg from SAVE/metrics.jsonl: loss and accuracy per epoch, one point per
// epoch, and the learning rate of each step (lr; NULL: at each epoch's end), a plain SVG
// file any browser shows; replaced atomically, so that a browser never reads half of it.
static int write_curves(const char *save, const char *title, const LrSteps *lr, Error *err) {
    char log[PATH_MAX], svg[PATH_MAX];
    snprintf(log, sizeof log, "%s/metrics.jsonl", save);
    snprintf(svg, sizeof svg, "%s/curves.svg", save);
    EpochPoint *pts;
    int n;
    if (read_epoch_points(log, &pts, &n, err)) return -1;
    Picture p = {pts, n, title, lr};
    const int rc = n ? file_write_atomic(svg, draw_svg, &p, err) : 0;
    free(pts);
    return rc;
}

// The log as it is, and the line to add.
typedef struct LogUpdate {
    const char *old;
    size_t nold;
    const char *line;
} LogUpdate;

static int write_log(FILE *f, void *arg) {
    const LogUpdate *u = arg;
    return (u->nold && fwrite(u->old, 1, u->nold, f) != u->nold) || fputs(u->line, f) < 0 ? -1 : 0;
}

// The whole file at path, malloc'd (NUL-terminated), into *out and *n; a file that does not
// exist is empty.
static int read_whole(const char *path, char **out, size_t *n, Error *err) {
    *out = NULL, *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : err_set(err, "cannot read %s: %s", path, strerror(errno));
    size_t cap = 0;
    char *s = NULL;
    int rc = 0;
    for (;;) {
        if (*n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            char *t = realloc(s, cap);
            if (!t) {
                rc = err_set(err, "out of memory reading %s", path);
                break;
            }
            s = t;
        }
        const size_t r = fread(s + *n, 1, cap - *n - 1, f);
        *n += r;
        if (r == 0) {
            if (ferror(f)) rc = err_set(err, "cannot read %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(s);
        *n = 0;
        return -1;
    }
    if (s) s[*n] = '\0';
    *out = s;
    return 0;
}

int metrics_log_line(const char *save, const char *line, Error *err) {
    char log[PATH_MAX];
    if (snprintf(log, sizeof log, "%s/metrics.jsonl", save) >= (int)sizeof log)
        return err_set(err, "the folder name %.200s... is too long", save);
    LogUpdate u = {.line = line};
    char *old;
    if (read_whole(log, &old, &u.nold, err)) return -1;
    u.old = old;
    // A log cut short (a run killed mid-line before this was atomic) gets its line ended.
    const bool cut = u.nold && old[u.nold - 1] != '\n';
    char *fixed = NULL;
    if (cut && (fixed = malloc(strlen(line) + 2))) {
        sprintf(fixed, "\n%s", line);
        u.line = fixed;
    }
    const int rc = cut && !fixed ? err_set(err, "out of memory writing %s", log)
                                 : file_write_atomic(log, write_log, &u, err);
    free(old);
    free(fixed);
    return rc;
}

int metrics_log_epoch(const char *save, const char *line, const char *title, const LrSteps *lr,
                      Error *err) {
    return metrics_log_line(save, line, err) || write_curves(save, title, lr, err) ? -1 : 0;
}
