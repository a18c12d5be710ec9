// Unit test of llmc/comm.h: every collective against values computed in closed form.
// Run under mpirun with any number of ranks; prints "comm ok" on success, exits non-zero if not.
// The same source builds for the CUDA backend (nvcc -x cu): buffers then live on the GPU and the
// collectives go through NCCL (or the host-staged path); `dev` below is that device buffer.
#include <math.h>
#include "llmc/comm.h"
#include "llmc/ops.h"

static void expect(int ok, const char* what, int i, float got, float want) {
    if (!ok) fail("%s: element %d is %g, expected %g", what, i, got, want);
}

static float* dev;  // device copy of the buffer a collective works on (4 * N floats)

static void up(const float* host, size_t n) { copy_host_to_device(dev, host, n * sizeof(float)); }
static void down(float* host, size_t n) { copy_device_to_host(host, dev, n * sizeof(float)); }

int main(int argc, char** argv) {
    CommGroup world;
    comm_init(&world, &argc, &argv);
    int r = world.rank, p = world.size;
    enum { N = 1000 };
    float buf[N], big[4 * N], out[4 * N];
    if (p > 4) fail("test_comm supports up to 4 ranks");
    dev = (float*)device_malloc(8 * N * sizeof(float));
    float* dev_out = dev + 4 * N;

    // all-reduce: element i holds r + i on rank r
    for (int i = 0; i < N; i++) buf[i] = (float)(r + i);
    up(buf, N);
    comm_all_reduce(&world, dev, N, COMM_FLOAT, COMM_SUM);
    down(buf, N);
    for (int i = 0; i < N; i++) {
        float want = (float)(p * i + p * (p - 1) / 2);
        expect(buf[i] == want, "all_reduce sum", i, buf[i], want);
    }
    if (world.calls[COMM_ALL_REDUCE] != 1 || world.bytes[COMM_ALL_REDUCE] != N * 4) {
        fail("counters after one all_reduce of %d floats: %lld calls, %lld bytes", N,
             world.calls[COMM_ALL_REDUCE], world.bytes[COMM_ALL_REDUCE]);
    }
    for (int i = 0; i < N; i++) buf[i] = (float)(r + i);
    up(buf, N);
    comm_all_reduce(&world, dev, N, COMM_FLOAT, COMM_AVG);
    down(buf, N);
    for (int i = 0; i < N; i++) {
        float want = (float)i + (float)(p - 1) / 2.0f;
        expect(fabsf(buf[i] - want) <= 1e-5f * want + 1e-6f, "all_reduce avg", i, buf[i], want);
    }
    for (int i = 0; i < N; i++) buf[i] = (float)((r * 7 + i) % p);
    up(buf, N);
    comm_all_reduce(&world, dev, N, COMM_FLOAT, COMM_MAX);
    down(buf, N);
    for (int i = 0; i < N; i++) {
        float want = (float)(p - 1);
        expect(buf[i] == want, "all_reduce max", i, buf[i], want);
    }

    // reduce-scatter: input j on rank r is r * 10 + j; rank r keeps block r of the sum
    for (int j = 0; j < p * N; j++) big[j] = (float)(r * 10 + j);
    up(big, (size_t)p * N);
    comm_reduce_scatter(&world, dev, dev_out, N, COMM_FLOAT, COMM_SUM);
    copy_device_to_host(out, dev_out, N * sizeof(float));
    for (int i = 0; i < N; i++) {
        float want = (float)(10 * p * (p - 1) / 2 + p * (r * N + i));
        expect(out[i] == want, "reduce_scatter sum", i, out[i], want);
    }
    comm_reduce_scatter(&world, dev, dev_out, N, COMM_FLOAT, COMM_AVG);
    copy_device_to_host(out, dev_out, N * sizeof(float));
    for (int i = 0; i < N; i++) {
        float want = (float)(10 * p * (p - 1) / 2 + p * (r * N + i)) / (float)p;
        expect(fabsf(out[i] - want) <= 1e-5f * want, "reduce_scatter avg", i, out[i], want);
    }

    // all-gather: rank r contributes r * 1000 + i
    for (int i = 0; i < N; i++) buf[i] = (float)(r * 1000 + i);
    up(buf, N);
    comm_all_gather(&world, dev, dev_out, N, COMM_FLOAT);
    copy_device_to_host(out, dev_out, (size_t)p * N * sizeof(float));
    for (int j = 0; j < p * N; j++) {
        float want = (float)((j / N) * 1000 + j % N);
        expect(out[j] == want, "all_gather", j, out[j], want);
    }

    // broadcast from the last rank
    for (int i = 0; i < N; i++) buf[i] = r == p - 1 ? (float)(3 * i) : -1.0f;
    up(buf, N);
    comm_broadcast(&world, dev, N * sizeof(float), p - 1);
    down(buf, N);
    for (int i = 0; i < N; i++) expect(buf[i] == (float)(3 * i), "broadcast", i, buf[i], (float)(3 * i));

    // a ring: each rank sends to the right and receives from the left, in one exchange
    for (int i = 0; i < N; i++) buf[i] = (float)(r * N + i);
    up(buf, N);
    CommMessage ring[2] = {comm_message(dev, N, (r + 1) % p, 1), comm_message(dev_out, N, (r + p - 1) % p, 0)};
    comm_exchange(&world, ring, 2, COMM_FLOAT);
    copy_device_to_host(out, dev_out, N * sizeof(float));
    for (int i = 0; i < N; i++) {
        float want = (float)(((r + p - 1) % p) * N + i);
        expect(out[i] == want, "exchange", i, out[i], want);
    }
    // plain send/recv: rank 0 sends to the last rank
    if (p > 1) {
        if (r == 0) {
            for (int i = 0; i < N; i++) buf[i] = (float)(5 * i);
            up(buf, N);
            comm_send(&world, dev, N, COMM_FLOAT, p - 1);
        } else if (r == p - 1) {
            comm_recv(&world, dev_out, N, COMM_FLOAT, 0);
            copy_device_to_host(out, dev_out, N * sizeof(float));
            for (int i = 0; i < N; i++) expect(out[i] == (float)(5 * i), "send/recv", i, out[i], (float)(5 * i));
        }
    }

    // split into even and odd ranks; the sum of ranks within each group
    CommGroup parity;
    comm_split(&parity, &world, r % 2, r, "parity");
    int expected_size = (p + 1 - r % 2) / 2;
    if (parity.size != expected_size || parity.rank != r / 2) {
        fail("split: rank %d got group rank %d of %d, expected %d of %d", r, parity.rank,
             parity.size, r / 2, expected_size);
    }
    float s = (float)r, want = 0.0f;
    for (int q = r % 2; q < p; q += 2) want += (float)q;
    comm_all_reduce_scalar(&parity, &s, COMM_SUM);
    expect(s == want, "all_reduce on a split group", 0, s, want);
    if (parity.calls[COMM_ALL_REDUCE] != 1) fail("split group counters: each group counts its own calls");
    comm_group_free(&parity);

    comm_barrier(&world);
    device_free(dev);
    if (r == 0) printf("comm ok on %d ranks (%s)\n", p, BACKEND_NAME);
    comm_finalize();
    return 0;
}
