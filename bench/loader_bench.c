// loader_bench.c: the data pipeline alone, with a simulated trainer.
//
//   loader_bench CFG [key=value ...] [--compute-ms X] [--compute-threads T] [--epochs E]
//                [--max-batches B] [--stb]
//
// Opens the [data] section of CFG (key=value overrides go to [data], batch= and seed= to
// [train]) exactly as the trainer does (data_cfg_read, data_open), then runs epochs of the
// training loader. After each batch it "computes" for X ms: T threads spin, as the
// trainer's OpenMP/OpenBLAS threads occupy the cores (X = 0: the loader's own speed).
// Per epoch it prints images/s, the time loader_next waited (LoaderStats) and its share
// of the epoch, the skipped samples and the peak RSS so far; at the end the best epoch
// after the first (on a shared machine the least disturbed one).
//
// --stb measures the path before libjpeg-turbo instead (issue 21's reference): every file
// of the folder decoded at full size by stb_image, resized by the same filter and
// normalised, on `workers` threads; images/s over the whole folder, per epoch. (The loader
// hands out bytes since issue 30: the network's first layer normalises them, a table
// lookup per value that this path still does here, about 1% of its time.)
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <dirent.h>
#include <limits.h>
#include <stb/stb_image.h>

#include "../data/data_cfg.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// CPU seconds of the whole process (every thread), user + system.
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

// The simulated compute: T threads spin until a deadline, released together per batch.
typedef struct Spin {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    double until;
    int64_t round, finished;
    int quit;
} Spin;

static Spin g_spin = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                      PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
static volatile double g_sink;

// Floating-point work until the clock reaches `until` (the simulated compute).
static void spin_until(double until) {
    double x = 1;
    while (now() < until)
        for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
    g_sink = x;
}

static void *spinner(void *arg) {
    int64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g_spin.mu);
        while (!g_spin.quit && g_spin.round == seen) pthread_cond_wait(&g_spin.go, &g_spin.mu);
        if (g_spin.quit) {
            pthread_mutex_unlock(&g_spin.mu);
            return NULL;
        }
        seen = g_spin.round;
        double until = g_spin.until;
        pthread_mutex_unlock(&g_spin.mu);
        spin_until(until);
        pthread_mutex_lock(&g_spin.mu);
        g_spin.finished++;
        pthread_cond_broadcast(&g_spin.done);
        pthread_mutex_unlock(&g_spin.mu);
    }
}

// Busy for ms on nthreads threads (the caller is one of them).
static void compute(double ms, int nthreads) {
    if (ms <= 0) return;
    const double until = now() + ms / 1000.0;
    pthread_mutex_lock(&g_spin.mu);
    g_spin.until = until;
    g_spin.round++;
    g_spin.finished = 0;
    pthread_cond_broadcast(&g_spin.go);
    pthread_mutex_unlock(&g_spin.mu);
    spin_until(until);
    pthread_mutex_lock(&g_spin.mu);
    while (g_spin.finished < nthreads - 1) pthread_cond_wait(&g_spin.done, &g_spin.mu);
    pthread_mutex_unlock(&g_spin.mu);
}

// ---- --stb: stb_image at full size, then the same resize --------------------------------

typedef struct StbJob {
    char **files;
    int nfiles, thread, threads, W, H, C;
    float mean[3], std[3];
    int failed;
} StbJob;

static void list_files(const char *dir, char ***files, int *n, int *cap) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR) {
            list_files(p, files, n, cap);
        } else if (image_name_has_ext(e->d_name)) {
            if (*n == *cap) *cap = *cap ? 2 * *cap : 1024, *files = realloc(*files, (size_t)*cap * sizeof **files);
            (*files)[(*n)++] = strdup(p);
        }
    }
    closedir(d);
}

static void *stb_work(void *arg) {
    StbJob *j = arg;
    uint8_t *small = malloc((size_t)j->W * j->H * j->C);
    float *x = malloc((size_t)j->W * j->H * j->C * sizeof *x);
    for (int i = j->thread; i < j->nfiles && small && x; i += j->threads) {
        int w, h, n;
        uint8_t *px = stbi_load(j->files[i], &w, &h, &n, j->C);
        if (!px || image_resize(px, w, h, (size_t)w * j->C, j->C, small, j->W, j->H)) {
            j->failed = 1;
            stbi_image_free(px);
            break;
        }
        stbi_image_free(px);
        for (int k = 0; k < j->W * j->H * j->C; k++)
            x[k] = (small[k] / 255.0f - j->mean[k % j->C]) / j->std[k % j->C];
    }
    free(small), free(x);
    return NULL;
}

