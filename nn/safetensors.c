// safetensors.c: the strict reader (a schema-driven JSON parser over the mapped header)
// and the atomic writer. See safetensors.h for the contracts.
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c copies tensor data raw: it assumes a little-endian host"
#endif

// clang-format off
const char *const st_dtype_names[ST_DTYPE_COUNT] = {
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64"};
// clang-format on
const size_t st_dtype_sizes[ST_DTYPE_COUNT] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
static_assert(ST_DTYPE_COUNT == 15, "st_dtype tables must list every StDType");

// DType -> StDType, in DType's order.
static const StDType from_dtype[DT_COUNT] = {ST_F32, ST_F16, ST_I64, ST_I32, ST_U8, ST_BF16};
static_assert(DT_COUNT == 6, "from_dtype must list every DType");

StDType st_dtype_from(DType dt) { return from_dtype[dt]; }

// StDType -> DType, or -1 where DType has no such type.
static int to_dtype(StDType st) {
    for (int i = 0; i < DT_COUNT; i++)
        if (from_dtype[i] == st) return i;
    return -1;
}

int64_t st_numel(const StEntry *e) {
    // Validated: the product of the dimensions fits, unless one of them is 0 (then the
    // others are not bounded, and their product may not fit).
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

// "[64, 9216]" into buf (always terminated).
static const char *shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t n = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

// ---- strings ---------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid, as in RFC 3629).
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static bool utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t len = utf8_len(p + i, n - i);
        if (!len) return false;
        i += len;
    }
    return true;
}

// ---- the header parser -----------------------------------------------------------------
//
// Recursive descent over exactly the schema: {name: {dtype, shape, data_offsets}, ...,
// "__metadata__": {key: string}}. It never recurses into arbitrary values, so nesting
// depth is bounded by the schema (3), and anything outside the schema is an error that
// says what was expected. Every read checks the cursor against the end.

typedef struct Parser {
    const unsigned char *s, *p, *end;  // the header text [s, end); cursor p
    const unsigned char *data;         // the data section
    size_t data_bytes;
    const char *path;
    StFile *f;
    int cap_entries, cap_meta;
    char *arena;  // decoded strings; capacity = header size + 1, which always suffices:
    size_t used;  // a decoded string plus its NUL is shorter than its quoted JSON form
    char ctx[TENSOR_NAME_MAX + 32];  // where we are, for messages: "tensor 'x'"
    Error *err;
} Parser;

static size_t pos(const Parser *P) { return (size_t)(P->p - P->s) + 8; }  // file offset

static void skip_ws(Parser *P) {
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\t' || *P->p == '\n' || *P->p == '\r'))
        P->p++;
}

