// The device layer on CUDA: checked allocation, copies, memset and synchronization. Kernels run
// on the default stream; the comm layer orders its own stream against it with events.
#ifndef LLMC_CUDA_DEVICE_CUH
#define LLMC_CUDA_DEVICE_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "../precision.h"
#include "../target.h"
#include "../utils.h"
#include "../allocations.h"

#define BACKEND_NAME "cuda"

// every CUDA call is checked; a failure names the file, the line and CUDA's error string
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error %d at %s:%d", (int)status, file, line);
}
// after a kernel launch: a bad launch configuration shows up here, not later
#define cudaCheckLaunch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

static inline int ceil_div(size_t a, size_t b) { return (int)((a + b - 1) / b); }

// A mark on the compute stream's timeline: the time between two marks is the time the GPU spent
// on the work queued between them (kernel_times.h), read after the marks have been passed
typedef cudaEvent_t DeviceMark;
static inline void device_mark_create(DeviceMark* m) { cudaCheck(cudaEventCreate(m)); }
static inline void device_mark_record(DeviceMark* m) { cudaCheck(cudaEventRecord(*m, 0)); }
static inline double device_marks_seconds(const DeviceMark* from, const DeviceMark* to) {
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, *from, *to));
    return ms * 1e-3;
}
#include "../kernel_times.h"

static inline void* device_malloc(size_t bytes) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) fail("cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(err));
    allocation_add((uintptr_t)p, bytes);
    return p;
}
static inline void device_free(void* p) {
    allocation_remove(p);
    cudaCheck(cudaFree(p));
}
static inline void device_memset_zero(void* p, size_t bytes) {
    int kernel_span = kernel_time_begin("memset", 0, 0);
    cudaCheck(cudaMemset(p, 0, bytes));
    kernel_time_end(kernel_span);
}
// the direction of a copy comes from the pointers (unified addressing), so that a "device"
// buffer may also be host memory: the optimizer state is, with -offload
static inline void copy_host_to_device(void* dst, const void* src, size_t bytes) {
    int kernel_span = kernel_time_begin("copy host to device", 0, 0);
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    kernel_time_end(kernel_span);
}
static inline void copy_device_to_host(void* dst, const void* src, size_t bytes) {
    int kernel_span = kernel_time_begin("copy device to host", 0, 0);
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    kernel_time_end(kernel_span);
}
static inline void copy_device_to_device(void* dst, const void* src, size_t bytes) {
    int kernel_span = kernel_time_begin("copy device to device", 0, 0);
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    kernel_time_end(kernel_span);
}
static inline void device_synchronize(void) { cudaCheck(cudaDeviceSynchronize()); }

// Host memory for what the device reads and writes often (-offload's optimizer state): pinned
// (page-locked), so that the GPU's copy engines move it at full PCIe speed and asynchronously
static inline void* host_malloc_pinned(size_t bytes) {
    void* p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess) fail("cudaMallocHost of %zu bytes of pinned host memory failed: %s", bytes, cudaGetErrorString(err));
    return p;
}
static inline void host_free_pinned(void* p) { cudaCheck(cudaFreeHost(p)); }

// Copies that run behind the host: device to host on a copy stream of their own, after all the
// compute stream has queued so far (so they overlap the kernels queued after them), each with an
// event to wait for; host to device on the compute stream, before the kernels and collectives
// queued after them (the source must stay untouched until then: pinned and not reused in a step)
typedef struct {
    cudaEvent_t queued, copied;  // created on first use
} DeviceCopy;
static cudaStream_t device_copy_stream;
static inline void copy_device_to_host_async(void* dst, const void* src, size_t bytes, DeviceCopy* done) {
    if (device_copy_stream == NULL) cudaCheck(cudaStreamCreateWithFlags(&device_copy_stream, cudaStreamNonBlocking));
    if (done->queued == NULL) {
        cudaCheck(cudaEventCreateWithFlags(&done->queued, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&done->copied, cudaEventDisableTiming));
    }
    cudaCheck(cudaEventRecord(done->queued, 0));
    cudaCheck(cudaStreamWaitEvent(device_copy_stream, done->queued, 0));
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, device_copy_stream));
    cudaCheck(cudaEventRecord(done->copied, device_copy_stream));
}
static inline void device_copy_wait(DeviceCopy* done) {
    if (done->copied) cudaCheck(cudaEventSynchronize(done->copied));
}
static inline void device_copy_free(DeviceCopy* done) {
    if (done->queued) cudaEventDestroy(done->queued);
    if (done->copied) cudaEventDestroy(done->copied);
}
static inline void copy_host_to_device_async(void* dst, const void* src, size_t bytes) {
    int kernel_span = kernel_time_begin("copy host to device", 0, 0);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, 0));
    kernel_time_end(kernel_span);
}

