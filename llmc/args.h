// Command-line flags in llm.c's style: "-x 100 -l 3e-4". A trainer lists its flags in a table with
// the range each value must lie in; an unknown flag, a missing value, a value that does not parse,
// an integer that would not fit an int (no silent wrap: 4294967298 is not 2), a float that is not
// finite, or a value outside its range prints what was expected and stops, before any work.
// An "enum" such as -shuffle 0|1 is an integer whose range holds exactly its values.
// Every rank parses the same command line before the ranks connect, so a flag error is printed
// once, by the launcher's rank 0, and every rank exits 1 (no MPI_Abort: MPI is not started yet).
// A flag that another trainer takes says which (args_flag_owners); --help prints the defaults.
#ifndef LLMC_ARGS_H
#define LLMC_ARGS_H

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include "utils.h"

// ARG_OUTPUT_FILE: a string that names a file the run writes (-dump_grads), checked with the flags
typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING, ARG_OUTPUT_FILE } ArgType;
static inline int args_is_string(ArgType t) { return t == ARG_STRING || t == ARG_OUTPUT_FILE; }

typedef struct {
    const char* flag;  // "-x"
    ArgType type;
    void* value;       // int*, float* or const char**
    double min, max;   // allowed range, both ends included (ignored for strings)
    const char* help;
} ArgSpec;

#define ARG_NO_MAX 1e300  // "no upper bound" beyond what the type holds

