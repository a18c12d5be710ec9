// How long a collective takes: the communication half of the step-time model (issue 61), on the
// alpha-beta model of llmc/device_profile.h. A message of n bytes over one link costs
//
//     alpha + n / beta,    beta = the link's bandwidth x efficiency_link
//
// alpha and bandwidth those of the link it crosses: inside a node (NVLink; MPI on one host) or
// across nodes (InfiniBand, one adapter per GPU), both per GPU and per direction. A collective is
// a sequence of such steps, and which links its steps cross follows from where its ranks are.
// This file answers, for the trainers' groups:
//
//   1. placement: the members of each group of rank r on the grid (grid_group, the trainers'
//      colours and keys written as arithmetic), and from them and gpus_per_node how many nodes the
//      group spans, how many of its ranks share a node, and so which link each step crosses;
//   2. times: each collective's seconds by the algorithm NCCL runs it with (below);
//   3. overlap: the part of a collective left exposed by compute it runs under (comm_exposed).
//
// Plain C99 like device_profile.h (also compiled as C++ by nvcc and as C by emscripten), nothing
// allocated: the step-time model calls these for every group of every layout a search tries.
#ifndef LLMC_COMM_TIME_H
#define LLMC_COMM_TIME_H

#include <stdio.h>
#include "device_profile.h"

// ----------------------------------------------------------------------------------------------
// 1. Placement
//
// The grid (train_gpt2_3d.cu, grid_coordinates): world rank r sits at tp rank r % tp, cp rank
// (r / tp) % cp, dp rank (r / (tp cp)) % dp and stage r / (tp cp dp); S = dp cp tp ranks make a
// stage. The trainer splits its groups from the world by colours (grid_init, grid_fold_experts);
// written out, every group is an arithmetic progression of world ranks, first + i stride for
// i < size, listed in the order of its keys (ascending ranks, in every group):
//
//   group      what it holds                                     first            stride        size
//   tp         the tp ranks of one stage of one replica          r - t            1             tp
//   cp         a replica's sequence, one stage and tp rank        r - c tp         tp            cp
//   pp         the stages of one replica, cp and tp rank          r - s S          S             pp
//   dp         same parameters: the dp x cp replicas' ranks       s S + t          tp            dp cp
//   embedding  the first and last stage's wte copies              r - s S          (pp - 1) S    2
//              (a rank of a middle stage, or every rank with pp = 1: itself alone)
//   ep         ep consecutive ranks of a stage share its experts  s S + (q / ep) ep 1            ep
//   edp        the stage's ranks holding the same experts         s S + q % ep     ep            S / ep
//   seq        one replica's cp x tp ranks at a stage             s S + d cp tp    1             cp tp
//
// with t, c, d, s rank r's tp, cp, dp rank and stage and q = r % S its place in the stage. The ep,
// edp and seq groups exist when the model has experts (the 5D fold); grid_group returns them for
// any ep dividing S (ep = 1: each rank its own ep group, the whole stage one edp group).
// The other trainers are this grid with the other sizes 1: train_gpt2_dp's world is dp's group,
// _tp's tp's, _cp's cp's, _pp's pp's (and its embedding group the first and last stage);
// train_gpt2_ep (dp = world, ep) has ep consecutive ranks and edp every ep-th; train_gpt2_diloco's
// workers, R consecutive ranks, are placed as tp's groups at tp = R, its across groups as dp's.

typedef struct {
    int dp, pp, cp, tp, ep;  // the grid's sizes (train_gpt2_3d's -dp -pp -cp -tp -ep), each >= 1
} GridShape;

typedef enum { GRID_TP, GRID_CP, GRID_PP, GRID_DP, GRID_EMBEDDING, GRID_EP, GRID_EDP, GRID_SEQ, GRID_GROUPS } GridGroup;
static const char* const grid_group_names[GRID_GROUPS] = {"tp", "cp", "pp", "dp", "embedding", "ep", "edp", "seq"};

typedef struct {
    int first, stride, size;  // the ranks first + i stride, i = 0 .. size - 1
} RankPattern;

static inline int grid_world(GridShape g) { return g.dp * g.pp * g.cp * g.tp; }

