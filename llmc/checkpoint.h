// Checkpoints for a bit-identical resume, and the output dir they live in. A checkpoint of step S:
//   model_S.bin          the parameters (llm.c model file, fp32, with a CRC-32), written by rank 0
//   state_S_RANK.bin     per rank: step, layout, the run's identity, the sampling rng (before
//                        step S's sample, which a resume redoes), where in the token files the
//                        next global batch starts (shard, offset), that rank's AdamW moments and,
//                        when parameters are bf16, their exact bf16 values (stochastic rounding
//                        cannot be redone from the fp32 master weights)
//   DONE_S               written last, after a barrier: the checkpoint is complete
// What can go wrong, and what stops it:
//   a crash mid-write    every file goes to disk (fsync) under a temporary name before its rename,
//                        and the directory is synced before DONE: a DONE names whole files only
//   a flipped byte       CRC-32 over every file, verified on load before a field is believed
//   another run's files  the run identity (what determines the training trajectory: model, data,
//                        seed, batch layout, optimizer and schedule flags) is stored in every state
//                        file; resume refuses a checkpoint whose identity differs and names what
//   mixed-up files       each state file's header must hold the agreed step, this rank, the world
//                        size and the model file's CRC, with no byte missing or left over
//   two jobs, one dir    rank 0 holds an exclusive lock (flock) on <dir>/LOCK for the whole run,
//                        and removes LOCK as it ends (a killed job's stays, unlocked: harmless)
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/stat.h>
#include "utils.h"

#define STATE_MAGIC 20240327
#define STATE_VERSION 3  // 3: the data position; 2 (without it) is still read
#define STATE_HEADER_INTS 256

// ---------------------------------------------------------------------------------------------
// run identity: "key value" lines, e.g. "-l 0.000300000014\n-seed 1337\n"

typedef struct {
    char text[4096];
    size_t len;
} RunIdentity;

static inline void run_identity_add(RunIdentity* id, const char* key, const char* fmt, ...) {
    char value[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    int n = snprintf(id->text + id->len, sizeof(id->text) - id->len, "%s %s\n", key, value);
    if (n < 0 || (size_t)n >= sizeof(id->text) - id->len) fail("run identity too long at '%s'", key);
    id->len += (size_t)n;
}

// the value of `key` in identity text, copied into out ("(absent)" when missing)
static inline void run_identity_value(const char* text, const char* key, char* out, size_t cap) {
    size_t klen = strlen(key);
    for (const char* line = text; *line;) {
        const char* end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > klen && strncmp(line, key, klen) == 0 && line[klen] == ' ') {
            snprintf(out, cap, "%.*s", (int)(len - klen - 1), line + klen + 1);
            return;
        }
        line += len + (end ? 1 : 0);
    }
    snprintf(out, cap, "(absent)");
}

// A value made of "-flag value" pairs (a trainer's layout line): splits it into at most `max`
// pairs of flag and value; returns how many, or -1 when it is not such a list
static inline int run_identity_flags(const char* value, char (*flags)[64], char (*values)[64], int max) {
    int n = 0;
    for (const char* p = value; *p;) {
        char flag[64], val[64];
        int used = 0;
        if (sscanf(p, " %63s %63s%n", flag, val, &used) != 2 || flag[0] != '-' || n == max) return -1;
        snprintf(flags[n], 64, "%s", flag);
        snprintf(values[n], 64, "%s", val);
        n++;
        p += used;
        while (*p == ' ') p++;
    }
    return n;
}

// A value may end in a note in parentheses, "64 (-d -1: B*T*ranks, ranks = 2)": it says where
// the value came from and is not compared (a -d given as 64 is the same run). Returns the length
// of the value without its note.
static inline size_t run_identity_bare(const char* value) {
    const char* note = strstr(value, " (");
    size_t n = strlen(value);
    return note != NULL && value[n - 1] == ')' ? (size_t)(note - value) : n;
}
static inline int run_identity_same(const char* a, const char* b) {
    size_t n = run_identity_bare(a);
    return n == run_identity_bare(b) && strncmp(a, b, n) == 0;
}

