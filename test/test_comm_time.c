// Unit tests of the collectives' times (llmc/comm_time.h), each against a case worked by hand on a
// profile of round numbers (1 us and 100 GB/s inside a node, 10 us and 10 GB/s across, at
// efficiency_link 0.5: beta 50 GB/s and 5 GB/s):
//   - placement: the nodes a group spans and its ranks on each, the link between two ranks;
//   - the grid's groups: rank 13 of a 2 x 2 x 2 x 2 grid with ep 4 written out by hand, and on
//     several grids every group holds its rank, every member finds the same group, and the groups
//     of a kind cover the world once (with pp = 1, a middle stage and ep = 1 at their edges);
//   - ring all-reduce over 2 ranks, 2 alpha + n / beta; 8 ranks in one node against 16 over two
//     (the inter-node beta sets the pace) and 16 in one node of 16; the tree for 8 bytes across
//     nodes (and 2 log2(p) alpha_e with a rank a node), the ring for 1 GB and always inside a node;
//     reduce-scatter, all-gather, broadcast, all-to-all with half its peers off the node and on an
//     uneven placement, send; a group of one and an empty payload cost nothing;
//   - a measured two-rank all-reduce (a CPU profile) is itself at p = 2, and a / 2 a step beyond;
//   - the overlap rule, max(0, comm - compute); the built-in h100-sxm's links read as the
//     datasheet's numbers at 80%.
// Expected values are the formulas with the numbers put in, never a run of the code under test.
// `test_comm_time -groups DP PP CP TP EP` prints each rank's groups instead, for
// test/tests_comm_time.py to hold against train_gpt2_3d's own table.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/comm_time.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

// the same number up to rounding: the code and the expectation add the same terms in other orders
// (relative 1e-12, a thousand times a double's rounding)
static int close_to(double got, double want) { return fabs(got - want) <= 1e-12 * fabs(want) + 1e-30; }
#define CHECK_SECONDS(got, want, what) \
    CHECK(close_to(got, want), "%s: %.12g s, by hand %.12g s", what, (double)(got), (double)(want))

static const char ROUND_LINKS[] =
    "name round numbers\n"
    "kind cuda\n"
    "peak_flops_fp32 1e12\n"
    "peak_flops_bf16 1e12\n"
    "memory_bandwidth_bytes_per_s 1e12\n"
    "memory_bytes 1e9\n"
    "efficiency_matmul_large 1\n"
    "efficiency_matmul_small 1\n"
    "matmul_small_flops 0\n"
    "efficiency_attention 1\n"
    "efficiency_memory 1\n"
    "intra_node_latency_s 1e-6\n"
    "intra_node_bandwidth_bytes_per_s 100e9\n"
    "inter_node_latency_s 10e-6\n"
    "inter_node_bandwidth_bytes_per_s 10e9\n"
    "gpus_per_node 8\n"
    "efficiency_link 0.5\n";
// the hand-worked cases' links: alpha and beta x efficiency_link
#define AI 1e-6
#define BI 50e9
#define AE 10e-6
#define BE 5e9

static DeviceProfile load_profile(const char* text, const char* name) {
    DeviceProfile p;
    char why[2048];  // (room for a profile line of 511 characters in a message)
    if (!device_profile_parse(text, name, &p, why, sizeof(why))) {
        printf("FAIL: the test's profile: %s\n", why);
        exit(1);
    }
    return p;
}

static GroupPlacement place(int first, int stride, int size, int gpus_per_node) {
    RankPattern p = {first, stride, size};
    return group_placement(p, gpus_per_node);
}

