// seeds.c: writes the seed corpus of every fuzz target into OUT/TARGET/ (make fuzz, make
// test): small valid inputs of each kind, so that fuzzing starts from real structure.
//   seeds OUT CFG...     (the cfg files become the cfg target's seeds)
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include <jpeglib.h>  // after stdio.h: it uses FILE

#include <stb/stb_image_write.h>

#include "fuzz.h"

#include "../../nn/checkpoint.h"
#include "../../nn/kernels.h"
#include "../../nn/net.h"
#include "../../nn/safetensors.h"

static const char *out;

static const char *seed_path(const char *target, const char *name) {
    static char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", out, target);
    mkdir(p, 0777);
    snprintf(p, sizeof p, "%s/%s/%s", out, target, name);
    return p;
}

static void put(const char *target, const char *name, const void *a, size_t na, const void *b,
                size_t nb) {
    FILE *f = fopen(seed_path(target, name), "wb");
    if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f)) {
        fprintf(stderr, "seeds: cannot write %s/%s/%s\n", out, target, name);
        exit(1);
    }
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    if (!b || fread(b, 1, *n, f) != *n) exit(1);
    fclose(f);
    return b;
}

static void cfg_seeds(int n, char **cfgs) {
    for (int i = 0; i < n; i++) {
        size_t len;
        uint8_t *text = slurp(cfgs[i], &len);
        if (!text) continue;
        const char *base = strrchr(cfgs[i], '/') ? strrchr(cfgs[i], '/') + 1 : cfgs[i];
        put("cfg", base, text, len, NULL, 0);
        char name[256];
        snprintf(name, sizeof name, "%s.overrides", base);
        static const char more[] = "\n%%\nepochs=3\nconv1.filters=8\nlayer2.0.stride=1\ntest=\nfc.outputs=7\n";
        put("cfg", name, text, len, more, sizeof more - 1);
        free(text);
    }
}

