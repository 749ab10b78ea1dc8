// The cost floor of one kernel launch on this machine, for the small-tensor rows: an empty
// kernel launched back to back on the bench's stream (host wall per call and GPU time).
#include <cuda_runtime.h>

namespace fp4q::bench {
namespace {
__global__ void EmptyKernel(int) {}
}  // namespace

cudaError_t LaunchEmptyKernel(cudaStream_t s) {
  EmptyKernel<<<1, 32, 0, s>>>(0);
  return cudaGetLastError();
}

}  // namespace fp4q::bench