// a key's two values, "key: a in the checkpoint, b now"; where both are lists of flags, only the
// flags that differ, each by name ("layout -tau: 2 in the checkpoint, 1 now"); a value's note
// after it: "-d: 64 in the checkpoint (-d -1: B*T*ranks, ranks = 2), 32 now (...)"
static inline size_t run_identity_describe(const char* key, const char* a, const char* b, char* out, size_t cap) {
    size_t bare_a = run_identity_bare(a), bare_b = run_identity_bare(b);
    if (bare_a < strlen(a) || bare_b < strlen(b)) {
        return (size_t)snprintf(out, cap, "%s: %.*s in the checkpoint%s, %.*s now%s", key, (int)bare_a, a, a + bare_a,
                                (int)bare_b, b, b + bare_b);
    }
    char fa[32][64], va[32][64], fb[32][64], vb[32][64];
    int na = run_identity_flags(a, fa, va, 32), nb = run_identity_flags(b, fb, vb, 32), same_flags = na == nb && na > 0;
    for (int i = 0; same_flags && i < na; i++) same_flags = strcmp(fa[i], fb[i]) == 0;
    if (!same_flags) return (size_t)snprintf(out, cap, "%s: %s in the checkpoint, %s now", key, a, b);
    size_t used = 0;
    for (int i = 0; i < na && used < cap; i++) {
        if (strcmp(va[i], vb[i]) == 0) continue;
        used += (size_t)snprintf(out + used, cap - used, "%s%s %s: %s in the checkpoint, %s now", used ? "; " : "", key,
                                 fa[i], va[i], vb[i]);
    }
    return used;
}

