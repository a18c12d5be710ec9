// The GPT-2 model state one rank holds, shared by every trainer: the parameters (with their
// gradients, fp32 master weights and AdamW moments, in one flat buffer each, in the model file's
// tensor order), the activations of the forward pass in one arena, views of one layer's slice of
// both, and the loss. What a trainer does with them (which layers, which shard, which
// collectives) stays in the trainer.
// Counts and sizes are uint64_t rather than size_t here (and in gpt2.h, stage.h, memory_plan.h):
// the same type on every machine the trainers run on, and still 64 bits where size_t is 32, in
// the WebAssembly build of dev/memory_planner that dev/memory.html runs (a 1.5B model's AdamW
// moments alone pass 4 GB).
#ifndef LLMC_MODEL_H
#define LLMC_MODEL_H

#include "gpt2.h"
#include "ops.h"
#include "target.h"

// the widths of one layer on one rank: with tensor parallelism over tp ranks a rank holds NH/tp
// heads, so 3C/tp of qkv, C/tp of the attention output and 4C/tp of the MLP; tp = 1 otherwise.
// With sequence parallelism the residual stream (and the LayerNorms on it) is split too: a rank
// holds B*T/seq_shards of its tokens.
typedef struct {
    int C;           // residual stream width, always whole
    int qkv;         // 3C / tp
    int att;         // C / tp: the attention output, the input of the attention projection
    int fc;          // 4C / tp
    int NH;          // heads, NH / tp
    int Vp_rank;     // this rank's logits per token: Vp, or Vp / tp with a vocabulary-parallel LM head
    int tp;          // tensor-parallel ranks
    int seq_shards;  // tp with sequence parallelism, else 1
    int tp_overlap;  // -tp_overlap 1: tp's collectives in ring steps under their GEMMs (tensor_parallel.h)
    DeviceTarget target;  // how the tensors are stored: this build's (or the planner's machine's)
} LayerDims;

// the machine this build runs on (llmc/target.h): the CPU backend in fp32, or CUDA in floatX,
// with flash attention where the head size allows it and LLMC_ATTENTION does not ask for cuBLAS
static inline DeviceTarget build_target(GPT2Config c) {
#ifdef __CUDACC__
    DeviceTarget t = {1, (int)sizeof(floatX), attention_uses_flash(c.channels, c.num_heads), 0};
    // (LLMC_BIAS_GRAD, LLMC_GELU, LLMC_CLASSIFIER, LLMC_LAYERNORM_BACKWARD, LLMC_FLASH and
    // LLMC_FLASH_BACKWARD read now, so a bad value stops before any file is written)
    bias_grad_in_epilogue();
    gelu_in_epilogue();
    classifier_split_asked();
    layernorm_backward_fused_asked();
#if !FLOATX_IS_FLOAT
    flash_wgmma_asked();
    t.flash_one_kernel = t.flash && flash_one_kernel_asked();
#endif
#else
    (void)c;
    DeviceTarget t = {0, (int)sizeof(float), 0, 0};
#endif
    return t;
}

// 0 when tp ranks can split the layers of model c on target t, else 1 with the reason in why
static inline int layer_dims_problem(GPT2Config c, int tp, DeviceTarget t, char* why, uint64_t why_size) {
    const char* what[3] = {"the heads NH", "the MLP width 4C", "the padded vocabulary Vp"};
    int n[3] = {c.num_heads, 4 * c.channels, c.padded_vocab_size};
    for (int i = 0; i < 3; i++) {
        if (n[i] % tp != 0) {
            snprintf(why, why_size, "-tp %d: tensor parallelism splits %s = %d over the ranks, and %d does not divide "
                     "it (the model has NH=%d, C=%d, Vp=%d)", tp, what[i], n[i], tp, c.num_heads, c.channels,
                     c.padded_vocab_size);
            return 1;
        }
    }
    // the CUDA loss kernels read a rank's row of logits 16 bytes at a time
    if (t.cuda && c.padded_vocab_size / tp % (16 / t.X) != 0) {
        snprintf(why, why_size, "-tp %d: each rank's Vp/tp = %d logits per token must be a multiple of %d for the CUDA "
                 "kernels", tp, c.padded_vocab_size / tp, 16 / t.X);
        return 1;
    }
    return 0;
}

// tp: tensor-parallel ranks (1: none); sp: 1 to split the residual stream over them as well;
// target: the machine (build_target for this one's)
static inline LayerDims layer_dims_for(GPT2Config c, int tp, int sp, DeviceTarget target) {
    char why[256];
    if (layer_dims_problem(c, tp, target, why, sizeof(why))) fail("%s", why);
    LayerDims d = {c.channels, 3 * c.channels / tp, c.channels / tp, 4 * c.channels / tp,
                   c.num_heads / tp, c.padded_vocab_size / tp, tp, sp && tp > 1 ? tp : 1, 0, target};
    return d;
}
static inline LayerDims layer_dims(GPT2Config c, int tp, int sp) { return layer_dims_for(c, tp, sp, build_target(c)); }

// a Mixture-of-Experts model's layers: no dense MLP (fc = 0), so the activation arena holds none
// of its tensors; the experts keep their own (llmc/moe.h)
static inline LayerDims layer_dims_moe(LayerDims d) {
    d.fc = 0;
    return d;
}

// The vocabulary of tensor-parallel rank r is the tokens [r Vp/tp, (r+1) Vp/tp); of those
// columns the first `real` ones are tokens (below V), the rest padding (none on most ranks).
static inline int vocab_real_columns(GPT2Config c, LayerDims d, int tp_rank) {
    int real = c.vocab_size - tp_rank * d.Vp_rank;
    return real < 0 ? 0 : real < d.Vp_rank ? real : d.Vp_rank;
}

// ---------------------------------------------------------------------------------------------
// the parameters on one rank. With tensor parallelism (Megatron-LM) a rank holds slices of 7 of
// the 17 tensors and a whole copy of the others; `r` is its rank in the tensor-parallel group:
//   wte        rows [r Vp/tp, (r+1) Vp/tp): its part of the vocabulary (embedding and LM head)
//   qkvw, qkvb the q, k and v rows of heads [r NH/tp, (r+1) NH/tp)      column-parallel
//   attprojw   input columns [r C/tp, (r+1) C/tp)                        row-parallel
//   fcw, fcb   rows [r 4C/tp, (r+1) 4C/tp)                               column-parallel
//   fcprojw    input columns [r 4C/tp, (r+1) 4C/tp)                      row-parallel
//   wpe, the LayerNorms, attprojb, fcprojb: whole on every rank (replicated)
// (routerw is empty in a dense model, and the MLP's tensors hold one expert: E = 1. With
// Mixture-of-Experts and expert parallelism over ep ranks, rank r holds experts
// [r E/ep, (r+1) E/ep) of the four MLP tensors, whole, and the rest whole: train_gpt2_ep.cu.)
// With pipeline parallelism over pp stages a rank holds the per-layer tensors of its stage's
// layers only: L/pp of them, in V chunks of L/(pp V) consecutive layers, chunk c of stage s being
// layers [(c pp + s) L/(pp V), ...) (one chunk without interleaving). The first stage holds wte
// and wpe, the last lnfw, lnfb and a copy of wte for the tied LM head; other stages hold none of
// the four. The pieces keep the model file's tensor order in one flat buffer per rank (a tensor a
// rank does not hold has size 0); tp = pp = 1 is the file.

typedef enum { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS } TensorSplit;

