// The pipeline walk: one stage's actions of one step in the order its schedule gives
// (llmc/pipeline.h), with the exchanges between neighbouring stages. The PP chapter
// (train_gpt2_pp.cu) and the 3D trainer's steps call pipeline_walk; validation and samples walk
// the pipe forward-only (stage_forward_pass). The computing of each action is llmc/chunk.h's.
#ifndef LLMC_PIPELINE_WALK_H
#define LLMC_PIPELINE_WALK_H

#include "chunk.h"
#include "pipeline.h"
#include "stage.h"

// The walk: one training step of this stage, its actions in the order the schedule gives
// (pipeline.h; F a chunk's forward, B its backward, W zero bubble's weight gradients), each on
// one micro-batch (a forward-only walk, for validation and samples: F only). The computing is
// llmc/chunk.h's; what is pipeline parallelism is here: which buffer goes to which neighbour, and
// when.
//
// Stage s talks only to its neighbours: a forward's input comes from the virtual stage before
// (stage s - 1; with -vp, chunk c > 0 of stage 0 from the last stage's chunk c - 1) and its output
// goes to the next; a backward's go the other way. Every message is (B, T, C) floatX (with the 3D
// trainer's -sp, the rank's (B T/tp, C): walk_message). In a V (zbv, dualpipev) the bottom stage
// p - 1 is its own neighbour once: its chunk 1 takes chunk 0's output by a copy, and its chunk 0's
// backward starts from the gradient chunk 1's left in their shared buffer (pipeline_grad_indices).
//
// The actions run in groups (pipeline_exchange_index: one action each, or an interleaved or
// DualPipeV pair of a forward and a backward that "join"). Before each group, ONE exchange posts
// at once the sends of outputs and the receives of this group's inputs (comm_exchange: MPI_Isend
// and MPI_Irecv then a wait for all; NCCL's send and recv in one group). Posting them together is
// what lets two neighbours that each send to the other both go on: in 1F1B's steady state stage s
// sends a forward's output down the pipe while stage s + 1 sends a backward's gradient up; two
// blocking sends would wait for each other forever. An output goes in the exchange right after its
// group, or in a V sends_later exchanges after that one (the receiver posts its receive much
// later; pipeline.h says why). pipeline_check_exchanges proved at start that every exchange of
// this schedule pairs up and completes.
//
// The F&B overlap (-pp_overlap 1; DualPipe's reason to be, DeepSeek-V3 section 3.2.1). In a group
// that joins a forward and a backward of another micro-batch (dualpipev's F&B pairs, interleaved's
// steady state) the forward's output is ready while the backward still has to run. So it leaves
// at once: right after the forward, the next exchange's sends of actions up to the forward (its
// output, unless the V's bottom keeps it, and any put off to that exchange: walk_sends_ahead) are
// posted non-blocking and move while the backward computes (MPI requests, moved by comm_progress
// between the backward's layers; NCCL calls on their own stream); the exchange posts the rest and
// waits for both. What is left waiting is the step line's exposed time; the same run with
// -pp_overlap 0 gives the cost.
//
// The MoE overlap (-pp_overlap 1 with experts; DualPipe's main overlap, the same section). An
// F&B pair's two micro-batches each run all-to-alls over the ep group in every MoE layer: the
// forward's tokens to their experts and the outputs home, the backward's gradients the same two
// ways. Run one after the other, each of those waits in the open. So the pair's passes step in
// turn (chunk.h's ChunkPass): a step runs a pass up to the next all-to-all of rows it posts
// (moe.h's layer parts: dispatch | experts | combine), and the pass waits for it at the start of
// its next step, after a step of the other pass has computed under it. With one MoE layer a
// chunk the order is F1 B1 F2 B2 F3 B3 (F1: attention, routing, post the tokens; B1: post the
// output gradients; F2: wait, experts, post the outputs home; ...), and each of the pair's four
// all-to-alls of rows per layer moves under the other's compute: 4 x MoE layers per chunk per
// pair, the count the step's "moe all-to-all" line prints. (Interleaved's last stage joins a
// forward with its own micro-batch's backward, which needs the forward's loss: those two run one
// after the other.) The counts' small all-to-all, which
// the host needs before it can post the rows (moe_forward_dispatch), still blocks. Neither
// micro-batch's arithmetic changes (the same kernels in the same order on its own buffers; the
// backward's rows in the MoE's second lane), so the run is bit for bit the run without it. Every
// rank of a stage steps the same pair the same way, so the ep group's collectives are posted in
// the same order on all of them, as MPI and NCCL require. On CUDA the rows go as grouped NCCL
// sends and receives on a side channel of the ep group (its own communicator and stream: moe.h's
// moe_add_lane), after the compute stream's kernels that wrote them, and the compute stream waits
// for their event at the pass's next step (comm_all_to_all_start, comm_wait); the host-staged
// path (ranks sharing a GPU without NCCL) still blocks.
//
// Which channel each message takes (comm.h). With MPI requests, which move on their own, a send
// posted sooner only makes its message available sooner: the exchanges still pair up and finish
// as pipeline_check_exchanges proved. NCCL runs a rank's calls on one communicator in turn: a send
// posted ahead there would hold back the exchange queued behind it until its receiver posts, and
// two neighbours that send ahead to each other would each wait for the other's exchange. So:
//   - the rule: a message sent ahead travels on side channel 1 + colour(its sender), and its
//     receiver receives it there; every other message on channel 0. Both ends evaluate
//     walk_sends_ahead on the sender's list, so they agree on every message's channel; a pair's
//     messages on one channel are a subsequence of its messages in posting order (the overlap
//     keeps that order: the sends ahead are the first of their exchange's, in action order), so
//     they pair up on each channel as they did on one.
//   - colour: the stage's parity, so that neighbours differ (in interleaved's ring of odd p,
//     stage p - 1 sends on to stage 0, and takes a third). A rank's own colour's channel then
//     carries only its sends ahead; the other side channels only its receives.
// Why nothing waits forever: on its own channel a rank holds one batch of sends ahead at a time
// (posted after a group's forward, waited for at the next exchange, before the next batch is
// posted); on the other side channels only the receives of the exchange in progress; on channel
// 0 that exchange's other messages. An exchange posts every channel's part before it waits for
// any (comm.h), so it has all its messages out at once, with nothing of another exchange queued
// ahead of them on any communicator: exactly the exchanges of MPI requests, which
// pipeline_check_exchanges proved complete. And the side channels connect their peers when they
// open (walk_channels), so no send ahead waits on the host for its peer's first call.