static inline void args_format_range(const ArgSpec* s, char* out, size_t cap) {
    if (args_is_string(s->type)) { out[0] = '\0'; return; }
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

// The flags only some trainers take, and which (the common flags of llmc/train.h are every
// trainer's): an unknown flag that another trainer takes says so. The test
// flag_owners_match_the_trainers checks this table against every trainer's --help.
typedef struct {
    const char* flag;
    const char* trainers;
    const char* note;  // said after them, or NULL
} ArgOwner;
static const ArgOwner args_flag_owners[] = {
    {"-z", "train_gpt2_dp and train_gpt2_3d", NULL},
    {"-overlap", "train_gpt2_dp", NULL},
    {"-offload", "train_gpt2_dp", NULL},
    {"-dump_logits", "train_gpt2_dp", NULL},
    {"-dump_grads", "train_gpt2_dp, train_gpt2_tp, train_gpt2_pp, train_gpt2_3d, train_gpt2_cp and train_gpt2_ep", NULL},
    {"-check_replicas", "train_gpt2_dp, train_gpt2_tp, train_gpt2_pp, train_gpt2_3d, train_gpt2_cp and train_gpt2_ep", NULL},
    {"-h", "train_gpt2_dp, train_gpt2_tp and train_gpt2_diloco", "(-h alone prints the usage)"},
    {"-hellaswag", "train_gpt2_dp, train_gpt2_tp and train_gpt2_diloco", NULL},
    {"-dp", "train_gpt2_3d", "(in train_gpt2_dp and train_gpt2_diloco the replicas are the ranks: mpirun -np N)"},
    {"-tp", "train_gpt2_tp and train_gpt2_3d", NULL},
    {"-sp", "train_gpt2_tp and train_gpt2_3d", NULL},
    {"-tp_overlap", "train_gpt2_tp and train_gpt2_3d", NULL},
    {"-tp_timeline", "train_gpt2_tp", NULL},
    {"-pp", "train_gpt2_pp and train_gpt2_3d", NULL},
    {"-sched", "train_gpt2_pp and train_gpt2_3d", NULL},
    {"-vp", "train_gpt2_pp and train_gpt2_3d", NULL},
    {"-timeline", "train_gpt2_pp and train_gpt2_3d", NULL},
    {"-pp_overlap", "train_gpt2_pp and train_gpt2_3d", NULL},
    {"-cp", "train_gpt2_cp and train_gpt2_3d", NULL},
    {"-cp_layout", "train_gpt2_cp and train_gpt2_3d", NULL},
    {"-cp_comm", "train_gpt2_cp and train_gpt2_3d", NULL},
    {"-workers", "train_gpt2_diloco", NULL},
    {"-H", "train_gpt2_diloco", NULL},
    {"-outer_lr", "train_gpt2_diloco", NULL},
    {"-outer_momentum", "train_gpt2_diloco", NULL},
    {"-fragments", "train_gpt2_diloco", NULL},
    {"-fragment_layout", "train_gpt2_diloco", NULL},
    {"-alpha", "train_gpt2_diloco", NULL},
    {"-tau", "train_gpt2_diloco", NULL},
    {"-outer_dtype", "train_gpt2_diloco", NULL},
    {"-dump_outer", "train_gpt2_diloco", NULL},
    {"-experts", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-topk", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-ep", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-balance", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-aux_alpha", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-bias_rate", "train_gpt2_ep and train_gpt2_3d", NULL},
    {"-capacity_factor", "train_gpt2_ep and train_gpt2_3d", NULL},
};
// llm.c's flags that this project does not have (DESIGN.md section 8 keeps their letters free)
static const char* args_llmc_only[] = {"-k", "-lg", "-nk", "-nm", "-a", "-f", "-w", "-ge", "-pn", "-pr", "-pg",
                                       "-pf", "-ps", "-pi"};

static inline const char* args_program_name(const char* argv0) {
    const char* slash = strrchr(argv0, '/');
    return slash ? slash + 1 : argv0;
}

// A flag error: the message and, with hint, a one-line pointer to --help, printed by the
// launcher's rank 0 only (every rank parses the same flags); every rank exits 1
static inline void args_fail(const char* program, int hint, const char* fmt, ...) {
    if (llmc_launcher_rank() == 0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "error: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        if (hint) fprintf(stderr, "run %s --help for every flag, its default and its range\n", program);
        fflush(stderr);
    }
    exit(1);
}

// the value a flag holds now, as text
static inline void args_format_value(const ArgSpec* s, char* out, size_t cap) {
    if (s->type == ARG_INT) snprintf(out, cap, "%d", *(int*)s->value);
    if (s->type == ARG_FLOAT) snprintf(out, cap, "%g", *(float*)s->value);
    if (args_is_string(s->type)) {
        const char* v = *(const char**)s->value;
        snprintf(out, cap, "%s", v ? v : "(none)");
    }
}

// to stdout when asked for (-h, --help: it can be piped to less); the values printed are the
// flags' current ones, so args_parse prints it before reading any flag: the defaults
static inline void args_print_usage(FILE* out, const char* program, const ArgSpec* specs, int n) {
    fprintf(out, "usage: %s [flags]\n", program);
    for (int i = 0; i < n; i++) {
        char current[64], range[80];
        args_format_value(&specs[i], current, sizeof(current));
        args_format_range(&specs[i], range, sizeof(range));
        fprintf(out, "  %-12s %s (default: %s%s%s)\n", specs[i].flag, specs[i].help, current,
                range[0] ? "; allowed: " : "", range);
    }
}

// argv[i] asks for the usage: --help, -help, or -h with no value after it (the last argument);
// -h with a value is llm.c's HellaSwag flag (-h 1, llmc/hellaswag.h), which some trainers take
static inline int args_is_help(int argc, char** argv, int i) {
    const char* a = argv[i];
    return strcmp(a, "--help") == 0 || strcmp(a, "-help") == 0 || (strcmp(a, "-h") == 0 && i + 1 == argc);
}

// why flag is not one of specs: another trainer's, llm.c's, or a double dash; "" when none of these
static inline void args_unknown_note(const char* flag, const char* program, const ArgSpec* specs, int n, char* out,
                                     size_t cap) {
    out[0] = '\0';
    if (strncmp(flag, "--", 2) == 0 && flag[2] != '\0') {  // --tp: -tp's note, or the one dash
        for (int j = 0; j < n; j++) {
            if (strcmp(flag + 1, specs[j].flag) == 0) {
                snprintf(out, cap, ": flags take one dash, as in llm.c: %s", specs[j].flag);
                return;
            }
        }
        args_unknown_note(flag + 1, program, specs, n, out, cap);
        size_t len = strlen(out);
        if (len == 0) snprintf(out, cap, ": flags take one dash, as in llm.c (-x for the steps, -i for the data, ...)");
        else snprintf(out + len, cap - len, " (and flags take one dash)");
        return;
    }
    for (size_t k = 0; k < sizeof(args_flag_owners) / sizeof(args_flag_owners[0]); k++) {
        if (strcmp(flag, args_flag_owners[k].flag) == 0) {
            const ArgOwner* o = &args_flag_owners[k];
            snprintf(out, cap, ": %s is a flag of %s, not of %s%s%s", flag, o->trainers, program, o->note ? " " : "",
                     o->note ? o->note : "");
            return;
        }
    }
    for (size_t k = 0; k < sizeof(args_llmc_only) / sizeof(args_llmc_only[0]); k++) {
        if (strcmp(flag, args_llmc_only[k]) == 0) {
            snprintf(out, cap, ": %s is llm.c's, and this project has no such flag", flag);
            return;
        }
    }
}

// An argument where a flag should be that is no flag (no leading '-'), right after the value of a
// string flag: most likely the shell expanded an unquoted pattern, so that -i dir/*.bin reached
// the trainer as -i dir/a.bin dir/b.bin ..., and the second file is read as a flag. The note
// names the flag and a quoted pattern built from the two names, their common start (less its
// trailing digits) and common end (less its leading digits) around a '*': data_train_000001.bin
// and data_train_000002.bin give data_train_*.bin
static inline void args_expanded_note(const char* flag, const char* value, const char* next, char* out, size_t cap) {
    size_t n1 = strlen(value), n2 = strlen(next), start = 0, end = 0;
    while (value[start] != '\0' && value[start] == next[start]) start++;
    while (start > 0 && isdigit((unsigned char)value[start - 1])) start--;
    size_t room = (n1 < n2 ? n1 : n2) - start;  // (the end may not overlap the start)
    while (end < room && value[n1 - 1 - end] == next[n2 - 1 - end]) end++;
    while (end > 0 && isdigit((unsigned char)value[n1 - end])) end--;
    if (start == 0 && end == 0) {  // nothing in common: the pattern's shape only
        snprintf(out, cap, " (after %s: a pattern the shell expanded? quote it: %s 'dir/*.bin')", flag, flag);
    } else {
        snprintf(out, cap, " (after %s: a pattern the shell expanded? quote it: %s '%.*s*%s')", flag, flag, (int)start,
                 value, value + n1 - end);
    }
}

// returns 0 when the usage was asked for (-h, -help or --help anywhere: printed, with the
// defaults, by the launcher's rank 0), 1 otherwise. Registers the string flags' variables for
// path_origin (utils.h), so that a file error names the flag of its path.
// A flag that names a file the run writes (ARG_OUTPUT_FILE: the trainers' -dump_grads, ...): checked
// with the other flags, before any work, as far as can be known then: its directory exists, and the
// path names no directory, device or symbolic link (fopen_temp would refuse it after the step)
static inline void args_check_output_file(const char* program, const char* flag, const char* path) {
    if (path == NULL) return;
    struct stat st;
    const char* dir = dirname_of(path);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        args_fail(program, 0, "flag '%s' is '%s': its directory '%s' does not exist", flag, path, dir);
    const char* what = path_not_a_file(path);
    if (what != NULL) args_fail(program, 0, "flag '%s' is '%s', which is %s: give the path of a file", flag, path, what);
}

static inline int args_parse(int argc, char** argv, const ArgSpec* specs, int n) {
    const char* program = args_program_name(argv[0]);
    llmc_launched_alone();  // (read before MPI_Init changes what it reads)
    for (int i = 1; i < argc; i++) {
        if (args_is_help(argc, argv, i)) {
            if (llmc_launcher_rank() == 0) args_print_usage(stdout, argv[0], specs, n);
            return 0;
        }
    }
    int given[256] = {0};
    for (int i = 1; i < argc; i += 2) {
        int index = -1;
        for (int j = 0; j < n; j++) {
            if (strcmp(argv[i], specs[j].flag) == 0) index = j;
        }
        if (index < 0) {
            char note[8192];
            args_unknown_note(argv[i], program, specs, n, note, sizeof(note));
            // argv[i - 2] is the flag before (matched, or this loop would have stopped there)
            for (int j = 0; note[0] == '\0' && argv[i][0] != '-' && i >= 3 && j < n; j++) {
                if (strcmp(argv[i - 2], specs[j].flag) == 0 && args_is_string(specs[j].type))
                    args_expanded_note(specs[j].flag, argv[i - 1], argv[i], note, sizeof(note));
            }
            args_fail(argv[0], 1, "unknown flag '%s'%s", argv[i], note);
        }
        const ArgSpec* spec = &specs[index];
        if (index < 256) given[index] = 1;
        if (i + 1 >= argc) args_fail(argv[0], 1, "flag '%s' needs a value: %s", argv[i], spec->help);
        const char* text = argv[i + 1];
        char* end = NULL;
        char range[80];
        args_format_range(spec, range, sizeof(range));
        if (spec->type == ARG_INT) {
            // parsed as 64 bits first, so a value past INT_MAX is reported instead of wrapped
            errno = 0;
            long long v = strtoll(text, &end, 10);
            if (*text == '\0' || *end != '\0') args_fail(argv[0], 0, "flag '%s' expects an integer, got '%s'", argv[i], text);
            if (errno == ERANGE || v < INT_MIN || v > INT_MAX) {
                args_fail(argv[0], 0, "flag '%s' is %s, which does not fit a 32-bit int (at most %d)", argv[i], text, INT_MAX);
            }
            if (v < spec->min || v > spec->max) {
                args_fail(argv[0], 0, "flag '%s' is %s, outside its allowed range %s: %s", argv[i], text, range, spec->help);
            }
            *(int*)spec->value = (int)v;
        } else if (spec->type == ARG_FLOAT) {
            // nan and inf parse as numbers; they would train silently on non-finite weights
            double v = strtod(text, &end);
            if (*text == '\0' || *end != '\0') args_fail(argv[0], 0, "flag '%s' expects a number, got '%s'", argv[i], text);
            if (!isfinite(v) || !isfinite((float)v) || (v != 0.0 && (float)v == 0.0f)) {
                args_fail(argv[0], 0, "flag '%s' is %s: expected a finite number that fits a float (magnitude "
                          "between 1e-45 and 3.4e38, or 0)", argv[i], text);
            }
            if (v < spec->min || v > spec->max) {
                args_fail(argv[0], 0, "flag '%s' is %s, outside its allowed range %s: %s", argv[i], text, range, spec->help);
            }
            *(float*)spec->value = (float)v;
        } else {
            *(const char**)spec->value = text;
        }
    }
    for (int j = 0; j < n; j++)
        if (specs[j].type == ARG_OUTPUT_FILE) args_check_output_file(argv[0], specs[j].flag, *(const char**)specs[j].value);
    // a file error's note says what the flag names: its help up to ", or ", where the help goes
    // on with the alternatives (-e's descriptor, -i's shards), which a file error does not need
    static char path_notes[LLMC_PATH_FLAGS][200];
    llmc_num_path_flags = 0;
    for (int j = 0; j < n && llmc_num_path_flags < LLMC_PATH_FLAGS; j++) {
        if (!args_is_string(specs[j].type)) continue;
        char* note = path_notes[llmc_num_path_flags];
        PathFlag* p = &llmc_path_flags[llmc_num_path_flags++];
        p->flag = specs[j].flag;
        p->value = (const char* const*)specs[j].value;
        const char* alternatives = strstr(specs[j].help, ", or ");
        int length = alternatives ? (int)(alternatives - specs[j].help) : (int)strlen(specs[j].help);
        snprintf(note, sizeof(path_notes[0]), "%.*s", length, specs[j].help);
        p->help = note;
        p->given = j < 256 && given[j];
    }
    return 1;
}

#endif
