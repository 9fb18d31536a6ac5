// A linear layer's product taken one idea at a time: C = A @ W^T, with A (M x K) and W (N x K)
// in BF16, both row-major (W is laid out as PyTorch's nn.Linear keeps its weight: one row
// of K values per output column), accumulated and written in FP32 (C is M x N, row-major).
// Launched by matmul_ladder.py, which checks every rung against cuBLAS and times it beside
// cuBLAS in the same run.
//
// Rungs 1-4 run on the CUDA cores (FFMA), with the BF16 inputs widened to FP32 as they are
// read; rungs 5-6 on the tensor cores through mma.sync (any GPU from sm_80); rungs 7-10
// through Hopper's wgmma, fed by the tensor memory accelerator (TMA): rung 8 keeps one group
// in flight, 9 is persistent with an L2-friendly tile order, 10 shares W across a cluster.
// Every rung handles any M and N; rungs 3-10 load 16 bytes (8 values) at a time, so they
// need K and N to be multiples of 8 (the script checks). Edges are masked (or, for TMA,
// filled with zeros by the TMA unit), so a shape that is not a multiple of the tile is
// computed exactly like one that is. Rungs 7-10 build only for sm_90a.

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float ld_bf16(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Rung 1: one output per thread. A 16 x 16 block of threads covers a 16 x 16 patch of C;
// threadIdx.x runs along a row of C. Every product term is read from global memory (mostly
// hits in L1): 2 loads per multiply-add; a warp (2 rows of 16) reads 16 rows of W, K values
// apart, each by 2 threads and in a sector of its own, and 2 addresses of A.
extern "C" __global__ void ladder_1_naive(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ W,
                                          float* __restrict__ C, int M, int N, int K) {
    const int col = blockIdx.x * 16 + threadIdx.x, row = blockIdx.y * 16 + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(ld_bf16(&A[(size_t)row * K + k]), ld_bf16(&W[(size_t)col * K + k]), acc);
    C[(size_t)row * N + col] = acc;
}

// Rung 2: shared-memory tiles. A 32 x 32 block copies a 32 x 32 slice of A and of W into
// shared memory once (consecutive threads read consecutive values: coalesced), and every
// thread reads its row and column from there: each value fetched from global memory serves
// 32 multiply-adds instead of one. Still one output per thread, so each multiply-add costs
// two shared-memory reads. (W's slice is read down a column, 33 floats apart: the one-float
// pad keeps those reads in different banks; bank conflicts are rung 4's subject.)
#define T2 32
extern "C" __global__ void ladder_2_smem(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ W,
                                         float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[T2][T2], Ws[T2][T2 + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * T2 + ty, col = blockIdx.x * T2 + tx;
    const int wrow = blockIdx.x * T2 + ty;  // the row of W this thread copies
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += T2) {
        As[ty][tx] = (row < M && k0 + tx < K) ? ld_bf16(&A[(size_t)row * K + k0 + tx]) : 0.f;
        Ws[ty][tx] = (wrow < N && k0 + tx < K) ? ld_bf16(&W[(size_t)wrow * K + k0 + tx]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < T2; ++k) acc = fmaf(As[ty][k], Ws[tx][k], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}

// Rungs 3 and 4: register tiles and 16-byte loads. A block of 256 threads computes a
// 128 x 128 tile of C, each thread an 8 x 8 patch held in 64 registers: per step of K it
// reads 8 values of A and 8 of W from shared memory and does 64 multiply-adds with them
// (4 FFMA per value read, against rung 2's one half). Global loads are 16 bytes (8 BF16
// values) per thread. Both slices are stored transposed (k-major), so that the 8 values a
// thread needs at one k are adjacent.
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

__device__ __forceinline__ void store_tile_fp32(float (&acc)[TM][TN], float* C, int M, int N, int r0, int c0, int rstep,
                                                int cstep) {
    // Rows r0 + i (i < 4) and r0 + rstep + (i - 4); likewise columns: rung 3 passes steps of
    // 4 (8 adjacent rows and columns), rung 4 steps of 64 (two groups of 4, 64 apart).
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = r0 + (i < 4 ? i : rstep + i - 4);
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = c0 + (j < 4 ? j : cstep + j - 4);
            if (c < N) C[(size_t)r * N + c] = acc[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) ladder_3_regtile(const __nv_bfloat16* __restrict__ A,
                                                                    const __nv_bfloat16* __restrict__ W,
                                                                    float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM];  // transposed: As[k][m]
    __shared__ __align__(16) float Ws[BK][BN];  // transposed: Ws[k][n]
    const int tid = threadIdx.x;
    const int ty = tid / (BN / TN), tx = tid % (BN / TN);  // 16 x 16 threads
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // Loading: each slice is 128 rows x 16 k = 256 vectors of 8, one per thread: thread t
    // takes row t / 2 and the half (t % 2) of the slice's 16 k.
    const int l_r = tid / 2, l_k = (tid % 2) * 8;
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float v[8];
        const int ar = row0 + l_r, wr = col0 + l_r, k = k0 + l_k;
        load8(A + (size_t)ar * K + k, ar < M && k < K, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) As[l_k + i][l_r] = v[i];
        load8(W + (size_t)wr * K + k, wr < N && k < K, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) Ws[l_k + i][l_r] = v[i];
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Ws[kk][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    store_tile_fp32(acc, C, M, N, row0 + ty * TM, col0 + tx * TN, 4, 4);
}

// Rung 4: rung 3 without bank conflicts. Shared memory serves a warp's 16-byte loads a
// quarter-warp (8 threads, 128 bytes) at a time; in rung 3 the 8 threads of a quarter read
// 32 bytes apart, so two of them always share a bank. Here each thread's 8 columns are two
// groups of 4, 64 columns apart (tx * 4 and 64 + tx * 4), so a quarter-warp's 8 loads are
// 128 consecutive bytes; the same for its 8 rows. And the transposing stores: in rung 3 the
// two threads of a row wrote k and k + 8, 8 x 128 floats apart, the same bank; here a warp
// copies 32 different rows at the same k, so its 32 stores are 32 consecutive floats.
extern "C" __global__ void __launch_bounds__(256) ladder_4_conflict_free(const __nv_bfloat16* __restrict__ A,
                                                                          const __nv_bfloat16* __restrict__ W,
                                                                          float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM];
    __shared__ __align__(16) float Ws[BK][BN];
    const int tid = threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    // Loading: warp w copies rows 32 * (w / 2) .. + 31, the half (w % 2) of the 16 k.
    const int warp = tid / 32, lane = tid % 32;
    const int l_r = 32 * (warp / 2) + lane, l_k = (warp % 2) * 8;
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        float v[8];
        const int ar = row0 + l_r, wr = col0 + l_r, k = k0 + l_k;
        load8(A + (size_t)ar * K + k, ar < M && k < K, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) As[l_k + i][l_r] = v[i];
        load8(W + (size_t)wr * K + k, wr < N && k < K, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) Ws[l_k + i][l_r] = v[i];
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
            const float4 a0 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Ws[kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Ws[kk][64 + tx * 4]);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w; a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w; b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    store_tile_fp32(acc, C, M, N, row0 + ty * 4, col0 + tx * 4, 64, 64);
}

// ---------------------------------------------------------------------------------------
// Rungs 5 and 6: tensor cores through mma.sync (sm_80 and later). The unit of work is one
// warp-wide instruction, mma.sync.m16n8k16: a 16 x 16 piece of A times a 16 x 8 piece of W^T,
// added to a 16 x 8 piece of C held across the warp's registers (4 floats per thread). The
// operands come from shared memory through ldmatrix, which loads 8 x 8 matrices of 16-bit
// values straight into the register layout mma.sync wants (four at a time with .x4).
//
// Both rungs: a block of 8 warps computes a 128 x 128 tile of C, walking K in slices of 32;
// warp (wm, wn) owns a 64 x 32 piece: 4 x 4 instructions per 16 of K, 64 floats of
// accumulator per thread. A and W stay BF16 in shared memory, K-contiguous, each row padded
// from 32 to 40 values (80 bytes): ldmatrix reads 8 rows of 16 bytes per matrix, and at 80
// bytes apart those 8 rows fall in 8 different groups of 4 banks (at 64 bytes, rows 0 and 2
// would collide).
#define MBM 128
#define MBN 128
#define MBK 32
#define MPAD 40  // padded row length of a slice in shared memory, in BF16 values

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
#endif
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// One 32-deep slice already in shared memory (As: 128 rows of A, Ws: 128 rows of W) times
// the warp's accumulators. ldmatrix.x4's lane l gives the address of one row: lanes 0-7
// the first matrix's 8 rows, 8-15 the second's, and so on.
__device__ __forceinline__ void mma_slice(float (&acc)[4][4][4], const __nv_bfloat16* As, const __nv_bfloat16* Ws,
                                          int wm, int wn, int lane) {
#pragma unroll
    for (int k16 = 0; k16 < MBK; k16 += 16) {
        uint32_t a[4][4], b[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i)  // A: rows 0-15 at k 0-7 and 8-15 -> a0..a3 of one 16 x 16 piece
            ldmatrix_x4(a[i], As + (wm * 64 + i * 16 + (lane % 16)) * MPAD + k16 + (lane / 16) * 8);
#pragma unroll
        for (int j = 0; j < 4; j += 2) {  // W: rows n 0-7 (k 0-7, 8-15), n 8-15 (k 0-7, 8-15) -> b of two n-pieces
            uint32_t r[4];
            ldmatrix_x4(r, Ws + (wn * 32 + j * 8 + (lane % 8) + (lane / 16) * 8) * MPAD + k16 + ((lane / 8) % 2) * 8);
            b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[i][j], a[i], b[j][0], b[j][1]);
    }
}

// The accumulators to C: in each 16 x 8 piece, thread l holds rows l / 4 and l / 4 + 8,
// columns 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void mma_store(const float (&acc)[4][4][4], float* C, int M, int N, int row0, int col0,
                                          int lane) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row0 + i * 16 + lane / 4 + h * 8, c = col0 + j * 8 + (lane % 4) * 2;
                if (r < M && c < N) *reinterpret_cast<float2*>(&C[(size_t)r * N + c]) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
}

// 16 bytes of row r (k from k) of a K-contiguous matrix with R rows, or zeros past its edge.
__device__ __forceinline__ uint4 load16(const __nv_bfloat16* X, int R, int K, int r, int k) {
    return (r < R && k < K) ? *reinterpret_cast<const uint4*>(X + (size_t)r * K + k) : make_uint4(0, 0, 0, 0);
}

// Rung 5: the slices go global -> registers -> shared memory, then everyone waits
// (__syncthreads) and computes: while the tensor cores work no load is in flight, and while
// loads are in flight the tensor cores wait.
extern "C" __global__ void __launch_bounds__(256) ladder_5_mma(const __nv_bfloat16* __restrict__ A,
                                                                const __nv_bfloat16* __restrict__ W,
                                                                float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) __nv_bfloat16 As[MBM * MPAD], Ws[MBN * MPAD];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4;
    const int row0 = blockIdx.y * MBM, col0 = blockIdx.x * MBN;
    float acc[4][4][4] = {};
    for (int k0 = 0; k0 < K; k0 += MBK) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {  // each slice: 128 rows x 4 vectors of 8 = 512 vectors, 2 per thread
            const int idx = tid + v * 256, r = idx / 4, k = (idx % 4) * 8;
            *reinterpret_cast<uint4*>(&As[r * MPAD + k]) = load16(A, M, K, row0 + r, k0 + k);
            *reinterpret_cast<uint4*>(&Ws[r * MPAD + k]) = load16(W, N, K, col0 + r, k0 + k);
        }
        __syncthreads();
        mma_slice(acc, As, Ws, wm, wn, lane);
        __syncthreads();
    }
    mma_store(acc, C, M, N, row0 + wm * 64, col0 + wn * 32, lane);
}