// the colour of a stage's sends ahead (above): neighbours never share one
static inline int walk_ahead_colour(PipeSpec spec, int stage) {
    int ring = spec.sched == SCHEDULE_INTERLEAVED && spec.V > 1;  // (the last stage sends on to stage 0)
    return ring && spec.p > 1 && spec.p % 2 == 1 && stage == spec.p - 1 ? 2 : stage % 2;
}

// ahead[j] = 1 when the output of a stage's action j is sent ahead (the F&B overlap): j is at or
// before the forward that opens a group of more than one action, and its send is due at the
// exchange right after that group. The sender and its receiver both read it (walk_channels).
static inline void walk_sends_ahead(PipeSpec spec, int stage, const PipeAction* actions, int n, unsigned char* ahead) {
    int* group = (int*)malloc_check((size_t)(n > 0 ? n : 1) * sizeof(int));
    pipeline_exchange_index(actions, n, group);
    for (int j = 0; j < n; j++) ahead[j] = 0;
    for (int k = 0; k + 1 < n; k++) {
        int opens = (k == 0 || group[k - 1] != group[k]) && group[k + 1] == group[k] && actions[k].op == PIPE_FORWARD;
        for (int j = 0; j <= k && opens; j++) {
            int due = group[j] + 1 + actions[j].sends_later;  // (the exchange that sends it)
            if (pipeline_output_to(spec, stage, actions[j]) >= 0 && due == group[k] + 1) ahead[j] = 1;
        }
    }
    free(group);
}

