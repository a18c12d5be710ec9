// Command-line flags in llm.c's style: "-x 100 -l 3e-4". A trainer lists its flags in a table;
// an unknown flag, a missing value or a value that does not parse prints the table and stops.
#ifndef LLMC_ARGS_H
#define LLMC_ARGS_H

#include <stdlib.h>
#include "utils.h"

typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING } ArgType;

typedef struct {
    const char* flag;  // "-x"
    ArgType type;
    void* value;       // int*, float* or const char**
    const char* help;
} ArgSpec;

static inline void args_print_usage(const char* program, const ArgSpec* specs, int n) {
    fprintf(stderr, "usage: %s [flags]\n", program);
    for (int i = 0; i < n; i++) {
        char current[64];
        if (specs[i].type == ARG_INT) snprintf(current, sizeof(current), "%d", *(int*)specs[i].value);
        if (specs[i].type == ARG_FLOAT) snprintf(current, sizeof(current), "%g", *(float*)specs[i].value);
        if (specs[i].type == ARG_STRING) {
            const char* s = *(const char**)specs[i].value;
            snprintf(current, sizeof(current), "%s", s ? s : "(none)");
        }
        fprintf(stderr, "  %-12s %s (default: %s)\n", specs[i].flag, specs[i].help, current);
    }
}

// returns 0 when --help was asked for (usage printed), 1 otherwise
static inline int args_parse(int argc, char** argv, const ArgSpec* specs, int n) {
    for (int i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--help") == 0) {
            args_print_usage(argv[0], specs, n);
            return 0;
        }
        const ArgSpec* spec = NULL;
        for (int j = 0; j < n; j++) {
            if (strcmp(argv[i], specs[j].flag) == 0) spec = &specs[j];
        }
        if (spec == NULL) {
            args_print_usage(argv[0], specs, n);
            fail("unknown flag '%s' (see the list above)", argv[i]);
        }
        if (i + 1 >= argc) fail("flag '%s' needs a value: %s", argv[i], spec->help);
        const char* text = argv[i + 1];
        char* end = NULL;
        if (spec->type == ARG_INT) {
            long v = strtol(text, &end, 10);
            if (*text == '\0' || *end != '\0') fail("flag '%s' expects an integer, got '%s'", argv[i], text);
            *(int*)spec->value = (int)v;
        } else if (spec->type == ARG_FLOAT) {
            float v = strtof(text, &end);
            if (*text == '\0' || *end != '\0') fail("flag '%s' expects a number, got '%s'", argv[i], text);
            *(float*)spec->value = v;
        } else {
            *(const char**)spec->value = text;
        }
    }
    return 1;
}

#endif
