// Warp divergence: the same work, split between two code paths either per warp or per
// thread. Launched by divergence.py (CuPy, compiled with -lineinfo).
//
// A warp issues one instruction for its 32 threads at a time. When the threads of a warp
// disagree at a branch, the warp runs both sides one after the other, each with the
// other side's threads switched off: the work of the idle half is lost.

// Path A: a chain of single-precision multiply-adds.
__device__ float path_a(float v, int iters) {
#pragma unroll 4
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999999f, 0.5f);
    return v;
}

// Path B: a linear congruential generator, integer multiply-adds (a different
// computation, so the compiler cannot merge the two paths into one).
__device__ unsigned path_b(unsigned u, int iters) {
#pragma unroll 4
    for (int k = 0; k < iters; ++k) u = u * 1664525u + 1013904223u;
    return u;
}

// Which path a thread takes depends on its warp: all 32 threads of a warp agree.
extern "C" __global__ void branch_per_warp(float* __restrict__ out, int iters) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if ((threadIdx.x / 32) % 2 == 0)
        out[i] = path_a((float)i, iters);
    else
        out[i] = (float)(path_b((unsigned)i, iters) >> 8);
}

// The same split, but by thread: even and odd threads of every warp disagree.
extern "C" __global__ void branch_per_thread(float* __restrict__ out, int iters) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x % 2 == 0)
        out[i] = path_a((float)i, iters);
    else
        out[i] = (float)(path_b((unsigned)i, iters) >> 8);
}
