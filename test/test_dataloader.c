// Unit test of llmc/dataloader.h under mpirun: over two epochs, the ranks' micro-batches cover
// every global batch exactly once, each micro-batch is a contiguous run of the file with targets
// shifted by one, and with shuffling each epoch visits every global batch once in a new order.
//   test_dataloader B T ACCUM SHUFFLE
#include <unistd.h>
#include "llmc/comm.h"
#include "llmc/dataloader.h"

#define NUM_TOKENS 20001  // token i of the file is i: a token names its own position

int main(int argc, char** argv) {
    CommGroup world;
    comm_init(&world, &argc, &argv);
    if (argc != 5) fail("usage: test_dataloader B T ACCUM SHUFFLE");
    int B = atoi(argv[1]), T = atoi(argv[2]), accum = atoi(argv[3]), shuffle = atoi(argv[4]);
    int r = world.rank, p = world.size;
    char path[64];
    snprintf(path, sizeof(path), "test/tmp/dataloader_%d.bin", (int)getppid());
    if (r == 0) {
        int header[256] = {TOKENS_MAGIC, TOKENS_VERSION, NUM_TOKENS};
        FILE* f = fopen_check(path, "wb");
        fwrite_check(header, sizeof(int), 256, f, path);
        for (int i = 0; i < NUM_TOKENS; i++) {
            uint16_t t = (uint16_t)i;
            fwrite_check(&t, sizeof(t), 1, f, path);
        }
        fclose_check(f, path);
    }
    comm_barrier(&world);

    DataLoader dl;
    dataloader_init(&dl, path, B, T, p * accum, shuffle, 7);
    size_t G = (size_t)B * T * p * accum, nb = dl.batches_per_epoch;
    if (nb != (NUM_TOKENS - 1) / G) fail("batches per epoch %zu, expected %zu", nb, (size_t)(NUM_TOKENS - 1) / G);
    int chunks = p * accum;  // B*T-token chunks per global batch
    float* mine = (float*)malloc_check((size_t)accum * sizeof(float));
    float* all = (float*)malloc_check((size_t)chunks * sizeof(float));
    char* seen_chunk = (char*)malloc_check((size_t)chunks);
    char* seen_batch = (char*)malloc_check(nb);
    size_t* first_epoch = (size_t*)malloc_check(nb * sizeof(size_t));
    int same_order = 1;
    for (int epoch = 0; epoch < 2; epoch++) {
        memset(seen_batch, 0, nb);
        for (size_t step = 0; step < nb; step++) {
            for (int a = 0; a < accum; a++) {
                dataloader_load_chunk(&dl, a * p + r, 65536);  // DDP's layout
                for (int i = 0; i < B * T; i++) {
                    if (dl.inputs[i] != dl.inputs[0] + i || dl.targets[i] != dl.inputs[i] + 1) {
                        fail("micro-batch %d of step %zu is not contiguous at %d", a, step, i);
                    }
                }
                mine[a] = (float)dl.inputs[0];  // positions < 2^24 are exact in a float
            }
            dataloader_advance(&dl);
            // gather every rank's chunk starts; rank q's micro a lands at q*accum + a
            comm_all_gather(&world, mine, all, (size_t)accum, COMM_FLOAT);
            size_t base = (size_t)all[0] - ((size_t)all[0] % G);
            if (base / G >= nb || seen_batch[base / G]) fail("global batch at %zu repeated or out of range", base);
            seen_batch[base / G] = 1;
            if (epoch == 0) first_epoch[step] = base;
            else if (first_epoch[step] != base) same_order = 0;
            memset(seen_chunk, 0, (size_t)chunks);
            for (int j = 0; j < chunks; j++) {
                size_t start = (size_t)all[j];
                if (start < base || start >= base + G || (start - base) % ((size_t)B * T) != 0) {
                    fail("chunk at %zu is not inside global batch [%zu, %zu)", start, base, base + G);
                }
                size_t c = (start - base) / ((size_t)B * T);
                if (seen_chunk[c]) fail("chunk %zu of the global batch at %zu read twice", c, base);
                seen_chunk[c] = 1;
                int q = j / accum, a = j % accum;  // rank q, micro-step a reads chunk a*p + q
                if ((int)c != a * p + q) fail("rank %d micro %d read chunk %zu, expected %d", q, a, c, a * p + q);
            }
            if (!shuffle && base != step * G) fail("unshuffled step %zu read batch at %zu", step, base);
        }
    }
    if (shuffle && nb > 2 && same_order) fail("shuffling gave the same order in two epochs");
    if (!shuffle && !same_order) fail("without shuffling the two epochs differ");
    comm_barrier(&world);
    if (r == 0) {
        remove(path);
        printf("dataloader ok: %d ranks, B=%d T=%d accum=%d shuffle=%d, %zu batches x 2 epochs\n", p, B, T, accum, shuffle, nb);
    }
    dataloader_free(&dl);
    comm_finalize();
    return 0;
}
