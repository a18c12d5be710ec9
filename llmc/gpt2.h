// GPT-2 configuration, the layout of its 17 parameter tensors, model files (llm.c format) and
// random initialisation from a descriptor such as "d12". A Mixture-of-Experts GPT-2
// (train_gpt2_ep.cu) has E experts in every layer's MLP: its file has a router and an expert
// dimension in the MLP's tensors; a dense GPT-2 is E = 1, its router empty, its file llm.c's.
#ifndef LLMC_GPT2_H
#define LLMC_GPT2_H

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include "precision.h"
#include "rng.h"
#include "utils.h"

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5
// header[8] holds this tag when header[9] is the CRC-32 of header[0..8] and the parameters: files
// this project writes carry it (llm.c reads header[0..7] and ignores the rest); files from
// elsewhere have 0 there and load without a checksum
#define MODEL_CHECKSUM_TAG 0x43524333  // "3CRC"
#define GPT2_VOCAB_SIZE 50257
#define NUM_PARAMETER_TENSORS 17

typedef struct {
    int max_seq_len;        // maxT
    int vocab_size;         // V, e.g. 50257
    int padded_vocab_size;  // Vp, V rounded up to a multiple of 128
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    int experts;            // E: each layer's MLP is E experts and a router; 0 in a dense model
    int topk;               // k: the experts each token goes to (0 in a dense model)
} GPT2Config;

// the MLP copies a layer holds: E in a Mixture-of-Experts model, 1 in a dense one
static inline int gpt2_experts(GPT2Config c) { return c.experts > 1 ? c.experts : 1; }
static inline int gpt2_is_moe(GPT2Config c) { return c.experts > 1; }

// the tensors, in file order; every per-layer tensor is stacked over the L layers
typedef struct {
    floatX* wte;       // (Vp, C)   token embedding, tied to the LM head
    floatX* wpe;       // (maxT, C) position embedding
    floatX* ln1w;      // (L, C)
    floatX* ln1b;      // (L, C)
    floatX* qkvw;      // (L, 3C, C)
    floatX* qkvb;      // (L, 3C)
    floatX* attprojw;  // (L, C, C)
    floatX* attprojb;  // (L, C)
    floatX* ln2w;      // (L, C)
    floatX* ln2b;      // (L, C)
    floatX* routerw;   // (L, E, C)  Mixture-of-Experts only: the router; empty in a dense model
    floatX* fcw;       // (L, E, 4C, C)  E = 1 in a dense model: (L, 4C, C)
    floatX* fcb;       // (L, E, 4C)
    floatX* fcprojw;   // (L, E, C, 4C)
    floatX* fcprojb;   // (L, E, C)
    floatX* lnfw;      // (C)
    floatX* lnfb;      // (C)
} ParameterTensors;

// each tensor's index in that order (into parameter_names, a layout's sizes and offsets)
enum {
    PARAM_WTE, PARAM_WPE, PARAM_LN1W, PARAM_LN1B, PARAM_QKVW, PARAM_QKVB, PARAM_ATTPROJW, PARAM_ATTPROJB,
    PARAM_LN2W, PARAM_LN2B, PARAM_ROUTERW, PARAM_FCW, PARAM_FCB, PARAM_FCPROJW, PARAM_FCPROJB, PARAM_LNFW, PARAM_LNFB
};

static const char* parameter_names[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "routerw", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// AdamW decays the 2-D weight matrices only, never biases or LayerNorm gains (as in GPT-2/nanoGPT)
static const int parameter_is_matrix[NUM_PARAMETER_TENSORS] = {1, 1, 0, 0, 1, 0, 1, 0,
                                                                0, 0, 1, 1, 0, 1, 0, 0, 0};

static inline void gpt2_parameter_sizes(uint64_t sizes[NUM_PARAMETER_TENSORS], GPT2Config c) {
    uint64_t Vp = c.padded_vocab_size, C = c.channels, maxT = c.max_seq_len, L = c.num_layers;
    uint64_t E = (uint64_t)gpt2_experts(c), router = gpt2_is_moe(c) ? E : 0;
    sizes[PARAM_WTE] = Vp * C;
    sizes[PARAM_WPE] = maxT * C;
    sizes[PARAM_LN1W] = L * C;
    sizes[PARAM_LN1B] = L * C;
    sizes[PARAM_QKVW] = L * 3 * C * C;
    sizes[PARAM_QKVB] = L * 3 * C;
    sizes[PARAM_ATTPROJW] = L * C * C;
    sizes[PARAM_ATTPROJB] = L * C;
    sizes[PARAM_LN2W] = L * C;
    sizes[PARAM_LN2B] = L * C;
    sizes[PARAM_ROUTERW] = L * router * C;
    sizes[PARAM_FCW] = L * E * 4 * C * C;
    sizes[PARAM_FCB] = L * E * 4 * C;
    sizes[PARAM_FCPROJW] = L * E * C * 4 * C;
    sizes[PARAM_FCPROJB] = L * E * C;
    sizes[PARAM_LNFW] = C;
    sizes[PARAM_LNFB] = C;
}

static inline uint64_t gpt2_num_parameters(GPT2Config c) {
    uint64_t sizes[NUM_PARAMETER_TENSORS], total = 0;
    gpt2_parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) total += sizes[i];
    return total;
}