// 1 if the grid is one the trainer runs (every size >= 1, ep dividing a stage's dp cp tp ranks);
// else 0 with why filled in, naming the flag
static inline int grid_shape_check(GridShape g, char* why, size_t cap) {
    const int sizes[5] = {g.dp, g.pp, g.cp, g.tp, g.ep};
    const char* flags[5] = {"-dp", "-pp", "-cp", "-tp", "-ep"};
    for (int i = 0; i < 5; i++) {
        if (sizes[i] < 1) {
            snprintf(why, cap, "%s %d: a grid's sizes are at least 1", flags[i], sizes[i]);
            return 0;
        }
    }
    int S = g.dp * g.cp * g.tp;
    if (S % g.ep != 0) {
        snprintf(why, cap, "-ep %d does not divide a stage's dp x cp x tp = %d ranks", g.ep, S);
        return 0;
    }
    return 1;
}

// rank r's group of this kind (the grid must pass grid_shape_check, and 0 <= r < grid_world)
static inline RankPattern grid_group(GridShape g, int r, GridGroup kind) {
    int S = g.dp * g.cp * g.tp, t = r % g.tp, c = r / g.tp % g.cp, d = r / (g.tp * g.cp) % g.dp, s = r / S, q = r % S;
    RankPattern p = {r, 1, 1};  // (alone)
    switch (kind) {
        case GRID_TP: p.first = r - t, p.stride = 1, p.size = g.tp; break;
        case GRID_CP: p.first = r - c * g.tp, p.stride = g.tp, p.size = g.cp; break;
        case GRID_PP: p.first = r - s * S, p.stride = S, p.size = g.pp; break;
        case GRID_DP: p.first = s * S + t, p.stride = g.tp, p.size = g.dp * g.cp; break;
        case GRID_EMBEDDING:
            if (g.pp > 1 && (s == 0 || s == g.pp - 1)) p.first = r - s * S, p.stride = (g.pp - 1) * S, p.size = 2;
            break;
        case GRID_EP: p.first = s * S + q / g.ep * g.ep, p.stride = 1, p.size = g.ep; break;
        case GRID_EDP: p.first = s * S + q % g.ep, p.stride = g.ep, p.size = S / g.ep; break;
        case GRID_SEQ: p.first = s * S + d * g.cp * g.tp, p.stride = 1, p.size = g.cp * g.tp; break;
        default: break;
    }
    if (p.size == 1) p.first = r, p.stride = 1;
    return p;
}

static inline int rank_pattern_member(RankPattern p, int i) { return p.first + i * p.stride; }

// Ranks r and s share a node iff r / gpus_per_node == s / gpus_per_node (mpirun and Slurm fill
// nodes with consecutive ranks; the trainers' grid puts the group that talks most, tp, on them).
typedef enum { LINK_INTRA_NODE, LINK_INTER_NODE } LinkClass;
static const char* const link_class_names[2] = {"intra-node", "inter-node"};

static inline int comm_same_node(int r, int s, int gpus_per_node) { return r / gpus_per_node == s / gpus_per_node; }

// where a group's ranks are
typedef struct {
    int size;          // p, its ranks
    int nodes;         // k, the nodes they are on
    int max_per_node;  // the most of them on one node ...
    int min_per_node;  // ... and the fewest (on a node that has any)
    LinkClass link;    // the slowest link between two of them: inter-node once the group spans nodes
} GroupPlacement;

// The ranks of a progression meet the nodes in order, so each node's ranks are one run of equal
// r / gpus_per_node: the runs count the nodes and the ranks on each.
static inline GroupPlacement group_placement(RankPattern p, int gpus_per_node) {
    GroupPlacement g = {p.size, 0, 0, 0, LINK_INTRA_NODE};
    int run = 0;
    for (int i = 0; i < p.size; i++) {
        int node = rank_pattern_member(p, i) / gpus_per_node;
        run++;
        if (i + 1 == p.size || rank_pattern_member(p, i + 1) / gpus_per_node != node) {  // the run ends here
            g.nodes++;
            if (run > g.max_per_node) g.max_per_node = run;
            if (g.min_per_node == 0 || run < g.min_per_node) g.min_per_node = run;
            run = 0;
        }
    }
    g.link = g.nodes > 1 ? LINK_INTER_NODE : LINK_INTRA_NODE;
    return g;
}