// a tensor of the file as layers x groups x rows x cols (qkvw: L x 3 x C x C, q k v stacked; the
// MLP's: L x E x rows x cols, the experts stacked, GROUPS_EXPERTS: under expert parallelism each
// rank holds E/ep whole experts)
typedef enum { GROUPS_WHOLE, GROUPS_EXPERTS } TensorGroups;
typedef struct {
    uint64_t layers, groups, rows, cols;
    TensorSplit split;
    TensorGroups grouping;  // GROUPS_EXPERTS: the groups are the experts (ep splits them)
} TensorShape;

static inline TensorShape tensor_shape(GPT2Config c, int i) {
    uint64_t L = c.num_layers, C = c.channels, Vp = c.padded_vocab_size, maxT = c.max_seq_len;
    uint64_t E = (uint64_t)gpt2_experts(c), R = gpt2_is_moe(c) ? E : 0;  // the router's rows
    TensorGroups W = GROUPS_WHOLE, X = GROUPS_EXPERTS;
    TensorShape shapes[NUM_PARAMETER_TENSORS] = {
        {1, 1, Vp, C, SPLIT_ROWS, W},    {1, 1, maxT, C, SPLIT_NONE, W},     // wte wpe
        {L, 1, 1, C, SPLIT_NONE, W},     {L, 1, 1, C, SPLIT_NONE, W},        // ln1w ln1b
        {L, 3, C, C, SPLIT_ROWS, W},     {L, 3, C, 1, SPLIT_ROWS, W},        // qkvw qkvb
        {L, 1, C, C, SPLIT_COLS, W},     {L, 1, 1, C, SPLIT_NONE, W},        // attprojw attprojb
        {L, 1, 1, C, SPLIT_NONE, W},     {L, 1, 1, C, SPLIT_NONE, W},        // ln2w ln2b
        {L, 1, R, C, SPLIT_NONE, W},                                         // routerw
        {L, E, 4 * C, C, SPLIT_ROWS, X}, {L, E, 4 * C, 1, SPLIT_ROWS, X},    // fcw fcb
        {L, E, C, 4 * C, SPLIT_COLS, X}, {L, E, 1, C, SPLIT_NONE, X},        // fcprojw fcprojb
        {1, 1, 1, C, SPLIT_NONE, W},     {1, 1, 1, C, SPLIT_NONE, W}};       // lnfw lnfb
    return shapes[i];
}

// the 13 tensors stacked over the layers (ln1w .. fcprojb), as opposed to wte, wpe, lnfw, lnfb
#define PARAM_FIRST_PER_LAYER PARAM_LN1W
#define PARAM_LAST_PER_LAYER PARAM_FCPROJB
#define PER_LAYER_TENSORS (PARAM_LAST_PER_LAYER - PARAM_FIRST_PER_LAYER + 1)
static inline int tensor_is_per_layer(int i) { return i >= PARAM_FIRST_PER_LAYER && i <= PARAM_LAST_PER_LAYER; }

typedef struct {
    int tp, tp_rank;
    int ep, ep_rank;        // expert parallelism: this rank holds experts [ep_rank E/ep, (ep_rank+1) E/ep)
    int pp, stage, chunks;  // pipeline stages, this rank's stage, chunks per stage (V)
    int v_shape;            // 1: two chunks in a V (zbv, dualpipev; llmc/pipeline.h): chunk 1 of stage
                            // s is virtual stage 2 pp - 1 - s, and the head is on stage 0
    int layers;             // layers this rank holds: L / pp
    int embedding, head;    // 1: holds wte and wpe (first stage) / lnfw, lnfb and wte (last; in a V
                            // the first, whose one wte serves both)
    uint64_t sizes[NUM_PARAMETER_TENSORS];    // elements of each tensor on this rank
    uint64_t offsets[NUM_PARAMETER_TENSORS];  // where each starts in this rank's flat buffer
    uint64_t file_offsets[NUM_PARAMETER_TENSORS];  // where the whole tensor starts in the file
    uint64_t rounding[NUM_PARAMETER_TENSORS];  // stochastic rounding index of its first element
    int sharded[NUM_PARAMETER_TENSORS];      // 1: sliced over the tp ranks; 0: replicated (or experts)
    uint64_t layer_stride[NUM_PARAMETER_TENSORS];  // from one layer's slice of a tensor to the next's
    uint64_t count;                            // elements on this rank (with buckets, padding included)
    // In buckets (parameter_layout_buckets) instead of the file's order; else all 0
    int shards;                  // each bucket splits into this many equal shards (ZeRO's ranks)
    uint64_t bucket_sizes[3];      // padded: the embeddings' bucket, one layer's, the final LayerNorm's
    int zero, shard_rank;        // ZeRO's stage (0: nothing sharded) and this rank's shard
    // With experts their tensors close the buffer, in a region of their own: expert_region
    // elements (padded like the rest under ZeRO), which ZeRO-1 shards over the expert_shards
    // ranks holding the same experts (edp) instead of the dense part's `shards` (dp x cp)
    uint64_t expert_region;
    int expert_shards, expert_shard_rank;
    unsigned gathered;           // the tensors a gather of the whole model takes from this rank (a
                                 // bit each: parameter_layout_of_rank)
} ParameterLayout;

// Mixture-of-Experts: the four MLP tensors hold E experts, each whole on the rank that holds it
// (expert parallelism splits the experts, never an expert: expert tp = 1, as in Megatron-LM's
// parallel folding); in a dense model they are the one MLP, which tensor parallelism slices
static inline int tensor_is_expert(GPT2Config c, int i) {
    return gpt2_is_moe(c) && tensor_shape(c, i).grouping == GROUPS_EXPERTS;
}

// the model's layer that is local layer j of this rank (layers are stored chunk after chunk):
// chunk c of stage s is virtual stage c pp + s, or in a V chunk 1 is 2 pp - 1 - s, and virtual
// stage v holds layers v per_chunk ... (v + 1) per_chunk - 1
static inline int layout_layer(const ParameterLayout* p, int j) {
    int per_chunk = p->layers / p->chunks, chunk = j / per_chunk;
    int virtual_stage = p->v_shape && chunk == 1 ? 2 * p->pp - 1 - p->stage : chunk * p->pp + p->stage;
    return virtual_stage * per_chunk + j % per_chunk;
}

