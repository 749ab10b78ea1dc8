// One experiment of the examples: a Problem trained for a number of steps in
// five variants, each from the same f32 start W0:
//   fp32    the client updates an f32 weight itself: W <- RN(W - RN(lr * g));
//   no service. RTN     the 4-bit weight is updated through the service with
//   round-to-nearest, SR      ... with stochastic rounding (seed, step), RTN+EF
//   ... round-to-nearest with error feedback (server-held f32 residual), SR+EF
//   ... stochastic rounding with error feedback.
// The quantized variants go through one of two paths:
//   kStoredWeight  CreateWeight(W0) then UpdateWeight(gradient, lr, step) each
//   step; the
//                  client computes the gradient at the DQ(W) the update
//                  returns;
//   kQdq           the client holds W: W <- Qdq(W - lr * g, step, residual_key
//   for EF), the
//                  pattern W = ErrorFeedback.qdq(name, W - lr * grad, step).
//                  Its first call (step 0, W0) creates the residual with W0's
//                  quantization error, as CreateWeight does for a weight with
//                  error feedback, so the two paths do the same arithmetic
//                  (docs/DESIGN.md "UpdateWeight").
//
// Measured per variant: the loss after every step, and the fraction of weights
// whose 4-bit code changed at least once (stored path: the stored codes,
// GetWeight quantized=true; QDQ path: the codes of Quantize(W) with
// round-to-nearest; -0 and +0 count as the same code). Measured on the RTN run:
// the fraction of per-step updates smaller than half the grid step around the
// weight (Nvfp4Grid).
//
// Contract
// - Server state is named "fp4q-examples/<example>/<random run
// id>/<variant>/<tensor>" and
//   deleted when a variant ends, also after an error (best effort).
// - Errors: the service's, unchanged; a reply that disagrees with itself (DQ(W)
// not equal to
//   the decoded codes and scales) is INTERNAL.
#ifndef FP4Q_EXAMPLES_EXPERIMENT_H_
#define FP4Q_EXAMPLES_EXPERIMENT_H_

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/client/client.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/transport.h"

namespace fp4q::examples {

enum class Variant { kFp32, kRtn, kSr, kRtnEf, kSrEf };
inline constexpr Variant kAllVariants[] = {Variant::kFp32, Variant::kRtn,
                                           Variant::kSr, Variant::kRtnEf,
                                           Variant::kSrEf};
const char* VariantKey(Variant v);    // "fp32", "rtn", "sr", "rtn_ef", "sr_ef"
const char* VariantLabel(Variant v);  // "fp32", "RTN", "SR", "RTN+EF", "SR+EF"
bool IsQuantized(Variant v);
bool IsStochastic(Variant v);
bool HasErrorFeedback(Variant v);

enum class UpdatePath { kStoredWeight, kQdq };

struct ExperimentConfig {
  std::string example;  // "linear", "mlp", "linear_qdq": names and reports
  UpdatePath path = UpdatePath::kStoredWeight;
  int64_t steps = 500;
  double lr = 0.01;  // sent as f32
  uint64_t seed = 1;
};

struct VariantResult {
  Variant variant = Variant::kFp32;
  std::vector<double>
      losses;  // steps + 1 values: before the first update, after each
  int64_t moved =
      0;  // weights whose code changed at least once (quantized only)
  int64_t weights = 0;  // weights counted (0 for fp32)
  double seconds = 0;
  // NaN when no loss was recorded.
  double start_loss() const { return losses.empty() ? NAN : losses.front(); }
  double final_loss() const { return losses.empty() ? NAN : losses.back(); }
  double moved_fraction() const;  // NaN for fp32
};

struct ExperimentResult {
  ExperimentConfig config;
  std::string problem;    // Problem::Describe()
  std::string server;     // address
  std::string backend;    // ServerInfo backend, "cpu" or "cuda"
  std::string transport;  // "inline" or "cuda_ipc"
  // Per-step updates smaller than half a grid step, on the RTN run: at step 1,
  // and over all.
  int64_t below_first = 0, count_first = 0;
  int64_t below_all = 0, count_all = 0;
  // Loss at the teacher's weights quantized with round-to-nearest: what a
  // perfect 4-bit weight would reach, for reference.
  double target_rtn_loss = 0;
  std::vector<VariantResult> variants;  // kAllVariants order

  const VariantResult& Get(Variant v) const;
};

// Runs the five variants in order. `progress`, when not null, gets one line per
// variant.
absl::StatusOr<ExperimentResult> RunExperiment(const client::Client& client,
                                               Transport& transport,
                                               const Problem& problem,
                                               const ExperimentConfig& config,
                                               std::ostream* progress);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_EXPERIMENT_H_
