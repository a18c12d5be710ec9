// Checked wrappers around the C library: every failure names the file or call (and the flag that
// gave the path) and stops the job. In a multi-rank run comm.h installs an abort hook so that one
// rank's error ends every rank, and the hooks of check_every_rank, so that an error every rank
// meets alike is printed once and ends the job without the launcher's abort report.
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

// set by comm_init: the rank used in messages (-1: a tool without ranks, dev/memory_planner, whose
// messages carry no "[rank N]") and the way to end all ranks (MPI_Abort)
static int llmc_rank = 0;
static void (*llmc_abort_hook)(int code) = NULL;
// set by comm_init, for check_every_rank below: the number of ranks of the world whose flag is 1
// (an all-reduce: every rank calls it at the same point), the world's size in *ranks; and the way
// to end the communication layer in order (MPI_Finalize), so that a job whose every rank stops
// on the same error exits without the launcher's abort report
static int (*llmc_count_hook)(int flag, int* ranks) = NULL;
static void (*llmc_finalize_hook)(void) = NULL;
// called between the pieces of long file reads, writes and checksums: the watchdog's heartbeat
static void (*llmc_progress_hook)(void) = NULL;
#define LLMC_IO_PIECE ((size_t)1 << 26)  // 64 MB

// What the launcher says before the ranks connect (MPI_Init): this process's rank (0 when there
// is no launcher), and whether it runs alone (no launcher, or one of one rank): such a process
// ends by exit(1) alone, without MPI_Abort's report. Unknown launchers count as several ranks.
static inline int llmc_launcher_rank(void) {
    const char* names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++) {
        const char* v = getenv(names[i]);
        if (v != NULL && *v != '\0') return atoi(v);
    }
    const char* v = getenv("RANK");  // torchrun's variables (the CUDA backend without MPI)
    return v != NULL && getenv("WORLD_SIZE") != NULL ? atoi(v) : 0;
}

// (cached at its first call, which args_parse makes before MPI_Init: a process that MPI_Init
// starts alone, a singleton, is then given PMIX_RANK)
static inline int llmc_launched_alone(void) {
    static int alone = -1;
    if (alone >= 0) return alone;
    alone = 0;
    const char* sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
    int named = 0;
    for (int i = 0; i < (int)(sizeof(sizes) / sizeof(sizes[0])); i++) {
        const char* v = getenv(sizes[i]);
        if (v == NULL || *v == '\0') continue;
        if (atoi(v) != 1) return alone;
        named = 1;
    }
    alone = named || getenv("PMIX_RANK") == NULL;  // (PMIx names the rank, not the size)
    return alone;
}

// a JSON string on stdout: the text between quotes, with quotes and backslashes escaped (the
// tools' names and notes hold no control characters)
static inline void print_json_string(const char* text) {
    putchar('"');
    for (const char* c = text; *c; c++) {
        if (*c == '"' || *c == '\\') putchar('\\');
        putchar(*c);
    }
    putchar('"');
}

// The temporary files this process is writing (fopen_temp until file_commit renames them): an
// error removes them before the process ends, so that a full disk is not left holding a
// half-written checkpoint (their final names never held one: see fopen_temp). Then the hook that
// checkpoint.h sets when a fresh run claims its output dir (output_dir_claim): while main.log is
// still empty, the error removes what the claim made there (LOCK, main.log, the dirs it created).
#define LLMC_TEMP_FILES 4
static char llmc_temp_files[LLMC_TEMP_FILES][4096];
static void (*llmc_unclaim_hook)(void) = NULL;
static void (*llmc_release_hook)(void) = NULL;  // the output dir's LOCK, let go before the launcher ends us
static inline void remove_unfinished_files(void) {
    for (int i = 0; i < LLMC_TEMP_FILES; i++) {
        if (llmc_temp_files[i][0] != '\0') unlink(llmc_temp_files[i]);
        llmc_temp_files[i][0] = '\0';
    }
    if (llmc_unclaim_hook) llmc_unclaim_hook();
    llmc_unclaim_hook = NULL;
    if (llmc_release_hook) llmc_release_hook();
}

