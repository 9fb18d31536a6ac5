// Occupancy: how many warps an SM can hold for a kernel, and when more of them help.
// Launched by occupancy.py (CuPy, compiled with -lineinfo).
//
// reverse_chunks reverses every CHUNK-float piece of an array. Each block stages its
// chunk in shared memory so that both the read and the write stay coalesced. The
// shared tile is 32 KiB whatever the block size, so an SM fits only a few blocks
// (Hopper: 228 KiB of shared memory per SM, about 1 KiB of it reserved per block),
// and the number of *threads* per block decides how many warps that makes: the
// occupancy is limited by shared memory, and changed with the block size.

#define CHUNK 8192   // floats per block: 32 KiB of shared memory
#define IN_FLIGHT 4  // loads each thread issues before it waits for any of them

extern "C" __global__ void reverse_chunks(const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float tile[CHUNK];
    const size_t base = (size_t)blockIdx.x * CHUNK;
    const int step = IN_FLIGHT * blockDim.x;
    for (int i = threadIdx.x; i < CHUNK; i += step) {
        float v[IN_FLIGHT];  // IN_FLIGHT independent loads, then their stores
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k) v[k] = in[base + i + k * blockDim.x];
#pragma unroll
        for (int k = 0; k < IN_FLIGHT; ++k) tile[i + k * blockDim.x] = v[k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < CHUNK; i += blockDim.x)
        out[base + i] = tile[CHUNK - 1 - i];
}