// Stochastic rounding draws its bits from (seed, index): a replicated tensor uses the same
// indices on every rank (its copies must round alike and stay identical: the LayerNorms over tp
// ranks, the tied wte on the first and last stage), a piece the indices after the pieces of the
// ranks before it (every element of the model its own bits).
static inline ParameterLayout parameter_layout_experts(GPT2Config c, int tp, int tp_rank, int pp, int stage, int chunks,
                                                       int v_shape, int ep, int ep_rank) {
    ParameterLayout p;
    p.tp = tp;
    p.tp_rank = tp_rank;
    p.ep = ep;
    p.ep_rank = ep_rank;
    p.pp = pp;
    p.stage = stage;
    p.chunks = chunks;
    p.v_shape = v_shape;
    p.layers = c.num_layers / pp;
    p.embedding = stage == 0;
    p.head = stage == (v_shape ? 0 : pp - 1);
    int held[NUM_PARAMETER_TENSORS];
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) held[i] = 1;
    held[PARAM_WTE] = p.embedding || p.head;
    held[PARAM_WPE] = p.embedding;
    held[PARAM_LNFW] = held[PARAM_LNFB] = p.head;
    uint64_t file = 0, local = 0;
    p.shards = 0;
    p.zero = p.shard_rank = 0;
    p.expert_region = 0;
    p.expert_shards = 1, p.expert_shard_rank = 0;
    for (int k = 0; k < 3; k++) p.bucket_sizes[k] = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {  // (the dense tensors' places; the experts' below)
        TensorShape s = tensor_shape(c, i);
        uint64_t whole = s.layers * s.groups * s.rows * s.cols;
        int experts_split = s.grouping == GROUPS_EXPERTS && ep > 1;
        uint64_t mine = tensor_is_per_layer(i) ? whole / s.layers * p.layers : whole;
        if (experts_split) mine /= (uint64_t)ep;
        p.sharded[i] = s.split != SPLIT_NONE && tp > 1 && !tensor_is_expert(c, i);
        p.sizes[i] = held[i] ? (p.sharded[i] ? mine / tp : mine) : 0;
        p.offsets[i] = local;
        p.layer_stride[i] = tensor_is_per_layer(i) ? p.sizes[i] / p.layers : 0;  // the layers stacked
        p.file_offsets[i] = file;
        uint64_t piece = (uint64_t)(tensor_is_per_layer(i) ? stage : 0) * (p.sharded[i] ? tp : 1) + (p.sharded[i] ? tp_rank : 0);
        if (experts_split) piece = piece * (uint64_t)ep + (uint64_t)ep_rank;
        p.rounding[i] = file + piece * p.sizes[i];
        if (!tensor_is_expert(c, i)) local += p.sizes[i];
        file += whole;
    }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {  // the experts after every dense tensor, in the file's order
        if (!tensor_is_expert(c, i)) continue;
        p.offsets[i] = local;
        local += p.sizes[i];
        p.expert_region += p.sizes[i];
    }
    p.count = local;
    p.gathered = (1u << NUM_PARAMETER_TENSORS) - 1;
    return p;
}
static inline ParameterLayout parameter_layout_grid(GPT2Config c, int tp, int tp_rank, int pp, int stage, int chunks,
                                                    int v_shape) {
    return parameter_layout_experts(c, tp, tp_rank, pp, stage, chunks, v_shape, 1, 0);
}

// Data parallelism with ZeRO (train_gpt2_dp.cu) shards by buckets, the units in which gradients
// are reduced and parameters gathered: bucket 0 is the embeddings (wte, wpe), bucket 1 + l layer
// l's per-layer tensors, bucket L + 1 the final LayerNorm. So that a bucket is one contiguous range
// (one collective each, no copies), the buffer holds the model bucket after bucket, each layer's
// slices of the per-layer tensors together, instead of the file's order (every layer's qkvw
// together); files are converted on reading and writing (parameter_shard_copy). Each bucket is
// padded to a multiple of `shards` x ZERO_ALIGN elements (zeros that no tensor covers), so it
// splits into `shards` equal shards, each a whole number of 16-byte packs and 256-byte aligned
// for the GPU's loads. shards = 1: no padding at all (DDP).
#define ZERO_ALIGN 128

