// The cost floor of one kernel launch on this machine, for the small-tensor rows: an empty
// kernel launched back to back on the bench's stream (host wall per call and GPU time), the
// same as programmatic dependent launches, and the
// parts a backend call adds around its launch (a grid and an argument of a quantize kernel's
// size, the runtime calls the backend makes before and after it).
#include <cuda_runtime.h>

#include "cuda/pdl.cuh"

namespace fp4q::bench {
namespace {
__global__ void EmptyKernel(int) {}

// The same as a programmatic dependent launch (as the step kernels go on sm_90+, pdl.cuh): it
// waits for the previous kernel, then lets the next one launch.
__global__ void EmptyPdlKernel(int) { kernels::cuda::PdlGridEnter(); }

// About the size of the quantize kernels' parameter structs.
struct BigArg {
  unsigned long long words[64];
};
__global__ void EmptyKernelBigArg(const BigArg a) {
  if (a.words[threadIdx.x & 63] == 1ull && blockIdx.x == 0x7FFFFFFF) asm volatile("trap;");
}
}  // namespace

cudaError_t LaunchEmptyKernel(cudaStream_t s) {
  EmptyKernel<<<1, 32, 0, s>>>(0);
  return cudaGetLastError();
}

cudaError_t LaunchEmptyPdlKernel(cudaStream_t s) {
  return kernels::cuda::LaunchMaybePdl(EmptyPdlKernel, dim3(1), dim3(32), 0, s, /*pdl=*/true, 0);
}

cudaError_t LaunchEmptyGrid(cudaStream_t s, unsigned ctas) {
  BigArg a{};
  a.words[0] = ctas;
  EmptyKernelBigArg<<<ctas, 256, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchEmptyWithBackendCalls(cudaStream_t s, int device) {
  // What CudaBackend's Enter() and AfterLaunches() ask of the runtime around a launch (the
  // thread already on `device`, as in the bench: no cudaSetDevice).
  int current = -1;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return e;
  if (current != device) {
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
  }
  (void)cudaGetLastError();
  e = cudaGetDevice(&current);  // SmCount()'s per-call query
  if (e != cudaSuccess) return e;
  EmptyKernel<<<1, 32, 0, s>>>(current);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaPeekAtLastError();
}

}  // namespace fp4q::bench