// Rung 6: the same warps and instructions, fed by a pipeline of STAGES slices. cp.async
// copies 16 bytes from global to shared memory without passing through registers and
// without making the thread wait; commit_group / wait_group count the copies in flight.
// While slice t is multiplied, slices t+1 .. t+STAGES-1 are on their way.
#define STAGES 4
#define STAGE_ELEMS ((MBM + MBN) * MPAD)

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool inside) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(inside ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N_IN_FLIGHT>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N_IN_FLIGHT));
#endif
}

__device__ __forceinline__ void issue_slice(__nv_bfloat16* stage, const __nv_bfloat16* A, const __nv_bfloat16* W, int M,
                                            int N, int K, int row0, int col0, int k0, int tid) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {
        const int idx = tid + v * 256, r = idx / 4, k = (idx % 4) * 8;
        const bool a_in = row0 + r < M && k0 + k < K, w_in = col0 + r < N && k0 + k < K;
        cp_async16(stage + r * MPAD + k, a_in ? A + (size_t)(row0 + r) * K + k0 + k : A, a_in);
        cp_async16(stage + (MBM + r) * MPAD + k, w_in ? W + (size_t)(col0 + r) * K + k0 + k : W, w_in);
    }
}

extern "C" __global__ void __launch_bounds__(256) ladder_6_pipelined(const __nv_bfloat16* __restrict__ A,
                                                                      const __nv_bfloat16* __restrict__ W,
                                                                      float* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(16) __nv_bfloat16 smem6[];  // STAGES x (A slice, W slice)
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4;
    const int row0 = blockIdx.y * MBM, col0 = blockIdx.x * MBN;
    const int slices = (K + MBK - 1) / MBK;
    float acc[4][4][4] = {};
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {  // prologue: the first STAGES-1 slices in flight
        if (s < slices) issue_slice(smem6 + s * STAGE_ELEMS, A, W, M, N, K, row0, col0, s * MBK, tid);
        cp_async_commit();  // an empty group past the end keeps the count uniform
    }
    for (int t = 0; t < slices; ++t) {
        cp_async_wait<STAGES - 2>();  // slice t has landed (this thread's copies)...
        __syncthreads();              // ...and everyone's; and everyone is done with slice t-1
        const int next = t + STAGES - 1;
        if (next < slices) issue_slice(smem6 + (next % STAGES) * STAGE_ELEMS, A, W, M, N, K, row0, col0, next * MBK, tid);
        cp_async_commit();
        const __nv_bfloat16* stage = smem6 + (t % STAGES) * STAGE_ELEMS;
        mma_slice(acc, stage, stage + MBM * MPAD, wm, wn, lane);
    }
    cp_async_wait<0>();
    mma_store(acc, C, M, N, row0 + wm * 64, col0 + wn * 32, lane);
}