static inline uint64_t round_up(uint64_t n, uint64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// ZeRO stage `zero` on rank `rank` of `ranks`: stage 0 (DDP) keeps whole unpadded buckets
static inline ParameterLayout parameter_layout_buckets(GPT2Config c, int zero, int ranks, int rank) {
    ParameterLayout p = parameter_layout_grid(c, 1, 0, 1, 0, 1, 0);
    int shards = zero > 0 ? ranks : 1;
    uint64_t pad = zero > 0 ? (uint64_t)shards * ZERO_ALIGN : 1;
    p.shards = shards;
    p.zero = zero;
    p.shard_rank = zero > 0 ? rank : 0;
    uint64_t embedding = round_up(p.sizes[0] + p.sizes[1], pad), layer = 0;
    p.offsets[PARAM_WTE] = 0;
    p.offsets[PARAM_WPE] = p.sizes[PARAM_WTE];
    for (int i = PARAM_FIRST_PER_LAYER; i <= PARAM_LAST_PER_LAYER; i++) {  // where each tensor's slice sits in a layer's bucket
        p.offsets[i] = embedding + layer;
        layer += p.sizes[i] / p.layers;
    }
    layer = round_up(layer, pad);
    for (int i = PARAM_FIRST_PER_LAYER; i <= PARAM_LAST_PER_LAYER; i++) p.layer_stride[i] = layer;
    p.offsets[PARAM_LNFW] = embedding + (uint64_t)p.layers * layer;
    p.offsets[PARAM_LNFB] = p.offsets[PARAM_LNFW] + p.sizes[PARAM_LNFW];
    p.bucket_sizes[0] = embedding;
    p.bucket_sizes[1] = layer;
    p.bucket_sizes[2] = round_up(p.sizes[PARAM_LNFW] + p.sizes[PARAM_LNFB], pad);
    p.count = embedding + (uint64_t)p.layers * layer + p.bucket_sizes[2];
    return p;
}

// (a flat layout, layout_shard_flat's, is one bucket: the rank's whole buffer)
static inline int parameter_num_buckets(const ParameterLayout* p) { return p->bucket_sizes[1] > 0 ? p->layers + 2 : 1; }

// the kind of bucket k: 0 the embeddings, 1 a layer, 2 the final LayerNorm (bucket_sizes' index)
static inline int parameter_bucket_kind(const ParameterLayout* p, int k) { return k == 0 ? 0 : k <= p->layers ? 1 : 2; }

// bucket k's range in a layout in buckets: its first element and its (padded) size
static inline uint64_t parameter_bucket_size(const ParameterLayout* p, int k) {
    return p->bucket_sizes[parameter_bucket_kind(p, k)];
}

// the largest bucket: the embeddings' in any GPT-2 (Vp + maxT rows of C against 12 C^2 + 13 C)
static inline uint64_t parameter_largest_bucket(const ParameterLayout* p) {
    uint64_t most = 0;
    for (int kind = 0; kind < 3; kind++) most = p->bucket_sizes[kind] > most ? p->bucket_sizes[kind] : most;
    return most;
}
static inline uint64_t parameter_bucket_offset(const ParameterLayout* p, int k) {
    return k == 0 ? 0 : p->bucket_sizes[0] + (uint64_t)(k - 1) * p->bucket_sizes[1];
}

// What a rank holds of each per-parameter buffer: everything, or from a ZeRO stage on (the
// optimizer state from 1, the gradients from 2, the parameters from 3) its shard of every bucket,
// the shards one after another (bucket k's at parameter_bucket_offset / shards)
static inline uint64_t layout_held(const ParameterLayout* p, int sharded_from_stage) {
    if (!(p->zero >= sharded_from_stage && p->zero > 0)) return p->count;
    return (p->count - p->expert_region) / p->shards + p->expert_region / p->expert_shards;
}
static inline uint64_t layout_state_held(const ParameterLayout* p) { return layout_held(p, 1); }
static inline uint64_t layout_grads_held(const ParameterLayout* p) { return layout_held(p, 2); }
static inline uint64_t layout_params_held(const ParameterLayout* p) { return layout_held(p, 3); }

// this rank's shard of bucket k: n elements from `global` in the whole buffer, at `local` in a
// buffer of shards
static inline void layout_bucket_shard(const ParameterLayout* p, int k, uint64_t* global, uint64_t* local, uint64_t* n) {
    *n = parameter_bucket_size(p, k) / p->shards;
    *global = parameter_bucket_offset(p, k) + (uint64_t)p->shard_rank * *n;
    *local = parameter_bucket_offset(p, k) / p->shards;
}

// A flat layout's (layout_shard_flat) two shards: the dense region's n_dense elements from
// dense_lo, then the experts' n_experts from experts_lo (none in a dense model); in a buffer
// of shards the experts' follows the dense one, at n_dense
static inline void layout_flat_shards(const ParameterLayout* p, uint64_t* dense_lo, uint64_t* n_dense,
                                      uint64_t* experts_lo, uint64_t* n_experts) {
    *n_dense = (p->count - p->expert_region) / p->shards;
    *dense_lo = (uint64_t)p->shard_rank * *n_dense;
    *n_experts = p->expert_region / p->expert_shards;
    *experts_lo = p->count - p->expert_region + (uint64_t)p->expert_shard_rank * *n_experts;
}

// the rank's shards of a whole buffer (host, fp32), into `shards`
static inline void layout_take_shards(const ParameterLayout* p, const float* whole, float* shards) {
    for (int k = 0; k < parameter_num_buckets(p); k++) {
        uint64_t global, local, n;
        layout_bucket_shard(p, k, &global, &local, &n);
        memcpy(shards + local, whole + global, n * sizeof(float));
    }
    if (p->expert_region > 0) {  // (a flat layout with experts: their shard after the dense one)
        uint64_t dense_lo, n_dense, experts_lo, n_experts;
        layout_flat_shards(p, &dense_lo, &n_dense, &experts_lo, &n_experts);
        memcpy(shards + n_dense, whole + experts_lo, n_experts * sizeof(float));
    }
}

// ZeRO-1 across the data-parallel replicas of a model-parallel rank (train_gpt2_3d.cu): its whole
// flat buffer (its tp slices of its stage's tensors) is one bucket, split into `shards` equal
// contiguous shards, rank shard_rank updating one; Megatron-LM's distributed optimizer does the
// same. The buffer is padded with zeros to a multiple of shards x ZERO_ALIGN elements, so the
// shards are equal and aligned. With experts two regions, each padded and split so: the dense
// tensors over `shards` ranks (dp x cp), the experts, which other ranks hold copies of, over
// their expert_shards (edp) at expert_shard_rank. zero = 0 leaves the layout as it is.
static inline void layout_shard_flat(ParameterLayout* p, int zero, int shards, int shard_rank, int expert_shards,
                                     int expert_shard_rank) {
    if (zero == 0) return;
    p->zero = zero;
    p->shards = shards;
    p->shard_rank = shard_rank;
    p->expert_shards = expert_shards;
    p->expert_shard_rank = expert_shard_rank;
    uint64_t dense = p->count - p->expert_region, dense_padded = round_up(dense, (uint64_t)shards * ZERO_ALIGN);
    uint64_t experts = round_up(p->expert_region, (uint64_t)expert_shards * ZERO_ALIGN);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {  // (the experts move past the dense region's padding)
        if (p->offsets[i] >= dense && p->sizes[i] > 0) p->offsets[i] += dense_padded - dense;
    }
    p->count = dense_padded + experts;
    p->expert_region = experts;
    p->bucket_sizes[0] = dense_padded;
    p->bucket_sizes[1] = p->bucket_sizes[2] = 0;
}

// a rank of tensor parallelism alone (one pipeline stage)
static inline ParameterLayout parameter_layout(GPT2Config c, int tp, int tp_rank) {
    return parameter_layout_grid(c, tp, tp_rank, 1, 0, 1, 0);
}

// the ranks a model is split over: tp x pp; with experts split over ep ranks, each stage's pieces
// lie on max(tp, ep) ranks: its first tp hold the tp slices of its dense tensors (one replica's),
// its first ep the experts (the grid trainer's parallel folding puts a stage's ep ranks first,
// then its tp ranks, on its consecutive ranks; train_gpt2_ep: tp = pp = 1, its ep ranks)
static inline int layout_model_ranks(const ParameterLayout* p) {
    return p->pp * (p->tp > p->ep ? p->tp : p->ep);
}

// the layout of rank r of the model-parallel group this layout belongs to (numbered stage by
// stage, max(tp, ep) ranks each): r's tp slices of its stage's dense tensors and its experts; a
// gather takes the dense tensors from the stage's first tp ranks and the experts from its first
// ep (`gathered`), each piece once (the tied wte from both its stages: identical copies). (With the same ZeRO padding as this one: its buffers have as
// many elements as that rank's.)
static inline ParameterLayout parameter_layout_of_rank(GPT2Config c, const ParameterLayout* p, int r) {
    int per_stage = p->tp > p->ep ? p->tp : p->ep, stage = r / per_stage, local = r % per_stage;
    ParameterLayout of_r = parameter_layout_experts(c, p->tp, local % p->tp, p->pp, stage, p->chunks, p->v_shape, p->ep,
                                                     local % p->ep);
    of_r.gathered = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int holds_it = tensor_is_expert(c, i) ? local < p->ep : local < p->tp;
        if (holds_it) of_r.gathered |= 1u << i;
    }
    layout_shard_flat(&of_r, p->zero, p->shards, p->shard_rank, p->expert_shards, p->expert_shard_rank);
    return of_r;
}

// copies this rank's pieces between the whole model in the file's layout and the rank's own
// flat buffer: full -> shard with to_shard = 1 (loading), shard -> full with 0 (gathering)
static inline void parameter_shard_copy(float* full, float* shard, const ParameterLayout* p, GPT2Config c,
                                        int to_shard) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (p->sizes[i] == 0 || (!to_shard && !(p->gathered & (1u << i)))) continue;  // (another rank's copy is gathered)
        TensorShape s = tensor_shape(c, i);
        int split = p->sharded[i] ? s.split : SPLIT_NONE;
        uint64_t rows = split == SPLIT_ROWS ? s.rows / p->tp : s.rows;
        uint64_t cols = split == SPLIT_COLS ? s.cols / p->tp : s.cols;
        uint64_t row0 = split == SPLIT_ROWS ? (uint64_t)p->tp_rank * rows : 0;
        uint64_t col0 = split == SPLIT_COLS ? (uint64_t)p->tp_rank * cols : 0;
        uint64_t layers = tensor_is_per_layer(i) ? (uint64_t)p->layers : 1;
        // the groups this rank holds: all, or under expert parallelism its experts
        uint64_t groups = s.grouping == GROUPS_EXPERTS ? s.groups / (uint64_t)p->ep : s.groups;
        uint64_t group0 = s.grouping == GROUPS_EXPERTS ? (uint64_t)p->ep_rank * groups : 0;
        for (uint64_t lg = 0; lg < layers * groups; lg++) {  // each layer's (each q/k/v's, each expert's) block
            uint64_t local = lg / groups, group = lg % groups;
            uint64_t layer = tensor_is_per_layer(i) ? (uint64_t)layout_layer(p, (int)local) : 0;
            uint64_t block = layer * s.groups + group0 + group;  // ... where it sits in the file
            for (uint64_t j = 0; j < rows; j++) {
                float* f = full + p->file_offsets[i] + (block * s.rows + row0 + j) * s.cols + col0;
                float* h = shard + p->offsets[i] + local * p->layer_stride[i] + (group * rows + j) * cols;
                memcpy(to_shard ? h : f, to_shard ? f : h, cols * sizeof(float));
            }
        }
    }
}

// each tensor's pointer into a flat buffer of this rank's layout
static inline void parameter_point(ParameterTensors* t, floatX* base, const ParameterLayout* p) {
    floatX** ptrs[NUM_PARAMETER_TENSORS] = {
        &t->wte, &t->wpe, &t->ln1w, &t->ln1b, &t->qkvw, &t->qkvb, &t->attprojw, &t->attprojb,
        &t->ln2w, &t->ln2b, &t->routerw, &t->fcw, &t->fcb, &t->fcprojw, &t->fcprojb, &t->lnfw, &t->lnfb};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) *ptrs[i] = base + p->offsets[i];
}

