/*
GPT-2 training with data parallelism: DDP, and ZeRO-1, -2 and -3 (-z 1, 2, 3; Rajbhandari et al.
2020), which shard the optimizer state, then the gradients, then the parameters over the ranks
(see "ZeRO" below; -z 3 is PyTorch's FSDP, Zhao et al. 2023).

Every rank holds a full replica of the model and the optimizer. Each step:
  1. each rank runs forward + backward on its own slice of the global batch (micro-batches of
     B x T tokens, accumulated `accum` times),
  2. all-reduces average the gradients over the ranks: one per bucket while the backward pass
     goes on (-overlap 1), or one of the whole flattened buffer after it (-overlap 0),
  3. every rank applies the same AdamW step to the same averaged gradient, so the replicas stay
     identical without ever sending a parameter.
The result is the same as one process training on the whole global batch (checked in test/).
ZeRO replaces step 2 with a reduce-scatter (each rank gets the averaged gradient of its shard),
step 3 with an update of each rank's shard followed by an all-gather of the parameters (-z 1, 2)
or by nothing (-z 3: the parameters are gathered, a bucket at a time, when the next pass needs them).

Build: make train_gpt2_dp          Run: mpirun -np 2 ./train_gpt2_dp -e d6 -x 100 -z 1 -o out
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
#include "llmc/model.h"
#include "llmc/block.h"
#include "llmc/optimizer.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// ----------------------------------------------------------------------------------------------
// ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054). DDP keeps on every rank what the optimizer
// needs for every parameter: 16 bytes each in mixed precision (2 parameter, 2 gradient, 4 master
// weight, 4 + 4 AdamW moments). ZeRO gives each of the N ranks one shard of it instead:
//   -z 1: the optimizer state (master weights, m, v). The gradients are reduce-scattered, so
//         each rank receives the sum of its shard only, updates that shard, and the updated
//         parameters are all-gathered: the same bytes on the wire as DDP's all-reduce (which is
//         a reduce-scatter then an all-gather), for 12/16 of the memory divided by N.
//   -z 2: the gradients too: each bucket's gradient is reduce-scattered as soon as the backward
//         pass has produced it, and a later bucket reuses its buffer.
//   -z 3: the parameters too, as PyTorch's FSDP (Zhao et al. 2023, arXiv:2304.11277): a rank
//         keeps its shard of every bucket, and all-gathers a bucket into a gather buffer just
//         before the forward pass needs it, and again before the backward pass does; the buffer
//         then serves another bucket. 16/N bytes per parameter, for two all-gathers of the model
//         per micro-batch instead of one per step: 3 (N-1)/N X Psi on the wire with one
//         micro-batch instead of 2, 3a (N-1)/N X Psi with a of them.
// The units are buckets (model.h): the embeddings, each layer, the final LayerNorm. The rank's
// buffers are laid out bucket after bucket (parameter_layout_buckets), so every collective is one
// call on one contiguous range, and the file's tensor order is restored when files are written.
// Chosen over llm.c's grouped call per tensor slice of a layer: one call per bucket, and one
// padding per bucket rather than per slice, at the cost of a conversion at file I/O.
//
// Overlap (-overlap 1): a collective is posted as soon as its input is ready and waited for only
// when its output is needed, so that it runs while the rank computes: a layer's gradient is
// reduced while the backward pass goes on to the layers below it (all stages), the next layer's
// parameters are gathered while this one computes (-z 3, "prefetch"), and after the update each
// bucket's parameters are gathered while the next bucket is updated (-z 1, 2). -overlap 0 waits
// at once after each post (DDP and -z 1: one reduction after the backward pass, as before).

typedef struct {
    int stage;            // -z
    int overlap;          // -overlap
    CommGroup* dp;        // the data-parallel ranks that share the buckets
    floatX* grad_shards;  // this rank's reduced shard of every bucket's gradient: -z 1 its own
                          // buffer (the reduce-scatter's output), -z 2, 3 the model's gradients
    floatX* grad_bucket[4];  // -z 2, 3: a bucket's gradient before it is reduce-scattered: the
                             // embeddings', a layer's (two with overlap: one in flight while the
                             // backward fills the other), the final LayerNorm's
    floatX* received;     // -z 2, 3 with accumulation: a reduce-scatter's output, to be added
    floatX* gathered;     // -z 3: the gather buffer, the size of the largest of: the embeddings'
                          // bucket, or two layers' buckets and the final LayerNorm's after them
    CommRequest* requests;  // one per bucket: its gradient's reduction (DDP and -z 1, on the last
                            // micro-batch), or its parameters' all-gather after the update
    CommRequest reducing;   // -z 2, 3: the reduce-scatter in flight (one at a time)
    int reducing_bucket;    // its bucket, or -1 when none is in flight
    int reducing_adds;      // 1: its output is `received`, to be added to the shards
    int reducing_last;      // 1: it is the step's last reduction of that bucket
    CommRequest gathering;  // -z 3: the all-gather in flight (one at a time: the prefetch)
    int micro, accum;     // the micro-batch of the step the backward is on, of accum
    // -offload 1 (ZeRO-Offload, below): the host's side
    int offload;
    floatX* host_grads;   // (S) this rank's reduced gradients, copied as each bucket's reduction ends
    floatX* host_params;  // (S) its updated parameters, copied back: in fp32 the weights AdamW
                          // updates in place, in bf16 the rounded copy of the master weights
    DeviceCopy* copies;   // one per bucket: its gradient's copy to the host, and
    int* copying;         // 1 once it is posted this step
    int buckets;
} Zero;

// ZeRO-Offload (-offload 1; Ren et al. 2021, arXiv:2101.06840). The optimizer state is 12 of the
// 16 bytes per parameter in mixed precision (fp32 master weights, m, v): this trainer can keep it
// in the host's memory instead of the GPU's, and run AdamW on the CPU, which has the memory and
// is idle during the backward pass. The GPU keeps the bf16 parameters and gradients and does all
// the forward and backward work. Each bucket's reduced gradient (this rank's shard of it under
// ZeRO) goes to the host on a copy stream as soon as its reduction ends, behind the backward
// pass; after the backward pass the CPU updates bucket after bucket (OpenMP over its cores) and
// each bucket's new parameters go back, then are all-gathered (-z 1, 2) as without offload. The
// price: 2 X bytes per parameter of this rank's share over PCIe each step, and AdamW at the CPU's
// memory bandwidth. The arithmetic is the device's own, so on the CPU backend the run is the same
// bit for bit; with bf16 the host rounds stochastically with the same bits as the GPU kernel.

// the buffers of bucket k's gradient (-z 2, 3) and parameters (-z 3) before reduction / after
// gathering: the embeddings fill the gather buffer; the layers take turns in its first two
// layer-sized slots (layer l in slot l % 2), so that the next layer can be gathered while one
// computes, and the final LayerNorm follows them
static floatX* grad_bucket_buffer(const Zero* z, const ParameterLayout* p, int k) {
    int kind = parameter_bucket_kind(p, k);
    return kind == 0 ? z->grad_bucket[0] : kind == 2 ? z->grad_bucket[3] : z->grad_bucket[1 + (z->overlap ? (k - 1) % 2 : 0)];
}
static floatX* gathered_bucket(const Zero* z, const ParameterLayout* p, int k) {
    int kind = parameter_bucket_kind(p, k);
    return z->gathered + (kind == 0 ? 0 : kind == 1 ? (size_t)((k - 1) % 2) * p->bucket_sizes[1] : 2 * p->bucket_sizes[1]);
}
// (the gather buffer's size, zero_gather_buffer_size, and ZeRO's buffers besides the model's
// own, zero_buffer_bytes: llmc/memory_plan.h, which the memory table counts with)

static Zero zero_alloc(GPT2* model, CommGroup* dp, int accum, int overlap) {
    const ParameterLayout* p = &model->layout;
    Zero z;
    memset(&z, 0, sizeof(z));
    z.stage = p->zero;
    z.overlap = overlap;
    z.dp = dp;
    z.accum = accum;
    z.reducing_bucket = -1;
    z.buckets = parameter_num_buckets(p);
    z.requests = (CommRequest*)calloc_check((size_t)parameter_num_buckets(p), sizeof(CommRequest));
    allocation_kind(ALLOC_COMM);  // (ZeRO's buffers below: the table's comm buffers)
    if (z.stage == 1) z.grad_shards = (floatX*)device_malloc(p->count / p->shards * sizeof(floatX));
    if (z.stage >= 2) {
        z.grad_shards = model->grads_memory;
        size_t sizes[4] = {p->bucket_sizes[0], p->bucket_sizes[1], overlap ? p->bucket_sizes[1] : 0, p->bucket_sizes[2]};
        for (int i = 0; i < 4; i++) z.grad_bucket[i] = sizes[i] ? (floatX*)device_malloc(sizes[i] * sizeof(floatX)) : NULL;
        if (accum > 1) z.received = (floatX*)device_malloc(parameter_largest_bucket(p) / p->shards * sizeof(floatX));
    }
    if (z.stage == 3) z.gathered = (floatX*)device_malloc(zero_gather_buffer_size(p) * sizeof(floatX));
    z.offload = model->offload;
    if (z.offload) {  // pinned host memory: the copies run at full speed, behind the host
        size_t S = layout_state_held(p);
        z.host_grads = (floatX*)host_malloc_pinned(S * sizeof(floatX));
        z.host_params = (floatX*)host_malloc_pinned(S * sizeof(floatX));
        z.copies = (DeviceCopy*)calloc_check((size_t)parameter_num_buckets(p), sizeof(DeviceCopy));
        z.copying = (int*)calloc_check((size_t)parameter_num_buckets(p), sizeof(int));
    }
    return z;
}

static void zero_free(Zero* z) {
    if (z->stage == 1) device_free(z->grad_shards);
    for (int i = 0; i < 4; i++) {
        if (z->grad_bucket[i]) device_free(z->grad_bucket[i]);
    }
    if (z->received) device_free(z->received);
    if (z->gathered) device_free(z->gathered);
    free(z->requests);
    if (z->offload) {
        host_free_pinned(z->host_grads);
        host_free_pinned(z->host_params);
        for (int k = 0; k < z->buckets; k++) device_copy_free(&z->copies[k]);
        free(z->copies);
        free(z->copying);
    }
}

// ---- the buckets and their shards
// Bucket k: 0 the embeddings (wte, wpe), 1 + l layer l, L + 1 the final LayerNorm (model.h).
// layout_bucket_shard(k) gives this rank's shard of it as (global, local, n): n elements (the
// bucket / N), starting at `global` in the whole model's buffer and at `local` in this rank's
// packed buffer of shards (the bucket's offset / N). The comm calls take n, each rank's share:
// an all-gather of n from every rank fills the whole bucket (N n); a reduce-scatter of the whole
// bucket leaves n on each.

// ---- -z 3: the parameters of a bucket, gathered when they are needed

// Posts the all-gather of bucket k's parameters into its place in the gather buffer: every
// rank's shard (bucket size / N floatX), concatenated in rank order, is the whole bucket. Waited
// for by params_gathered, at the first use; -overlap 0 waits at once.
static void params_gather_start(Zero* z, GPT2* model, int k) {
    if (z->stage < 3) return;
    size_t global, local, n;
    layout_bucket_shard(&model->layout, k, &global, &local, &n);
    comm_all_gather_start(z->dp, model->params_memory + local, gathered_bucket(z, &model->layout, k), n, COMM_FLOATX,
                          &z->gathering);
    if (!z->overlap) comm_wait(&z->gathering);
}
static void params_gathered(Zero* z) {
    if (z->stage == 3) comm_wait(&z->gathering);
}

// where the forward and backward passes read bucket k's parameters: in the model's own buffer
// (-z 0, 1, 2: whole on every rank), or in the gather buffer (-z 3)
static floatX* bucket_params(const Zero* z, const GPT2* model, int k) {
    if (z->stage == 3) return gathered_bucket(z, &model->layout, k);
    return model->params_memory + parameter_bucket_offset(&model->layout, k);
}
static LayerWeights layer_params(const Zero* z, const GPT2* model, int l) {
    return layer_weights_in_bucket(&model->layout, bucket_params(z, model, 1 + l));
}

// ---- the gradients of a bucket, reduced as soon as the backward pass has produced them

// -z 2, 3: the reduce-scatter in flight is complete (its bucket buffer free again); after the
// first micro-batch of a step it went into `received`, which is now added to the shards: the
// shards accumulate the step's gradient, as the whole buffer does under DDP (each micro-batch's
// average over the ranks, summed over micro-batches: the average of the ranks' sums)
// -offload: bucket k's gradient on this rank is final (reduced, this step's micro-batches summed):
// its shard (the whole bucket under DDP) goes to the host now, behind the work queued after it
static floatX* reduced_grads(const Zero* z, const GPT2* model) { return z->stage > 0 ? z->grad_shards : model->grads_memory; }
static void offload_grads_start(Zero* z, GPT2* model, int k) {
    if (!z->offload || z->copying[k]) return;
    size_t global, local, n;
    layout_bucket_shard(&model->layout, k, &global, &local, &n);
    copy_device_to_host_async(z->host_grads + local, reduced_grads(z, model) + local, n * sizeof(floatX), &z->copies[k]);
    z->copying[k] = 1;
}

static void zero_reduce_wait(Zero* z, GPT2* model) {
    if (z->reducing_bucket < 0) return;
    comm_wait(&z->reducing);
    if (z->reducing_adds) {
        size_t global, local, n;
        layout_bucket_shard(&model->layout, z->reducing_bucket, &global, &local, &n);
        residual_forward(z->grad_shards + local, z->grad_shards + local, z->received, 1, (int)n);  // shards += received
    }
    if (z->reducing_last) offload_grads_start(z, model, z->reducing_bucket);
    z->reducing_bucket = -1;
}

// Where the backward writes bucket k's gradient: its place in the whole gradient buffer (-z 0
// and 1), or the bucket's own buffer (-z 2, 3), zeroed once no reduction reads it any more
static floatX* bucket_grad(Zero* z, GPT2* model, int k) {
    const ParameterLayout* p = &model->layout;
    if (z->stage < 2) return model->grads_memory + parameter_bucket_offset(p, k);
    floatX* buf = grad_bucket_buffer(z, p, k);
    if (z->reducing_bucket >= 0 && grad_bucket_buffer(z, p, z->reducing_bucket) == buf) zero_reduce_wait(z, model);
    device_memset_zero(buf, parameter_bucket_size(p, k) * sizeof(floatX));
    return buf;
}

// Bucket k's gradient is complete for this micro-batch; its reduction is posted now:
//   -z 2, 3: reduce-scatter, (bucket size) floatX in, this rank's 1/N of it out, averaged over
//            the ranks, into the shards (first micro-batch) or `received` (later ones). One in
//            flight at a time: the previous bucket's is finished first, so with two layer
//            buffers the backward fills one while the other is reduced.
//   DDP, -z 1 with overlap, on the step's last micro-batch (the earlier ones only accumulate):
//            all-reduce of the bucket in place (DDP) or reduce-scatter into the shards (-z 1),
//            all of them in flight until the backward pass ends (zero_reduce_finish).
static void bucket_grad_done(Zero* z, GPT2* model, int k) {
    const ParameterLayout* p = &model->layout;
    size_t global, local, n;
    layout_bucket_shard(p, k, &global, &local, &n);
    if (z->stage >= 2) {
        zero_reduce_wait(z, model);
        floatX* out = z->micro == 0 ? z->grad_shards + local : z->received;
        comm_reduce_scatter_start(z->dp, grad_bucket_buffer(z, p, k), out, n, COMM_FLOATX, COMM_AVG, &z->reducing);
        z->reducing_bucket = k;
        z->reducing_adds = z->micro > 0;
        z->reducing_last = z->micro == z->accum - 1;
        if (!z->overlap) zero_reduce_wait(z, model);
    } else if (z->overlap && z->micro == z->accum - 1) {
        floatX* grad = model->grads_memory + parameter_bucket_offset(p, k);
        if (z->stage == 0) comm_all_reduce_start(z->dp, grad, parameter_bucket_size(p, k), COMM_FLOATX, COMM_AVG, &z->requests[k]);
        else comm_reduce_scatter_start(z->dp, grad, z->grad_shards + local, n, COMM_FLOATX, COMM_AVG, &z->requests[k]);
    }
}

// after the step's last backward pass: every gradient reduction complete. Without overlap, DDP
// and -z 1 reduce here, after the backward pass
static void zero_reduce_finish(Zero* z, GPT2* model) {
    const ParameterLayout* p = &model->layout;
    if (z->stage >= 2) zero_reduce_wait(z, model);
    else if (z->overlap) {
        for (int k = 0; k < parameter_num_buckets(p); k++) {
            comm_wait(&z->requests[k]);
            offload_grads_start(z, model, k);  // (-offload) while the later buckets still reduce
        }
    } else if (z->stage == 0) {
        // DDP: all-reduce every gradient, (Psi) floatX in one flat buffer, with AVG. After it
        // every rank holds the same gradient; the replicas stay identical because they also
        // started identical (the same seed or model file on every rank, where PyTorch's DDP
        // broadcasts rank 0's weights) and round alike (the same stochastic-rounding seed).
        comm_all_reduce(z->dp, model->grads_memory, model->num_parameters, COMM_FLOATX, COMM_AVG);
    } else {
        // ZeRO-1: reduce-scatter each bucket, (bucket) floatX in, its 1/N shard out, averaged:
        // each rank gets the sum only of what it updates
        for (int k = 0; k < parameter_num_buckets(p); k++) {
            size_t global, local, n;
            layout_bucket_shard(p, k, &global, &local, &n);
            comm_reduce_scatter(z->dp, model->grads_memory + parameter_bucket_offset(p, k), z->grad_shards + local, n,
                                COMM_FLOATX, COMM_AVG);
        }
    }
    // -offload: every bucket's final gradient to the host (those not on their way already)
    for (int k = 0; k < parameter_num_buckets(p); k++) offload_grads_start(z, model, k);
}

// -dump_grads: the step's averaged gradients as a model file (the file's order), from rank 0's
// whole buffer (DDP) or gathered from every rank's shards (ZeRO)
static void write_gradients(GPT2* model, Zero* z, CommGroup* world, const char* path) {
    const ParameterLayout* p = &model->layout;
    float* full = world->rank == 0 ? (float*)malloc_check(gpt2_num_parameters(model->config) * sizeof(float)) : NULL;
    if (z->stage > 0) zero_gather_full(model, world, z->grad_shards, COMM_FLOATX, full);
    else if (world->rank == 0) {
        float* whole = (float*)malloc_check(p->count * sizeof(float));
        copy_device_to_floats(whole, model->grads_memory, p->count);
        parameter_shard_copy(full, whole, p, model->config, 0);
        free(whole);
    }
    if (full) gpt2_write_model_file(path, model->config, full);
    free(full);
}

// -dump_logits: the logits of rank 0's first micro-batch of step 0, right after the forward
// (the loss then overwrites them with their gradient), as raw fp32 (B, T, V): the V real
// columns of each row, the padded ones dropped. dev/hf_export.py's tests compare them with
// PyTorch's and Hugging Face's.
static void write_logits(GPT2* model, int B, int T, const char* path) {
    int V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    float* row = (float*)malloc_check((size_t)Vp * sizeof(float));
    char tmp[4200];
    FILE* f = fopen_temp(path, tmp, sizeof(tmp));
    for (size_t i = 0; i < (size_t)B * T; i++) {
        copy_device_to_floats(row, model->acts.logits + i * Vp, Vp);
        fwrite_check(row, sizeof(float), V, f, tmp);
    }
    file_commit(f, tmp, path);
    free(row);
}

// ----------------------------------------------------------------------------------------------
// forward and backward of the whole model on one micro-batch. B and T may be smaller than the
// allocated shape (sampling uses B = 1): per-layer slices are laid out with the actual B, T.
// Parameters come from bucket_params; under -z 3 each bucket is gathered first (above).
// What differs from the other trainers' passes (llmc/chunk.h's, which PP, 3D and DiLoCo run;
// TP's, CP's): not the layer, the plain one of block.h's two halves, but where its tensors
// live: every parameter is read from its bucket (-z 3: gathered first, the next one prefetched)
// and every bucket's gradient is reduced as soon as the backward has completed it
// (bucket_grad_done), under the layers still to come.

// One layer's forward from its ln1 (the LayerNorm before it wrote it) to fcproj, which the caller
// adds to the residual stream. rerun (-r 2): the same again before the layer's backward, as far
// as the backward reads (block.h), from the parameters the backward has (-z 3: gathered again).
static void layer_forward(GPT2* model, Zero* z, LayerActs x, LayerWeights w, const floatX* residual, int B, int T,
                          int rerun) {
    LayerDims d = model->dims;
    // attention half (block.h), its residual add fused with ln2: residual2 = residual + attproj
    attention_half_forward(x, w, B, T, d);
    fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, x.attproj, w.ln2w, w.ln2b,
                                     B * T, d.C);
    comm_progress(z->dp);  // (CPU: MPI moves the collectives in flight only when called)
    if (rerun) mlp_half_forward_to_gelu(x, w, B, T, d);
    else mlp_half_forward(x, w, B, T, d);
}

// -r 1 and 2: what layer l's forward did not keep, computed again right before its backward
// (model.h); residual is the layer's input
static void layer_recompute(GPT2* model, Zero* z, LayerActs x, LayerWeights w, const floatX* residual, int B, int T) {
    unsigned kept = model->acts.kept;
    if (kept == KEEP_ALL) return;
    device_span_begin(&recompute_spans);
    if (layer_rerun_needed(kept)) {
        layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, B * T, model->dims.C);
        layer_forward(model, z, x, w, residual, B, T, 1);
    } else {
        layer_recompute_selective(x, kept, B, T, model->dims);
    }
    device_span_end(&recompute_spans);
}

static void gpt2_forward(GPT2* model, Zero* z, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    const ParameterLayout* lay = &model->layout;
    int L = c.num_layers, C = c.channels;
    Activations* a = &model->acts;
    tokens_to_device(model->inputs, &model->input_stage, inputs_host, (size_t)B * T);

    // -z 3: the embeddings' bucket (wte, wpe), then layer 0's, which the first LayerNorm needs.
    // The gather buffer's places are reused (gathered_bucket): a gather may overwrite parameters
    // a kernel has just read, safe because a collective is queued behind the kernels issued
    // before it (CUDA: the comm stream waits for them; CPU: kernels finish before the call)
    params_gather_start(z, model, 0);
    params_gathered(z);
    floatX* wte = bucket_params(z, model, 0);
    encoder_forward(a->encoded, model->inputs, wte, wte + lay->sizes[0], B, T, C);
    params_gather_start(z, model, 1);
    params_gathered(z);
    LayerWeights w0 = layer_params(z, model, 0);
    LayerActs first = layer_acts(a, d, B, T, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, w0.ln1w, w0.ln1b, B * T, C);
    for (int l = 0; l < L; l++) {
        // -z 3 prefetch: the next bucket (layer l + 1, or the final LayerNorm after the last
        // layer) is gathered while this layer computes; its LayerNorm ends this layer
        params_gather_start(z, model, l + 2);
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        layer_forward(model, z, x, layer_params(z, model, l), residual, B, T, 0);
        params_gathered(z);
        // the residual add of the MLP half fused with the next LayerNorm (the next layer's ln1,
        // or lnf after the last layer): residual3 = residual2 + fcproj
        if (l + 1 < L) {
            LayerWeights wn = layer_params(z, model, l + 1);
            LayerActs xn = layer_acts(a, d, B, T, l + 1);
            fused_residual_layernorm_forward(x.residual3, xn.ln1, xn.ln1_mean, xn.ln1_rstd, x.residual2,
                                             x.fcproj, wn.ln1w, wn.ln1b, B * T, C);
        } else {
            floatX* lnf = bucket_params(z, model, L + 1);
            fused_residual_layernorm_forward(x.residual3, a->lnf, a->lnf_mean, a->lnf_rstd,
                                             x.residual2, x.fcproj, lnf, lnf + lay->sizes[PARAM_LNFW], B * T, C);
        }
    }
    // LM head tied to the token embedding: logits (B, T, Vp) = lnf @ wte^T. -z 3: the
    // embeddings' bucket again (the layers have used its buffer since), kept for the LM head's
    // backward, which comes next
    params_gather_start(z, model, 0);
    params_gathered(z);
    matmul_forward(a->logits, a->lnf, bucket_params(z, model, 0), NULL, B * T, C, d.Vp_rank);
}

// Accumulates the parameter gradients of one micro-batch, bucket by bucket (above); expects
// gpt2_loss to have left dlogits. inputs_host: the micro-batch's tokens, for the embeddings.
static void gpt2_backward(GPT2* model, Zero* z, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    const ParameterLayout* lay = &model->layout;
    int L = c.num_layers, C = c.channels;
    Activations* a = &model->acts;
    // the embeddings' bucket (wte, then wpe) and the final LayerNorm's (lnfw, lnfb). The tied wte
    // takes the LM head's gradient first and the lookups' last, so the embeddings' bucket is
    // complete only at the end of the backward pass
    floatX* embeddings = bucket_grad(z, model, 0);
    floatX* lnf = bucket_grad(z, model, L + 1);
    floatX *dwte = embeddings, *dwpe = embeddings + lay->sizes[0], *dlnfw = lnf, *dlnfb = lnf + lay->sizes[PARAM_LNFW];

    // LM head (-z 3: wte still gathered from the forward pass) and final LayerNorm (-z 3:
    // gathered again, with layer L-1 prefetched behind it): dresidual = gradient w.r.t. the last
    // layer's output
    matmul_backward(a->dbuf, dwte, NULL, a->logits, a->lnf, bucket_params(z, model, 0), B * T, C, d.Vp_rank);
    params_gather_start(z, model, L + 1);
    params_gathered(z);
    params_gather_start(z, model, L);
    floatX* lnfw = bucket_params(z, model, L + 1);
    device_memset_zero(a->dresidual, (size_t)B * T * C * sizeof(floatX));
    layernorm_backward(a->dresidual, dlnfw, dlnfb, a->dbuf, layer_acts(a, d, B, T, L - 1).residual3,
                       lnfw, a->lnf_mean, a->lnf_rstd, B * T, C);
    bucket_grad_done(z, model, L + 1);
    for (int l = L - 1; l >= 0; l--) {
        params_gathered(z);
        LayerWeights w = layer_params(z, model, l), gw = layer_weights_in_bucket(lay, bucket_grad(z, model, 1 + l));
        if (l > 0) params_gather_start(z, model, l);  // -z 3 prefetch: layer l - 1's bucket
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        layer_recompute(model, z, x, w, residual, B, T);
        // a residual add passes dresidual to both of its inputs unchanged: to the MLP half's
        // output, and on down the stream, where each LayerNorm's input gradient is added to it
        mlp_half_backward(a->dbuf, a->dfch, a->dresidual, x, w, gw, B, T, d);
        layernorm_backward(a->dresidual, gw.ln2w, gw.ln2b, a->dbuf, x.residual2, w.ln2w, x.ln2_mean,
                           x.ln2_rstd, B * T, C);
        comm_progress(z->dp);  // (CPU: MPI moves the collectives in flight only when called)
        attention_half_backward(a->dbuf, a->dbuf, a->dqkv, a->dresidual, x, w, gw, B, T, d);
        layernorm_backward(a->dresidual, gw.ln1w, gw.ln1b, a->dbuf, residual, w.ln1w, x.ln1_mean,
                           x.ln1_rstd, B * T, C);
        bucket_grad_done(z, model, 1 + l);  // layer l's gradient is complete: reduced from now on
    }
    // the embeddings read the tokens on the host, where the positions are sorted by token
    encoder_backward(dwte, dwpe, a->dresidual, inputs_host, B, T, C);
    bucket_grad_done(z, model, 0);
}

// ----------------------------------------------------------------------------------------------
// The update, after the reduction

// The global gradient norm, for clipping (as torch.nn.utils.clip_grad_norm_): DDP has every
// gradient on every rank; a ZeRO rank has its shards, so the ranks' sums of squares are summed
// (all-reduce of one float) before the square root: the norm of the whole gradient, not of one
// shard
static float zero_grad_norm(Zero* z, GPT2* model) {
    if (z->stage == 0) return sqrtf(global_norm_squared(model->grads_memory, model->num_parameters));
    float squares = global_norm_squared(z->grad_shards, layout_state_held(&model->layout));
    comm_all_reduce_scalar(z->dp, &squares, COMM_SUM);
    return sqrtf(squares);
}

// -offload in fp32: AdamW on the host updates a host copy of this rank's share of the weights
// (in bf16 the master weights are that copy): taken from the device once, before the first step
static void offload_take_weights(Zero* z, GPT2* model) {
    for (int k = 0; k < parameter_num_buckets(&model->layout); k++) {
        size_t global, local, n;
        layout_bucket_shard(&model->layout, k, &global, &local, &n);
        copy_device_to_host(z->host_params + local, model->params_memory + (z->stage == 3 ? local : global),
                            n * sizeof(floatX));
    }
}

// AdamW (llmc/train.h) on this rank's shard of every bucket (DDP: the whole buffer at once), with
// the same rounding seed on every rank: stochastic rounding must round the replicas alike (its
// index is each element's place in the model file, so a shard rounds as the whole replica
// would). -z 1, 2: each updated bucket is all-gathered to every rank. Returns the learning rate.
static float zero_adamw_step(Zero* z, GPT2* model, const TrainArgs* args, int step, int max_steps, float grad_norm,
                             float* clip_scale) {
    if (z->stage == 0 && !z->offload) return train_adamw_step(model, args, step, max_steps, grad_norm, clip_scale);
    const ParameterLayout* layout = &model->layout;
    AdamWConfig opt = train_adamw_config(args, step, max_steps, grad_norm, clip_scale);
    int gathers = z->stage == 1 || z->stage == 2;
    for (int k = 0; k < parameter_num_buckets(layout); k++) {
        // this rank's shard of bucket k (under DDP the whole bucket): n elements from `global` in
        // the whole model, at `local` in its shards of master weights, moments and gradients (and
        // under -z 3 of the parameters, which the next forward gathers)
        size_t global, local, n;
        layout_bucket_shard(layout, k, &global, &local, &n);
        floatX* params = model->params_memory + (z->stage == 3 ? local : global);
        float* master = model->master_memory ? model->master_memory + local : NULL;
        if (z->offload) {
            // ZeRO-Offload: wait for the bucket's gradient on the host, update there (the master
            // weights and moments are host memory), send the new parameters back
            device_copy_wait(&z->copies[k]);
            z->copying[k] = 0;
            optimizer_adamw_step_with(adamw_update_host, z->host_params + local, master, z->host_grads + local,
                                      model->m_memory + local, model->v_memory + local, global, global + n, layout, opt,
                                      *clip_scale, step + 1);
            copy_host_to_device_async(params, z->host_params + local, n * sizeof(floatX));
        } else {
            optimizer_adamw_step(params, master, z->grad_shards + local, model->m_memory + local, model->v_memory + local,
                                 global, global + n, layout, opt, *clip_scale, step + 1);
        }
        // -z 1, 2: then the updated parameters to every rank: all-gather bucket k in place (the
        // NULL send buffer), each rank's shard (n floatX) already at its place in the whole (N n),
        // while the next bucket is updated (with overlap)
        if (gathers) {
            comm_all_gather_start(z->dp, NULL, model->params_memory + parameter_bucket_offset(layout, k), n, COMM_FLOATX,
                                  &z->requests[k]);
            if (!z->overlap) comm_wait(&z->requests[k]);
        }
        comm_progress(z->dp);  // (CPU: the gathers in flight move on)
    }
    for (int k = 0; k < parameter_num_buckets(layout) && gathers; k++) comm_wait(&z->requests[k]);
    return opt.lr;
}

// ----------------------------------------------------------------------------------------------

// Validation and samples run this trainer's forward pass; the run layer (llmc/run.h) calls these
// two with the model and its ZeRO state
typedef struct {
    GPT2* model;
    Zero* z;
} DataParallel;

// one validation batch: one chunk per rank; the run layer averages the ranks' losses, since
// every rank saw different validation tokens
static float val_loss(void* trainer, DataLoader* val) {
    DataParallel* t = (DataParallel*)trainer;
    GPT2* model = t->model;
    dataloader_load_chunk(val, t->z->dp->rank, model->config.vocab_size);
    gpt2_forward(model, t->z, val->inputs, model->B, model->T);
    return gpt2_loss(model, val->targets, model->B, model->T, 0.0f);
}

// HellaSwag's batch (-h 1, llmc/hellaswag.h): its (B, T) per-token losses on the host. Every rank
// runs as many as the others (run.h), since under -z 3 the forward pass gathers from all of them
static const float* token_losses(void* trainer, const int* inputs, const int* targets) {
    DataParallel* t = (DataParallel*)trainer;
    gpt2_forward(t->model, t->z, inputs, t->model->B, t->model->T);
    gpt2_loss(t->model, targets, t->model->B, t->model->T, 0.0f);
    return t->model->losses_host;
}

// a sample's forward pass, the logits (1, T, Vp). Every rank runs it, because under -z 3 the
// forward pass gathers each bucket from all of them
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    DataParallel* t = (DataParallel*)trainer;
    gpt2_forward(t->model, t->z, tokens, 1, T);
    return t->model->acts.logits;
}

// What rank 0 prints at the start: the run, the buckets, and the memory of one rank beside the
// ZeRO paper's formulas. Model states take 16 bytes per parameter either way: fp32 parameters 4
// + gradients 4 + AdamW m 4 + v 4, or bf16 parameters 2 + gradients 2 + fp32 master weights 4 +
// m 4 + v 4. DDP keeps all 16 on every rank; each ZeRO stage divides more of them by N.
static void print_layout(const Run* run, const GPT2* model, int zero, int overlap, int accum) {
    const TrainArgs* args = &run->args;
    GPT2Config c = model->config;
    const ParameterLayout* p = &model->layout;
    int N = run->world.size;
    BannerRow rows[16];
    const char* title[4] = {"train_gpt2_dp (DDP)", "train_gpt2_dp (ZeRO-1)", "train_gpt2_dp (ZeRO-2)",
                            "train_gpt2_dp (ZeRO-3)"};
    int n = train_banner_model(rows, title[zero], args->model, c);
    banner_row(&rows[n++], "ranks (data parallel)", "%d", N);
    banner_row(&rows[n++], "micro-batch B x T", "%d x %d", args->B, args->T);
    banner_row(&rows[n++], "accumulation steps", "%d", accum);
    banner_row(&rows[n++], "communication", "%s", overlap ? "overlapped with compute (-overlap 1)" : "after each post (-overlap 0)");
    banner_row(&rows[n++], "recomputation", "%s", recompute_names[args->recompute]);
    banner_row(&rows[n++], "optimizer", "%s", model->offload ? "AdamW on the CPU, its state in host memory (-offload 1)"
                                                             : "AdamW on the device (-offload 0)");
    n = run_banner_rows(run, rows, n);
    train_print_banner(rows, n);
    size_t sizes[NUM_PARAMETER_TENSORS], P = gpt2_num_parameters(c);
    gpt2_parameter_sizes(sizes, c);
    printf("buckets (one collective each; padded to %s):\n",
           zero > 0 ? "a multiple of N x 128 elements, one equal shard per rank" : "nothing: DDP reduces them whole");
    printf("  embeddings (wte, wpe)  %12zu  padded %12zu\n", sizes[PARAM_WTE] + sizes[PARAM_WPE], p->bucket_sizes[0]);
    printf("  each of %d layers      %12zu  padded %12zu\n", c.num_layers, (P - sizes[PARAM_WTE] - sizes[PARAM_WPE] - sizes[PARAM_LNFW] - sizes[PARAM_LNFB]) / c.num_layers,
           p->bucket_sizes[1]);
    printf("  final LayerNorm        %12zu  padded %12zu\n", sizes[PARAM_LNFW] + sizes[PARAM_LNFB], p->bucket_sizes[2]);
    printf("  all                    %12zu  padded %12zu = Psi\n", P, p->count);
    // what a step hands to the collectives (the README's ZeRO table; the step report prints the
    // measured bytes after the first step): whole gradients once a step under DDP and ZeRO-1,
    // every micro-batch's under ZeRO-2, and ZeRO-3 gathers the parameters for each micro-batch's
    // forward and again for its backward
    double psi = (double)sizeof(floatX) * p->count;
    printf("communication per step (payload per rank), X Psi = %.0f bytes (X = %zu), accum = %d:\n", psi, sizeof(floatX), accum);
    if (zero == 0) {
        printf("  all_reduce     %14.0f bytes  X Psi + 4 (the loss)\n", psi + 4);
    } else {
        int reductions = zero == 1 ? 1 : accum, gathers = zero == 3 ? 2 * accum : 1;
        printf("  reduce_scatter %14.0f bytes  %s X Psi\n", reductions * psi, zero == 1 ? "" : "accum");
        printf("  all_gather     %14.0f bytes  %s X Psi\n", gathers * psi, zero == 3 ? "2 accum" : "");
        printf("  all_reduce     %14.0f bytes  4 (the loss) + 4 (the gradient norm's sum)\n", 8.0);
    }
    int mixed = model->master_memory != NULL;
    printf("memory per rank, Psi = %zu parameters (padded), dp = %d ranks, bytes per parameter %s:\n", p->count, N,
           mixed ? "2 + 2 + 12 (bf16 parameters and gradients; fp32 master, m, v)" : "4 + 4 + 8 (fp32 parameters and gradients; m, v)");
    memory_plan_print(&run->plan, c, &run->layout);
}

// -check_replicas compares replicas, which ZeRO-3 has none of
static void check_own_flags(int zero, int check_replicas) {
    if (zero == 3 && check_replicas > 0) {
        fail("-check_replicas %d with -z 3: under ZeRO-3 every rank holds a different shard of the "
             "parameters, so there are no replicas to compare; use -z 0, 1 or 2", check_replicas);
    }
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    const char* dump_grads = NULL, *dump_logits = NULL;
    int check_replicas = 0, zero = 0, overlap = 1, offload = 0;
    const ArgSpec own[] = {
        {"-z", ARG_INT, &zero, 0, 3, "ZeRO stage: 0 DDP (everything replicated), 1 the optimizer state sharded over the ranks, 2 the gradients too, 3 the parameters too (FSDP)"},
        {"-overlap", ARG_INT, &overlap, 0, 1, "1: gradient reductions and parameter gathers run while the rank computes; 0: each waited for at once"},
        {"-offload", ARG_INT, &offload, 0, 1, "1: master weights and AdamW moments in host memory and AdamW on the CPU (ZeRO-Offload), any -z; same results"},
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the averaged gradients of the first step here (tests)"},
        {"-dump_logits", ARG_OUTPUT_FILE, &dump_logits, 0, 0, "write rank 0's logits of the first micro-batch here, raw fp32 (B, T, V) (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that all replicas hold the same parameters (their stored bits; not the master weights or moments) (0: never)"},
        HELLASWAG_FLAGS(&run.hellaswag),
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    check_own_flags(zero, check_replicas);
    CommGroup* world = &run.world;  // every rank a data-parallel replica
    int rank = world->rank, ranks = world->size;
    GPT2Config config = run.config;

    // ---- the batch layout: B x T per micro-batch, `accum` micro-batches per rank per step,
    // every rank on its own data
    int B = run.args.B, T = run.args.T, accum = train_accumulation_steps(&run.args, ranks, "ranks");

    // ---- memory, checked before allocating (llmc/memory_plan.h): ZeRO shards the model states
    // as the layout says, -r keeps fewer activations, -offload moves the optimizer to the host
    RunLayout layout = run_layout(&run, TRAINER_DP, accum);
    layout.dp = ranks;
    layout.zero = zero;
    layout.offload = offload;
    layout.overlap = overlap;
    layout.dump_grads = dump_grads != NULL;
    run_check_memory(&run, layout, 0, "%zu parameters, -z %d over %d ranks, -b %d -t %d", gpt2_num_parameters(config),
                     zero, ranks, B, T);

    // ---- the weights, the data (a global batch is accum x ranks chunks of B x T tokens; which
    // rank reads which: see the loop), the run's identity with DDP's layout (a resume must match
    // it), the output dir; validation: each rank evaluates its own chunk, ranks chunks a batch
    float* weights = run_load(&run, accum * ranks, /*val_chunks*/ ranks, "dp=%d zero=%d tp=1 pp=1, %d micro-batches of %d x %d",
                              ranks, zero, accum, B, T);
    LayerDims dims = layer_dims(config, /*tp*/ 1, /*sp*/ 0);  // every rank holds whole layers
    // the whole model in buckets, padded for ZeRO into one equal shard per rank (model.h)
    ParameterLayout rank_layout = parameter_layout_buckets(config, zero, ranks, rank);
    GPT2 model;
    gpt2_build(&model, config, dims, rank_layout, weights, B, T, ACTS_ALL, activations_kept(run.args.recompute, 0, dims),
               offload);
    free(weights);
    Zero z = zero_alloc(&model, world, accum, overlap);
    if (rank == 0) print_layout(&run, &model, zero, overlap, accum);

    // ---- resume with -y 1; validation (each rank its own chunk, averaged), samples (every rank
    // draws, -z 3 gathers from all), checkpoints (ZeRO shards gathered over the ranks)
    DataParallel trainer = {&model, &z};
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.val_replicas = world;  // each rank its own validation chunk: the mean over the ranks
    hooks.split = world;         // checkpoints gathered from the ZeRO shards
    hooks.token_losses = token_losses;  // -h 1: HellaSwag's examples split over the ranks as validation's chunks
    run_begin(&run, hooks, &world, 1);
    if (offload && FLOATX_IS_FLOAT) offload_take_weights(&z, &model);  // (as started, or resumed)

    // ---- training loop; `step` counts completed optimizer steps
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample, a checkpoint: when due
        run_step_begin(&run);
        // 1. forward + backward over this rank's micro-batches; gradients accumulate (-z 2, 3: in
        // this rank's shards, a bucket reduce-scattered as soon as it is complete). The backward
        // posts each bucket's reduction itself (bucket_grad_done): DDP and -z 1 with overlap on
        // the last micro-batch (z.micro == accum - 1), -z 2, 3 on every one
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, layout_grads_held(&rank_layout) * sizeof(floatX));
        float loss = 0.0f;
        // Loss scaling, in two halves: each token's gradient is weighted 1/(B*T*accum) here (the
        // mean over this rank's tokens), and the reduction below averages over the ranks
        // (COMM_AVG). Together: 1/total_batch, the gradient of the mean loss over the global batch,
        // whatever the layout. A plain sum over ranks would multiply the gradient, and with it
        // the effective learning rate, by the number of ranks.
        float dloss = 1.0f / (float)((size_t)B * T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            // the DDP slice: micro-step `micro` of rank r is chunk micro * ranks + r, so the ranks
            // and micro-steps together read the global batch once (llmc/dataloader.h)
            dataloader_load_chunk(&run.train, micro * ranks + rank, config.vocab_size);
            gpt2_forward(&model, &z, run.train.inputs, B, T);
            if (dump_logits != NULL && step == 0 && micro == 0 && rank == 0) write_logits(&model, B, T, dump_logits);
            loss += gpt2_loss(&model, run.train.targets, B, T, dloss) / (float)accum;
            z.micro = micro;
            gpt2_backward(&model, &z, run.train.inputs, B, T);
        }
        dataloader_advance(&run.train);
        // 2. the gradient reduction finishes (or, for DDP and -z 1 without overlap, happens:
        // zero_reduce_finish), and the loss (one float) is averaged over the ranks
        watchdog_phase("gradient reduction", step);
        zero_reduce_finish(&z, &model);
        comm_all_reduce_scalar(world, &loss, COMM_AVG);
        // 3. the global gradient norm: under ZeRO the shards' sums of squares all-reduced (a float)
        watchdog_phase("AdamW update", step);
        float grad_norm = zero_grad_norm(&z, &model);
        // A nan or inf anywhere on any rank reaches every rank through the all-reduced sums, so
        // all ranks stop here together, before this step updates, logs or checkpoints anything
        train_stop_if_not_finite(step, loss, grad_norm);
        // 4. AdamW on this rank's shards, then (-z 1, 2) each bucket all-gathered, (N n) floatX
        float clip_scale, lr = zero_adamw_step(&z, &model, &run.args, step, run.max_steps, grad_norm, &clip_scale);
        // the step line and main.log (llmc/run.h). The bytes each rank hands to the collectives
        // and sends if each is a ring (comm.h): DDP's all-reduce 2 (N-1)/N Psi X, as much as
        // ZeRO-1's and ZeRO-2's reduce-scatter plus all-gather, ZeRO-3's 3 (N-1)/N Psi X with its
        // second all-gather; exposed: the part of the collectives' time the rank waited (not
        // hidden behind compute; all of it with -overlap 0)
        run_step_end(&run, step, loss, lr, grad_norm, clip_scale);
        // after the step's count; AdamW left the gradients as they were
        if (dump_grads != NULL && step == 0) write_gradients(&model, &z, world, dump_grads);
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) train_check_replicas(&model, world, step + 1, NULL, "replicas");
    }
    run_end(&run);
    zero_free(&z);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