// two ranks, for a send and its receive (a pipeline's neighbours: the same place in stages s and s + 1)
static inline GroupPlacement pair_placement(int r, int s, int gpus_per_node) {
    GroupPlacement g = {2, 1, 2, 2, LINK_INTRA_NODE};
    if (r == s) g.size = 1, g.max_per_node = g.min_per_node = 1;
    else if (!comm_same_node(r, s, gpus_per_node)) g.nodes = 2, g.max_per_node = g.min_per_node = 1, g.link = LINK_INTER_NODE;
    return g;
}

// ----------------------------------------------------------------------------------------------
// 2. Times
//
// n is the payload as the trainers count it and nccl-tests sizes it (S in nccl-tests'
// doc/PERFORMANCE.md): the whole tensor reduced, the whole gathered result of an all-gather (a
// rank's share is n/p), the whole input of a reduce-scatter, the root's buffer of a broadcast, a
// rank's whole send buffer of an all-to-all (n/p of it to each rank, itself included), the
// message of a send. alpha and beta below are the link's (alpha_i, beta_i inside a node, alpha_e,
// beta_e across), beta with efficiency_link applied; p the group's ranks, k its nodes, q the most
// of its ranks on one node. A group of one rank, or a payload of 0 bytes, costs nothing.
//
//   all-reduce, ring   2 (p - 1) steps of n / p bytes:  2 (p - 1) (alpha + (n / p) / beta)
//                      a reduce-scatter then an all-gather around the ring, each rank sending and
//                      receiving one n/p block a step. The steps are in lock-step (each needs the
//                      block the step before brought), so each lasts as long as its slowest hop:
//                      a ring that spans nodes crosses them on at least k of its p hops, and every
//                      step pays alpha_e and beta_e. For large n this is nccl-tests' bus bandwidth
//                      of an all-reduce, algbw x 2 (p - 1) / p = beta.
//   all-reduce, tree   2 ((q - 1) alpha_i + ceil(log2 k) alpha_e) + 2 n / beta
//                      NCCL's tree: a chain through the ranks of each node and a double binary
//                      tree across the nodes (NVIDIA/nccl#919: "The tree is only between nodes.
//                      Within a single node, it is indeed just a chain"; the two trees: NCCL 2.4's
//                      release, developer.nvidia.com/blog/massively-scale-deep-learning-training-
//                      nccl-2-4). A reduce up to the root then a broadcast down, pipelined in
//                      chunks (NVIDIA/nccl#545): the latency is the path's hops twice, up and
//                      down; the bandwidth term is n through each rank's link on the way up and
//                      again on the way down (with two complementary trees each rank is inner in
//                      one, taking two halves in, and a leaf in the other), at the slowest link's
//                      beta. With one rank per node (k = p) the latency is the textbook tree's
//                      2 ceil(log2 p) alpha_e; on one node the chain's 2 (p - 1) alpha_i never
//                      beats the ring, which is why NCCL runs rings inside a node (NVIDIA/nccl#532).
//   all-reduce         the faster of the two. NCCL's tuner picks an algorithm (and protocol) for
//                      each call from a model of the same kind, by size, nodes, GPUs per node and
//                      the links' bandwidths (NVIDIA/nccl#754; NCCL_ALGO forces one): the tree for
//                      small messages across nodes, where the ring's 2 (p - 1) latencies dominate,
//                      the ring for large ones (its 2 (p - 1) / p n against the tree's 2 n).
//   reduce-scatter,    p - 1 ring steps of n / p:  (p - 1) (alpha + (n / p) / beta)
//   all-gather         the all-reduce's two halves; bus bandwidth algbw x (p - 1) / p.
//   broadcast          (p - 1) alpha + n / beta: NCCL's ring broadcast, a chain from the root
//                      pipelined in chunks, every byte leaving the root once (bus bandwidth = algbw).
//   all-to-all         pairwise: each rank exchanges n / p with each of its p - 1 peers, one after
//                      another, each message on its own link:
//                          (p_i - 1) (alpha_i + (n / p) / beta_i) + p_e (alpha_e + (n / p) / beta_e)
//                      p_i the group's ranks on this rank's node (itself included), p_e = p - p_i
//                      the peers off it; the collective lasts as long as its slowest rank's share,
//                      the rank with the most peers off its node. (Bus bandwidth (p - 1) / p.)
//                      NCCL posts the sends together and may move the on-node and off-node parts
//                      at once; adding them overestimates by the on-node part, small beside the
//                      off-node one when beta_i >> beta_e.
//   send / recv        alpha + n / beta, the link between the two ranks.
//
// A measured all-reduce (a CPU profile of dev/bench/calibrate: MPI_Allreduce over 2 ranks of the
// host took a + n / b) replaces the link inside a node for all-reduces: the ring over 2 ranks is
// 2 steps of n / 2, 2 alpha + n / beta, so alpha = a / 2 a step and beta = b, the measured bus
// bandwidth (at p = 2 algbw and busbw are one). It is what MPI reached, so efficiency_link does
// not apply to it. A measured reduce-scatter or all-gather (reducescatter_2_ranks_*, allgather_2_ranks_*:
// a + n / b for n bytes in all) replaces it for those: one ring step of n / 2 over 2 ranks, so
// alpha = a and beta = b / 2 a step. A measured collective of more than 2 MB takes its
// _beyond_2mb bandwidth for the bytes past them (measured_bandwidth_at). Other collectives, and
// any across nodes, use the profile's links.
//
// Not modelled: groups that share a link at the same time (each GPU has its own adapter, and the
// trainers' concurrent collectives are on different groups' ranks), NCCL's protocols (LL, LL128,
// Simple: their latencies and bandwidths differ), NVLink SHARP and in-network reductions.

