// Unit test of llmc/dataloader.h under mpirun: over two epochs, the ranks' micro-batches cover
// every global batch exactly once, each micro-batch is a contiguous run of the file with targets
// shifted by one, and with shuffling each epoch visits every global batch once in a new order.
// Then the same tokens cut into 3 shards of unequal sizes (a glob, and a comma list out of order)
// give every chunk the one file gives, and the position (shard, offset) of each global batch is
// where its first token lies in the shards.
//   test_dataloader B T ACCUM SHUFFLE
#include <unistd.h>
#include "llmc/comm.h"
#include "llmc/dataloader.h"

#define NUM_TOKENS 20001  // token i of the file is i: a token names its own position

// a token file holding tokens first .. first+count-1 (token i is stream position i)
static void write_token_file(const char* path, int first, int count) {
    int header[256] = {TOKENS_MAGIC, TOKENS_VERSION, count};
    FILE* f = fopen_check(path, "wb");
    fwrite_check(header, sizeof(int), 256, f, path);
    for (int i = first; i < first + count; i++) {
        uint16_t t = (uint16_t)i;
        fwrite_check(&t, sizeof(t), 1, f, path);
    }
    fclose_check(f, path);
}

// over two epochs, `sharded` reads every chunk that `whole` reads, and says where each batch starts
static void check_shards_equal_one_file(DataLoader* whole, DataLoader* sharded, const int* sizes, int accum, int rank,
                                        int ranks) {
    if (sharded->num_tokens != whole->num_tokens || sharded->batches_per_epoch != whole->batches_per_epoch) {
        fail("shards '%s': %zu tokens in %zu batches, the one file %zu in %zu", sharded->spec, sharded->num_tokens,
             sharded->batches_per_epoch, whole->num_tokens, whole->batches_per_epoch);
    }
    size_t n = (size_t)whole->B * whole->T;
    dataloader_seek(whole, 0);
    dataloader_seek(sharded, 0);
    for (size_t step = 0; step < 2 * whole->batches_per_epoch; step++) {
        for (int a = 0; a < accum; a++) {
            dataloader_load_chunk(whole, a * ranks + rank, 65536);
            dataloader_load_chunk(sharded, a * ranks + rank, 65536);
            if (memcmp(whole->inputs, sharded->inputs, n * sizeof(int)) != 0 ||
                memcmp(whole->targets, sharded->targets, n * sizeof(int)) != 0) {
                fail("shards '%s': step %zu micro %d differs from the one file", sharded->spec, step, a);
            }
        }
        // the batch's first token is its own stream position: find its shard from the sizes
        dataloader_load_chunk(whole, 0, 65536);
        size_t at = (size_t)whole->inputs[0], offset = at;
        int shard = 0;
        while (offset >= (size_t)sizes[shard]) offset -= (size_t)sizes[shard++];
        int got_shard;
        size_t got_offset;
        dataloader_position(sharded, &got_shard, &got_offset);
        if (got_shard != shard || got_offset != offset) {
            fail("step %zu starts at token %zu, in shard %d at offset %zu; the loader says shard %d offset %zu", step, at,
                 shard, offset, got_shard, got_offset);
        }
        dataloader_advance(whole);
        dataloader_advance(sharded);
    }
}

int main(int argc, char** argv) {
    CommGroup world;
    comm_init(&world, &argc, &argv);
    if (argc != 5) fail("usage: test_dataloader B T ACCUM SHUFFLE");
    int B = atoi(argv[1]), T = atoi(argv[2]), accum = atoi(argv[3]), shuffle = atoi(argv[4]);
    int r = world.rank, p = world.size;
    char path[64];
    snprintf(path, sizeof(path), "test/tmp/dataloader_%d.bin", (int)getppid());
    // the shards: unequal, one shorter than a global batch (so batches cross two boundaries)
    const int sizes[3] = {NUM_TOKENS / 3 + 17, 5, NUM_TOKENS - NUM_TOKENS / 3 - 22};
    char shard_paths[3][80], glob_spec[80], list_spec[260];
    for (int s = 0; s < 3; s++) snprintf(shard_paths[s], sizeof(shard_paths[s]), "test/tmp/dataloader_%d_shard_%d.bin", (int)getppid(), s);
    snprintf(glob_spec, sizeof(glob_spec), "test/tmp/dataloader_%d_shard_*.bin", (int)getppid());
    snprintf(list_spec, sizeof(list_spec), "%s,%s,%s", shard_paths[2], shard_paths[0], shard_paths[1]);  // sorted on reading
    if (r == 0) {
        write_token_file(path, 0, NUM_TOKENS);
        for (int s = 0, first = 0; s < 3; first += sizes[s++]) write_token_file(shard_paths[s], first, sizes[s]);
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
    DataLoader globbed, listed;
    dataloader_init(&globbed, glob_spec, B, T, p * accum, shuffle, 7);
    dataloader_init(&listed, list_spec, B, T, p * accum, shuffle, 7);
    if (globbed.num_shards != 3 || strcmp(globbed.shards[1], shard_paths[1]) != 0 ||
        strcmp(listed.shards[0], shard_paths[0]) != 0 || strcmp(listed.shards[2], shard_paths[2]) != 0) {
        fail("the shards are not read in sorted order");
    }
    check_shards_equal_one_file(&dl, &globbed, sizes, accum, r, p);
    check_shards_equal_one_file(&dl, &listed, sizes, accum, r, p);
    comm_barrier(&world);
    if (r == 0) {
        remove(path);
        for (int s = 0; s < 3; s++) remove(shard_paths[s]);
        printf("dataloader ok: %d ranks, B=%d T=%d accum=%d shuffle=%d, %zu batches x 2 epochs, 3 shards alike\n", p, B, T, accum, shuffle, nb);
    }
    dataloader_free(&dl);
    dataloader_free(&globbed);
    dataloader_free(&listed);
    comm_finalize();
    return 0;
}
