// json.h: JSON text for the trainer's outputs (--json, metrics.jsonl).
#ifndef CLI_JSON_H
#define CLI_JSON_H

#include <stdio.h>

// s as a JSON string, quotes included (class names and paths may hold quotes, backslashes
// and control characters).
static inline void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

#endif