// What the cursor is on, for "found ..." in messages.
static const char *found(const Parser *P, char *buf, size_t cap) {
    if (P->p >= P->end) return "the end of the header";
    unsigned char c = *P->p;
    if (c > 0x20 && c < 0x7F)
        snprintf(buf, cap, "'%c'", c);
    else
        snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

// The kind of JSON value starting at the cursor, for type errors.
static const char *value_kind(const Parser *P) {
    if (P->p >= P->end) return "the end of the header";
    switch (*P->p) {
    case '{': return "an object";
    case '[': return "an array";
    case '"': return "a string";
    case 't': return "true";
    case 'f': return "false";
    case 'n': return "null";
    case '-': return "a number";
    default: return (*P->p >= '0' && *P->p <= '9') ? "a number" : "an invalid token";
    }
}

static int syntax(Parser *P, const char *expected) {
    char b[32];
    return err_set(P->err,
                   "%s: the header is not valid JSON: at byte %zu (in %s) expected %s, found %s;"
                   " the file is corrupt or not a safetensors file",
                   P->path, pos(P), P->ctx, expected, found(P, b, sizeof b));
}

static int bad_string(Parser *P, const char *what) {
    return err_set(P->err,
                   "%s: the header is not valid JSON: at byte %zu (in %s): %s;"
                   " the file is corrupt or not a safetensors file",
                   P->path, pos(P), P->ctx, what);
}

static int expect(Parser *P, char c, const char *expected) {
    skip_ws(P);
    if (P->p >= P->end || *P->p != (unsigned char)c) return syntax(P, expected);
    P->p++;
    return 0;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

// Parses a JSON string at the cursor (after whitespace) into the arena; *out is its
// NUL-terminated UTF-8 text, *len its length. Rejects what JSON rejects (raw control
// characters, bad escapes, invalid UTF-8, lone surrogates) and \u0000, which C strings
// cannot hold.
static int parse_string(Parser *P, const char **out, size_t *len, const char *expected) {
    skip_ws(P);
    if (P->p >= P->end || *P->p != '"') return syntax(P, expected);
    P->p++;
    char *o = P->arena + P->used, *start = o;
    for (;;) {
        if (P->p >= P->end) return bad_string(P, "a string runs to the end of the header");
        unsigned char c = *P->p;
        if (c == '"') {
            P->p++;
            break;
        }
        if (c < 0x20)
            return bad_string(P, "a raw control character inside a string (JSON needs it escaped)");
        if (c != '\\') {
            size_t n = utf8_len(P->p, (size_t)(P->end - P->p));
            if (!n) return bad_string(P, "a string is not valid UTF-8");
            memcpy(o, P->p, n);
            o += n;
            P->p += n;
            continue;
        }
        if (P->end - P->p < 2) return bad_string(P, "a string runs to the end of the header");
        unsigned char e = P->p[1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            *o++ = map[simple - "\"\\/bfnrt"];
            P->p += 2;
            continue;
        }
        if (e != 'u') return bad_string(P, "an invalid escape sequence in a string");
        unsigned cp, lo;
        if (P->end - P->p < 6 || hex4(P->p + 2, &cp))
            return bad_string(P, "\\u is not followed by 4 hex digits");
        P->p += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return bad_string(P, "a lone low surrogate \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (P->end - P->p < 6 || P->p[0] != '\\' || P->p[1] != 'u' || hex4(P->p + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return bad_string(P, "a high surrogate \\u escape without its low surrogate");
            P->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0)
            return bad_string(
                P, "\\u0000 (a NUL character) in a string; names and metadata cannot hold it");
        if (cp < 0x80)
            *o++ = (char)cp;
        else if (cp < 0x800) {
            *o++ = (char)(0xC0 | cp >> 6);
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *o++ = (char)(0xE0 | cp >> 12);
            *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (char)(0xF0 | cp >> 18);
            *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
            *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *o++ = '\0';
    *out = start;
    *len = (size_t)(o - start) - 1;
    P->used += (size_t)(o - start);
    return 0;
}

// Parses a JSON integer (sign allowed) into *v. what names the field for messages.
static int parse_int(Parser *P, int64_t *v, const char *what) {
    skip_ws(P);
    const unsigned char *p = P->p;
    bool neg = p < P->end && *p == '-';
    if (neg) p++;
    if (p >= P->end || *p < '0' || *p > '9') {
        return err_set(P->err, "%s: %s: %s must hold integers, found %s at byte %zu", P->path,
                       P->ctx, what, value_kind(P), pos(P));
    }
    if (*p == '0' && p + 1 < P->end && p[1] >= '0' && p[1] <= '9') {
        P->p = p;
        return bad_string(P, "a number with a leading zero");
    }
    uint64_t x = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (p < P->end && *p >= '0' && *p <= '9') {
        unsigned d = *p - '0';
        if (x > (limit - d) / 10)
            return err_set(P->err, "%s: %s: a number in %s at byte %zu does not fit in 64 bits",
                           P->path, P->ctx, what, pos(P));
        x = x * 10 + d;
        p++;
    }
    if (p < P->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return err_set(P->err,
                       "%s: %s: %s must hold integers, found a fraction or exponent at byte %zu",
                       P->path, P->ctx, what, pos(P));
    P->p = p;
    *v = neg ? (int64_t)(0 - x) : (int64_t)x;  // two's complement: -2^63 maps exactly
    return 0;
}

// Parses [i, j, ...] into out[0..cap); *n is the number of integers (may exceed cap:
// the extra ones are parsed and counted but not stored). Negative values are errors.
static int parse_int_array(Parser *P, int64_t *out, int cap, int *n, const char *what) {
    skip_ws(P);
    if (P->p >= P->end || *P->p != '[')
        return err_set(P->err, "%s: %s: %s must be an array of integers, found %s at byte %zu",
                       P->path, P->ctx, what, value_kind(P), pos(P));
    P->p++;
    *n = 0;
    skip_ws(P);
    if (P->p < P->end && *P->p == ']') {
        P->p++;
        return 0;
    }
    for (;;) {
        int64_t v = 0;
        if (parse_int(P, &v, what)) return -1;
        if (v < 0)
            return err_set(P->err, "%s: %s: %s[%d] is %" PRId64 "; it must not be negative",
                           P->path, P->ctx, what, *n, v);
        if (*n < cap) out[*n] = v;
        if (*n == INT_MAX) return bad_string(P, "an array too long");
        (*n)++;
        skip_ws(P);
        if (P->p < P->end && *P->p == ',') {
            P->p++;
            continue;
        }
        return expect(P, ']', "',' or ']'");
    }
}

static int grow(Parser *P, void **arr, int *cap, int count, size_t elem) {
    if (count < *cap) return 0;
    if (*cap > INT_MAX / 2) return err_set(P->err, "%s: too many entries in the header", P->path);
    int ncap = *cap ? *cap * 2 : 16;
    void *q = realloc(*arr, (size_t)ncap * elem);
    if (!q)
        return err_set(P->err, "%s: out of memory reading the header (%d entries)", P->path, ncap);
    *arr = q;
    *cap = ncap;
    return 0;
}

// A tensor's object; name is already parsed.
static int parse_tensor(Parser *P, const char *name, size_t name_len) {
    StFile *f = P->f;
    if (name_len >= TENSOR_NAME_MAX)
        return err_set(P->err,
                       "%s: tensor '%.60s...' has a name of %zu bytes; names are limited to %d",
                       P->path, name, name_len, TENSOR_NAME_MAX - 1);
    if (grow(P, (void **)&f->entries, &P->cap_entries, f->count, sizeof *f->entries)) return -1;
    StEntry *e = &f->entries[f->count];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, name_len + 1);
    snprintf(P->ctx, sizeof P->ctx, "tensor '%s'", e->name);

    skip_ws(P);
    if (P->p >= P->end || *P->p != '{')
        return err_set(P->err,
                       "%s: tensor '%s': expected an object with dtype, shape and data_offsets, "
                       "found %s at byte %zu",
                       P->path, e->name, value_kind(P), pos(P));
    P->p++;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    int64_t off[2] = {0, 0};
    int noff = 0;
    skip_ws(P);
    if (P->p < P->end && *P->p == '}')
        P->p++;
    else
        for (;;) {
            size_t mark = P->used, klen, vlen;
            const char *key, *val;
            if (parse_string(P, &key, &klen, "a field name (dtype, shape or data_offsets)") ||
                expect(P, ':', "':'"))
                return -1;
            bool *seen = !strcmp(key, "dtype")          ? &have_dtype
                         : !strcmp(key, "shape")        ? &have_shape
                         : !strcmp(key, "data_offsets") ? &have_offsets
                                                        : NULL;
            if (!seen)
                return err_set(P->err,
                               "%s: tensor '%s': unknown field '%s'; a tensor has dtype, shape and "
                               "data_offsets only",
                               P->path, e->name, key);
            if (*seen)
                return err_set(P->err, "%s: tensor '%s': field '%s' appears twice", P->path,
                               e->name, key);
            *seen = true;
            if (seen == &have_dtype) {
                skip_ws(P);
                if (P->p >= P->end || *P->p != '"')
                    return err_set(P->err,
                                   "%s: tensor '%s': dtype must be a string such as \"F32\", found "
                                   "%s at byte %zu",
                                   P->path, e->name, value_kind(P), pos(P));
                if (parse_string(P, &val, &vlen, "a string")) return -1;
                int dt = -1;
                for (int i = 0; i < ST_DTYPE_COUNT; i++)
                    if (!strcmp(val, st_dtype_names[i])) dt = i;
                if (dt < 0)
                    return err_set(
                        P->err,
                        "%s: tensor '%s': unknown dtype '%.40s'; safetensors dtypes are BOOL, "
                        "U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, "
                        "U64",
                        P->path, e->name, val);
                e->dtype = (StDType)dt;
            } else if (seen == &have_shape) {
                if (parse_int_array(P, e->shape, TENSOR_MAX_DIMS, &e->ndim, "shape")) return -1;
                if (e->ndim > TENSOR_MAX_DIMS)
                    return err_set(P->err,
                                   "%s: tensor '%s' has %d dimensions; cnn.c supports at most %d",
                                   P->path, e->name, e->ndim, TENSOR_MAX_DIMS);
            } else {
                if (parse_int_array(P, off, 2, &noff, "data_offsets")) return -1;
                if (noff != 2)
                    return err_set(
                        P->err,
                        "%s: tensor '%s': data_offsets must be [begin, end], found %d value%s",
                        P->path, e->name, noff, noff == 1 ? "" : "s");
            }
            P->used = mark;  // field names and the dtype string are not kept
            skip_ws(P);
            if (P->p < P->end && *P->p == ',') {
                P->p++;
                continue;
            }
            if (expect(P, '}', "',' or '}'")) return -1;
            break;
        }
    const char *missing = !have_dtype     ? "dtype"
                          : !have_shape   ? "shape"
                          : !have_offsets ? "data_offsets"
                                          : NULL;
    if (missing) return err_set(P->err, "%s: tensor '%s' has no %s", P->path, e->name, missing);

    // The bytes the dtype and shape need, without overflow.
    char sb[160];
    uint64_t numel = 1, size = st_dtype_sizes[e->dtype], need;
    bool zero = false, overflow = false;
    for (int i = 0; i < e->ndim; i++) zero |= e->shape[i] == 0;
    for (int i = 0; i < e->ndim && !zero; i++) {
        uint64_t d = (uint64_t)e->shape[i];
        if (numel > UINT64_MAX / d)
            overflow = true;
        else
            numel *= d;
    }
    if (zero) numel = 0;
    if (overflow || numel > UINT64_MAX / size || numel > (uint64_t)INT64_MAX)
        return err_set(P->err, "%s: tensor '%s': %s %s has more elements than fit in 64 bits",
                       P->path, e->name, st_dtype_names[e->dtype],
                       shape_str(sb, sizeof sb, e->shape, e->ndim));
    need = numel * size;
    if (off[0] > off[1])
        return err_set(P->err,
                       "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                       "] end before they begin",
                       P->path, e->name, off[0], off[1]);
    uint64_t have = (uint64_t)(off[1] - off[0]);
    if (have != need)
        return err_set(P->err,
                       "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRIu64
                       " bytes but %s %s needs %" PRIu64,
                       P->path, e->name, off[0], off[1], have, st_dtype_names[e->dtype],
                       shape_str(sb, sizeof sb, e->shape, e->ndim), need);
    if ((uint64_t)off[1] > P->data_bytes)
        return err_set(
            P->err,
            "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] reach past the data "
            "section, which holds %zu bytes; the file is truncated or its header is corrupt",
            P->path, e->name, off[0], off[1], P->data_bytes);
    e->offset = (size_t)off[0];
    e->bytes = (size_t)have;
    e->data = P->data + e->offset;
    f->count++;
    return 0;
}

static int parse_metadata(Parser *P) {
    StFile *f = P->f;
    snprintf(P->ctx, sizeof P->ctx, "__metadata__");
    skip_ws(P);
    if (P->p >= P->end || *P->p != '{')
        return err_set(P->err,
                       "%s: __metadata__ must be an object of strings, found %s at byte %zu",
                       P->path, value_kind(P), pos(P));
    P->p++;
    skip_ws(P);
    if (P->p < P->end && *P->p == '}') {
        P->p++;
        return 0;
    }
    for (;;) {
        const char *key, *val;
        size_t klen, vlen;
        if (parse_string(P, &key, &klen, "a metadata key (a string)") || expect(P, ':', "':'"))
            return -1;
        skip_ws(P);
        if (P->p >= P->end || *P->p != '"')
            return err_set(
                P->err,
                "%s: __metadata__ key '%s': the value must be a string, found %s at byte %zu",
                P->path, key, value_kind(P), pos(P));
        if (parse_string(P, &val, &vlen, "a string")) return -1;
        if (grow(P, (void **)&f->meta, &P->cap_meta, f->nmeta, sizeof *f->meta)) return -1;
        f->meta[f->nmeta++] = (StMeta){key, val};
        skip_ws(P);
        if (P->p < P->end && *P->p == ',') {
            P->p++;
            continue;
        }
        return expect(P, '}', "',' or '}'");
    }
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const StEntry *)a)->name, ((const StEntry *)b)->name);
}
static int cmp_meta_key(const void *a, const void *b) {
    return strcmp(((const StMeta *)a)->key, ((const StMeta *)b)->key);
}
// Entries by data_offsets (qsort has no context argument, so the keys travel along).
typedef struct Span {
    size_t offset, bytes;
    int index;
} Span;
static int cmp_span(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? -1 : 1;
    return 0;
}

