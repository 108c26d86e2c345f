// test_cfg.c: the cfg parser and getters against good and broken input. Every error
// test checks that the message names the file, the line and the key.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../nn/cfg.h"

// The example of DESIGN.md, with the awkward parts a user's file may have: comments of
// both kinds, ragged spacing, a repeated section, a tab.
static const char *example =
    "# mnist\n"
    "[train]\n"
    "epochs = 14\n"
    "batch=64\n"
    "accumulate   =   1          # micro-batches per optimizer step\n"
    "lr = 1.0\n"
    "\n"
    "   # an indented comment\n"
    "[data]\n"
    "mean = 0.1307\n"
    "std\t= 0.3081\n"
    "norm = 0.5, 0.25 ,0.125\n"
    "[conv]\n"
    "name = conv1\n"
    "filters = 32\n"
    "activation = relu\n"
    "[conv]\n"
    "name = conv2\n"
    "filters = 64\n"
    "activation = relu\n";

static const char *const activations[] = {"none", "relu", "sigmoid"};

// Parses text as "t.cfg" and fails the test if it does not parse.
static Cfg parse_ok(const char *text) {
    Cfg cfg;
    Error err = {0};
    int rc = cfg_parse(&cfg, text, "t.cfg", &err);
    if (rc) fail_msg("cfg_parse failed: %s", err.msg);
    return cfg;
}

// Parses text that must fail; checks the cfg is left empty and each needle is in the message.
static void parse_fails(const char *text, const char *needle1, const char *needle2,
                        const char *needle3) {
    Cfg cfg;
    memset(&cfg, 0xAB, sizeof cfg);  // the parser must not rely on a zeroed cfg
    Error err = {0};
    assert_int_equal(cfg_parse(&cfg, text, "t.cfg", &err), -1);
    assert_null(cfg.sections);
    assert_null(cfg.path);
    assert_int_equal(cfg.nsections, 0);
    const char *needles[] = {needle1, needle2, needle3};
    for (int i = 0; i < 3; i++)
        if (needles[i] && !strstr(err.msg, needles[i]))
            fail_msg("message '%s' lacks '%s'", err.msg, needles[i]);
    cfg_free(&cfg);
}

// Asserts that msg holds every needle (NULL-terminated list).
static void assert_msg(const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    for (const char *n = va_arg(ap, const char *); n; n = va_arg(ap, const char *))
        if (!strstr(msg, n)) fail_msg("message '%s' lacks '%s'", msg, n);
    va_end(ap);
}

// ---- parsing ----------------------------------------------------------------------

static void test_parse_example(void **state) {
    Cfg cfg = parse_ok(example);
    assert_string_equal(cfg.path, "t.cfg");
    assert_int_equal(cfg.nsections, 4);
    const char *names[] = {"train", "data", "conv", "conv"};
    const int lines[] = {2, 9, 13, 17};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(cfg.sections[i].name, names[i]);
        assert_int_equal(cfg.sections[i].line, lines[i]);
    }
    CfgSection *train = &cfg.sections[0];
    assert_int_equal(train->nentries, 4);
    assert_string_equal(train->entries[0].key, "epochs");
    assert_string_equal(train->entries[0].value, "14");
    assert_int_equal(train->entries[0].line, 3);
    assert_string_equal(train->entries[1].key, "batch");
    assert_string_equal(train->entries[1].value, "64");
    // Trailing comment and spaces gone.
    assert_string_equal(train->entries[2].key, "accumulate");
    assert_string_equal(train->entries[2].value, "1");
    assert_int_equal(train->entries[2].line, 5);
    assert_string_equal(cfg_entry(&cfg.sections[1], "std")->value, "0.3081");
    assert_string_equal(cfg_entry(&cfg.sections[1], "norm")->value, "0.5, 0.25 ,0.125");
    assert_string_equal(cfg_entry(&cfg.sections[2], "name")->value, "conv1");
    assert_string_equal(cfg_entry(&cfg.sections[3], "name")->value, "conv2");
    assert_int_equal(cfg_entry(&cfg.sections[3], "filters")->line, 19);
    cfg_free(&cfg);
}