static int stb_bench(const DataConfig *dc, int epochs) {
    char **files = NULL;
    int n = 0, cap = 0;
    list_files(dc->train, &files, &n, &cap);
    const int threads = dc->workers > 0 ? dc->workers : 1;
    double best = 0;
    for (int e = 0; e < epochs; e++) {
        StbJob jobs[64];
        pthread_t th[64];
        const double t0 = now();
        for (int t = 0; t < threads && t < 64; t++) {
            jobs[t] = (StbJob){.files = files, .nfiles = n, .thread = t, .threads = threads,
                               .W = dc->width, .H = dc->height, .C = dc->channels};
            for (int c = 0; c < 3; c++)
                jobs[t].mean[c] = dc->mean[dc->nmean == 1 ? 0 : c], jobs[t].std[c] = dc->std[dc->nstd == 1 ? 0 : c];
            pthread_create(&th[t], NULL, stb_work, &jobs[t]);
        }
        int failed = 0;
        for (int t = 0; t < threads && t < 64; t++) pthread_join(th[t], NULL), failed |= jobs[t].failed;
        const double secs = now() - t0;
        if (failed) {
            fprintf(stderr, "loader_bench: stb_image could not decode a file of %s\n", dc->train);
            return 1;
        }
        printf("stb epoch %d: %d images in %.2f s = %.0f img/s; peak RSS %.1f MB\n", e + 1, n, secs,
               n / secs, peak_rss_mb());
        if (e > 0 && n / secs > best) best = n / secs;
    }
    if (epochs > 1) printf("best epoch after the first: %.0f img/s (stb_image path)\n", best);
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: loader_bench CFG [key=value ...] [--compute-ms X] "
                        "[--compute-threads T] [--epochs E] [--max-batches B]\n");
        return 2;
    }
    double compute_ms = 0;
    int compute_threads = 2, epochs = 2, stb = 0;
    int64_t max_batches = INT64_MAX;
    Error err = {{0}};
    Cfg cfg = {0};
    if (cfg_load(&cfg, argv[1], &err)) goto fail;
    CfgSection *d = cfg_section(&cfg, "data"), *t = cfg_section(&cfg, "train");
    if (!d || !t) {
        fprintf(stderr, "loader_bench: %s needs [train] and [data]\n", argv[1]);
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--compute-ms") && i + 1 < argc) {
            compute_ms = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--compute-threads") && i + 1 < argc) {
            compute_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) {
            epochs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--stb")) {
            stb = 1;
        } else if (!strcmp(argv[i], "--max-batches") && i + 1 < argc) {
            max_batches = atoll(argv[++i]);
        } else {
            char key[64];
            const char *eq = strchr(argv[i], '=');
            if (!eq || eq - argv[i] >= (int)sizeof key) {
                fprintf(stderr, "loader_bench: cannot read '%s'\n", argv[i]);
                return 2;
            }
            snprintf(key, sizeof key, "%.*s", (int)(eq - argv[i]), argv[i]);
            int train_key = !strcmp(key, "batch") || !strcmp(key, "seed");
            if (cfg_set(train_key ? t : d, key, eq + 1, &err)) goto fail;
            d = cfg_section(&cfg, "data"), t = cfg_section(&cfg, "train");
        }
    }
    int64_t batch, seed;
    DataConfig dc;
    if (cfg_int(&cfg, t, "batch", "64", 1, 1 << 20, &batch, &err) ||
        cfg_int(&cfg, t, "seed", "1", 0, INT64_MAX, &seed, &err) ||
        data_cfg_read(&dc, &cfg, d, DATA_FILES_ALL, &err))
        goto fail;
    if (stb) return stb_bench(&dc, epochs);
    pthread_t spin[64];
    if (compute_threads < 1 || compute_threads > 64) compute_threads = 1;
    for (int i = 0; i < compute_threads - 1; i++) pthread_create(&spin[i], NULL, spinner, NULL);

    const double t_open = now();
    Data data;
    if (data_open(&data, &dc, (int)batch, (uint64_t)seed, &err)) goto fail;
    printf("opened %s in %.2f s: %s; workers %d, prefetch %d, loader %.1f MB; peak RSS %.1f MB\n",
           dc.train, now() - t_open, data.train->info ? data.train->info : "",
           dc.workers, dc.prefetch, data_loader_bytes(&data) / 1e6, peak_rss_mb());
    double best = 0, best_cpu = 0;
    for (int e = 0; e < epochs; e++) {
        if (loader_start_epoch(data.train_loader, e, 0, &err)) goto fail;
        const double t0 = now(), c0 = cpu_seconds();
        int64_t images = 0, batches = 0;
        const Batch *b;
        double sum = 0;
        for (;;) {
            if (batches >= max_batches) break;
            if (loader_next(data.train_loader, &b, &err)) goto fail;
            if (!b) break;
            sum += b->lut[b->px[0]];  // touch the batch
            images += b->n;
            batches++;
            compute(compute_ms, compute_threads);
        }
        const double secs = now() - t0, cpu = cpu_seconds() - c0;
        LoaderStats st;
        loader_stats(data.train_loader, &st);
        printf("epoch %d: %" PRId64 " images in %.2f s = %.0f img/s (CPU %.1f us an image); "
               "waited %.2f s (%.1f%% of the epoch); skipped %" PRId64 "; peak RSS %.1f MB\n",
               e + 1, images, secs, images / secs,
               1e6 * (cpu - (compute_ms > 0 ? compute_threads * batches * compute_ms / 1e3 : 0)) /
                   images,
               st.wait_seconds, 100.0 * st.wait_seconds / secs, st.skipped, peak_rss_mb());
        fflush(stdout);
        (void)sum;
        if (e > 0 && images / secs > best) best = images / secs, best_cpu = cpu / images;
    }
    if (epochs > 1)
        printf("best epoch after the first: %.0f img/s (CPU %.2f us an image)\n", best,
               1e6 * best_cpu);
    data_close(&data);
    pthread_mutex_lock(&g_spin.mu);
    g_spin.quit = 1;
    pthread_cond_broadcast(&g_spin.go);
    pthread_mutex_unlock(&g_spin.mu);
    for (int i = 0; i < compute_threads - 1; i++) pthread_join(spin[i], NULL);
    cfg_free(&cfg);
    return 0;
fail:
    fprintf(stderr, "loader_bench: %s\n", err.msg);
    return 1;
}
