// Error feedback and its guard; see error_feedback.h.
#include "cpu/error_feedback.h"

#include <cmath>

#include "cpu/formats.h"
#include "cpu/mxfp4.h"
#include "cpu/nvfp4.h"
#include "cpu/quantize.h"
#include "step_layout.h"

namespace fp4q::kernels::cpu {

HostQuantized QuantizeWithFeedback(const Matrix& x, const QuantizeOptions& options,
                                   Matrix* residual) {
  Matrix v(x.rows, x.cols);
  for (size_t i = 0; i < v.values.size(); ++i) {
    v.values[i] = x.values[i] + residual->values[i];
  }
  HostQuantized q = QuantizeMatrix(v, DType::kF32, options, /*columnwise=*/false);
  const Matrix dq = DequantizeHost(q);
  for (size_t i = 0; i < v.values.size(); ++i) {
    residual->values[i] = v.values[i] - dq.values[i];
  }
  return q;
}

FiniteGuard FeedbackGuard(const Matrix& x, const Matrix& residual, const QuantizeOptions& o,
                          bool bf16_out) {
  FiniteGuard g;
  for (size_t i = 0; i < x.values.size(); ++i) {
    if (!std::isfinite(x.values[i])) {
      g.outcome = StepOutcome::kNonFiniteUpdate;
      g.quantity = StepQuantity::kUpdateSum;
      g.index = static_cast<int64_t>(i);
      g.value = x.values[i];
      return g;
    }
  }
  float amax = 0.0f;
  for (size_t i = 0; i < x.values.size(); ++i) {
    const float v = x.values[i] + residual.values[i];
    if (!std::isfinite(v)) {
      g.outcome = StepOutcome::kNonFiniteResult;
      g.quantity = StepQuantity::kWeight;
      g.index = static_cast<int64_t>(i);
      g.value = v;
      return g;
    }
    amax = std::fmax(amax, std::fabs(v));
  }
  if (o.has_amax) amax = o.amax;
  g.amax = amax;
  double dmax;
  if (o.format == Format::kMxfp4) {
    dmax = 6.0 * static_cast<double>(E8m0ToFloat(MxScaleByte(amax, o.mx_rule)));
  } else {
    const float numerator = o.scale_selection == ScaleSelection::kMapTo6
                                ? kE4m3Max * kE2m1Max
                                : o.four_over_six_emax * 6.0f;
    dmax = 2688.0 * static_cast<double>(GlobalDecodeScale(GlobalEncodeScale(numerator, amax)));
  }
  if (!(dmax < step_ws::kTwoPow127) || (bf16_out && !(dmax < step_ws::kBf16Max))) {
    g.outcome = StepOutcome::kOutOfRange;
    g.quantity = StepQuantity::kDequantized;
    g.bound = dmax;
  }
  return g;
}

}  // namespace fp4q::kernels::cpu
