// Unit test of the CPU gradient norm (llmc/cpu/adamw.h): reads float32 values from a file and
// prints the sum of their squares as global_norm_squared computes it, for run_tests.py to compare
// with an exact sum (Python's math.fsum). The result must be the float nearest the exact value.
//   test_norm VALUES.f32
#include "llmc/utils.h"
#include "llmc/cpu/adamw.h"

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: test_norm VALUES.f32");
    FILE* f = fopen_check(argv[1], "rb");
    size_t n = (size_t)file_size_check(f, argv[1]) / sizeof(float);
    float* values = (float*)malloc_check(n * sizeof(float));
    fread_check(values, sizeof(float), n, f, argv[1]);
    fclose(f);
    printf("sum of squares %.9g\n", global_norm_squared(values, n));
    free(values);
    return 0;
}
