#include "server/scratch_pool.h"

#include <utility>

namespace fp4q::server {

size_t ScratchPool::RoundUp(size_t bytes) {
  size_t size = 256;
  while (size < bytes && size < (size_t{1} << 62)) size <<= 1;
  return size < bytes ? bytes : size;
}

absl::StatusOr<DeviceBuffer> ScratchPool::Take(size_t bytes) {
  const size_t size = RoundUp(bytes == 0 ? 1 : bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      DeviceBuffer b = std::move(it->second.back());
      it->second.pop_back();
      cached_ -= b.size();
      ++hits_;
      return b;
    }
    ++misses_;
  }
  return DeviceBuffer::Allocate(backend_, size);
}

void ScratchPool::Give(DeviceBuffer buffer) {
  if (buffer.empty()) return;
  const size_t size = buffer.size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (RoundUp(size) == size && size <= max_cached_bytes_ / 4 &&
        cached_ + size <= max_cached_bytes_) {
      cached_ += size;
      free_[size].push_back(std::move(buffer));
      return;
    }
  }
  buffer.Reset();  // outside the lock: a cudaFree may wait for the device
}

uint64_t ScratchPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}
uint64_t ScratchPool::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
uint64_t ScratchPool::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace fp4q::server
