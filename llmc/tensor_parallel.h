// The pieces of Megatron-LM's tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053) that the
// tensor-parallel trainers share (train_gpt2_tp.cu, and inside each pipeline stage
// train_gpt2_3d.cu): the two collectives at the ends of a parallel half-block, with sequence
// parallelism (Korthikanti et al. 2022, arXiv:2205.05198) or without, and the vocabulary-parallel
// embedding lookup and cross-entropy. Where each is called, and why, is the trainers' chapter.
#ifndef LLMC_TENSOR_PARALLEL_H
#define LLMC_TENSOR_PARALLEL_H

#include "comm.h"
#include "model.h"

// ----------------------------------------------------------------------------------------------
// The two collectives of tensor parallelism. Each is the forward of one of Megatron's operators
// and the backward of the other, so the forward and backward passes call the same two.

// a layer's widths on one of tp ranks (model.h: the heads, 4C and Vp must divide by tp); with
// -sp the T tokens of a sequence are split over them too, so T must divide by tp
static inline LayerDims tp_layer_dims(GPT2Config c, int tp, int sp, int T, const char* ranks_name) {
    LayerDims d = layer_dims(c, tp, sp);
    if (d.seq_shards > 1 && T % tp != 0) {
        fail("-sp 1 splits the tokens over the %d %s: -t %d must be a multiple of %d", tp, ranks_name, T, tp);
    }
    return d;
}

// Sums partial (B, T, C), of which every rank holds a share, over the ranks. Without -sp an
// all-reduce in place: returns partial, now whole on every rank. With -sp a reduce-scatter:
// returns `reduced`, this rank's B*T/tp tokens of the sum.
static inline floatX* sum_over_ranks(CommGroup* tp, floatX* partial, floatX* reduced, size_t BT, int C, int sp) {
    if (!sp) {
        comm_all_reduce(tp, partial, BT * C, COMM_FLOATX, COMM_SUM);
        return partial;
    }
    comm_reduce_scatter(tp, partial, reduced, BT / tp->size * C, COMM_FLOATX, COMM_SUM);
    return reduced;
}

// With -sp: every rank's B*T/tp tokens (shard) all-gathered into whole (B, T, C), in rank order.
// Without -sp every rank holds all tokens already (the identity): returns shard itself.
static inline floatX* gather_tokens(CommGroup* tp, floatX* shard, floatX* whole, size_t BT, int C, int sp) {
    if (!sp) return shard;
    comm_all_gather(tp, shard, whole, BT / tp->size * C, COMM_FLOATX);
    return whole;
}

// ----------------------------------------------------------------------------------------------
// The vocabulary-parallel embedding: this rank holds rows [lo, lo + Vp/tp) of wte. Its lookup
// table of the B*T tokens, written to the host stage (for encoder_backward, which reads the tokens
// on the host) and returned; with a `device` buffer also copied there (for encoder_forward). A token
// of another rank becomes -1, a row of zeros in the forward pass and no gradient in the backward.
static inline const int* vocab_parallel_tokens(int* device, HostStage* stage, const int* tokens_host, size_t BT,
                                               int tp_rank, int Vp_rank) {
    int lo = tp_rank * Vp_rank;
    int* local = (int*)host_stage_take(stage, BT * sizeof(int));
    for (size_t i = 0; i < BT; i++) local[i] = tokens_host[i] >= lo && tokens_host[i] < lo + Vp_rank ? tokens_host[i] - lo : -1;
    if (device != NULL) host_stage_to_device(stage, device, BT * sizeof(int));
    return local;
}

// Vocabulary-parallel cross-entropy: the mean loss of the micro-batch from this rank's logits
// (B, T, Vp/tp) in head->logits, which are never gathered. With dloss != 0 they become their
// gradient, each token weighted by dloss. Every rank returns the same loss. `head` holds the
// head's activations (logits, losses, row statistics): the model's arena, or a pipeline slot.
static inline float vocab_parallel_loss(GPT2* model, CommGroup* tp, Activations* head, const int* targets_host, int B,
                                        int T, float dloss) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int BT = B * T, lo = tp->rank * d.Vp, real = vocab_real_columns(c, d, tp->rank);
    tokens_to_device(model->targets, &model->target_stage, targets_host, (size_t)BT);
    // each row's maximum over the whole vocabulary: all-reduce MAX of (B, T) fp32
    classifier_shard_max(head->row_max, head->logits, BT, d.Vp, real);
    comm_all_reduce(tp, head->row_max, (size_t)BT, COMM_FLOAT, COMM_MAX);
    // each row's sum of exp(logit - max) and its target's logit (held by one rank, 0 on the
    // others): one all-reduce SUM of (B, T, 2) fp32 for both
    classifier_shard_sums(head->row_sums, head->logits, head->row_max, model->targets, BT, d.Vp, real, lo);
    comm_all_reduce(tp, head->row_sums, (size_t)BT * 2, COMM_FLOAT, COMM_SUM);
    // loss = log(sum) - (target - max) on every rank; dlogits = dloss (softmax - onehot), local
    classifier_shard_loss(head->logits, head->losses, head->row_max, head->row_sums, model->targets, dloss, BT, d.Vp,
                          real, lo);
    const float* losses = losses_to_host(model, head->losses, (size_t)BT);
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += losses[i];
    return (float)(sum / BT);
}

// With -sp each rank's LayerNorm weights saw only its own tokens, so their gradients are partial
// sums: all-reduce each of ln1w, ln1b, ln2w, ln2b ((layers, C) each) and, where the rank holds
// them, lnfw, lnfb ((C) each). Forgetting this is the classic sequence-parallel bug: every rank
// would update its LayerNorm copy with its own part of the gradient.
static inline void layernorm_grads_all_reduce(GPT2* model, CommGroup* tp) {
    const ParameterLayout* p = &model->layout;
    const int layernorms[6] = {PARAM_LN1W, PARAM_LN1B, PARAM_LN2W, PARAM_LN2B, PARAM_LNFW, PARAM_LNFB};
    for (int i = 0; i < 6; i++) {
        int t = layernorms[i];
        if (p->sizes[t] > 0) comm_all_reduce(tp, model->grads_memory + p->offsets[t], p->sizes[t], COMM_FLOATX, COMM_SUM);
    }
}

#endif
