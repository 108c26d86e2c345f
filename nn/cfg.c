// cfg.c: the cfg file parser and the typed getters of cfg.h.
//
// The parser keeps text only; every value is checked where it is read, by a getter that
// knows what the key means, so a message can say what was expected. Every message
// starts with where the value came from: "PATH:LINE" for the file, "command line" for
// an override (line 0).
#include "cfg.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// Longest value or line quoted in a message: enough to recognise it, short enough to
// leave room for the rest of the message in Error.msg.
#define QUOTE_MAX 200

// ---- small helpers ----------------------------------------------------------------

static int is_space(char c) { return isspace((unsigned char)c) != 0; }

// Trims white space from both ends of [*b, *e).
static void trim(const char **b, const char **e) {
    while (*b < *e && is_space(**b)) (*b)++;
    while (*e > *b && is_space((*e)[-1])) (*e)--;
}

// Section names and keys are identifiers: letters, digits, underscore. None of these
// can start a comment, split at '=' or hold spaces, so cfg_to_text writes every valid
// name back unchanged; and '.' stays free for a command line to address one layer's
// key ("conv1.filters=16") should the CLI want that.
static int valid_name(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') return 0;
    return 1;
}

// Why a value cannot stand in a cfg file, or NULL when it can. The parser never makes
// such a value; cfg_set and cfg_to_text check it so that the text written for a
// checkpoint always reads back to the same cfg.
static const char *value_problem(const char *v) {
    if (!v || !*v) return "a value cannot be empty";
    if (is_space(v[0]) || is_space(v[strlen(v) - 1]))
        return "a value cannot start or end with white space";
    if (strchr(v, '#')) return "a value cannot hold '#' (it starts a comment)";
    if (strchr(v, '\n') || strchr(v, '\r')) return "a value cannot hold a line break";
    return NULL;
}

static const char *cfg_path(const Cfg *cfg) {
    return (cfg && cfg->path) ? cfg->path : "<cfg>";
}

// "PATH:LINE", or "command line" for line 0 (an override).
static void where(char *buf, size_t size, const Cfg *cfg, int line) {
    if (line > 0)
        snprintf(buf, size, "%s:%d", cfg_path(cfg), line);
    else
        snprintf(buf, size, "command line");
}

// Appends one zeroed element to a malloc'd array of *n elements of size bytes.
// On failure the array is left as it was.
static void *grow(void *arr, int *n, size_t size, Error *err) {
    if (*n == INT_MAX) {
        err_set(err, "cfg: too many sections or entries");
        return NULL;
    }
    void *p = realloc(arr, ((size_t)*n + 1) * size);
    if (!p) {
        err_set(err, "%s:%d: out of memory growing a cfg array to %d elements", __FILE__,
                __LINE__, *n + 1);
        return NULL;
    }
    memset((char *)p + (size_t)*n * size, 0, size);
    (*n)++;
    return p;
}