// model FLOPs per token of a training step (forward + backward = 3 x forward): 6 per parameter
// a token uses, plus the attention scores and their use, 12 L C T (PaLM paper, appendix B). A
// Mixture-of-Experts token uses k of each layer's E experts: the other E - k MLPs do not count.
// MFU's numerator, in the trainers' step lines and the step-time model's prediction alike
static inline double gpt2_flops_per_token(GPT2Config c, int T) {
    double C = c.channels, idle_experts = gpt2_is_moe(c) ? (double)(c.experts - c.topk) : 0.0;
    double active = (double)gpt2_num_parameters(c) - c.num_layers * idle_experts * (8.0 * C * C + 5.0 * C);
    return 6.0 * active + 12.0 * c.num_layers * C * (double)T;
}

static inline void gpt2_check_config(GPT2Config c, const char* source) {
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
        c.channels <= 0 || c.padded_vocab_size < c.vocab_size) {
        fail("%s: invalid GPT-2 config (maxT=%d V=%d Vp=%d L=%d NH=%d C=%d)", source,
             c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers, c.num_heads,
             c.channels);
    }
    // about 12 L C^2 + (Vp + maxT) C parameters; 2^50 is far beyond any memory and keeps every
    // size product in 64 bits
    double params = 12.0 * c.num_layers * c.channels * (double)c.channels +
                    ((double)c.padded_vocab_size + c.max_seq_len) * c.channels;
    if (params > 1125899906842624.0) fail("%s: a GPT-2 of %.3g parameters is too large", source, params);
    if (c.channels % c.num_heads != 0) {
        fail("%s: channels C=%d is not divisible by the number of heads NH=%d", source, c.channels,
             c.num_heads);
    }
    if (c.experts < 0 || c.experts > 1024 || (gpt2_is_moe(c) ? c.topk < 1 || c.topk > c.experts : c.topk != 0)) {
        fail("%s: invalid Mixture-of-Experts config: E=%d experts, top-k=%d (a dense model has 0 and 0; an MoE "
             "model 2 <= E <= 1024 and 1 <= k <= E)", source, c.experts, c.topk);
    }
}

// the trainers other than train_gpt2_ep hold dense MLPs only
static inline void gpt2_require_dense(GPT2Config c, const char* source, const char* trainer) {
    if (gpt2_is_moe(c)) {
        fail("%s is a Mixture-of-Experts model (E=%d experts, top-k %d): %s trains dense GPT-2 models only; "
             "train it with train_gpt2_ep", source, c.experts, c.topk, trainer);
    }
}

// ---------------------------------------------------------------------------------------------
// model files: 256 x int32 header, then all parameters in the order above (fp32 or bf16)

// (header[10..11], a Mixture-of-Experts model's E and k, are covered where they are set: a dense
// file's checksum stays what it was before they existed)
static inline uint32_t model_file_checksum(const int header[256], const void* params, uint64_t bytes) {
    uint32_t crc = crc32_update(0, header, 9 * sizeof(int));
    if (header[10] != 0 || header[11] != 0) crc = crc32_update(crc, header + 10, 2 * sizeof(int));
    return crc32_update(crc, params, bytes);
}

// a model that starts from nan or inf would train on silently: stop, naming the first bad value
static inline void gpt2_check_finite(const float* params, GPT2Config c, const char* source) {
    uint64_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_parameter_sizes(sizes, c);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        for (uint64_t i = 0; i < sizes[t]; i++) {
            if (!isfinite(params[offset + i])) {
                fail("%s: parameter %s[%zu] is %g; the weights must be finite numbers", source,
                     parameter_names[t], i, params[offset + i]);
            }
        }
        offset += sizes[t];
    }
}

