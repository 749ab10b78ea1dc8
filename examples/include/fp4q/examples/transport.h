// How the examples move the per-step tensors to the service and back.
//
// - Inline: tensors travel inside the gRPC messages.
// - CUDA IPC: the client copies the update into device memory it allocated
// (cuda_runtime.h),
//   registers that allocation once through a Session (client library,
//   session.h), and names slices of it in the requests; the server writes its
//   result (DQ(W) or the QDQ output) into another slice, which the client
//   copies back. The output slice is filled with 0xFF bytes (f32 NaN) before
//   every request, so a result the server did not write is caught.
//
// Contract
// - UpdateWeight sends one gradient step (UPDATE_KIND_GRADIENT, `lr`) for
// weight `name` at
//   `step` and returns the new DQ(W) as f32. The step must be applied by this
//   call: a reply with applied=false (the step was applied before) is
//   FAILED_PRECONDITION. Replies are checked: dtype F32, shape [rows, cols],
//   every value finite (the weights are finite by construction, so a non-finite
//   value means the output was not written), else INTERNAL.
// - Qdq sends `x` ([rows, cols] f32) with `options` and returns the f32 QDQ
// values, checked
//   the same way.
// - Errors of the service keep their code and message (client.h).
// - Not thread-safe: one request at a time per transport.
#ifndef FP4Q_EXAMPLES_TRANSPORT_H_
#define FP4Q_EXAMPLES_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fp4q/client/client.h"
#include "fp4q/examples/cuda_runtime.h"
#include "fp4q/examples/options.h"

namespace fp4q::examples {

namespace v1 = ::fp4q::v1;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;

  virtual absl::StatusOr<std::vector<float>> UpdateWeight(
      const std::string& name, int64_t step, float lr,
      absl::Span<const float> gradient, int64_t rows, int64_t cols) = 0;
  virtual absl::StatusOr<std::vector<float>> Qdq(
      absl::Span<const float> x, int64_t rows, int64_t cols,
      const v1::QuantOptions& options) = 0;
};

std::unique_ptr<Transport> MakeInlineTransport(const client::Client& client);

// A CUDA IPC transport able to carry tensors of up to `max_elements` f32
// values, over a loaded CUDA runtime (cuda_runtime.h; CudaRuntime::Load is
// where "no GPU" shows). Allocates the device memory and opens a session; the
// region is registered on the first request (the server answers
// FAILED_PRECONDITION there unless it runs with --allow_cuda_ipc).
absl::StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(
    const client::Client& client, std::unique_ptr<CudaRuntime> cuda,
    int64_t max_elements);

// The checks both transports apply to a result (exposed for tests): dtype F32,
// shape [rows, cols], `values` (already decoded) all finite.
absl::Status CheckResult(const v1::TensorResult& result,
                         absl::Span<const float> values, int64_t rows,
                         int64_t cols, const char* what);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_TRANSPORT_H_