typedef enum { COLL_ALL_REDUCE, COLL_REDUCE_SCATTER, COLL_ALL_GATHER, COLL_BROADCAST, COLL_ALL_TO_ALL, COLL_SEND_RECV,
               COLL_KINDS } Collective;
static const char* const collective_names[COLL_KINDS] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                                         "all-to-all", "send"};

typedef enum { COLL_ALGO_NONE, COLL_ALGO_RING, COLL_ALGO_TREE, COLL_ALGO_PAIRWISE, COLL_ALGO_DIRECT } CollAlgo;
static const char* const coll_algo_names[5] = {"none", "ring", "tree", "pairwise", "direct"};

// the collective of this name (llmc/step_kernels.h's link rows: "all-reduce", "send", ...), or
// COLL_KINDS for none
static inline Collective collective_of_name(const char* name) {
    int k = 0;
    while (k < COLL_KINDS && strcmp(collective_names[k], name) != 0) k++;
    return (Collective)k;
}

typedef struct {
    double alpha;  // seconds a message
    double beta;   // bytes/s it moves at
} LinkCost;

// a link of the profile, beta at efficiency_link
static inline LinkCost link_cost(const DeviceProfile* p, LinkClass c) {
    LinkCost l;
    l.alpha = c == LINK_INTRA_NODE ? p->intra_node_latency_s : p->inter_node_latency_s;
    l.beta = (c == LINK_INTRA_NODE ? p->intra_node_bandwidth_bytes_per_s : p->inter_node_bandwidth_bytes_per_s) *
             p->efficiency_link;
    return l;
}

// A measured collective's bandwidth for n bytes in all: its bytes past the first
// DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES move at `beyond` where the profile has it (0: not), so one
// bandwidth for the whole is n / (knee / beta + (n - knee) / beyond)
static inline double measured_bandwidth_at(double beta, double beyond, double n) {
    double knee = DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES;
    if (!(beyond > 0.0) || n <= knee) return beta;
    return n / (knee / beta + (n - knee) / beyond);
}

// the link an all-reduce of n bytes takes its steps on: a measured all-reduce inside a node where
// the profile has one (its a / 2 a step, b at n bytes), else the profile's link
static inline LinkCost all_reduce_link(const DeviceProfile* p, LinkClass c, double n) {
    if (c == LINK_INTRA_NODE && p->intra_node_allreduce_bandwidth_bytes_per_s > 0.0) {
        LinkCost l = {p->intra_node_allreduce_latency_s / 2.0,
                      measured_bandwidth_at(p->intra_node_allreduce_bandwidth_bytes_per_s,
                                            p->intra_node_allreduce_bandwidth_beyond_2mb_bytes_per_s, n)};
        return l;
    }
    return link_cost(p, c);
}