static void check_placement(void) {
    GroupPlacement g = place(4, 1, 8, 8);  // ranks 4..11: 4 on node 0, 4 on node 1
    CHECK(g.size == 8 && g.nodes == 2 && g.max_per_node == 4 && g.min_per_node == 4 && g.link == LINK_INTER_NODE,
          "ranks 4..11, 8 a node: %d nodes, %d..%d a node", g.nodes, g.min_per_node, g.max_per_node);
    g = place(0, 8, 4, 8);  // 0, 8, 16, 24: a rank on each of 4 nodes
    CHECK(g.nodes == 4 && g.max_per_node == 1 && g.min_per_node == 1 && g.link == LINK_INTER_NODE,
          "ranks 0, 8, 16, 24: %d nodes, %d..%d a node", g.nodes, g.min_per_node, g.max_per_node);
    g = place(8, 1, 8, 8);  // one whole node
    CHECK(g.nodes == 1 && g.max_per_node == 8 && g.min_per_node == 8 && g.link == LINK_INTRA_NODE,
          "ranks 8..15: %d nodes, %d a node", g.nodes, g.max_per_node);
    g = place(0, 1, 3, 2);  // 0, 1 | 2
    CHECK(g.nodes == 2 && g.max_per_node == 2 && g.min_per_node == 1, "ranks 0..2, 2 a node: %d nodes, %d..%d a node",
          g.nodes, g.min_per_node, g.max_per_node);
    g = place(1, 2, 4, 4);  // 1, 3 | 5, 7: every other rank
    CHECK(g.nodes == 2 && g.max_per_node == 2 && g.min_per_node == 2, "ranks 1, 3, 5, 7, 4 a node: %d nodes", g.nodes);
    CHECK(pair_placement(3, 4, 4).link == LINK_INTER_NODE && pair_placement(0, 3, 4).link == LINK_INTRA_NODE &&
          pair_placement(5, 5, 4).size == 1, "pairs: 3-4 across nodes of 4, 0-3 inside, 5-5 alone");
    CHECK(comm_same_node(7, 0, 8) && !comm_same_node(7, 8, 8), "ranks 7 and 8 on different nodes of 8");
}

// ----------------------------------------------------------------------------------------------
// the grid's groups

static int same_pattern(RankPattern a, RankPattern b) {
    if (a.size != b.size) return 0;
    for (int i = 0; i < a.size; i++) {
        if (rank_pattern_member(a, i) != rank_pattern_member(b, i)) return 0;
    }
    return 1;
}

static void check_members(GridShape g, int r, GridGroup kind, const int* want, int n) {
    RankPattern p = grid_group(g, r, kind);
    int ok = p.size == n;
    for (int i = 0; ok && i < n; i++) ok = rank_pattern_member(p, i) == want[i];
    CHECK(ok, "rank %d's %s group on dp %d pp %d cp %d tp %d ep %d: first %d stride %d size %d, by hand %d ranks from %d",
          r, grid_group_names[kind], g.dp, g.pp, g.cp, g.tp, g.ep, p.first, p.stride, p.size, n, want[0]);
}

// every group holds its rank, in ascending order and inside the world; each member's group of the
// kind is the same; the groups of a kind cover each rank once (counted: each rank is reached by
// the group of the lowest rank in it exactly once)
static void check_partition(GridShape g) {
    int world = grid_world(g);
    int* covered = (int*)calloc((size_t)world, sizeof(int));
    for (int k = 0; k < GRID_GROUPS; k++) {
        memset(covered, 0, (size_t)world * sizeof(int));
        for (int r = 0; r < world; r++) {
            RankPattern p = grid_group(g, r, (GridGroup)k);
            int holds = 0, ordered = 1, inside = 1;
            for (int i = 0; i < p.size; i++) {
                int s = rank_pattern_member(p, i);
                holds |= s == r;
                inside &= s >= 0 && s < world;
                if (i > 0) ordered &= s > rank_pattern_member(p, i - 1);
            }
            CHECK(holds && ordered && inside, "%s group of rank %d (dp %d pp %d cp %d tp %d ep %d): holds it %d, ascending %d, "
                  "inside the world %d", grid_group_names[k], r, g.dp, g.pp, g.cp, g.tp, g.ep, holds, ordered, inside);
            if (!inside) continue;
            for (int i = 0; i < p.size; i++) {
                int s = rank_pattern_member(p, i);
                CHECK(same_pattern(grid_group(g, s, (GridGroup)k), p), "%s: rank %d's group is not its member %d's",
                      grid_group_names[k], r, s);
            }
            if (rank_pattern_member(p, 0) == r) {
                for (int i = 0; i < p.size; i++) covered[rank_pattern_member(p, i)]++;
            }
        }
        for (int r = 0; r < world; r++) {
            CHECK(covered[r] == 1, "%s groups (dp %d pp %d cp %d tp %d ep %d) cover rank %d %d times", grid_group_names[k],
                  g.dp, g.pp, g.cp, g.tp, g.ep, r, covered[r]);
        }
    }
    free(covered);
}