// The tensors must tile the data section: sorted by offset, each starts where the
// previous one ends, and the last ends at the end of the data.
static int check_tiling(const StFile *f, size_t data_bytes, Error *err) {
    if (!f->count) {
        if (data_bytes)
            return err_set(err,
                           "%s: the header lists no tensors but %zu bytes of data follow it; the "
                           "file is corrupt",
                           f->path, data_bytes);
        return 0;
    }
    Span *order = malloc((size_t)f->count * sizeof *order);
    if (!order) return err_set(err, "%s: out of memory checking %d tensors", f->path, f->count);
    for (int i = 0; i < f->count; i++)
        order[i] = (Span){f->entries[i].offset, f->entries[i].bytes, i};
    qsort(order, (size_t)f->count, sizeof *order, cmp_span);
    size_t cursor = 0;
    const StEntry *prev = NULL;
    int rc = 0;
    for (int i = 0; i < f->count && !rc; i++) {
        const StEntry *e = &f->entries[order[i].index];
        if (e->offset < cursor)
            rc = err_set(
                err,
                "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap in the data section; "
                "the header is corrupt",
                f->path, prev->name, prev->offset, prev->offset + prev->bytes, e->name, e->offset,
                e->offset + e->bytes);
        else if (e->offset > cursor)
            rc = err_set(
                err,
                "%s: bytes [%zu, %zu) of the data section belong to no tensor (before '%s'); "
                "safetensors requires tensors packed back to back, so the header is corrupt",
                f->path, cursor, e->offset, e->name);
        cursor = e->offset + e->bytes;
        prev = e;
    }
    if (!rc && cursor != data_bytes)
        rc = err_set(err,
                     "%s: the tensors end at byte %zu of the data section but it holds %zu bytes; "
                     "the file has trailing bytes or its header is corrupt",
                     f->path, cursor, data_bytes);
    free(order);
    return rc;
}