// the link a reduce-scatter's or an all-gather's ring steps take, n bytes in all: the collective
// measured over 2 ranks inside a node where the profile has it (its a, b / 2 a step, b at n bytes),
// else the profile's link
static inline LinkCost ring_collective_link(const DeviceProfile* p, int gather, LinkClass c, double n) {
    double latency = gather ? p->allgather_2_ranks_latency_s : p->reducescatter_2_ranks_latency_s;
    double bandwidth = gather ? p->allgather_2_ranks_bandwidth_bytes_per_s : p->reducescatter_2_ranks_bandwidth_bytes_per_s;
    double beyond = gather ? p->allgather_2_ranks_bandwidth_beyond_2mb_bytes_per_s
                           : p->reducescatter_2_ranks_bandwidth_beyond_2mb_bytes_per_s;
    if (c == LINK_INTRA_NODE && bandwidth > 0.0) {
        LinkCost l = {latency, measured_bandwidth_at(bandwidth, beyond, n) / 2.0};
        return l;
    }
    return link_cost(p, c);
}

// a collective's predicted time and where it goes
typedef struct {
    double seconds;        // the whole: intra_seconds + inter_seconds
    double intra_seconds;  // the part spent on links inside a node ...
    double inter_seconds;  // ... and across nodes
    CollAlgo algo;         // how NCCL runs it (the faster algorithm for an all-reduce)
    LinkClass link;        // the slowest link it crosses
    int steps;             // messages one rank sends in a row (ring steps, tree hops up and down, peers)
} CollTime;

static inline CollTime coll_time_zero(void) {
    CollTime t = {0.0, 0.0, 0.0, COLL_ALGO_NONE, LINK_INTRA_NODE, 0};
    return t;
}

// steps messages of `bytes` each on link l, all counted to the link class c
static inline CollTime coll_steps(CollAlgo algo, LinkClass c, int steps, LinkCost l, double bytes) {
    CollTime t = coll_time_zero();
    t.algo = algo, t.link = c, t.steps = steps;
    t.seconds = steps * (l.alpha + bytes / l.beta);
    if (c == LINK_INTRA_NODE) t.intra_seconds = t.seconds;
    else t.inter_seconds = t.seconds;
    return t;
}

// ceil(log2 k), k >= 1: the levels of a binary tree over k nodes
static inline int comm_ceil_log2(int k) {
    int levels = 0;
    while ((1 << levels) < k) levels++;
    return levels;
}

static inline CollTime all_reduce_ring_time(const DeviceProfile* prof, GroupPlacement g, double n) {
    if (g.size <= 1 || n <= 0.0) return coll_time_zero();
    return coll_steps(COLL_ALGO_RING, g.link, 2 * (g.size - 1), all_reduce_link(prof, g.link, n), n / g.size);
}

static inline CollTime all_reduce_tree_time(const DeviceProfile* prof, GroupPlacement g, double n) {
    if (g.size <= 1 || n <= 0.0) return coll_time_zero();
    CollTime t = coll_time_zero();
    t.algo = COLL_ALGO_TREE, t.link = g.link;
    int chain = g.max_per_node - 1, levels = comm_ceil_log2(g.nodes);
    t.steps = 2 * (chain + levels);
    if (g.nodes == 1) {  // the chain alone: its hops and the bytes, all inside the node
        LinkCost in = all_reduce_link(prof, LINK_INTRA_NODE, n);
        t.intra_seconds = 2.0 * chain * in.alpha + 2.0 * n / in.beta;
    } else {             // the chains' latency inside the nodes; the tree's, and the bytes' pace, across them
        LinkCost out = link_cost(prof, LINK_INTER_NODE);
        t.intra_seconds = 2.0 * chain * link_cost(prof, LINK_INTRA_NODE).alpha;
        t.inter_seconds = 2.0 * levels * out.alpha + 2.0 * n / out.beta;
    }
    t.seconds = t.intra_seconds + t.inter_seconds;
    return t;
}

