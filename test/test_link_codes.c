// Unit test of the link's int8 and e3m0 codes (llmc/precision.h, the CPU passes of
// llmc/cpu/outer.h) that DiLoCo's -outer_dtype int8 / e3m0 sends between workers.
//   test_link_codes                      the edge values, each code written out from the format's
//                                        definition (llmc/precision.h's comment); prints "link codes ok"
//   test_link_codes BITS IN.f32 OUT.f32  one piece of values coded (its scale, then its codes) and
//                                        read back, as they arrive: run_tests.py compares them with
//                                        test/reference.py's link_round, written from the definition
#include <float.h>
#include <math.h>
#include "llmc/utils.h"
#include "llmc/cpu/outer.h"

static int failures = 0;

// x coded against scale must give `want`, and read back `back` (NAN: not checked)
static void expect(int bits, float x, float scale, unsigned want, float back, const char* why) {
    unsigned code = link_code(x, scale, bits);
    float value = link_value(code, scale, bits);
    if (code != want || (!isnan(back) && value != back)) {
        printf("FAIL %s: %s x = %a, scale %a: code %u (want %u), read back %a (want %a)\n", why, bits == 8 ? "int8" : "e3m0",
               x, scale, code, want, value, back);
        failures++;
    }
}

// the scale a worker's first pass finds for n values (outer - theta with theta = 0: the values)
static float scale_of(const float* values, size_t n) {
    float* zeros = (float*)calloc(n, sizeof(float));
    float scale;
    link_scale(&scale, values, zeros, NULL, n);
    free(zeros);
    return scale;
}

static void edge_values(void) {
    const int E = LINK_E3M0_BITS, I = LINK_INT8_BITS;
    float t2 = 1.0f * (1.41421356f * 4.0f / 256.0f);  // level 2's threshold at scale 1: 2^-5.5 as an fp32
    // e3m0 at scale 1: the levels 2^-6 .. 1, sign in bit 3
    expect(E, 0.0f, 1.0f, 0, 0.0f, "zero");
    expect(E, -0.0f, 1.0f, 0, 0.0f, "negative zero codes as zero");
    expect(E, 1.0f, 1.0f, 7, 1.0f, "the largest (the scale itself)");
    expect(E, -1.0f, 1.0f, 15, -1.0f, "the largest, negative");
    expect(E, -0.125f, 1.0f, 8 | 4, -0.125f, "a level, negative: 2^-3");
    expect(E, 0.72f, 1.0f, 7, 1.0f, "nearest in log space: log2 0.72 = -0.47 (in value 0.5 is nearer)");
    expect(E, 0.70f, 1.0f, 6, 0.5f, "nearest in log space: log2 0.70 = -0.51");
    expect(E, t2, 1.0f, 2, 0.03125f, "on a threshold, the upper level");
    expect(E, nextafterf(t2, 0.0f), 1.0f, 1, 0.015625f, "just below a threshold, the lower");
    expect(E, 0.0078125f, 1.0f, 1, 0.015625f, "2^-7, half the smallest level: up to it");
    expect(E, nextafterf(0.0078125f, 0.0f), 1.0f, 0, 0.0f, "below half the smallest level: zero");
    expect(E, 1e-40f, 1.0f, 0, 0.0f, "a denormal value at scale 1: zero");
    // a denormal scale, 2^-140: the levels 2^-146 .. 2^-140 are denormals too, each exact
    float tiny = ldexpf(1.0f, -140);
    expect(E, tiny, tiny, 7, tiny, "a denormal scale: its largest");
    expect(E, -ldexpf(1.0f, -143), tiny, 8 | 4, -ldexpf(1.0f, -143), "a denormal scale: 2^-143, negative");
    expect(E, ldexpf(1.0f, -146), tiny, 1, ldexpf(1.0f, -146), "a denormal scale: its smallest level");
    expect(E, ldexpf(1.0f, -149), tiny, 0, 0.0f, "a denormal scale: the smallest float, below half a level");
    // the largest float as the scale
    expect(E, FLT_MAX, FLT_MAX, 7, FLT_MAX, "the largest float");
    expect(E, -FLT_MAX / 8, FLT_MAX, 8 | 4, -FLT_MAX / 8, "the largest float / 8, negative");
    // a piece of zeros: scale 0, every code 0
    expect(E, 0.0f, 0.0f, 0, 0.0f, "scale 0");
    expect(I, 0.0f, 0.0f, 0, 0.0f, "scale 0");
    // int8 at scale 127: steps of 1 ((x / 127) 127, rounded), two's complement
    expect(I, 127.0f, 127.0f, 0x7f, 127.0f, "the largest");
    expect(I, -127.0f, 127.0f, 0x81, -127.0f, "the largest, negative");
    expect(I, 5.0f, 127.0f, 5, NAN, "5 steps");
    expect(I, -6.0f, 127.0f, 0xfa, NAN, "6 steps, negative");
    expect(I, 0.49f, 127.0f, 0, 0.0f, "below half a step");
    expect(I, 1e-40f, 127.0f, 0, 0.0f, "a denormal value");
    // x = scale / 2: (1/2) 127 = 63.5 exactly, a tie, to the even 64; negative alike
    expect(I, 0.5f, 1.0f, 64, 64.0f / 127.0f, "a tie rounds to even");
    expect(I, -0.5f, 1.0f, 0xc0, -64.0f / 127.0f, "a tie, negative");
    // a denormal scale: 3 2^-149 (its step, scale / 127, would round to 0); 2^-149 is a third of it,
    // 42.3 steps, which read back as the nearest float to (42/127) 3 2^-149: 2^-149 again
    float smallest = ldexpf(1.0f, -149), scale3 = 3.0f * smallest;
    expect(I, smallest, scale3, 42, smallest, "a denormal scale below 127 times the smallest float");
    expect(I, 0.0f, scale3, 0, 0.0f, "zero at a denormal scale");
    expect(I, -scale3, scale3, 0x81, -scale3, "a denormal scale: its largest, negative");
    expect(I, FLT_MAX, FLT_MAX, 0x7f, NAN, "the largest float");
    float back = link_value(0x7f, FLT_MAX, I);
    if (!isfinite(back) || fabsf(back - FLT_MAX) > FLT_MAX * 1e-6f) {
        printf("FAIL int8: the largest float read back as %a\n", back), failures++;
    }
    // the scale: the largest |x| (its sign dropped), and any NaN or infinity shows in it
    float some[4] = {0.5f, -3.0f, 2.0f, 1e-40f}, with_nan[3] = {1.0f, NAN, 2.0f}, with_inf[3] = {1.0f, -INFINITY, 2.0f};
    if (scale_of(some, 4) != 3.0f) printf("FAIL the scale of {0.5, -3, 2, 1e-40} is %g, not 3\n", scale_of(some, 4)), failures++;
    if (!isnan(scale_of(with_nan, 3))) printf("FAIL a NaN does not show in the scale\n"), failures++;
    if (!isinf(scale_of(with_inf, 3))) printf("FAIL an infinity does not show in the scale\n"), failures++;
}

