// What the trainer has allocated on the device, counted by the device layer at every
// device_malloc and device_free: the bytes held now and the high-water mark, which the trainers
// print beside their predicted memory. (Only the trainer's own buffers: not cuBLAS's or NCCL's
// internal ones, nor the CUDA context.)
#ifndef LLMC_ALLOCATIONS_H
#define LLMC_ALLOCATIONS_H

#include <stddef.h>
#include <stdint.h>
#include "utils.h"

#define MAX_DEVICE_ALLOCATIONS 1024

typedef struct {
    uintptr_t ptrs[MAX_DEVICE_ALLOCATIONS];  // the live allocations (their addresses) and sizes
    size_t sizes[MAX_DEVICE_ALLOCATIONS];
    int count;
    size_t now, peak;  // bytes held now; the most held at once
} DeviceAllocations;

static DeviceAllocations device_allocations;

// (by address: a uintptr_t, so that no compiler takes the fresh, unwritten memory for an input)
static inline void allocation_add(uintptr_t p, size_t bytes) {
    DeviceAllocations* a = &device_allocations;
    if (a->count == MAX_DEVICE_ALLOCATIONS) fail("more than %d device allocations at once", MAX_DEVICE_ALLOCATIONS);
    a->ptrs[a->count] = p;
    a->sizes[a->count++] = bytes;
    a->now += bytes;
    a->peak = a->now > a->peak ? a->now : a->peak;
}

static inline void allocation_remove(const void* p) {
    DeviceAllocations* a = &device_allocations;
    for (int i = a->count - 1; i >= 0; i--) {
        if (a->ptrs[i] != (uintptr_t)p) continue;
        a->now -= a->sizes[i];
        a->ptrs[i] = a->ptrs[--a->count];
        a->sizes[i] = a->sizes[a->count];
        return;
    }
}

// the high-water mark of the trainer's device allocations so far
static inline size_t device_allocated_peak(void) { return device_allocations.peak; }

#endif
