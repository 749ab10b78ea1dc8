// A stored weight's optimizer state on the weight's device: the moment tensors its
// OptimizerSpec names (SGD: a momentum buffer; AdamW: m, v and with amsgrad max v), each in the
// spec's StateDType (F32, BF16, or NVFP4 with its own global record), zeroed at creation.
// Owned by a StateEntry and guarded by its op_mu. docs/NUMERICS.md section 10 defines the values.
#ifndef FP4Q_SERVER_OPTIMIZER_STATE_H_
#define FP4Q_SERVER_OPTIMIZER_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/step.h"
#include "server/device_buffer.h"

namespace fp4q::server {

// What a weight keeps (fp4q.v1.OptimizerSpec, normalized). `stateful()` false: plain SGD.
struct OptimizerSpec {
  kernels::OptimizerKind kind = kernels::OptimizerKind::kSgd;
  bool momentum = false;  // SGD
  bool amsgrad = false;   // AdamW
  kernels::StateDType dtype = kernels::StateDType::kF32;

  bool stateful() const { return kind == kernels::OptimizerKind::kAdamW || momentum; }
  int moments() const {
    return kind == kernels::OptimizerKind::kAdamW ? (amsgrad ? 3 : 2) : (momentum ? 1 : 0);
  }
  bool operator==(const OptimizerSpec& o) const {
    return kind == o.kind && momentum == o.momentum && amsgrad == o.amsgrad && dtype == o.dtype;
  }
  // "SGD", "SGD with momentum (BF16)", "AdamW with amsgrad (NVFP4)".
  std::string ToString() const;
};

// The torch.optim state name of moment i (0 .. moments() - 1): "momentum_buffer", "exp_avg",
// "exp_avg_sq", "max_exp_avg_sq".
const char* MomentName(const OptimizerSpec& spec, int i);

class OptimizerStorage {
 public:
  // One moment tensor's buffers.
  struct Moment {
    DeviceBuffer dense;                 // F32 / BF16
    DeviceBuffer codes, scales, global;  // NVFP4
  };

  // Bytes of backend memory the state of `spec` takes for a [rows, cols] weight.
  static absl::StatusOr<uint64_t> BytesFor(const OptimizerSpec& spec, int64_t rows, int64_t cols);

  // Allocates and zeroes the state of `spec` (synchronizes `stream`).
  static absl::StatusOr<OptimizerStorage> Create(kernels::Backend* backend, kernels::Stream stream,
                                                 const OptimizerSpec& spec, int64_t rows,
                                                 int64_t cols);

  const OptimizerSpec& spec() const { return spec_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  uint64_t bytes() const { return bytes_; }
  // The kernels' view (step.h) with the buffers of every moment.
  kernels::OptimizerState View() const;
  std::vector<Moment>& moments() { return moments_; }
  const std::vector<Moment>& moments() const { return moments_; }
  // The NVFP4 view of moment i (NVFP4 storage only).
  kernels::QuantizedTensor QuantizedView(int i) const;

 private:
  OptimizerSpec spec_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  uint64_t bytes_ = 0;
  std::vector<Moment> moments_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_OPTIMIZER_STATE_H_