// ---------------------------------------------------------------------------------------------
// activations: what the forward pass keeps for the backward pass, plus backward scratch buffers.
// Tensors are floatX (bf16 or fp32); LayerNorm statistics and losses stay fp32. The widths are a
// rank's (LayerDims): with tensor parallelism qkv, atty, fch and the logits hold its shard only;
// with sequence parallelism the residual stream and the LayerNorm statistics hold B*T/seq_shards
// tokens (BTs below), while the LayerNorm outputs are kept whole, as gathered for the matmuls.
// An arena holds some of three parts: what one micro-batch keeps through `layers` layers
// (ACTS_LAYERS), what the LM head and the loss keep (ACTS_HEAD), and the backward pass's scratch
// (ACTS_SCRATCH), and with recomputation (-r, below) one layer's buffers for what is not kept
// (ACTS_RECOMPUTE). DP and TP keep one micro-batch at a time: one arena of all four. A pipeline
// stage keeps several micro-batches in flight: an arena of the scratch and the recompute
// buffers, and one per micro-batch in flight of its layers (and head); the pointers of parts an
// arena lacks are NULL.

typedef struct {
    floatX* encoded;    // (BTs, C)       token + position embedding, the residual stream's input
    floatX* ln1;        // (L, B, T, C)
    float* ln1_mean;    // (L, BTs)
    float* ln1_rstd;    // (L, BTs)
    floatX* qkv;        // (L, B, T, 3C)
    floatX* atty;       // (L, B, T, C)   attention output before its projection
    char* att_state;    // (L, attention_state_size) what attention keeps for its backward pass:
                        // the (B, NH, T, T) probabilities, or the flash path's (B, NH, T) lse
    floatX* attproj;    // (L, B, T, C)
    floatX* residual2;  // (L, BTs, C)    residual stream after attention
    floatX* ln2;        // (L, B, T, C)
    float* ln2_mean;    // (L, BTs)
    float* ln2_rstd;    // (L, BTs)
    floatX* fch;        // (L, B, T, 4C)
    floatX* fch_gelu;   // (L, B, T, 4C)
    floatX* fcproj;     // (L, B, T, C)
    floatX* residual3;  // (L, BTs, C)    residual stream after the MLP = next layer's input
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (BTs)
    float* lnf_rstd;    // (BTs)
    floatX* logits;     // (B, T, Vp)     overwritten with its gradient by the loss
    float* losses;      // (B, T)
    floatX* dresidual;  // (BTs, C)       gradient of the residual stream, flowing down the layers
    floatX* dbuf;       // (B, T, C)      gradient of a LayerNorm output or of the attention output
                        //                (and the TP embedding's partial sum in the forward pass)
    floatX* dqkv;       // (B, T, 3C)
    floatX* dfch;       // (B, T, 4C)
    float* row_max;     // (B, T)         vocabulary-parallel loss: each row's maximum logit
    float* row_sums;    // (B, T, 2)      ... its sum of exponentials and its target's logit
    // only with sequence parallelism
    floatX* reduced;    // (BTs, C)       this rank's tokens of a reduce-scatter's result
    floatX* ln_shard;   // (BTs, C)       a LayerNorm's output on this rank's tokens, before the
                        //                all-gather that fills the whole (B, T, C) ln1/ln2/lnf
    floatX* dgathered;  // (B, T, C)      dresidual all-gathered over the sequence
    unsigned kept;      // the per-layer tensors kept for every layer (KEEP_ bits, below); each
                        // of the others is one layer's buffer, recomputed in the backward pass
    char* arena;        // the memory all of them point into
    uint64_t arena_bytes;
} Activations;

// ACTS_RECOMPUTE: one layer's buffers for the activations recomputation does not keep (below)
enum { ACTS_LAYERS = 1, ACTS_HEAD = 2, ACTS_SCRATCH = 4, ACTS_RECOMPUTE = 8, ACTS_ALL = 15 };

// ---------------------------------------------------------------------------------------------
// Activation recomputation (-r; Chen et al. 2016, arXiv:1604.06174, and for the selective kind
// Korthikanti et al. 2022, arXiv:2205.05198). The forward pass need not keep every tensor it
// writes: a tensor it drops lives in one layer's buffer, which the next layer overwrites, and the
// backward pass computes it again, with the same kernels on the same inputs, just before it
// needs it. So the gradients are bit for bit those of -r 0; the price is compute. (One exception:
// on CUDA -r 0 takes GELU from the fc GEMM's epilogue, computed from the fp32 product, and a
// recomputed GELU comes from the kernel, which reads fch rounded: LLMC_GELU=kernels makes -r 0 use
// the kernel too, and the runs bit for bit the same; block.h.)
//   -r 0  keep everything.
//   -r 1  selective: drop what is large and cheap to redo. The GELU output (B, T, 4C) comes back
//         from fch in one elementwise pass; attention's (B, NH, T, T) probabilities (the CPU and
//         the cuBLAS path; the flash path keeps only (B, NH, T) statistics, not worth dropping)
//         from qkv by running attention again. attproj and fcproj are dropped too, and need no
//         recomputing at all: the backward pass never reads them (only the residual adds did).
//   -r 2  full: keep only each layer's output, residual3 (the next layer's input), and rerun the
//         whole layer forward from its input before its backward; with tensor parallelism that
//         rerun repeats the layer's collectives. The head (lnf, logits) is kept.
// Zero bubble's W (pipeline.h) runs after B, from each matmul's input and output gradient kept in
// the slot (llmc/tensor_parallel.h's tp_layer_backward), so under -sched zb those stay kept whatever -r.
enum {
    KEEP_LN1 = 1 << 0, KEEP_LN1_STATS = 1 << 1, KEEP_QKV = 1 << 2, KEEP_ATTY = 1 << 3, KEEP_ATT_STATE = 1 << 4,
    KEEP_ATTPROJ = 1 << 5, KEEP_RESIDUAL2 = 1 << 6, KEEP_LN2 = 1 << 7, KEEP_LN2_STATS = 1 << 8, KEEP_FCH = 1 << 9,
    KEEP_FCH_GELU = 1 << 10, KEEP_FCPROJ = 1 << 11, KEEP_RESIDUAL3 = 1 << 12, KEEP_ALL = (1 << 13) - 1
};
#define RECOMPUTE_MAX 2
static const char* recompute_names[RECOMPUTE_MAX + 1] = {
    "none: every activation kept (-r 0)", "selective: GELU output and attention probabilities (-r 1)",
    "full: each layer rerun from its input (-r 2)"};

// what a layer's forward keeps for -r `recompute` (a mask of KEEP_ bits); weights_later: zero
// bubble's W will read the matmuls' inputs and the slots of their output gradients
static inline unsigned activations_kept(int recompute, int weights_later, LayerDims d) {
    unsigned kept = KEEP_ALL;
    if (recompute == 1) {
        kept &= ~(unsigned)(KEEP_FCH_GELU | KEEP_ATTPROJ | KEEP_FCPROJ);
        if (!d.target.flash) kept &= ~(unsigned)KEEP_ATT_STATE;  // the (B, NH, T, T) probabilities
    }
    if (recompute == 2) kept = KEEP_RESIDUAL3;
    if (weights_later) {
        kept |= KEEP_LN1 | KEEP_QKV | KEEP_ATTY | KEEP_ATTPROJ | KEEP_LN2 | KEEP_FCH | KEEP_FCH_GELU | KEEP_FCPROJ;
    }
    return kept;
}


