// Loads the CUDA backend module (libfp4q_cuda.so) with dlopen.
//
// Why dlopen: the server binary then runs on machines without CUDA libraries, and libcublasLt's
// ~92 KiB of static TLS goes into dynamic TLS, which lets prometheus-cpp's civetweb threads
// (100 KiB stacks) start. See README "CUDA backend module".
//
// The module exports a small C ABI (below); objects it returns are C++ Backends built with the
// same compiler and Abseil as the loader. The module stays loaded while the CudaModule lives;
// destroy every Backend it created first.
#ifndef FP4Q_KERNELS_CUDA_MODULE_H_
#define FP4Q_KERNELS_CUDA_MODULE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fp4q/kernels/backend.h"

// C ABI of the module. Bump FP4Q_CUDA_ABI_VERSION on any change of it or of Backend.
#define FP4Q_CUDA_ABI_VERSION 8
extern "C" {
// How a backend tunes its kernels (kernels/src/cuda/kernel_choice.h).
struct fp4q_cuda_options {
  int rows_only;            // 1: every row-wise pass takes the general row kernel
  int bf16_block_ctas;      // 3 or 4: CTAs per SM of the bf16 one-block-a-lane kernel
  int step_prefetch_slots;  // 0..16: slots the optimizer step's warps ask L2 for ahead
};
// Returns FP4Q_CUDA_ABI_VERSION.
int fp4q_cuda_abi_version(void);
// Number of visible CUDA devices, or -1 with a message in err (e.g. no driver).
int fp4q_cuda_device_count(char* err, size_t err_len);
// A new Backend on device `ordinal` (caller owns it), or null with a message in err.
fp4q::kernels::Backend* fp4q_cuda_create_backend(int ordinal, const fp4q_cuda_options* options,
                                                 char* err, size_t err_len);
}

namespace fp4q::kernels {

// Tuning of a CUDA backend's kernels (fp4qd --cuda_row_kernels, --cuda_bf16_block_ctas,
// --cuda_step_prefetch); the defaults are kernel_choice.h's KernelTuning's.
struct CudaBackendOptions {
  bool rows_only = false;
  int bf16_block_ctas = 3;
  int step_prefetch_slots = 2;
};

class CudaModule {
 public:
  // Loads the module from `path`, or when empty from, in order: the directory of the running
  // executable, ../lib next to it, then the dynamic linker's path. (Programs that honor
  // $FP4Q_CUDA_MODULE pass it as `path`: fp4qd, fp4q_bench, the GPU tests.) NOT_FOUND when no
  // module is found; FAILED_PRECONDITION on an ABI mismatch.
  static absl::StatusOr<std::unique_ptr<CudaModule>> Load(const std::string& path = "");
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  const std::string& path() const { return path_; }
  // UNAVAILABLE with the CUDA error text when the driver or devices are missing.
  absl::StatusOr<int> DeviceCount() const;
  absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
      int ordinal, const CudaBackendOptions& options = {}) const;

 private:
  CudaModule() = default;
  void* handle_ = nullptr;
  std::string path_;
  decltype(&fp4q_cuda_device_count) device_count_ = nullptr;
  decltype(&fp4q_cuda_create_backend) create_backend_ = nullptr;
};

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_CUDA_MODULE_H_
