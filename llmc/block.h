// Half-blocks: the two halves of a transformer layer that every trainer runs, on both backends.
// A half starts right after a LayerNorm and ends right before a residual add:
//   attention half   ln1 (B,T,C) -> qkv (B,T,qkv) -> attention -> atty (B,T,att) -> attproj (B,T,C)
//   MLP half         ln2 (B,T,C) -> fch (B,T,fc) -> GELU -> fch_gelu -> fcproj (B,T,C)
// Neither communicates. The LayerNorms, the residual adds, the loop over layers and the
// strategy's collectives stay in the trainers, in the open: that is where the strategies differ
// (the collectives several trainers share are named calls: the pipeline's exchanges in stage.h,
// the vocabulary-parallel cross-entropy's in tensor_parallel.h). Under tensor
// parallelism a half is Megatron's column-parallel then row-parallel pair, on the rank's widths
// (LayerDims); a row-parallel bias must be added once, after the reduction, so that trainer
// passes a NULL attprojb/fcprojb and adds it itself.
#ifndef LLMC_BLOCK_H
#define LLMC_BLOCK_H

#include "model.h"

static inline void attention_half_forward(LayerActs a, LayerWeights w, int B, int T, LayerDims d) {
    matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, B * T, d.C, d.qkv);
    attention_forward(a.atty, a.att_state, a.qkv, B, T, d.att, d.NH);
    matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, B * T, d.att, d.C);
}

// A half's backward is two passes (zero-bubble pipelines, Qi et al. 2023, run them at different
// times; every other trainer runs them back to back):
//   input   the gradient at the half's input, which the layers below wait for;
//   weight  the weight and bias gradients, which nothing waits for. It needs each matmul's input
//           (kept in the activations) and the gradient at its output (from the input pass).

// dout (B,T,C): the gradient at attproj. Writes the gradient at ln1 into dln1 (B,T,C), which may
// be the same buffer as datty (B,T,att): datty is used up before dln1 is written. Leaves the
// gradient at qkv in dqkv (B,T,qkv), for the weight pass.
static inline void attention_half_backward_input(floatX* dln1, floatX* datty, floatX* dqkv, const floatX* dout,
                                                 LayerActs a, LayerWeights w, int B, int T, LayerDims d) {
    matmul_backward_input(datty, dout, w.attprojw, B * T, d.att, d.C);
    attention_backward(dqkv, datty, a.qkv, a.atty, a.att_state, B, T, d.att, d.NH);
    matmul_backward_input(dln1, dqkv, w.qkvw, B * T, d.C, d.qkv);
}

// dout (B,T,C) and dqkv (B,T,qkv) as the input pass had them; gradients accumulate into g
static inline void attention_half_backward_weight(LayerWeights g, const floatX* dqkv, const floatX* dout, LayerActs a,
                                                  int B, int T, LayerDims d) {
    matmul_backward_weight(g.attprojw, g.attprojb, dout, a.atty, B * T, d.att, d.C);
    matmul_backward_weight(g.qkvw, g.qkvb, dqkv, a.ln1, B * T, d.C, d.qkv);
}

// both passes: dqkv (B,T,qkv) is scratch
static inline void attention_half_backward(floatX* dln1, floatX* datty, floatX* dqkv, const floatX* dout,
                                           LayerActs a, LayerWeights w, LayerWeights g, int B, int T,
                                           LayerDims d) {
    attention_half_backward_input(dln1, datty, dqkv, dout, a, w, B, T, d);
    attention_half_backward_weight(g, dqkv, dout, a, B, T, d);
}

// the MLP half as far as its backward reads: fch and the GELU output (a rerun stops here, below).
// The GELU output may come from the fc GEMM's epilogue (the default on CUDA) only where it is kept:
// -r 1 recomputes it with gelu_forward from fch, which must give what the forward gave.
static inline void mlp_half_forward_to_gelu(LayerActs a, LayerWeights w, int B, int T, LayerDims d) {
    if (a.kept & KEEP_FCH_GELU) {
        matmul_forward_gelu(a.fch_gelu, a.fch, a.ln2, w.fcw, w.fcb, B * T, d.C, d.fc);
    } else {
        matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, B * T, d.C, d.fc);
        gelu_forward(a.fch_gelu, a.fch, (size_t)B * T * d.fc);
    }
}

static inline void mlp_half_forward(LayerActs a, LayerWeights w, int B, int T, LayerDims d) {
    mlp_half_forward_to_gelu(a, w, B, T, d);
    matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, B * T, d.fc, d.C);
}

// dout (B,T,C): the gradient at fcproj. Writes the gradient at ln2 into dln2 (B,T,C). Leaves the
// gradient at fch (after GELU's backward) in dfch (B,T,fc), for the weight pass.
static inline void mlp_half_backward_input(floatX* dln2, floatX* dfch, const floatX* dout, LayerActs a,
                                           LayerWeights w, int B, int T, LayerDims d) {
    matmul_backward_input_gelu(dfch, dout, w.fcprojw, a.fch, B * T, d.fc, d.C);
    matmul_backward_input(dln2, dfch, w.fcw, B * T, d.C, d.fc);
}

// dout (B,T,C) and dfch (B,T,fc) as the input pass had them; gradients accumulate into g
static inline void mlp_half_backward_weight(LayerWeights g, const floatX* dfch, const floatX* dout, LayerActs a,
                                            int B, int T, LayerDims d) {
    matmul_backward_weight(g.fcprojw, g.fcprojb, dout, a.fch_gelu, B * T, d.fc, d.C);
    matmul_backward_weight(g.fcw, g.fcb, dfch, a.ln2, B * T, d.C, d.fc);
}

// both passes: dfch (B,T,fc) is scratch
static inline void mlp_half_backward(floatX* dln2, floatX* dfch, const floatX* dout, LayerActs a,
                                     LayerWeights w, LayerWeights g, int B, int T, LayerDims d) {
    mlp_half_backward_input(dln2, dfch, dout, a, w, B, T, d);
    mlp_half_backward_weight(g, dfch, dout, a, B, T, d);
}

// ---------------------------------------------------------------------------------------------
// Recomputation (-r, model.h): before a layer's backward, what its forward did not keep.

// the time the step spent recomputing, for the step report (device.h's spans)
static DeviceSpans recompute_spans;

// -r 1: the GELU output from fch (fcproj's weight gradient reads it), and attention's
// probabilities from qkv (attention runs again, and writes atty once more with the same values)
static inline void layer_recompute_selective(LayerActs a, unsigned kept, int B, int T, LayerDims d) {
    if (!(kept & KEEP_FCH_GELU)) gelu_forward(a.fch_gelu, a.fch, (size_t)B * T * d.fc);
    if (!(kept & KEEP_ATT_STATE)) attention_forward(a.atty, a.att_state, a.qkv, B, T, d.att, d.NH);
}

// -r 2 (its residual stream after attention is gone): the layer's whole forward runs again from
// its input, the trainer's own code with its collectives, as far as the backward reads: the
// LayerNorms, both halves, but not fcproj, whose only use was residual3, which is kept
static inline int layer_rerun_needed(unsigned kept) { return !(kept & KEEP_RESIDUAL2); }

#endif
