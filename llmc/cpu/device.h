// The device layer on the CPU: "device" memory is host memory, copies are memcpy. The CUDA
// backend gives the same functions over cudaMalloc/cudaMemcpy, so trainers call only these.
#ifndef LLMC_CPU_DEVICE_H
#define LLMC_CPU_DEVICE_H

#include <string.h>
#include "../precision.h"
#include "../utils.h"
#include "../allocations.h"

// A mark on the device's timeline (kernel_times.h): on the CPU the device is the caller, so a mark
// is the wall time when it is recorded
typedef double DeviceMark;
static inline void device_mark_create(DeviceMark* m) { *m = 0.0; }
static inline void device_mark_record(DeviceMark* m) { *m = wall_time_s(); }
static inline double device_marks_seconds(const DeviceMark* from, const DeviceMark* to) { return *to - *from; }
#include "../kernel_times.h"

#define BACKEND_NAME "cpu"

static inline void* device_malloc(size_t bytes) {
    void* p = malloc_check(bytes);
    allocation_add((uintptr_t)p, bytes);
    return p;
}
static inline void device_free(void* p) {
    allocation_remove(p);
    free(p);
}
static inline void device_memset_zero(void* p, size_t bytes) {
    int kernel_span = kernel_time_begin("memset", 0, 0);
    memset(p, 0, bytes);
    kernel_time_end(kernel_span);
}
static inline void copy_host_to_device(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void copy_device_to_host(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void copy_device_to_device(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static inline void device_synchronize(void) {}

// Host memory for what the device reads and writes often (-offload's optimizer state): pinned on
// CUDA, so that copies run at full speed and asynchronously; plain memory here
static inline void* host_malloc_pinned(size_t bytes) { return malloc_check(bytes); }
static inline void host_free_pinned(void* p) { free(p); }

// Copies that run behind the host on CUDA (a copy stream), each with its completion to wait for;
// on the CPU they are done when called
typedef struct {
    int unused;
} DeviceCopy;
static inline void copy_device_to_host_async(void* dst, const void* src, size_t bytes, DeviceCopy* done) {
    (void)done;
    memcpy(dst, src, bytes);
}
static inline void device_copy_wait(DeviceCopy* done) { (void)done; }
static inline void device_copy_free(DeviceCopy* done) { (void)done; }
static inline void copy_host_to_device_async(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
// What the host prepares for the device each micro-batch: pinned memory and an asynchronous copy
// on CUDA; here a buffer and memcpy
typedef struct {
    void* host;
    size_t bytes;
} HostStage;
static inline void* host_stage_take(HostStage* s, size_t bytes) {
    if (bytes > s->bytes) {
        free(s->host);
        s->host = malloc_check(bytes);
        s->bytes = bytes;
    }
    return s->host;
}
static inline void host_stage_to_device(HostStage* s, void* dst, size_t bytes) { memcpy(dst, s->host, bytes); }
static inline void host_stage_free(HostStage* s) {
    free(s->host);
    s->host = NULL, s->bytes = 0;
}
// MFU and memory figures are printed for GPUs only
typedef struct {
    const char* part;
    double flops;
} DevicePeak;
static inline DevicePeak device_peak(void) {
    DevicePeak none = {NULL, 0.0};
    return none;
}
static inline size_t device_memory_used(void) { return 0; }

// The time one kind of work takes inside a step (the trainers time recomputation): spans begun
// and ended around it, their sum read and reset once the device has finished the step. On the
// CPU the device is the caller, so a span is wall time.
typedef struct {
    double started, total;
} DeviceSpans;
static inline void device_span_begin(DeviceSpans* s) { s->started = wall_time_s(); }
static inline void device_span_end(DeviceSpans* s) { s->total += wall_time_s() - s->started; }
static inline double device_spans_collect(DeviceSpans* s) {
    double total = s->total;
    s->total = 0.0;
    return total;
}
// fp32 host values to floatX device values and back (floatX is float on the CPU)
static inline void copy_floats_to_device(floatX* dst, const float* src, size_t n) { memcpy(dst, src, n * sizeof(float)); }
static inline void copy_device_to_floats(float* dst, const floatX* src, size_t n) { memcpy(dst, src, n * sizeof(float)); }

#endif