// opens a model file and checks its header and size; returns the file positioned at the
// parameters, with the header and the config filled in
static inline FILE* gpt2_open_model_file(const char* path, int header[256], GPT2Config* config) {
    FILE* f = fopen_check(path, "rb");
    long file_bytes = file_size_check(f, path);
    if (file_bytes < 256 * (long)sizeof(int)) {
        fail("model file '%s' is %ld bytes, shorter than its 1024-byte header", path, file_bytes);
    }
    fread_check(header, sizeof(int), 256, f, path);
    if (header[0] != MODEL_MAGIC) {
        fail("model file '%s' has magic number %d, expected %d (an llm.c GPT-2 model file)", path,
             header[0], MODEL_MAGIC);
    }
    int version = header[1];
    if (version != MODEL_VERSION_FP32 && version != MODEL_VERSION_BF16) {
        fail("model file '%s' has version %d, expected %d (fp32) or %d (bf16)", path, version,
             MODEL_VERSION_FP32, MODEL_VERSION_BF16);
    }
    GPT2Config c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    c.experts = header[10];  // 0 in dense files (llm.c's, and this project's dense ones)
    c.topk = header[11];
    gpt2_check_config(c, path);
    uint64_t n = gpt2_num_parameters(c);
    uint64_t elem = version == MODEL_VERSION_FP32 ? 4 : 2;
    long expected = (long)(256 * sizeof(int) + n * elem);
    if (file_bytes != expected) {
        fail("model file '%s' is %ld bytes, expected %ld for its header's config (%zu parameters, "
             "%zu bytes each): truncated or corrupt", path, file_bytes, expected, n, elem);
    }
    *config = c;
    return f;
}

// the config of a model file, without reading its parameters (to plan memory before loading)
static inline void gpt2_read_model_config(const char* path, GPT2Config* config) {
    int header[256];
    fclose(gpt2_open_model_file(path, header, config));
}

// reads a model file into a newly allocated fp32 host buffer; bf16 files are widened exactly.
// crc (may be NULL) receives the checksum in the header, 0 when the file carries none.
static inline float* gpt2_read_model_file(const char* path, GPT2Config* config, uint32_t* crc) {
    int header[256];
    GPT2Config c;
    FILE* f = gpt2_open_model_file(path, header, &c);
    int version = header[1];
    uint64_t n = gpt2_num_parameters(c);
    uint64_t elem = version == MODEL_VERSION_FP32 ? 4 : 2;
    float* params = (float*)malloc_check(n * sizeof(float));
    void* raw = version == MODEL_VERSION_FP32 ? (void*)params : malloc_check(n * elem);
    fread_check(raw, elem, n, f, path);
    fclose(f);
    uint32_t file_crc = 0;
    if (header[8] == MODEL_CHECKSUM_TAG) {
        file_crc = model_file_checksum(header, raw, n * elem);
        if (file_crc != (uint32_t)header[9]) {
            fail("model file '%s' is corrupt: its CRC-32 is %08x, its header says %08x (a flipped "
                 "byte or a torn copy)", path, file_crc, (uint32_t)header[9]);
        }
    }
    if (crc) *crc = file_crc;
    if (version == MODEL_VERSION_BF16) {  // bf16 files are widened exactly
        for (uint64_t i = 0; i < n; i++) params[i] = bf16_to_float(((uint16_t*)raw)[i]);
        free(raw);
    }
    gpt2_check_finite(params, c, path);
    *config = c;
    return params;
}

// writes an fp32 (version 3) model file with its checksum, durably (utils.h); returns the checksum
static inline uint32_t gpt2_write_model_file(const char* path, GPT2Config c, const float* params) {
    int header[256];
    memset(header, 0, sizeof(header));
    header[0] = MODEL_MAGIC;
    header[1] = MODEL_VERSION_FP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    header[8] = MODEL_CHECKSUM_TAG;
    header[10] = gpt2_is_moe(c) ? c.experts : 0;  // (before the checksum, which covers them)
    header[11] = gpt2_is_moe(c) ? c.topk : 0;
    uint64_t n = gpt2_num_parameters(c);
    header[9] = (int)model_file_checksum(header, params, n * sizeof(float));
    char tmp[4200];
    FILE* f = fopen_temp(path, tmp, sizeof(tmp));
    fwrite_check(header, sizeof(int), 256, f, tmp);
    fwrite_check(params, sizeof(float), n, f, tmp);
    file_commit(f, tmp, path);
    return (uint32_t)header[9];
}

// ---------------------------------------------------------------------------------------------
// descriptors: "dL" builds a GPT-2 of depth L. The GPT-2 family (d12 124M, d24 350M, d36 774M,
// d48 1.5B) uses its published widths; any other depth gets C = 64 L with heads of size 64.

