// Machine-readable training log: one JSON object per line in <output dir>/main.log.
// Floats are printed with 9 significant digits, enough to round-trip an fp32 exactly.
#ifndef LLMC_LOGGER_H
#define LLMC_LOGGER_H

#include "utils.h"

typedef struct {
    FILE* file;  // NULL when there is no output dir or on ranks other than 0
} Logger;

static inline void logger_init(Logger* log, const char* out_dir, int rank, int resuming) {
    log->file = NULL;
    if (out_dir == NULL || rank != 0) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/main.log", out_dir);
    log->file = fopen_check(path, resuming ? "a" : "w");
}

// comm_bytes: what this rank handed to collectives during the step (comm.h's counters)
static inline void logger_train(Logger* log, int step, float loss, float lr, float grad_norm,
                                double tokens_per_s, long long comm_bytes) {
    if (!log->file) return;
    fprintf(log->file,
            "{\"step\": %d, \"train_loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens_per_s\": %.1f, \"comm_bytes\": %lld}\n", step, loss, lr, grad_norm,
            tokens_per_s, comm_bytes);
    fflush(log->file);
}

static inline void logger_val(Logger* log, int step, float val_loss) {
    if (!log->file) return;
    fprintf(log->file, "{\"step\": %d, \"val_loss\": %.9g}\n", step, val_loss);
    fflush(log->file);
}

static inline void logger_close(Logger* log) {
    if (log->file) fclose(log->file);
}

#endif
