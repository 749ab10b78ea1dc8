// How one tensor of one variant is updated (experiment.h describes the variants
// and paths). Private to the examples library.
#ifndef FP4Q_EXAMPLES_SRC_UPDATERS_H_
#define FP4Q_EXAMPLES_SRC_UPDATERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fp4q/client/client.h"
#include "fp4q/examples/experiment.h"
#include "fp4q/examples/nvfp4_grid.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/transport.h"

namespace fp4q::examples {

struct UpdaterSpec {
  Variant variant = Variant::kFp32;
  UpdatePath path = UpdatePath::kStoredWeight;
  std::string name;  // server name of the weight or residual key
  TensorSpec tensor;
  float lr = 0;
  uint64_t seed = 0;  // stochastic rounding seed of this tensor
};

class WeightUpdater {
 public:
  virtual ~WeightUpdater() = default;
  // Creates the state from the f32 start and returns the weight's value at step
  // 0.
  virtual absl::StatusOr<std::vector<float>> Start(
      absl::Span<const float> initial) = 0;
  // Applies step `step` (1, 2, ...) with the f32 gradient; returns the weight's
  // new value.
  virtual absl::StatusOr<std::vector<float>> Apply(
      int64_t step, absl::Span<const float> gradient) = 0;
  // The codes and scales of the current value (quantized variants only).
  virtual absl::StatusOr<Nvfp4Grid> Grid() = 0;
  // Relative tolerance of Grid() against the value (0: the stored codes,
  // bit-exact).
  virtual double GridTolerance() const = 0;
  // Deletes server state; idempotent.
  virtual absl::Status Finish() = 0;
};

absl::StatusOr<std::unique_ptr<WeightUpdater>> MakeUpdater(
    const client::Client& client, Transport& transport,
    const UpdaterSpec& spec);

// The client's f32 step: RN(w - RN(lr * g)) per element, the order UpdateWeight
// uses (min(w.size(), gradient.size()) elements; callers pass equal sizes).
std::vector<float> Fp32Step(absl::Span<const float> w,
                            absl::Span<const float> gradient, float lr);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_SRC_UPDATERS_H_