static int check_size(const char *path, size_t size, Error *err) {
    if (size == 0)
        return err_set(
            err,
            "%s: the file is empty; a safetensors file starts with an 8-byte header length "
            "(an interrupted write or copy?)",
            path);
    if (size < 8)
        return err_set(err,
                       "%s: the file is %zu bytes, too short for the 8-byte header length; "
                       "it is truncated or not a safetensors file",
                       path, size);
    return 0;
}

// Whether buf is what torch.save writes, a zip archive (PyTorch 1.6 and later) or a pickle
// (older ones: protocol 2, then its magic number as a long); if so, err says so and how to
// convert it. Asked only of a file that is not valid safetensors (the bytes of a valid
// header length may look alike).
static bool torch_file(const StFile *f, const unsigned char *buf, size_t size, Error *err) {
    const bool zip = size >= 4 && !memcmp(buf, "PK\x03\x04", 4);
    const bool pickle = size >= 3 && buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5 && buf[2] == 0x8a;
    if (!zip && !pickle) return false;
    err_set(err,
            "%s is a PyTorch file (torch.save's %s), not safetensors; convert it once in "
            "Python: from safetensors.torch import save_file; save_file(torch.load('%s', "
            "map_location='cpu'), 'weights.safetensors') (a checkpoint dict: its state_dict "
            "entry; without the safetensors package, bench/st_torch.py writes the file with "
            "torch alone)",
            f->path, zip ? "zip archive" : "pickle", f->path);
    return true;
}