static void section_free(CfgSection *s) {
    for (int i = 0; i < s->nentries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    free(s->entries);
    free(s->name);
    memset(s, 0, sizeof *s);
}

// Appends key = value (copied) to s at the given line. On failure s is unchanged.
static int section_append(CfgSection *s, const char *key, size_t keylen, const char *value,
                          size_t valuelen, int line, Error *err) {
    char *k = xstrndup(key, keylen, err);
    char *v = k ? xstrndup(value, valuelen, err) : NULL;
    CfgEntry *entries = v ? grow(s->entries, &s->nentries, sizeof *entries, err) : NULL;
    if (!entries) {
        free(k);
        free(v);
        return -1;
    }
    s->entries = entries;
    CfgEntry *e = &s->entries[s->nentries - 1];
    e->key = k;
    e->value = v;
    e->line = line;
    return 0;
}

// ---- parsing ----------------------------------------------------------------------

// Parses one line [b, e) (already without its line break) into cfg.
static int parse_line(Cfg *cfg, const char *b, const char *e, int line, Error *err) {
    const char *path = cfg_path(cfg);
    const char *hash = memchr(b, '#', (size_t)(e - b));
    if (hash) e = hash;
    trim(&b, &e);
    if (b == e) return 0;  // blank or comment only
    int len = (int)(e - b) > QUOTE_MAX ? QUOTE_MAX : (int)(e - b);

    if (*b == '[') {
        if (e[-1] != ']' || e - b < 2)
            return err_set(err, "%s:%d: cannot parse '%.*s': expected [section] or key = value",
                           path, line, len, b);
        const char *nb = b + 1, *ne = e - 1;
        trim(&nb, &ne);
        if (!valid_name(nb, (size_t)(ne - nb)))
            return err_set(err,
                           "%s:%d: bad section name '%.*s': expected letters, digits and _ "
                           "between [ and ]",
                           path, line, len, b);
        if (cfg->nsections == CFG_MAX_SECTIONS)
            return err_set(err, "%s:%d: more than %d sections; a cfg holds at most that many", path, line,
                           CFG_MAX_SECTIONS);
        char *name = xstrndup(nb, (size_t)(ne - nb), err);
        if (!name) return -1;
        CfgSection *sections = grow(cfg->sections, &cfg->nsections, sizeof *sections, err);
        if (!sections) {
            free(name);
            return -1;
        }
        cfg->sections = sections;
        cfg->sections[cfg->nsections - 1].name = name;
        cfg->sections[cfg->nsections - 1].line = line;
        return 0;
    }

    const char *eq = memchr(b, '=', (size_t)(e - b));
    if (!eq)
        return err_set(err, "%s:%d: cannot parse '%.*s': expected [section] or key = value",
                       path, line, len, b);
    const char *kb = b, *ke = eq, *vb = eq + 1, *ve = e;
    trim(&kb, &ke);
    trim(&vb, &ve);
    int klen = (int)(ke - kb) > QUOTE_MAX ? QUOTE_MAX : (int)(ke - kb);
    if (kb == ke)
        return err_set(err, "%s:%d: cannot parse '%.*s': the key before '=' is missing", path,
                       line, len, b);
    if (!valid_name(kb, (size_t)(ke - kb)))
        return err_set(err, "%s:%d: bad key '%.*s': expected letters, digits and _", path,
                       line, klen, kb);
    if (cfg->nsections == 0)
        return err_set(err,
                       "%s:%d: key '%.*s' comes before any [section]: put it under a header "
                       "such as [train]",
                       path, line, klen, kb);
    CfgSection *s = &cfg->sections[cfg->nsections - 1];
    if (vb == ve)
        return err_set(err, "%s:%d: [%s] key '%.*s' has an empty value: expected %.*s = VALUE",
                       path, line, s->name, klen, kb, klen, kb);
    for (int i = 0; i < s->nentries; i++) {
        const CfgEntry *old = &s->entries[i];
        if (strlen(old->key) == (size_t)(ke - kb) && !memcmp(old->key, kb, (size_t)(ke - kb)))
            return err_set(err,
                           "%s:%d: duplicate key '%s' in [%s]: it is already set on line %d; "
                           "keep one",
                           path, line, old->key, s->name, old->line);
    }
    if (s->nentries == CFG_MAX_KEYS)
        return err_set(err, "%s:%d: [%s] has more than %d keys; a section holds at most that many", path,
                       line, s->name, CFG_MAX_KEYS);
    return section_append(s, kb, (size_t)(ke - kb), vb, (size_t)(ve - vb), line, err);
}

int cfg_parse(Cfg *cfg, const char *text, const char *path, Error *err) {
    Cfg c = {0};
    memset(cfg, 0, sizeof *cfg);
    if (!path) path = "<string>";
    c.path = xstrndup(path, strlen(path), err);
    if (!c.path) return -1;
    const char *p = text ? text : "";
    // A UTF-8 byte order mark, as some Windows editors write, is not part of line 1.
    if (!strncmp(p, "\xEF\xBB\xBF", 3)) p += 3;
    for (int line = 1; *p; line++) {
        const char *nl = strchr(p, '\n');
        const char *e = nl ? nl : p + strlen(p);
        if (parse_line(&c, p, e, line, err)) {
            cfg_free(&c);
            return -1;
        }
        if (!nl) break;
        if (line == INT_MAX) {
            cfg_free(&c);
            return err_set(err, "%s: too many lines", path);
        }
        p = nl + 1;
    }
    *cfg = c;
    return 0;
}

int cfg_load(Cfg *cfg, const char *path, Error *err) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, "%s: cannot open cfg file: %s", path, strerror(errno));
    // Read in chunks rather than trusting ftell, so pipes and /dev/stdin work too.
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return err_set(err, "%s: out of memory reading cfg file", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return err_set(err, "%s: out of memory reading cfg file (%zu bytes so far)",
                               path, n);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    int saved = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return err_set(err, "%s: cannot read cfg file: %s", path, strerror(saved));
    }
    buf[n] = '\0';
    // The parser reads a C string; a NUL would silently end the file early.
    size_t len = strlen(buf);
    if (len != n) {
        free(buf);
        return err_set(err, "%s: NUL byte at offset %zu: a cfg file is text", path, len);
    }
    int rc = cfg_parse(cfg, buf, path, err);
    free(buf);
    return rc;
}