static void check_grid(void) {
    // rank 13 of dp 2 pp 2 cp 2 tp 2 (S = 8 a stage): tp 13 % 2 = 1, cp 13 / 2 % 2 = 0, dp 13 / 4 % 2 = 1,
    // stage 13 / 8 = 1, q = 13 % 8 = 5
    GridShape g = {2, 2, 2, 2, 4};
    const int tp[] = {12, 13}, cp[] = {13, 15}, pp[] = {5, 13}, dp[] = {9, 11, 13, 15}, emb[] = {5, 13};
    const int ep[] = {12, 13, 14, 15}, edp[] = {9, 13}, seq[] = {12, 13, 14, 15};
    check_members(g, 13, GRID_TP, tp, 2);
    check_members(g, 13, GRID_CP, cp, 2);
    check_members(g, 13, GRID_PP, pp, 2);
    check_members(g, 13, GRID_DP, dp, 4);      // stage 1, tp rank 1: the 4 replicas x cp ranks
    check_members(g, 13, GRID_EMBEDDING, emb, 2);
    check_members(g, 13, GRID_EP, ep, 4);      // q / ep = 1: the stage's ranks 4..7
    check_members(g, 13, GRID_EDP, edp, 2);    // q % ep = 1: stage ranks 1 and 5
    check_members(g, 13, GRID_SEQ, seq, 4);    // dp rank 1's cp x tp ranks
    // the edges: pp 3's middle stage and pp 1 have no embedding partner; ep 1 folds nothing
    GridShape g3 = {1, 3, 1, 2, 1};
    const int alone[] = {3}, ends[] = {0, 4}, stage[] = {2, 3};
    check_members(g3, 3, GRID_EMBEDDING, alone, 1);
    check_members(g3, 0, GRID_EMBEDDING, ends, 2);
    check_members(g3, 3, GRID_EP, alone, 1);
    check_members(g3, 3, GRID_EDP, stage, 2);
    GridShape g1 = {4, 1, 1, 2, 2};
    const int alone5[] = {5};
    check_members(g1, 5, GRID_EMBEDDING, alone5, 1);
    // every group of these grids: the 5D ones the tests run, tp, cp or ep alone, ep across dp
    const GridShape grids[] = {{2, 2, 2, 2, 4}, {2, 2, 1, 2, 2}, {2, 1, 2, 2, 4}, {1, 4, 2, 1, 1}, {3, 2, 1, 4, 6},
                               {1, 3, 1, 2, 1}, {4, 1, 1, 2, 2}, {1, 1, 1, 1, 1}, {2, 2, 4, 1, 8}};
    for (size_t i = 0; i < sizeof(grids) / sizeof(grids[0]); i++) {
        char why[256];
        CHECK(grid_shape_check(grids[i], why, sizeof(why)), "grid %zu refused: %s", i, why);
        check_partition(grids[i]);
    }
    char why[256] = "";
    GridShape bad = {2, 1, 1, 4, 3};
    CHECK(!grid_shape_check(bad, why, sizeof(why)) && strstr(why, "-ep 3") && strstr(why, "8 ranks"),
          "-ep 3 on a stage of 8 ranks: '%s'", why);
    GridShape zero = {0, 1, 1, 1, 1};
    CHECK(!grid_shape_check(zero, why, sizeof(why)) && strstr(why, "-dp 0"), "-dp 0: '%s'", why);
}

// ----------------------------------------------------------------------------------------------
// times