// Validates buf[0..size) and fills f (whose path is set). On error the caller closes f.
static int parse_file(StFile *f, const unsigned char *buf, size_t size, Error *err) {
    if (check_size(f->path, size, err)) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    if ((n > ST_MAX_HEADER || n > size - 8) && torch_file(f, buf, size, err)) return -1;
    if (n > ST_MAX_HEADER)
        return err_set(err,
                       "%s: the header length is %" PRIu64 " bytes, more than the 100 MB limit; "
                       "the file is corrupt or not a safetensors file",
                       f->path, n);
    if (n > size - 8)
        return err_set(err,
                       "%s: the header length %" PRIu64
                       " reaches past the end of the file (%zu bytes); "
                       "the file is truncated or not a safetensors file",
                       f->path, n, size);
    f->file_bytes = size;
    f->header_bytes = (size_t)n;
    Parser P = {.s = buf + 8,
                .p = buf + 8,
                .end = buf + 8 + n,
                .data = buf + 8 + n,
                .data_bytes = size - 8 - (size_t)n,
                .path = f->path,
                .f = f,
                .err = err};
    snprintf(P.ctx, sizeof P.ctx, "the header object");
    if ((n == 0 || buf[8] != '{') && torch_file(f, buf, size, err)) return -1;
    if (n == 0 || buf[8] != '{')
        return err_set(
            err,
            "%s: the header does not start with '{'; the file is corrupt or not a safetensors file",
            f->path);
    f->strings = P.arena = malloc((size_t)n + 1);
    if (!P.arena)
        return err_set(err, "%s: out of memory for a header of %" PRIu64 " bytes", f->path, n);

    P.p++;
    skip_ws(&P);
    bool have_meta = false;
    if (P.p < P.end && *P.p == '}')
        P.p++;
    else
        for (;;) {
            const char *key;
            size_t klen, mark = P.used;
            snprintf(P.ctx, sizeof P.ctx, "the header object");
            if (parse_string(&P, &key, &klen, "a tensor name (a string)") || expect(&P, ':', "':'"))
                return -1;
            if (!strcmp(key, "__metadata__")) {
                if (have_meta)
                    return err_set(err, "%s: __metadata__ appears twice in the header", f->path);
                have_meta = true;
                P.used = mark;
                if (parse_metadata(&P)) return -1;
            } else {
                if (parse_tensor(&P, key, klen)) return -1;
                P.used = mark;  // the name lives in the entry
            }
            snprintf(P.ctx, sizeof P.ctx, "the header object");
            skip_ws(&P);
            if (P.p < P.end && *P.p == ',') {
                P.p++;
                continue;
            }
            if (expect(&P, '}', "',' or '}'")) return -1;
            break;
        }
    skip_ws(&P);  // the padding
    if (P.p != P.end) {
        char b[32];
        return err_set(err,
                       "%s: the header has garbage after its JSON object at byte %zu (%s); "
                       "only spaces may pad it; the file is corrupt",
                       f->path, pos(&P), found(&P, b, sizeof b));
    }

    if (f->count > 1) qsort(f->entries, (size_t)f->count, sizeof *f->entries, cmp_entry_name);
    for (int i = 1; i < f->count; i++)
        if (!strcmp(f->entries[i - 1].name, f->entries[i].name))
            return err_set(err, "%s: tensor '%s' appears twice in the header; the file is corrupt",
                           f->path, f->entries[i].name);
    if (f->nmeta > 1) qsort(f->meta, (size_t)f->nmeta, sizeof *f->meta, cmp_meta_key);
    for (int i = 1; i < f->nmeta; i++)
        if (!strcmp(f->meta[i - 1].key, f->meta[i].key))
            return err_set(
                err, "%s: __metadata__ key '%s' appears twice in the header; the file is corrupt",
                f->path, f->meta[i].key);
    return check_tiling(f, P.data_bytes, err);
}

