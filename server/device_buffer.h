// DeviceBuffer: memory in one backend's space (device memory for CUDA, host for CPU), freed on
// destruction. Move-only.
#ifndef FP4Q_SERVER_DEVICE_BUFFER_H_
#define FP4Q_SERVER_DEVICE_BUFFER_H_

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "fp4q/kernels/backend.h"

namespace fp4q::server {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (> 0) from `backend` (not owned; must outlive the buffer).
  static absl::StatusOr<DeviceBuffer> Allocate(kernels::Backend* backend, size_t bytes) {
    if (bytes == 0) return DeviceBuffer();
    absl::StatusOr<void*> ptr = backend->Allocate(bytes);
    if (!ptr.ok()) return ptr.status();
    DeviceBuffer b;
    b.backend_ = backend;
    b.ptr_ = *ptr;
    b.size_ = bytes;
    return b;
  }
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = std::exchange(o.backend_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void Reset() {
    if (ptr_ != nullptr) backend_->Free(ptr_);
    backend_ = nullptr;
    ptr_ = nullptr;
    size_ = 0;
  }
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  kernels::Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_DEVICE_BUFFER_H_
