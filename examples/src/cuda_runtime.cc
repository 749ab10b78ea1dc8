#include "fp4q/examples/cuda_runtime.h"

#include <utility>

#include "fp4q/common/status_macros.h"

namespace fp4q::examples {

absl::StatusOr<std::unique_ptr<CudaRuntime>> CudaRuntime::Load(
    const std::vector<std::string>& candidates) {
  using client::CudaCall;
  FP4Q_ASSIGN_OR_RETURN(std::unique_ptr<client::CudaRuntime> loaded,
                        client::CudaRuntime::Load(candidates));
  FP4Q_RETURN_IF_ERROR(loaded->Require(
      {CudaCall::kGetErrorName, CudaCall::kGetErrorString, CudaCall::kGetDeviceCount,
       CudaCall::kMalloc, CudaCall::kFree, CudaCall::kMemcpy, CudaCall::kMemset,
       CudaCall::kDeviceSynchronize}));
  FP4Q_ASSIGN_OR_RETURN(const int devices, loaded->DeviceCount());
  return std::unique_ptr<CudaRuntime>(new CudaRuntime(std::move(*loaded), devices));
}

}  // namespace fp4q::examples