// ---------------------------------------------------------------------------------------
// Rung 7: Hopper (sm_90a). A warpgroup (4 consecutive warps, 128 threads) issues wgmma,
// one instruction for a 64 x 256 x 16 product that reads both operands from shared memory
// itself (no ldmatrix, no registers for A or W) and runs asynchronously. The slices arrive
// by the tensor memory accelerator (TMA): one thread asks for a whole 128 x 64 or 256 x 64
// box with one instruction, the copy engine writes it swizzled (the 128-byte pattern wgmma
// reads without bank conflicts), fills what lies past the matrix's edge with zeros, and
// counts the bytes in on an mbarrier in shared memory.
//
// Warp specialisation: a block of 3 warpgroups computes a 128 x 256 tile of C. Warpgroup 0
// is the producer (one of its threads issues the copies for a ring of 4 stages and waits
// for free slots); warpgroups 1 and 2 are consumers, each multiplying 64 rows of the tile
// into 128 FP32 accumulators per thread. setmaxnreg moves registers from the producer
// (which needs few) to the consumers. Barrier full[s]: the producer's copies of stage s
// have landed; empty[s]: both consumers are done reading it.
#define HBM 128
#define HBN 256
#define HBK 64
#define HSTAGES 4
#define H_A_BYTES (HBM * HBK * 2)
#define H_W_BYTES (HBN * HBK * 2)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LADDER_HOPPER 1
#endif