static void check_times(const DeviceProfile* p) {
    // nothing to do: a group of one, or no bytes
    for (int k = 0; k < COLL_KINDS; k++) {
        CollTime one = coll_time(p, (Collective)k, place(3, 1, 1, 8), 1e9);
        CollTime none = coll_time(p, (Collective)k, place(0, 1, 8, 8), 0.0);
        CHECK(one.seconds == 0.0 && none.seconds == 0.0, "%s: a group of 1 %g s, 0 bytes %g s", collective_names[k],
              one.seconds, none.seconds);
    }
    char what[160];
    // ring all-reduce over 2 ranks of a node: 2 steps of n/2, 2 alpha + n / beta
    CollTime t = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 2, 8), 1e8);
    CHECK_SECONDS(t.seconds, 2 * AI + 1e8 / BI, "2-rank all-reduce of 100 MB");
    CHECK(t.algo == COLL_ALGO_RING && t.steps == 2 && t.inter_seconds == 0.0, "2-rank all-reduce: %s, %d steps",
          coll_algo_names[t.algo], t.steps);
    t = coll_time(p, COLL_ALL_REDUCE, place(7, 1, 2, 8), 1e8);  // ranks 7 and 8: across
    CHECK_SECONDS(t.seconds, 2 * AE + 1e8 / BE, "2-rank all-reduce of 100 MB across nodes");

    // 8 ranks in one node against 16 over two, 800 MB: 2 (p - 1) steps of n / p
    CollTime one_node = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 8, 8), 8e8);
    CHECK_SECONDS(one_node.seconds, 14 * (AI + 1e8 / BI), "8 ranks in one node, 800 MB");
    CollTime two_nodes = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 16, 8), 8e8);
    CHECK_SECONDS(two_nodes.seconds, 30 * (AE + 5e7 / BE), "16 ranks over 2 nodes, 800 MB: every step at the inter-node pace");
    CHECK(two_nodes.algo == COLL_ALGO_RING && two_nodes.link == LINK_INTER_NODE && two_nodes.inter_seconds == two_nodes.seconds,
          "16 ranks over 2 nodes: %s over the %s link, %g s of %g across", coll_algo_names[two_nodes.algo],
          link_class_names[two_nodes.link], two_nodes.inter_seconds, two_nodes.seconds);
    CollTime wide_node = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 16, 16), 8e8);
    CHECK_SECONDS(wide_node.seconds, 30 * (AI + 5e7 / BI), "16 ranks in one node of 16, 800 MB");

    // tree against ring, 16 ranks over 2 nodes: a chain of 8 in each node, a tree of 2 nodes
    double tree8 = 2 * (7 * AI + 1 * AE) + 2 * 8 / BE, ring8 = 30 * (AE + 0.5 / BE);
    CHECK_SECONDS(all_reduce_tree_time(p, place(0, 1, 16, 8), 8).seconds, tree8, "tree, 8 bytes, 16 ranks over 2 nodes");
    CHECK_SECONDS(all_reduce_ring_time(p, place(0, 1, 16, 8), 8).seconds, ring8, "ring, 8 bytes, 16 ranks over 2 nodes");
    t = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 16, 8), 8);
    CHECK(t.algo == COLL_ALGO_TREE && close_to(t.seconds, tree8) && close_to(t.intra_seconds, 14 * AI),
          "8 bytes over 2 nodes: %s %g s (the tree, %g s; its chains %g s inside)", coll_algo_names[t.algo], t.seconds,
          tree8, 14 * AI);
    double ring1g = 30 * (AE + 6.25e7 / BE), tree1g = 2 * (7 * AI + 1 * AE) + 2 * 1e9 / BE;
    t = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 16, 8), 1e9);
    CHECK(t.algo == COLL_ALGO_RING && close_to(t.seconds, ring1g) && ring1g < tree1g,
          "1 GB over 2 nodes: %s %g s (the ring, %g s, the tree %g s)", coll_algo_names[t.algo], t.seconds, ring1g, tree1g);
    // a rank on each of 8 nodes: the textbook tree, 2 log2(8) alpha_e
    t = coll_time(p, COLL_ALL_REDUCE, place(0, 8, 8, 8), 8);
    CHECK(t.algo == COLL_ALGO_TREE && close_to(t.seconds, 2 * 3 * AE + 2 * 8 / BE),
          "8 bytes over 8 nodes, a rank each: %s %g s, by hand %g s", coll_algo_names[t.algo], t.seconds, 2 * 3 * AE + 2 * 8 / BE);
    // inside one node the tree is a chain, as slow as the ring in latency: the ring, even for 8 bytes
    t = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 8, 8), 8);
    CHECK(t.algo == COLL_ALGO_RING && close_to(t.seconds, 14 * (AI + 1 / BI)), "8 bytes in one node: %s %g s",
          coll_algo_names[t.algo], t.seconds);
    // the choice is the faster of the two at every size, and flips once from tree to ring
    int flips = 0;
    CollAlgo last = COLL_ALGO_NONE;
    for (double n = 8; n <= 1e9; n *= 2) {
        CollTime ring = all_reduce_ring_time(p, place(0, 1, 16, 8), n), tree = all_reduce_tree_time(p, place(0, 1, 16, 8), n);
        t = coll_time(p, COLL_ALL_REDUCE, place(0, 1, 16, 8), n);
        CHECK(t.seconds == (ring.seconds < tree.seconds ? ring.seconds : tree.seconds), "%g bytes: %g s, not the faster of "
              "ring %g and tree %g", n, t.seconds, ring.seconds, tree.seconds);
        if (last != COLL_ALGO_NONE && t.algo != last) flips++;
        last = t.algo;
    }
    CHECK(flips == 1 && last == COLL_ALGO_RING, "16 ranks over 2 nodes, 8 B to 1 GB: %d changes of algorithm, ending %s",
          flips, coll_algo_names[last]);

    // reduce-scatter and all-gather: p - 1 ring steps of n / p
    for (int k = COLL_REDUCE_SCATTER; k <= COLL_ALL_GATHER; k++) {
        snprintf(what, sizeof(what), "%s, 4 ranks of a node, 400 MB", collective_names[k]);
        CHECK_SECONDS(coll_time(p, (Collective)k, place(0, 1, 4, 8), 4e8).seconds, 3 * (AI + 1e8 / BI), what);
        snprintf(what, sizeof(what), "%s, 4 ranks on 4 nodes, 400 MB", collective_names[k]);
        CHECK_SECONDS(coll_time(p, (Collective)k, place(0, 8, 4, 8), 4e8).seconds, 3 * (AE + 1e8 / BE), what);
    }
    // broadcast: a pipelined chain, p - 1 latencies and the bytes once
    CHECK_SECONDS(coll_time(p, COLL_BROADCAST, place(0, 1, 4, 8), 4e8).seconds, 3 * AI + 4e8 / BI, "broadcast, 4 ranks, 400 MB");
    CHECK_SECONDS(coll_time(p, COLL_BROADCAST, place(0, 4, 4, 8), 4e8).seconds, 3 * AE + 4e8 / BE,
                  "broadcast, 4 ranks over 2 nodes, 400 MB");

    // all-to-all of 800 MB a rank over 8 ranks, 4 a node: 100 MB to each of 3 peers inside and 4 outside
    t = coll_time(p, COLL_ALL_TO_ALL, place(0, 1, 8, 4), 8e8);
    CHECK_SECONDS(t.seconds, 3 * (AI + 1e8 / BI) + 4 * (AE + 1e8 / BE), "all-to-all, half the group off the node");
    CHECK(close_to(t.intra_seconds, 3 * (AI + 1e8 / BI)) && t.steps == 7 && t.algo == COLL_ALGO_PAIRWISE,
          "all-to-all: %g s inside, %d steps", t.intra_seconds, t.steps);
    // 3 ranks, 2 a node: rank 2 is alone on its node, all its peers outside: the slowest
    CHECK_SECONDS(coll_time(p, COLL_ALL_TO_ALL, place(0, 1, 3, 2), 3e8).seconds, 2 * (AE + 1e8 / BE),
                  "all-to-all, 3 ranks, 2 a node: the rank alone on its node");
    CHECK_SECONDS(coll_time(p, COLL_ALL_TO_ALL, place(0, 1, 4, 8), 4e8).seconds, 3 * (AI + 1e8 / BI), "all-to-all in one node");

    // send: alpha + n / beta of the link between the two
    CHECK_SECONDS(coll_time(p, COLL_SEND_RECV, pair_placement(0, 1, 8), 1e8).seconds, AI + 1e8 / BI, "send inside a node");
    CHECK_SECONDS(coll_time(p, COLL_SEND_RECV, pair_placement(7, 8, 8), 1e8).seconds, AE + 1e8 / BE, "send across nodes");

    // overlap
    CHECK(comm_exposed(3.0, 5.0) == 0.0 && comm_exposed(5.0, 3.0) == 2.0 && comm_exposed(4.0, 0.0) == 4.0,
          "exposed: 3 under 5 %g, 5 under 3 %g, 4 under nothing %g", comm_exposed(3.0, 5.0), comm_exposed(5.0, 3.0),
          comm_exposed(4.0, 0.0));
    CHECK(collective_of_name("all-reduce") == COLL_ALL_REDUCE && collective_of_name("send") == COLL_SEND_RECV &&
          collective_of_name("all-to-all") == COLL_ALL_TO_ALL && collective_of_name("copy") == COLL_KINDS,
          "collective names (llmc/step_kernels.h's)");
}

