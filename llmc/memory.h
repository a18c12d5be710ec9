// Will it fit? Before a trainer allocates, it adds up what each rank will hold and compares it
// with what this machine (or container, or batch job) can still give, so that a batch too large
// is a message naming the numbers rather than a kill by the out-of-memory killer mid-run.
//   host memory   the kernel's MemAvailable, lowered to what the process's memory cgroup still
//                 allows (its limit minus its usage, page cache that can be dropped not counted),
//                 at every level of the cgroup tree above the process, v1 or v2
//   GPU memory    cudaMemGetInfo's free bytes
// Ranks on one machine (CPU) or one GPU share it: the need is per rank x those ranks.
#ifndef LLMC_MEMORY_H
#define LLMC_MEMORY_H

#include "ops.h"
#include "utils.h"

// the number after `key` in a file of "key value" lines, or the first number when key is NULL;
// 0 when the file or the key is missing or the value is not a number ("max")
static inline size_t read_size_from(const char* path, const char* key) {
    FILE* f = fopen(path, "r");
    if (f == NULL) return 0;
    char line[256];
    unsigned long long value = 0;
    size_t klen = key ? strlen(key) : 0;
    while (fgets(line, sizeof(line), f)) {
        if (key == NULL || (strncmp(line, key, klen) == 0 && line[klen] == ' ')) {
            if (sscanf(line + klen, " %llu", &value) != 1) value = 0;
            break;
        }
    }
    fclose(f);
    return (size_t)value;
}

// what the cgroup at `dir` still allows, lowering *available; v2 and v1 file names differ
static inline void cgroup_lower(const char* dir, int v2, size_t* available) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    size_t limit = read_size_from(path, NULL);
    snprintf(path, sizeof(path), "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    size_t used = read_size_from(path, NULL);
    snprintf(path, sizeof(path), "%s/memory.stat", dir);
    size_t cache = read_size_from(path, v2 ? "inactive_file" : "total_inactive_file");
    used = used > cache ? used - cache : 0;
    if (limit > 0 && limit > used && limit - used < *available) *available = limit - used;
    if (limit > 0 && limit <= used) *available = 0;
}

static inline size_t host_memory_available(void) {
    size_t available = read_size_from("/proc/meminfo", "MemAvailable:") * 1024;  // kB there
    if (available == 0) return 0;  // unknown: no check
    FILE* f = fopen("/proc/self/cgroup", "r");
    char line[4096];
    while (f && fgets(line, sizeof(line), f)) {
        // "0::/path" (v2) or "4:memory:/path" (v1, maybe "memory,other")
        char* first = strchr(line, ':');
        char* second = first ? strchr(first + 1, ':') : NULL;
        if (!second) continue;
        line[strcspn(line, "\n")] = '\0';
        int v2 = second == first + 1;
        *second = '\0';
        if (!v2 && strstr(first + 1, "memory") == NULL) continue;
        char dir[4096];
        // from the process's own cgroup up to the root of the hierarchy
        snprintf(dir, sizeof(dir), "%s%s", v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory", second + 1);
        size_t root_len = strlen(v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
        for (;;) {
            cgroup_lower(dir, v2, &available);
            char* slash = strrchr(dir, '/');
            if (slash == NULL || (size_t)(slash - dir) < root_len) break;
            *slash = '\0';
        }
    }
    if (f) fclose(f);
    return available;
}

// stops every rank when device_bytes (+ host_bytes of host buffers) per rank, times the ranks
// sharing that memory, exceeds what is available; `layout` says what the user can lower
static inline void memory_check(const char* name, size_t need, size_t available, int ranks_sharing,
                                const char* layout, const char* unit) {
    size_t total = mul_check(need, (size_t)ranks_sharing, "memory per rank x ranks");
    // every rank checks at the same point: printed once where all fail alike (check_every_rank)
    check_every_rank(available == 0 || total <= available, "not enough memory: %.2f GB per rank (%s) x %d ranks sharing "
                     "it = %.2f GB, but %s is %.2f GB. Lower the batch, or use fewer ranks per %s", need / 1e9, layout,
                     ranks_sharing, total / 1e9, name, available / 1e9, unit);
}

static inline void memory_check_fits(size_t device_bytes, size_t host_bytes, int ranks_sharing,
                                     const char* layout) {
#ifdef __CUDACC__
    memory_check("free GPU memory", device_bytes, device_memory_available(), ranks_sharing, layout, "GPU");
    // host buffers: every rank on this machine (ranks_sharing counts those on one GPU)
    memory_check("host memory (MemAvailable, cgroup)", host_bytes, host_memory_available(), 1, layout, "machine");
#else  // "device" buffers are host memory too
    memory_check("host memory (MemAvailable, cgroup)", device_bytes + host_bytes,
                 host_memory_available(), ranks_sharing, layout, "machine");
#endif
}

#endif
