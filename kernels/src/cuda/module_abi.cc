// The C ABI of libfp4q_cuda.so (fp4q/kernels/cuda_module.h). These three functions are the only
// symbols the module exports; everything else is hidden.
#include <cuda_runtime.h>

#include <cstdio>
#include <new>
#include <string>

#include "cuda/cuda_backend.h"
#include "fp4q/kernels/cuda_module.h"

// The loader's defaults are the backend's.
static_assert(fp4q::kernels::CudaBackendOptions{}.bf16_block_ctas ==
              fp4q::kernels::cuda::KernelTuning{}.bf16_block_ctas);
static_assert(fp4q::kernels::CudaBackendOptions{}.step_prefetch_slots ==
              fp4q::kernels::cuda::KernelTuning{}.step_prefetch_slots);

namespace {

void WriteError(char* err, size_t err_len, const std::string& msg) {
  if (err == nullptr || err_len == 0) return;
  std::snprintf(err, err_len, "%s", msg.c_str());
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int fp4q_cuda_abi_version(void) {
  return FP4Q_CUDA_ABI_VERSION;
}

__attribute__((visibility("default"))) int fp4q_cuda_device_count(char* err, size_t err_len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    WriteError(err, err_len,
               std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" +
                   cudaGetErrorName(e) + ")");
    cudaGetLastError();
    return -1;
  }
  return count;
}

__attribute__((visibility("default"))) fp4q::kernels::Backend* fp4q_cuda_create_backend(
    int ordinal, const fp4q_cuda_options* options, char* err, size_t err_len) {
  try {
    fp4q::kernels::cuda::KernelTuning tuning;
    if (options != nullptr) {
      tuning.rows_only = options->rows_only != 0;
      tuning.bf16_block_ctas = options->bf16_block_ctas;
      tuning.step_prefetch_slots = options->step_prefetch_slots;
    }
    auto backend = fp4q::kernels::cuda::CudaBackend::Create(ordinal, tuning);
    if (!backend.ok()) {
      WriteError(err, err_len, std::string(backend.status().ToString()));
      return nullptr;
    }
    return backend->release();
  } catch (const std::bad_alloc&) {
    WriteError(err, err_len, "out of host memory creating the CUDA backend");
    return nullptr;
  }
}

}  // extern "C"
