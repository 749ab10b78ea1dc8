// Stream-ordered temporaries; see staging.h.
#include "cuda/staging.h"

#include <cstdint>

#include "cuda/cuda_status.h"

namespace fp4q::kernels::cuda {

Staging::~Staging() {
  for (const Entry& e : entries_) {
    if (e.staged != e.user) cudaFreeAsync(e.staged, stream_);
  }
  for (void* p : scratch_) cudaFreeAsync(p, stream_);
}

absl::StatusOr<void*> Staging::Use(const void* p, size_t bytes, bool copy_in, bool copy_out) {
  if (p == nullptr) return nullptr;
  for (Entry& e : entries_) {
    if (e.user == p) {
      if (bytes > e.bytes) {
        return absl::InternalError("staging: one buffer used with two different sizes");
      }
      e.copy_out = e.copy_out || copy_out;
      return e.staged;
    }
  }
  if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
    entries_.push_back(Entry{p, const_cast<void*>(p), bytes, false});
    return const_cast<void*>(p);
  }
  void* staged = nullptr;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&staged, bytes == 0 ? 16 : bytes, stream_));
  entries_.push_back(Entry{p, staged, bytes, copy_out});
  if (copy_in && bytes > 0) {
    FP4Q_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(staged, p, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  return staged;
}

absl::StatusOr<void*> Staging::Scratch(size_t bytes) {
  void* p = nullptr;
  FP4Q_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, bytes == 0 ? 16 : bytes, stream_));
  scratch_.push_back(p);
  return p;
}

absl::Status Staging::Finish() {
  for (Entry& e : entries_) {
    if (e.staged == e.user) continue;
    if (e.copy_out && e.bytes > 0) {
      FP4Q_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<void*>(e.user), e.staged, e.bytes,
                                                cudaMemcpyDeviceToDevice, stream_));
    }
    void* staged = e.staged;
    e.staged = const_cast<void*>(e.user);  // freed: the destructor skips it
    FP4Q_CUDA_RETURN_IF_ERROR(cudaFreeAsync(staged, stream_));
  }
  while (!scratch_.empty()) {
    void* p = scratch_.back();
    scratch_.pop_back();
    FP4Q_CUDA_RETURN_IF_ERROR(cudaFreeAsync(p, stream_));
  }
  return absl::OkStatus();
}

}  // namespace fp4q::kernels::cuda