// every key whose value differs between the two identities: "-l: 0.001 there, 0.0003 now; ..."
static inline void run_identity_diff(const char* saved, const char* now, char* out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    const char* texts[2] = {now, saved};  // keys of either side, so nothing that differs is missed
    for (int side = 0; side < 2; side++) {
        for (const char* line = texts[side]; *line;) {
            const char* end = strchr(line, '\n');
            size_t len = end ? (size_t)(end - line) : strlen(line);
            char key[128], a[1024], b[1024];
            const char* space = (const char*)memchr(line, ' ', len);
            size_t klen = space ? (size_t)(space - line) : len;
            snprintf(key, sizeof(key), "%.*s", (int)klen, line);
            run_identity_value(saved, key, a, sizeof(a));
            run_identity_value(now, key, b, sizeof(b));
            int reported = side == 1 && strcmp(b, "(absent)") != 0;  // already seen from `now`
            if (!run_identity_same(a, b) && !reported && used < cap) {
                if (used) used += (size_t)snprintf(out + used, cap - used, "; ");
                if (used < cap) used += run_identity_describe(key, a, b, out + used, cap - used);
            }
            line += len + (end ? 1 : 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// state files: 256 x int32 header, the identity text, m (n floats), v (n floats), extra bytes
//   header: [0] magic [1] version [2] step [3] rank [4] world [5..6] sampling rng
//           [7..8] n [9..10] extra bytes [11] identity bytes [12] CRC-32 of the whole file with
//           this slot 0 [13] CRC-32 of the model file of the same checkpoint [14] the shard
//           of the next global batch's first token [15..16] that token's offset in its shard

typedef struct {
    int step;             // optimizer steps completed
    int world;            // ranks that wrote the checkpoint
    uint64_t rng;         // sampling rng state before this step's sample
    uint32_t model_crc;   // ties the state files to the model file written with them
    // where the next global batch starts in the token files: shard (sorted index), token offset;
    // -1 in a version 2 file, which did not record it
    int data_shard;
    uint64_t data_offset;
} TrainState;

static inline void checkpoint_path(char* out, size_t cap, const char* dir, const char* kind, int step,
                                   int rank) {
    if (rank < 0) snprintf(out, cap, "%s/%s_%08d.bin", dir, kind, step);
    else snprintf(out, cap, "%s/%s_%08d_%05d.bin", dir, kind, step, rank);
}

static inline void state_header(int header[STATE_HEADER_INTS], const TrainState* s, int rank,
                                size_t n, size_t extra_bytes, const RunIdentity* id) {
    memset(header, 0, STATE_HEADER_INTS * sizeof(int));
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s->step;
    header[3] = rank;
    header[4] = s->world;
    memcpy(&header[5], &s->rng, sizeof(uint64_t));
    uint64_t n64 = n, extra64 = extra_bytes;
    memcpy(&header[7], &n64, sizeof(uint64_t));
    memcpy(&header[9], &extra64, sizeof(uint64_t));
    header[11] = (int)id->len;
    header[13] = (int)s->model_crc;
    header[14] = s->data_shard;
    memcpy(&header[15], &s->data_offset, sizeof(uint64_t));
}

// Stops the job when this rank's state file of checkpoint `step` cannot be opened. The usual
// reason is a job with more ranks than the one that wrote the checkpoint: rank 0's file then
// says how many ranks that was, and the message says so instead of naming a missing file.
// A checkpoint is one of two kinds: a state file per rank (DP, TP, PP, DiLoCo) or one state file
// gathered into the model file's layout (CP, 3D: any layout resumes it). Where this trainer's
// kind is missing and the other's is there, the checkpoint is another trainer's: say so.
// Gathered files are written by train_gpt2_cp, _3d and _ep; of those, an MoE run's identity alone
// holds the key "moe" (its experts), which names the writer: train_gpt2_ep.
static inline const char* state_file_writers(const char* path, int gathered) {
    if (!gathered) return "train_gpt2_dp, _tp, _pp or _diloco";
    int header[STATE_HEADER_INTS];
    char id[4096], moe[16];
    FILE* f = fopen(path, "rb");
    int read = f != NULL && fread(header, sizeof(int), STATE_HEADER_INTS, f) == STATE_HEADER_INTS &&
               header[0] == STATE_MAGIC && header[11] >= 0 && (size_t)header[11] < sizeof(id) &&
               fread(id, 1, (size_t)header[11], f) == (size_t)header[11];
    if (f != NULL) fclose(f);
    if (!read) return "train_gpt2_cp, _3d or _ep";
    id[header[11]] = '\0';
    run_identity_value(id, "moe", moe, sizeof(moe));
    return strcmp(moe, "(absent)") != 0 ? "train_gpt2_ep (its Mixture-of-Experts model)" : "train_gpt2_cp or train_gpt2_3d";
}

static inline void state_check_kind(const char* dir, int step, int gathered) {
    char other[4096];
    checkpoint_path(other, sizeof(other), dir, "state", step, gathered ? 0 : -1);
    FILE* f = fopen(other, "rb");
    if (f == NULL) return;
    fclose(f);
    // (gathered: what this trainer reads; the file found is of the other kind)
    fail("the checkpoint of step %d in '%s' is another trainer's: it holds %s ('%s'), which %s writes; this "
         "trainer reads %s. Resume it with the trainer that wrote it, or start over in an empty output dir", step, dir,
         gathered ? "a state file per rank" : "one gathered state file", other, state_file_writers(other, !gathered),
         gathered ? "one gathered state file (train_gpt2_cp, _3d, _ep)" : "a state file per rank");
}

static inline void state_check_exists(const char* dir, int step, int rank, int world) {
    char path[4096], first[4096];
    checkpoint_path(path, sizeof(path), dir, "state", step, rank);
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
        fclose(f);
        return;
    }
    state_check_kind(dir, step, /*gathered*/ 0);
    checkpoint_path(first, sizeof(first), dir, "state", step, 0);
    int header[STATE_HEADER_INTS];
    FILE* f0 = fopen(first, "rb");
    int known = f0 != NULL && fread(header, sizeof(int), STATE_HEADER_INTS, f0) == STATE_HEADER_INTS &&
                header[0] == STATE_MAGIC && header[4] != world;
    if (f0 != NULL) fclose(f0);
    if (known) {
        fail("the checkpoint of step %d was written by a job of %d ranks, this job has %d (rank %d has no "
             "state file '%s'): resume with %d ranks", step, header[4], world, rank, path, header[4]);
    }
    fail("cannot open state file '%s' of the checkpoint of step %d (%s)", path, step, strerror(errno));
}

// writes the state file durably: header, identity, the n-element moments m and v, extra bytes
static inline void state_write(const char* path, const TrainState* s, int rank, const RunIdentity* id,
                               const float* m, const float* v, size_t n, const void* extra,
                               size_t extra_bytes) {
    int header[STATE_HEADER_INTS];
    state_header(header, s, rank, n, extra_bytes, id);
    uint32_t crc = crc32_update(0, header, sizeof(header));  // slot 12 is still 0
    crc = crc32_update(crc, id->text, id->len);
    crc = crc32_update(crc, m, n * sizeof(float));
    crc = crc32_update(crc, v, n * sizeof(float));
    crc = crc32_update(crc, extra, extra_bytes);
    header[12] = (int)crc;
    char tmp[4200];
    FILE* f = fopen_temp(path, tmp, sizeof(tmp));
    fwrite_check(header, sizeof(int), STATE_HEADER_INTS, f, tmp);
    fwrite_check(id->text, 1, id->len, f, tmp);
    fwrite_check(m, sizeof(float), n, f, tmp);
    fwrite_check(v, sizeof(float), n, f, tmp);
    if (extra_bytes > 0) fwrite_check(extra, 1, extra_bytes, f, tmp);
    file_commit(f, tmp, path);
}

// CRC-32 of a whole state file as it is on disk, with the header's checksum slot taken as 0;
// computed before any header field is trusted, so that a flipped bit anywhere reads as what it is
static inline uint32_t state_file_checksum(FILE* f, const char* path, long file_bytes) {
    int header[STATE_HEADER_INTS];
    fseek_check(f, 0, SEEK_SET, path);
    fread_check(header, sizeof(int), STATE_HEADER_INTS, f, path);
    header[12] = 0;
    uint32_t crc = crc32_file(crc32_update(0, header, sizeof(header)), f, path, (size_t)file_bytes - sizeof(header));
    fseek_check(f, sizeof(header), SEEK_SET, path);
    return crc;
}

// Reads the state file `rank` wrote at `step` into m, v (n floats each) and extra. Any doubt
// stops the job, naming the file and what was expected: a checksum that does not match (checked
// first), another step, rank or world size, another run, the wrong size. The remedy for a bad
// checkpoint is to fall back to the one before: remove its DONE file.
static inline TrainState state_read(const char* path, int step, int rank, int world,
                                    const RunIdentity* id, float* m, float* v, size_t n,
                                    void* extra, size_t extra_bytes) {
    FILE* f = fopen_check(path, "rb");
    long file_bytes = file_size_check(f, path);
    int header[STATE_HEADER_INTS];
    if (file_bytes < (long)sizeof(header)) fail("state file '%s' is %ld bytes, shorter than its header", path, file_bytes);
    fread_check(header, sizeof(int), STATE_HEADER_INTS, f, path);
    if (header[0] != STATE_MAGIC || (header[1] != STATE_VERSION && header[1] != 2)) {
        fail("state file '%s' has magic %d version %d, expected %d version 2 or %d", path, header[0],
             header[1], STATE_MAGIC, STATE_VERSION);
    }
    uint32_t crc = state_file_checksum(f, path, file_bytes);
    if (crc != (uint32_t)header[12]) {
        fail("state file '%s' is corrupt: its CRC-32 is %08x, its header says %08x (a flipped "
             "byte, a torn copy, bytes cut or appended). To fall back to the checkpoint before, "
             "remove %s/DONE_%08d", path, crc, (uint32_t)header[12], dirname_of(path), step);
    }
    if (header[2] != step || header[3] != rank) {
        fail("state file '%s' holds step %d of rank %d, expected step %d of rank %d: the files of "
             "this checkpoint do not belong together", path, header[2], header[3], step, rank);
    }
    if (header[4] != world) {
        fail("the checkpoint of step %d was written by a job of %d ranks, this job has %d: resume "
             "with %d ranks", step, header[4], world, header[4]);
    }
    uint64_t file_n, file_extra;
    memcpy(&file_n, &header[7], sizeof(uint64_t));
    memcpy(&file_extra, &header[9], sizeof(uint64_t));
    size_t id_bytes = (size_t)(unsigned)header[11];
    if (id_bytes >= sizeof(id->text)) fail("state file '%s': run identity of %zu bytes, at most %zu", path, id_bytes, sizeof(id->text) - 1);
    char saved_id[sizeof(id->text)];
    fread_check(saved_id, 1, id_bytes, f, path);
    saved_id[id_bytes] = '\0';
    char diff[4096];
    run_identity_diff(saved_id, id->text, diff, sizeof(diff));
    if (diff[0]) {
        fail("the checkpoint of step %d ('%s') belongs to another run: %s. Resume with the flags "
             "it was written with, or start over in an empty output dir", step, path, diff);
    }
    if (file_n != n || file_extra != extra_bytes) {
        fail("state file '%s' holds %llu parameters (+%llu bytes), this model needs %zu (+%zu "
             "bytes): another model or precision", path, (unsigned long long)file_n,
             (unsigned long long)file_extra, n, extra_bytes);
    }
    long expected = (long)(sizeof(header) + id_bytes + 2 * n * sizeof(float) + extra_bytes);
    if (file_bytes != expected) {
        fail("state file '%s' is %ld bytes, its header promises %ld", path, file_bytes, expected);
    }
    fread_check(m, sizeof(float), n, f, path);
    fread_check(v, sizeof(float), n, f, path);
    if (extra_bytes > 0) fread_check(extra, 1, extra_bytes, f, path);
    fclose(f);
    TrainState s;
    s.step = header[2];
    s.world = header[4];
    memcpy(&s.rng, &header[5], sizeof(uint64_t));
    s.model_crc = (uint32_t)header[13];
    s.data_shard = header[1] >= 3 ? header[14] : -1;
    memcpy(&s.data_offset, &header[15], sizeof(uint64_t));
    return s;
}

// ---------------------------------------------------------------------------------------------
// the output dir

// DONE_S, once every file of the checkpoint is on disk under its final name
static inline void checkpoint_mark_done(const char* dir, int step) {
    char path[4096], tmp[4200];
    fsync_dir(dir);  // the renames of model_S and state_S_* are durable before DONE exists
    snprintf(path, sizeof(path), "%s/DONE_%08d", dir, step);
    file_commit(fopen_temp(path, tmp, sizeof(tmp)), tmp, path);
    fsync_dir(dir);
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

// a fresh run must not mix its checkpoints with those already in dir: stops naming one of them
static inline void checkpoint_refuse_existing(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) return;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "DONE_", 5) == 0 || strncmp(e->d_name, "model_", 6) == 0 ||
            strncmp(e->d_name, "state_", 6) == 0) {
            char name[256];
            snprintf(name, sizeof(name), "%s", e->d_name);
            closedir(d);
            fail("output dir '%s' already holds checkpoints (%s ...) of an earlier run. Continue "
                 "it with -y 1, or start over: remove them or choose another -o", dir, name);
        }
    }
    closedir(d);
}