static inline CollTime all_to_all_time(const DeviceProfile* prof, GroupPlacement g, double n) {
    if (g.size <= 1 || n <= 0.0) return coll_time_zero();
    LinkCost in = link_cost(prof, LINK_INTRA_NODE), out = link_cost(prof, LINK_INTER_NODE);
    double m = n / g.size;
    // a rank with c of the group's ranks on its node: (c - 1) peers inside, p - c outside. The time
    // is linear in c, so the slowest rank is on the fullest node or on the emptiest
    CollTime best = coll_time_zero();
    const int counts[2] = {g.max_per_node, g.min_per_node};
    for (int i = 0; i < 2; i++) {
        int c = counts[i];
        CollTime t = coll_time_zero();
        t.algo = COLL_ALGO_PAIRWISE, t.link = c < g.size ? LINK_INTER_NODE : LINK_INTRA_NODE, t.steps = g.size - 1;
        t.intra_seconds = (c - 1) * (in.alpha + m / in.beta);
        t.inter_seconds = (g.size - c) * (out.alpha + m / out.beta);
        t.seconds = t.intra_seconds + t.inter_seconds;
        if (i == 0 || t.seconds > best.seconds) best = t;
    }
    return best;
}

// The time of one collective of kind `kind` with payload n bytes over a group placed as g. For a
// send, g is the pair's placement (pair_placement).
static inline CollTime coll_time(const DeviceProfile* prof, Collective kind, GroupPlacement g, double n) {
    if (g.size <= 1 || n <= 0.0) return coll_time_zero();
    LinkCost l = link_cost(prof, g.link);
    switch (kind) {
        case COLL_ALL_REDUCE: {
            CollTime ring = all_reduce_ring_time(prof, g, n), tree = all_reduce_tree_time(prof, g, n);
            return tree.seconds < ring.seconds ? tree : ring;
        }
        case COLL_REDUCE_SCATTER:
        case COLL_ALL_GATHER:
            return coll_steps(COLL_ALGO_RING, g.link, g.size - 1,
                              ring_collective_link(prof, kind == COLL_ALL_GATHER, g.link, n), n / g.size);
        case COLL_BROADCAST: {
            CollTime t = coll_steps(COLL_ALGO_RING, g.link, g.size - 1, l, 0.0);  // the chain's latencies ...
            if (g.link == LINK_INTRA_NODE) t.intra_seconds += n / l.beta;        // ... and the bytes once
            else t.inter_seconds += n / l.beta;
            t.seconds += n / l.beta;
            return t;
        }
        case COLL_ALL_TO_ALL: return all_to_all_time(prof, g, n);
        case COLL_SEND_RECV: return coll_steps(COLL_ALGO_DIRECT, g.link, 1, l, n);
        default: return coll_time_zero();
    }
}

// ----------------------------------------------------------------------------------------------
// 3. Overlap
//
// A collective that runs while the rank computes costs the step only what outlasts the compute:
//
//     exposed = max(0, comm - compute)
//
// the rule the step-time model applies wherever a trainer posts communication and computes
// before it waits for it (everything else waits in the open, exposed whole):
//   - DDP's buckets (train_gpt2_dp -overlap 1; -z 1 and 2 likewise): a layer's gradients are
//     reduced while the backward goes on to the layers below, so the reductions hide behind the
//     backward compute that follows the first bucket's post; the last bucket (the embeddings')
//     has nothing after it. -overlap 0: no compute to hide behind.
//   - -tp_overlap's ring steps (llmc/tensor_parallel.h): each of a collective's tp - 1 steps
//     carries the next block of rows while the GEMM multiplies the block at hand, so each step
//     is exposed by max(0, step - that block's GEMM).
//   - CP's ring (llmc/context_parallel.h): each of the cp - 1 K,V blocks travels while attention
//     runs on the block before: max(0, block's transfer - a block's attention), a step each.
//   - pipeline sends: a message hides behind what the receiving stage computes before it needs
//     it; pipeline_play (llmc/pipeline.h) counts its send_seconds only where the receiver waits.
static inline double comm_exposed(double comm_seconds, double compute_seconds) {
    double left = comm_seconds - compute_seconds;
    return left > 0.0 ? left : 0.0;
}

#endif
