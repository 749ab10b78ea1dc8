// The free functions of step.h and the host side of the step's workspace (step_report.h).
#include "fp4q/kernels/step.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "step_layout.h"
#include "step_report.h"

namespace fp4q::kernels {

// The workspace's report is StepItemReport byte for byte.
static_assert(sizeof(StepItemReport) == sizeof(step_ws::ReportPod), "StepItemReport layout");
static_assert(offsetof(StepItemReport, outcome) == offsetof(step_ws::ReportPod, outcome));
static_assert(offsetof(StepItemReport, quantity) == offsetof(step_ws::ReportPod, quantity));
static_assert(offsetof(StepItemReport, rank) == offsetof(step_ws::ReportPod, rank));
static_assert(offsetof(StepItemReport, index) == offsetof(step_ws::ReportPod, index));
static_assert(offsetof(StepItemReport, value) == offsetof(step_ws::ReportPod, value));
static_assert(offsetof(StepItemReport, amax) == offsetof(step_ws::ReportPod, amax));
static_assert(offsetof(StepItemReport, bound) == offsetof(step_ws::ReportPod, bound));
static_assert(static_cast<int>(StepOutcome::kFingerprintMismatch) == step_ws::kFingerprintMismatch);
static_assert(static_cast<int>(StepQuantity::kDequantized) == step_ws::kQDequantized);
static_assert(static_cast<int>(StateDType::kNvfp4) == step_ws::kStNvfp4);
static_assert(kStepStatFloats == step_ws::kStatFloats);

step_ws::Layout StepLayoutOf(const std::vector<StepItem>& items) {
  int64_t updates = 0;
  int64_t outs = 0;
  for (const StepItem& item : items) {
    updates += static_cast<int64_t>(item.updates.size());
    for (const MutTensor& o : item.dequantized_out) outs += o.data != nullptr ? 1 : 0;
  }
  return step_ws::ComputeLayout(static_cast<int64_t>(items.size()), updates, outs);
}

void DecodeStepReport(const std::vector<StepItem>& items, const step_ws::Layout& layout,
                      const uint8_t* prefix, StepReport* report) {
  step_ws::Header header;
  std::memcpy(&header, prefix, sizeof(header));
  report->ok = header.checked == step_ws::kCheckedMagic && header.ok == 1;
  report->cancelled = header.checked == step_ws::kCheckedMagic && header.cancelled == 1;
  report->items.assign(items.size(), StepItemReport());
  std::memcpy(report->items.data(), prefix + layout.reports, items.size() * sizeof(StepItemReport));
  report->fingerprints.assign(items.size(), {});
  const uint8_t* fp = prefix + layout.fingerprints;
  for (size_t i = 0; i < items.size(); ++i) {
    report->fingerprints[i].resize(items[i].updates.size());
    std::memcpy(report->fingerprints[i].data(), fp, items[i].updates.size() * sizeof(uint64_t));
    fp += items[i].updates.size() * sizeof(uint64_t);
  }
}

size_t StepWorkspaceBytes(const std::vector<StepItem>& items) { return StepLayoutOf(items).total; }

bool OnePassItem(const StepItem& item) {
  const auto dense = [](DType d) { return d == DType::kF32 || d == DType::kBF16; };
  if (item.check_only || item.scaling != Scaling::kDelayed || item.stats == nullptr ||
      item.kind != UpdateKind::kGradient || item.state.kind != OptimizerKind::kSgd ||
      item.state.momentum || item.hyper.weight_decay != 0.0f || item.updates.size() != 1 ||
      !dense(item.updates[0].dtype) || item.weight.block != BlockShape::k1x16 ||
      item.weight.scale_layout != ScaleLayout::kPlain) {
    return false;
  }
  int outs = 0;
  for (const MutTensor& o : item.dequantized_out) {
    if (o.data == nullptr) continue;
    if (++outs > 1 || o.dtype != item.updates[0].dtype) return false;
  }
  return true;
}

double StateBytesPerElement(StateDType dtype) {
  switch (dtype) {
    case StateDType::kF32:
      return 4.0;
    case StateDType::kBF16:
      return 2.0;
    case StateDType::kNvfp4:
      return 0.5625;  // 4-bit codes + one E4M3 scale per 16 elements
  }
  return 0.0;
}

}  // namespace fp4q::kernels
