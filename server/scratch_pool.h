// ScratchPool: per-device cache of request scratch buffers (inline tensors copied to the device,
// inline outputs, global-scale records, quality samples), so a request does not pay a
// cudaMalloc and a cudaFree (which waits for the whole device, stalling every other stream).
//
// - Take(bytes) hands out a buffer of at least `bytes` (sizes are rounded up to a power of two,
//   256 bytes at least) from the cache, or allocates one from the backend.
// - Give(buffer) returns it. The caller must have synchronized the stream that last used the
//   buffer (OpEnv does when the request ends), so a buffer handed to another stream is idle.
// - At most `max_cached_bytes` stay cached; beyond that, and for buffers larger than a quarter
//   of it, Give frees. max_cached_bytes 0: no caching (every Take allocates).
// Thread-safe.
#ifndef FP4Q_SERVER_SCRATCH_POOL_H_
#define FP4Q_SERVER_SCRATCH_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/kernels/backend.h"
#include "server/device_buffer.h"

namespace fp4q::server {

class ScratchPool {
 public:
  // `backend` is not owned and outlives the pool.
  ScratchPool(kernels::Backend* backend, uint64_t max_cached_bytes)
      : backend_(backend), max_cached_bytes_(max_cached_bytes) {}
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;

  absl::StatusOr<DeviceBuffer> Take(size_t bytes);
  void Give(DeviceBuffer buffer);

  uint64_t cached_bytes() const;
  // Takes served from the cache / by a new allocation (for tests).
  uint64_t hits() const;
  uint64_t misses() const;

  // The size class of `bytes`.
  static size_t RoundUp(size_t bytes);

 private:
  kernels::Backend* const backend_;
  const uint64_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<DeviceBuffer>> free_;  // by size class
  uint64_t cached_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_SCRATCH_POOL_H_