#ifdef LADDER_HOPPER
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {  // arrive, expecting `bytes` more
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {  // until the phase of this parity completes
    asm volatile(
        "{\n .reg .pred done;\n"
        "WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// One box of a 2-D tensor map (K innermost): HBK values of K from k, rows from r.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, uint64_t* bar, int k, int r) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
            smem_addr(dst)),
        "l"(tmap), "r"(smem_addr(bar)), "r"(k), "r"(r)
        : "memory");
}
// Shared-memory matrix descriptor for wgmma: K-major, 128-byte swizzle, 8-row groups
// 1024 bytes apart (8 rows x 64 BF16 values). Addresses are encoded in units of 16 bytes.
__device__ __forceinline__ uint64_t wgmma_desc(const void* p) {
    const uint64_t addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
// D (64 x 256, FP32, 128 registers per thread) += A (64 x 16) * W^T (16 x 256), both from shared memory.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[16][8], uint64_t desc_a, uint64_t desc_w) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, 1, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[2][4]), "+f"(d[2][5]), "+f"(d[2][6]), "+f"(d[2][7]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[3][4]), "+f"(d[3][5]), "+f"(d[3][6]), "+f"(d[3][7]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[4][4]), "+f"(d[4][5]), "+f"(d[4][6]), "+f"(d[4][7]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[5][4]), "+f"(d[5][5]), "+f"(d[5][6]), "+f"(d[5][7]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[6][4]), "+f"(d[6][5]), "+f"(d[6][6]), "+f"(d[6][7]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[7][4]), "+f"(d[7][5]), "+f"(d[7][6]), "+f"(d[7][7]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[8][4]), "+f"(d[8][5]), "+f"(d[8][6]), "+f"(d[8][7]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[9][4]), "+f"(d[9][5]), "+f"(d[9][6]), "+f"(d[9][7]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[10][4]), "+f"(d[10][5]), "+f"(d[10][6]), "+f"(d[10][7]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[11][4]), "+f"(d[11][5]), "+f"(d[11][6]), "+f"(d[11][7]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[12][4]), "+f"(d[12][5]), "+f"(d[12][6]), "+f"(d[12][7]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[13][4]), "+f"(d[13][5]), "+f"(d[13][6]), "+f"(d[13][7]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[14][4]), "+f"(d[14][5]), "+f"(d[14][6]), "+f"(d[14][7]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[15][4]), "+f"(d[15][5]), "+f"(d[15][6]), "+f"(d[15][7])
        : "l"(desc_a), "l"(desc_w));
}
#endif