static void test_parse_crlf(void **state) {
    Cfg cfg = parse_ok("[train]\r\nepochs = 3\r\n# note\r\n\r\nlr = 0.5 # half\r\n[data]\r\n"
                       "std=1\r\n");
    assert_int_equal(cfg.nsections, 2);
    assert_string_equal(cfg.sections[0].name, "train");
    assert_string_equal(cfg_entry(&cfg.sections[0], "epochs")->value, "3");
    assert_string_equal(cfg_entry(&cfg.sections[0], "lr")->value, "0.5");
    assert_int_equal(cfg_entry(&cfg.sections[0], "lr")->line, 5);
    assert_string_equal(cfg.sections[1].name, "data");
    assert_int_equal(cfg.sections[1].line, 6);
    assert_string_equal(cfg_entry(&cfg.sections[1], "std")->value, "1");
    cfg_free(&cfg);
}

static void test_parse_edges(void **state) {
    // Empty text, comments only, no final newline, header with a trailing comment,
    // spaces inside the brackets, an empty section, a UTF-8 byte order mark.
    Cfg cfg = parse_ok("");
    assert_int_equal(cfg.nsections, 0);
    cfg_free(&cfg);
    cfg = parse_ok("# nothing\n\n   \n");
    assert_int_equal(cfg.nsections, 0);
    cfg_free(&cfg);
    cfg = parse_ok("\xEF\xBB\xBF[ empty ]\n[train] # the trainer\nseed=7");
    assert_int_equal(cfg.nsections, 2);
    assert_string_equal(cfg.sections[0].name, "empty");
    assert_int_equal(cfg.sections[0].nentries, 0);
    assert_string_equal(cfg.sections[1].name, "train");
    assert_string_equal(cfg_entry(&cfg.sections[1], "seed")->value, "7");
    // A value may hold '=' and spaces inside.
    cfg_free(&cfg);
    cfg = parse_ok("[data]\nsave = runs/a b=c\n");
    assert_string_equal(cfg_entry(&cfg.sections[0], "save")->value, "runs/a b=c");
    cfg_free(&cfg);
}

static void test_parse_junk_line(void **state) {
    parse_fails("[train]\nepochs = 1\nepochs 14 # oops\n", "t.cfg:3:", "cannot parse 'epochs 14'",
                "expected [section] or key = value");
    parse_fails("[train\n", "t.cfg:1:", "cannot parse '[train'", NULL);
    parse_fails("[train] x\n", "t.cfg:1:", "cannot parse", NULL);
    parse_fails("[train]\n= 5\n", "t.cfg:2:", "key before '=' is missing", NULL);
}

static void test_parse_bad_names(void **state) {
    parse_fails("[train]\n[con v]\n", "t.cfg:2:", "bad section name '[con v]'", NULL);
    parse_fails("[]\n", "t.cfg:1:", "bad section name", NULL);
    parse_fails("[train]\nlearning rate = 1\n", "t.cfg:2:", "bad key 'learning rate'", NULL);
    parse_fails("[train]\nconv1.filters = 1\n", "t.cfg:2:", "bad key 'conv1.filters'", NULL);
}

static void test_parse_long_line(void **state) {
    // A long junk line is quoted in part, and the message still names file and line.
    char text[4096] = "[train]\nok = 1\n";
    size_t n = strlen(text);
    memset(text + n, 'x', 3000);
    text[n + 3000] = '\0';
    parse_fails(text, "t.cfg:3: cannot parse 'xxxx", NULL, NULL);
}

static void test_parse_key_before_section(void **state) {
    parse_fails("# header\nepochs = 14\n[train]\n", "t.cfg:2:", "key 'epochs'",
                "before any [section]");
}

static void test_parse_duplicate_key(void **state) {
    parse_fails("[train]\nepochs = 1\nlr = 1\n\nepochs = 2\n", "t.cfg:5:",
                "duplicate key 'epochs' in [train]", "line 2");
    // The same key in two sections of the same name is fine: one per layer.
    Cfg cfg = parse_ok("[conv]\nfilters = 1\n[conv]\nfilters = 2\n");
    cfg_free(&cfg);
}