int st_open_buffer(StFile *f, const void *buf, size_t size, const char *name, Error *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(name ? name : "<buffer>");
    if (!f->path) return err_set(err, "%s: out of memory", name ? name : "<buffer>");
    if (size && !buf) {
        st_close(f);
        return err_set(err, "%s: st_open_buffer given NULL data", name ? name : "<buffer>");
    }
    if (parse_file(f, buf, size, err)) {
        st_close(f);
        return -1;
    }
    return 0;
}

int st_open(StFile *f, const char *path, Error *err) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return err_set(err, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, "'%s' is not a regular file; expected a .safetensors file", path);
    }
    size_t size = (size_t)st.st_size;
    if (check_size(path, size, err)) {
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);  // the mapping keeps the file open
    if (map == MAP_FAILED)
        return err_set(err, "cannot map '%s' (%zu bytes) into memory: %s", path, size, strerror(e));
    f->path = strdup(path);
    f->map = map;
    f->file_bytes = size;
    if (!f->path) {
        st_close(f);
        return err_set(err, "%s: out of memory", path);
    }
    if (parse_file(f, map, size, err)) {
        st_close(f);
        return -1;
    }
    return 0;
}

void st_close(StFile *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->file_bytes);
    free(f->entries);
    free(f->meta);
    free(f->strings);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const StEntry *st_find(const StFile *f, const char *name) {
    int lo = 0, hi = f->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->entries[mid].name, name);
        if (!c) return &f->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    int lo = 0, hi = f->nmeta - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->meta[mid].key, key);
        if (!c) return f->meta[mid].value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

// ---- conversions -----------------------------------------------------------------------

// IEEE half -> float, exact for every value (subnormals, inf, NaN payloads).
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = h >> 10 & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F)
        bits = sign | 0x7F800000 | man << 13;
    else if (exp)
        bits = sign | (exp + 112) << 23 | man << 13;
    else if (!man)
        bits = sign;
    else {  // subnormal: man * 2^-24; normalise so the leading 1 is bit 10
        uint32_t shift = 0;
        while (!(man & 0x400)) man <<= 1, shift++;
        bits = sign | (113 - shift) << 23 | (man & 0x3FF) << 13;
    }
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

int st_to_f32(const StFile *f, const StEntry *e, float *dst, Error *err) {
    int64_t n = st_numel(e);
    const unsigned char *src = e->data;
    switch (e->dtype) {
    case ST_F32:
        if (n) memcpy(dst, src, e->bytes);
        return 0;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    case ST_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return err_set(err, "%s: tensor '%s' is %s; only F32, F16, BF16 and F64 convert to float",
                       f->path, e->name, st_dtype_names[e->dtype]);
    }
}

int st_as_tensor(const StFile *f, const StEntry *e, Tensor *out, Error *err) {
    int dt = to_dtype(e->dtype);
    if (dt < 0)
        return err_set(
            err, "%s: tensor '%s' is %s, which cnn.c tensors cannot hold (F32, F16, I64, I32, U8, BF16)",
            f->path, e->name, st_dtype_names[e->dtype]);
    memset(out, 0, sizeof *out);
    memcpy(out->name, e->name, sizeof out->name);
    out->dtype = (DType)dt;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->data = (void *)e->data;  // read-only mapping: see the contract
    return 0;
}

int st_read_tensor(const StFile *f, const Tensor *dst, Error *err) {
    const StEntry *e = st_find(f, dst->name);
    char a[160], b[160];
    if (!e) return err_set(err, "%s: no tensor '%s' in the file", f->path, dst->name);
    bool same = e->ndim == dst->ndim;
    for (int i = 0; same && i < e->ndim; i++) same = e->shape[i] == dst->shape[i];
    StDType want = st_dtype_from(dst->dtype);
    bool convert =
        dst->dtype == DT_F32 && (e->dtype == ST_F16 || e->dtype == ST_BF16 || e->dtype == ST_F64);
    if (!same || (e->dtype != want && !convert))
        return err_set(err, "%s: tensor '%s' is %s %s but %s %s is expected", f->path, e->name,
                       st_dtype_names[e->dtype], shape_str(a, sizeof a, e->shape, e->ndim),
                       st_dtype_names[want], shape_str(b, sizeof b, dst->shape, dst->ndim));
    if (e->dtype == want) {
        if (e->bytes) memcpy(dst->data, e->data, e->bytes);
        return 0;
    }
    return st_to_f32(f, e, dst->data, err);
}