// The body of rungs 7 and 8. IN_FLIGHT: how many of a consumer's wgmma groups may still be
// running when it moves to the next slice (0: it waits for each slice's products before the
// next; 1: it waits for the slice before, so the tensor cores always have the next one queued).
// tmap_a, tmap_w: tensor maps (made on the host by cuTensorMapEncodeTiled, copied to global
// memory): A as K x M and W as K x N, boxes of 64 x 128 and 64 x 256, 128-byte swizzle.
template <int IN_FLIGHT>
__device__ __forceinline__ void wgmma_tma_body(const void* __restrict__ tmap_a, const void* __restrict__ tmap_w,
                                               float* __restrict__ C, int M, int N, int K) {
#ifdef LADDER_HOPPER
    __shared__ __align__(8) uint64_t full[HSTAGES], empty[HSTAGES];
    extern __shared__ unsigned char smem7_raw[];
    // The 128-byte swizzle repeats every 1024 bytes, and the copy engine and wgmma agree on it
    // only from a 1024-byte aligned address.
    unsigned char* smem7 = smem7_raw + ((1024 - (smem_addr(smem7_raw) & 1023)) & 1023);
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem7);                             // HSTAGES x 128 x 64
    __nv_bfloat16* sW = reinterpret_cast<__nv_bfloat16*>(smem7 + HSTAGES * H_A_BYTES);     // HSTAGES x 256 x 64
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int row0 = blockIdx.y * HBM, col0 = blockIdx.x * HBN;
    const int slices = (K + HBK - 1) / HBK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < HSTAGES; ++s) {
            mbar_init(&full[s], 1);   // the producer's one arrive (plus the bytes it expects)
            mbar_init(&empty[s], 2);  // one arrive per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (t == 0) {
            // The tensor maps were written to global memory by an ordinary copy: make them
            // visible to the copy engine (the tensor-map proxy) before it reads them.
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(tmap_a) : "memory");
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(tmap_w) : "memory");
            for (int i = 0; i < slices; ++i) {
                const int s = i % HSTAGES, round = i / HSTAGES;
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                mbar_expect_tx(&full[s], H_A_BYTES + H_W_BYTES);
                tma_load_2d(sA + s * (HBM * HBK), tmap_a, &full[s], i * HBK, row0);
                tma_load_2d(sW + s * (HBN * HBK), tmap_w, &full[s], i * HBK, col0);
            }
        }
    } else {  // consumers: warpgroup c multiplies rows 64 (c - 1) .. + 63 of the tile
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int c = wg - 1;
        float d[16][8];
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) d[j][e] = 0.f;
        for (int i = 0; i < slices; ++i) {
            const int s = i % HSTAGES;
            mbar_wait(&full[s], (i / HSTAGES) & 1);
            const __nv_bfloat16* a = sA + s * (HBM * HBK) + c * 64 * HBK;
            const __nv_bfloat16* w = sW + s * (HBN * HBK);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int k = 0; k < HBK / 16; ++k)  // 16 values of K = 32 bytes further into each swizzled row
                wgmma_m64n256k16(d, wgmma_desc(a + k * 16), wgmma_desc(w + k * 16));
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(IN_FLIGHT) : "memory");
            // Release the stage whose products are now complete: this slice's (IN_FLIGHT 0) or
            // the one before (IN_FLIGHT 1).
            if (t == 0 && i >= IN_FLIGHT) mbar_arrive(&empty[(i - IN_FLIGHT) % HSTAGES]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // Accumulator layout of m64nNk16: warp w of the warpgroup holds rows 16 w .. 16 w + 15;
        // d[j][e] is row l / 4 (+ 8 for e = 2, 3, 6, 7), column 16 j + 2 (l % 4) (+ 1 for odd e,
        // + 8 for e >= 4), with l the lane.
        const int warp = t / 32, lane = t % 32;
        const int r = row0 + c * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const int rr = r + ((e / 2) % 2) * 8, cc = col0 + 16 * j + 2 * (lane % 4) + (e / 4) * 8;
                if (rr < M && cc < N) *reinterpret_cast<float2*>(&C[(size_t)rr * N + cc]) = make_float2(d[j][e], d[j][e + 1]);
            }
    }
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1) ladder_7_wgmma_tma(const void* __restrict__ tmap_a,
                                                                         const void* __restrict__ tmap_w,
                                                                         float* __restrict__ C, int M, int N, int K) {
    wgmma_tma_body<0>(tmap_a, tmap_w, C, M, N, K);
}

// Rung 8: what rung 7's source page asked for. Most of its warp samples sat on
// wgmma.wait_group 0: after each slice a consumer waited for its own products to finish
// before it could release the stage and queue the next slice's, so the tensor cores idled
// between slices. Here it keeps one group in flight.
extern "C" __global__ void __launch_bounds__(384, 1) ladder_8_wgmma_overlap(const void* __restrict__ tmap_a,
                                                                             const void* __restrict__ tmap_w,
                                                                             float* __restrict__ C, int M, int N, int K) {
    wgmma_tma_body<1>(tmap_a, tmap_w, C, M, N, K);
}

