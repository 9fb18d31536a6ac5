// Register spills: one computation compiled twice, once with the registers it needs and
// once squeezed into 32 per thread. Launched by spills.py (CuPy, compiled with -lineinfo).
//
// Each thread keeps NACC running values live across a loop. With enough registers they
// stay in registers; under __launch_bounds__(256, 8) the compiler may use only
// 65536 / (256 x 8) = 32 registers per thread, so it spills the rest to local memory:
// per-thread memory that lives in device memory and is cached in L1 and L2. ptxas reports
// the spill bytes at compile time (nvcc -Xptxas -v); ncu counts the local loads and stores.

#define NACC 64

__device__ __forceinline__ float accumulate(const float* __restrict__ x, int n, int iters) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = blockDim.x * gridDim.x;
    float acc[NACC];
#pragma unroll
    for (int k = 0; k < NACC; ++k) acc[k] = (float)k;
    for (int it = 0; it < iters; ++it) {
        const float v = x[(tid + (size_t)it * stride) % n];
#pragma unroll
        for (int k = 0; k < NACC; ++k) acc[k] = fmaf(acc[k], v, (float)(k + 1));  // NACC live values
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NACC; ++k) s += acc[k];
    return s;
}

// As many registers as the compiler wants (up to 255 per thread).
extern "C" __global__ void __launch_bounds__(256) accumulate_in_registers(const float* __restrict__ x, float* out,
                                                                         int n, int iters) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = accumulate(x, n, iters);
}

// At most 32 registers per thread: 8 blocks of 256 threads must fit on one SM.
extern "C" __global__ void __launch_bounds__(256, 8) accumulate_spilled(const float* __restrict__ x, float* out,
                                                                        int n, int iters) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = accumulate(x, n, iters);
}