// Copies to the device of what the host prepares each micro-batch (the tokens, the encoder
// backward's buckets) go through pinned memory: from pageable memory cudaMemcpy first waits for
// all the device's queued work and then copies through a driver buffer, while a copy from pinned
// memory is queued on the compute stream like a kernel and the host runs on. The pinned buffer
// must stay untouched until the copy has run, so taking it again first waits for the event
// recorded after its last copy (in a training step that copy was queued a micro-batch earlier,
// and the host rarely runs that far ahead: on the last stage it waits for each loss).
typedef struct {
    void* host;          // pinned, `bytes` long
    size_t bytes;
    cudaEvent_t copied;  // recorded after the last copy from `host`
} HostStage;
static inline void* host_stage_take(HostStage* s, size_t bytes) {
    if (s->copied == NULL) cudaCheck(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming));
    cudaCheck(cudaEventSynchronize(s->copied));  // (an event never recorded is complete)
    if (bytes > s->bytes) {
        if (s->host != NULL) host_free_pinned(s->host);
        s->host = host_malloc_pinned(bytes);
        s->bytes = bytes;
    }
    return s->host;
}
// the first `bytes` of the stage to dst, in order with the kernels queued after it
static inline void host_stage_to_device(HostStage* s, void* dst, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, s->host, bytes, cudaMemcpyHostToDevice, 0));
    cudaCheck(cudaEventRecord(s->copied, 0));
}
static inline void host_stage_free(HostStage* s) {
    if (s->host != NULL) host_free_pinned(s->host);
    if (s->copied != NULL) cudaEventDestroy(s->copied);
    s->host = NULL, s->bytes = 0, s->copied = NULL;
}

// the dense peak of this GPU for floatX matmuls, from NVIDIA's datasheets, and which part it
// was taken for. One compute capability covers parts of different speeds: sm_90 is the H100 SXM
// and the H200 (132 SMs: 989 TFLOP/s bf16, 67 fp32), the H100 NVL (835, 60) and the H100 PCIe
// (114 SMs: 756, 51). A100 (sm_80): 312 bf16, 19.5 fp32. Other GPUs: 0 (no MFU is printed).
typedef struct {
    const char* part;
    double flops;
} DevicePeak;
static inline DevicePeak device_peak(void) {
    int dev;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    DevicePeak none = {NULL, 0.0};
    if (prop.major == 9 && prop.minor == 0) {
        if (strstr(prop.name, "PCIe") || prop.multiProcessorCount == 114) {
            DevicePeak p = {"H100 PCIe", FLOATX_IS_FLOAT ? 51e12 : 756e12};
            return p;
        }
        if (strstr(prop.name, "NVL")) {
            DevicePeak p = {"H100 NVL", FLOATX_IS_FLOAT ? 60e12 : 835e12};
            return p;
        }
        DevicePeak p = {"H100 SXM / H200", FLOATX_IS_FLOAT ? 67e12 : 989e12};
        return p;
    }
    if (prop.major == 8 && prop.minor == 0) {
        DevicePeak p = {"A100", FLOATX_IS_FLOAT ? 19.5e12 : 312e12};
        return p;
    }
    return none;
}

// memory in use on the device, by this process and any other
static inline size_t device_memory_used(void) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

