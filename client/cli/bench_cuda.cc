#include "bench_cuda.h"

#include <cstring>
#include <vector>

namespace fp4q::client::cli {

absl::StatusOr<std::unique_ptr<CudaRuntime>> LoadBenchCuda(const std::string& wanted) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load(
      wanted.empty() ? std::vector<std::string>{} : std::vector<std::string>{wanted});
  if (!cuda.ok()) return cuda.status();
  if (absl::Status s =
          (*cuda)->Require({CudaCall::kGetErrorName, CudaCall::kGetErrorString,
                            CudaCall::kGetDeviceCount, CudaCall::kSetDevice, CudaCall::kMalloc,
                            CudaCall::kFree, CudaCall::kMemcpy, CudaCall::kDeviceSynchronize});
      !s.ok()) {
    return s;
  }
  if (absl::StatusOr<int> n = (*cuda)->DeviceCount(); !n.ok()) return n.status();
  if (absl::Status s = (*cuda)->Check("cudaSetDevice(0)", (*cuda)->SetDevice(0)); !s.ok()) {
    return s;
  }
  return cuda;
}

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace fp4q::client::cli