// a rank into a channel's list of peers, once
static inline void walk_add_peer(int* peers, int* count, int peer) {
    for (int i = 0; i < *count; i++) if (peers[i] == peer) return;
    peers[(*count)++] = peer;
}

// With -pp_overlap, each action's channels (0 without): the one its output leaves on and the one
// its input arrives on, from every stage's list (a receiver needs its sender's walk_sends_ahead).
// The first time, the side channels open on every rank of the pipe (a collective of the pp
// group: every rank's walk starts here), each connecting this stage's peers on it: those it sends
// ahead to on its own colour's, those that send ahead to it on theirs.
static inline void walk_channels(Walk* w, const PipeAction* actions, int n, int* send_channel, int* recv_channel) {
    PipeSpec spec = w->st->spec;
    int p = spec.p, me = w->st->stage, keys = 3 * spec.m * spec.V;
    PipeAction* lists = (PipeAction*)malloc_check((size_t)p * n * sizeof(PipeAction));
    unsigned char* ahead = (unsigned char*)malloc_check((size_t)p * n);
    int* index_of = (int*)malloc_check((size_t)p * keys * sizeof(int));  // stage q's (op, micro, chunk) -> its index
    int channels = 0;  // side channels in use: 1 + the highest colour that sends ahead
    for (int q = 0; q < p; q++) {
        const PipeAction* list = q == me ? actions : lists + (size_t)q * n;
        if (q != me && pipeline_stage_actions(spec, q, lists + (size_t)q * n) != n) fail("stage %d: a walk of %d actions, "
                                                                                       "not its schedule's", me, n);
        walk_sends_ahead(spec, q, list, n, ahead + (size_t)q * n);
        for (int j = 0; j < n; j++) {
            index_of[(size_t)q * keys + (list[j].op * spec.m + list[j].micro) * spec.V + list[j].chunk] = j;
            if (ahead[(size_t)q * n + j] && 1 + walk_ahead_colour(spec, q) > channels) channels = 1 + walk_ahead_colour(spec, q);
        }
    }
    int* peers = (int*)malloc_check((size_t)COMM_CHANNELS * p * sizeof(int));  // channel c's from c p on
    int num_peers[COMM_CHANNELS] = {0};
    for (int j = 0; j < n; j++) {
        PipeAction a = actions[j];
        int to = pipeline_output_to(spec, me, a), from = pipeline_input_from(spec, me, a);
        send_channel[j] = recv_channel[j] = 0;
        if (to >= 0 && ahead[(size_t)me * n + j]) send_channel[j] = 1 + walk_ahead_colour(spec, me);
        if (from >= 0) {  // the sender's action: the same pass of the micro-batch, one virtual stage away
            int v = pipeline_virtual_stage(spec, me, a.chunk) + (a.op == PIPE_FORWARD ? -1 : 1);
            int i = index_of[(size_t)from * keys + (a.op * spec.m + a.micro) * spec.V + pipeline_chunk_of(spec, v)];
            if (ahead[(size_t)from * n + i]) {
                recv_channel[j] = 1 + walk_ahead_colour(spec, from);
                if (recv_channel[j] == 1 + walk_ahead_colour(spec, me)) {
                    fail("stage %d receives ahead from stage %d of its own colour: the pipe's side channels would mix "
                         "sends and receives (llmc/pipeline_walk.h)", me, from);
                }
            }
        }
        if (send_channel[j]) walk_add_peer(peers + send_channel[j] * p, &num_peers[send_channel[j]], to);
        if (recv_channel[j]) walk_add_peer(peers + recv_channel[j] * p, &num_peers[recv_channel[j]], from);
    }
    for (int c = w->pp->side_channels + 1; c <= channels; c++) comm_open_channel(w->pp, c, peers + c * p, num_peers[c]);
    free(lists);
    free(ahead);
    free(index_of);
    free(peers);
}

