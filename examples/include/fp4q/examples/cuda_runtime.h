// Device memory for the examples' CUDA IPC transport, through the CUDA runtime
// loaded at run time with dlopen (nothing links CUDA at build time; the client
// library's CudaIpc does the same for IPC exports).
//
// Contract
// - Load: FAILED_PRECONDITION when no candidate library loads (naming each and
// dlerror()'s
//   reason), when a symbol is missing, or when the runtime reports no usable
//   device (the CUDA error name and text, e.g. cudaErrorNoDevice or
//   cudaErrorInsufficientDriver where no driver is installed). The examples
//   turn that into "skipped".
// - Allocate uses cudaMalloc on the current device (device 0 unless the caller
// changed it), so
//   the memory can be exported with cudaIpcGetMemHandle. DeviceBuffer frees it.
// - Copies are synchronous for the host: CopyToDevice and Fill return only
// after the device
//   memory holds the data (cudaDeviceSynchronize after the call), which is what
//   the service's ordering contract requires before a request naming the memory
//   is sent.
// - Every failed CUDA call is INTERNAL with the call, the error name and CUDA's
// message.
// - Thread safety: calls may come from any thread; the examples use one.
#ifndef FP4Q_EXAMPLES_CUDA_RUNTIME_H_
#define FP4Q_EXAMPLES_CUDA_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::examples {

class CudaRuntime;

// A cudaMalloc'ed allocation; move-only; freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  friend class CudaRuntime;
  DeviceBuffer(const CudaRuntime* runtime, void* data, uint64_t bytes)
      : runtime_(runtime), data_(data), bytes_(bytes) {}
  void Reset();
  const CudaRuntime* runtime_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class CudaRuntime {
 public:
  // Candidates tried in order (empty: libcudart.so.13, libcudart.so).
  static absl::StatusOr<std::unique_ptr<CudaRuntime>> Load(
      const std::vector<std::string>& candidates = {});
  ~CudaRuntime();
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  const std::string& library() const;
  int device_count() const;

  // INVALID_ARGUMENT for bytes == 0.
  absl::StatusOr<DeviceBuffer> Allocate(uint64_t bytes) const;
  // [offset, offset + bytes) must lie inside `buffer` (INVALID_ARGUMENT
  // otherwise).
  absl::Status CopyToDevice(const DeviceBuffer& buffer, uint64_t offset,
                            const void* src, uint64_t bytes) const;
  absl::Status CopyToHost(void* dst, const DeviceBuffer& buffer,
                          uint64_t offset, uint64_t bytes) const;
  // Sets every byte of the range to `value`.
  absl::Status Fill(const DeviceBuffer& buffer, uint64_t offset, uint8_t value,
                    uint64_t bytes) const;

 private:
  struct Api;
  friend class DeviceBuffer;
  explicit CudaRuntime(std::unique_ptr<Api> api);
  void Free(void* ptr) const;
  std::unique_ptr<Api> api_;
};

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_CUDA_RUNTIME_H_