// ---------------------------------------------------------------------------------------
// Rungs 9 and 10: rung 8's warpgroups and main loop, in a persistent grid that walks the
// tiles in an order that keeps A and W in L2.
//
// Rung 9, tile order and persistence. Rungs 7-8 launch one block per 128 x 256 tile and
// the hardware starts them in blockIdx order: along a row of tiles, then the next row. At
// 8192^3 a wave of 132 blocks then covers 4 rows of tiles and all 32 columns: it streams
// 1/16 of A and all of W (128 MB, more than the L2's 50 MB) past the L2 once per wave.
// Here the grid has one block per SM (the host passes min(tiles, SMs)); block b takes
// tiles b, b + gridDim.x, b + 2 gridDim.x, ... of a grouped order: GROUP_M rows of tiles
// walk together along N (tile t's row is t mod GROUP_M inside its group, its column t div
// GROUP_M), so the 132 tiles in flight at a time cover GROUP_M rows and about 132 / GROUP_M
// columns: at 8192^3 and GROUP_M = 16 the first 132 tiles need 2,048 rows of A and 2,304 of W,
// where blockIdx order's first wave needs 640 rows of A and all 8,192 of W (the test suite
// counts both). And a block that loops over tiles overlaps one tile's epilogue with the next
// tile's loads: the producer runs ahead into the stages the consumers have released while
// they store C.
//
// Rung 10, a cluster of two blocks sharing W. Two blocks of a cluster (two SMs of a GPC)
// take the tiles of rows 2p and 2p + 1 in the same column: both need the same 256 x 64 slice
// of W at every step. Each block's producer loads its own A (128 x 64) and one half of W's
// slice (128 x 64), multicast by the TMA into the shared memory of both blocks: every block
// still receives 48 KB per slice, but asks the L2 for 32 KB of it (a third less L2 -> SM
// traffic). The price is coupling: a stage may be refilled only when the consumers of both
// blocks are done with it (empty[s] counts 2 x 2 arrivals, sent across the cluster), and no
// block may exit while its partner can still write to it or arrive on its barriers.

// Tile t of the grouped order over a tiles_m x tiles_n grid of tiles (host and device: the
// test suite compiles this function for the CPU and compares it with matmul_ladder.py's
// tile_order). Groups of group_m rows of tiles (the last group may have fewer) are taken one
// after the other; inside a group, t runs down the rows first, then to the next column.
__host__ __device__ inline void grouped_tile(int t, int tiles_m, int tiles_n, int group_m, int* tm, int* tn) {
    const int per_group = group_m * tiles_n;
    const int group = t / per_group, first = group * group_m, in_group = t - group * per_group;
    const int rows = tiles_m - first < group_m ? tiles_m - first : group_m;
    *tm = first + in_group % rows;
    *tn = in_group / rows;
}

#ifdef LADDER_HOPPER
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t cluster_id_x() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t clusters_x() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster arrives and waits (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrive on barrier `bar` of the cluster's block `rank` (the same offset in its shared memory).
// RELEASE_CLUSTER false: mbarrier.arrive's default semantics, release at CTA scope, the form
// CUTLASS's ClusterBarrier::arrive(cta_id) uses for the same signal. A consumer has nothing to
// publish here (wgmma.wait_group already saw its reads of the stage complete): it only says
// the stage is free. RELEASE_CLUSTER true: release at cluster scope, rung 10 as first run. That
// orders the thread's earlier global stores (the last tile's C) before the arrive for every
// thread of the cluster; under ncu at 8192^3 it came with about 80 more one-sector L2 requests
// per arrive than rung 9 made (the H100 has 80 L2 slices), the tensor pipe busy 45% of active
// cycles against rung 9's 96%, and half of rung 9's speed.
template <bool RELEASE_CLUSTER>
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
    if (RELEASE_CLUSTER)
        asm volatile(
            "{\n .reg .b32 remote;\n"
            " mapa.shared::cluster.u32 remote, %0, %1;\n"
            " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
            "r"(rank)
            : "memory");
    else
        asm volatile(
            "{\n .reg .b32 remote;\n"
            " mapa.shared::cluster.u32 remote, %0, %1;\n"
            " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
            "r"(rank)
            : "memory");
}
// One box, written at the same offset into the shared memory of every block in `mask`, each
// block's barrier at `bar`'s offset counting the bytes that land in that block.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tmap, uint64_t* bar, int k, int r,
                                                      uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_addr(dst)),
        "l"(tmap), "r"(smem_addr(bar)), "r"(k), "r"(r), "h"(mask)
        : "memory");
}
// A consumer warpgroup's "stage free" signal, to the empty barrier of every block that writes
// into the stage: its own (a local arrive) and, in a cluster, its partner's (a remote one).
// Rung 10 as first run sent both through mapa with release at cluster scope.
template <int CLUSTER, bool RELEASE_CLUSTER>
__device__ __forceinline__ void release_stage(uint64_t* bar, uint32_t rank) {
    for (uint32_t b = 0; b < CLUSTER; ++b) {
        if (RELEASE_CLUSTER) mbar_arrive_cluster<true>(bar, b);
        else if (b == rank) mbar_arrive(bar);
        else mbar_arrive_cluster<false>(bar, b);
    }
}
#endif

