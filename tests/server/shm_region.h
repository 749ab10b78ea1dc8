// The client side of fake_shm_cuda_module.cc: a POSIX shared memory object
// standing in for a CUDA allocation, and its 64-byte "IPC handle". Removed
// (unlinked and unmapped) on destruction.
#ifndef FP4Q_TESTS_SERVER_SHM_REGION_H_
#define FP4Q_TESTS_SERVER_SHM_REGION_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace fp4q::server::testing {

// The UUID of the fake module's only device.
inline constexpr char kFakeShmUuid[] = "GPU-fake-shm-0";

class ShmRegion {
 public:
  // Creates a zero-filled object of `bytes` bytes; ok() says whether it worked.
  explicit ShmRegion(size_t bytes) : bytes_(bytes) {
    static std::atomic<int> counter{0};
    name_ = absl::StrCat("/fp4q-test-", ::getpid(), "-", counter++);
    const int fd = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
    }
    ::close(fd);
  }
  ~ShmRegion() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    ::shm_unlink(name_.c_str());
  }
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  bool ok() const { return data_ != nullptr; }
  uint8_t* data() { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  // "FP4QSHM:" + name, NUL-padded to 64 bytes.
  std::string Handle() const {
    std::string h(64, '\0');
    std::memcpy(h.data(), "FP4QSHM:", 8);
    std::memcpy(h.data() + 8, name_.data(), name_.size());
    return h;
  }

 private:
  size_t bytes_;
  std::string name_;
  uint8_t* data_ = nullptr;
};

}  // namespace fp4q::server::testing

#endif  // FP4Q_TESTS_SERVER_SHM_REGION_H_
