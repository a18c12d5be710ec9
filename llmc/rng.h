// A small deterministic random number generator (xorshift64*, Vigna 2014) and Box-Muller normals.
// Its whole state is one uint64, so a checkpoint can save it and a resume continues the stream.
#ifndef LLMC_RNG_H
#define LLMC_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t state;
} Rng;

static inline void rng_init(Rng* rng, uint64_t seed) {
    // splitmix64 of the seed, so nearby seeds give unrelated streams; the state must not be 0
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    rng->state = (z ^ (z >> 31)) | 1ull;
}

static inline uint64_t rng_u64(Rng* rng) {
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

// uniform in [0, 1) with 24 random bits
static inline float rng_uniform(Rng* rng) { return (float)(rng_u64(rng) >> 40) / 16777216.0f; }

static inline void rng_normal_fill(Rng* rng, float* out, size_t n, float mean, float std) {
    for (size_t i = 0; i < n; i += 2) {
        // Box-Muller: two uniforms give two independent standard normals
        double u1 = ((double)(rng_u64(rng) >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
        double u2 = (double)(rng_u64(rng) >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1));
        out[i] = mean + std * (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n) out[i + 1] = mean + std * (float)(r * sin(6.283185307179586 * u2));
    }
}

#endif