// ---- the writer ------------------------------------------------------------------------

typedef struct Buf {
    char *s;
    size_t n, cap;
    bool oom;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *q = realloc(b->s, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->s = q;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

// A JSON string as serde_json writes it: '"' and '\\' escaped, control characters as
// \b \t \n \f \r or \u00xx; everything else (UTF-8 included) raw.
static void buf_json_string(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"')
            buf_put(b, "\\\"", 2);
        else if (*p == '\\')
            buf_put(b, "\\\\", 2);
        else if (*p == '\b')
            buf_put(b, "\\b", 2);
        else if (*p == '\t')
            buf_put(b, "\\t", 2);
        else if (*p == '\n')
            buf_put(b, "\\n", 2);
        else if (*p == '\f')
            buf_put(b, "\\f", 2);
        else if (*p == '\r')
            buf_put(b, "\\r", 2);
        else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            buf_put(b, esc, 6);
        } else
            buf_put(b, (const char *)p, 1);
    }
    buf_put(b, "\"", 1);
}

// A tensor's place in the file: largest alignment (StDType rank) first, then by name,
// the reference writer's order.
typedef struct Slot {
    int rank;
    const char *name;
    int index;
} Slot;
static int cmp_slot(const void *a, const void *b) {
    const Slot *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}
static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Checks one tensor for writing; its byte count goes to *bytes.
static int check_tensor(const char *path, const Tensor *x, int i, size_t *bytes, Error *err) {
    if (!memchr(x->name, '\0', sizeof x->name))
        return err_set(err,
                       "cannot write '%s': tensor %d's name is not NUL-terminated within %d bytes",
                       path, i, TENSOR_NAME_MAX);
    if (!utf8_valid(x->name))
        return err_set(err, "cannot write '%s': tensor '%s': the name is not valid UTF-8", path,
                       x->name);
    if (!strcmp(x->name, "__metadata__"))
        return err_set(err, "cannot write '%s': a tensor cannot be named __metadata__", path);
    if ((unsigned)x->dtype >= DT_COUNT)
        return err_set(err, "cannot write '%s': tensor '%s' has an invalid dtype %d", path, x->name,
                       (int)x->dtype);
    if (x->ndim < 0 || x->ndim > TENSOR_MAX_DIMS)
        return err_set(err, "cannot write '%s': tensor '%s' has %d dimensions; 0 to %d are allowed",
                       path, x->name, x->ndim, TENSOR_MAX_DIMS);
    uint64_t numel = 1;
    bool zero = false, overflow = false;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] < 0)
            return err_set(err, "cannot write '%s': tensor '%s' has a negative dimension %" PRId64,
                           path, x->name, x->shape[d]);
        zero |= x->shape[d] == 0;
    }
    for (int d = 0; d < x->ndim && !zero; d++) {
        uint64_t dim = (uint64_t)x->shape[d];
        if (numel > UINT64_MAX / dim)
            overflow = true;
        else
            numel *= dim;
    }
    if (zero) numel = 0;
    size_t es = dtype_sizes[x->dtype];
    if (overflow || numel > SIZE_MAX / es || numel > (uint64_t)INT64_MAX)
        return err_set(err, "cannot write '%s': tensor '%s' is too large to address", path,
                       x->name);
    *bytes = (size_t)numel * es;
    if (*bytes && !x->data)
        return err_set(err, "cannot write '%s': tensor '%s' has no data", path, x->name);
    return 0;
}

