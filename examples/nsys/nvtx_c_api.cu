// NVTX from C++: the C API that every other NVTX binding wraps.
//
// Build and profile (NVTX v3 is header-only: no -lnvToolsExt, unlike NVTX v2):
//   nvcc -arch=sm_90 -o nvtx_c_api examples/nsys/nvtx_c_api.cu
//   nsys profile --trace=cuda,nvtx -o nvtx_c_api ./nvtx_c_api
//
// Ranges: "init" (allocate and fill), "compute" (10 kernel launches, each inside a
// nested "iteration" range), "verify" (copy back and check). Exits non-zero if the
// result is wrong or any CUDA call fails.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#define CHECK(call)                                                                 \
  do {                                                                              \
    cudaError_t err_ = (call);                                                      \
    if (err_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "error: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

__global__ void scale_add(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main(int argc, char** argv) {
  const int n = 1 << 24;
  const int iterations = 10;
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s (no arguments)\n", argv[0]);
    return 2;
  }
  nvtxRangePushA("init");
  std::vector<float> host(n, 1.0f);
  float *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&y, n * sizeof(float)));
  CHECK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, n * sizeof(float)));
  nvtxRangePop();

  nvtxRangePushA("compute");
  for (int it = 0; it < iterations; ++it) {
    nvtxRangePushA("iteration");
    scale_add<<<(n + 255) / 256, 256>>>(y, x, 2.0f, n);
    CHECK(cudaGetLastError());
    nvtxRangePop();
  }
  CHECK(cudaDeviceSynchronize());  // inside the range, so its kernels finish within it
  nvtxRangePop();

  nvtxRangePushA("verify");
  CHECK(cudaMemcpy(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
  nvtxMarkA("copied back");
  nvtxRangePop();
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  for (int i = 0; i < n; i += 4099) {
    if (host[i] != 2.0f * iterations) {
      std::fprintf(stderr, "error: y[%d] = %f, expected %f\n", i, host[i], 2.0f * iterations);
      return 1;
    }
  }
  std::printf("result checked: y = %.1f everywhere after %d launches\n", 2.0f * iterations, iterations);
  return 0;
}
