// The CUDA runtime (libcudart), reached at run time with dlopen/dlsym.
//
// Nothing in the client, the CLI or the examples links CUDA: this is the one place that opens
// libcudart and looks up its calls. Users: CudaIpc (cuda_ipc.h: IPC handle exports),
// `fp4q bench-ipc` (device memory for its latency run) and the examples' CUDA IPC transport.
// Only plain C types cross the boundary (cudaError_t is an int, pointers, sizes), so no CUDA
// header is needed to build this either.
//
// Contract
// - Load opens the first candidate dlopen accepts (DefaultLibraries() when none are given) and
//   looks up every call below; a call the library lacks stays unset. When no candidate loads:
//   FAILED_PRECONDITION "no CUDA runtime (tried LIB: dlerror; LIB: dlerror)"; callers add what
//   they needed it for.
// - Require(calls): FAILED_PRECONDITION "CUDA runtime LIB lacks cudaA, cudaB" naming, in the
//   order given, every call the library lacks. A user requires what it calls right after Load.
//   Calling an unset function returns kCudaErrorSymbolNotFound instead of crashing.
// - Check(call, error): OK for cudaSuccess, else a Status whose message is
//   "CALL: cudaErrorName (CUDA's text)" and whose code says whose problem it is:
//     FAILED_PRECONDITION  no usable CUDA here (no device, no or old driver, stub library,
//                          devices unavailable); the message starts with "CUDA unavailable: ";
//     RESOURCE_EXHAUSTED   out of device memory;
//     INVALID_ARGUMENT     an invalid value, device, or device pointer; an unsupported operation;
//     INTERNAL             anything else.
// - Device memory: Allocate is cudaMalloc on the current device (exportable with
//   cudaIpcGetMemHandle); DeviceBuffer frees it. CopyToDevice and Fill return only once the
//   device holds the bytes (cudaDeviceSynchronize after the call): the service's ordering
//   contract requires that before a request naming the memory is sent. A range outside the
//   buffer is INVALID_ARGUMENT. These need kMalloc, kFree, kMemcpy, kMemset and
//   kDeviceSynchronize.
// - Thread safety: every method may be called from any thread; the runtime's own rules apply
//   to the current device (per thread).
#ifndef FP4Q_CLIENT_CUDA_RUNTIME_H_
#define FP4Q_CLIENT_CUDA_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::client {

using CudaError = int;  // cudaError_t
inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorSymbolNotFound = 500;

inline constexpr size_t kCudaIpcHandleBytes = 64;

enum class CudaMemcpyKind : int { kHostToDevice = 1, kDeviceToHost = 2 };

// cudaPointerAttributes (CUDA 13's layout; the fields used are unchanged since CUDA 10).
struct CudaPointerAttributes {
  int type;  // 0 unregistered, 1 host, 2 device, 3 managed
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[8];  // CUDA 13 ("must be zero"); older runtimes write less
};

struct CudaIpcMemHandle {  // cudaIpcMemHandle_t
  char reserved[kCudaIpcHandleBytes];
};

// The calls this wrapper knows, for Require.
enum class CudaCall : int {
  kGetErrorName,
  kGetErrorString,
  kGetDeviceCount,
  kGetDevice,
  kSetDevice,
  kMalloc,
  kFree,
  kMemcpy,
  kMemset,
  kDeviceSynchronize,
  kPointerGetAttributes,
  kIpcGetMemHandle,
  kIpcOpenMemHandle,
  kIpcCloseMemHandle,
  kGetDriverEntryPointByVersion,
  kCount,
};

// The CUDA name of a call ("cudaMalloc").
const char* CudaCallName(CudaCall call);

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
  const CudaRuntime* runtime_ = nullptr;  // must outlive the buffer
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class CudaRuntime {
 public:
  // libcudart.so.13, then libcudart.so.
  static std::vector<std::string> DefaultLibraries();

  static absl::StatusOr<std::unique_ptr<CudaRuntime>> Load(
      const std::vector<std::string>& candidates = {});

  virtual ~CudaRuntime();
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  // The library that was loaded, as it was named in the candidates.
  const std::string& library() const;

  bool Has(CudaCall call) const;
  absl::Status Require(std::initializer_list<CudaCall> calls) const;

  // "cudaErrorNoDevice (no CUDA-capable device is detected)".
  std::string ErrorText(CudaError error) const;
  absl::Status Check(const char* call, CudaError error) const;

  // The runtime's calls, as CUDA declares them.
  CudaError GetDeviceCount(int* count) const;
  CudaError GetDevice(int* device) const;
  CudaError SetDevice(int device) const;
  CudaError Malloc(void** ptr, size_t bytes) const;
  CudaError Free(void* ptr) const;
  CudaError Memcpy(void* dst, const void* src, size_t bytes, CudaMemcpyKind kind) const;
  CudaError Memset(void* ptr, int value, size_t bytes) const;
  CudaError DeviceSynchronize() const;
  CudaError PointerGetAttributes(CudaPointerAttributes* attributes, const void* ptr) const;
  CudaError IpcGetMemHandle(CudaIpcMemHandle* handle, void* ptr) const;
  CudaError IpcOpenMemHandle(void** ptr, const CudaIpcMemHandle& handle,
                             unsigned int flags) const;
  CudaError IpcCloseMemHandle(void* ptr) const;
  CudaError GetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                         unsigned long long flags, int* query_result) const;

  // The number of devices; FAILED_PRECONDITION "no usable CUDA device: ..." when the runtime
  // reports an error or none.
  absl::StatusOr<int> DeviceCount() const;

  // INVALID_ARGUMENT for bytes == 0; the cudaMalloc error otherwise (Check).
  absl::StatusOr<DeviceBuffer> Allocate(uint64_t bytes) const;
  // [offset, offset + bytes) must lie inside `buffer`.
  absl::Status CopyToDevice(const DeviceBuffer& buffer, uint64_t offset, const void* src,
                            uint64_t bytes) const;
  absl::Status CopyToHost(void* dst, const DeviceBuffer& buffer, uint64_t offset,
                          uint64_t bytes) const;
  // Sets every byte of the range to `value`.
  absl::Status Fill(const DeviceBuffer& buffer, uint64_t offset, uint8_t value,
                    uint64_t bytes) const;

 protected:
  // For wrappers that load through Load and add their own checks (the examples).
  CudaRuntime(CudaRuntime&& other) noexcept;

 private:
  struct Library;
  explicit CudaRuntime(std::unique_ptr<Library> library);
  std::unique_ptr<Library> library_;
};

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_CUDA_RUNTIME_H_