// An action's start: the micro-batch's tokens (first and last stage), its slot, at the V's bottom
// chunk 1's input copied from chunk 0's output; the pass that computes it (chunk.h)
static inline ChunkPass walk_begin(Walk* w, const PipeAction* actions, int j, const int* grad_index, int split) {
    Stage* st = w->st;
    PipeAction a = actions[j];
    watchdog_beat();
    if (w->times) w->times[2 * j] = wall_time_s() - w->t0;
    const int *inputs, *targets;
    walk_tokens(w, a, &inputs, &targets);
    Activations* slot = stage_slot(st, a.micro, a.chunk);
    note_slots_in_use(w);
    if (a.op == PIPE_FORWARD && pipeline_input_is_local(st->spec, st->stage, a)) {
        // the V's bottom: chunk 0's output (B T, C) is chunk 1's input, on this rank: a copy
        int v = pipeline_virtual_stage(st->spec, st->stage, a.chunk);
        PipeAction made = pipe_action(PIPE_FORWARD, a.micro, pipeline_chunk_of(st->spec, v - 1));
        copy_device_to_device(slot->encoded, stage_output_buffer(w, made, 0), walk_message(w) * sizeof(floatX));
        if (w->forward_only) stage_release(st, made.micro, made.chunk);
    }
    return chunk_pass(w, a.chunk, slot, a.op == PIPE_BACKWARD ? st->grad[grad_index[j]] : NULL, inputs, targets, split);
}

// ... and its end, once its pass has run: a forward's loss (the last virtual stage's), the slots
// it frees
static inline void walk_end(Walk* w, const PipeAction* actions, int j, const ChunkPass* pass) {
    Stage* st = w->st;
    PipeAction a = actions[j];
    if (a.op == PIPE_FORWARD) {
        w->loss += pass->loss;
        if (is_last_virtual(st, a.chunk)) w->head = pass->slot;  // (its logits: a sample's)
        // (a forward-only walk is done with the last virtual stage's slot: its logits stay until
        // the next walk takes it)
        if (w->forward_only && is_last_virtual(st, a.chunk)) stage_release(st, a.micro, a.chunk);
    } else if (a.op == PIPE_WEIGHT || !pass->split) {
        stage_release(st, a.micro, a.chunk);  // (a split B's slot stays for its W)
    }
    if (w->times) {
        device_synchronize();  // the GPU's work, not its launch
        w->times[2 * j + 1] = wall_time_s() - w->t0;
    }
}

// The F&B overlap's sends: those of the next exchange that go ahead (walk_sends_ahead: the
// group's forward's, and those before it due there; sends[from .. to) are the next exchange's),
// posted in action order on this stage's side channel into `early`, after the forward's kernels
static inline void walk_send_ahead(Walk* w, const PipeAction* actions, const int* sends, int from, int to,
                                   const int* send_channel, const int* grad_index, CommMessage* msgs,
                                   CommRequest* early) {
    int posted = 0;
    for (int i = from; i < to; i++) {
        if (!send_channel[sends[i]]) continue;
        PipeAction out = actions[sends[i]];
        int peer = pipeline_output_to(w->st->spec, w->st->stage, out);
        msgs[posted] = comm_message(stage_output_buffer(w, out, grad_index[sends[i]]), walk_message(w), peer, 1);
        msgs[posted++].channel = send_channel[sends[i]];
    }
    comm_exchange_start(w->pp, msgs, posted, COMM_FLOATX, early);  // (none: nothing posted)
}

