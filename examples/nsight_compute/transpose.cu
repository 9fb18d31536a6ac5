// Matrix transpose, one step at a time: each kernel fixes what Nsight Compute showed
// to be wrong with the one before. out = in^T for an n x n row-major float matrix,
// n a multiple of TILE. Every kernel moves the same bytes (n*n floats read, n*n written),
// so their durations compare directly. Launched by transpose.py (CuPy, compiled with
// -lineinfo so that ncu's Source Counters point at these lines).
//
// Blocks cover one TILE x TILE tile of the matrix. Unless a kernel says otherwise, a
// block has TILE x ROWS threads and each thread handles TILE / ROWS elements.

#define TILE 32
#define ROWS 8

// Reference: a copy with the transpose's access pattern, minus the transposing. Reads and
// writes are both row-wise (coalesced): the ceiling every transpose below aims at.
extern "C" __global__ void copy_tile(const float* __restrict__ in, float* __restrict__ out, int n) {
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        out[(size_t)(y + j) * n + x] = in[(size_t)(y + j) * n + x];
}

// Step 1, naive: read a row, write a column. The 32 threads of a warp read 32 neighbouring
// floats (4 sectors of 32 bytes) but write 32 floats that are n floats apart: 32 sectors
// for one store instruction, each carrying 4 useful bytes.
extern "C" __global__ void transpose_naive(const float* __restrict__ in, float* __restrict__ out, int n) {
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        out[(size_t)x * n + (y + j)] = in[(size_t)(y + j) * n + x];
}

// Step 2, through shared memory: load a tile row-wise, then write it out row-wise from
// the tile's columns. Global accesses are now coalesced both ways; the column walk moved
// into shared memory, where the 32 floats of a tile column all sit in the same bank
// (a row is 32 floats = 32 banks): a 32-way bank conflict on every read.
extern "C" __global__ void transpose_tiled(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float tile[TILE][TILE];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;  // the block's tile, transposed
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        out[(size_t)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}

// Step 3, padded: one extra float per tile row shifts each row by one bank, so a column's
// 32 floats fall in 32 different banks. Same code as step 2 otherwise.
extern "C" __global__ void transpose_padded(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS)
        out[(size_t)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}

// Step 4, coarsened: each block transposes a 64 x 64 tile (four 32 x 32 quarters) with
// the same 32 x 8 threads, so a thread moves 16 elements instead of 4 and issues its
// loads back to back before the barrier: more bytes in flight per thread, a quarter of
// the blocks (and of the barriers and index arithmetic) for the same data.
#define BIG (2 * TILE)
extern "C" __global__ void transpose_coarse(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float tile[BIG][BIG + 1];
    int x = blockIdx.x * BIG + threadIdx.x;
    int y = blockIdx.y * BIG + threadIdx.y;
#pragma unroll
    for (int i = 0; i < BIG; i += TILE)
#pragma unroll
        for (int j = 0; j < BIG; j += ROWS)
            tile[threadIdx.y + j][threadIdx.x + i] = in[(size_t)(y + j) * n + x + i];
    __syncthreads();
    x = blockIdx.y * BIG + threadIdx.x;
    y = blockIdx.x * BIG + threadIdx.y;
#pragma unroll
    for (int i = 0; i < BIG; i += TILE)
#pragma unroll
        for (int j = 0; j < BIG; j += ROWS)
            out[(size_t)(y + j) * n + x + i] = tile[threadIdx.x + i][threadIdx.y + j];
}
