// cfg.h: the cfg file of DESIGN.md: INI sections in order, `#` comments, key = value.
//
//     [train]            # sections keep their order; layer sections may repeat
//     epochs = 14        # a comment may follow a value
//
// The parser knows no keys: it keeps every section and entry with its line number.
// The consumers (trainer, loader, layers) read values through the typed getters below,
// which check the value and name the file, line and key when it is bad. Each consumer
// declares its keys in a CfgKey table; cfg_check_keys rejects keys outside the table,
// and the same tables print `./train --help`.
#ifndef NN_CFG_H
#define NN_CFG_H

#include <stdint.h>
#include <stdio.h>

#include "error.h"

typedef struct CfgEntry {
    char *key;
    char *value;
    int line;  // 1-based line in the file; 0 for a command-line override
} CfgEntry;

typedef struct CfgSection {
    char *name;  // without brackets: "train", "conv", ...
    int line;    // line of the [header]; 0 if created by an override
    CfgEntry *entries;
    int nentries;
} CfgSection;

typedef struct Cfg {
    char *path;  // for messages; "<string>" when parsed from memory
    CfgSection *sections;
    int nsections;
} Cfg;

// Documentation and validation of one key of a section.
typedef struct CfgKey {
    const char *key;
    const char *def;   // default as text; NULL = required
    const char *help;  // one line for --help
} CfgKey;

// A cfg holds at most CFG_MAX_SECTIONS sections of at most CFG_MAX_KEYS keys each: far
// beyond any network's (a ResNet-152 written out layer by layer is a few hundred sections;
// [train] knows 56 keys), and few enough that a checkpoint's stored cfg, from anywhere, is
// parsed and its layers named in seconds: layer_section_name walks the sections before each
// layer, and the parser compares a key with those before it in its section (unbounded,
// `./ckpt rename` took 227 s over 40,000 sections and 83 s over 100,000 keys in one
// section; 9,000 sections now take 2 s).
#define CFG_MAX_SECTIONS 10000
#define CFG_MAX_KEYS 256

// Parses text; path is used in messages only. On error cfg is left empty.
// Errors: a line that is neither a [section], a key = value nor a comment; a key
// before the first section; an empty key; a duplicate key within one section; more
// sections or keys than the limits above.
int cfg_parse(Cfg *cfg, const char *text, const char *path, Error *err);
// Reads and parses a file (error if it cannot be read).
int cfg_load(Cfg *cfg, const char *path, Error *err);
void cfg_free(Cfg *cfg);

// Writes the cfg back as text (sections in order, one key = value a line): the exact
// configuration a checkpoint stores. Returns a malloc'd string or NULL with err.
char *cfg_to_text(const Cfg *cfg, Error *err);

// The first section with this name, or NULL.
CfgSection *cfg_section(const Cfg *cfg, const char *name);
// The entry for key in s, or NULL.
CfgEntry *cfg_entry(const CfgSection *s, const char *key);

// Sets key = value in s, replacing an existing entry or appending one (line 0). Keys are
// letters, digits and '_'. It may move s's entries and frees a replaced value: pointers
// from earlier cfg_entry/cfg_str calls on s are invalid afterwards.
int cfg_set(CfgSection *s, const char *key, const char *value, Error *err);

// Removes key from s (the key takes its default again); nothing if s has no such key.
// Like cfg_set, it moves s's entries.
void cfg_unset(CfgSection *s, const char *key);

// Errors if s holds a key not in keys[0..nkeys): "FILE:LINE: unknown key 'k' in
// [section]; known keys: a, b, c".
int cfg_check_keys(const Cfg *cfg, const CfgSection *s, const CfgKey *keys, int nkeys, Error *err);

// Typed getters. def == NULL means the key is required (missing -> error naming the
// section and its line). A value that does not parse or lies outside [lo, hi] is an
// error: "FILE:LINE: [train] key 'batch' = 'abc': expected an integer in [1, 1048576]".
int cfg_int(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
            int64_t lo, int64_t hi, int64_t *out, Error *err);
int cfg_float(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
              double lo, double hi, double *out, Error *err);
// Returns a pointer to the stored string (owned by cfg) or to def.
int cfg_str(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
            const char **out, Error *err);
// The value must be one of choices[0..nchoices); *out is its index.
int cfg_choice(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
               const char *const *choices, int nchoices, int *out, Error *err);
// A list of floats separated by commas ("0.5, 0.5, 0.5"): 1..max values.
int cfg_floats(const Cfg *cfg, const CfgSection *s, const char *key, const char *def,
               double *out, int max, int *n, Error *err);

// Prints a CfgKey table for --help: "  key = default    help".
void cfg_print_keys(FILE *f, const char *section, const CfgKey *keys, int nkeys);

#endif