// a CPU profile's measured all-reduce, a + n / b over 2 ranks (a 4 us, b 1 GB/s)
static void check_measured(void) {
    char text[sizeof(ROUND_LINKS) + 200];
    snprintf(text, sizeof(text), "%sintra_node_allreduce_latency_s 4e-6\nintra_node_allreduce_bandwidth_bytes_per_s 1e9\n",
             ROUND_LINKS);
    DeviceProfile p = load_profile(text, "round numbers, measured all-reduce");
    // itself at p = 2 (efficiency_link 0.5 not applied: the line is what was reached)
    CHECK_SECONDS(coll_time(&p, COLL_ALL_REDUCE, place(0, 1, 2, 8), 1e6).seconds, 4e-6 + 1e6 / 1e9,
                  "measured all-reduce, 2 ranks, 1 MB");
    // 4 ranks: 6 steps of a / 2 and n / 4
    CHECK_SECONDS(coll_time(&p, COLL_ALL_REDUCE, place(0, 1, 4, 8), 4e6).seconds, 6 * (2e-6 + 1e6 / 1e9),
                  "measured all-reduce, 4 ranks, 4 MB");
    // across nodes, and other collectives, the profile's links
    CHECK_SECONDS(coll_time(&p, COLL_ALL_REDUCE, place(0, 1, 4, 2), 4e6).seconds, 6 * (AE + 1e6 / BE),
                  "4 ranks over 2 nodes, 4 MB: the inter-node link");
    CHECK_SECONDS(coll_time(&p, COLL_REDUCE_SCATTER, place(0, 1, 4, 8), 4e6).seconds, 3 * (AI + 1e6 / BI),
                  "reduce-scatter beside a measured all-reduce");
}

