// cuda_emu: the WMMA API (warp-level matrix multiply on tensor cores) for 16 x 16 x 16 tiles.
// On a GPU a fragment is spread over the 32 lanes of a warp in an unspecified way; here every
// lane holds the whole tile (row-major in x), and each lane computes the same product. Code that
// treats fragments as opaque, as it must, behaves the same. The _sync operations begin with a
// warp barrier, as on a GPU, so that no lane stores a tile before every lane has loaded it. The alignment rules of the API
// (32-byte pointers, ldm a multiple of 16 bytes) are checked, since a GPU faults on them.
#ifndef CUDA_EMU_MMA_H
#define CUDA_EMU_MMA_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace nvcuda {
namespace wmma {

struct matrix_a;
struct matrix_b;
struct accumulator;
struct row_major;
struct col_major;
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct shape;
template <int M, int N, int K> struct shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    enum { rows = shape<Use, M, N, K>::rows, cols = shape<Use, M, N, K>::cols, num_elements = rows * cols };
    T x[num_elements];
};

template <class T> static inline void check_access(const T* p, unsigned ldm, const char* what) {
    if ((uintptr_t)p % 32 != 0 || ldm * sizeof(T) % 16 != 0) cuda_emu::die(what);
}
#define CUDA_EMU_WMMA_CHECK(p, ldm, op)                                                       \
    cuda_emu::barrier(cuda_emu::AT_WARP_BARRIER);                                             \
    check_access(p, ldm, op ": pointer not 32-byte aligned, or ldm not a multiple of 16 bytes")

template <class Use, int M, int N, int K, class T>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, const T* p, unsigned ldm) {
    CUDA_EMU_WMMA_CHECK(p, ldm, "wmma::load_matrix_sync");
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.x[r * f.cols + c] = p[(size_t)r * ldm + c];
}
template <class Use, int M, int N, int K, class T>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, const T* p, unsigned ldm) {
    CUDA_EMU_WMMA_CHECK(p, ldm, "wmma::load_matrix_sync");
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.x[r * f.cols + c] = p[(size_t)c * ldm + r];
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
    CUDA_EMU_WMMA_CHECK(p, ldm, "wmma::load_matrix_sync");
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++)
            f.x[r * f.cols + c] = layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
template <int M, int N, int K>
static inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    CUDA_EMU_WMMA_CHECK(p, ldm, "wmma::store_matrix_sync");
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++)
            (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[r * f.cols + c];
}
template <class Use, int M, int N, int K, class T, class Layout, class V>
static inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, V v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}
// d = a b + c, products and sums in fp32
template <int M, int N, int K, class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                            const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    cuda_emu::barrier(cuda_emu::AT_WARP_BARRIER);
    float out[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = c.x[i * N + j];
            for (int k = 0; k < K; k++) acc += (float)a.x[i * K + k] * (float)b.x[k * N + j];
            out[i * N + j] = acc;
        }
    memcpy(d.x, out, sizeof(out));
}

}  // namespace wmma
}  // namespace nvcuda

#endif
