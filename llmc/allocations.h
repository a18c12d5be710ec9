// What the trainer has allocated on the device, counted by the device layer at every
// device_malloc and device_free: the bytes held now and the high-water mark, which the trainers
// print beside their predicted memory. (Only the trainer's own buffers: not cuBLAS's or NCCL's
// internal ones, nor the CUDA context.)
//
// Each allocation is also counted under a kind: the row of the memory table (memory_plan.h) it
// belongs to. The allocating code names the kind before it allocates,
//     allocation_kind(ALLOC_GRADIENTS);
//     grads = device_malloc(...);
// and every allocation until the next allocation_kind counts under it. So each row of the table
// can be checked against what was measured for it (LLMC_MEMORY_MEASURED=1 prints both), not only
// the total against the high-water mark.
#ifndef LLMC_ALLOCATIONS_H
#define LLMC_ALLOCATIONS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"

#define MAX_DEVICE_ALLOCATIONS 1024

// the memory table's rows that are buffers (its sums, "model states", "activations" and "total",
// are not); ALLOC_UNTAGGED: allocated before any kind was named (none should be)
typedef enum {
    ALLOC_UNTAGGED, ALLOC_PARAMETERS, ALLOC_GRADIENTS, ALLOC_MASTER, ALLOC_ADAMW, ALLOC_LAYERS, ALLOC_RECOMPUTED,
    ALLOC_HEAD, ALLOC_BACKWARD, ALLOC_COMM, ALLOC_EXPERTS, ALLOC_OUTER, ALLOC_KERNELS, ALLOC_FILE_GATHER, ALLOC_KINDS
} AllocationKind;
// each kind's name: the label of its row in the memory table
static const char* const allocation_kind_names[ALLOC_KINDS] = {
    "untagged", "parameters", "gradients", "master weights", "AdamW m, v", "layers", "recomputed",
    "head", "backward", "comm buffers", "experts", "outer state", "kernel scratch", "file gather"};

typedef struct {
    // the live allocations: address, bytes, kind. One block may count under several kinds (an
    // activation arena's parts): then it has an entry for each, at the same address
    uintptr_t ptrs[MAX_DEVICE_ALLOCATIONS];
    size_t sizes[MAX_DEVICE_ALLOCATIONS];
    AllocationKind kinds[MAX_DEVICE_ALLOCATIONS];
    int count;
    size_t now, peak;                  // bytes held now; the most held at once
    AllocationKind kind;               // what the next allocations count under
    size_t next_parts[ALLOC_KINDS];    // (allocation_parts_of_next)
    size_t now_of[ALLOC_KINDS];        // each kind's bytes held now,
    size_t peak_of[ALLOC_KINDS];       // the most it held at once,
    size_t at_peak_of[ALLOC_KINDS];    // and what it held at a moment the total was at its peak
} DeviceAllocations;

static DeviceAllocations device_allocations;

// what the next allocations count under; returns the kind it replaces (to put back, for code
// that allocates on demand between others' allocations: the CUDA kernels' scratch)
static inline AllocationKind allocation_kind(AllocationKind kind) {
    AllocationKind was = device_allocations.kind;
    device_allocations.kind = kind;
    return was;
}

static inline void allocation_entry(uintptr_t p, size_t bytes, AllocationKind kind) {
    DeviceAllocations* a = &device_allocations;
    if (a->count == MAX_DEVICE_ALLOCATIONS) fail("more than %d device allocations at once", MAX_DEVICE_ALLOCATIONS);
    a->ptrs[a->count] = p;
    a->sizes[a->count] = bytes;
    a->kinds[a->count++] = kind;
    a->now_of[kind] += bytes;
    if (a->now_of[kind] > a->peak_of[kind]) a->peak_of[kind] = a->now_of[kind];
}

// the next allocation is one block of several rows (an activation arena's parts): bytes_of[k] of
// it count under kind k, the rest under the current kind
static inline void allocation_parts_of_next(const size_t bytes_of[ALLOC_KINDS]) {
    memcpy(device_allocations.next_parts, bytes_of, sizeof(device_allocations.next_parts));
}

// (by address: a uintptr_t, so that no compiler takes the fresh, unwritten memory for an input)
static inline void allocation_add(uintptr_t p, size_t bytes) {
    DeviceAllocations* a = &device_allocations;
    size_t rest = bytes;
    for (int k = 0; k < ALLOC_KINDS; k++) {
        if (a->next_parts[k] == 0) continue;
        if (a->next_parts[k] > rest) fail("allocation_parts_of_next: parts beyond the block's %zu bytes", bytes);
        allocation_entry(p, a->next_parts[k], (AllocationKind)k);
        rest -= a->next_parts[k];
        a->next_parts[k] = 0;
    }
    if (rest > 0 || bytes == 0) allocation_entry(p, rest, a->kind);
    a->now += bytes;
    if (a->now > a->peak) {
        a->peak = a->now;
        memcpy(a->at_peak_of, a->now_of, sizeof(a->now_of));
    }
}

static inline void allocation_remove(const void* p) {
    DeviceAllocations* a = &device_allocations;
    for (int i = a->count - 1; i >= 0; i--) {  // (every entry of the block)
        if (a->ptrs[i] != (uintptr_t)p) continue;
        a->now -= a->sizes[i];
        a->now_of[a->kinds[i]] -= a->sizes[i];
        a->count--;
        a->ptrs[i] = a->ptrs[a->count];
        a->sizes[i] = a->sizes[a->count];
        a->kinds[i] = a->kinds[a->count];
    }
}

// the high-water mark of the trainer's device allocations so far
static inline size_t device_allocated_peak(void) { return device_allocations.peak; }

#endif