int main(int argc, char** argv) {
    if (argc == 1) {
        edge_values();
        if (failures) fail("%d edge values coded wrongly", failures);
        printf("link codes ok\n");
        return 0;
    }
    if (argc != 4) fail("usage: test_link_codes [BITS IN.f32 OUT.f32]");
    int bits = atoi(argv[1]);
    if (bits != LINK_INT8_BITS && bits != LINK_E3M0_BITS) fail("BITS %s: expected 8 (int8) or 4 (e3m0)", argv[1]);
    FILE* f = fopen_check(argv[2], "rb");
    size_t n = (size_t)file_size_check(f, argv[2]) / sizeof(float);
    float* values = (float*)malloc_check(n * sizeof(float));
    fread_check(values, sizeof(float), n, f, argv[2]);
    fclose(f);
    // the piece as one message: its scale (two words), then its codes
    size_t k = 16 / (size_t)bits;
    uint16_t* message = (uint16_t*)calloc(2 + (n + k - 1) / k, sizeof(uint16_t));
    float* zeros = (float*)calloc(n, sizeof(float));
    link_scale((float*)message, values, zeros, NULL, n);
    if (!isfinite(*(float*)message)) fail("%s: a non-finite value, no scale codes it", argv[2]);
    link_quantize(message + 2, (float*)message, values, zeros, NULL, n, bits);
    for (size_t i = 0; i < n; i++) values[i] = link_read(message, 0, 2, i, bits);
    f = fopen_check(argv[3], "wb");
    fwrite_check(values, sizeof(float), n, f, argv[3]);
    fclose_check(f, argv[3]);
    free(values), free(message), free(zeros);
    return 0;
}
