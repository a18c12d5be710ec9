// HellaSwag (Zellers et al., 2019): sentence completion as an evaluation of a language model. Each
// example is a context ("A man is sitting on a roof. he") and four endings, one of them right. The
// model reads context + ending as one row and the ending's tokens are scored by their loss; the
// ending with the lowest mean loss per token is the model's answer (llm.c's "acc_norm": the mean,
// so that a long ending is not penalised for being long). Accuracy = right answers / examples.
//
// The file is llm.c's eval file, so its hellaswag_val.bin works here and ours there
// (dev/data/hellaswag.py writes it):
//   header  256 int32: magic 20240522, version 1, number of examples, bytes of the longest example
//   then each example, a stream of uint16:
//     65535 (the delimiter), the example's bytes (from the delimiter on), its index (0, 1, ...),
//     its label (0..3), the number of completions (4), the context's length and tokens, then
//     each completion's length and tokens
//
// A batch: B rows of T tokens, each example four rows (one per completion), so B/4 examples per
// forward pass. Row c of an example holds the context then completion c; the targets of the
// positions from the context's last token on are the completion's tokens, and only those
// positions (the mask) are scored:
//     inputs   ctx0 ctx1 ctx2 end0 end1  0 ...
//     targets   .    .   end0 end1  .    . ...      mask 0 0 1 1 0 0 ...
// The rest of a row (and a padding row) holds token 0 and is never scored: attention is causal,
// so what follows a position cannot change its loss.
//
// The examples are split over the data-parallel ranks: rank r of N takes examples r, r + N, r + 2N,
// ... Every rank runs the same number of forward passes (the longest share's), since a forward pass
// may need every rank (ZeRO-3 gathers each bucket from all of them); a rank with fewer examples
// pads with empty rows. The right answers are then summed over the ranks.
#ifndef LLMC_HELLASWAG_H
#define LLMC_HELLASWAG_H

#include <sys/stat.h>
#include "comm.h"
#include "logger.h"
#include "utils.h"
#include "watchdog.h"

#define HELLASWAG_MAGIC 20240522
#define HELLASWAG_VERSION 1
#define HELLASWAG_CHOICES 4         // completions per example: four rows of a batch
#define HELLASWAG_DELIMITER 65535   // the uint16 each example starts with
#define HELLASWAG_DEFAULT_PATH "dev/data/hellaswag/hellaswag_val.bin"

typedef struct {
    int on;             // -h 1
    const char* path;   // -hellaswag (the file found, when the default was looked up beside the program)
    char found[4096];   // (that path, when so)
    int num_examples;
    uint16_t* stream;   // every example as in the file, after the header
    size_t* starts;     // (num_examples) where each example starts in stream, in uint16
    // this rank's share and its batches
    int rank, ranks;    // of the data-parallel group the examples are split over
    int per_batch;      // examples per forward pass, B / 4
    int batches;        // forward passes per evaluation, the same on every rank
    int B, T;
    int *inputs, *targets;  // (B, T) one batch, on the host
    char* mask;             // (B, T) 1 where the target is a completion's token
    int* example;           // (B / 4) the example in each group of four rows, -1 for padding
} HellaSwag;

// The two flags, in the table of a trainer that evaluates HellaSwag (one with a token_losses hook,
// llmc/run.h): -h as in llm.c, and the file. hs: the run's HellaSwag (run.hellaswag).
#define HELLASWAG_FLAGS(hs)                                                                                        \
    {"-h", ARG_INT, &(hs)->on, 0, 1, "1: HellaSwag accuracy whenever the validation loss runs (every -v steps, "  \
     "and at the end: with -v 0 only there); -b must be at least 4 (an example's four completions are 4 rows)"}, \
    {"-hellaswag", ARG_STRING, &(hs)->path, 0, 0, "HellaSwag examples for -h 1, llm.c's eval file (dev/data/hellaswag.py writes it)"}

// example i's fields: its stream from the delimiter on
static inline const uint16_t* hellaswag_example(const HellaSwag* hs, int i) { return hs->stream + hs->starts[i]; }
static inline int hellaswag_label(const HellaSwag* hs, int i) { return hellaswag_example(hs, i)[3]; }

