// Machine-readable training log: one JSON object per line in <output dir>/main.log (a train
// step's record: step_report in run.h).
// Floats are printed with 9 significant digits, enough to round-trip an fp32 exactly; a value
// that is not finite is written as null (JSON has no nan or inf). A failed write (a full disk)
// stops the run: a log that silently ends is worse than no log.
// On resume the log is first cut back to the checkpoint of step S: the train entries up to S and
// the validations before S stay (the resumed run validates at S again, as an uninterrupted run
// with its flags would), so every entry appears once even when the interrupted run had logged
// steps past its last checkpoint.
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include <math.h>
#include "utils.h"

typedef struct {
    FILE* file;  // NULL when there is no output dir or on ranks other than 0
    char path[4096];
} Logger;

// keeps the train lines of main.log up to `step` and the other lines before it (a torn last
// line goes too)
static inline void logger_cut_back(const char* path, int step) {
    FILE* in = fopen(path, "r");
    if (in == NULL) return;  // no log yet: nothing to cut
    char tmp[4200], line[4096];
    FILE* out = fopen_temp(path, tmp, sizeof(tmp));
    while (fgets(line, sizeof(line), in)) {
        int line_step;
        size_t len = strlen(line);
        int whole = len > 0 && line[len - 1] == '\n';
        int is_train = strstr(line, "\"train_loss\"") != NULL;
        if (whole && sscanf(line, "{\"step\": %d", &line_step) == 1 &&
            (line_step < step || (line_step == step && is_train))) {
            if (fputs(line, out) == EOF) fail("write to '%s' failed: %s", tmp, strerror(errno));
        }
    }
    fclose(in);
    file_commit(out, tmp, path);
}

// resume_step: the checkpoint's step when resuming, -1 for a fresh run (the log starts empty)
static inline void logger_init(Logger* log, const char* out_dir, int rank, int resume_step) {
    log->file = NULL;
    if (out_dir == NULL || rank != 0) return;
    snprintf(log->path, sizeof(log->path), "%s/main.log", out_dir);
    if (resume_step >= 0) logger_cut_back(log->path, resume_step);
    log->file = fopen_check(log->path, resume_step >= 0 ? "a" : "w");
}

// one formatted line, flushed; any error stops the job naming the file
static inline void logger_line(Logger* log, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int bad = vfprintf(log->file, fmt, ap) < 0;
    va_end(ap);
    if (bad || fflush(log->file) != 0) fail("writing the log '%s' failed: %s", log->path, strerror(errno));
}

// x as JSON: 9 significant digits, or null
static inline const char* json_float(char* buf, size_t cap, double x) {
    if (isfinite(x)) snprintf(buf, cap, "%.9g", x);
    else snprintf(buf, cap, "null");
    return buf;
}

static inline void logger_val(Logger* log, int step, float val_loss) {
    if (!log->file) return;
    char a[32];
    logger_line(log, "{\"step\": %d, \"val_loss\": %s}\n", step, json_float(a, 32, val_loss));
}

static inline void logger_close(Logger* log) {
    if (log->file) fclose_check(log->file, log->path);
}

#endif