typedef struct {
    GPT2Config config;
    ParameterLayout layout;  // this rank's tensors (the whole model without tensor parallelism)
    uint64_t num_parameters;   // on this rank: layout.count (padding included); what it holds of each
                             // buffer: layout_held
    ParameterTensors params;
    ParameterTensors grads;
    floatX* params_memory;  // one buffer each, in the layout's order
    floatX* grads_memory;
    float* master_memory;   // fp32 master weights when floatX is bf16, else NULL
    float* m_memory;        // AdamW first moment
    float* v_memory;        // AdamW second moment
    int offload;            // 1: master weights and moments live in (pinned) host memory, and
                            // AdamW runs on the host (-offload, train_gpt2_dp.cu)
    Activations acts;       // DP and TP: every part; a pipeline stage: the scratch
    LayerDims dims;         // this rank's widths
    int B, T;               // the shape the activations were allocated for
    int* inputs;            // (B, T) on the device
    int* targets;           // (B, T) on the device
    HostStage input_stage;  // the pinned host buffers they are copied from (tokens_to_device)
    HostStage target_stage;
    HostStage token_table;  // the TP and 3D backward's vocabulary-parallel table (host only, never copied)
    float* losses_host;     // (B, T), pinned: the losses come back by DMA, without a staging copy
    DeviceCopy losses_copy;
} GPT2;

// One entry per tensor of an arena: where its pointer lives, its bytes, and its part.
typedef struct {
    void** ptr;
    uint64_t bytes;
    int part;  // the ACTS_ part it belongs to
} ActivationTensor;

// every tensor an arena may hold, for `layers` layers of which the forward keeps `kept`: a kept
// per-layer tensor counts `layers` times in ACTS_LAYERS, a dropped one once in ACTS_RECOMPUTE.
// Returns how many entries it wrote (at most ACTIVATION_TENSORS).
#define ACTIVATION_TENSORS 32
static inline int activation_tensors(ActivationTensor* t, Activations* a, LayerDims d, int layers, unsigned kept, int B,
                                     int T) {
    uint64_t L = (uint64_t)layers, C = d.C, QKV = d.qkv, ATT = d.att, FC = d.fc, Vp = d.Vp_rank;
    uint64_t BT = (uint64_t)B * T, BTs = BT / d.seq_shards, X = d.target.X, F = sizeof(float);
    uint64_t sp = d.seq_shards > 1;  // 0 or 1: sequence parallelism's buffers or none
    struct { void** ptr; uint64_t bytes; unsigned keep; } layer[] = {  // one layer's tensors
        {(void**)&a->ln1, BT * C * X, KEEP_LN1},           {(void**)&a->ln1_mean, BTs * F, KEEP_LN1_STATS},
        {(void**)&a->ln1_rstd, BTs * F, KEEP_LN1_STATS},   {(void**)&a->qkv, BT * QKV * X, KEEP_QKV},
        {(void**)&a->atty, BT * ATT * X, KEEP_ATTY},
        {(void**)&a->att_state, attention_state_size(d.target, B, T, d.NH), KEEP_ATT_STATE},
        {(void**)&a->attproj, BT * C * X, KEEP_ATTPROJ},   {(void**)&a->residual2, BTs * C * X, KEEP_RESIDUAL2},
        {(void**)&a->ln2, BT * C * X, KEEP_LN2},           {(void**)&a->ln2_mean, BTs * F, KEEP_LN2_STATS},
        {(void**)&a->ln2_rstd, BTs * F, KEEP_LN2_STATS},   {(void**)&a->fch, BT * FC * X, KEEP_FCH},
        {(void**)&a->fch_gelu, BT * FC * X, KEEP_FCH_GELU}, {(void**)&a->fcproj, BT * C * X, KEEP_FCPROJ},
        {(void**)&a->residual3, BTs * C * X, KEEP_RESIDUAL3},
    };
    int n = 0;
    t[n++] = (ActivationTensor){(void**)&a->encoded, BTs * C * X, ACTS_LAYERS};
    for (uint64_t i = 0; i < sizeof(layer) / sizeof(layer[0]); i++) {
        int keep = (kept & layer[i].keep) != 0;
        t[n++] = (ActivationTensor){layer[i].ptr, layer[i].bytes * (keep ? L : 1), keep ? ACTS_LAYERS : ACTS_RECOMPUTE};
    }
    ActivationTensor rest[] = {
        {(void**)&a->lnf, BT * C * X, ACTS_HEAD},          {(void**)&a->lnf_mean, BTs * F, ACTS_HEAD},
        {(void**)&a->lnf_rstd, BTs * F, ACTS_HEAD},        {(void**)&a->logits, BT * Vp * X, ACTS_HEAD},
        {(void**)&a->losses, BT * F, ACTS_HEAD},           {(void**)&a->row_max, BT * F, ACTS_HEAD},
        {(void**)&a->row_sums, BT * 2 * F, ACTS_HEAD},
        {(void**)&a->dresidual, BTs * C * X, ACTS_SCRATCH}, {(void**)&a->dbuf, BT * C * X, ACTS_SCRATCH},
        {(void**)&a->dqkv, BT * QKV * X, ACTS_SCRATCH},    {(void**)&a->dfch, BT * FC * X, ACTS_SCRATCH},
        {(void**)&a->reduced, sp * BTs * C * X, ACTS_SCRATCH}, {(void**)&a->ln_shard, sp * BTs * C * X, ACTS_SCRATCH},
        {(void**)&a->dgathered, sp * BT * C * X, ACTS_SCRATCH},
    };
    for (uint64_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++) t[n++] = rest[i];
    return n;
}

// the parts `parts` of an arena (for `layers` layers, keeping `kept`) in one block, each tensor
// aligned to 256 bytes. Returns its size; with base != NULL also points every tensor of `a` into
// it, the tensors of other parts at NULL (base NULL: only the size, for planning). bytes_of_part
// (may be NULL) receives each part's bytes, indexed by the part's bit (1, 2, 4, 8).
static inline uint64_t gpt2_lay_out_activations(Activations* a, LayerDims d, int layers, int parts, unsigned kept, int B,
                                               int T, char* base, uint64_t bytes_of_part[ACTS_ALL + 1]) {
    ActivationTensor t[ACTIVATION_TENSORS];
    int n = activation_tensors(t, a, d, layers, kept, B, T);
    uint64_t total = 0;
    if (bytes_of_part) memset(bytes_of_part, 0, (ACTS_ALL + 1) * sizeof(uint64_t));
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (t[i].part & parts) ? (t[i].bytes + 255) / 256 * 256 : 0;
        if (base) *t[i].ptr = bytes > 0 ? base + total : NULL;
        if (bytes_of_part) bytes_of_part[t[i].part] += bytes;
        total += bytes;
    }
    if (base) a->kept = kept;
    return total;
}

// (one block, its parts counted under the memory table's rows of the activations)
static inline void activations_alloc(Activations* a, LayerDims d, int layers, int parts, unsigned kept, int B, int T) {
    uint64_t part[ACTS_ALL + 1];
    a->arena_bytes = gpt2_lay_out_activations(a, d, layers, parts, kept, B, T, NULL, part);
    size_t bytes_of[ALLOC_KINDS] = {0};
    bytes_of[ALLOC_LAYERS] = part[ACTS_LAYERS], bytes_of[ALLOC_HEAD] = part[ACTS_HEAD];
    bytes_of[ALLOC_BACKWARD] = part[ACTS_SCRATCH], bytes_of[ALLOC_RECOMPUTED] = part[ACTS_RECOMPUTE];
    allocation_parts_of_next(bytes_of);
    a->arena = (char*)device_malloc(a->arena_bytes);
    gpt2_lay_out_activations(a, d, layers, parts, kept, B, T, a->arena, NULL);
}

