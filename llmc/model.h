// The GPT-2 model state one rank holds, shared by every trainer: the parameters (with their
// gradients, fp32 master weights and AdamW moments, in one flat buffer each, in the model file's
// tensor order), the activations of the forward pass in one arena, views of one layer's slice of
// both, and the loss. What a trainer does with them (which layers, which shard, which
// collectives) stays in the trainer.
#ifndef LLMC_MODEL_H
#define LLMC_MODEL_H

#include "gpt2.h"
#include "ops.h"

// the widths of one layer on one rank: with tensor parallelism over tp ranks a rank holds NH/tp
// heads, so 3C/tp of qkv, C/tp of the attention output and 4C/tp of the MLP; tp = 1 otherwise
typedef struct {
    int C;    // residual stream width, always whole
    int qkv;  // 3C / tp
    int att;  // C / tp: the attention output, the input of the attention projection
    int fc;   // 4C / tp
    int NH;   // heads, NH / tp
    int Vp;   // logits per token, Vp / tp with a vocabulary-parallel LM head
} LayerDims;

static inline LayerDims layer_dims(GPT2Config c, int tp) {
    if (c.num_heads % tp != 0 || c.padded_vocab_size % tp != 0) {
        fail("tensor parallelism over %d ranks needs NH = %d and Vp = %d divisible by %d", tp,
             c.num_heads, c.padded_vocab_size, tp);
    }
    LayerDims d = {c.channels, 3 * c.channels / tp, c.channels / tp, 4 * c.channels / tp,
                   c.num_heads / tp, c.padded_vocab_size / tp};
    return d;
}

// ---------------------------------------------------------------------------------------------
// activations: what the forward pass keeps for the backward pass, plus backward scratch buffers.
// Tensors are floatX (bf16 or fp32); LayerNorm statistics and losses stay fp32. The widths are a
// rank's (LayerDims): with tensor parallelism qkv, atty, fch and the logits hold its shard only.

typedef struct {
    floatX* encoded;    // (B, T, C)      token + position embedding, the residual stream's input
    floatX* ln1;        // (L, B, T, C)
    float* ln1_mean;    // (L, B, T)
    float* ln1_rstd;    // (L, B, T)
    floatX* qkv;        // (L, B, T, 3C)
    floatX* atty;       // (L, B, T, C)   attention output before its projection
    char* att_state;    // (L, attention_state_bytes) what attention keeps for its backward pass:
                        // the (B, NH, T, T) probabilities, or the flash path's (B, NH, T) lse
    floatX* attproj;    // (L, B, T, C)
    floatX* residual2;  // (L, B, T, C)   residual stream after attention
    floatX* ln2;        // (L, B, T, C)
    float* ln2_mean;    // (L, B, T)
    float* ln2_rstd;    // (L, B, T)
    floatX* fch;        // (L, B, T, 4C)
    floatX* fch_gelu;   // (L, B, T, 4C)
    floatX* fcproj;     // (L, B, T, C)
    floatX* residual3;  // (L, B, T, C)   residual stream after the MLP = next layer's input
    floatX* lnf;        // (B, T, C)
    float* lnf_mean;    // (B, T)
    float* lnf_rstd;    // (B, T)
    floatX* logits;     // (B, T, Vp)     overwritten with its gradient by fused_classifier
    float* losses;      // (B, T)
    floatX* dresidual;  // (B, T, C)      gradient of the residual stream, flowing down the layers
    floatX* dbuf;       // (B, T, C)      gradient of a LayerNorm output or of the attention output
    floatX* dqkv;       // (B, T, 3C)
    floatX* dfch;       // (B, T, 4C)
} Activations;

typedef struct {
    GPT2Config config;
    size_t num_parameters;
    ParameterTensors params;
    ParameterTensors grads;
    floatX* params_memory;  // one buffer each, in the model file's layout
    floatX* grads_memory;
    float* master_memory;   // fp32 master weights when floatX is bf16, else NULL
    float* m_memory;        // AdamW first moment
    float* v_memory;        // AdamW second moment
    Activations acts;
    void* acts_memory;
    size_t acts_bytes;
    LayerDims dims;         // this rank's widths
    int B, T;               // the shape the activations were allocated for
    int* inputs;            // (B, T) on the device
    int* targets;           // (B, T) on the device
    float* losses_host;     // (B, T)
} GPT2;