// CFG_MAX_SECTIONS sections of CFG_MAX_KEYS keys parse; one more section, or key, does not.
static void test_parse_limits(void **state) {
    const size_t size = (size_t)(CFG_MAX_SECTIONS + 1) * 8 + (size_t)(CFG_MAX_KEYS + 1) * 16 + 1;
    char *text = malloc(size), *p = text;
    assert_non_null(text);
    for (int i = 0; i < CFG_MAX_KEYS; i++) p += sprintf(p, "k%d = 1\n", i);
    for (int i = 1; i < CFG_MAX_SECTIONS; i++) p += sprintf(p, "[relu]\n");
    char *keys_end = p;
    // The keys go under a first section (the sections' loop starts at 1).
    char *full = malloc(size + 16);
    assert_non_null(full);
    sprintf(full, "[conv]\n%s", text);
    Cfg cfg = parse_ok(full);
    assert_int_equal(cfg.nsections, CFG_MAX_SECTIONS);
    assert_int_equal(cfg.sections[0].nentries, CFG_MAX_KEYS);
    cfg_free(&cfg);
    sprintf(keys_end, "[relu]\n");
    sprintf(full, "[conv]\n%s", text);
    parse_fails(full, "t.cfg:", "more than 10000 sections", "at most");
    // One key more in the first section.
    sprintf(full, "[conv]\nextra = 1\n%s", text);
    parse_fails(full, "t.cfg:258:", "[conv] has more than 256 keys", "at most");
    free(full);
    free(text);
}

static void test_parse_empty_value(void **state) {
    parse_fails("[train]\nepochs =   # to do\n", "t.cfg:2:", "key 'epochs'", "empty value");
}

static void test_to_text_round_trip(void **state) {
    Cfg cfg = parse_ok(example);
    Error err = {0};
    assert_int_equal(cfg_set(&cfg.sections[0], "device", "cuda", &err), 0);
    char *text = cfg_to_text(&cfg, &err);
    assert_non_null(text);
    // Canonical: one "key = value" a line, no comments, a blank line between sections.
    assert_non_null(strstr(text, "[train]\nepochs = 14\nbatch = 64\naccumulate = 1\n"));
    assert_non_null(strstr(text, "device = cuda\n\n[data]\n"));
    assert_null(strchr(text, '#'));
    Cfg back;
    assert_int_equal(cfg_parse(&back, text, "ckpt", &err), 0);
    assert_int_equal(back.nsections, cfg.nsections);
    for (int i = 0; i < cfg.nsections; i++) {
        assert_string_equal(back.sections[i].name, cfg.sections[i].name);
        assert_int_equal(back.sections[i].nentries, cfg.sections[i].nentries);
        for (int j = 0; j < cfg.sections[i].nentries; j++) {
            assert_string_equal(back.sections[i].entries[j].key, cfg.sections[i].entries[j].key);
            assert_string_equal(back.sections[i].entries[j].value,
                                cfg.sections[i].entries[j].value);
        }
    }
    // Writing the re-read cfg gives the same text: the form is canonical.
    char *again = cfg_to_text(&back, &err);
    assert_non_null(again);
    assert_string_equal(again, text);
    free(again);
    free(text);
    cfg_free(&back);
    cfg_free(&cfg);

    // An empty cfg writes an empty string.
    Cfg empty = {0};
    text = cfg_to_text(&empty, &err);
    assert_non_null(text);
    assert_string_equal(text, "");
    free(text);

    // A hand-built cfg that would not read back is refused, not written wrong.
    CfgEntry entry = {.key = "save", .value = "runs/a # b", .line = 0};
    CfgSection section = {.name = "train", .line = 0, .entries = &entry, .nentries = 1};
    Cfg hand = {.path = NULL, .sections = &section, .nsections = 1};
    assert_null(cfg_to_text(&hand, &err));
    assert_msg(err.msg, "[train] key 'save'", "'#'", NULL);
    entry.value = "ok";
    entry.key = "two words";
    assert_null(cfg_to_text(&hand, &err));
    assert_msg(err.msg, "bad key 'two words'", NULL);
}

static void test_free_zeroes(void **state) {
    Cfg cfg = {0};
    cfg_free(&cfg);  // a zeroed cfg is fine
    cfg_free(&cfg);
    cfg = parse_ok(example);
    cfg_free(&cfg);
    Cfg zero = {0};
    assert_memory_equal(&cfg, &zero, sizeof cfg);
    cfg_free(NULL);
}

// ---- files ------------------------------------------------------------------------