void cfg_free(Cfg *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->nsections; i++) section_free(&cfg->sections[i]);
    free(cfg->sections);
    free(cfg->path);
    memset(cfg, 0, sizeof *cfg);
}

char *cfg_to_text(const Cfg *cfg, Error *err) {
    // First pass: check that every part reads back unchanged, and measure.
    size_t size = 1;
    for (int i = 0; i < cfg->nsections; i++) {
        const CfgSection *s = &cfg->sections[i];
        if (!s->name || !valid_name(s->name, strlen(s->name))) {
            err_set(err, "cfg_to_text: bad section name '%.*s': expected letters, digits and _",
                    QUOTE_MAX, s->name ? s->name : "");
            return NULL;
        }
        size += strlen(s->name) + 4;  // "\n" between sections, "[", "]", "\n"
        for (int j = 0; j < s->nentries; j++) {
            const CfgEntry *e = &s->entries[j];
            if (!e->key || !valid_name(e->key, strlen(e->key))) {
                err_set(err, "cfg_to_text: [%s] bad key '%.*s': expected letters, digits and _",
                        s->name, QUOTE_MAX, e->key ? e->key : "");
                return NULL;
            }
            const char *why = value_problem(e->value);
            if (why) {
                err_set(err, "cfg_to_text: [%s] key '%s' = '%.*s': %s", s->name, e->key,
                        QUOTE_MAX, e->value ? e->value : "", why);
                return NULL;
            }
            size += strlen(e->key) + strlen(e->value) + 4;  // " = ", "\n"
        }
    }
    char *text = xcalloc(size, 1, err);
    if (!text) return NULL;
    char *p = text;
    for (int i = 0; i < cfg->nsections; i++) {
        const CfgSection *s = &cfg->sections[i];
        p += sprintf(p, "%s[%s]\n", i ? "\n" : "", s->name);
        for (int j = 0; j < s->nentries; j++)
            p += sprintf(p, "%s = %s\n", s->entries[j].key, s->entries[j].value);
    }
    return text;
}

// ---- lookup -----------------------------------------------------------------------

CfgSection *cfg_section(const Cfg *cfg, const char *name) {
    if (!cfg || !name) return NULL;
    for (int i = 0; i < cfg->nsections; i++)
        if (!strcmp(cfg->sections[i].name, name)) return &cfg->sections[i];
    return NULL;
}

CfgEntry *cfg_entry(const CfgSection *s, const char *key) {
    if (!s || !key) return NULL;
    for (int i = 0; i < s->nentries; i++)
        if (!strcmp(s->entries[i].key, key)) return &s->entries[i];
    return NULL;
}

