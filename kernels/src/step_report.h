// Host-side pieces of a step shared by both backends: the workspace layout of a batch and the
// decoding of the report prefix StepReadReport copies (step_layout.h).
#ifndef FP4Q_KERNELS_SRC_STEP_REPORT_H_
#define FP4Q_KERNELS_SRC_STEP_REPORT_H_

#include <cstdint>
#include <vector>

#include "fp4q/kernels/step.h"
#include "step_layout.h"

namespace fp4q::kernels {

// The layout of `items`' workspace (counts: items, updates, outputs with non-null data).
step_ws::Layout StepLayoutOf(const std::vector<StepItem>& items);

// Fills *report from a host copy of the workspace's first layout.report_end bytes.
void DecodeStepReport(const std::vector<StepItem>& items, const step_ws::Layout& layout,
                      const uint8_t* prefix, StepReport* report);

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_SRC_STEP_REPORT_H_
