// A kernel whose duration is set by the caller and which records when it ran: one warp
// spins for a number of SM clock cycles and writes the GPU's global timer (nanoseconds)
// at its start and end. Launched by replay_modes.py on two streams and inside a CUDA
// graph, to see whether launches that can overlap do overlap, with and without Nsight
// Compute, in each of its replay modes.

extern "C" __global__ void spin(long long cycles, unsigned long long* __restrict__ stamps) {
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        stamps[0] = t0;
        stamps[1] = t1;
    }
}