// A pipeline slot keeps the layers of one micro-batch in flight; what recomputation drops is not
// kept, so every slot shares the stage's one-layer buffers (in the model's scratch arena)
static inline void activations_share_recomputed(Activations* slot, const Activations* scratch, LayerDims d, int B,
                                                int T) {
    ActivationTensor mine[ACTIVATION_TENSORS], theirs[ACTIVATION_TENSORS];
    int n = activation_tensors(mine, slot, d, 1, slot->kept, B, T);
    activation_tensors(theirs, (Activations*)scratch, d, 1, slot->kept, B, T);
    for (int i = 0; i < n; i++) {
        if (mine[i].part == ACTS_RECOMPUTE) *mine[i].ptr = *theirs[i].ptr;
    }
}

static inline void activations_free(Activations* a) { device_free(a->arena); }

// The kernels' own device memory at widths d and B x T: on CUDA cuBLASLt's workspace and each
// launcher's scratch buffer at its largest (they grow on demand to the largest call, and each
// launcher asks llmc/target.h's size function used here); none on the CPU
static inline uint64_t kernel_workspace_bytes(LayerDims d, int B, int T) {
    if (!d.target.cuda) return 0;
    uint64_t BT = (uint64_t)B * T, widest_bias = d.fc > d.qkv ? d.fc : d.qkv;
    widest_bias = widest_bias > (uint64_t)d.C ? widest_bias : (uint64_t)d.C;
    uint64_t attention = d.target.flash ? flash_scratch_bytes(B, T, d.NH) : attention_cublas_scratch_bytes(B, T, d.att, d.NH, d.target.X);
    if (d.target.flash_one_kernel) attention += flash_one_kernel_scratch_bytes(B, T, d.NH, d.att / d.NH);
    return CUBLASLT_WORKSPACE_BYTES + bias_scratch_bytes(BT, (int)widest_bias) + layernorm_scratch_bytes(BT / d.seq_shards, d.C) +
           attention + encoder_scratch_bytes(BT) + norm_scratch_bytes();
}

// what gpt2_build allocates on one rank's device: parameters and gradients (floatX), fp32 master
// weights (bf16 only) and AdamW m and v (fp32) unless offloaded to the host, each whole or its
// shards (layout_held), the activation parts `parts` for the layout's layers (keeping `kept`)
// and the token buffers
static inline uint64_t gpt2_optimizer_state_bytes(const ParameterLayout* layout, DeviceTarget t) {
    uint64_t S = layout_state_held(layout);
    return (t.X < 4 ? S * sizeof(float) : 0) + S * 2 * sizeof(float);
}
static inline uint64_t gpt2_memory_bytes(LayerDims d, const ParameterLayout* layout, int parts, unsigned kept, int B, int T,
                                       int offload) {
    Activations unused;
    return (layout_params_held(layout) + layout_grads_held(layout)) * d.target.X +
           (offload ? 0 : gpt2_optimizer_state_bytes(layout, d.target)) +
           gpt2_lay_out_activations(&unused, d, layout->layers, parts, kept, B, T, NULL, NULL) + (uint64_t)B * T * 2 * sizeof(int);
}

// this rank's slices of the whole model `full` (fp32, host, the file's layout) into the
// parameters, and into the fp32 master weights when there are any
// (under ZeRO the rank's shards of each, as it holds them)
static inline void gpt2_weights_from_full(GPT2* model, const float* full) {
    const ParameterLayout* p = &model->layout;
    float* mine = (float*)calloc_check(p->count, sizeof(float));  // padding stays 0
    parameter_shard_copy((float*)full, mine, p, model->config, 1);
    float* shards = p->zero > 0 ? (float*)malloc_check(layout_state_held(p) * sizeof(float)) : NULL;
    if (shards) layout_take_shards(p, mine, shards);
    if (model->master_memory) {
        copy_host_to_device(model->master_memory, shards ? shards : mine, layout_state_held(p) * sizeof(float));
    }
    copy_floats_to_device(model->params_memory, p->zero >= 3 ? shards : mine, layout_params_held(p));
    free(mine);
    free(shards);
}

// this rank's fp32 weights on the device: the master copy when there is one (exact), else the
// parameters themselves; *sharded says whether they are the rank's shards (ZeRO) or whole
static inline int fp32_weights_sharded(const ParameterLayout* p, DeviceTarget t) { return t.X == 4 ? p->zero >= 3 : p->zero >= 1; }
static inline const float* gpt2_fp32_weights(const GPT2* model, int* sharded) {
    *sharded = fp32_weights_sharded(&model->layout, model->dims.target);
    return model->master_memory ? model->master_memory : (const float*)model->params_memory;
}

// the optimizer state's home: the device, or with offload pinned host memory
static inline float* optimizer_state_alloc(uint64_t n, int offload) {
    return (float*)(offload ? host_malloc_pinned(n * sizeof(float)) : device_malloc(n * sizeof(float)));
}
static inline void optimizer_state_free(float* p, int offload) {
    if (offload) host_free_pinned(p);
    else device_free(p);
}

// full_weights: the whole model in the file's layout (fp32, host); this rank keeps its pieces
// (layout) and allocates the activation parts `acts_parts` for its layers at B x T, keeping
// `kept` of each layer's (-r); offload: the optimizer state in host memory
static inline void gpt2_build(GPT2* model, GPT2Config config, LayerDims dims, ParameterLayout layout,
                              const float* full_weights, int B, int T, int acts_parts, unsigned kept, int offload) {
    model->config = config;
    model->dims = dims;
    model->B = B;
    model->T = T;
    model->layout = layout;
    model->num_parameters = layout.count;
    uint64_t S = layout_state_held(&layout);
    allocation_kind(ALLOC_PARAMETERS);  // (each buffer counted under its row of the memory table)
    model->params_memory = (floatX*)device_malloc(layout_params_held(&layout) * sizeof(floatX));
    allocation_kind(ALLOC_GRADIENTS);
    model->grads_memory = (floatX*)device_malloc(layout_grads_held(&layout) * sizeof(floatX));
    model->offload = offload;
    allocation_kind(ALLOC_ADAMW);
    model->m_memory = optimizer_state_alloc(S, offload);
    model->v_memory = optimizer_state_alloc(S, offload);
    model->master_memory = NULL;
    if (!FLOATX_IS_FLOAT) {  // AdamW updates fp32 master weights, then rounds them to bf16
        allocation_kind(ALLOC_MASTER);
        model->master_memory = optimizer_state_alloc(S, offload);
    }
    gpt2_weights_from_full(model, full_weights);
    if (offload) {
        memset(model->m_memory, 0, S * sizeof(float));
        memset(model->v_memory, 0, S * sizeof(float));
    } else {
        device_memset_zero(model->m_memory, S * sizeof(float));
        device_memset_zero(model->v_memory, S * sizeof(float));
    }
    // tensor views of whole buffers only (a sharded one has none: NULL pointers fail loudly)
    memset(&model->params, 0, sizeof(ParameterTensors));
    memset(&model->grads, 0, sizeof(ParameterTensors));
    if (layout.zero < 3) parameter_point(&model->params, model->params_memory, &model->layout);
    if (layout.zero < 2) parameter_point(&model->grads, model->grads_memory, &model->layout);
    activations_alloc(&model->acts, dims, layout.layers, acts_parts, kept, B, T);
    allocation_kind(ALLOC_BACKWARD);  // (the tokens: the table's row "backward")
    model->inputs = (int*)device_malloc((uint64_t)B * T * sizeof(int));
    model->targets = (int*)device_malloc((uint64_t)B * T * sizeof(int));
    model->losses_host = (float*)host_malloc_pinned((uint64_t)B * T * sizeof(float));
    memset(&model->input_stage, 0, sizeof(HostStage));
    memset(&model->target_stage, 0, sizeof(HostStage));
    memset(&model->token_table, 0, sizeof(HostStage));
    memset(&model->losses_copy, 0, sizeof(DeviceCopy));
}