static inline void pipeline_walk(Walk* w, const PipeAction* actions, int n) {
    Stage* st = w->st;
    PipeSpec spec = st->spec;
    int split = pipeline_splits_backward(spec);  // B leaves the weight gradients to a later W
    int* group = (int*)malloc_check((size_t)n * sizeof(int));
    int* grad_index = (int*)malloc_check((size_t)n * sizeof(int));
    int groups = pipeline_exchange_index(actions, n, group);
    // which gradient buffer each backward receives into and sends from (stage.h)
    pipeline_grad_indices(spec, st->stage, actions, n, grad_index);
    // the sends in the order the exchanges post them: by exchange (the one after the action's
    // group, plus sends_later), in action order within one (a counting sort)
    int* sends = (int*)malloc_check((size_t)(n + 1) * sizeof(int));
    int* first_send = (int*)calloc_check((size_t)groups + 2, sizeof(int));  // exchange e's: first_send[e] ..
    for (int j = 0; j < n; j++) {
        if (pipeline_output_to(spec, st->stage, actions[j]) >= 0) first_send[group[j] + 1 + actions[j].sends_later + 1]++;
    }
    for (int e = 0; e <= groups; e++) first_send[e + 1] += first_send[e];
    int* placed = (int*)calloc_check((size_t)groups + 1, sizeof(int));
    for (int j = 0; j < n; j++) {
        int e = group[j] + 1 + actions[j].sends_later;
        if (pipeline_output_to(spec, st->stage, actions[j]) >= 0) sends[first_send[e] + placed[e]++] = j;
    }
    // each action's channels, for its output and its input (all 0 without -pp_overlap)
    int* send_channel = (int*)calloc_check((size_t)n + 1, sizeof(int));
    int* recv_channel = (int*)calloc_check((size_t)n + 1, sizeof(int));
    if (w->overlap_pairs && !w->forward_only) walk_channels(w, actions, n, send_channel, recv_channel);
    // (an exchange's messages: its sends, and a group's receives, at most one per action)
    CommMessage* msgs = (CommMessage*)malloc_check((size_t)(n + 2) * sizeof(CommMessage));
    // the F&B overlap's sends posted ahead of the next exchange (those on a side channel)
    CommRequest early;
    memset(&early, 0, sizeof(early));
    // exchange e comes before group e (actions k .. end-1); after the last group, one more
    // exchange sends the last outputs
    for (int k = 0, e = 0, end; ; k = end, e++) {
        for (end = k; end < n && group[end] == group[k]; end++) {}
        int count = 0;
        for (int i = first_send[e]; i < first_send[e + 1]; i++) {  // send: the outputs due now
            // a forward's from its slot's last layer's residual3 to the next virtual stage; a
            // backward's, its input gradient in grad[grad_index], to the one before (unless it
            // left ahead, under the backward of the group before)
            if (send_channel[sends[i]]) continue;
            PipeAction a = actions[sends[i]];
            int to = pipeline_output_to(spec, st->stage, a);
            msgs[count++] = comm_message(stage_output_buffer(w, a, grad_index[sends[i]]), walk_message(w), to, 1);
        }
        for (int j = k; j < end; j++) {  // receive: the inputs of this group
            // a forward's into its slot's encoded (the slot is taken here, from the free ones);
            // a backward's, the gradient at its chunk's output, into grad[grad_index]; on the
            // channel its sender sent it on
            int from = pipeline_input_from(spec, st->stage, actions[j]);
            if (from < 0) continue;
            msgs[count] = comm_message(stage_input_buffer(w, actions[j], grad_index[j]), walk_message(w), from, 0);
            msgs[count++].channel = recv_channel[j];
        }
        comm_exchange(w->pp, msgs, count, COMM_FLOATX);
        comm_wait(&early);  // (the sends posted ahead, under the backward; their buffers are free after)
        note_slots_in_use(w);  // (the peak count of slots held, for the memory check at the end)
        // a forward-only walk frees a slot once its output is sent (or, at the V's bottom, copied)
        for (int i = first_send[e]; i < first_send[e + 1] && w->forward_only; i++) {
            stage_release(st, actions[sends[i]].micro, actions[sends[i]].chunk);
        }
        if (k == n) break;
        // the MoE overlap (the header comment): a group that opens with an F&B pair of two
        // micro-batches, its forward and backward stepped in turn. (On interleaved's last stage a
        // group joins a forward and its own backward, which needs the forward's loss: not a pair.)
        int pair = w->overlap_pairs && st->moe && !w->forward_only && pipeline_fb_pair(actions, k, end);
        for (int j = k; j < end; j++) {  // compute: the group's actions, each on its slot
            PipeAction a = actions[j];
            ChunkPass pass = walk_begin(w, actions, j, grad_index, split);
            if (pair && j == k) {
                // F's pass and B's (on the MoE's second lane) a step each in turn: each step runs
                // to the pass's next posted all-to-all of rows (chunk.h), so that every all-to-all
                // one posts moves while the other computes, and waits at the pass's next step. A
                // pass's loaded tokens are the data loader's buffers, shared: each step loads its
                // own again (walk_tokens; only the first and last stage read any)
                ChunkPass back = walk_begin(w, actions, j + 1, grad_index, split);
                back.lane = &st->moe->lanes[1];
                for (int f_on = 1, b_on = 1; f_on || b_on; comm_progress(st->moe->ep_group)) {
                    if (f_on) {
                        st->moe->hidden += back.exchange.active;  // (B's all-to-all, under F's step)
                        walk_tokens(w, a, &pass.inputs, &pass.targets);
                        f_on = chunk_forward_step(w, &pass);
                        if (!f_on) walk_end(w, actions, j, &pass);
                        if (!f_on) walk_send_ahead(w, actions, sends, first_send[e + 1], first_send[e + 2],
                                                   send_channel, grad_index, msgs, &early);
                    }
                    if (b_on) {
                        st->moe->hidden += pass.exchange.active;  // (F's, under B's)
                        walk_tokens(w, actions[j + 1], &back.inputs, &back.targets);
                        b_on = chunk_backward_step(w, &back);
                        if (!b_on) walk_end(w, actions, j + 1, &back);
                    }
                }
                j++;
                continue;
            }
            if (a.op == PIPE_FORWARD) {
                // the chunk's layers; the last virtual stage also the loss, its logits becoming
                // their gradient. The slot keeps the activations for the backward.
                while (chunk_forward_step(w, &pass)) {}
            } else if (a.op == PIPE_BACKWARD) {
                // from the gradient at the chunk's output (received into grad, or on the last
                // virtual stage the dlogits) to the gradient at its input, left in the same
                // buffer to be sent back; then the slot is free, unless W still needs it
                while (chunk_backward_step(w, &pass)) {}
            } else {
                chunk_weights(w, pass.slot, a.chunk);  // W: the weight gradients B left to it
            }
            walk_end(w, actions, j, &pass);
            // the F&B overlap: the next exchange's sends that go ahead, after the group's forward
            if (j == k) walk_send_ahead(w, actions, sends, first_send[e + 1], first_send[e + 2], send_channel,
                                        grad_index, msgs, &early);
        }
    }
    free(group);
    free(grad_index);
    free(sends);
    free(first_send);
    free(placed);
    free(msgs);
    free(send_channel);
    free(recv_channel);
}

// One micro-batch of B x T forward through the whole pipe (every chunk in turn), no backward:
// chunk 0 of the loader's current batch, or without a loader `tokens`. Returns the walk: its
// loss on the stage with the head, and the slot holding the logits there.
static inline Walk stage_forward_pass(GPT2* model, Stage* st, CommGroup* pp, CommGroup* tp, ContextParallel* cp,
                                      DataLoader* data, const int* tokens, int B, int T) {
    PipeSpec one = st->spec;
    one.m = 1;
    PipeAction* actions = (PipeAction*)malloc_check((size_t)one.V * sizeof(PipeAction));
    int n = pipeline_forward_actions(one, actions);
    Walk w = walk_init(model, st, pp, tp, cp, B, T);
    w.data = data;
    w.tokens = tokens;
    w.forward_only = 1;
    pipeline_walk(&w, actions, n);
    free(actions);
    return w;
}

#endif