// the built-in h100-sxm: 8 GPUs of a node, 1 GB, at NVLink's 450 GB/s a direction x 0.8 and 2 us
static void check_builtin(void) {
    DeviceProfile p;
    char why[2048];  // (room for a profile line of 511 characters in a message)
    CHECK(device_profile_load("h100-sxm", &p, why, sizeof(why)), "h100-sxm: %s", why);
    CHECK_SECONDS(coll_time(&p, COLL_ALL_REDUCE, place(0, 1, 8, p.gpus_per_node), 1e9).seconds,
                  14 * (2e-6 + 1.25e8 / (450e9 * 0.8)), "h100-sxm, 8 GPUs, 1 GB all-reduce");
    CHECK_SECONDS(coll_time(&p, COLL_SEND_RECV, pair_placement(0, 8, p.gpus_per_node), 1e9).seconds,
                  5e-6 + 1e9 / (50e9 * 0.8), "h100-sxm, a send of 1 GB to the next node");
}

// each rank's groups, one line a rank: "rank R tp {..} cp {..} ..."
static int print_groups(int argc, char** argv) {
    GridShape g;
    if (argc != 7 || sscanf(argv[2], "%d", &g.dp) != 1 || sscanf(argv[3], "%d", &g.pp) != 1 ||
        sscanf(argv[4], "%d", &g.cp) != 1 || sscanf(argv[5], "%d", &g.tp) != 1 || sscanf(argv[6], "%d", &g.ep) != 1) {
        fprintf(stderr, "usage: %s -groups DP PP CP TP EP\n", argv[0]);
        return 1;
    }
    char why[256];
    if (!grid_shape_check(g, why, sizeof(why))) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }
    for (int r = 0; r < grid_world(g); r++) {
        printf("rank %d", r);
        for (int k = 0; k < GRID_GROUPS; k++) {
            RankPattern p = grid_group(g, r, (GridGroup)k);
            printf(" %s {", grid_group_names[k]);
            for (int i = 0; i < p.size; i++) printf("%s%d", i ? "," : "", rank_pattern_member(p, i));
            printf("}");
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "-groups") == 0) return print_groups(argc, argv);
    DeviceProfile p = load_profile(ROUND_LINKS, "round numbers");
    check_placement();
    check_grid();
    check_times(&p);
    check_measured();
    check_builtin();
    if (failures) {
        printf("%d checks failed\n", failures);
        return 1;
    }
    printf("comm_time ok\n");
    return 0;
}
