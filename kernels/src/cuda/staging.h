// Stream-ordered temporaries of one backend call: scratch buffers and aligned stand-ins for
// caller buffers the kernels cannot address directly.
//
// The kernels use 16-byte vector accesses, so they need 16-byte-aligned base pointers. Views
// may point anywhere (a region plus an odd offset), so Use() hands back the pointer itself when
// it is aligned and otherwise a pool buffer holding a copy (copy_in), whose contents go back to
// the caller's buffer in Finish() (copy_out). The same pointer used twice (an output aliasing an
// input) maps to the same stand-in. Everything comes from the device's stream-ordered pool
// (cudaMallocAsync) on the call's stream and is freed there, so concurrent streams never share
// a buffer and nothing waits for the host.
#ifndef FP4Q_KERNELS_SRC_CUDA_STAGING_H_
#define FP4Q_KERNELS_SRC_CUDA_STAGING_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::kernels::cuda {

class Staging {
 public:
  explicit Staging(cudaStream_t stream) : stream_(stream) {}
  ~Staging();  // frees what Finish() did not (the call failed)
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // `p` itself when 16-byte aligned, else an aligned copy. Null stays null.
  absl::StatusOr<void*> Use(const void* p, size_t bytes, bool copy_in, bool copy_out);
  template <typename T>
  absl::StatusOr<T*> UseAs(const void* p, size_t bytes, bool copy_in, bool copy_out) {
    absl::StatusOr<void*> r = Use(p, bytes, copy_in, copy_out);
    if (!r.ok()) return r.status();
    return static_cast<T*>(*r);
  }
  // A pool buffer of `bytes` (uninitialized).
  absl::StatusOr<void*> Scratch(size_t bytes);
  // Copies stand-ins back to the caller's buffers and frees everything (stream-ordered).
  absl::Status Finish();

 private:
  struct Entry {
    const void* user;
    void* staged;
    size_t bytes;
    bool copy_out;
  };
  cudaStream_t stream_;
  // Inline: a call uses a handful of buffers (no heap allocation on a small call's path).
  absl::InlinedVector<Entry, 8> entries_;
  absl::InlinedVector<void*, 4> scratch_;
};

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_STAGING_H_
