// The same matrix product, C = A @ B (n x n, row-major, n a multiple of 64), on CUDA
// cores in FP32 and on tensor cores in TF32 and BF16 (FP32 accumulation throughout).
// Launched by matmul.py (CuPy, compiled with -lineinfo). The three kernels share one
// plan: a block computes a 64 x 64 tile of C, walking along K in slices that the whole
// block first copies into shared memory. They differ in who does the multiply-adds.

#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

#define BM 64
#define BN 64

// FP32 on CUDA cores. 256 threads, each computes a 4 x 4 patch of the tile with FFMA
// instructions: 16 multiply-adds for every 8 values it reads from shared memory.
#define SK 16
extern "C" __global__ void sgemm_simt(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int n) {
    __shared__ float As[BM][SK + 1];  // +1: no bank conflicts when reading a column
    __shared__ __align__(16) float Bs[SK][BN];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < n; k0 += SK) {
        {   // each thread copies 4 floats of A's slice (64 x 16) and 4 of B's (16 x 64)
            const int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 4;
            const float4 a = *reinterpret_cast<const float4*>(&A[(size_t)(row0 + r) * n + k0 + c]);
            As[r][c] = a.x; As[r][c + 1] = a.y; As[r][c + 2] = a.z; As[r][c + 3] = a.w;
            const int rb = threadIdx.x / 16, cb = (threadIdx.x % 16) * 4;
            *reinterpret_cast<float4*>(&Bs[rb][cb]) =
                *reinterpret_cast<const float4*>(&B[(size_t)(k0 + rb) * n + col0 + cb]);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[ty * 4 + i][k];
                b[i] = Bs[k][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) C[(size_t)(row0 + ty * 4 + i) * n + col0 + tx * 4 + j] = acc[i][j];
}

// Tensor cores through WMMA: 4 warps, each computes a 32 x 32 quarter of the tile as
// 2 x 2 fragments of 16 x 16. One mma_sync multiplies a 16 x K_FRAG slice of A by a
// K_FRAG x 16 slice of B on the tensor cores. The slices in shared memory are padded by
// 8 elements per row (16 or 32 bytes), which keeps the fragment loads conflict-free.
#define TK 32  // K per shared-memory slice

// BF16 inputs (fragments of 16 x 16 x 16).
extern "C" __global__ void gemm_wmma_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                                          float* __restrict__ C, int n) {
    __shared__ __align__(32) __nv_bfloat16 As[BM][TK + 8];
    __shared__ __align__(32) __nv_bfloat16 Bs[TK][BN + 8];
    const int warp = threadIdx.x / 32;
    const int wr = (warp / 2) * 32, wc = (warp % 2) * 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < n; k0 += TK) {
        // 128 threads copy A's 64 x 32 and B's 32 x 64 slices, 8 values (16 bytes) at a time
        for (int v = threadIdx.x; v < BM * TK / 8; v += blockDim.x) {
            const int r = v / (TK / 8), c = (v % (TK / 8)) * 8;
            *reinterpret_cast<int4*>(&As[r][c]) = *reinterpret_cast<const int4*>(&A[(size_t)(row0 + r) * n + k0 + c]);
            const int rb = v / (BN / 8), cb = (v % (BN / 8)) * 8;
            *reinterpret_cast<int4*>(&Bs[rb][cb]) = *reinterpret_cast<const int4*>(&B[(size_t)(k0 + rb) * n + col0 + cb]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[wr + 16 * i][kk], TK + 8);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &Bs[kk][wc + 16 * j], BN + 8);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&C[(size_t)(row0 + wr + 16 * i) * n + col0 + wc + 16 * j], acc[i][j], n,
                                    wmma::mem_row_major);
}

// TF32: FP32 inputs, rounded to TF32 (10-bit mantissa) as they enter the tensor cores
// (fragments of 16 x 16 x 8).
extern "C" __global__ void gemm_wmma_tf32(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int n) {
    __shared__ __align__(32) float As[BM][TK + 4];
    __shared__ __align__(32) float Bs[TK][BN + 4];
    const int warp = threadIdx.x / 32;
    const int wr = (warp / 2) * 32, wc = (warp % 2) * 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < n; k0 += TK) {
        // 128 threads copy A's 64 x 32 and B's 32 x 64 slices, 4 floats (16 bytes) at a time
        for (int v = threadIdx.x; v < BM * TK / 4; v += blockDim.x) {
            const int r = v / (TK / 4), c = (v % (TK / 4)) * 4;
            *reinterpret_cast<float4*>(&As[r][c]) = *reinterpret_cast<const float4*>(&A[(size_t)(row0 + r) * n + k0 + c]);
            const int rb = v / (BN / 4), cb = (v % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[rb][cb]) = *reinterpret_cast<const float4*>(&B[(size_t)(k0 + rb) * n + col0 + cb]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                wmma::load_matrix_sync(a[i], &As[wr + 16 * i][kk], TK + 4);
                for (int t = 0; t < a[i].num_elements; ++t) a[i].x[t] = wmma::__float_to_tf32(a[i].x[t]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(b[j], &Bs[kk][wc + 16 * j], BN + 4);
                for (int t = 0; t < b[j].num_elements; ++t) b[j].x[t] = wmma::__float_to_tf32(b[j].x[t]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&C[(size_t)(row0 + wr + 16 * i) * n + col0 + wc + 16 * j], acc[i][j], n,
                                    wmma::mem_row_major);
}
