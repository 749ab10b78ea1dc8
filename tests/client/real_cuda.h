// The CUDA runtime calls the GPU tests need beyond the client's own (cudaMalloc, cudaMemcpy,
// IPC open), reached with dlsym like the client does, so the tests link no CUDA either.
#ifndef FP4Q_TESTS_CLIENT_REAL_CUDA_H_
#define FP4Q_TESTS_CLIENT_REAL_CUDA_H_

#include <dlfcn.h>

#include <cstddef>
#include <string>

#include "fp4q/client/cuda_ipc.h"

namespace fp4q::client::testing {

struct RealCuda {
  static constexpr int kHostToDevice = 1;
  static constexpr int kDeviceToHost = 2;
  struct Handle {
    char bytes[kCudaIpcHandleBytes];
  };

  explicit RealCuda(const std::string& runtime_path) {
    rt = dlopen(runtime_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (rt == nullptr) return;
    malloc = reinterpret_cast<decltype(malloc)>(dlsym(rt, "cudaMalloc"));
    free = reinterpret_cast<decltype(free)>(dlsym(rt, "cudaFree"));
    memcpy = reinterpret_cast<decltype(memcpy)>(dlsym(rt, "cudaMemcpy"));
    ipc_open = reinterpret_cast<decltype(ipc_open)>(dlsym(rt, "cudaIpcOpenMemHandle"));
    ipc_close = reinterpret_cast<decltype(ipc_close)>(dlsym(rt, "cudaIpcCloseMemHandle"));
  }
  ~RealCuda() {
    if (rt != nullptr) dlclose(rt);
  }
  RealCuda(const RealCuda&) = delete;
  RealCuda& operator=(const RealCuda&) = delete;
  bool ok() const { return malloc && free && memcpy && ipc_open && ipc_close; }

  void* rt = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*ipc_open)(void**, Handle, unsigned) = nullptr;
  int (*ipc_close)(void*) = nullptr;
};

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
