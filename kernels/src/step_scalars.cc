// The host-side scalars of a step item; see step_scalars.h. Compiled with -ffp-contract=off.
#include "step_scalars.h"

#include <cmath>

namespace fp4q::kernels {

StepScalars ComputeStepScalars(const StepHyper& h, int num_updates) {
  StepScalars s;
  s.lr = h.lr;
  s.wd = h.weight_decay;
  s.mu = h.momentum;
  s.cd = 1.0f - h.dampening;
  s.b1 = h.beta1;
  s.b2 = h.beta2;
  s.c1 = 1.0f - h.beta1;
  s.c2 = 1.0f - h.beta2;
  s.eps = h.eps;
  s.lrwd = h.lr * h.weight_decay;
  s.k = static_cast<float>(num_updates);
  s.t = h.t;
  const double t = static_cast<double>(h.t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  s.sbc2 = static_cast<float>(std::sqrt(bc2));
  s.alpha = static_cast<float>(static_cast<double>(h.lr) / bc1);
  return s;
}

}  // namespace fp4q::kernels
