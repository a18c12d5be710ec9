// Token files (llm.c format: 256 x int32 header, then uint16 tokens) cut into global batches.
//
// The data is one stream of tokens: a single file, or shards (llm.c's convention for data
// larger than one file: -i 'dir/train_*.bin', or a comma list 'a.bin,b.bin'), whose token
// arrays are concatenated in sorted path order (byte order, whatever order the list gives).
// One optimizer step consumes one global batch of `chunks` B*T-token chunks (plus one target
// token), a contiguous run of that stream. A batch may cross from one shard into the next, so
// shards give exactly the batches that their concatenation in one file would (llm.c's own
// loader skips the rest of a shard instead; here re-sharding the data does not change a run).
// Which chunk a rank reads at which micro-step is the trainer's decision, written where the
// reader sees it (data parallelism: micro-step a of rank r reads chunk a*ranks + r, so ranks and
// micro-steps cover the global batch exactly once).
// With shuffling on, the order of the global batches within an epoch is a permutation drawn from
// (seed, epoch), the same on every rank, so the slices stay disjoint; it permutes the batches
// of all shards together.
// Only the file that holds the tokens being read is open: shards are never read into memory.
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include <stdint.h>
#include <sys/stat.h>
#include "rng.h"
#include "utils.h"

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1
#define TOKENS_HEADER_BYTES (256 * sizeof(int))

typedef struct {
    const char* spec;        // the flag's value: a path, a glob or a comma list
    int num_shards;
    char** shards;           // the files, sorted
    size_t* shard_start;     // stream position of each shard's first token; [num_shards] = num_tokens
    FILE* file;              // the shard open for reading (open_shard; -1: none)
    int open_shard;
    size_t num_tokens;       // over all shards
    int B, T, chunks;            // a global batch is `chunks` chunks of B x T tokens
    size_t global_batch_tokens;  // B * T * chunks
    size_t batches_per_epoch;
    int shuffle;
    uint64_t seed;
    size_t* order;           // global batch order of the current epoch (batches_per_epoch)
    // position: the next global batch is order[batch] of epoch `epoch`
    size_t epoch;
    size_t batch;
    uint16_t* buffer;        // B*T+1 tokens read from the stream
    int* inputs;             // (B, T)
    int* targets;            // (B, T)
} DataLoader;

static inline void dataloader_make_order(DataLoader* dl) {
    for (size_t i = 0; i < dl->batches_per_epoch; i++) dl->order[i] = i;
    if (!dl->shuffle) return;
    Rng rng;
    rng_init(&rng, dl->seed * 1000003ull + dl->epoch);
    for (size_t i = dl->batches_per_epoch; i > 1; i--) {  // Fisher-Yates
        size_t j = (size_t)(rng_u64(&rng) % i);
        size_t t = dl->order[i - 1];
        dl->order[i - 1] = dl->order[j];
        dl->order[j] = t;
    }
}

