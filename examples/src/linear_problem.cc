// Linear regression from sufficient statistics: with S = X^T X / N, C = Y^T X /
// N and q = (1/N) sum_n |y_n|^2, the loss (1/2N) sum_n |W x_n - y_n|^2 equals
// 0.5 <W, W S> - <W, C> + 0.5 q and its gradient is W S - C. This costs
// out*in*in per step instead of N*out*in, exactly the same function.
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/random.h"

namespace fp4q::examples {
namespace {

constexpr int64_t kIn = 256;
constexpr int64_t kOut = 64;
constexpr int64_t kSamples = 2048;
constexpr double kWeightScale = 1.0 / 16.0;  // 1 / sqrt(kIn)
constexpr double kRho = 0.5;

class LinearProblem : public Problem {
 public:
  explicit LinearProblem(uint64_t seed) {
    specs_ = {{"w", kOut, kIn}};
    Rng w_rng = StreamRng(seed, 1);
    Rng e_rng = StreamRng(seed, 2);
    Rng x_rng = StreamRng(seed, 3);
    std::vector<float> w0 = NormalVector(w_rng, kOut * kIn, kWeightScale);
    std::vector<float> noise =
        NormalVector(e_rng, kOut * kIn, kRho * kWeightScale);
    std::vector<float> target(w0.size());
    for (size_t i = 0; i < w0.size(); ++i) target[i] = w0[i] + noise[i];
    initial_ = {std::move(w0)};
    target_ = {std::move(target)};

    const std::vector<float> x = NormalVector(x_rng, kSamples * kIn, 1.0);
    sigma_.assign(kIn * kIn, 0.0);
    c_.assign(kOut * kIn, 0.0);
    q_ = 0.0;
    std::vector<double> y(kOut);
    const std::vector<float>& ws = target_[0];
    for (int64_t n = 0; n < kSamples; ++n) {
      const float* xn = &x[n * kIn];
      for (int64_t i = 0; i < kIn; ++i) {
        double* row = &sigma_[i * kIn];
        const double xi = xn[i];
        for (int64_t j = 0; j < kIn; ++j) row[j] += xi * xn[j];
      }
      for (int64_t o = 0; o < kOut; ++o) {
        double acc = 0.0;
        for (int64_t k = 0; k < kIn; ++k)
          acc += static_cast<double>(ws[o * kIn + k]) * xn[k];
        y[o] = acc;
        q_ += acc * acc;
      }
      for (int64_t o = 0; o < kOut; ++o) {
        double* row = &c_[o * kIn];
        for (int64_t k = 0; k < kIn; ++k) row[k] += y[o] * xn[k];
      }
    }
    const double inv_n = 1.0 / static_cast<double>(kSamples);
    for (double& v : sigma_) v *= inv_n;
    for (double& v : c_) v *= inv_n;
    q_ *= inv_n;
  }

  std::string Describe() const override {
    return absl::StrCat("linear regression y = W* x, ", kIn, " -> ", kOut, ", ",
                        kSamples, " samples");
  }
  const std::vector<TensorSpec>& tensors() const override { return specs_; }
  const Weights& initial() const override { return initial_; }
  const Weights& target() const override { return target_; }

  absl::StatusOr<double> LossAndGradient(const Weights& weights,
                                         Weights* grads) const override {
    FP4Q_RETURN_IF_ERROR(CheckWeights(specs_, weights));
    const std::vector<float>& w = weights[0];
    std::vector<double> ws(kIn);  // one row of W S
    double quad = 0.0, lin = 0.0;
    if (grads != nullptr) grads->assign(1, std::vector<float>(kOut * kIn));
    for (int64_t o = 0; o < kOut; ++o) {
      std::fill(ws.begin(), ws.end(), 0.0);
      for (int64_t k = 0; k < kIn; ++k) {
        const double wk = w[o * kIn + k];
        const double* srow = &sigma_[k * kIn];
        for (int64_t j = 0; j < kIn; ++j) ws[j] += wk * srow[j];
      }
      for (int64_t j = 0; j < kIn; ++j) {
        const double wj = w[o * kIn + j];
        const double cj = c_[o * kIn + j];
        quad += wj * ws[j];
        lin += wj * cj;
        if (grads != nullptr)
          (*grads)[0][o * kIn + j] = static_cast<float>(ws[j] - cj);
      }
    }
    return 0.5 * quad - lin + 0.5 * q_;
  }

 private:
  std::vector<TensorSpec> specs_;
  Weights initial_;
  Weights target_;
  std::vector<double> sigma_;  // X^T X / N, [in, in]
  std::vector<double> c_;      // Y^T X / N, [out, in]
  double q_ = 0.0;             // mean |y|^2
};

}  // namespace

absl::Status CheckWeights(const std::vector<TensorSpec>& specs,
                          const Weights& weights) {
  if (weights.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: ", weights.size(), " tensors, expected ", specs.size()));
  }
  for (size_t t = 0; t < specs.size(); ++t) {
    if (static_cast<int64_t>(weights[t].size()) != specs[t].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights[", t, "] (", specs[t].name, "): ", weights[t].size(),
          " values, expected ", specs[t].size()));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Problem> MakeLinearProblem(uint64_t seed) {
  return std::make_unique<LinearProblem>(seed);
}

}  // namespace fp4q::examples