// What a fresh run's claim (output_dir_claim, below) made: the dirs mkdir created (the lengths of
// those prefixes of dir, shallowest first) and the lock it holds. If the run stops on an error
// before its first line in main.log, rank 0 removes them, LOCK and the empty main.log
// (remove_unfinished_files calls output_dir_unclaim), so that an error found after the claim (an
// allocation that fails, a flag checked once the model is read) leaves no output dir behind.
// (An error on another rank alone ends rank 0 by MPI_Abort, before it can.)
#define OUTPUT_DIRS_MADE 64
static struct {
    char dir[4096];
    size_t made[OUTPUT_DIRS_MADE];
    int made_count;
    int lock_fd;  // + 1: 0 while this process holds no LOCK
} output_claim;

// mkdir -p, each dir it creates recorded in output_claim
static inline void make_dir(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char* p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) == 0) {
            if (output_claim.made_count < OUTPUT_DIRS_MADE) output_claim.made[output_claim.made_count++] = strlen(path);
        } else if (errno != EEXIST) {
            fail("cannot create output dir '%s': %s", path, strerror(errno));
        }
        *p = saved;
        if (saved == '\0') break;
    }
}

// One job per output dir: an exclusive flock on <dir>/LOCK, held until the process ends (the
// kernel releases it then, even after a crash or kill -9). The file names its holder for the
// message a second job prints. Returns the descriptor, which must stay open.
static inline int output_dir_lock(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/LOCK", dir);
    int fd, locked;
    for (int tries = 0;; tries++) {
        fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno == EEXIST) fd = open(path, O_RDWR);
        if (fd < 0 && errno == ENOENT && tries < 100) {  // a job that stopped removed the dir meanwhile
            make_dir(dir);
            continue;
        }
        if (fd < 0) fail("cannot open lock file '%s': %s", path, strerror(errno));
        locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        // Locked, but is it still the file named LOCK? A job that stops before writing anything
        // removes its LOCK while holding it (output_dir_unclaim): a job that had opened it just
        // before then locks a file no later job opens, so it opens the new one instead.
        struct stat held, named;
        if (!locked || (fstat(fd, &held) == 0 && stat(path, &named) == 0 && held.st_dev == named.st_dev &&
                        held.st_ino == named.st_ino)) {
            break;
        }
        close(fd);
        if (tries == 100) fail("cannot lock '%s': other jobs keep removing it", path);
    }
    if (!locked) {
        char holder[512] = "";
        ssize_t got = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[got > 0 ? got : 0] = '\0';
        if (got > 0 && holder[got - 1] == '\n') holder[got - 1] = '\0';
        fail("output dir '%s' is in use by another job (%s): wait for it to end, or choose "
             "another -o", dir, holder[0] ? holder : "holder unknown");
    }
    char host[256] = "?", text[600];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&now));
    int len = snprintf(text, sizeof(text), "pid %d on host %s, since %s\n", (int)getpid(), host, when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) {
        fail("cannot write lock file '%s': %s", path, strerror(errno));
    }
    return fd;
}