static void test_load_file(void **state) {
    char path[] = "/tmp/test_cfg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(example, f);
    fclose(f);
    Cfg cfg;
    Error err = {0};
    assert_int_equal(cfg_load(&cfg, path, &err), 0);
    assert_string_equal(cfg.path, path);
    assert_int_equal(cfg.nsections, 4);
    cfg_free(&cfg);

    // An error in a file names that file.
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("[train]\nepochs: 3\n", f);
    fclose(f);
    assert_int_equal(cfg_load(&cfg, path, &err), -1);
    char want[64];
    snprintf(want, sizeof want, "%s:2:", path);
    assert_msg(err.msg, want, "cannot parse", NULL);
    assert_int_equal(cfg.nsections, 0);
    unlink(path);
}

static void test_load_missing(void **state) {
    Cfg cfg;
    Error err = {0};
    assert_int_equal(cfg_load(&cfg, "/nonexistent/dir/mnist.cfg", &err), -1);
    assert_msg(err.msg, "/nonexistent/dir/mnist.cfg", "No such file", NULL);
    assert_null(cfg.sections);
    cfg_free(&cfg);
}

static void test_load_nul_byte(void **state) {
    char path[] = "/tmp/test_cfg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "[train]\nepochs = 1\0\n", 20), 20);
    close(fd);
    Cfg cfg;
    Error err = {0};
    assert_int_equal(cfg_load(&cfg, path, &err), -1);
    assert_msg(err.msg, path, "NUL byte", NULL);
    unlink(path);
}

// ---- lookup and set ---------------------------------------------------------------

static void test_lookup(void **state) {
    Cfg cfg = parse_ok(example);
    assert_ptr_equal(cfg_section(&cfg, "conv"), &cfg.sections[2]);  // the first one
    assert_ptr_equal(cfg_section(&cfg, "data"), &cfg.sections[1]);
    assert_null(cfg_section(&cfg, "linear"));
    assert_null(cfg_entry(&cfg.sections[0], "nope"));
    assert_null(cfg_entry(NULL, "epochs"));
    cfg_free(&cfg);
}

static void test_set_replace_append(void **state) {
    Cfg cfg = parse_ok(example);
    Error err = {0};
    CfgSection *train = cfg_section(&cfg, "train");
    int n = train->nentries;
    assert_int_equal(cfg_set(train, "epochs", "1", &err), 0);
    assert_int_equal(train->nentries, n);
    assert_string_equal(train->entries[0].value, "1");
    assert_int_equal(train->entries[0].line, 0);
    assert_int_equal(cfg_set(train, "device", "cuda", &err), 0);
    assert_int_equal(train->nentries, n + 1);
    CfgEntry *e = cfg_entry(train, "device");
    assert_non_null(e);
    assert_string_equal(e->value, "cuda");
    assert_int_equal(e->line, 0);
    assert_ptr_equal(e, &train->entries[n]);  // appended last
    // Values that could not be written back to a cfg file are refused.
    assert_int_equal(cfg_set(train, "save", "", &err), -1);
    assert_msg(err.msg, "command line", "save", "empty", NULL);
    assert_int_equal(cfg_set(train, "save", "a#b", &err), -1);
    assert_msg(err.msg, "save", "'#'", NULL);
    assert_int_equal(cfg_set(train, "save", "a\nb", &err), -1);
    assert_int_equal(cfg_set(train, "bad key", "1", &err), -1);
    assert_msg(err.msg, "bad key 'bad key'", NULL);
    assert_int_equal(train->nentries, n + 1);
    cfg_free(&cfg);
}

static void test_override_reports_command_line(void **state) {
    Cfg cfg = parse_ok(example);
    Error err = {0};
    CfgSection *train = cfg_section(&cfg, "train");
    assert_int_equal(cfg_set(train, "batch", "lots", &err), 0);
    int64_t v;
    assert_int_equal(cfg_int(&cfg, train, "batch", NULL, 1, 1048576, &v, &err), -1);
    assert_msg(err.msg, "command line: [train] key 'batch' = 'lots'",
               "expected an integer in [1, 1048576]", NULL);
    assert_null(strstr(err.msg, "t.cfg"));
    assert_int_equal(cfg_set(train, "batch", "32", &err), 0);
    assert_int_equal(cfg_int(&cfg, train, "batch", NULL, 1, 1048576, &v, &err), 0);
    assert_int_equal(v, 32);
    cfg_free(&cfg);
}

// ---- check_keys -------------------------------------------------------------------

static const CfgKey train_keys[] = {
    {"epochs", "14", "number of passes over the training set"},
    {"batch", "64", "samples per optimizer step"},
    {"accumulate", "1", "micro-batches per optimizer step"},
    {"lr", "1.0", "learning rate"},
    {"save", NULL, "folder for checkpoints and the metrics log"},
};