// " (-hellaswag: ...)" after the file's name in a message. (path_origin would name the first flag
// holding the same path: -j's, when the validation token file is given to -hellaswag by mistake.)
static inline const char* hellaswag_origin(const HellaSwag* hs) {
    static char note[400];
    note[0] = '\0';
    for (int i = 0; i < llmc_num_path_flags; i++) {
        const PathFlag* p = &llmc_path_flags[i];
        if (strcmp(p->flag, "-hellaswag") != 0) continue;
        snprintf(note, sizeof(note), " (-hellaswag: %.200s%s)", p->help,
                 p->given ? "" : hs->path == hs->found ? "; the default, found beside the program" : "; the default");
    }
    return note;
}

// The whole file, read and checked before any training: the header, then every example's
// delimiter, index, label, number of completions and lengths against its byte count, its tokens
// inside the model's vocabulary V, and every row (context + completion) within -t T. An example
// longer than T is refused as llm.c's loader refuses it (an assert there): cutting its context
// would change the question, and leaving it out would change the set the score is over; the
// message says the -t that holds the longest. -b B must hold an example's four rows.
static inline void hellaswag_open(HellaSwag* hs, int B, int T, int V) {
    const char* path = hs->path;
    if (B < HELLASWAG_CHOICES)
        fail("-h 1 with -b %d: a HellaSwag example is %d rows of one batch (its context with each of its %d "
             "completions), so -b must be at least %d", B, HELLASWAG_CHOICES, HELLASWAG_CHOICES, HELLASWAG_CHOICES);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))  // (hellaswag.py's --out is a dir; -hellaswag, the file in it)
        fail("HellaSwag file '%s'%s is a directory; -hellaswag takes the file, e.g. %s%shellaswag_val.bin", path,
             hellaswag_origin(hs), path, path[strlen(path) - 1] == '/' ? "" : "/");
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        char why[8192];
        fopen_problem(path, "rb", errno, why, sizeof(why));
        fail("%s; -h 1 needs HellaSwag's examples: python3 dev/data/hellaswag.py writes them to %s", why,
             HELLASWAG_DEFAULT_PATH);
    }
    fseek_check(f, 0, SEEK_END, path);
    long size = ftell(f);
    fseek_check(f, 0, SEEK_SET, path);
    if (size < 256 * (long)sizeof(int32_t))
        fail("HellaSwag file '%s'%s: %ld bytes, shorter than its header of 256 int32 (1024 bytes)", path, hellaswag_origin(hs), size);
    int32_t header[256];
    fread_check(header, sizeof(int32_t), 256, f, path);
    if (header[0] != HELLASWAG_MAGIC || header[1] != HELLASWAG_VERSION)
        fail("HellaSwag file '%s'%s: magic %d version %d, expected llm.c's eval file, magic %d version %d (a token "
             "file has magic 20240520: dev/data/hellaswag.py writes the eval file)", path, hellaswag_origin(hs), header[0],
             header[1], HELLASWAG_MAGIC, HELLASWAG_VERSION);
    if (header[2] <= 0 || (size - 1024) % 2 != 0)
        fail("HellaSwag file '%s'%s: %d examples and %ld bytes after the header, expected at least one example and "
             "whole uint16s", path, hellaswag_origin(hs), header[2], size - 1024);
    size_t n = (size_t)(size - 1024) / 2;
    hs->num_examples = header[2];
    hs->stream = (uint16_t*)malloc_check(n * sizeof(uint16_t));
    hs->starts = (size_t*)malloc_check((size_t)hs->num_examples * sizeof(size_t));
    fread_check(hs->stream, sizeof(uint16_t), n, f, path);
    fclose(f);
    size_t at = 0;
    int longest_bytes = 0, longest_row = 0;
    for (int i = 0; i < hs->num_examples; i++) {
        const uint16_t* e = hs->stream + at;
        // (the six fields before the context's tokens, then the example's own count)
        if (at + 6 > n || at + e[1] / 2 > n)
            fail("HellaSwag file '%s'%s is truncated: its header says %d examples, the file ends in example %d", path,
                 hellaswag_origin(hs), hs->num_examples, i);
        if (e[0] != HELLASWAG_DELIMITER || e[2] != i || e[1] % 2 != 0)
            fail("HellaSwag file '%s'%s: example %d (uint16 %zu after the header) starts with %u, %u, %u; expected the "
                 "delimiter 65535, an even byte count and the index %d", path, hellaswag_origin(hs), i, at, e[0], e[1], e[2], i);
        if (e[3] >= HELLASWAG_CHOICES || e[4] != HELLASWAG_CHOICES || e[5] == 0)
            fail("HellaSwag file '%s'%s: example %d has label %u, %u completions and a context of %u tokens; expected "
                 "a label 0..3, 4 completions and a context", path, hellaswag_origin(hs), i, e[3], e[4], e[5]);
        size_t words = e[1] / 2, used = 6 + e[5];  // (uint16s in the example, and read so far)
        int context = e[5], tokens_ok = 1;
        for (size_t k = 6; k < used && k < words; k++) tokens_ok &= e[k] < V;
        for (int c = 0; c < HELLASWAG_CHOICES && used < words; c++) {
            int length = e[used];
            if (length == 0) fail("HellaSwag file '%s'%s: example %d's completion %d is empty", path, hellaswag_origin(hs), i, c);
            if (context + length > longest_row) longest_row = context + length;
            for (size_t k = used + 1; k < used + 1 + length && k < words; k++) tokens_ok &= e[k] < V;
            used += 1 + length;
        }
        if (used != words)
            fail("HellaSwag file '%s'%s: example %d says it is %u bytes, its lengths add up to %zu", path,
                 hellaswag_origin(hs), i, e[1], used * 2);
        if (!tokens_ok)
            fail("HellaSwag file '%s'%s: example %d holds a token outside the model's vocabulary of %d (tokenized "
                 "for another model?)", path, hellaswag_origin(hs), i, V);
        hs->starts[i] = at;
        longest_bytes = e[1] > longest_bytes ? e[1] : longest_bytes;
        at += words;
    }
    if (at != n)
        fail("HellaSwag file '%s'%s: %zu bytes after its %d examples; expected the file to end there", path,
             hellaswag_origin(hs), (n - at) * 2, hs->num_examples);
    if (header[3] != longest_bytes)
        fail("HellaSwag file '%s'%s: the header says the longest example is %d bytes, it is %d (llm.c sizes its buffer "
             "from it)", path, hellaswag_origin(hs), header[3], longest_bytes);
    if (longest_row > T)
        fail("HellaSwag file '%s'%s: an example's context and completion are %d tokens, longer than -t %d; llm.c "
             "refuses such a file too (a row must hold the whole example): use -t %d or more", path, hellaswag_origin(hs),
             longest_row, T, longest_row);
    hs->B = B, hs->T = T;
    hs->per_batch = B / HELLASWAG_CHOICES;
    hs->example = (int*)malloc_check((size_t)hs->per_batch * sizeof(int));
    hs->inputs = (int*)malloc_check((size_t)B * T * sizeof(int));
    hs->targets = (int*)malloc_check((size_t)B * T * sizeof(int));
    hs->mask = (char*)malloc_check((size_t)B * T);
}

