// Checked wrappers around the C library: every failure names the file or call and stops the job.
// In a multi-rank run comm.h installs an abort hook so that one rank's error ends every rank.
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// set by comm_init: the rank used in messages and the way to end all ranks (MPI_Abort)
static int llmc_rank = 0;
static void (*llmc_abort_hook)(int code) = NULL;

static inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] error: ", llmc_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    if (llmc_abort_hook) llmc_abort_hook(1);
    exit(1);
}

static inline void* malloc_check(size_t bytes) {
    void* p = malloc(bytes);
    if (p == NULL && bytes > 0) fail("malloc of %zu bytes failed", bytes);
    return p;
}

static inline void* calloc_check(size_t count, size_t size) {
    void* p = calloc(count, size);
    if (p == NULL && count > 0) fail("calloc of %zu x %zu bytes failed", count, size);
    return p;
}

static inline FILE* fopen_check(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) fail("cannot open file '%s' (mode %s): %s", path, mode, strerror(errno));
    return f;
}

// reads exactly count items or stops with the file name and what was missing
static inline void fread_check(void* ptr, size_t size, size_t count, FILE* f, const char* path) {
    size_t got = fread(ptr, size, count, f);
    if (got != count) {
        fail("file '%s' is truncated or unreadable: wanted %zu items of %zu bytes, got %zu", path,
             count, size, got);
    }
}

static inline void fwrite_check(const void* ptr, size_t size, size_t count, FILE* f, const char* path) {
    if (fwrite(ptr, size, count, f) != count) fail("write to '%s' failed: %s", path, strerror(errno));
}

static inline void fclose_check(FILE* f, const char* path) {
    if (fclose(f) != 0) fail("closing '%s' failed: %s", path, strerror(errno));
}

static inline void fseek_check(FILE* f, long offset, int whence, const char* path) {
    if (fseek(f, offset, whence) != 0) fail("seek in '%s' failed: %s", path, strerror(errno));
}

static inline long file_size_check(FILE* f, const char* path) {
    fseek_check(f, 0, SEEK_END, path);
    long size = ftell(f);
    if (size < 0) fail("cannot tell the size of '%s'", path);
    fseek_check(f, 0, SEEK_SET, path);
    return size;
}

// files are written under "<path>.tmp" and renamed when complete, so a crash never leaves a
// half-written file under the final name
static inline void rename_check(const char* from, const char* to) {
    if (rename(from, to) != 0) fail("rename '%s' -> '%s' failed: %s", from, to, strerror(errno));
}

static inline double wall_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