// Returns 0 when desc is not a descriptor (then it names a model file). A name that starts with
// d, has no / or ., is no file, and is not a valid descriptor (d0, dx, d12a) stops with a
// message about descriptors rather than a missing file.
static inline int gpt2_config_from_descriptor(const char* desc, GPT2Config* c) {
    if (desc[0] != 'd' || strpbrk(desc, "/.") != NULL) return 0;  // a path: dev/..., d.bin
    int digits = desc[1] != '\0';
    for (const char* p = desc + 1; *p; p++) digits &= isdigit((unsigned char)*p) != 0;
    int L = digits && strlen(desc) <= 5 ? atoi(desc + 1) : 0;
    if (L < 1 || L > 1000) {
        FILE* f = fopen(desc, "rb");
        if (f != NULL) {
            fclose(f);
            return 0;  // a model file that happens to start with d
        }
        check_every_rank(0, "-e '%s' is neither a model file nor a descriptor: dL builds a GPT-2 of depth L, 1 <= L "
                         "<= 1000 (d12: 124M)", desc);  // (every rank reads -e at the same point)
    }
    int C = 64 * L, NH = L;
    if (L == 24) { C = 1024; NH = 16; }
    if (L == 36) { C = 1280; NH = 20; }
    if (L == 48) { C = 1600; NH = 25; }
    c->max_seq_len = 1024;
    c->vocab_size = GPT2_VOCAB_SIZE;
    c->padded_vocab_size = ((GPT2_VOCAB_SIZE + 127) / 128) * 128;  // 50304
    c->num_layers = L;
    c->num_heads = NH;
    c->channels = C;
    c->experts = c->topk = 0;  // dense (train_gpt2_ep's -experts and -topk make it an MoE model)
    return 1;
}

// The tools' -e also takes a shape, L/C/NH (48/1600/25: GPT-2's vocabulary and maxT at that depth,
// width and heads), optionally with the longest sequence and the vocabulary, L/C/NH/maxT/V
// (96/12288/96/2048/51200: GPT-3 175B's shape as Megatron-LM trains it; the vocabulary padded to a
// multiple of 128, as GPT-2's 50257 is to 50304), beside a descriptor. Returns 0 when model is
// neither (then it names a file)
static inline int gpt2_config_from_shape(const char* model, GPT2Config* c) {
    int L, C, NH, maxT = 1024, V = GPT2_VOCAB_SIZE, used = 0;
    int fields = sscanf(model, "%d/%d/%d%n/%d%n/%d%n", &L, &C, &NH, &used, &maxT, &used, &V, &used);
    if (fields >= 3 && model[used] == '\0') {  // (the whole text read: 48/1600/25x is a file's name)
        if (L <= 0 || C <= 0 || NH <= 0 || C % NH != 0 || maxT <= 0 || V <= 0 || V > 65536) {
            fail("-e %s: expected L/C/NH[/maxT[/V]], all positive, with NH dividing C and V <= 65536 (tokens are "
                 "uint16 in the token files)", model);
        }
        gpt2_config_from_descriptor("d12", c);
        c->num_layers = L, c->channels = C, c->num_heads = NH, c->max_seq_len = maxT;
        c->vocab_size = V, c->padded_vocab_size = ((V + 127) / 128) * 128;
        return 1;
    }
    return gpt2_config_from_descriptor(model, c);
}

// N(0, 0.02) for matrices, residual projections scaled by 1/sqrt(2L) (GPT-2 paper, section 2.3),
// biases zero, LayerNorm gains one; the padding rows of wte stay zero as they are never used
static inline float* gpt2_init_random(GPT2Config c, uint64_t seed) {
    uint64_t sizes[NUM_PARAMETER_TENSORS], offset[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, c);
    offset[0] = 0;
    for (int i = 1; i < NUM_PARAMETER_TENSORS; i++) offset[i] = offset[i - 1] + sizes[i - 1];
    float* p = (float*)calloc_check(gpt2_num_parameters(c), sizeof(float));
    Rng rng;
    rng_init(&rng, seed);
    float residual_std = 0.02f / sqrtf(2.0f * (float)c.num_layers);
    // N(0, 0.02) for the embeddings and the first matmul of each half, 0.02/sqrt(2L) for the
    // projections that add into the residual stream (GPT-2's scaling), zero for the biases
    float std[NUM_PARAMETER_TENSORS] = {0};
    std[PARAM_WTE] = std[PARAM_WPE] = std[PARAM_QKVW] = std[PARAM_FCW] = 0.02f;
    std[PARAM_ATTPROJW] = std[PARAM_FCPROJW] = residual_std;
    std[PARAM_ROUTERW] = 0.02f;  // (Mixture-of-Experts; a router of zeros would tie every score: test/reference.py's too)
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        // wte: only the V real rows; the padding rows stay zero
        uint64_t n = i == PARAM_WTE ? (uint64_t)c.vocab_size * c.channels : sizes[i];
        if (std[i] > 0.0f) rng_normal_fill(&rng, p + offset[i], n, 0.0f, std[i]);
    }
    const int layernorm_gains[] = {PARAM_LN1W, PARAM_LN2W, PARAM_LNFW};  // one; their biases zero
    for (int j = 0; j < 3; j++) {
        for (uint64_t k = 0; k < sizes[layernorm_gains[j]]; k++) p[offset[layernorm_gains[j]] + k] = 1.0f;
    }
    return p;
}

#endif