// the examples split over `replicas` (the data-parallel ranks; NULL: one rank evaluates them all):
// the forward passes of the longest share, ceil(ceil(n / N) / (B / 4)), on every rank
static inline void hellaswag_split(HellaSwag* hs, const CommGroup* replicas) {
    hs->rank = replicas ? replicas->rank : 0;
    hs->ranks = replicas ? replicas->size : 1;
    int longest_share = (hs->num_examples + hs->ranks - 1) / hs->ranks;
    hs->batches = (longest_share + hs->per_batch - 1) / hs->per_batch;
}

// batch b of this rank: its examples k = b B/4 ... of its share (example rank + k N), four rows each
static inline void hellaswag_fill(HellaSwag* hs, int b) {
    int T = hs->T;
    memset(hs->inputs, 0, (size_t)hs->B * T * sizeof(int));
    memset(hs->targets, 0, (size_t)hs->B * T * sizeof(int));
    memset(hs->mask, 0, (size_t)hs->B * T);
    for (int j = 0; j < hs->per_batch; j++) {
        int i = hs->rank + (b * hs->per_batch + j) * hs->ranks;
        hs->example[j] = i < hs->num_examples ? i : -1;
        if (i >= hs->num_examples) continue;
        const uint16_t* e = hellaswag_example(hs, i);
        int context = e[5];
        const uint16_t* completion = e + 6 + context;  // (its length, then its tokens)
        for (int c = 0; c < HELLASWAG_CHOICES; c++) {
            size_t row = (size_t)(j * HELLASWAG_CHOICES + c) * T;
            for (int t = 0; t < context; t++) hs->inputs[row + t] = e[6 + t];
            for (int t = 0; t < completion[0]; t++) {
                // position context + t - 1 (the context's last token first) predicts the completion's token t
                hs->inputs[row + context + t] = completion[1 + t];
                hs->targets[row + context + t - 1] = completion[1 + t];
                hs->mask[row + context + t - 1] = 1;
            }
            completion += 1 + completion[0];
        }
    }
}

