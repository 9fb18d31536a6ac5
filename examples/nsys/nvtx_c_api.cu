// NVTX from C and C++: the C API that every other NVTX binding wraps, and its C++ wrappers.
//
// Build and profile (NVTX v3 is header-only: no -lnvToolsExt, unlike NVTX v2; the three
// headers below are in the CUDA toolkit's include/nvtx3/):
//   nvcc -arch=sm_90 -o nvtx_c_api examples/nsys/nvtx_c_api.cu
//   nsys profile --trace=cuda,nvtx -o nvtx_c_api ./nvtx_c_api
//
// What it records, in order:
//   * names for this thread ("main thread", nvtxNameOsThreadA) and for the stream the kernels
//     run on ("compute stream", nvtxNameCudaStreamA): nsys uses them as the timeline's row names;
//   * "init" (allocate and fill) and "compute": nvtxRangePushA/Pop, plain C strings in the
//     default domain;
//   * inside "compute", 10 "iteration" ranges, one kernel launch each, in a domain of their own
//     ("course", nvtxDomainCreateA), pushed with nvtxDomainRangePushEx and event attributes:
//     a registered string (nvtxDomainRegisterStringA: the text is handed over once, then only
//     its handle), a colour, a named category ("kernels") and the iteration number as payload;
//   * "verify" (copy back and check): a C++ nvtx3::scoped_range, closed by its destructor,
//     with an nvtxMarkA instant "copied back" inside it.
// Exits non-zero if the result is wrong or any CUDA call fails.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <sys/syscall.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>
#include <nvtx3/nvtx3.hpp>

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
  // Resource naming: Linux wants the kernel's thread id (gettid), not pthread_self().
  nvtxNameOsThreadA(static_cast<uint32_t>(syscall(SYS_gettid)), "main thread");

  nvtxRangePushA("init");
  std::vector<float> host(n, 1.0f);
  float *x = nullptr, *y = nullptr;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  nvtxNameCudaStreamA(stream, "compute stream");
  CHECK(cudaMalloc(&x, n * sizeof(float)));
  CHECK(cudaMalloc(&y, n * sizeof(float)));
  CHECK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, n * sizeof(float)));
  nvtxRangePop();

  // A domain, a category named in it, and a string registered once: built before the loop.
  nvtxDomainHandle_t course = nvtxDomainCreateA("course");
  nvtxDomainNameCategoryA(course, 1, "kernels");
  nvtxStringHandle_t iteration_name = nvtxDomainRegisterStringA(course, "iteration");
  nvtxEventAttributes_t attr = {};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.category = 1;
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = 0xFF76B900;  // opaque green
  attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attr.message.registered = iteration_name;
  attr.payloadType = NVTX_PAYLOAD_TYPE_INT32;

  nvtxRangePushA("compute");
  for (int it = 0; it < iterations; ++it) {
    attr.payload.iValue = it;  // the payload changes, the rest of the attributes stay
    nvtxDomainRangePushEx(course, &attr);
    scale_add<<<(n + 255) / 256, 256, 0, stream>>>(y, x, 2.0f, n);
    CHECK(cudaGetLastError());
    nvtxDomainRangePop(course);
  }
  CHECK(cudaStreamSynchronize(stream));  // inside the range, so its kernels finish within it
  nvtxRangePop();

  {
    nvtx3::scoped_range verify{"verify"};  // C++: pushed here, popped at the closing brace
    CHECK(cudaMemcpy(host.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
    nvtxMarkA("copied back");
  }
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  nvtxDomainDestroy(course);
  for (int i = 0; i < n; i += 4099) {
    if (host[i] != 2.0f * iterations) {
      std::fprintf(stderr, "error: y[%d] = %f, expected %f\n", i, host[i], 2.0f * iterations);
      return 1;
    }
  }
  std::printf("result checked: y = %.1f everywhere after %d launches\n", 2.0f * iterations, iterations);
  return 0;
}