static void test_check_keys(void **state) {
    Cfg cfg = parse_ok(example);
    Error err = {0};
    assert_int_equal(cfg_check_keys(&cfg, &cfg.sections[0], train_keys, 5, &err), 0);
    Cfg bad = parse_ok("[train]\nepochs = 1\nepoch = 2\n");
    assert_int_equal(cfg_check_keys(&bad, &bad.sections[0], train_keys, 5, &err), -1);
    assert_msg(err.msg, "t.cfg:3: unknown key 'epoch' in [train]",
               "known keys: epochs, batch, accumulate, lr, save", NULL);
    // An unknown key from the command line says so.
    assert_int_equal(cfg_set(&cfg.sections[0], "epoch", "1", &err), 0);
    assert_int_equal(cfg_check_keys(&cfg, &cfg.sections[0], train_keys, 5, &err), -1);
    assert_msg(err.msg, "command line: unknown key 'epoch' in [train]", NULL);
    cfg_free(&bad);
    cfg_free(&cfg);
}

// ---- getters ----------------------------------------------------------------------

static void test_int(void **state) {
    Cfg cfg = parse_ok("[train]\nepochs = 14\nneg = -3\nplus = +5\nbig = 9223372036854775807\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    int64_t v = 0;
    assert_int_equal(cfg_int(&cfg, s, "epochs", NULL, 1, 1000, &v, &err), 0);
    assert_int_equal(v, 14);
    assert_int_equal(cfg_int(&cfg, s, "neg", NULL, -10, 10, &v, &err), 0);
    assert_int_equal(v, -3);
    assert_int_equal(cfg_int(&cfg, s, "plus", NULL, 0, 10, &v, &err), 0);
    assert_int_equal(v, 5);
    assert_int_equal(cfg_int(&cfg, s, "big", NULL, INT64_MIN, INT64_MAX, &v, &err), 0);
    assert_true(v == INT64_MAX);
    // Absent with a default: the default, parsed.
    assert_int_equal(cfg_int(&cfg, s, "seed", "7", 0, 100, &v, &err), 0);
    assert_int_equal(v, 7);
    cfg_free(&cfg);
}

static void test_int_errors(void **state) {
    Cfg cfg = parse_ok("[train]\na = abc\nb = 1e3\nc = 12x\nd = 0x10\ne = 99999999999999999999\n"
                       "f = 0\ng = 1.5\nh = -\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    int64_t v = 42;
    const char *keys[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    const char *vals[] = {"abc", "1e3", "12x", "0x10", "99999999999999999999", "0", "1.5", "-"};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(cfg_int(&cfg, s, keys[i], NULL, 1, 1048576, &v, &err), -1);
        char line[32], kv[64];
        snprintf(line, sizeof line, "t.cfg:%d: [train]", i + 2);
        snprintf(kv, sizeof kv, "key '%s' = '%s'", keys[i], vals[i]);
        assert_msg(err.msg, line, kv, "expected an integer in [1, 1048576]", NULL);
    }
    assert_int_equal(v, 42);  // untouched on error
    // Out of range above.
    cfg_set(s, "f", "1048577", &err);
    assert_int_equal(cfg_int(&cfg, s, "f", NULL, 1, 1048576, &v, &err), -1);
    assert_msg(err.msg, "'1048577'", "[1, 1048576]", NULL);
    // Beyond int64 is refused even when any int64 is allowed (not clamped to the limit).
    assert_int_equal(cfg_int(&cfg, s, "e", NULL, INT64_MIN, INT64_MAX, &v, &err), -1);
    assert_msg(err.msg, "t.cfg:6:", "key 'e'", NULL);
    cfg_set(s, "e", "-9223372036854775809", &err);
    assert_int_equal(cfg_int(&cfg, s, "e", NULL, INT64_MIN, INT64_MAX, &v, &err), -1);
    assert_msg(err.msg, "command line", "key 'e'", NULL);
    cfg_free(&cfg);
}

static void test_missing_required(void **state) {
    Cfg cfg = parse_ok("# top\n[train]\nepochs = 1\n\n[conv]\nname = conv1\n");
    Error err = {0};
    int64_t v;
    double d;
    const char *str;
    int idx;
    assert_int_equal(cfg_int(&cfg, &cfg.sections[1], "filters", NULL, 1, 10, &v, &err), -1);
    assert_msg(err.msg, "t.cfg:5: [conv] needs key 'filters'", NULL);
    assert_int_equal(cfg_float(&cfg, &cfg.sections[0], "lr", NULL, 0, 10, &d, &err), -1);
    assert_msg(err.msg, "t.cfg:2: [train] needs key 'lr'", NULL);
    assert_int_equal(cfg_str(&cfg, &cfg.sections[0], "save", NULL, &str, &err), -1);
    assert_msg(err.msg, "t.cfg:2: [train] needs key 'save'", NULL);
    assert_int_equal(cfg_choice(&cfg, &cfg.sections[1], "activation", NULL, activations, 3, &idx,
                                &err),
                     -1);
    assert_msg(err.msg, "t.cfg:5: [conv] needs key 'activation'", NULL);
    // No section at all: a default still works, a required key is an error.
    assert_int_equal(cfg_int(&cfg, cfg_section(&cfg, "data"), "workers", "2", 0, 64, &v, &err), 0);
    assert_int_equal(v, 2);
    assert_int_equal(cfg_int(&cfg, NULL, "workers", NULL, 0, 64, &v, &err), -1);
    assert_msg(err.msg, "t.cfg", "'workers'", NULL);
    cfg_free(&cfg);
}

static void test_bad_default(void **state) {
    Cfg cfg = parse_ok("[train]\nepochs = 1\n");
    Error err = {0};
    int64_t v;
    assert_int_equal(cfg_int(&cfg, &cfg.sections[0], "seed", "one", 0, 10, &v, &err), -1);
    assert_msg(err.msg, "t.cfg:1: [train] key 'seed' default 'one'", "expected an integer", NULL);
    double d;
    assert_int_equal(cfg_float(&cfg, &cfg.sections[0], "lr", "x", 0, 10, &d, &err), -1);
    assert_msg(err.msg, "key 'lr' default 'x'", NULL);
    cfg_free(&cfg);
}

static void test_float(void **state) {
    Cfg cfg = parse_ok("[train]\nlr = 1.0\neps = 1e-6\nneg = -.5\nint = 3\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    double d;
    assert_int_equal(cfg_float(&cfg, s, "lr", NULL, 0, 100, &d, &err), 0);
    assert_true(d == 1.0);
    assert_int_equal(cfg_float(&cfg, s, "eps", NULL, 0, 1, &d, &err), 0);
    assert_true(d == 1e-6);
    assert_int_equal(cfg_float(&cfg, s, "neg", NULL, -1, 0, &d, &err), 0);
    assert_true(d == -0.5);
    assert_int_equal(cfg_float(&cfg, s, "int", NULL, 0, 10, &d, &err), 0);
    assert_true(d == 3.0);
    assert_int_equal(cfg_float(&cfg, s, "rho", "0.9", 0, 1, &d, &err), 0);
    assert_true(d == 0.9);
    cfg_free(&cfg);
}

static void test_float_errors(void **state) {
    Cfg cfg = parse_ok("[train]\na = fast\nb = 1.0x\nc = nan\nd = inf\ne = 1e999\nf = 2.5\n"
                       "g = -infinity\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    double d = 42;
    const char *keys[] = {"a", "b", "c", "d", "e", "f", "g"};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(cfg_float(&cfg, s, keys[i], NULL, 0, 2, &d, &err), -1);
        char line[32], key[32];
        snprintf(line, sizeof line, "t.cfg:%d: [train]", i + 2);
        snprintf(key, sizeof key, "key '%s' = '", keys[i]);
        assert_msg(err.msg, line, key, "expected a number in [0, 2]", NULL);
    }
    assert_true(d == 42);
    cfg_free(&cfg);
}

static void test_str(void **state) {
    Cfg cfg = parse_ok("[train]\nsave = runs/mnist # where\n");
    Error err = {0};
    const char *str = NULL;
    assert_int_equal(cfg_str(&cfg, &cfg.sections[0], "save", NULL, &str, &err), 0);
    assert_string_equal(str, "runs/mnist");
    assert_ptr_equal(str, cfg.sections[0].entries[0].value);  // owned by cfg
    assert_int_equal(cfg_str(&cfg, &cfg.sections[0], "log", "metrics.csv", &str, &err), 0);
    assert_string_equal(str, "metrics.csv");
    cfg_free(&cfg);
}

static void test_choice(void **state) {
    Cfg cfg = parse_ok("[conv]\nactivation = sigmoid\nbad = tanh\ncase = ReLU\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    int idx = -1;
    assert_int_equal(cfg_choice(&cfg, s, "activation", NULL, activations, 3, &idx, &err), 0);
    assert_int_equal(idx, 2);
    assert_int_equal(cfg_choice(&cfg, s, "missing", "relu", activations, 3, &idx, &err), 0);
    assert_int_equal(idx, 1);
    idx = -1;
    assert_int_equal(cfg_choice(&cfg, s, "bad", NULL, activations, 3, &idx, &err), -1);
    assert_msg(err.msg, "t.cfg:3: [conv] key 'bad' = 'tanh'", "expected one of none, relu, sigmoid",
               NULL);
    assert_int_equal(idx, -1);
    // Choices are case-sensitive, like the names in the cfg reference.
    assert_int_equal(cfg_choice(&cfg, s, "case", NULL, activations, 3, &idx, &err), -1);
    assert_msg(err.msg, "t.cfg:4:", "'ReLU'", NULL);
    cfg_free(&cfg);
}

static void test_floats(void **state) {
    Cfg cfg = parse_ok("[data]\nmean = 0.5, 0.25 ,0.125\none = 7\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    double v[4];
    int n = 0;
    assert_int_equal(cfg_floats(&cfg, s, "mean", NULL, v, 4, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_true(v[0] == 0.5 && v[1] == 0.25 && v[2] == 0.125);
    assert_int_equal(cfg_floats(&cfg, s, "one", NULL, v, 1, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_true(v[0] == 7);
    assert_int_equal(cfg_floats(&cfg, s, "std", "0.3081", v, 3, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_true(v[0] == 0.3081);
    cfg_free(&cfg);
}

static void test_floats_errors(void **state) {
    Cfg cfg = parse_ok("[data]\na = 0.5,,0.5\nb = 0.5,\nc = 1, x, 3\nd = 1,2,3,4\ne = 1, nan\n");
    Error err = {0};
    CfgSection *s = &cfg.sections[0];
    double v[3];
    int n = -1;
    const char *keys[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(cfg_floats(&cfg, s, keys[i], NULL, v, 3, &n, &err), -1);
        char line[32], key[32];
        snprintf(line, sizeof line, "t.cfg:%d: [data]", i + 2);
        snprintf(key, sizeof key, "key '%s' = '", keys[i]);
        assert_msg(err.msg, line, key, "expected 1 to 3", NULL);
    }
    assert_int_equal(n, -1);
    cfg_free(&cfg);
}

static void test_print_keys(void **state) {
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    assert_non_null(f);
    cfg_print_keys(f, "train", train_keys, 5);
    fclose(f);
    assert_non_null(strstr(buf, "[train]\n"));
    // Aligned: every help text starts in the same column.
    const char *a = strstr(buf, "  epochs = 14 ");
    const char *b = strstr(buf, "  save = (required) ");
    assert_non_null(a);
    assert_non_null(b);
    const char *ha = strstr(a, "number of passes");
    const char *hb = strstr(b, "folder for checkpoints");
    assert_non_null(ha);
    assert_non_null(hb);
    assert_int_equal(ha - a, hb - b);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_example),
        cmocka_unit_test(test_parse_crlf),
        cmocka_unit_test(test_parse_edges),
        cmocka_unit_test(test_parse_junk_line),
        cmocka_unit_test(test_parse_bad_names),
        cmocka_unit_test(test_parse_long_line),
        cmocka_unit_test(test_parse_key_before_section),
        cmocka_unit_test(test_parse_duplicate_key),
        cmocka_unit_test(test_parse_empty_value),
        cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_to_text_round_trip),
        cmocka_unit_test(test_free_zeroes),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_load_missing),
        cmocka_unit_test(test_load_nul_byte),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_set_replace_append),
        cmocka_unit_test(test_override_reports_command_line),
        cmocka_unit_test(test_check_keys),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_int_errors),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_bad_default),
        cmocka_unit_test(test_float),
        cmocka_unit_test(test_float_errors),
        cmocka_unit_test(test_str),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_floats),
        cmocka_unit_test(test_floats_errors),
        cmocka_unit_test(test_print_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
