// Command-line flags in llm.c's style: "-x 100 -l 3e-4". A trainer lists its flags in a table with
// the range each value must lie in; an unknown flag, a missing value, a value that does not parse,
// an integer that would not fit an int (no silent wrap: 4294967298 is not 2), a float that is not
// finite, or a value outside its range prints what was expected and stops, before any work.
// An "enum" such as -shuffle 0|1 is an integer whose range holds exactly its values.
#ifndef LLMC_ARGS_H
#define LLMC_ARGS_H

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include "utils.h"

typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING } ArgType;

typedef struct {
    const char* flag;  // "-x"
    ArgType type;
    void* value;       // int*, float* or const char**
    double min, max;   // allowed range, both ends included (ignored for strings)
    const char* help;
} ArgSpec;

#define ARG_NO_MAX 1e300  // "no upper bound" beyond what the type holds

static inline void args_format_range(const ArgSpec* s, char* out, size_t cap) {
    if (s->type == ARG_STRING) { out[0] = '\0'; return; }
    const char* fmt = s->type == ARG_INT ? "%.0f" : "%g";
    char lo[24], hi[24];
    snprintf(lo, sizeof(lo), fmt, s->min);
    snprintf(hi, sizeof(hi), fmt, s->max);
    if (s->max >= ARG_NO_MAX) snprintf(out, cap, ">= %s", lo);
    else if (s->type == ARG_INT && s->max - s->min <= 3) {  // a small enum: list its values
        size_t len = 0;
        for (int v = (int)s->min; v <= (int)s->max; v++) len += (size_t)snprintf(out + len, cap - len, "%s%d", len ? "|" : "", v);
    } else snprintf(out, cap, "%s..%s", lo, hi);
}

// to stdout when asked for (-h, --help: it can be piped to less), to stderr before an error
static inline void args_print_usage(FILE* out, const char* program, const ArgSpec* specs, int n) {
    fprintf(out, "usage: %s [flags]\n", program);
    for (int i = 0; i < n; i++) {
        char current[64], range[80];
        if (specs[i].type == ARG_INT) snprintf(current, sizeof(current), "%d", *(int*)specs[i].value);
        if (specs[i].type == ARG_FLOAT) snprintf(current, sizeof(current), "%g", *(float*)specs[i].value);
        if (specs[i].type == ARG_STRING) {
            const char* s = *(const char**)specs[i].value;
            snprintf(current, sizeof(current), "%s", s ? s : "(none)");
        }
        args_format_range(&specs[i], range, sizeof(range));
        fprintf(out, "  %-12s %s (default: %s%s%s)\n", specs[i].flag, specs[i].help, current,
                range[0] ? "; allowed: " : "", range);
    }
}

// returns 0 when the usage was asked for (-h, -help or --help: printed), 1 otherwise
static inline int args_parse(int argc, char** argv, const ArgSpec* specs, int n) {
    for (int i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-help") == 0 || strcmp(argv[i], "-h") == 0) {
            args_print_usage(stdout, argv[0], specs, n);
            return 0;
        }
        const ArgSpec* spec = NULL;
        for (int j = 0; j < n; j++) {
            if (strcmp(argv[i], specs[j].flag) == 0) spec = &specs[j];
        }
        if (spec == NULL) {
            args_print_usage(stderr, argv[0], specs, n);
            fail("unknown flag '%s' (see the list above)", argv[i]);
        }
        if (i + 1 >= argc) fail("flag '%s' needs a value: %s", argv[i], spec->help);
        const char* text = argv[i + 1];
        char* end = NULL;
        char range[80];
        args_format_range(spec, range, sizeof(range));
        if (spec->type == ARG_INT) {
            // parsed as 64 bits first, so a value past INT_MAX is reported instead of wrapped
            errno = 0;
            long long v = strtoll(text, &end, 10);
            if (*text == '\0' || *end != '\0') fail("flag '%s' expects an integer, got '%s'", argv[i], text);
            if (errno == ERANGE || v < INT_MIN || v > INT_MAX) {
                fail("flag '%s' is %s, which does not fit a 32-bit int (at most %d)", argv[i], text, INT_MAX);
            }
            if (v < spec->min || v > spec->max) {
                fail("flag '%s' is %s, outside its allowed range %s: %s", argv[i], text, range, spec->help);
            }
            *(int*)spec->value = (int)v;
        } else if (spec->type == ARG_FLOAT) {
            // nan and inf parse as numbers; they would train silently on non-finite weights
            double v = strtod(text, &end);
            if (*text == '\0' || *end != '\0') fail("flag '%s' expects a number, got '%s'", argv[i], text);
            if (!isfinite(v) || !isfinite((float)v) || (v != 0.0 && (float)v == 0.0f)) {
                fail("flag '%s' is %s: expected a finite number that fits a float (magnitude "
                     "between 1e-45 and 3.4e38, or 0)", argv[i], text);
            }
            if (v < spec->min || v > spec->max) {
                fail("flag '%s' is %s, outside its allowed range %s: %s", argv[i], text, range, spec->help);
            }
            *(float*)spec->value = (float)v;
        } else {
            *(const char**)spec->value = text;
        }
    }
    return 1;
}

#endif
