// The CPU benchmarks' timer (as dev/cuda's TIME_KERNEL is the kernels'): seconds per call of
// `call`, the best of 3 rounds of `reps` calls after one to warm up. The best round, because a
// shared machine only ever adds time to a round.
#ifndef DEV_BENCH_BEST_SECONDS_H
#define DEV_BENCH_BEST_SECONDS_H

#include <math.h>
#include "llmc/utils.h"

#define BEST_SECONDS(seconds_out, reps, call) do {                           \
    call;                                                                    \
    double best_ = 1e30;                                                     \
    for (int round_ = 0; round_ < 3; round_++) {                             \
        double t0_ = wall_time_s();                                          \
        for (int r_ = 0; r_ < (reps); r_++) call;                            \
        best_ = fmin(best_, (wall_time_s() - t0_) / (reps));                 \
    }                                                                        \
    (seconds_out) = best_;                                                   \
} while (0)

#endif
