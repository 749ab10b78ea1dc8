// Error feedback and the stored-weight update; see error_feedback.h.
#include "cpu/error_feedback.h"

#include "cpu/quantize.h"

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

HostQuantized UpdateWeightHost(const HostQuantized& w, const Matrix& update, float lr,
                               UpdateKind kind, const QuantizeOptions& options, Matrix* residual,
                               Matrix* dequantized) {
  const Matrix d = DequantizeHost(w);
  Matrix v(d.rows, d.cols);
  for (size_t i = 0; i < v.values.size(); ++i) {
    float x;
    if (kind == UpdateKind::kGradient) {
      const float step = lr * update.values[i];
      x = d.values[i] - step;
    } else {
      x = d.values[i] + update.values[i];
    }
    v.values[i] = residual != nullptr ? x + residual->values[i] : x;
  }
  QuantizeOptions o = options;
  o.has_amax = false;  // amax from v
  HostQuantized next = QuantizeMatrix(v, DType::kF32, o, /*columnwise=*/false);
  const Matrix dq = DequantizeHost(next);
  if (residual != nullptr) {
    for (size_t i = 0; i < v.values.size(); ++i) residual->values[i] = v.values[i] - dq.values[i];
  }
  if (dequantized != nullptr) *dequantized = dq;
  return next;
}

}  // namespace fp4q::kernels::cpu