// The body of rungs 9 (CLUSTER 1) and 10 (CLUSTER 2). A unit of work is CLUSTER tiles of one
// column, rows CLUSTER u .. CLUSTER u + CLUSTER - 1 of tiles; block `rank` of a cluster takes
// the unit's tile rank. Units are numbered in the grouped order (group_m rows of tiles, i.e.
// group_m / CLUSTER units), and cluster c of the grid takes units c, c + clusters, ...
// The stage ring runs on across tiles: g counts every slice this block has loaded (producer)
// or multiplied (consumers), so stage g % HSTAGES and its phase parity (g / HSTAGES) & 1 need
// no reset between tiles. Each slice's stage is released exactly once: the slice before
// after wait_group 1 (as in rung 8), and a tile's last slice after its wait_group 0.
template <int CLUSTER, bool RELEASE_CLUSTER>
__device__ __forceinline__ void persistent_body(const void* __restrict__ tmap_a, const void* __restrict__ tmap_w,
                                                float* __restrict__ C, int M, int N, int K, int group_m) {
#ifdef LADDER_HOPPER
    __shared__ __align__(8) uint64_t full[HSTAGES], empty[HSTAGES];
    extern __shared__ unsigned char smem9_raw[];
    unsigned char* smem9 = smem9_raw + ((1024 - (smem_addr(smem9_raw) & 1023)) & 1023);
    __nv_bfloat16* sA = reinterpret_cast<__nv_bfloat16*>(smem9);                          // HSTAGES x 128 x 64
    __nv_bfloat16* sW = reinterpret_cast<__nv_bfloat16*>(smem9 + HSTAGES * H_A_BYTES);  // HSTAGES x 256 x 64
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const int slices = (K + HBK - 1) / HBK;
    const int tiles_m = (M + HBM - 1) / HBM, tiles_n = (N + HBN - 1) / HBN;
    const int unit_rows = (tiles_m + CLUSTER - 1) / CLUSTER, units = unit_rows * tiles_n;
    const int group = group_m / CLUSTER > 0 ? group_m / CLUSTER : 1;
    const uint32_t rank = CLUSTER > 1 ? cluster_rank() : 0;
    const int first_unit = CLUSTER > 1 ? (int)cluster_id_x() : (int)blockIdx.x;
    const int unit_step = CLUSTER > 1 ? (int)clusters_x() : (int)gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < HSTAGES; ++s) {
            mbar_init(&full[s], 1);              // this block's producer's one arrive (plus the bytes)
            mbar_init(&empty[s], 2 * CLUSTER);   // both consumers of every block that writes into stage s
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (CLUSTER > 1)
        cluster_sync();  // the partner's barriers are initialised before anyone signals them
    else
        __syncthreads();
    if (wg == 0) {  // producer
        // 56, not rung 8's 40: ptxas holds the code after setmaxnreg to its count, and at 40
        // rung 10's producer loop spilled 8 bytes
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        if (t == 0) {
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(tmap_a) : "memory");
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(tmap_w) : "memory");
            uint32_t g = 0;
            for (int u = first_unit; u < units; u += unit_step) {
                int um, tn;
                grouped_tile(u, unit_rows, tiles_n, group, &um, &tn);
                // A box or W half that would lie wholly past the matrix's edge (the second tile
                // of a unit at an odd last row, the second half of a narrow last column) is
                // read from the last row instead: those results are never stored.
                int row0 = (um * CLUSTER + (int)rank) * HBM;
                row0 = row0 < M ? row0 : M - 1;
                int wrow = tn * HBN + (int)rank * (HBN / CLUSTER);
                wrow = wrow < N ? wrow : N - 1;
                for (int i = 0; i < slices; ++i, ++g) {
                    const uint32_t s = g % HSTAGES, round = g / HSTAGES;
                    if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                    mbar_expect_tx(&full[s], H_A_BYTES + H_W_BYTES);  // all of it lands here, half from the partner
                    tma_load_2d(sA + s * (HBM * HBK), tmap_a, &full[s], i * HBK, row0);
                    if (CLUSTER > 1)
                        tma_load_2d_multicast(sW + s * (HBN * HBK) + rank * (HBN / CLUSTER) * HBK, tmap_w, &full[s],
                                              i * HBK, wrow, (uint16_t)((1u << CLUSTER) - 1));
                    else
                        tma_load_2d(sW + s * (HBN * HBK), tmap_w, &full[s], i * HBK, wrow);
                }
            }
        }
        if (CLUSTER > 1) cluster_sync();  // (each thread arrives once; the consumers' call is below)
    } else {  // consumers: warpgroup c multiplies rows 64 (c - 1) .. + 63 of each tile
        asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");  // 128 x 56 + 256 x 224 = 64,512 = 384 x 168
        const int c = wg - 1, warp = t / 32, lane = t % 32;
        float d[16][8];
        uint32_t g = 0;
        for (int u = first_unit; u < units; u += unit_step) {
            int um, tn;
            grouped_tile(u, unit_rows, tiles_n, group, &um, &tn);
            const int row0 = (um * CLUSTER + (int)rank) * HBM, col0 = tn * HBN;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) d[j][e] = 0.f;
            for (int i = 0; i < slices; ++i, ++g) {
                const uint32_t s = g % HSTAGES;
                mbar_wait(&full[s], (g / HSTAGES) & 1);
                const __nv_bfloat16* a = sA + s * (HBM * HBK) + c * 64 * HBK;
                const __nv_bfloat16* w = sW + s * (HBN * HBK);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int k = 0; k < HBK / 16; ++k) wgmma_m64n256k16(d, wgmma_desc(a + k * 16), wgmma_desc(w + k * 16));
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                if (t == 0 && i > 0)  // the slice before is complete: release its stage in every block
                    release_stage<CLUSTER, RELEASE_CLUSTER>(&empty[(g - 1) % HSTAGES], rank);
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (t == 0)  // the tile's last slice; the producer may already be loading the next tile
                release_stage<CLUSTER, RELEASE_CLUSTER>(&empty[(g - 1) % HSTAGES], rank);
            // The epilogue of rungs 7-8 (same accumulator layout), from registers to C.
            const int r = row0 + c * 64 + warp * 16 + lane / 4;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const int rr = r + ((e / 2) % 2) * 8, cc = col0 + 16 * j + 2 * (lane % 4) + (e / 4) * 8;
                    if (rr < M && cc < N)
                        *reinterpret_cast<float2*>(&C[(size_t)rr * N + cc]) = make_float2(d[j][e], d[j][e + 1]);
                }
        }
        if (CLUSTER > 1) cluster_sync();  // no block leaves while its partner may still write to it or signal it
    }