// appends a formatted problem to why (cap bytes), "; " between problems
static inline void dataloader_problem(char* why, size_t cap, const char* fmt, ...) {
    size_t used = strlen(why);
    if (used > 0 && used + 2 < cap) {
        memcpy(why + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    if (used < cap) vsnprintf(why + used, cap - used, fmt, ap);
    va_end(ap);
}

static inline int dataloader_compare_paths(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

// the shards that spec names: each comma-separated item is a path, or a glob pattern when it
// holds * ? or [ (its matches); sorted, and every problem (a pattern matching nothing, a path
// named twice) appended to why
static inline void dataloader_find_shards(DataLoader* dl, const char* flag, char* why, size_t cap) {
    char* items = (char*)malloc_check(strlen(dl->spec) + 1);
    strcpy(items, dl->spec);
    int cap_shards = 16;
    dl->shards = (char**)malloc_check((size_t)cap_shards * sizeof(char*));
    for (char* item = strtok(items, ","); item != NULL; item = strtok(NULL, ",")) {
        glob_t g;
        size_t found = 1;
        char** names = &item;
        int pattern = strpbrk(item, "*?[") != NULL;
        if (pattern) {
            int rc = glob(item, 0, NULL, &g);
            found = rc == 0 ? g.gl_pathc : 0;
            names = g.gl_pathv;
            if (found == 0) dataloader_problem(why, cap, "the pattern '%s'%s matches no file", item, flag);
        }
        for (size_t i = 0; i < found; i++) {
            if (dl->num_shards == cap_shards) {
                cap_shards *= 2;
                dl->shards = (char**)realloc(dl->shards, (size_t)cap_shards * sizeof(char*));
                if (dl->shards == NULL) fail("out of memory listing the shards of '%s'", dl->spec);
            }
            dl->shards[dl->num_shards] = (char*)malloc_check(strlen(names[i]) + 1);
            strcpy(dl->shards[dl->num_shards++], names[i]);
        }
        if (pattern) globfree(&g);
    }
    free(items);
    if (dl->num_shards == 0 && why[0] == '\0') dataloader_problem(why, cap, "'%s'%s names no token file", dl->spec, flag);
    qsort(dl->shards, (size_t)dl->num_shards, sizeof(char*), dataloader_compare_paths);
    for (int s = 1; s < dl->num_shards; s++) {
        if (strcmp(dl->shards[s - 1], dl->shards[s]) == 0) {
            dataloader_problem(why, cap, "token file '%s'%s is named twice", dl->shards[s], flag);
        }
    }
}

// checks one shard's header against its size (problems appended to why); returns its tokens
static inline size_t dataloader_check_shard(const char* path, const char* flag, char* why, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {  // (prepare.py's --out: the shards are in it)
        dataloader_problem(why, cap, "token file '%s'%s is a directory; give the token files in it, e.g. as a quoted "
                           "pattern '%s%sdata_train_*.bin' (prepare.py's names)", path, flag, path,
                           path[strlen(path) - 1] == '/' ? "" : "/");
        return 0;
    }
    FILE* f = fopen(path, "rb");
    int err = errno;
    if (f == NULL && path_origin(path)[0] != '\0') {  // the flag's whole value: the usual message
        char problem[8192];
        fopen_problem(path, "rb", err, problem, sizeof(problem));
        dataloader_problem(why, cap, "%s", problem);
        return 0;
    } else if (f == NULL) {  // one shard of several
        dataloader_problem(why, cap, "cannot open token file '%s'%s for reading: %s", path, flag, strerror(err));
        return 0;
    }
    long bytes = -1;
    int header[256];
    size_t tokens = 0;
    if (fseek(f, 0, SEEK_END) == 0) bytes = ftell(f);
    if (bytes < 0 || fseek(f, 0, SEEK_SET) != 0) {
        dataloader_problem(why, cap, "cannot tell the size of token file '%s'%s", path, flag);
    } else if (bytes < (long)TOKENS_HEADER_BYTES) {
        dataloader_problem(why, cap, "token file '%s'%s is %ld bytes, shorter than its 1024-byte header", path, flag, bytes);
    } else if (fread(header, sizeof(int), 256, f) != 256) {
        dataloader_problem(why, cap, "token file '%s'%s is unreadable: %s", path, flag, strerror(errno));
    } else if (header[0] != TOKENS_MAGIC) {
        // (20240522: llm.c's eval file, hellaswag.h's HELLASWAG_MAGIC, an easy file to give -i or -j by mistake)
        dataloader_problem(why, cap, "token file '%s'%s has magic number %d, expected %d (an llm.c token file)%s", path,
                           flag, header[0], TOKENS_MAGIC,
                           header[0] == 20240522 ? "; 20240522 is a HellaSwag eval file, for -h 1 -hellaswag FILE" : "");
    } else if (header[1] != TOKENS_VERSION) {
        dataloader_problem(why, cap, "token file '%s'%s has version %d, expected %d", path, flag, header[1], TOKENS_VERSION);
    } else {
        tokens = (size_t)(unsigned)header[2];
        long expected = (long)(TOKENS_HEADER_BYTES + tokens * sizeof(uint16_t));
        if (bytes != expected) {
            dataloader_problem(why, cap, "token file '%s'%s is %ld bytes, but its header promises %zu tokens (%ld bytes): "
                               "truncated or corrupt", path, flag, bytes, tokens, expected);
            tokens = 0;
        }
    }
    fclose(f);
    return tokens;
}

// Every rank of the world calls it at the same point (the trainers: run_load), for the same
// files: every shard is found and its header checked before the run starts, and all problems
// (a pattern matching nothing, a missing file, a bad header) go into one message, a check every
// rank makes (check_every_rank: printed once) naming each file and the flag that gave it (-i, -j)
static inline void dataloader_init(DataLoader* dl, const char* spec, int B, int T, int chunks,
                                   int shuffle, uint64_t seed) {
    memset(dl, 0, sizeof(*dl));
    dl->spec = spec;
    dl->B = B;
    dl->T = T;
    dl->chunks = chunks;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->open_shard = -1;
    char why[16384] = "", flag[400];
    snprintf(flag, sizeof(flag), "%s", path_origin(spec));
    dataloader_find_shards(dl, flag, why, sizeof(why));
    dl->shard_start = (size_t*)malloc_check(((size_t)dl->num_shards + 1) * sizeof(size_t));
    for (int s = 0; s < dl->num_shards; s++) {
        dl->shard_start[s] = dl->num_tokens;
        dl->num_tokens += dataloader_check_shard(dl->shards[s], flag, why, sizeof(why));
    }
    dl->shard_start[dl->num_shards] = dl->num_tokens;
    dl->global_batch_tokens = (size_t)B * T * chunks;
    if (why[0] == '\0' && dl->num_tokens < dl->global_batch_tokens + 1) {
        dataloader_problem(why, sizeof(why), "%s '%s'%s %s %zu tokens, fewer than one global batch of %zu (+1 target)",
                           dl->num_shards > 1 ? "the shards" : "token file", spec, flag,
                           dl->num_shards > 1 ? "hold" : "holds", dl->num_tokens, dl->global_batch_tokens);
    }
    check_every_rank(why[0] == '\0', "%s", why);
    dl->batches_per_epoch = (dl->num_tokens - 1) / dl->global_batch_tokens;
    dl->order = (size_t*)malloc_check(dl->batches_per_epoch * sizeof(size_t));
    dl->buffer = (uint16_t*)malloc_check(((size_t)B * T + 1) * sizeof(uint16_t));
    dl->inputs = (int*)malloc_check((size_t)B * T * sizeof(int));
    dl->targets = (int*)malloc_check((size_t)B * T * sizeof(int));
    dataloader_make_order(dl);
}

// moves to global batch `index` counted from the start of training (resume and evaluation)
static inline void dataloader_seek(DataLoader* dl, size_t index) {
    size_t epoch = index / dl->batches_per_epoch;
    dl->batch = index % dl->batches_per_epoch;
    if (epoch != dl->epoch) {
        dl->epoch = epoch;
        dataloader_make_order(dl);
    }
}

// the shard that holds stream position `at` (a binary search over the shards' starts; an empty
// shard holds nothing, so the last shard starting at or before `at` is the one)
static inline int dataloader_shard_of(const DataLoader* dl, size_t at) {
    int lo = 0, hi = dl->num_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dl->shard_start[mid] <= at) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// where the next global batch starts: its shard (index into the sorted list) and the offset of
// its first token in that shard, counted in tokens; what checkpoints record (checkpoint.h)
static inline void dataloader_position(const DataLoader* dl, int* shard, size_t* offset) {
    size_t at = dl->order[dl->batch] * dl->global_batch_tokens;
    *shard = dataloader_shard_of(dl, at);
    *offset = at - dl->shard_start[*shard];
}

// reads n tokens of the stream from position `at` into out, shard after shard
static inline void dataloader_read(DataLoader* dl, size_t at, size_t n, uint16_t* out) {
    while (n > 0) {
        int s = dataloader_shard_of(dl, at);
        size_t offset = at - dl->shard_start[s], here = dl->shard_start[s + 1] - at;
        if (here > n) here = n;
        if (s != dl->open_shard) {  // one shard open at a time
            if (dl->file) fclose(dl->file);
            dl->file = fopen_check(dl->shards[s], "rb");
            dl->open_shard = s;
        }
        fseek_check(dl->file, (long)(TOKENS_HEADER_BYTES + offset * sizeof(uint16_t)), SEEK_SET, dl->shards[s]);
        fread_check(out, sizeof(uint16_t), here, dl->file, dl->shards[s]);
        at += here;
        out += here;
        n -= here;
    }
}

// fills inputs/targets with chunk `chunk` (0 .. chunks-1) of the current global batch; tokens
// must be below `vocab_size` because they index the embedding and the logits
static inline void dataloader_load_chunk(DataLoader* dl, int chunk, int vocab_size) {
    if (chunk < 0 || chunk >= dl->chunks) fail("dataloader: chunk %d of a global batch of %d", chunk, dl->chunks);
    size_t first = dl->order[dl->batch] * dl->global_batch_tokens + (size_t)chunk * dl->B * dl->T;
    size_t n = (size_t)dl->B * dl->T;
    dataloader_read(dl, first, n + 1, dl->buffer);
    for (size_t i = 0; i <= n; i++) {
        if (dl->buffer[i] >= vocab_size) {
            int s = dataloader_shard_of(dl, first + i);
            fail("token file '%s'%s: token %u at position %zu is outside the model's vocabulary of %d", dl->shards[s],
                 dl->num_shards > 1 ? path_origin(dl->spec) : path_origin(dl->shards[s]), dl->buffer[i],
                 first + i - dl->shard_start[s], vocab_size);
        }
    }
    for (size_t i = 0; i < n; i++) {
        dl->inputs[i] = dl->buffer[i];
        dl->targets[i] = dl->buffer[i + 1];
    }
}

// the next global batch; a new epoch (and, when shuffling, a new order) after the last one
static inline void dataloader_advance(DataLoader* dl) {
    dataloader_seek(dl, dl->epoch * dl->batches_per_epoch + dl->batch + 1);
}

// CRC-32 of the token files one after the other in their sorted order, headers included: what
// the data is, wherever it lives (for one file, the CRC-32 of that file)
static inline uint32_t dataloader_file_crc(DataLoader* dl) {
    uint32_t crc = 0;
    for (int s = 0; s < dl->num_shards; s++) {
        FILE* f = fopen_check(dl->shards[s], "rb");
        size_t tokens = dl->shard_start[s + 1] - dl->shard_start[s];
        crc = crc32_file(crc, f, dl->shards[s], TOKENS_HEADER_BYTES + tokens * sizeof(uint16_t));
        fclose(f);
    }
    return crc;
}

static inline void dataloader_free(DataLoader* dl) {
    if (dl->file) fclose(dl->file);
    for (int s = 0; s < dl->num_shards; s++) free(dl->shards[s]);
    free(dl->shards);
    free(dl->shard_start);
    free(dl->order);
    free(dl->buffer);
    free(dl->inputs);
    free(dl->targets);
}

#endif
