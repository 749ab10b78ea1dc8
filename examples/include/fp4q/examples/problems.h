// The training problems of the examples: synthetic data, a loss, and its
// gradient, computed on the client in double precision from the weights'
// current values.
//
// Both are teacher/student regressions: the student starts at random weights W0
// and the teacher (the target) is W* = W0 + rho * E with E independent noise of
// the same scale as W0 (a fine-tuning step away from the start). The
// least-squares rescaling of W0 towards W* is then 1 in expectation, so no part
// of the loss can be removed by scaling a whole tensor, which is what NVFP4's
// per-tensor scale does by itself under round-to-nearest (see
// docs/TRAINING.md).
//
// Contract
// - Everything is a deterministic function of the seed (random.h), bit for bit
// on every
//   machine: data and weights come from SplitMix64, sums run in a fixed order,
//   and no libm transcendental is used.
// - LossAndGradient: `weights` holds one f32 vector per tensor() in order, each
// rows*cols
//   values (row-major); INVALID_ARGUMENT naming the tensor otherwise. `grads`,
//   when not null, is resized and receives the f32 gradient (each value rounded
//   once from double).
// - Thread-compatible: const methods may run concurrently.
#ifndef FP4Q_EXAMPLES_PROBLEMS_H_
#define FP4Q_EXAMPLES_PROBLEMS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp4q::examples {

struct TensorSpec {
  std::string name;  // "w", "w1", "w2"
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t size() const { return rows * cols; }
};

using Weights = std::vector<std::vector<float>>;

class Problem {
 public:
  virtual ~Problem() = default;
  // One line for the table's header.
  virtual std::string Describe() const = 0;
  virtual const std::vector<TensorSpec>& tensors() const = 0;
  // The student's start (f32, not quantized) and the teacher's weights.
  virtual const Weights& initial() const = 0;
  virtual const Weights& target() const = 0;
  virtual absl::StatusOr<double> LossAndGradient(const Weights& weights,
                                                 Weights* grads) const = 0;
};

// Linear regression y = W* x: 256 inputs, 64 outputs, 2048 samples x ~ N(0, I)
// (Irwin-Hall), W0 entries of scale 1/16, rho = 0.5. Loss (1/2N) sum_n |W x_n -
// y_n|^2, gradient (W X^T - Y^T) X / N, both from the sufficient statistics X^T
// X / N and Y^T X / N.
std::unique_ptr<Problem> MakeLinearProblem(uint64_t seed);

// Two-layer MLP y = W2 f(W1 x): 128 inputs, 64 hidden units, 16 outputs, 512
// samples, f the softsign z / (1 + |z|), rho = 0.5. Loss (1/2N) sum_n |y^_n -
// y_n|^2, gradient by backpropagation.
std::unique_ptr<Problem> MakeMlpProblem(uint64_t seed);

// Shared check of LossAndGradient's argument.
absl::Status CheckWeights(const std::vector<TensorSpec>& specs,
                          const Weights& weights);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_PROBLEMS_H_