static void safetensors_seeds(void) {
    Net net;
    Error err = {{0}};
    if (fuzz_resnet_create(&net, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    char *names[5] = {"a", "b", "c", "d", "e"};
    const TrainState st = {.epoch = 1, .step = 7, .loss_scale = 1, .best_val_acc = 50};
    const CheckpointInfo info = {.cfg_text = (char *)fuzz_resnet_cfg, .class_names = names, .classes = 5};
    int n;
    char ckpt[PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%s", seed_path("safetensors", "checkpoint"));
    if (checkpoint_save(ckpt, &net, &st, &info, &err) ||
        checkpoint_export(ckpt, seed_path("safetensors", "plain"), &n, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    // Every dtype the reader knows, scalars and an empty tensor.
    static const uint16_t h[4] = {0x3c00, 0x4000, 0xbc00, 0x7c00};
    static const int64_t i64 = 42;
    const Tensor t[] = {
        {.name = "half", .dtype = DT_F16, .ndim = 2, .shape = {2, 2}, .data = (void *)h},
        {.name = "count", .dtype = DT_I64, .ndim = 0, .data = (void *)&i64},
        {.name = "empty", .dtype = DT_F32, .ndim = 2, .shape = {0, 3}, .data = NULL},
    };
    const char *keys[] = {"format"}, *values[] = {"other"};
    if (st_write(seed_path("safetensors", "dtypes"), t, 3, keys, values, 1, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    net_free(&net);
}

static void be32(uint8_t *p, uint32_t v) { p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v; }

static size_t gz(const uint8_t *in, size_t n, uint8_t *outb, size_t cap) {
    z_stream z = {0};
    if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
    z.next_in = (Bytef *)in, z.avail_in = (uInt)n, z.next_out = outb, z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) exit(1);
    deflateEnd(&z);
    return z.total_out;
}

static void idx_seeds(void) {
    enum { COUNT = 6, SIDE = 4 };
    uint8_t im[16 + COUNT * SIDE * SIDE], lb[8 + COUNT];
    be32(im, 0x803), be32(im + 4, COUNT), be32(im + 8, SIDE), be32(im + 12, SIDE);
    be32(lb, 0x801), be32(lb + 4, COUNT);
    for (int i = 0; i < COUNT * SIDE * SIDE; i++) im[16 + i] = (uint8_t)(i * 37);
    for (int i = 0; i < COUNT; i++) lb[8 + i] = (uint8_t)(i % 3);
    uint8_t buf[2 + sizeof im + sizeof lb];
    buf[0] = sizeof im & 0xff, buf[1] = sizeof im >> 8;
    memcpy(buf + 2, im, sizeof im);
    memcpy(buf + 2 + sizeof im, lb, sizeof lb);
    put("idx", "raw", buf, sizeof buf, NULL, 0);
    uint8_t gi[512], gl[128], g[2 + 640];
    const size_t ni = gz(im, sizeof im, gi, sizeof gi), nl = gz(lb, sizeof lb, gl, sizeof gl);
    g[0] = ni & 0xff, g[1] = ni >> 8;
    memcpy(g + 2, gi, ni);
    memcpy(g + 2 + ni, gl, nl);
    put("idx", "gzip", g, 2 + ni + nl, NULL, 0);
}

// A seed of the image target: the control byte (channels, side), then the file.
static void image_from_file(const char *name, const char *file, uint8_t control) {
    size_t n;
    uint8_t *b = slurp(file, &n);
    if (!b) exit(1);
    put("image", name, &control, 1, b, n);
    free(b);
    remove(file);
}

static void write_jpeg(const char *file, const uint8_t *px, int w, int h, int comps,
                       J_COLOR_SPACE space, int progressive, unsigned restart_interval) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(file, "wb");
    if (!f) exit(1);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w, c.image_height = (JDIMENSION)h;
    c.input_components = comps, c.in_color_space = space;
    jpeg_set_defaults(&c);
    if (progressive) jpeg_simple_progression(&c);
    c.restart_interval = restart_interval;
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)(px + (size_t)c.next_scanline * w * comps);
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

static void image_seeds(void) {
    enum { W = 12, H = 9 };
    uint8_t px[W * H * 4];
    for (int i = 0; i < W * H * 4; i++) px[i] = (uint8_t)(i * 29 + (i >> 3) * 7);
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/seed.tmp", out);
    const struct {
        const char *name;
        int comps;
    } pngs[] = {{"gray.png", 1}, {"graya.png", 2}, {"rgb.png", 3}, {"rgba.png", 4}};
    for (int i = 0; i < 4; i++) {
        stbi_write_png(tmp, W, H, pngs[i].comps, px, W * pngs[i].comps);
        image_from_file(pngs[i].name, tmp, (uint8_t)(i & 1 ? 17 : 16));  // 9 x 9, 1 or 3 channels
    }
    stbi_write_bmp(tmp, W, H, 3, px);
    image_from_file("rgb.bmp", tmp, 15);
    stbi_write_tga(tmp, W, H, 4, px);
    image_from_file("rgba.tga", tmp, 15);
    write_jpeg(tmp, px, W, H, 3, JCS_RGB, 0, 0);
    image_from_file("baseline.jpg", tmp, 7);  // 4 x 4: a DCT scale
    write_jpeg(tmp, px, W, H, 3, JCS_RGB, 0, 1);
    image_from_file("restart.jpg", tmp, 1);  // 1 x 1: the DC path, a restart marker each MCU
    write_jpeg(tmp, px, W, H, 3, JCS_RGB, 1, 0);
    image_from_file("progressive.jpg", tmp, 7);
    write_jpeg(tmp, px, W, H, 1, JCS_GRAYSCALE, 0, 0);
    image_from_file("gray.jpg", tmp, 30);
    write_jpeg(tmp, px, W, H, 4, JCS_CMYK, 0, 0);
    image_from_file("cmyk.jpg", tmp, 31);
    uint8_t pgm[32 + W * H];
    const int n = snprintf((char *)pgm, 32, "P5\n# seed\n%d %d\n255\n", W, H);
    memcpy(pgm + n, px, W * H);
    uint8_t control = 20;
    put("image", "gray.pgm", &control, 1, pgm, (size_t)n + W * H);
    // A 1x1 GIF.
    static const uint8_t gif[] = {0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 1, 0, 1, 0, 0x80, 0, 0, 0xff,
                                  0xff, 0xff, 0, 0, 0, 0x2c, 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44,
                                  1, 0, 0x3b};
    put("image", "pixel.gif", &control, 1, gif, sizeof gif);
}

// ---- predict: (checkpoint, image) pairs -------------------------------------------------

// A file's bytes, then removed.
static uint8_t *take_file(const char *file, size_t *n) {
    uint8_t *b = slurp(file, n);
    if (!b) exit(1);
    remove(file);
    return b;
}

// A checkpoint of a small network for `input` and `classes`, trained by nobody (PyTorch's
// initial weights), as ./train writes it.
static uint8_t *predict_checkpoint(const char *cfg_text, Shape input, int classes, size_t *n) {
    Cfg cfg;
    Net net;
    Error err = {{0}};
    const NetOptions opt = {.batch = 2};
    if (cfg_parse(&cfg, cfg_text, "seed", &err) ||
        net_create(&net, &cfg, input, classes, &opt, cpu_kernels(), &err) ||
        net_init_params(&net, 5, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    cfg_free(&cfg);
    char *names[4] = {"cat", "dog", "bird", "fish"};
    const TrainState st = {.epoch = 1, .step = 10, .loss_scale = 1, .best_val_acc = 50};
    const CheckpointInfo info = {.cfg_text = (char *)cfg_text, .class_names = names, .classes = classes};
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/seed.safetensors", out);
    if (checkpoint_save(tmp, &net, &st, &info, &err)) {
        fprintf(stderr, "seeds: %s\n", err.msg);
        exit(1);
    }
    net_free(&net);
    return take_file(tmp, n);
}

// The forged checkpoint of issue 29: metadata that says `channels` input channels, and a
// conv1.weight to match, from a valid checkpoint (the rest as it was).
static uint8_t *forge_channels(const uint8_t *ckpt, size_t n, int channels, size_t *out_n) {
    StFile f;
    Error err = {{0}};
    if (st_open_buffer(&f, ckpt, n, "seed", &err)) exit(1);
    Tensor t[64];
    const char *keys[32], *values[32];
    char input[32];
    float w[4 * 4 * 9] = {0};
    if (f.count > 64 || f.nmeta > 32) exit(1);
    for (int i = 0; i < f.count; i++) {
        if (st_as_tensor(&f, &f.entries[i], &t[i], &err)) exit(1);
        if (!strcmp(t[i].name, "conv1.weight")) {
            t[i].shape[1] = channels;
            for (int j = 0; j < 4 * channels * 9; j++) w[j] = (float)(j % 7) * 0.1f - 0.3f;
            t[i].data = w;
        }
    }
    for (int i = 0; i < f.nmeta; i++) {
        keys[i] = f.meta[i].key, values[i] = f.meta[i].value;
        if (!strcmp(keys[i], "input")) {
            snprintf(input, sizeof input, "%d%s", channels, strchr(values[i], ','));
            values[i] = input;
        }
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/seed.safetensors", out);
    if (st_write(tmp, t, f.count, keys, values, f.nmeta, &err)) exit(1);
    st_close(&f);
    return take_file(tmp, out_n);
}

static void predict_seeds(void) {
    static const char gray_cfg[] =
        "[train]\nbatch = 2\n[data]\ntrain = photos\nmean = 0.5\nstd = 0.25\n"
        "[conv]\nname = conv1\nfilters = 4\nsize = 3\nactivation = relu\n[maxpool]\n[flatten]\n"
        "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n";
    static const char rgb_cfg[] =
        "[train]\nbatch = 2\n[data]\ntrain = photos\nwidth = 8\nheight = 8\nchannels = 3\n"
        "mean = 0.5, 0.4, 0.3\nstd = 0.2\n"
        "[conv]\nname = conv1\nfilters = 4\nsize = 3\npad = 1\nbias = 0\n"
        "[batchnorm]\nname = bn1\nactivation = relu\n[global_avgpool]\n[flatten]\n"
        "[linear]\nname = fc\noutputs = classes\n[log_softmax]\n";
    struct {
        const char *name;
        uint8_t *b;
        size_t n;
    } ck[4] = {{"gray", NULL, 0}, {"rgb", NULL, 0}, {"forged2", NULL, 0}, {"forged4", NULL, 0}};
    ck[0].b = predict_checkpoint(gray_cfg, (Shape){1, 8, 8}, 3, &ck[0].n);
    ck[1].b = predict_checkpoint(rgb_cfg, (Shape){3, 8, 8}, 4, &ck[1].n);
    ck[2].b = forge_channels(ck[0].b, ck[0].n, 2, &ck[2].n);
    ck[3].b = forge_channels(ck[1].b, ck[1].n, 4, &ck[3].n);

    // Images for an 8 x 8 input: 64 x 64 JPEGs go through the DC path (1/8 scale), 24 x 24
    // ones through libjpeg-turbo at 3/8; PNG and PNM through the other decoders.
    enum { S = 64 };
    static uint8_t px[S * S * 4];
    for (int i = 0; i < S * S * 4; i++) px[i] = (uint8_t)(i * 29 + (i >> 5) * 7);
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/seed.tmp", out);
    struct {
        const char *name;
        uint8_t *b;
        size_t n;
    } im[8];
    int nim = 0;
#define IMAGE(label) (im[nim].name = label, im[nim].b = take_file(tmp, &im[nim].n), nim++)
    write_jpeg(tmp, px, S, S, 3, JCS_RGB, 0, 0);
    IMAGE("dc.jpg");
    write_jpeg(tmp, px, S, S, 1, JCS_GRAYSCALE, 0, 0);
    IMAGE("dc-gray.jpg");
    write_jpeg(tmp, px, 24, 24, 3, JCS_RGB, 0, 0);
    IMAGE("scaled.jpg");
    write_jpeg(tmp, px, S, S, 3, JCS_RGB, 1, 0);
    IMAGE("progressive.jpg");
    write_jpeg(tmp, px, 24, 24, 4, JCS_CMYK, 0, 0);
    IMAGE("cmyk.jpg");
    stbi_write_png(tmp, 12, 9, 3, px, 12 * 3);
    IMAGE("rgb.png");
    stbi_write_png(tmp, 12, 9, 2, px, 12 * 2);
    IMAGE("graya.png");
#undef IMAGE
    uint8_t pnm[32 + 10 * 10 * 3];
    const int h = snprintf((char *)pnm, 32, "P6\n10 10\n255\n");
    memcpy(pnm + h, px, 10 * 10 * 3);
    im[nim].name = "rgb.ppm", im[nim].n = (size_t)h + 300;
    im[nim].b = malloc(im[nim].n);
    if (!im[nim].b) exit(1);
    memcpy(im[nim].b, pnm, im[nim].n);
    nim++;

    for (int c = 0; c < 4; c++)
        for (int i = 0; i < nim; i++) {
            uint8_t head[5] = {(uint8_t)(i & 1 ? 5 : 2), (uint8_t)ck[c].n, (uint8_t)(ck[c].n >> 8),
                               (uint8_t)(ck[c].n >> 16), (uint8_t)(ck[c].n >> 24)};
            char name[64];
            snprintf(name, sizeof name, "%s-%s", ck[c].name, im[i].name);
            uint8_t *pair = malloc(sizeof head + ck[c].n);
            if (!pair) exit(1);
            memcpy(pair, head, sizeof head);
            memcpy(pair + sizeof head, ck[c].b, ck[c].n);
            put("predict", name, pair, sizeof head + ck[c].n, im[i].b, im[i].n);
            free(pair);
        }
    for (int c = 0; c < 4; c++) free(ck[c].b);
    for (int i = 0; i < nim; i++) free(im[i].b);
}

static void rename_seeds(void) {
    static const char *const seeds[][2] = {
        {"substring", "0\nconv1=stem\n%%\nconv1.weight\noptimizer.conv1.weight.square_avg\nlayer1.0.conv1.weight\n"},
        {"prefix", "1\nlayer1=stage1\nfc=head\n%%\nlayer1.0.bn1.running_mean\nfc.bias\n"},
        {"whole", "2\nlayer1.0=layer1.1\n%%\nlayer1.0.conv2.weight\noptimizer.layer1.0.bn2.bias.acc_delta\n"},
        {"collide", "0\nbn1=conv1\n%%\nbn1.weight\n"},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
        put("rename", seeds[i][0], seeds[i][1], strlen(seeds[i][1]), NULL, 0);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: seeds OUT [CFG ...]\n");
        return 2;
    }
    out = argv[1];
    mkdir(out, 0777);
    cfg_seeds(argc - 2, argv + 2);
    safetensors_seeds();
    idx_seeds();
    image_seeds();
    rename_seeds();
    predict_seeds();
    printf("seeds: written to %s\n", out);
    return 0;
}
