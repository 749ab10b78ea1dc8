// The host-side scalars of one step item (NUMERICS 10.2, marked (h) there, and the f32 constants
// computed on the host): one function, called by both backends, so the CPU reference and the
// CUDA kernels start from the same bits.
#ifndef FP4Q_KERNELS_SRC_STEP_SCALARS_H_
#define FP4Q_KERNELS_SRC_STEP_SCALARS_H_

#include <cstdint>

#include "fp4q/kernels/step.h"

namespace fp4q::kernels {

struct StepScalars {
  float lr = 0.0f;
  float wd = 0.0f;
  float mu = 0.0f;  // SGD momentum
  float cd = 1.0f;  // RN(1 - dampening), f32
  float b1 = 0.0f;
  float b2 = 0.0f;
  float c1 = 1.0f;  // RN(1 - b1), f32
  float c2 = 1.0f;  // RN(1 - b2), f32
  float eps = 0.0f;
  float sbc2 = 1.0f;   // (h) sqrt(1 - b2^t): double, rounded once to f32
  float alpha = 0.0f;  // (h) lr / (1 - b1^t): double, rounded once to f32
  float lrwd = 0.0f;   // RN(lr * wd), f32
  float k = 1.0f;      // the number of updates K as f32 (the divisor of the rank mean)
  int64_t t = 1;
};

StepScalars ComputeStepScalars(const StepHyper& hyper, int num_updates);

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_SRC_STEP_SCALARS_H_
