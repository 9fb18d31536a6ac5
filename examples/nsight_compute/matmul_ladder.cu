// A matrix product taken one idea at a time: C = A @ B, A (M x K) and B (K x N) in BF16,
// row-major, accumulated and written in FP32 (C is M x N). Launched by matmul_ladder.py,
// which checks every rung against cuBLAS and times it beside cuBLAS in the same run.
//
// Rungs 1-3 run on the CUDA cores (FFMA), with the BF16 inputs widened to FP32 as they are
// read; the tensor-core rungs (mma.sync, then Hopper's wgmma fed by TMA) come next and are
// not written yet. Every rung handles any M and N and any K (rung 3: K and N multiples of 8,
// for its 16-byte loads; the script checks), so a shape that is not a multiple of the tile
// is computed exactly like one that is, with the edges masked.

#include <cuda_bf16.h>

__device__ __forceinline__ float ld_bf16(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Rung 1: one output per thread. A 16 x 16 block of threads covers a 16 x 16 patch of C;
// threadIdx.x runs along a row of C, so a warp's loads of B are consecutive (coalesced)
// and its loads of A are one value, broadcast. Every product term is read from global
// memory (through L1/L2): 2 loads per multiply-add.
extern "C" __global__ void ladder_1_naive(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K) {
    const int col = blockIdx.x * 16 + threadIdx.x, row = blockIdx.y * 16 + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(ld_bf16(&A[(size_t)row * K + k]), ld_bf16(&B[(size_t)k * N + col]), acc);
    C[(size_t)row * N + col] = acc;
}

// Rung 2: shared-memory tiles. A 32 x 32 block copies a 32 x 32 slice of A and of B into
// shared memory once, and every thread reads its row and column from there: each value
// fetched from global memory serves 32 multiply-adds instead of one. Still one output per
// thread, so each multiply-add costs two shared-memory reads.
#define T2 32
extern "C" __global__ void ladder_2_smem(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                                         float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[T2][T2], Bs[T2][T2];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * T2 + ty, col = blockIdx.x * T2 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += T2) {
        As[ty][tx] = (row < M && k0 + tx < K) ? ld_bf16(&A[(size_t)row * K + k0 + tx]) : 0.f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? ld_bf16(&B[(size_t)(k0 + ty) * N + col]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < T2; ++k) acc = fmaf(As[ty][k], Bs[k][tx], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}

// Rung 3: register tiles and 16-byte loads. A block of 256 threads computes a 128 x 128 tile
// of C, each thread an 8 x 8 patch held in 64 registers: per slice of K it reads 8 values of
// A and 8 of B from shared memory and does 64 multiply-adds with them (4 FFMA per shared
// load instead of rung 2's one half). Global loads are 16 bytes (8 BF16 values) per thread.
// A's slice is stored transposed (k-major), so that a thread's 8 values of A are adjacent.
#define BM 128
#define BN 128
#define BK 16
#define TM 8
#define TN 8
__device__ __forceinline__ void widen8(uint4 v, float* out) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// 8 BF16 values at p (16 bytes, one load) widened to FP32, or zeros past the matrix's edge.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, bool inside, float* out) {
    if (inside) {
        widen8(*reinterpret_cast<const uint4*>(p), out);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(256) ladder_3_regtile(const __nv_bfloat16* __restrict__ A,
                                                                    const __nv_bfloat16* __restrict__ B,
                                                                    float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM];  // transposed: As[k][m]
    __shared__ __align__(16) float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int ty = tid / (BN / TN), tx = tid % (BN / TN);  // 16 x 16 threads
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // Loading: A's slice is 128 rows x 16 k = 256 vectors of 8 (one per thread);
    // B's slice is 16 k x 128 columns = 256 vectors of 8 (one per thread).
    const int a_r = tid / (BK / 8), a_k = (tid % (BK / 8)) * 8;
    const int b_k = tid / (BN / 8), b_c = (tid % (BN / 8)) * 8;
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float v[8];
        const int ar = row0 + a_r, ak = k0 + a_k;
        load8(A + (size_t)ar * K + ak, ar < M && ak < K, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) As[a_k + i][a_r] = v[i];
        const int bk = k0 + b_k, bc = col0 + b_c;
        load8(B + (size_t)bk * N + bc, bk < K && bc < N, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) Bs[b_k][b_c + i] = v[i];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + ty * TM + i;
        if (r >= M) break;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = col0 + tx * TN + j;
            if (c < N) C[(size_t)r * N + c] = acc[i][j];
        }
    }
}