static inline void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    if (model->master_memory) optimizer_state_free(model->master_memory, model->offload);
    optimizer_state_free(model->m_memory, model->offload);
    optimizer_state_free(model->v_memory, model->offload);
    activations_free(&model->acts);
    device_free(model->inputs);
    device_free(model->targets);
    host_stage_free(&model->input_stage);
    host_stage_free(&model->target_stage);
    host_stage_free(&model->token_table);
    host_free_pinned(model->losses_host);
    device_copy_free(&model->losses_copy);
}

// n tokens of the micro-batch (inputs or targets) to the device, through the pinned `stage`:
// queued on the compute stream before the kernels that read them, with no wait for the device
static inline void tokens_to_device(int* device, HostStage* stage, const int* tokens_host, uint64_t n) {
    int* staged = (int*)host_stage_take(stage, n * sizeof(int));
    memcpy(staged, tokens_host, n * sizeof(int));
    host_stage_to_device(stage, device, n * sizeof(int));
}

// the (B, T) losses to the host (pinned): waits for the kernels that computed them. The mean of
// the micro-batch's loss is the one value each micro-batch hands back to the host.
static inline float* losses_to_host(GPT2* model, const float* losses, uint64_t BT) {
    copy_device_to_host_async(model->losses_host, losses, BT * sizeof(float), &model->losses_copy);
    device_copy_wait(&model->losses_copy);
    return model->losses_host;
}


// ---------------------------------------------------------------------------------------------
// views of layer l: plain pointers to its slices of the thirteen per-layer tensors, so that code
// working on one layer (block.h) needs no offsets. In a Mixture-of-Experts layer fcw .. fcprojb
// point at the rank's first expert, the others following it (llmc/moe.h); routerw is empty in a
// dense model.

typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *routerw, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerWeights;

static inline LayerWeights layer_weights_of(floatX* t[PER_LAYER_TENSORS]) {
    LayerWeights w = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], t[12]};
    return w;
}

// layer l (of the rank's layers) in a buffer of the layout: its parameters, gradients or any
// buffer laid out alike
static inline LayerWeights layer_weights(const ParameterLayout* p, floatX* base, int l) {
    floatX* t[PER_LAYER_TENSORS];
    for (int i = PARAM_FIRST_PER_LAYER; i <= PARAM_LAST_PER_LAYER; i++) {
        t[i - PARAM_FIRST_PER_LAYER] = base + p->offsets[i] + (uint64_t)l * p->layer_stride[i];
    }
    return layer_weights_of(t);
}

// a layer's slices in a buffer that holds its bucket alone (layout in buckets): where the DP
// trainer's backward writes a layer's gradient, or where ZeRO-3 gathers a layer's parameters
static inline LayerWeights layer_weights_in_bucket(const ParameterLayout* p, floatX* bucket) {
    floatX* t[PER_LAYER_TENSORS];
    for (int i = PARAM_FIRST_PER_LAYER; i <= PARAM_LAST_PER_LAYER; i++) {  // ln1w comes first
        t[i - PARAM_FIRST_PER_LAYER] = bucket + (p->offsets[i] - p->offsets[PARAM_FIRST_PER_LAYER]);
    }
    return layer_weights_of(t);
}

// the rank's layer l: its parameters, its gradients
static inline LayerWeights gpt2_layer_params(const GPT2* model, int l) {
    return layer_weights(&model->layout, model->params_memory, l);
}
static inline LayerWeights gpt2_layer_grads(const GPT2* model, int l) {
    return layer_weights(&model->layout, model->grads_memory, l);
}

typedef struct {
    floatX* ln1;              // (B, T, C)    the layer's input, normalised
    float *ln1_mean, *ln1_rstd;  // (BTs)
    floatX* qkv;              // (B, T, qkv)
    floatX* atty;             // (B, T, att)
    char* att_state;
    floatX* attproj;          // (B, T, C)
    floatX* residual2;        // (BTs, C)
    floatX* ln2;              // (B, T, C)
    float *ln2_mean, *ln2_rstd;  // (BTs)
    floatX* fch;              // (B, T, fc)
    floatX* fch_gelu;         // (B, T, fc)
    floatX* fcproj;           // (B, T, C)
    floatX* residual3;        // (BTs, C)     the layer's output
    unsigned kept;            // what of it stays until the backward (KEEP_ bits); the rest is recomputed
} LayerActs;

// layer l's slices for a micro-batch of B x T (which may be smaller than the arena's shape): of
// a kept tensor layer l's own, of a recomputed one the one layer's buffer
static inline LayerActs layer_acts(const Activations* a, LayerDims d, int B, int T, int l) {
    uint64_t BT = (uint64_t)B * T, BTs = BT / d.seq_shards;
    uint64_t att_state = attention_state_size(d.target, B, T, d.NH);
#define AT(bit) ((a->kept & (bit)) ? (uint64_t)l : 0)  // the layer's index in its tensor
    LayerActs x = {a->ln1 + AT(KEEP_LN1) * BT * d.C,       a->ln1_mean + AT(KEEP_LN1_STATS) * BTs,
                   a->ln1_rstd + AT(KEEP_LN1_STATS) * BTs, a->qkv + AT(KEEP_QKV) * BT * d.qkv,
                   a->atty + AT(KEEP_ATTY) * BT * d.att,   a->att_state + AT(KEEP_ATT_STATE) * att_state,
                   a->attproj + AT(KEEP_ATTPROJ) * BT * d.C, a->residual2 + AT(KEEP_RESIDUAL2) * BTs * d.C,
                   a->ln2 + AT(KEEP_LN2) * BT * d.C,       a->ln2_mean + AT(KEEP_LN2_STATS) * BTs,
                   a->ln2_rstd + AT(KEEP_LN2_STATS) * BTs, a->fch + AT(KEEP_FCH) * BT * d.fc,
                   a->fch_gelu + AT(KEEP_FCH_GELU) * BT * d.fc, a->fcproj + AT(KEEP_FCPROJ) * BT * d.C,
                   a->residual3 + AT(KEEP_RESIDUAL3) * BTs * d.C, a->kept};
#undef AT
    return x;
}

// mean cross-entropy of the micro-batch. With dloss != 0 the logits are replaced by their
// gradient, each token's loss weighted by dloss (the trainer's: 1 / the tokens whose mean the
// step's loss is).
static inline float gpt2_loss(GPT2* model, const int* targets_host, int B, int T, float dloss) {
    GPT2Config c = model->config;
    uint64_t BT = (uint64_t)B * T;
    tokens_to_device(model->targets, &model->target_stage, targets_host, BT);
    fused_classifier(model->acts.logits, model->acts.losses, model->targets, dloss, B * T,
                     c.vocab_size, c.padded_vocab_size);
    const float* losses = losses_to_host(model, model->acts.losses, BT);
    double sum = 0.0;
    for (uint64_t i = 0; i < BT; i++) sum += losses[i];
    return (float)(sum / (double)BT);
}

#endif