// all activations in one arena, each tensor aligned to 256 bytes. Returns the arena's size;
// with base != NULL also points every tensor of `a` into it (NULL: only the size, for planning)
static inline size_t gpt2_lay_out_activations(Activations* a, GPT2Config c, LayerDims d, int B, int T,
                                               char* base) {
    size_t L = c.num_layers, C = d.C, QKV = d.qkv, ATT = d.att, FC = d.fc, Vp = d.Vp;
    size_t BT = (size_t)B * T, X = sizeof(floatX), F = sizeof(float);
    struct { void** ptr; size_t count; size_t elem_bytes; } t[] = {
        {(void**)&a->encoded, BT * C, X},       {(void**)&a->ln1, L * BT * C, X},
        {(void**)&a->ln1_mean, L * BT, F},      {(void**)&a->ln1_rstd, L * BT, F},
        {(void**)&a->qkv, L * BT * QKV, X},     {(void**)&a->atty, L * BT * ATT, X},
        {(void**)&a->att_state, L * attention_state_bytes(B, T, d.att, d.NH), 1},
        {(void**)&a->attproj, L * BT * C, X},
        {(void**)&a->residual2, L * BT * C, X}, {(void**)&a->ln2, L * BT * C, X},
        {(void**)&a->ln2_mean, L * BT, F},      {(void**)&a->ln2_rstd, L * BT, F},
        {(void**)&a->fch, L * BT * FC, X},     {(void**)&a->fch_gelu, L * BT * FC, X},
        {(void**)&a->fcproj, L * BT * C, X},    {(void**)&a->residual3, L * BT * C, X},
        {(void**)&a->lnf, BT * C, X},           {(void**)&a->lnf_mean, BT, F},
        {(void**)&a->lnf_rstd, BT, F},          {(void**)&a->logits, BT * Vp, X},
        {(void**)&a->losses, BT, F},            {(void**)&a->dresidual, BT * C, X},
        {(void**)&a->dbuf, BT * C, X},          {(void**)&a->dqkv, BT * QKV, X},
        {(void**)&a->dfch, BT * FC, X},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (base) *t[i].ptr = base + total;
        total += (t[i].count * t[i].elem_bytes + 255) / 256 * 256;
    }
    return total;
}

// what gpt2_build allocates on one rank: parameters and gradients (floatX), fp32 master weights
// (bf16 only), AdamW m and v (fp32), the activations and the token buffers
static inline size_t gpt2_memory_bytes(GPT2Config c, int B, int T) {
    Activations unused;
    size_t P = gpt2_num_parameters(c), master = FLOATX_IS_FLOAT ? 0 : P * sizeof(float);
    return P * 2 * sizeof(floatX) + master + P * 2 * sizeof(float) +
           gpt2_lay_out_activations(&unused, c, layer_dims(c, 1), B, T, NULL) + (size_t)B * T * 2 * sizeof(int);
}

static inline void gpt2_build(GPT2* model, GPT2Config config, const float* params_host, int B, int T) {
    model->config = config;
    model->B = B;
    model->T = T;
    size_t P = gpt2_num_parameters(config);
    model->num_parameters = P;
    model->params_memory = (floatX*)device_malloc(P * sizeof(floatX));
    model->grads_memory = (floatX*)device_malloc(P * sizeof(floatX));
    model->m_memory = (float*)device_malloc(P * sizeof(float));
    model->v_memory = (float*)device_malloc(P * sizeof(float));
    model->master_memory = NULL;
    if (!FLOATX_IS_FLOAT) {  // AdamW updates fp32 master weights, then rounds them to bf16
        model->master_memory = (float*)device_malloc(P * sizeof(float));
        copy_host_to_device(model->master_memory, params_host, P * sizeof(float));
    }
    copy_floats_to_device(model->params_memory, params_host, P);
    device_memset_zero(model->m_memory, P * sizeof(float));
    device_memset_zero(model->v_memory, P * sizeof(float));
    gpt2_point_parameters(&model->params, model->params_memory, config);
    gpt2_point_parameters(&model->grads, model->grads_memory, config);
    model->dims = layer_dims(config, 1);
    model->acts_bytes = gpt2_lay_out_activations(&model->acts, config, model->dims, B, T, NULL);
    model->acts_memory = device_malloc(model->acts_bytes);
    gpt2_lay_out_activations(&model->acts, config, model->dims, B, T, (char*)model->acts_memory);
    model->inputs = (int*)device_malloc((size_t)B * T * sizeof(int));
    model->targets = (int*)device_malloc((size_t)B * T * sizeof(int));
    model->losses_host = (float*)malloc_check((size_t)B * T * sizeof(float));
}

