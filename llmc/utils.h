// Checked wrappers around the C library: every failure names the file or call and stops the job.
// In a multi-rank run comm.h installs an abort hook so that one rank's error ends every rank.
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

// set by comm_init: the rank used in messages and the way to end all ranks (MPI_Abort)
static int llmc_rank = 0;
static void (*llmc_abort_hook)(int code) = NULL;
// called between the pieces of long file reads, writes and checksums: the watchdog's heartbeat
static void (*llmc_progress_hook)(void) = NULL;
#define LLMC_IO_PIECE ((size_t)1 << 26)  // 64 MB

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
    size_t piece = LLMC_IO_PIECE / size + 1, got = 0;
    while (got < count) {
        size_t want = count - got < piece ? count - got : piece;
        size_t n = fread((char*)ptr + got * size, size, want, f);
        got += n;
        if (n != want) {
            fail("file '%s' is truncated or unreadable: wanted %zu items of %zu bytes, got %zu", path,
                 count, size, got);
        }
        if (llmc_progress_hook) llmc_progress_hook();
    }
}

static inline void fwrite_check(const void* ptr, size_t size, size_t count, FILE* f, const char* path) {
    size_t piece = LLMC_IO_PIECE / size + 1;
    for (size_t done = 0; done < count; done += piece) {
        size_t n = count - done < piece ? count - done : piece;
        if (fwrite((const char*)ptr + done * size, size, n, f) != n) fail("write to '%s' failed: %s", path, strerror(errno));
        if (llmc_progress_hook) llmc_progress_hook();
    }
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

// a * b for sizes and counts: stops naming `what` instead of wrapping around
static inline size_t mul_check(size_t a, size_t b, const char* what) {
    size_t product;
    if (__builtin_mul_overflow(a, b, &product)) fail("%s: %zu x %zu does not fit in 64 bits", what, a, b);
    return product;
}

// CRC-32 (zlib's, the checksum of gzip and PNG) of `bytes` more bytes, continuing from `crc`
// (start from 0). zlib takes 32-bit lengths, so large buffers go through in pieces.
static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    while (bytes > 0) {
        uInt piece = bytes > LLMC_IO_PIECE ? (uInt)LLMC_IO_PIECE : (uInt)bytes;
        crc = (uint32_t)crc32((uLong)crc, p, piece);
        p += piece;
        bytes -= piece;
        if (llmc_progress_hook) llmc_progress_hook();
    }
    return crc;
}

// continues crc over the next `bytes` bytes of f, read in 16 MB pieces
static inline uint32_t crc32_file(uint32_t crc, FILE* f, const char* path, size_t bytes) {
    size_t chunk = (size_t)1 << 24;
    char* buf = (char*)malloc_check(chunk);
    while (bytes > 0) {
        size_t n = bytes < chunk ? bytes : chunk;
        fread_check(buf, 1, n, f, path);
        crc = crc32_update(crc, buf, n);
        bytes -= n;
    }
    free(buf);
    return crc;
}

// Durable files. A file is written under "<path>.tmp", flushed to the disk (fsync) and only then
// renamed to its final name: after a crash or a power cut the final name holds either nothing or
// the whole file, never a prefix. The rename itself is an entry in the directory, made durable
// by fsync_dir.
static inline FILE* fopen_temp(const char* path, char* tmp, size_t cap) {
    if ((size_t)snprintf(tmp, cap, "%s.tmp", path) >= cap) fail("path too long: '%s'", path);
    return fopen_check(tmp, "wb");
}

static inline void fsync_file(FILE* f, const char* path) {
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) fail("writing '%s' to disk failed: %s", path, strerror(errno));
}

static inline void rename_check(const char* from, const char* to) {
    if (rename(from, to) != 0) fail("rename '%s' -> '%s' failed: %s", from, to, strerror(errno));
}

static inline void file_commit(FILE* f, const char* tmp, const char* path) {
    fsync_file(f, tmp);
    fclose_check(f, tmp);
    rename_check(tmp, path);
}

// the directory part of a path ("." when there is none), in a static buffer
static inline const char* dirname_of(const char* path) {
    static char dir[4096];
    const char* slash = strrchr(path, '/');
    if (slash == NULL) return ".";
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    return dir;
}

static inline void fsync_dir(const char* dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) fail("syncing directory '%s' to disk failed: %s", dir, strerror(errno));
    close(fd);
}

static inline double wall_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
