// Two-layer MLP, teacher/student: y = W2 f(W1 x), f(z) = z / (1 + |z|)
// (softsign: smooth, odd, saturating like tanh, and computed with one IEEE
// division, so it is the same bits on every machine). Forward and backward
// passes in double, loops ordered so that the innermost loop runs over
// contiguous memory without reductions (vectorisable, same order as scalar).
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/examples/problems.h"
#include "fp4q/examples/random.h"

namespace fp4q::examples {
namespace {

constexpr int64_t kIn = 128;
constexpr int64_t kHidden = 64;
constexpr int64_t kOut = 16;
constexpr int64_t kSamples = 512;
constexpr double kRho = 0.5;

double Act(double z) { return z / (1.0 + std::fabs(z)); }
// f'(z) = 1 / (1 + |z|)^2.
double ActGrad(double z) {
  const double d = 1.0 + std::fabs(z);
  return 1.0 / (d * d);
}

// out[n][j] = sum_k a[n][k] * bt[k][j] (a [n_rows, inner], bt [inner, cols]).
void MatMul(const std::vector<double>& a, const std::vector<double>& bt,
            int64_t n_rows, int64_t inner, int64_t cols,
            std::vector<double>* out) {
  out->assign(static_cast<size_t>(n_rows * cols), 0.0);
  for (int64_t n = 0; n < n_rows; ++n) {
    double* o = &(*out)[n * cols];
    for (int64_t k = 0; k < inner; ++k) {
      const double av = a[n * inner + k];
      const double* b = &bt[k * cols];
      for (int64_t j = 0; j < cols; ++j) o[j] += av * b[j];
    }
  }
}

// [rows, cols] f32 -> [cols, rows] double.
std::vector<double> Transposed(const std::vector<float>& w, int64_t rows,
                               int64_t cols) {
  std::vector<double> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  }
  return t;
}

class MlpProblem : public Problem {
 public:
  explicit MlpProblem(uint64_t seed) {
    specs_ = {{"w1", kHidden, kIn}, {"w2", kOut, kHidden}};
    const double scale1 = 1.0 / std::sqrt(static_cast<double>(kIn));
    const double scale2 = 1.0 / std::sqrt(static_cast<double>(kHidden));
    Rng w_rng = StreamRng(seed, 11);
    Rng e_rng = StreamRng(seed, 12);
    Rng x_rng = StreamRng(seed, 13);
    initial_ = {NormalVector(w_rng, kHidden * kIn, scale1),
                NormalVector(w_rng, kOut * kHidden, scale2)};
    const std::vector<float> e1 =
        NormalVector(e_rng, kHidden * kIn, kRho * scale1);
    const std::vector<float> e2 =
        NormalVector(e_rng, kOut * kHidden, kRho * scale2);
    target_ = initial_;
    for (size_t i = 0; i < e1.size(); ++i) target_[0][i] += e1[i];
    for (size_t i = 0; i < e2.size(); ++i) target_[1][i] += e2[i];

    const std::vector<float> x = NormalVector(x_rng, kSamples * kIn, 1.0);
    x_.assign(x.begin(), x.end());
    Forward(target_, &y_, nullptr, nullptr);
  }

  std::string Describe() const override {
    return absl::StrCat("two-layer MLP y = W2 softsign(W1 x), ", kIn, " -> ",
                        kHidden, " -> ", kOut, ", ", kSamples, " samples");
  }
  const std::vector<TensorSpec>& tensors() const override { return specs_; }
  const Weights& initial() const override { return initial_; }
  const Weights& target() const override { return target_; }

  absl::StatusOr<double> LossAndGradient(const Weights& weights,
                                         Weights* grads) const override {
    FP4Q_RETURN_IF_ERROR(CheckWeights(specs_, weights));
    std::vector<double> p, z, h;
    Forward(weights, &p, &z, &h);
    std::vector<double> e(p.size());
    double loss = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      e[i] = p[i] - y_[i];
      loss += e[i] * e[i];
    }
    const double inv_n = 1.0 / static_cast<double>(kSamples);
    loss *= 0.5 * inv_n;
    if (grads == nullptr) return loss;

    // gW2 = E^T H / N: [out, hidden]; dZ = (E W2) .* f'(Z); gW1 = dZ^T X / N:
    // [hidden, in].
    std::vector<double> g2(kOut * kHidden, 0.0), g1(kHidden * kIn, 0.0);
    std::vector<double> dz(kHidden);
    const std::vector<float>& w2 = weights[1];
    for (int64_t n = 0; n < kSamples; ++n) {
      const double* en = &e[n * kOut];
      const double* hn = &h[n * kHidden];
      std::fill(dz.begin(), dz.end(), 0.0);
      for (int64_t o = 0; o < kOut; ++o) {
        double* g2row = &g2[o * kHidden];
        const float* w2row = &w2[o * kHidden];
        for (int64_t j = 0; j < kHidden; ++j) {
          g2row[j] += en[o] * hn[j];
          dz[j] += en[o] * w2row[j];
        }
      }
      const double* xn = &x_[n * kIn];
      for (int64_t j = 0; j < kHidden; ++j) {
        const double d = dz[j] * ActGrad(z[n * kHidden + j]);
        double* g1row = &g1[j * kIn];
        for (int64_t k = 0; k < kIn; ++k) g1row[k] += d * xn[k];
      }
    }
    grads->resize(2);
    (*grads)[0].resize(g1.size());
    (*grads)[1].resize(g2.size());
    for (size_t i = 0; i < g1.size(); ++i)
      (*grads)[0][i] = static_cast<float>(g1[i] * inv_n);
    for (size_t i = 0; i < g2.size(); ++i)
      (*grads)[1][i] = static_cast<float>(g2[i] * inv_n);
    return loss;
  }

 private:
  // p = W2 f(W1 x) for every sample; z and h (pre- and post-activations) when
  // not null.
  void Forward(const Weights& w, std::vector<double>* p,
               std::vector<double>* z_out, std::vector<double>* h_out) const {
    std::vector<double> z, h;
    MatMul(x_, Transposed(w[0], kHidden, kIn), kSamples, kIn, kHidden, &z);
    h.resize(z.size());
    for (size_t i = 0; i < z.size(); ++i) h[i] = Act(z[i]);
    MatMul(h, Transposed(w[1], kOut, kHidden), kSamples, kHidden, kOut, p);
    if (z_out != nullptr) *z_out = std::move(z);
    if (h_out != nullptr) *h_out = std::move(h);
  }

  std::vector<TensorSpec> specs_;
  Weights initial_;
  Weights target_;
  std::vector<double> x_;  // [samples, in]
  std::vector<double> y_;  // [samples, out]
};

}  // namespace

std::unique_ptr<Problem> MakeMlpProblem(uint64_t seed) {
  return std::make_unique<MlpProblem>(seed);
}

}  // namespace fp4q::examples
