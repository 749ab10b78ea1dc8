// The devices fp4qd serves: one kernels::Backend per visible GPU (reached only through
// CudaModule, so fp4qd itself links no CUDA library), or one CPU backend.
//
// Selection (`backend`):
//   "cpu"  - the CPU reference backend.
//   "cuda" - every visible GPU; fails (UNAVAILABLE / NOT_FOUND) when the module, the driver or
//            the devices are missing.
//   "auto" - "cuda" when it succeeds, else "cpu"; fallback_reason() says why.
// GPUs are identified by UUID; ordinals are process-local and never leave this class.
#ifndef FP4Q_SERVER_DEVICES_H_
#define FP4Q_SERVER_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/cuda_module.h"

namespace fp4q::server {

struct Device {
  int index = 0;                              // position in the DeviceSet
  std::unique_ptr<kernels::Backend> backend;  // owned
  kernels::DeviceInfo info;
  std::string label;         // GPU UUID or "cpu": metric label, messages, WeightInfo
  bool host_memory = false;  // backend memory is host memory (CPU backend)
};

struct DeviceSetOptions {
  std::string backend = "auto";  // "auto", "cpu", "cuda"
  std::string cuda_module;       // path of libfp4q_cuda.so; empty = CudaModule's search
  kernels::CudaBackendOptions cuda;  // every CUDA backend's kernel-choice tuning
};

class DeviceSet {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceSet>> Create(const DeviceSetOptions& options);

  // For tests: serve the given backends. `host_memory` says whether their memory is host
  // memory (inline tensors are then used in place and outputs written straight into replies).
  static std::unique_ptr<DeviceSet> FromBackends(
      std::vector<std::unique_ptr<kernels::Backend>> backends, bool host_memory);

  ~DeviceSet();  // backends are destroyed before the CUDA module is unloaded
  DeviceSet(const DeviceSet&) = delete;
  DeviceSet& operator=(const DeviceSet&) = delete;

  const std::string& kind() const { return kind_; }  // "cpu" or "cuda"
  int size() const { return static_cast<int>(devices_.size()); }
  Device& device(int i) { return *devices_[i]; }
  const Device& device(int i) const { return *devices_[i]; }
  // Null when no served device has this UUID (or label "cpu").
  Device* FindByUuid(absl::string_view uuid);
  // Why "auto" chose the CPU backend (empty otherwise).
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  DeviceSet() = default;
  static absl::StatusOr<std::unique_ptr<DeviceSet>> CreateCuda(const DeviceSetOptions& options);
  static std::unique_ptr<DeviceSet> CreateCpu();

  std::unique_ptr<kernels::CudaModule> module_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::string kind_;
  std::string fallback_reason_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_DEVICES_H_
