/*
GPT-2 training with data parallelism (DDP).

Every rank holds a full replica of the model and the optimizer. Each step:
  1. each rank runs forward + backward on its own slice of the global batch (micro-batches of
     B x T tokens, accumulated `accum` times),
  2. one all-reduce averages the flattened gradient buffer over the ranks,
  3. every rank applies the same AdamW step to the same averaged gradient, so the replicas stay
     identical without ever sending a parameter.
The result is the same as one process training on the whole global batch (checked in test/).

Build: make train_gpt2_dp          Run: mpirun -np 2 ./train_gpt2_dp -e d6 -o out
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
#include <math.h>
#include <stdint.h>
#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/comm.h"
#include "llmc/gpt2.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/schedule.h"
#include "llmc/logger.h"
#include "llmc/checkpoint.h"
#include "llmc/rng.h"
#include "llmc/watchdog.h"
#include "llmc/ops.h"
#include "llmc/memory.h"

// ----------------------------------------------------------------------------------------------
// activations: what the forward pass keeps for the backward pass, plus backward scratch buffers.
// Tensors are floatX (bf16 or fp32); LayerNorm statistics and losses stay fp32.

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
    int B, T;               // the shape the activations were allocated for
    int* inputs;            // (B, T) on the device
    int* targets;           // (B, T) on the device
    float* losses_host;     // (B, T)
} GPT2;

// all activations in one arena, each tensor aligned to 256 bytes. Returns the arena's size;
// with base != NULL also points every tensor of `a` into it (NULL: only the size, for planning)
static size_t gpt2_lay_out_activations(Activations* a, GPT2Config c, int B, int T, char* base) {
    size_t L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
    size_t BT = (size_t)B * T, X = sizeof(floatX), F = sizeof(float);
    struct { void** ptr; size_t count; size_t elem_bytes; } t[] = {
        {(void**)&a->encoded, BT * C, X},       {(void**)&a->ln1, L * BT * C, X},
        {(void**)&a->ln1_mean, L * BT, F},      {(void**)&a->ln1_rstd, L * BT, F},
        {(void**)&a->qkv, L * BT * 3 * C, X},   {(void**)&a->atty, L * BT * C, X},
        {(void**)&a->att_state, L * attention_state_bytes(B, T, C, NH), 1},
        {(void**)&a->attproj, L * BT * C, X},
        {(void**)&a->residual2, L * BT * C, X}, {(void**)&a->ln2, L * BT * C, X},
        {(void**)&a->ln2_mean, L * BT, F},      {(void**)&a->ln2_rstd, L * BT, F},
        {(void**)&a->fch, L * BT * 4 * C, X},   {(void**)&a->fch_gelu, L * BT * 4 * C, X},
        {(void**)&a->fcproj, L * BT * C, X},    {(void**)&a->residual3, L * BT * C, X},
        {(void**)&a->lnf, BT * C, X},           {(void**)&a->lnf_mean, BT, F},
        {(void**)&a->lnf_rstd, BT, F},          {(void**)&a->logits, BT * Vp, X},
        {(void**)&a->losses, BT, F},            {(void**)&a->dresidual, BT * C, X},
        {(void**)&a->dbuf, BT * C, X},          {(void**)&a->dqkv, BT * 3 * C, X},
        {(void**)&a->dfch, BT * 4 * C, X},
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
static size_t gpt2_memory_bytes(GPT2Config c, int B, int T) {
    Activations unused;
    size_t P = gpt2_num_parameters(c), master = FLOATX_IS_FLOAT ? 0 : P * sizeof(float);
    return P * 2 * sizeof(floatX) + master + P * 2 * sizeof(float) +
           gpt2_lay_out_activations(&unused, c, B, T, NULL) + (size_t)B * T * 2 * sizeof(int);
}

static void gpt2_build(GPT2* model, GPT2Config config, const float* params_host, int B, int T) {
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
    model->acts_bytes = gpt2_lay_out_activations(&model->acts, config, B, T, NULL);
    model->acts_memory = device_malloc(model->acts_bytes);
    gpt2_lay_out_activations(&model->acts, config, B, T, (char*)model->acts_memory);
    model->inputs = (int*)device_malloc((size_t)B * T * sizeof(int));
    model->targets = (int*)device_malloc((size_t)B * T * sizeof(int));
    model->losses_host = (float*)malloc_check((size_t)B * T * sizeof(float));
}

// the fp32 weights: the master copy when there is one (exact), else the parameters
static void gpt2_weights_to_host(GPT2* model, float* host) {
    if (model->master_memory) {
        copy_device_to_host(host, model->master_memory, model->num_parameters * sizeof(float));
    } else {
        copy_device_to_floats(host, model->params_memory, model->num_parameters);
    }
}

static void gpt2_weights_from_host(GPT2* model, const float* host) {
    if (model->master_memory) {
        copy_host_to_device(model->master_memory, host, model->num_parameters * sizeof(float));
    }
    copy_floats_to_device(model->params_memory, host, model->num_parameters);
}

static void gpt2_free(GPT2* model) {
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

// ----------------------------------------------------------------------------------------------
// forward and backward of the whole model on one micro-batch. B and T may be smaller than the
// allocated shape (sampling uses B = 1): per-layer slices are laid out with the actual B, T.

static void gpt2_forward(GPT2* model, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    int L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
    size_t BTC = (size_t)B * T * C, BT = (size_t)B * T;
    size_t att_state_bytes = attention_state_bytes(B, T, C, NH);  // per layer
    ParameterTensors p = model->params;
    Activations a = model->acts;
    copy_host_to_device(model->inputs, inputs_host, BT * sizeof(int));

    encoder_forward(a.encoded, model->inputs, p.wte, p.wpe, B, T, C);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, B * T, C);
    for (int l = 0; l < L; l++) {
        floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        floatX* qkv = a.qkv + l * BTC * 3;
        floatX* atty = a.atty + l * BTC;
        floatX* attproj = a.attproj + l * BTC;
        floatX* residual2 = a.residual2 + l * BTC;
        floatX* fch = a.fch + l * BTC * 4;
        floatX* fch_gelu = a.fch_gelu + l * BTC * 4;
        floatX* fcproj = a.fcproj + l * BTC;
        // attention block: residual2 = x + proj(attention(ln1(x))); ln1(x) is already computed
        matmul_forward(qkv, a.ln1 + l * BTC, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, B * T, C, 3 * C);
        attention_forward(atty, a.att_state + l * att_state_bytes, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, B * T, C, C);
        fused_residual_layernorm_forward(residual2, a.ln2 + l * BTC, a.ln2_mean + l * BT,
                                         a.ln2_rstd + l * BT, residual, attproj, p.ln2w + l * C,
                                         p.ln2b + l * C, B * T, C);
        // MLP block: residual3 = residual2 + fcproj(gelu(fc(ln2))), then the next LayerNorm
        // (the next layer's ln1, or lnf after the last layer) in the same pass
        matmul_forward(fch, a.ln2 + l * BTC, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, B * T, C, 4 * C);
        gelu_forward(fch_gelu, fch, BTC * 4);
        matmul_forward(fcproj, fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, B * T, 4 * C, C);
        if (l + 1 < L) {
            fused_residual_layernorm_forward(a.residual3 + l * BTC, a.ln1 + (l + 1) * BTC,
                                             a.ln1_mean + (l + 1) * BT, a.ln1_rstd + (l + 1) * BT,
                                             residual2, fcproj, p.ln1w + (l + 1) * C,
                                             p.ln1b + (l + 1) * C, B * T, C);
        } else {
            fused_residual_layernorm_forward(a.residual3 + l * BTC, a.lnf, a.lnf_mean, a.lnf_rstd,
                                             residual2, fcproj, p.lnfw, p.lnfb, B * T, C);
        }
    }
    // LM head tied to the token embedding: logits (B, T, Vp) = lnf @ wte^T
    matmul_forward(a.logits, a.lnf, p.wte, NULL, B * T, C, Vp);
}

// mean cross-entropy of the micro-batch. With dloss != 0 the logits are replaced by their
// gradient, each token's loss weighted by dloss (1 / tokens in the global batch per rank).
static float gpt2_loss(GPT2* model, const int* targets_host, int B, int T, float dloss) {
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

// accumulates parameter gradients into model->grads; expects gpt2_loss to have left dlogits
static void gpt2_backward(GPT2* model, int B, int T) {
    GPT2Config c = model->config;
    int L = c.num_layers, C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size;
    size_t BTC = (size_t)B * T * C, BT = (size_t)B * T;
    size_t att_state_bytes = attention_state_bytes(B, T, C, NH);  // per layer
    ParameterTensors p = model->params, g = model->grads;
    Activations a = model->acts;

    // LM head and final LayerNorm: dresidual = gradient w.r.t. the last layer's output
    matmul_backward(a.dbuf, g.wte, NULL, a.logits, a.lnf, p.wte, B * T, C, Vp);
    device_memset_zero(a.dresidual, BTC * sizeof(floatX));
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, a.dbuf, a.residual3 + (L - 1) * BTC, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, B * T, C);
    for (int l = L - 1; l >= 0; l--) {
        floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        // MLP block; the residual add passes dresidual to fcproj's output unchanged
        matmul_backward(a.dfch, g.fcprojw + (size_t)l * C * 4 * C, g.fcprojb + l * C, a.dresidual,
                        a.fch_gelu + l * BTC * 4, p.fcprojw + (size_t)l * C * 4 * C, B * T, 4 * C, C);
        gelu_backward(a.dfch, a.fch + l * BTC * 4, a.dfch, BTC * 4);
        matmul_backward(a.dbuf, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, a.dfch,
                        a.ln2 + l * BTC, p.fcw + (size_t)l * 4 * C * C, B * T, C, 4 * C);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, a.dbuf,
                           a.residual2 + l * BTC, p.ln2w + l * C, a.ln2_mean + l * BT,
                           a.ln2_rstd + l * BT, B * T, C);
        // attention block
        matmul_backward(a.dbuf, g.attprojw + (size_t)l * C * C, g.attprojb + l * C, a.dresidual,
                        a.atty + l * BTC, p.attprojw + (size_t)l * C * C, B * T, C, C);
        attention_backward(a.dqkv, a.dbuf, a.qkv + l * BTC * 3, a.atty + l * BTC,
                           a.att_state + l * att_state_bytes, B, T, C, NH);
        matmul_backward(a.dbuf, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C, a.dqkv,
                        a.ln1 + l * BTC, p.qkvw + (size_t)l * 3 * C * C, B * T, C, 3 * C);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, a.dbuf, residual,
                           p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, B * T, C);
    }
    encoder_backward(g.wte, g.wpe, a.dresidual, model->inputs, B, T, C);
}

// ----------------------------------------------------------------------------------------------

typedef struct {
    const char* train_path;
    const char* val_path;
    const char* model;
    const char* out_dir;
    const char* tokenizer_path;
    const char* dump_grads;
    int B, T, total_batch;
    float lr, final_lr_frac, weight_decay, grad_clip;
    int warmup, max_steps;
    int val_every, val_batches, sample_every, gen_tokens;
    int checkpoint_every, resume;
    int seed, shuffle;
    int watchdog;
} TrainArgs;

static float evaluate(GPT2* model, DataLoader* val, int batches, CommGroup* world) {
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_seek(val, (size_t)i);
        dataloader_load_microbatch(val, 0, model->config.vocab_size);
        gpt2_forward(model, val->inputs, model->B, model->T);
        sum += gpt2_loss(model, val->targets, model->B, model->T, 0.0f);
    }
    float loss = (float)(sum / batches);
    comm_all_reduce_scalar(world, &loss, COMM_AVG);  // every rank saw different validation tokens
    return loss;
}

// autoregressive sampling from <|endoftext|>, one sequence on rank 0 (the tokenizer's end-of-text
// id was checked to be inside the model's vocabulary)
static void sample(GPT2* model, const Tokenizer* tok, Rng* rng, int gen_tokens, int step) {
    int V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    int* tokens = (int*)malloc_check((size_t)gen_tokens * sizeof(int));
    float* logits = (float*)malloc_check((size_t)Vp * sizeof(float));  // one row, as fp32
    tokens[0] = tok->eot_token;
    printf("---- sample at step %d ----\n", step);
    for (int t = 1; t < gen_tokens; t++) {
        gpt2_forward(model, tokens, 1, t);
        copy_device_to_floats(logits, model->acts.logits + (size_t)(t - 1) * Vp, Vp);
        float maxval = -INFINITY, sum = 0.0f;
        for (int v = 0; v < V; v++) maxval = logits[v] > maxval ? logits[v] : maxval;
        for (int v = 0; v < V; v++) sum += expf(logits[v] - maxval);
        float r = rng_uniform(rng) * sum, cdf = 0.0f;
        int next = V - 1;
        for (int v = 0; v < V; v++) {
            cdf += expf(logits[v] - maxval);
            if (r < cdf) { next = v; break; }
        }
        tokens[t] = next;
        watchdog_beat();  // one token is progress: a long sample is not a hang
        tokenizer_print(tok, next);
        fflush(stdout);
    }
    printf("\n----------------\n");
    free(tokens);
    free(logits);
}

// bf16 parameters are not a function of the fp32 master weights (stochastic rounding), so the
// state file keeps their exact bits; fp32 parameters are the model file itself
static size_t low_precision_param_bytes(const GPT2* model) {
    return model->master_memory ? model->num_parameters * sizeof(floatX) : 0;
}

// every rank writes its state file, then DONE marks the checkpoint complete (checkpoint.h)
static void write_checkpoint(GPT2* model, const char* dir, CommGroup* world, int step,
                             const RunIdentity* id, uint64_t sample_rng_state) {
    char path[4096];
    size_t n = model->num_parameters, extra = low_precision_param_bytes(model);
    float* host = (float*)malloc_check(n * sizeof(float) * 2);
    TrainState s = {step, world->size, sample_rng_state, 0};
    if (world->rank == 0) {  // the replicas are identical: one copy of the weights is enough
        gpt2_weights_to_host(model, host);
        // an update can overflow the weights while its loss and gradient norm were finite; such
        // weights never become a checkpoint (the other ranks wait below and are stopped too)
        char what[64];
        snprintf(what, sizeof(what), "the weights after step %d (not checkpointed)", step);
        gpt2_check_finite(host, model->config, what);
        checkpoint_path(path, sizeof(path), dir, "model", step, -1);
        s.model_crc = gpt2_write_model_file(path, model->config, host);
    }
    // every state file records the model file's checksum, so that a resume can tell a model
    // file of another checkpoint from the right one
    comm_broadcast_host(world, &s.model_crc, sizeof(s.model_crc), 0);
    copy_device_to_host(host, model->m_memory, n * sizeof(float));
    copy_device_to_host(host + n, model->v_memory, n * sizeof(float));
    void* params = malloc_check(extra);
    if (extra > 0) copy_device_to_host(params, model->params_memory, extra);
    checkpoint_path(path, sizeof(path), dir, "state", step, world->rank);
    state_write(path, &s, world->rank, id, host, host + n, n, params, extra);
    free(host);
    free(params);
    comm_barrier(world);  // DONE only once every rank's file is in place
    if (world->rank == 0) checkpoint_mark_done(dir, step);
}

// Loads checkpoint `step` into the model; returns its state. Every rank checks its own state
// file against the step rank 0 chose, its rank, the world size and this run's identity, and the
// model file against the checksum its state file recorded: any mismatch stops every rank
// before anything is written.
static TrainState read_checkpoint(GPT2* model, const char* dir, CommGroup* world, int step,
                                  const RunIdentity* id) {
    char path[4096];
    size_t n = model->num_parameters, extra = low_precision_param_bytes(model);
    float* host = (float*)malloc_check(n * sizeof(float) * 2);
    void* params = malloc_check(extra);
    checkpoint_path(path, sizeof(path), dir, "state", step, world->rank);
    TrainState s = state_read(path, step, world->rank, world->size, id, host, host + n, n, params, extra);
    GPT2Config c;
    uint32_t model_crc;
    checkpoint_path(path, sizeof(path), dir, "model", step, -1);
    float* weights = gpt2_read_model_file(path, &c, &model_crc);
    if (gpt2_num_parameters(c) != n) fail("checkpoint '%s' does not match the model of -e", path);
    if (model_crc != s.model_crc) {
        fail("model file '%s' has CRC-32 %08x, but the state files of step %d were written with "
             "one of CRC-32 %08x: the files of this checkpoint do not belong together", path,
             model_crc, step, s.model_crc);
    }
    gpt2_weights_from_host(model, weights);
    free(weights);
    copy_host_to_device(model->m_memory, host, n * sizeof(float));
    copy_host_to_device(model->v_memory, host + n, n * sizeof(float));
    if (extra > 0) copy_host_to_device(model->params_memory, params, extra);
    free(host);
    free(params);
    return s;
}

int main(int argc, char** argv) {
    // defaults; --help prints them beside each flag with the range it accepts
    TrainArgs args;
    args.train_path = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
    args.val_path = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";
    args.model = "d12";
    args.out_dir = NULL;
    args.tokenizer_path = "dev/data/gpt2_tokenizer.bin";
    args.dump_grads = NULL;
    args.B = 4;
    args.T = 64;
    args.total_batch = -1;
    args.lr = 3e-4f;
    args.final_lr_frac = 1.0f;
    args.weight_decay = 0.0f;
    args.grad_clip = 1.0f;
    args.warmup = 0;
    args.max_steps = -1;
    args.val_every = 20;
    args.val_batches = 20;
    args.sample_every = 20;
    args.gen_tokens = 64;
    args.checkpoint_every = 0;
    args.resume = 0;
    args.seed = 1337;
    args.shuffle = 0;
    args.watchdog = 0;
    const double MAX = ARG_NO_MAX;
    ArgSpec specs[] = {
        {"-i", ARG_STRING, &args.train_path, 0, 0, "train token file"},
        {"-j", ARG_STRING, &args.val_path, 0, 0, "validation token file"},
        {"-e", ARG_STRING, &args.model, 0, 0, "model file, or descriptor dL for a random init (d12 = 124M)"},
        {"-o", ARG_STRING, &args.out_dir, 0, 0, "output dir for main.log and checkpoints; a fresh run needs one without checkpoints (-y 1 continues them; to start over, remove them or pick another dir)"},
        {"-b", ARG_INT, &args.B, 1, MAX, "micro-batch size per rank, in sequences"},
        {"-t", ARG_INT, &args.T, 1, MAX, "sequence length"},
        {"-d", ARG_INT, &args.total_batch, -1, MAX, "total batch in tokens = B*T*ranks*accumulation (-1: B*T*ranks)"},
        {"-l", ARG_FLOAT, &args.lr, 0, MAX, "peak learning rate"},
        {"-u", ARG_INT, &args.warmup, 0, MAX, "warmup steps"},
        {"-q", ARG_FLOAT, &args.final_lr_frac, 0, 1, "final learning rate as a fraction of -l (cosine decay)"},
        {"-c", ARG_FLOAT, &args.weight_decay, 0, MAX, "AdamW weight decay (2-D weights only)"},
        {"-x", ARG_INT, &args.max_steps, -1, MAX, "optimizer steps (-1: one epoch)"},
        {"-v", ARG_INT, &args.val_every, 0, MAX, "validation loss every N steps (0: never)"},
        {"-m", ARG_INT, &args.val_batches, 1, MAX, "validation batches per evaluation"},
        {"-s", ARG_INT, &args.sample_every, 0, MAX, "sample text every N steps (0: never)"},
        {"-g", ARG_INT, &args.gen_tokens, 1, MAX, "tokens to generate per sample"},
        {"-n", ARG_INT, &args.checkpoint_every, 0, MAX, "checkpoint every N steps and at the end (0: never)"},
        {"-y", ARG_INT, &args.resume, 0, 1, "1: resume from the newest checkpoint in -o"},
        {"-gc", ARG_FLOAT, &args.grad_clip, 0, MAX, "clip the global gradient norm to this (0: off)"},
        {"-seed", ARG_INT, &args.seed, 0, MAX, "seed of the random init, data shuffling and sampling"},
        {"-shuffle", ARG_INT, &args.shuffle, 0, 1, "1: shuffle the order of global batches every epoch"},
        {"-tok", ARG_STRING, &args.tokenizer_path, 0, 0, "tokenizer decode table, for samples"},
        {"-watchdog", ARG_INT, &args.watchdog, 0, MAX, "end the job when a rank makes no progress for this many seconds (0: off)"},
        {"-dump_grads", ARG_STRING, &args.dump_grads, 0, 0, "write the averaged gradients of the first step here (tests)"},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    if (!args_parse(argc, argv, specs, num_specs)) return 0;

    CommGroup world;
    comm_init(&world, &argc, &argv);
    int rank = world.rank;
    watchdog_start(args.watchdog);

    // ---- model: a model file, or a descriptor for a random init. Only its config for now: the
    // memory check comes before the first large allocation
    GPT2Config config;
    int from_descriptor = gpt2_config_from_descriptor(args.model, &config);
    if (!from_descriptor) gpt2_read_model_config(args.model, &config);

    // ---- the batch layout: B x T per micro-batch, `accum` micro-batches per rank per step.
    // Products of flags are taken in 64 bits: -b 4194304 -t 1024 on 2 ranks is 2^33 tokens.
    if (args.T > config.max_seq_len) {
        fail("-t %d is longer than the model's maximum sequence length %d", args.T, config.max_seq_len);
    }
    size_t tokens_per_pass = mul_check(mul_check(args.B, args.T, "-b x -t"), world.size, "-b x -t x ranks");
    if (args.total_batch == -1) {
        if (tokens_per_pass > INT_MAX) fail("B*T*ranks = %zu tokens does not fit -d's int range", tokens_per_pass);
        args.total_batch = (int)tokens_per_pass;
    }
    if (args.total_batch <= 0 || args.total_batch % tokens_per_pass != 0) {
        fail("-d %d must be a positive multiple of B*T*ranks = %d*%d*%d = %zu", args.total_batch,
             args.B, args.T, world.size, tokens_per_pass);
    }
    int accum = (int)(args.total_batch / tokens_per_pass);
    if ((args.checkpoint_every > 0 || args.resume) && args.out_dir == NULL) {
        fail("-n and -y need an output dir (-o)");
    }

    // ---- memory: predicted before allocating, so a batch too large for this machine is a
    // message rather than a kill by the out-of-memory killer mid-run (llmc/memory.h). Host
    // buffers at their largest: the fp32 weights while building, and on resume the weights plus
    // the AdamW moments (and the bf16 parameter bits) read from the checkpoint.
    size_t P = gpt2_num_parameters(config);
    size_t state_extra = FLOATX_IS_FLOAT ? 0 : P * sizeof(floatX);
    size_t host_bytes = P * sizeof(float) * (args.resume ? 3 : args.checkpoint_every > 0 ? 2 : 1) +
                        (args.resume || args.checkpoint_every > 0 ? state_extra : 0);
    char layout[128];
    snprintf(layout, sizeof(layout), "%zu parameters, -b %d -t %d", P, args.B, args.T);
    memory_check_fits(gpt2_memory_bytes(config, args.B, args.T), host_bytes, world.ranks_sharing_memory, layout);
    comm_barrier(&world);  // every rank checked before any allocates (ranks may share memory)

    // the weights: read (checksum verified, non-finite values refused) or drawn from the seed
    float* params_host = from_descriptor ? gpt2_init_random(config, (uint64_t)args.seed)
                                         : gpt2_read_model_file(args.model, &config, NULL);

    DataLoader train, val;
    dataloader_init(&train, args.train_path, args.B, args.T, rank, world.size, accum, args.shuffle, (uint64_t)args.seed);
    if (args.val_every > 0) {
        dataloader_init(&val, args.val_path, args.B, args.T, rank, world.size, 1, 0, 0);
        if ((size_t)args.val_batches > val.batches_per_epoch) args.val_batches = (int)val.batches_per_epoch;
    }
    int max_steps = args.max_steps >= 0 ? args.max_steps : (int)train.batches_per_epoch;
    Tokenizer tok = {0, 0, NULL};
    int can_sample = rank == 0 && args.sample_every > 0;
    if (can_sample) {
        FILE* f = fopen(args.tokenizer_path, "rb");
        if (f == NULL) {
            printf("warning: no tokenizer at '%s' (-tok): samples are off\n", args.tokenizer_path);
            can_sample = 0;
        } else {
            fclose(f);
            tokenizer_init(&tok, args.tokenizer_path);
            // sampling starts from the end-of-text token: it must be a row of the embedding
            if (tok.eot_token >= config.vocab_size) {
                printf("warning: the tokenizer's end-of-text id %d is outside the model's vocabulary "
                       "of %d (-tok '%s' does not fit -e): samples are off\n", tok.eot_token,
                       config.vocab_size, args.tokenizer_path);
                tokenizer_free(&tok);
                can_sample = 0;
            }
        }
    }
    int gen_tokens = args.gen_tokens < args.T ? args.gen_tokens : args.T;

    // ---- the run's identity: everything that determines the training trajectory. A checkpoint
    // stores it, and a resume with anything different is refused (checkpoint.h).
    RunIdentity identity = {"", 0};
    // the train data by content, so a moved or copied file still resumes (rank 0 reads it once)
    uint32_t train_crc = rank == 0 ? dataloader_file_crc(&train) : 0;
    comm_broadcast_host(&world, &train_crc, sizeof(train_crc), 0);
    run_identity_add(&identity, "-e", "L=%d NH=%d C=%d V=%d Vp=%d maxT=%d, initial weights CRC-32 %08x",
                     config.num_layers, config.num_heads, config.channels, config.vocab_size,
                     config.padded_vocab_size, config.max_seq_len,
                     crc32_update(0, params_host, gpt2_num_parameters(config) * sizeof(float)));
    run_identity_add(&identity, "-i", "%zu tokens, CRC-32 %08x", train.num_tokens, train_crc);
    run_identity_add(&identity, "ranks", "%d", world.size);
    run_identity_add(&identity, "-b", "%d", args.B);
    run_identity_add(&identity, "-t", "%d", args.T);
    run_identity_add(&identity, "-d", "%d", args.total_batch);
    run_identity_add(&identity, "-l", "%.9g", args.lr);
    run_identity_add(&identity, "-u", "%d", args.warmup);
    run_identity_add(&identity, "-q", "%.9g", args.final_lr_frac);
    if (args.final_lr_frac != 1.0f) run_identity_add(&identity, "-x", "%d", max_steps);  // the decay's length
    run_identity_add(&identity, "-c", "%.9g", args.weight_decay);
    run_identity_add(&identity, "-gc", "%.9g", args.grad_clip);
    run_identity_add(&identity, "-seed", "%d", args.seed);
    run_identity_add(&identity, "-shuffle", "%d", args.shuffle);
    run_identity_add(&identity, "precision", "%s", PRECISION_NAME);

    // ---- the output dir: rank 0 holds its lock for the whole run; a fresh run refuses a dir
    // that holds checkpoints already, instead of mixing them with its own
    if (args.out_dir != NULL) {
        if (rank == 0) output_dir_claim(args.out_dir, args.resume);
        comm_barrier(&world);
    }

    GPT2 model;
    gpt2_build(&model, config, params_host, args.B, args.T);
    free(params_host);

    if (rank == 0) {
        printf("+-----------------------+----------------------------------------------------+\n");
        char cell[4][64];  // composite cells are formatted first, so every row is padded alike
        snprintf(cell[0], sizeof(cell[0]), "backend %s, precision %s", BACKEND_NAME, PRECISION_NAME);
        snprintf(cell[1], sizeof(cell[1]), "%d, %d, %d", config.num_layers, config.num_heads, config.channels);
        snprintf(cell[2], sizeof(cell[2]), "%d, %d, %d", config.max_seq_len, config.vocab_size, config.padded_vocab_size);
        snprintf(cell[3], sizeof(cell[3]), "%d x %d", args.B, args.T);
        printf("| train_gpt2_dp (DDP)   | %-50s |\n", cell[0]);
        printf("| model                 | %-50s |\n", args.model);
        printf("| L, NH, C              | %-50s |\n", cell[1]);
        printf("| maxT, V, Vp           | %-50s |\n", cell[2]);
        printf("| parameters            | %-50zu |\n", P);
        printf("| ranks (data parallel) | %-50d |\n", world.size);
        printf("| micro-batch B x T     | %-50s |\n", cell[3]);
        printf("| accumulation steps    | %-50d |\n", accum);
        printf("| total batch (tokens)  | %-50d |\n", args.total_batch);
        printf("| steps                 | %-50d |\n", max_steps);
        printf("| train / val tokens    | %zu / %-41zu |\n", train.num_tokens, args.val_every > 0 ? val.num_tokens : (size_t)0);
        printf("+-----------------------+----------------------------------------------------+\n");
        size_t sizes[NUM_PARAMETER_TENSORS];
        gpt2_parameter_sizes(sizes, config);
        printf("parameter layout (one flat buffer; gradients and AdamW moments share it):\n");
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            printf("  %-9s %12zu%s\n", parameter_names[i], sizes[i], parameter_is_matrix[i] ? "  (weight decay)" : "");
        }
        size_t master = model.master_memory ? P * sizeof(float) : 0;
        printf("memory per rank (every rank holds a full replica):\n");
        printf("  parameters     %10.1f MB  (%s)\n", P * sizeof(floatX) / 1e6, PRECISION_NAME);
        printf("  master weights %10.1f MB\n", master / 1e6);
        printf("  gradients      %10.1f MB\n", P * sizeof(floatX) / 1e6);
        printf("  AdamW m, v     %10.1f MB\n", P * 2 * sizeof(float) / 1e6);
        printf("  activations    %10.1f MB\n", model.acts_bytes / 1e6);
        printf("  comm buffers   %10.1f MB  (the all-reduce works in place)\n", 0.0);
        printf("  total          %10.1f MB  (x %d ranks sharing this memory)\n",
               gpt2_memory_bytes(config, args.B, args.T) / 1e6, world.ranks_sharing_memory);
        printf("  host buffers   %10.1f MB  at most (weights; on resume also the AdamW moments)\n", host_bytes / 1e6);
    }

    // ---- resume from the newest complete checkpoint: rank 0 picks the step, every rank checks
    // that its files are of that step, of its rank, of this layout and of this run
    Rng sample_rng;
    rng_init(&sample_rng, (uint64_t)args.seed + 1);
    int start_step = 0;
    if (args.resume) {
        watchdog_phase("resume", 0);
        int latest = rank == 0 ? checkpoint_latest(args.out_dir) : 0;
        comm_broadcast_host(&world, &latest, sizeof(int), 0);
        if (latest < 0) fail("-y 1: no complete checkpoint (DONE_ file) in '%s'", args.out_dir);
        if (latest > max_steps) {
            fail("-x %d: the newest checkpoint in '%s' is already at step %d, so there is nothing to "
                 "train; raise -x", max_steps, args.out_dir, latest);
        }
        TrainState s = read_checkpoint(&model, args.out_dir, &world, latest, &identity);
        start_step = s.step;
        sample_rng.state = s.rng;
        dataloader_seek(&train, (size_t)start_step);
        comm_barrier(&world);  // every rank's checks passed before rank 0 touches main.log
        if (rank == 0) printf("resumed from step %d in %s\n", start_step, args.out_dir);
    }
    Logger logger;
    logger_init(&logger, args.out_dir, rank, args.resume ? start_step : -1);

    // ---- training loop; `step` counts completed optimizer steps
    // model FLOPs per token of a training step (forward + backward = 3 x forward): 6 per
    // parameter, plus the attention scores and their use, 12 L C T (PaLM paper, appendix B)
    double flops_per_token = 6.0 * model.num_parameters + 12.0 * config.num_layers * config.channels * args.T;
    DevicePeak peak = device_peak();
    double peak_flops = peak.flops;
    if (rank == 0 && peak_flops > 0)
        printf("MFU against the %s dense %s peak, %.0f TFLOP/s\n", peak.part, PRECISION_NAME, peak_flops / 1e12);
    size_t peak_memory = 0;
    double total_time = 0.0;
    int timed_steps = 0;
    for (int step = start_step; step <= max_steps; step++) {
        int last = step == max_steps;
        // The checkpoint of a step holds the state before that step's validation and sample
        // (the sampling rng included), so a resumed run redoes them exactly as an uninterrupted
        // run with its flags would: same values, same samples, and the log was cut back to match
        uint64_t rng_before_sample = sample_rng.state;
        if (args.val_every > 0 && (step % args.val_every == 0 || last)) {
            watchdog_phase("validation", step);
            float val_loss = evaluate(&model, &val, args.val_batches, &world);
            if (!isfinite(val_loss)) fail("step %d: the validation loss is %g; stopping", step, val_loss);
            if (rank == 0) printf("step %d: val loss %.6f\n", step, val_loss);
            logger_val(&logger, step, val_loss);
        }
        if (can_sample && step > 0 && (step % args.sample_every == 0 || last)) {
            watchdog_phase("sampling", step);
            sample(&model, &tok, &sample_rng, gen_tokens, step);
        }
        int resumed_here = args.resume && step == start_step;  // this checkpoint exists already
        if (args.checkpoint_every > 0 && !resumed_here && (last || (step > start_step && step % args.checkpoint_every == 0))) {
            watchdog_phase("checkpoint write", step);
            write_checkpoint(&model, args.out_dir, &world, step, &identity, rng_before_sample);
        }
        if (last) break;

        double t0 = wall_time_s();
        comm_reset_counters(&world);
        // 1. forward + backward over this rank's micro-batches; gradients accumulate
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        float loss = 0.0f;
        float dloss = 1.0f / (float)((size_t)args.B * args.T * accum);  // mean over rank's tokens
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            dataloader_load_microbatch(&train, micro, config.vocab_size);
            gpt2_forward(&model, train.inputs, args.B, args.T);
            loss += gpt2_loss(&model, train.targets, args.B, args.T, dloss) / (float)accum;
            gpt2_backward(&model, args.B, args.T);
        }
        dataloader_advance(&train);
        // 2. DDP: average the gradients (all P floats, one flat buffer) and the loss over ranks
        watchdog_phase("gradient all-reduce", step);
        comm_all_reduce(&world, model.grads_memory, model.num_parameters, COMM_FLOATX, COMM_AVG);
        comm_all_reduce_scalar(&world, &loss, COMM_AVG);
        if (args.dump_grads != NULL && step == 0 && rank == 0) {
            float* g = (float*)malloc_check(model.num_parameters * sizeof(float));
            copy_device_to_floats(g, model.grads_memory, model.num_parameters);
            gpt2_write_model_file(args.dump_grads, config, g);
            free(g);
        }
        // 3. the same clipped AdamW step on every rank (clip as torch.nn.utils.clip_grad_norm_)
        watchdog_phase("AdamW update", step);
        float grad_norm = sqrtf(global_norm_squared(model.grads_memory, model.num_parameters));
        // A nan or inf anywhere on any rank reaches every rank through the all-reduced sums, so
        // all ranks stop here together, before this step updates, logs or checkpoints anything
        if (!isfinite(loss) || !isfinite(grad_norm)) {
            fail("step %d: the %s is %g; stopping before the update, so nothing of this step is "
                 "written (the newest checkpoint is intact; try a lower -l)", step + 1,
                 isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? grad_norm : loss);
        }
        float grad_scale = 1.0f;
        if (args.grad_clip > 0.0f) {
            float coef = args.grad_clip / (grad_norm + 1e-6f);
            grad_scale = coef < 1.0f ? coef : 1.0f;
        }
        float lr = learning_rate_at(step, args.lr, args.warmup, max_steps, args.final_lr_frac);
        size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
        gpt2_parameter_sizes(sizes, config);
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            float wd = parameter_is_matrix[i] ? args.weight_decay : 0.0f;
            adamw_update(model.params_memory + offset,
                         model.master_memory ? model.master_memory + offset : NULL,
                         model.grads_memory + offset, model.m_memory + offset,
                         model.v_memory + offset, sizes[i], lr, 0.9f, 0.95f, 1e-8f, wd, step + 1,
                         grad_scale, (unsigned int)args.seed * 1000003u + (unsigned int)step, offset);
            offset += sizes[i];
        }
        device_synchronize();
        double dt = wall_time_s() - t0;
        if (step > start_step) {  // the first step warms caches; leave it out of the average
            total_time += dt;
            timed_steps++;
        }
        double tokens_per_s = args.total_batch / dt;
        size_t memory = device_memory_used();
        peak_memory = memory > peak_memory ? memory : peak_memory;
        if (rank == 0) {
            char comm_summary[256], mfu[32] = "";
            comm_format_counters(&world, comm_summary, sizeof(comm_summary));
            // MFU: this rank's share of the tokens against one device's peak
            if (peak_flops > 0) snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100.0 * flops_per_token * tokens_per_s / world.size / peak_flops);
            printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | %s\n",
                   step + 1, max_steps, loss, lr, grad_norm, dt * 1e3, tokens_per_s, mfu, comm_summary);
        }
        logger_train(&logger, step + 1, loss, lr, grad_norm, tokens_per_s, comm_total_bytes(&world));
    }
    if (rank == 0 && timed_steps > 0) {
        double tokens_per_s = args.total_batch / (total_time / timed_steps);
        printf("average step time %.1f ms, %.0f tokens/s", total_time / timed_steps * 1e3, tokens_per_s);
        if (peak_flops > 0) printf(", MFU %.1f%%", 100.0 * flops_per_token * tokens_per_s / world.size / peak_flops);
        if (peak_memory > 0) printf(", peak device memory %.2f GB", peak_memory / 1e9);
        printf("\n");
    }

    watchdog_phase("shutdown", max_steps);
    logger_close(&logger);
    if (can_sample) tokenizer_free(&tok);
    dataloader_free(&train);
    if (args.val_every > 0) dataloader_free(&val);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
