// The GPU tests' CUDA runtime: the client's own dlopen wrapper (client::CudaRuntime), loaded
// from the library CudaIpc chose, with the calls the tests make (cudaMalloc, cudaMemcpy, IPC
// open), so the tests link no CUDA either.
#ifndef FP4Q_TESTS_CLIENT_REAL_CUDA_H_
#define FP4Q_TESTS_CLIENT_REAL_CUDA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fp4q/client/cuda_ipc.h"
#include "fp4q/client/cuda_runtime.h"

namespace fp4q::client::testing {

inline absl::StatusOr<std::unique_ptr<CudaRuntime>> TestRuntime(const CudaIpc& ipc) {
  absl::StatusOr<std::unique_ptr<CudaRuntime>> rt = CudaRuntime::Load({ipc.runtime_library()});
  if (!rt.ok()) return rt.status();
  if (absl::Status s = (*rt)->Require({CudaCall::kMalloc, CudaCall::kFree, CudaCall::kMemcpy,
                                       CudaCall::kIpcOpenMemHandle, CudaCall::kIpcCloseMemHandle});
      !s.ok()) {
    return s;
  }
  return rt;
}

inline std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

inline std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace fp4q::client::testing

#endif  // FP4Q_TESTS_CLIENT_REAL_CUDA_H_
