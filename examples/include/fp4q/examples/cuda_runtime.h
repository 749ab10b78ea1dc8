// Device memory for the examples' CUDA IPC transport: the client library's CUDA runtime
// (fp4q/client/cuda_runtime.h, loaded at run time with dlopen; nothing links CUDA), loaded with
// what the transport needs.
//
// Contract
// - Load: FAILED_PRECONDITION when no candidate library loads ("no CUDA runtime (tried ...)",
//   naming each and dlerror()'s reason), when the library lacks a call the transport makes
//   ("CUDA runtime LIB lacks ..."), or when the runtime reports no usable device ("no usable
//   CUDA device: ..." with the CUDA error name and text, e.g. cudaErrorNoDevice, or
//   cudaErrorInsufficientDriver where no driver is installed). The examples turn that into
//   "skipped".
// - Allocate, CopyToDevice, CopyToHost, Fill and their errors: client::CudaRuntime. Allocate
//   uses the current device (device 0 unless the caller changed it), so the memory can be
//   exported with cudaIpcGetMemHandle.
#ifndef FP4Q_EXAMPLES_CUDA_RUNTIME_H_
#define FP4Q_EXAMPLES_CUDA_RUNTIME_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/client/cuda_runtime.h"

namespace fp4q::examples {

using client::DeviceBuffer;

class CudaRuntime : public client::CudaRuntime {
 public:
  // Candidates tried in order (empty: client::CudaRuntime::DefaultLibraries()).
  static absl::StatusOr<std::unique_ptr<CudaRuntime>> Load(
      const std::vector<std::string>& candidates = {});

  int device_count() const { return device_count_; }

 private:
  CudaRuntime(client::CudaRuntime&& loaded, int device_count)
      : client::CudaRuntime(std::move(loaded)), device_count_(device_count) {}
  int device_count_ = 0;
};

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_CUDA_RUNTIME_H_