// what the trainer may still allocate on this GPU (llmc/memory.h)
static inline size_t device_memory_available(void) {
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

// fp32 host values to floatX device values and back, converted on the host in chunks
#define CONVERT_CHUNK (1 << 20)
static inline void copy_floats_to_device(floatX* dst, const float* src, size_t n) {
    if (FLOATX_IS_FLOAT) { copy_host_to_device(dst, src, n * sizeof(float)); return; }
    floatX* tmp = (floatX*)malloc_check(CONVERT_CHUNK * sizeof(floatX));
    for (size_t i = 0; i < n; i += CONVERT_CHUNK) {
        size_t m = n - i < CONVERT_CHUNK ? n - i : CONVERT_CHUNK;
        for (size_t j = 0; j < m; j++) tmp[j] = (floatX)src[i + j];
        copy_host_to_device(dst + i, tmp, m * sizeof(floatX));
    }
    free(tmp);
}
static inline void copy_device_to_floats(float* dst, const floatX* src, size_t n) {
    if (FLOATX_IS_FLOAT) { copy_device_to_host(dst, src, n * sizeof(float)); return; }
    floatX* tmp = (floatX*)malloc_check(CONVERT_CHUNK * sizeof(floatX));
    for (size_t i = 0; i < n; i += CONVERT_CHUNK) {
        size_t m = n - i < CONVERT_CHUNK ? n - i : CONVERT_CHUNK;
        copy_device_to_host(tmp, src + i, m * sizeof(floatX));
        for (size_t j = 0; j < m; j++) dst[i + j] = (float)tmp[j];
    }
    free(tmp);
}

// The time one kind of work takes inside a step (the trainers time recomputation): spans begun
// and ended around it, their sum read and reset once the device has finished the step. The GPU
// runs behind the host, so each span is a pair of events on the compute stream, timed after the
// step's device_synchronize.
typedef struct {
    cudaEvent_t* events;  // begin, end of each span
    int count, capacity;
} DeviceSpans;
static inline void device_span_record(DeviceSpans* s) {
    if (s->count == s->capacity) {
        int cap = s->capacity ? 2 * s->capacity : 64;
        s->events = (cudaEvent_t*)realloc(s->events, (size_t)cap * sizeof(cudaEvent_t));
        if (s->events == NULL) fail("out of host memory for %d timing events", cap);
        for (int i = s->capacity; i < cap; i++) cudaCheck(cudaEventCreate(&s->events[i]));
        s->capacity = cap;
    }
    cudaCheck(cudaEventRecord(s->events[s->count++], 0));
}
static inline void device_span_begin(DeviceSpans* s) { device_span_record(s); }
static inline void device_span_end(DeviceSpans* s) { device_span_record(s); }
static inline double device_spans_collect(DeviceSpans* s) {
    double total = 0.0;
    for (int i = 0; i + 1 < s->count; i += 2) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, s->events[i], s->events[i + 1]));
        total += ms * 1e-3;
    }
    s->count = 0;
    return total;
}

// a device scratch buffer that grows on demand (kernels that need temporary space share it
// only within one launcher call)
typedef struct {
    void* ptr;
    size_t bytes;
} DeviceScratch;
static inline void* scratch_get(DeviceScratch* s, size_t bytes) {
    if (s->bytes < bytes) {
        if (s->ptr) device_free(s->ptr);
        AllocationKind was = allocation_kind(ALLOC_KERNELS);  // (mid-step, between others' allocations)
        s->ptr = device_malloc(bytes);
        allocation_kind(was);
        s->bytes = bytes;
    }
    return s->ptr;
}

// 16 bytes of floatX (8 bf16 or 4 fp32): one load or store instruction for memory-bound kernels,
// which then move 4-8x fewer, wider transactions. The pointer must be 16-byte aligned: rows of C
// channels are when C is a multiple of 8, as every model here has (C = 64 x heads or 64 x L).
#define PACK16 (16 / (int)sizeof(floatX))
typedef struct __align__(16) { floatX v[PACK16]; } Pack16;
__device__ inline Pack16 load16(const floatX* p) { return *(const Pack16*)p; }
__device__ inline void store16(floatX* p, Pack16 x) { *(Pack16*)p = x; }
// a launcher of Pack16 kernels checks that its row length or element count n divides into packs
static inline void check_whole_packs(const char* op, const char* what, size_t n) {
    if (n % PACK16 != 0) fail("%s: %s = %zu is not a multiple of %d", op, what, n, PACK16);
}

// warp-level sum and max: every lane ends with the result
__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

#endif
