// Exporting CUDA IPC handles for device pointers, without linking CUDA.
//
// The client library never links CUDA at build time: CudaIpc::Load opens the CUDA runtime
// through CudaRuntime (cuda_runtime.h: libcudart.so.13, then libcudart.so, unless other
// candidates are given) and reaches the three driver calls it needs (cuMemGetAddressRange,
// cuDeviceGet, cuDeviceGetUuid) through cudaGetDriverEntryPointByVersion, or through
// libcuda.so.1 when the runtime lacks that call.
//
// Contract
// - Load: FAILED_PRECONDITION "CUDA runtime not found, ..." naming every library tried and
//   dlerror()'s reason when none loads; "CUDA runtime LIB lacks ..." naming the missing calls.
// - Export(ptr): the allocation holding `ptr` (found with cuMemGetAddressRange), its IPC handle
//   (cudaIpcGetMemHandle of the allocation's base: a handle always describes a whole
//   allocation), ptr's offset from the base and the GPU's UUID ("GPU-xxxxxxxx-xxxx-..." as
//   nvidia-smi prints it). Errors:
//     FAILED_PRECONDITION  no usable CUDA driver or device (the CUDA error name and text);
//     INVALID_ARGUMENT     a null pointer, host or unregistered memory, managed memory (not
//                          exportable), or a pointer CUDA does not know;
//     INTERNAL             any other CUDA error, with the call and CUDA's message.
//   Export makes the pointer's device current for the duration of the call and restores the
//   caller's current device afterwards.
// - The memory must come from cudaMalloc (or an allocator built on it, e.g. PyTorch's caching
//   allocator); cudaMallocAsync pools and VMM allocations are not exportable this way.
// - Thread safety: Export may be called from any thread concurrently.
#ifndef FP4Q_CLIENT_CUDA_IPC_H_
#define FP4Q_CLIENT_CUDA_IPC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/client/cuda_runtime.h"  // kCudaIpcHandleBytes

namespace fp4q::client {

struct CudaIpcExport {
  std::string handle;          // kCudaIpcHandleBytes bytes of cudaIpcMemHandle_t
  uintptr_t base = 0;          // the allocation's base address
  uint64_t allocation_bytes = 0;  // the allocation's size
  uint64_t offset = 0;         // ptr - base
  int device = -1;             // CUDA ordinal in this process
  std::string device_uuid;     // "GPU-..." (or "MIG-..." on a MIG instance)
};

// Formats 16 UUID bytes as nvidia-smi does: prefix + 8-4-4-4-12 lowercase hex.
std::string FormatGpuUuid(const unsigned char bytes[16], const std::string& prefix = "GPU-");

class CudaIpc {
 public:
  // The default candidates, in order.
  static std::vector<std::string> DefaultRuntimeLibraries();

  // Loads the runtime from the first candidate that dlopens (DefaultRuntimeLibraries() when
  // empty). See the contract above.
  static absl::StatusOr<std::unique_ptr<CudaIpc>> Load(
      const std::vector<std::string>& runtime_candidates = {});

  ~CudaIpc();
  CudaIpc(const CudaIpc&) = delete;
  CudaIpc& operator=(const CudaIpc&) = delete;

  // The library path that was loaded.
  const std::string& runtime_library() const;

  absl::StatusOr<CudaIpcExport> Export(const void* device_ptr) const;

 private:
  struct Api;
  explicit CudaIpc(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_CUDA_IPC_H_
