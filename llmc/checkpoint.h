// Training state for a bit-identical resume. A checkpoint of step S in the output dir is
//   model_S.bin          the parameters (llm.c model file, fp32), written by rank 0
//   state_S_RANK.bin     per rank: step, layout, sampling rng, that rank's AdamW moments and,
//                        when parameters are bf16, their exact bf16 values (stochastic rounding
//                        cannot be redone from the fp32 master weights)
//   DONE_S               written last, after a barrier: the checkpoint is complete
// Every file goes through a temporary name, so an interrupted write leaves no partial file.
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include "utils.h"

#define STATE_MAGIC 20240327
#define STATE_VERSION 1

typedef struct {
    int step;        // optimizer steps completed
    int world;       // ranks that wrote the checkpoint
    int B, T;        // micro-batch shape
    int accum;       // gradient accumulation steps
    uint64_t rng;    // sampling rng state
} TrainState;

static inline void checkpoint_path(char* out, size_t cap, const char* dir, const char* kind, int step,
                            int rank) {
    if (rank < 0) snprintf(out, cap, "%s/%s_%08d.bin", dir, kind, step);
    else snprintf(out, cap, "%s/%s_%08d_%05d.bin", dir, kind, step, rank);
}

// writes the state header, the n-element moments m and v, and extra_bytes of extra (may be 0)
static inline void state_write(const char* path, const TrainState* s, int rank, const float* m,
                               const float* v, size_t n, const void* extra, size_t extra_bytes) {
    int header[256];
    memset(header, 0, sizeof(header));
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s->step;
    header[3] = rank;
    header[4] = s->world;
    header[5] = s->B;
    header[6] = s->T;
    header[7] = s->accum;
    memcpy(&header[8], &s->rng, sizeof(uint64_t));
    memcpy(&header[10], &n, sizeof(size_t));
    memcpy(&header[12], &extra_bytes, sizeof(size_t));
    char tmp[4200];  // room for the path and ".tmp"
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen_check(tmp, "wb");
    fwrite_check(header, sizeof(int), 256, f, tmp);
    fwrite_check(m, sizeof(float), n, f, tmp);
    fwrite_check(v, sizeof(float), n, f, tmp);
    if (extra_bytes > 0) fwrite_check(extra, 1, extra_bytes, f, tmp);
    fclose_check(f, tmp);
    rename_check(tmp, path);
}

// reads a state file written by `rank`, checking it matches n parameters and extra_bytes
static inline void state_read(const char* path, TrainState* s, int rank, float* m, float* v, size_t n,
                              void* extra, size_t extra_bytes) {
    FILE* f = fopen_check(path, "rb");
    int header[256];
    fread_check(header, sizeof(int), 256, f, path);
    if (header[0] != STATE_MAGIC || header[1] != STATE_VERSION) {
        fail("state file '%s' has magic %d version %d, expected %d version %d", path, header[0],
             header[1], STATE_MAGIC, STATE_VERSION);
    }
    size_t file_n, file_extra;
    memcpy(&file_n, &header[10], sizeof(size_t));
    memcpy(&file_extra, &header[12], sizeof(size_t));
    if (header[3] != rank || file_n != n || file_extra != extra_bytes) {
        fail("state file '%s' belongs to rank %d with %zu parameters (+%zu bytes), expected rank %d "
             "with %zu (+%zu bytes): another model or precision", path, header[3], file_n,
             file_extra, rank, n, extra_bytes);
    }
    s->step = header[2];
    s->world = header[4];
    s->B = header[5];
    s->T = header[6];
    s->accum = header[7];
    memcpy(&s->rng, &header[8], sizeof(uint64_t));
    fread_check(m, sizeof(float), n, f, path);
    fread_check(v, sizeof(float), n, f, path);
    if (extra_bytes > 0) fread_check(extra, 1, extra_bytes, f, path);
    fclose(f);
}

static inline void checkpoint_mark_done(const char* dir, int step) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/DONE_%08d", dir, step);
    fclose_check(fopen_check(path, "w"), path);
}

// the step of the newest complete checkpoint in dir, or -1 when there is none
static inline int checkpoint_latest(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) return -1;
    int latest = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char extra;
        if (sscanf(e->d_name, "DONE_%d%c", &step, &extra) == 1 && step > latest) latest = step;
    }
    closedir(d);
    return latest;
}

// mkdir -p
static inline void make_dir(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char* p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fail("cannot create output dir '%s': %s", path, strerror(errno));
        }
        *p = saved;
        if (saved == '\0') break;
    }
}

#endif
