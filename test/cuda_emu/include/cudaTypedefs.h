// cuda_emu: the driver functions' pointer types (cudaTypedefs.h), for those cuda.h emulates
#ifndef CUDA_EMU_CUDA_TYPEDEFS_H
#define CUDA_EMU_CUDA_TYPEDEFS_H

#include <cuda.h>

typedef CUresult (*PFN_cuTensorMapEncodeTiled_v12000)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                                      CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                                      CUtensorMapFloatOOBfill);

#endif