#endif
}

// Rung 9: rung 8 in a persistent grid (one block per SM), tiles in grouped order.
extern "C" __global__ void __launch_bounds__(384, 1) ladder_9_persistent(const void* __restrict__ tmap_a,
                                                                          const void* __restrict__ tmap_w,
                                                                          float* __restrict__ C, int M, int N, int K,
                                                                          int group_m) {
    persistent_body<1, false>(tmap_a, tmap_w, C, M, N, K, group_m);
}

// Rung 10: rung 9 in clusters of two blocks that share each slice of W (TMA multicast). The
// cluster shape is fixed at compile time, so an ordinary launch makes the clusters; the grid
// must be a multiple of 2. (Older GPUs have no clusters: there the kernel builds, empty, without.)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define LADDER_CLUSTER_OF_2 __cluster_dims__(2, 1, 1)
#else
#define LADDER_CLUSTER_OF_2
#endif
extern "C" __global__ void LADDER_CLUSTER_OF_2 __launch_bounds__(384, 1)
    ladder_10_cluster_multicast(const void* __restrict__ tmap_a, const void* __restrict__ tmap_w,
                                float* __restrict__ C, int M, int N, int K, int group_m) {
    persistent_body<2, false>(tmap_a, tmap_w, C, M, N, K, group_m);
}

// Rung 10 as first run (matmul_ladder.py --arrive-scope cluster): the same kernel with its
// consumers' arrivals released at cluster scope. Kept so that one run can show the defect and
// its fix side by side (time, ncu's L2 requests and membar stalls).
extern "C" __global__ void LADDER_CLUSTER_OF_2 __launch_bounds__(384, 1)
    ladder_10_release_cluster(const void* __restrict__ tmap_a, const void* __restrict__ tmap_w,
                              float* __restrict__ C, int M, int N, int K, int group_m) {
    persistent_body<2, true>(tmap_a, tmap_w, C, M, N, K, group_m);
}