// The message as one line in one write: what the program printed before it first (stdout is
// a pipe under mpirun, flushed only now), then "error: ..." whole, so that the launcher, which
// forwards each stream as it reads it, never splits it around another line. rank < 0: no rank.
static inline void llmc_print_error_as(int rank, const char* fmt, va_list ap) {
    char line[8192];
    int n = rank < 0 ? snprintf(line, sizeof(line), "error: ") : snprintf(line, sizeof(line), "[rank %d] error: ", rank);
    vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    fflush(stdout);
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
}
static inline void llmc_print_error(const char* fmt, va_list ap) {
    llmc_print_error_as(llmc_rank, fmt, ap);
}

// set by every_rank_alike (below) while its work runs: fail() keeps the message and returns there
static jmp_buf* llmc_catch = NULL;
static char llmc_caught[4096];

// This rank's error: printed with the rank, then every rank ends (the abort hook, where there are others)
static inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (llmc_catch != NULL) {  // (inside every_rank_alike: the ranks compare their verdicts there)
        jmp_buf* back = llmc_catch;
        llmc_catch = NULL;
        vsnprintf(llmc_caught, sizeof(llmc_caught), fmt, ap);
        va_end(ap);
        longjmp(*back, 1);
    }
    llmc_print_error(fmt, ap);
    va_end(ap);
    remove_unfinished_files();
    if (llmc_abort_hook && !llmc_launched_alone()) llmc_abort_hook(1);
    exit(1);
}

// A check that every rank of the world makes at the same point (a layout, the flags, a file every
// rank reads), ok being this rank's verdict; costs one all-reduce of an int. When every rank
// fails it, the message is printed once, by rank 0, without a rank, and every rank ends the
// communication layer in order and exits 1: the launcher reports an exit code, not an abort.
// When only some fail (a file one machine cannot see), each of those prints with its rank and
// the job is aborted. Before comm_init, or in a tool, it is fail().
static inline void check_every_rank(int ok, const char* fmt, ...) {
    va_list ap;
    int ranks = 1, failing = ok ? 0 : 1;
    if (llmc_count_hook != NULL) failing = llmc_count_hook(!ok, &ranks);
    if (failing == 0) return;
    remove_unfinished_files();
    if (llmc_count_hook != NULL && failing == ranks) {
        if (llmc_rank <= 0) {
            va_start(ap, fmt);
            llmc_print_error_as(-1, fmt, ap);
            va_end(ap);
        }
        // the first rank to exit 1 makes the launcher end the others: wait until every rank has
        // removed what it leaves (rank 0 holds LOCK) before any exits (one more count: a barrier)
        llmc_count_hook(0, &ranks);
        llmc_abort_hook = NULL;
        if (llmc_finalize_hook) llmc_finalize_hook();
        exit(1);
    }
    if (ok) {  // another rank failed: it prints and ends the job; this one waits to be ended
        for (int s = 0; s < 60; s++) sleep(1);
        if (llmc_abort_hook) llmc_abort_hook(1);
        exit(1);
    }
    va_start(ap, fmt);
    llmc_print_error(fmt, ap);
    va_end(ap);
    if (llmc_count_hook != NULL) fprintf(stderr, "[rank %d] (%d of the %d ranks failed this check)\n", llmc_rank, failing, ranks);
    if (llmc_abort_hook && !llmc_launched_alone()) llmc_abort_hook(1);
    exit(1);
}

// Work that every rank of the world does at the same point and that fails alike on every rank
// when it fails (reading the -e model file, a checkpoint's files against this run): a fail()
// inside it does not end the rank but comes back here with its message, and the ranks then
// compare verdicts (check_every_rank): where all failed, rank 0 alone prints its message, once,
// and the job ends without the launcher's abort report; where some failed (one rank's file is
// corrupt), those print theirs with their rank. The work must not communicate: a rank that
// failed halfway would leave the others waiting in a collective it never reaches.
static inline void every_rank_alike(void (*work)(void* arg), void* arg) {
    jmp_buf here;
    volatile int failed = 1;  // (volatile: set after setjmp, read after a longjmp)
    if (setjmp(here) == 0) {
        llmc_catch = &here;
        work(arg);
        failed = 0;
    }
    llmc_catch = NULL;
    check_every_rank(!failed, "%s", llmc_caught);
}