// the fp32 weights: the master copy when there is one (exact), else the parameters
static inline void gpt2_weights_to_host(GPT2* model, float* host) {
    if (model->master_memory) {
        copy_device_to_host(host, model->master_memory, model->num_parameters * sizeof(float));
    } else {
        copy_device_to_floats(host, model->params_memory, model->num_parameters);
    }
}

static inline void gpt2_weights_from_host(GPT2* model, const float* host) {
    if (model->master_memory) {
        copy_host_to_device(model->master_memory, host, model->num_parameters * sizeof(float));
    }
    copy_floats_to_device(model->params_memory, host, model->num_parameters);
}

static inline void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    if (model->master_memory) device_free(model->master_memory);
    device_free(model->m_memory);
    device_free(model->v_memory);
    device_free(model->acts_memory);
    device_free(model->inputs);
    device_free(model->targets);
    free(model->losses_host);
}


// ---------------------------------------------------------------------------------------------
// views of layer l: plain pointers into the stacked (L, ...) tensors, so that code working on one
// layer (block.h) needs no offsets

typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerWeights;

static inline LayerWeights layer_weights(ParameterTensors p, LayerDims d, int l) {
    size_t C = d.C, li = (size_t)l;
    LayerWeights w = {p.ln1w + li * C, p.ln1b + li * C, p.qkvw + li * d.qkv * C, p.qkvb + li * d.qkv,
                      p.attprojw + li * C * d.att, p.attprojb + li * C, p.ln2w + li * C, p.ln2b + li * C,
                      p.fcw + li * d.fc * C, p.fcb + li * d.fc, p.fcprojw + li * C * d.fc, p.fcprojb + li * C};
    return w;
}

typedef struct {
    floatX* ln1;              // (B, T, C)    the layer's input, normalised
    float *ln1_mean, *ln1_rstd;
    floatX* qkv;              // (B, T, qkv)
    floatX* atty;             // (B, T, att)
    char* att_state;
    floatX* attproj;          // (B, T, C)
    floatX* residual2;        // (B, T, C)
    floatX* ln2;              // (B, T, C)
    float *ln2_mean, *ln2_rstd;
    floatX* fch;              // (B, T, fc)
    floatX* fch_gelu;         // (B, T, fc)
    floatX* fcproj;           // (B, T, C)
    floatX* residual3;        // (B, T, C)    the layer's output
} LayerActs;

// layer l's slices for a micro-batch of B x T (which may be smaller than the arena's shape)
static inline LayerActs layer_acts(const Activations* a, LayerDims d, int B, int T, int l) {
    size_t BT = (size_t)B * T, li = (size_t)l;
    size_t att_state = attention_state_bytes(B, T, d.att, d.NH);
    LayerActs x = {a->ln1 + li * BT * d.C, a->ln1_mean + li * BT, a->ln1_rstd + li * BT,
                   a->qkv + li * BT * d.qkv, a->atty + li * BT * d.att, a->att_state + li * att_state,
                   a->attproj + li * BT * d.C, a->residual2 + li * BT * d.C, a->ln2 + li * BT * d.C,
                   a->ln2_mean + li * BT, a->ln2_rstd + li * BT, a->fch + li * BT * d.fc,
                   a->fch_gelu + li * BT * d.fc, a->fcproj + li * BT * d.C, a->residual3 + li * BT * d.C};
    return x;
}

// mean cross-entropy of the micro-batch. With dloss != 0 the logits are replaced by their
// gradient, each token's loss weighted by dloss (1 / tokens in the global batch per rank).
static inline float gpt2_loss(GPT2* model, const int* targets_host, int B, int T, float dloss) {
    GPT2Config c = model->config;
    size_t BT = (size_t)B * T;
    copy_host_to_device(model->targets, targets_host, BT * sizeof(int));
    fused_classifier(model->acts.logits, model->acts.losses, model->targets, dloss, B * T,
                     c.vocab_size, c.padded_vocab_size);
    copy_device_to_host(model->losses_host, model->acts.losses, BT * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += model->losses_host[i];
    return (float)(sum / (double)BT);
}

#endif