int cfg_set(CfgSection *s, const char *key, const char *value, Error *err) {
    const char *sec = s && s->name ? s->name : "?";
    if (!s) return err_set(err, "command line: no section to set key '%s' in", key ? key : "");
    if (!key || !valid_name(key, strlen(key)))
        return err_set(err, "command line: [%s] bad key '%.*s': expected letters, digits and _",
                       sec, QUOTE_MAX, key ? key : "");
    const char *why = value_problem(value);
    if (why)
        return err_set(err, "command line: [%s] key '%s' = '%.*s': %s", sec, key, QUOTE_MAX,
                       value ? value : "", why);
    CfgEntry *e = cfg_entry(s, key);
    if (!e) return section_append(s, key, strlen(key), value, strlen(value), 0, err);
    // Copy before freeing so a failure leaves the old value in place.
    char *v = xstrndup(value, strlen(value), err);
    if (!v) return -1;
    free(e->value);
    e->value = v;
    e->line = 0;  // the value now comes from the command line, and messages say so
    return 0;
}

void cfg_unset(CfgSection *s, const char *key) {
    CfgEntry *e = cfg_entry(s, key);
    if (!e) return;
    free(e->key);
    free(e->value);
    const int i = (int)(e - s->entries);
    memmove(e, e + 1, (size_t)(s->nentries - i - 1) * sizeof *e);
    s->nentries--;
}

int cfg_check_keys(const Cfg *cfg, const CfgSection *s, const CfgKey *keys, int nkeys,
                   Error *err) {
    if (!s) return 0;
    for (int i = 0; i < s->nentries; i++) {
        const CfgEntry *e = &s->entries[i];
        int known = 0;
        for (int k = 0; k < nkeys && !known; k++) known = !strcmp(keys[k].key, e->key);
        if (known) continue;
        // The list is cut where the message buffer ends; a section has a few keys.
        char list[sizeof err->msg] = "";
        size_t used = 0;
        for (int k = 0; k < nkeys && used < sizeof list; k++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "", keys[k].key);
            if (w < 0) break;
            used += (size_t)w;
        }
        char loc[512];
        where(loc, sizeof loc, cfg, e->line);
        return err_set(err, "%s: unknown key '%s' in [%s]; known keys: %s", loc, e->key, s->name,
                       nkeys ? list : "(none)");
    }
    return 0;
}

// ---- typed getters ----------------------------------------------------------------

// The value of key in s, or def when the key is absent (*line = -1 marks a default).
// A required key that is absent is an error naming the section's header line.
static int lookup(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
                  const char **value, int *line, Error *err) {
    const CfgEntry *e = cfg_entry(s, key);
    if (e) {
        *value = e->value;
        *line = e->line;
        return 0;
    }
    if (def) {
        *value = def;
        *line = -1;
        return 0;
    }
    if (!s) return err_set(err, "%s: missing section for required key '%s'", cfg_path(cfg), key);
    char loc[512];
    where(loc, sizeof loc, cfg, s->line);
    return err_set(err, "%s: [%s] needs key '%s'", loc, s->name, key);
}

// Formats "LOC: [section] key 'k' = 'v': expected ..." for a bad value. A bad default
// is a bug in the caller's table, but it is reported the same way (marked "default")
// at the section's header rather than crashing.
static int bad_value(const Cfg *cfg, const CfgSection *s, const char *key, const char *value,
                     int line, Error *err, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int bad_value(const Cfg *cfg, const CfgSection *s, const char *key, const char *value,
                     int line, Error *err, const char *fmt, ...) {
    char expected[512], loc[512], sec[160] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expected, sizeof expected, fmt, ap);
    va_end(ap);
    if (line >= 0)
        where(loc, sizeof loc, cfg, line);
    else if (s)
        where(loc, sizeof loc, cfg, s->line);
    else
        snprintf(loc, sizeof loc, "%s", cfg_path(cfg));
    if (s) snprintf(sec, sizeof sec, "[%.128s] ", s->name);
    return err_set(err, "%s: %skey '%s' %s '%.*s': expected %s", loc, sec, key,
                   line >= 0 ? "=" : "default", QUOTE_MAX, value, expected);
}