// The batch's right answers, from its (B, T) per-token losses: each completion's mean loss over its
// masked positions, the lowest mean the answer (the first of equal ones). results (NULL: none)
// receives per example: the answer, then the four mean losses.
static inline int hellaswag_score(const HellaSwag* hs, const float* losses, float* results) {
    int right = 0, T = hs->T;
    for (int j = 0; j < hs->per_batch; j++) {
        if (hs->example[j] < 0) continue;  // (padding)
        float mean[HELLASWAG_CHOICES];
        int answer = 0;
        for (int c = 0; c < HELLASWAG_CHOICES; c++) {
            size_t row = (size_t)(j * HELLASWAG_CHOICES + c) * T;
            double sum = 0.0;
            int count = 0;
            for (int t = 0; t < T; t++) {
                if (!hs->mask[row + t]) continue;
                sum += losses[row + t];
                count++;
            }
            mean[c] = (float)(sum / count);
            if (mean[c] < mean[answer]) answer = c;
        }
        right += answer == hellaswag_label(hs, hs->example[j]);
        if (results) {
            float* r = results + (size_t)hs->example[j] * (1 + HELLASWAG_CHOICES);
            r[0] = (float)answer;
            for (int c = 0; c < HELLASWAG_CHOICES; c++) r[1 + c] = mean[c];
        }
    }
    return right;
}

// LLMC_HELLASWAG_DUMP=path (tests): rank 0 writes each example's line there at every evaluation,
// "index label answer mean_loss0 .. mean_loss3", from results (n, 5) summed over the ranks
static inline void hellaswag_dump(const HellaSwag* hs, const float* results, const char* path) {
    char tmp[4200];
    FILE* f = fopen_temp(path, tmp, sizeof(tmp));
    for (int i = 0; i < hs->num_examples; i++) {
        const float* r = results + (size_t)i * (1 + HELLASWAG_CHOICES);
        fprintf(f, "%d %d %d %.9g %.9g %.9g %.9g\n", i, hellaswag_label(hs, i), (int)r[0], r[1], r[2], r[3], r[4]);
    }
    file_commit(f, tmp, path);
}

// One evaluation: every batch of this rank's share through the trainer's forward pass
// (token_losses: the (B, T) losses of a batch, on the host), scored; the right answers summed over
// `replicas` (an all-reduce SUM of one float, exact below 2^24: each rank scored different
// examples, and every rank reports the total; NULL where every rank scored all of them); rank
// (the world's) 0 prints the line and logs it
static inline void hellaswag_evaluate(HellaSwag* hs, CommGroup* replicas, int rank, int step, Logger* logger,
                                      const float* (*token_losses)(void*, const int*, const int*), void* trainer) {
    watchdog_phase("hellaswag", step);
    const char* dump = getenv("LLMC_HELLASWAG_DUMP");
    size_t fields = (size_t)hs->num_examples * (1 + HELLASWAG_CHOICES);
    float* results = dump && *dump ? (float*)calloc_check(fields, sizeof(float)) : NULL;
    int right = 0;
    for (int b = 0; b < hs->batches; b++) {
        watchdog_beat();
        hellaswag_fill(hs, b);
        right += hellaswag_score(hs, token_losses(trainer, hs->inputs, hs->targets), results);
    }
    float total = (float)right;
    if (replicas) comm_all_reduce_scalar(replicas, &total, COMM_SUM);
    // (the dump: each rank filled its examples' fields, zeros elsewhere; a sum puts them together)
    if (results && replicas) comm_all_reduce_host(replicas, results, fields, COMM_SUM);
    if (results && rank == 0) hellaswag_dump(hs, results, dump);
    free(results);
    double accuracy = (double)total / hs->num_examples;
    if (rank == 0) printf("step %d | hellaswag %d/%d = %.4f\n", step, (int)total, hs->num_examples, accuracy);
    if (logger->file)
        logger_line(logger, "{\"step\": %d, \"hellaswag\": %.9g, \"hellaswag_right\": %d, \"hellaswag_examples\": %d}\n",
                    step, accuracy, (int)total, hs->num_examples);
}

static inline void hellaswag_free(HellaSwag* hs) {
    free(hs->stream);
    free(hs->starts);
    free(hs->inputs);
    free(hs->targets);
    free(hs->mask);
    free(hs->example);
}

#endif
