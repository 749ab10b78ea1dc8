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

// C ABI of the module. Bump kFp4qCudaAbiVersion on any change of it or of Backend.
#define FP4Q_CUDA_ABI_VERSION 3
extern "C" {
// Returns FP4Q_CUDA_ABI_VERSION.
int fp4q_cuda_abi_version(void);
// Number of visible CUDA devices, or -1 with a message in err (e.g. no driver).
int fp4q_cuda_device_count(char* err, size_t err_len);
// A new Backend on device `ordinal` (caller owns it), or null with a message in err.
fp4q::kernels::Backend* fp4q_cuda_create_backend(int ordinal, char* err, size_t err_len);
}

namespace fp4q::kernels {

class CudaModule {
 public:
  // Loads the module from `path`, or when empty from, in order: $FP4Q_CUDA_MODULE, the
  // directory of the running executable, ../lib next to it, then the dynamic linker's path.
  // NOT_FOUND when no module is found; FAILED_PRECONDITION on an ABI mismatch.
  static absl::StatusOr<std::unique_ptr<CudaModule>> Load(const std::string& path = "");
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  const std::string& path() const { return path_; }
  // UNAVAILABLE with the CUDA error text when the driver or devices are missing.
  absl::StatusOr<int> DeviceCount() const;
  absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(int ordinal) const;

 private:
  CudaModule() = default;
  void* handle_ = nullptr;
  std::string path_;
  decltype(&fp4q_cuda_device_count) device_count_ = nullptr;
  decltype(&fp4q_cuda_create_backend) create_backend_ = nullptr;
};

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_CUDA_MODULE_H_