// LOCK is there for the run's length only: the process that holds it removes it as it ends
// (exit, the end of a run or an error; a kill leaves it, unlocked, and the next job takes it
// over). It is removed while still locked, and only while the name is still this lock's file: a
// job that had opened it meanwhile finds its file unnamed and opens a fresh one (output_dir_lock).
static inline void output_dir_release(void) {
    char path[4200];
    struct stat held, named;
    if (output_claim.lock_fd == 0) return;
    snprintf(path, sizeof(path), "%s/LOCK", output_claim.dir);
    if (fstat(output_claim.lock_fd - 1, &held) == 0 && stat(path, &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
        unlink(path);
    }
}

static inline void output_dir_unclaim(void) {
    char path[4200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/main.log", output_claim.dir);
    if (stat(path, &st) == 0 && st.st_size > 0) return;  // a step was logged: the run's output stays
    unlink(path);
    output_dir_release();  // (LOCK, so that the dirs it made are empty again)
    for (int i = output_claim.made_count - 1; i >= 0; i--) {  // the deepest first (rmdir leaves one that holds anything)
        snprintf(path, sizeof(path), "%.*s", (int)output_claim.made[i], output_claim.dir);
        rmdir(path);
    }
}

// rank 0, before anything is written to dir: create it, lock it for this job, and unless
// resuming make sure it holds no checkpoints of an earlier run (resuming, a dir that is not there
// is refused before anything is created)
static inline void output_dir_claim(const char* dir, int resuming) {
    struct stat st;
    if (resuming && stat(dir, &st) != 0) {
        fail("-y 1: the output dir '%s' does not exist, so there is no checkpoint to resume from (without -y 1 a "
             "run starts there)", dir);
    }
    snprintf(output_claim.dir, sizeof(output_claim.dir), "%s", dir);
    make_dir(dir);
    output_claim.lock_fd = output_dir_lock(dir) + 1;  // held until the process ends
    atexit(output_dir_release);
    llmc_release_hook = output_dir_release;  // (an error lets it go before the launcher can end this rank)
    if (resuming) return;
    checkpoint_refuse_existing(dir);
    llmc_unclaim_hook = output_dir_unclaim;
}

#endif
