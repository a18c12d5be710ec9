// Token files (llm.c format: 256 x int32 header, then uint16 tokens) cut into global batches.
//
// One optimizer step consumes one global batch of `chunks` B*T-token chunks (plus one target
// token), a contiguous run of the file. Which chunk a rank reads at which micro-step is the
// trainer's decision, written where the reader sees it (data parallelism: micro-step a of rank r
// reads chunk a*ranks + r, so ranks and micro-steps cover the global batch exactly once).
// With shuffling on, the order of the global batches within an epoch is a permutation drawn from
// (seed, epoch), the same on every rank, so the slices stay disjoint.
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <stdint.h>
#include "rng.h"
#include "utils.h"

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1
#define TOKENS_HEADER_BYTES (256 * sizeof(int))

typedef struct {
    const char* path;
    FILE* file;
    size_t num_tokens;
    int B, T, chunks;            // a global batch is `chunks` chunks of B x T tokens
    size_t global_batch_tokens;  // B * T * chunks
    size_t batches_per_epoch;
    int shuffle;
    uint64_t seed;
    size_t* order;           // global batch order of the current epoch (batches_per_epoch)
    // position: the next global batch is order[batch] of epoch `epoch`
    size_t epoch;
    size_t batch;
    uint16_t* buffer;        // B*T+1 tokens read from the file
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

// Every rank of the world calls it at the same point (the trainers: run_load), for the same file:
// a missing or malformed file is a check every rank makes (check_every_rank: printed once), and
// the message names the flag that gave the path (-i, -j)
static inline void dataloader_init(DataLoader* dl, const char* path, int B, int T, int chunks,
                                   int shuffle, uint64_t seed) {
    memset(dl, 0, sizeof(*dl));
    dl->path = path;
    dl->B = B;
    dl->T = T;
    dl->chunks = chunks;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->file = fopen_every_rank(path, "rb");
    char why[1024] = "";
    const char* flag = path_origin(path);
    long bytes = -1;
    int header[256];
    if (fseek(dl->file, 0, SEEK_END) == 0) bytes = ftell(dl->file);
    if (bytes < 0 || fseek(dl->file, 0, SEEK_SET) != 0) {
        snprintf(why, sizeof(why), "cannot tell the size of token file '%s'%s", path, flag);
    } else if (bytes < (long)TOKENS_HEADER_BYTES) {
        snprintf(why, sizeof(why), "token file '%s'%s is %ld bytes, shorter than its 1024-byte header", path, flag, bytes);
    } else if (fread(header, sizeof(int), 256, dl->file) != 256) {
        snprintf(why, sizeof(why), "token file '%s'%s is unreadable: %s", path, flag, strerror(errno));
    } else if (header[0] != TOKENS_MAGIC) {
        snprintf(why, sizeof(why), "token file '%s'%s has magic number %d, expected %d (an llm.c token file)", path, flag,
                 header[0], TOKENS_MAGIC);
    } else if (header[1] != TOKENS_VERSION) {
        snprintf(why, sizeof(why), "token file '%s'%s has version %d, expected %d", path, flag, header[1], TOKENS_VERSION);
    } else {
        dl->num_tokens = (size_t)(unsigned)header[2];
        long expected = (long)(TOKENS_HEADER_BYTES + dl->num_tokens * sizeof(uint16_t));
        dl->global_batch_tokens = (size_t)B * T * chunks;
        if (bytes != expected) {
            snprintf(why, sizeof(why), "token file '%s'%s is %ld bytes, but its header promises %zu tokens (%ld bytes): "
                     "truncated or corrupt", path, flag, bytes, dl->num_tokens, expected);
        } else if (dl->num_tokens < dl->global_batch_tokens + 1) {
            snprintf(why, sizeof(why), "token file '%s'%s holds %zu tokens, fewer than one global batch of %zu (+1 target)",
                     path, flag, dl->num_tokens, dl->global_batch_tokens);
        }
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

// fills inputs/targets with chunk `chunk` (0 .. chunks-1) of the current global batch; tokens
// must be below `vocab_size` because they index the embedding and the logits
static inline void dataloader_load_chunk(DataLoader* dl, int chunk, int vocab_size) {
    if (chunk < 0 || chunk >= dl->chunks) fail("dataloader: chunk %d of a global batch of %d", chunk, dl->chunks);
    size_t first = dl->order[dl->batch] * dl->global_batch_tokens + (size_t)chunk * dl->B * dl->T;
    size_t n = (size_t)dl->B * dl->T;
    fseek_check(dl->file, (long)(TOKENS_HEADER_BYTES + first * sizeof(uint16_t)), SEEK_SET,
                dl->path);
    fread_check(dl->buffer, sizeof(uint16_t), n + 1, dl->file, dl->path);
    for (size_t i = 0; i <= n; i++) {
        if (dl->buffer[i] >= vocab_size) {
            fail("token file '%s'%s: token %u at position %zu is outside the model's vocabulary "
                 "of %d", dl->path, path_origin(dl->path), dl->buffer[i], first + i, vocab_size);
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

// CRC-32 of the whole token file (header included): what the data is, wherever it lives
static inline uint32_t dataloader_file_crc(DataLoader* dl) {
    fseek_check(dl->file, 0, SEEK_SET, dl->path);
    return crc32_file(0, dl->file, dl->path, TOKENS_HEADER_BYTES + dl->num_tokens * sizeof(uint16_t));
}

static inline void dataloader_free(DataLoader* dl) {
    fclose(dl->file);
    free(dl->order);
    free(dl->buffer);
    free(dl->inputs);
    free(dl->targets);
}

#endif