// The LLMC_* variables that choose a code path (their table: dev/cuda/README.md, "The code paths") and their values: one
// table, read where a path is taken (env_choice, once, by the caller) and checked by every rank at
// a trainer's start (env_check_all), so that a misspelt value is one message before any work. The
// CUDA backend's own are checked in its builds only.
typedef struct {
    const char* name;
    const char* backend;     // "cpu", "cuda", or NULL: both
    const char* values[4];   // (NULL after the last)
} EnvChoice;
static const EnvChoice llmc_env_choices[] = {
    {"LLMC_KERNEL_TIMES", NULL, {"0", "1"}},
    {"LLMC_MEMORY_MEASURED", NULL, {"0", "1"}},
    {"LLMC_GEMM_ISA", "cpu", {"generic", "avx2", "avx512"}},
    {"LLMC_ATTENTION", "cuda", {"flash", "cublas"}},
    {"LLMC_FLASH", "cuda", {"mma", "wgmma", "fa3"}},
    {"LLMC_FLASH_BACKWARD", "cuda", {"two_kernels", "one_kernel"}},
    {"LLMC_GELU", "cuda", {"epilogue", "kernels"}},
    {"LLMC_CLASSIFIER", "cuda", {"split", "registers"}},
    {"LLMC_LAYERNORM_BACKWARD", "cuda", {"fused", "separate"}},
    {"LLMC_BIAS_GRAD", "cuda", {"epilogue", "kernels"}},
};
#define LLMC_ENV_CHOICES ((int)(sizeof(llmc_env_choices) / sizeof(llmc_env_choices[0])))

// e's value: its index among e's values, -1 when unset or empty, -2 when it is none of them (and
// then "a, b or c" in expected)
static inline int env_value_index(const EnvChoice* e, char* expected, size_t cap) {
    const char* v = getenv(e->name);
    int n = 0;
    while (n < 3 && e->values[n] != NULL) n++;  // (at most 3, a NULL after them)
    for (int i = 0; i < n; i++)
        if (v != NULL && strcmp(v, e->values[i]) == 0) return i;
    if (v == NULL || *v == '\0') return -1;
    expected[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(expected + strlen(expected), cap - strlen(expected), "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", e->values[i]);
    return -2;
}

// the index of variable name's value among its values in the table, `unset` when it is not set;
// any other value stops the run. Callers read it once and keep the answer.
static inline int env_choice(const char* name, int unset) {
    for (int i = 0; i < LLMC_ENV_CHOICES; i++) {
        if (strcmp(llmc_env_choices[i].name, name) != 0) continue;
        char expected[128];
        int index = env_value_index(&llmc_env_choices[i], expected, sizeof(expected));
        if (index == -2) fail("%s=%s: expected %s", name, getenv(name), expected);
        return index == -1 ? unset : index;
    }
    fail("env_choice: %s is not in llmc_env_choices", name);
    return unset;
}

// every variable of the table that this backend reads, by every rank at the same point
static inline void env_check_all(const char* backend) {
    for (int i = 0; i < LLMC_ENV_CHOICES; i++) {
        const EnvChoice* e = &llmc_env_choices[i];
        if (e->backend != NULL && strcmp(e->backend, backend) != 0) continue;
        char expected[128] = "";
        int index = env_value_index(e, expected, sizeof(expected));
        check_every_rank(index != -2, "%s=%s: expected %s", e->name, index == -2 ? getenv(e->name) : "", expected);
    }
}

// The flags whose values name files or directories (args_parse registers every string flag), so
// that a file error says which flag gave the path: value points at the flag's variable, read
// when the error happens, so it must outlive the run (main's variables, the Run struct)
#define LLMC_PATH_FLAGS 48
typedef struct {
    const char* flag;
    const char* const* value;
    const char* help;
    int given;  // 0: the default
} PathFlag;
static PathFlag llmc_path_flags[LLMC_PATH_FLAGS];
static int llmc_num_path_flags = 0;

// " (-i: train token file)" for a path that is a flag's value, " (in -o: output dir ...)" for one
// inside a flag's directory, "" for any other; in a static buffer
static inline const char* path_origin(const char* path) {
    static char note[400];
    note[0] = '\0';
    for (int pass = 0; pass < 2 && note[0] == '\0'; pass++) {
        for (int i = 0; i < llmc_num_path_flags; i++) {
            const PathFlag* p = &llmc_path_flags[i];
            const char* v = *p->value;
            if (v == NULL || *v == '\0') continue;
            size_t n = strlen(v);
            int here = pass == 0 ? strcmp(path, v) == 0 : strncmp(path, v, n) == 0 && path[n] == '/';
            if (!here) continue;
            snprintf(note, sizeof(note), " (%s%s: %.200s%s)", pass == 0 ? "" : "in ", p->flag, p->help,
                     p->given ? "" : "; the default");
            break;
        }
    }
    return note;
}

// why path could not be opened with mode (errno's reason, the flag that gave the path, where a
// relative path starts), into why
static inline void fopen_problem(const char* path, const char* mode, int err, char* why, size_t cap) {
    const char* verb = mode[0] == 'r' ? "reading" : mode[0] == 'a' ? "appending" : "writing";
    char where[4400] = "";
    if (path[0] != '/') {
        char cwd[4096];
        if (getcwd(cwd, sizeof(cwd)) == NULL) snprintf(cwd, sizeof(cwd), "(unknown)");
        snprintf(where, sizeof(where), "; a relative path starts at the working directory, %s (the defaults, "
                 "dev/data/..., at the repository's root: run from there, or give the path)", cwd);
    }
    snprintf(why, cap, "cannot open file '%s'%s for %s: %s%s", path, path_origin(path), verb, strerror(err), where);
}

static inline FILE* fopen_check(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        char why[8192];
        fopen_problem(path, mode, errno, why, sizeof(why));
        fail("%s", why);
    }
    return f;
}

