// cuda_emu: the part of the driver API (cuda.h) this project uses: tensor maps for Hopper's TMA.
// cuTensorMapEncodeTiled checks its arguments against the driver's documented rules (answering
// CUDA_ERROR_INVALID_VALUE, as the driver does, and saying which rule on stderr, which it does not)
// and stores what the emulator's TMA copies need (cuda_runtime.h's TensorMap) in the map's 128
// bytes. Emulated: no interleave, no swizzle, element strides of 1, zeros out of bounds; anything
// else is refused with a message.
#ifndef CUDA_EMU_CUDA_H
#define CUDA_EMU_CUDA_H

#include <cuda_runtime.h>

typedef enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 } CUresult;
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef struct alignas(64) CUtensorMap_st { cuuint64_t opaque[16]; } CUtensorMap;
// (the enums' values are the driver's)
typedef enum {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_UINT16, CU_TENSOR_MAP_DATA_TYPE_UINT32,
    CU_TENSOR_MAP_DATA_TYPE_INT32, CU_TENSOR_MAP_DATA_TYPE_UINT64, CU_TENSOR_MAP_DATA_TYPE_INT64,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
    CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ
} CUtensorMapDataType;
typedef enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0, CU_TENSOR_MAP_INTERLEAVE_16B, CU_TENSOR_MAP_INTERLEAVE_32B } CUtensorMapInterleave;
typedef enum {
    CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_128B
} CUtensorMapSwizzle;
typedef enum {
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0, CU_TENSOR_MAP_L2_PROMOTION_L2_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B
} CUtensorMapL2promotion;
typedef enum { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0, CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA } CUtensorMapFloatOOBfill;

namespace cuda_emu {
static inline CUresult tensor_map_refused(const char* why) {
    fprintf(stderr, "cuda_emu: cuTensorMapEncodeTiled: %s\n", why);
    return CUDA_ERROR_INVALID_VALUE;
}
}  // namespace cuda_emu

static inline CUresult cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                              void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
                                              const cuuint32_t* boxDim, const cuuint32_t* elementStrides,
                                              CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                              CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
    using cuda_emu::tensor_map_refused;
    (void)l2Promotion;  // (where L2 fetches start: speed only)
    static const uint32_t bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    if ((uintptr_t)tensorMap % 64 != 0) return tensor_map_refused("the map is not 64-byte aligned");
    if ((unsigned)tensorDataType > CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ) return tensor_map_refused("unknown data type");
    if (tensorRank < 1 || tensorRank > 5) return tensor_map_refused("rank outside 1..5");
    if ((uintptr_t)globalAddress % 16 != 0) return tensor_map_refused("the global address is not 16-byte aligned");
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || swizzle != CU_TENSOR_MAP_SWIZZLE_NONE ||
        oobFill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        return tensor_map_refused("interleave, swizzle and the NaN fill are not emulated");
    cuda_emu::TensorMap m = {};
    m.magic = cuda_emu::tensor_map_magic;
    m.base = (const unsigned char*)globalAddress;
    m.rank = tensorRank;
    m.element_bytes = bytes[tensorDataType];
    m.strides[0] = m.element_bytes;
    for (uint32_t i = 0; i < tensorRank; i++) {
        if (globalDim[i] == 0 || globalDim[i] > (1ull << 32)) return tensor_map_refused("a dimension is 0 or over 2^32");
        if (boxDim[i] == 0 || boxDim[i] > 256) return tensor_map_refused("a box dimension is 0 or over 256");
        if (elementStrides[i] != 1) return tensor_map_refused("element strides other than 1 are not emulated");
        if (i > 0 && (globalStrides[i - 1] % 16 != 0 || globalStrides[i - 1] >= (1ull << 40)))
            return tensor_map_refused("a stride is not a multiple of 16 bytes below 2^40");
        m.dims[i] = globalDim[i];
        m.box[i] = boxDim[i];
        if (i > 0) m.strides[i] = globalStrides[i - 1];
    }
    if (boxDim[0] * m.element_bytes % 16 != 0) return tensor_map_refused("a box row is not a multiple of 16 bytes");
    static_assert(sizeof(m) <= sizeof(CUtensorMap), "the emulator's tensor map is over 128 bytes");
    memset(tensorMap, 0, sizeof(*tensorMap));
    memcpy(tensorMap, &m, sizeof(m));
    return CUDA_SUCCESS;
}

// the runtime's way to the driver's functions without linking libcuda (cuda_runtime_api.h on a GPU)
typedef enum { cudaEnableDefault = 0 } cudaGetDriverEntryPointFlags;
typedef enum {
    cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1, cudaDriverEntryPointVersionNotSufficent = 2
} cudaDriverEntryPointQueryResult;
static inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                           unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
    (void)cudaVersion, (void)flags;
    int found = strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
    *funcPtr = found ? (void*)&cuTensorMapEncodeTiled : NULL;
    if (status) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

#endif