// A decimal integer with an optional sign and nothing else: "1e3", "0x10", " 5" and
// "5k" are refused rather than read as something the user did not mean.
static int parse_int(const char *v, int64_t *out) {
    const char *p = v;
    if (*p == '+' || *p == '-') p++;
    if (!*p) return -1;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (errno == ERANGE || *end) return -1;
    *out = (int64_t)x;
    return 0;
}

// A finite number as strtod reads it, the whole string.
static int parse_float(const char *v, double *out) {
    if (!*v || is_space(*v)) return -1;
    char *end;
    double x = strtod(v, &end);
    if (*end || !isfinite(x)) return -1;
    *out = x;
    return 0;
}

int cfg_int(const Cfg *cfg, const CfgSection *s, const char *key, const char *def, int64_t lo,
            int64_t hi, int64_t *out, Error *err) {
    const char *v = NULL;
    int line = 0;
    if (lookup(cfg, s, key, def, &v, &line, err)) return -1;
    int64_t x;
    if (parse_int(v, &x) || x < lo || x > hi)
        return bad_value(cfg, s, key, v, line, err, "an integer in [%" PRId64 ", %" PRId64 "]",
                         lo, hi);
    *out = x;
    return 0;
}

int cfg_float(const Cfg *cfg, const CfgSection *s, const char *key, const char *def, double lo,
              double hi, double *out, Error *err) {
    const char *v = NULL;
    int line = 0;
    if (lookup(cfg, s, key, def, &v, &line, err)) return -1;
    double x;
    if (parse_float(v, &x) || !(x >= lo && x <= hi))
        return bad_value(cfg, s, key, v, line, err, "a number in [%g, %g]", lo, hi);
    *out = x;
    return 0;
}

int cfg_str(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
            const char **out, Error *err) {
    const char *v = NULL;
    int line = 0;
    if (lookup(cfg, s, key, def, &v, &line, err)) return -1;
    *out = v;
    return 0;
}

int cfg_choice(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
               const char *const *choices, int nchoices, int *out, Error *err) {
    const char *v = NULL;
    int line = 0;
    if (lookup(cfg, s, key, def, &v, &line, err)) return -1;
    for (int i = 0; i < nchoices; i++) {
        if (!strcmp(v, choices[i])) {
            *out = i;
            return 0;
        }
    }
    char list[512] = "";
    size_t used = 0;
    for (int i = 0; i < nchoices && used < sizeof list; i++) {
        int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return bad_value(cfg, s, key, v, line, err, "one of %s", list);
}

int cfg_floats(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
               double *out, int max, int *n, Error *err) {
    const char *v = NULL;
    int line = 0;
    if (lookup(cfg, s, key, def, &v, &line, err)) return -1;
    int count = 0;
    const char *p = v;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *b = p, *e = comma ? comma : p + strlen(p);
        trim(&b, &e);
        char item[128];
        double x;
        int ok = b < e && (size_t)(e - b) < sizeof item && count < max;
        if (ok) {
            memcpy(item, b, (size_t)(e - b));
            item[e - b] = '\0';
            ok = !parse_float(item, &x);
        }
        if (!ok)
            return bad_value(cfg, s, key, v, line, err,
                             "1 to %d finite numbers separated by commas", max);
        out[count++] = x;
        if (!comma) break;
        p = comma + 1;
    }
    *n = count;
    return 0;
}

void cfg_print_keys(FILE *f, const char *section, const CfgKey *keys, int nkeys) {
    // Align the help column past the widest "key = default" of this table.
    int width = 20;
    for (int i = 0; i < nkeys; i++) {
        int w = (int)(strlen(keys[i].key) + 3 + strlen(keys[i].def ? keys[i].def : "(required)"));
        if (w > width) width = w;
    }
    fprintf(f, "[%s]\n", section);
    for (int i = 0; i < nkeys; i++) {
        const char *def = keys[i].def ? keys[i].def : "(required)";
        int w = (int)(strlen(keys[i].key) + 3 + strlen(def));
        fprintf(f, "  %s = %s%*s%s\n", keys[i].key, def, keys[i].help ? width - w + 2 : 0, "",
                keys[i].help ? keys[i].help : "");
    }
}