// Checks the tensors and metadata and builds the padded header in b. order[0..n) gets
// the tensors' indices in file order, sizes[i] tensor i's bytes. Messages name path.
static int build_header(Buf *b, int *order, size_t *sizes, const char *path, const Tensor *t, int n,
                        const char *const *keys, const char *const *values, int nmeta, Error *err) {
    int rc = -1;
    Slot *slots = malloc((size_t)(n ? n : 1) * sizeof *slots);
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    StMeta *meta = malloc((size_t)(nmeta ? nmeta : 1) * sizeof *meta);
    if (!slots || !names || !meta) {
        err_set(err, "cannot write '%s': out of memory", path);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (check_tensor(path, &t[i], i, &sizes[i], err)) goto done;
        slots[i] = (Slot){(int)st_dtype_from(t[i].dtype), t[i].name, i};
        names[i] = t[i].name;
    }
    // Duplicates: sorted by name alone (in file order equal names would be adjacent only
    // when their dtypes match).
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) {
            err_set(err, "cannot write '%s': two tensors are named '%s'", path, names[i]);
            goto done;
        }
    if (n > 1) qsort(slots, (size_t)n, sizeof *slots, cmp_slot);
    for (int i = 0; i < n; i++) order[i] = slots[i].index;

    for (int i = 0; i < nmeta; i++) {
        const char *bad = !keys[i]                 ? "a NULL key"
                          : !values[i]             ? "a NULL value"
                          : !utf8_valid(keys[i])   ? "a key that is not valid UTF-8"
                          : !utf8_valid(values[i]) ? "a value that is not valid UTF-8"
                                                   : NULL;
        if (bad) {
            err_set(err, "cannot write '%s': metadata entry %d has %s", path, i, bad);
            goto done;
        }
        meta[i] = (StMeta){keys[i], values[i]};
    }
    if (nmeta > 1) qsort(meta, (size_t)nmeta, sizeof *meta, cmp_meta_key);
    for (int i = 1; i < nmeta; i++)
        if (!strcmp(meta[i - 1].key, meta[i].key)) {
            err_set(err, "cannot write '%s': metadata key '%s' is given twice", path, meta[i].key);
            goto done;
        }

    buf_str(b, "{");
    if (nmeta > 0) {
        buf_str(b, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i) buf_str(b, ",");
            buf_json_string(b, meta[i].key);
            buf_str(b, ":");
            buf_json_string(b, meta[i].value);
        }
        buf_str(b, "}");
    }
    uint64_t offset = 0;
    for (int k = 0; k < n; k++) {
        const Tensor *x = &t[order[k]];
        char num[64];
        if (k || nmeta > 0) buf_str(b, ",");
        buf_json_string(b, x->name);
        buf_str(b, ":{\"dtype\":\"");
        buf_str(b, dtype_names[x->dtype]);
        buf_str(b, "\",\"shape\":[");
        for (int d = 0; d < x->ndim; d++) {
            snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", x->shape[d]);
            buf_str(b, num);
        }
        uint64_t end = offset + sizes[order[k]];
        if (end < offset) {
            err_set(err, "cannot write '%s': the tensors add up to more than 2^64 bytes", path);
            goto done;
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, end);
        buf_str(b, num);
        offset = end;
    }
    buf_str(b, "}");
    while ((8 + b->n) % 8) buf_str(b, " ");
    if (b->oom)
        err_set(err, "cannot write '%s': out of memory building the header", path);
    else if (b->n > ST_MAX_HEADER)
        err_set(err,
                "cannot write '%s': the header would be %zu bytes, over the 100 MB limit "
                "(too many tensors or too much metadata)",
                path, b->n);
    else
        rc = 0;
done:
    free(slots);
    free(names);
    free(meta);
    return rc;
}

static int write_all(FILE *fp, const void *p, size_t n) {
    return n && fwrite(p, 1, n, fp) != n ? -1 : 0;
}

// What st_write puts in the file, in order: the header's length, the header, the data.
typedef struct StBody {
    const Buf *header;
    const Tensor *tensors;
    const int *order;
    const size_t *sizes;
    int n;
} StBody;

static int write_body(FILE *fp, void *arg) {
    const StBody *b = arg;
    unsigned char len8[8];
    const uint64_t hn = b->header->n;
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hn >> 8 * i);
    if (write_all(fp, len8, 8) || write_all(fp, b->header->s, b->header->n)) return -1;
    for (int k = 0; k < b->n; k++)
        if (write_all(fp, b->tensors[b->order[k]].data, b->sizes[b->order[k]])) return -1;
    return 0;
}

int st_write(const char *path, const Tensor *tensors, int n, const char *const *meta_keys,
             const char *const *meta_values, int nmeta, Error *err) {
    if (n < 0 || nmeta < 0 || (n && !tensors) || (nmeta && (!meta_keys || !meta_values)))
        return err_set(err, "cannot write '%s': st_write given %d tensors and %d metadata pairs",
                       path, n, nmeta);
    Buf b = {0};
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    size_t *sizes = malloc((size_t)(n ? n : 1) * sizeof *sizes);
    int rc = -1;
    if (!order || !sizes) {
        err_set(err, "cannot write '%s': out of memory", path);
        goto done;
    }
    if (build_header(&b, order, sizes, path, tensors, n, meta_keys, meta_values, nmeta, err))
        goto done;
    StBody body = {&b, tensors, order, sizes, n};
    rc = file_write_atomic(path, write_body, &body, err);
done:
    free(order);
    free(sizes);
    free(b.s);
    return rc;
}