// fopen_check where every rank of the world opens the same file at the same point (check_every_rank)
static inline FILE* fopen_every_rank(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    char why[8192] = "";
    if (f == NULL) fopen_problem(path, mode, errno, why, sizeof(why));
    check_every_rank(f != NULL, "%s", why);
    return f;
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

// reads exactly count items or stops with the file name and what was missing
static inline void fread_check(void* ptr, size_t size, size_t count, FILE* f, const char* path) {
    size_t piece = LLMC_IO_PIECE / size + 1, got = 0;
    while (got < count) {
        size_t want = count - got < piece ? count - got : piece;
        size_t n = fread((char*)ptr + got * size, size, want, f);
        got += n;
        if (n != want) {  // (the flag that gave the path, and the system's reason when it was a read error: a directory)
            int err = ferror(f) ? errno : 0;
            fail("file '%s'%s is truncated or unreadable: wanted %zu items of %zu bytes, got %zu%s%s", path, path_origin(path),
                 count, size, got, err ? ": " : "", err ? strerror(err) : "");
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
static inline uint64_t mul_check(uint64_t a, uint64_t b, const char* what) {
    uint64_t product;
    if (__builtin_mul_overflow(a, b, &product)) fail("%s: %llu x %llu does not fit in 64 bits", what, (unsigned long long)a, (unsigned long long)b);
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
// what path names when it exists and is no regular file ("a directory", ...; a link is not
// followed), NULL otherwise: a path a file is written to must not be one (fopen_temp)
static inline const char* path_not_a_file(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0 || S_ISREG(st.st_mode)) return NULL;
    return S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket";
}

// A path that names something other than a regular file (a directory, a device such as /dev/full,
// a symbolic link) is refused before anything is written: the rename would replace it.
static inline FILE* fopen_temp(const char* path, char* tmp, size_t cap) {
    const char* what = path_not_a_file(path);
    if (what != NULL)
        fail("'%s'%s is %s, not a regular file: a file is written under a temporary name and renamed to its own, "
             "which would replace it; give the path of a file", path, path_origin(path), what);
    if ((size_t)snprintf(tmp, cap, "%s.tmp", path) >= cap || strlen(tmp) >= sizeof(llmc_temp_files[0]))
        fail("path too long: '%s'", path);
    int slot = 0;
    while (slot < LLMC_TEMP_FILES && llmc_temp_files[slot][0] != '\0') slot++;
    if (slot == LLMC_TEMP_FILES) fail("more than %d files written at once ('%s')", LLMC_TEMP_FILES, path);
    FILE* f = fopen_check(tmp, "wb");
    memcpy(llmc_temp_files[slot], tmp, strlen(tmp) + 1);  // (fits: checked above; after the open: never another's file)
    return f;
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
    for (int i = 0; i < LLMC_TEMP_FILES; i++)  // renamed: no longer this process's to remove
        if (strcmp(llmc_temp_files[i], tmp) == 0) llmc_temp_files[i][0] = '\0';
}

// the directory part of a path ("." when there is none), in a static buffer
static inline const char* dirname_of(const char* path) {
    static char dir[4096];
    const char* slash = strrchr(path, '/');
    if (slash == NULL) return ".";
    snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);  // ("/x": "/")
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
