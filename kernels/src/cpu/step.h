// The optimizer step on the host (docs/NUMERICS.md "The optimizer step", 10.1-10.7): the check
// of a batch and its apply, written as plainly as possible (the oracle of the CUDA kernels).
// Items are validated by the caller (ValidateStepItems). `workspace` is host memory laid out as
// step_layout.h says (StepLayoutOf(items)).
#ifndef FP4Q_KERNELS_CPU_STEP_H_
#define FP4Q_KERNELS_CPU_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "fp4q/kernels/step.h"

namespace fp4q::kernels::cpu {

// 10.4: checks every item in order and writes the batch flag, every item's report, every
// update's fingerprint and every item's plan into the workspace. Reads the items, writes
// nothing else.
void StepCheckHost(const std::vector<StepItem>& items, uint8_t* workspace,
                   const StepCancel& cancel = {});

// 10.2: when the workspace's check passed for the whole batch, rewrites every item's weight,
// residual, optimizer state and statistics and writes its dequantized outputs; otherwise
// writes nothing. FAILED_PRECONDITION when no check ran on this workspace.
absl::Status StepApplyHost(const std::vector<StepItem>& items, uint8_t* workspace);

// A one-pass step (StepNext on every item): the check's report, then either every item's new
// state written to its StepNext (the state in place untouched) or, refused, every dequantized
// output rewritten with DQ(W) of the unchanged weight.
absl::Status StepOnePassHost(const std::vector<StepItem>& items, uint8_t* workspace,
                             const StepCancel& cancel);

// 10.7: the fingerprint of one update tensor.
uint64_t UpdateFingerprint(const ConstTensor& update);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_STEP_H_
