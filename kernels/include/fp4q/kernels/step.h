// The trainer's step: one optimizer update of many stored NVFP4 weights, applied as a unit.
// Numerics: docs/NUMERICS.md "The optimizer step" (operation order, scaling, optimizer state).
//
// How a step runs (Backend::StepCheck / StepReport / StepApply, backend.h):
//   1. Check: reads every item's updates (and, under current scaling, its state) and decides,
//      on the device, whether every item may be applied: all inputs finite, every result
//      finite (exact under current scaling, by a bound under delayed scaling), and each
//      check-only item's update equal to the one applied before (fingerprint). The outcome
//      lives in the workspace; nothing the caller owns is written.
//   2. Apply: rewrites every item's weight, residual, optimizer state and statistics and writes
//      the dequantized outputs, but only when the check passed for every item of the batch;
//      otherwise it writes nothing (the gate is read on the device: no host round trip).
//   3. Report: one small device-to-host copy of the per-item outcome.
// A batch runs on one backend (one device); StepCheckAndApply queues 1 and 2 together, as one
// device's step does. One-pass steps (every item with a StepNext) turn the order around: the
// apply writes each new state beside the old one while it checks, the verdict follows, and the
// caller commits by taking the new state (StepNext below). Several devices: check each, read
// each report, apply only when all passed. A batch validated once (ValidatedStep) is not validated again by these calls.
//
// Ownership: views point at backend memory (device memory for CUDA) and are not owned. Every
// dense buffer (updates, residual, dense moments, outputs) and code array starts 16-byte aligned
// (ValidateStepItem). An item's buffers must not overlap another item's or each other.
#ifndef FP4Q_KERNELS_STEP_H_
#define FP4Q_KERNELS_STEP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/kernels/types.h"

namespace fp4q::kernels {

enum class OptimizerKind : int {
  kSgd = 1,    // torch.optim.SGD: momentum, dampening, Nesterov, weight decay.
  kAdamW = 2,  // torch.optim.AdamW: betas, eps, decoupled weight decay, amsgrad.
};

// Storage of optimizer moments (momentum buffer, AdamW's m, v and max v).
enum class StateDType : int {
  kF32 = 1,
  kBF16 = 2,
  kNvfp4 = 3,  // 1x16 NVFP4; v stored as sqrt(v) with zero-free rounding (NUMERICS).
};

// Where a stored weight's global scale comes from at each update.
enum class Scaling : int {
  kCurrent = 1,  // amax of this update's v (the check reads the state too: two passes).
  kDelayed = 2,  // amax of the previous update's v (stats[kStatNextAmax]): one pass.
};

// Per-weight statistics kept in backend memory beside the weight (kStepStatFloats floats),
// written by every applied step and by weight creation. They give delayed scaling its amax and
// the check its bounds.
inline constexpr int kStepStatFloats = 8;
enum StepStat : int {
  kStatNextAmax = 0,  // max |v| of the last update (creation: amax of the initial value)
  kStatMaxResidual = 1,  // max |r| after the last update (0 without error feedback)
  kStatMaxMoment1 = 2,   // max |b| (SGD momentum buffer) or max |m| (AdamW), f32 values
  kStatMaxSqrtMoment2 = 3,  // max RN(sqrt(v)) (AdamW)
  kStatMaxSqrtMaxMoment2 = 4,  // max RN(sqrt(v_max)) (AdamW with amsgrad)
};

// One moment tensor, [rows, cols] like its weight, in the weight's StateDType. For kF32/kBF16
// `dense` holds rows * cols elements; for kNvfp4 `quantized` is a 1x16 plain-layout NVFP4
// tensor with its own global record (a zeroed NVFP4 moment: codes and scales 0, record [0, 1]).
struct MomentTensor {
  void* dense = nullptr;
  QuantizedTensor quantized;
  bool present() const { return dense != nullptr || quantized.codes != nullptr; }
};

// What optimizer state a weight keeps (fixed per weight).
struct OptimizerState {
  OptimizerKind kind = OptimizerKind::kSgd;
  StateDType dtype = StateDType::kF32;
  bool momentum = false;  // SGD: m1 is the momentum buffer
  bool amsgrad = false;   // AdamW: max_moment2 is kept
  MomentTensor moment1;   // SGD momentum buffer / AdamW m
  MomentTensor moment2;   // AdamW v
  MomentTensor max_moment2;  // AdamW amsgrad max v
};

// Hyperparameters of one item's update, as sent (checked by ValidateStepItem).
struct StepHyper {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  // SGD
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  // AdamW
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // The optimizer step count after this update, t >= 1 (the weight's applied optimizer steps
  // plus one): SGD's first momentum step and AdamW's bias corrections use it.
  int64_t t = 1;
};

// Where a one-pass step writes an item's new state. Set on every item of a batch or on none; only
// OnePassItem items may have one, and only StepCheckAndApply runs them. The apply reads the state
// of StepItem (weight, residual, stats) and writes the new one here, checking as it goes (the
// same checks and report as the two-pass step, NUMERICS 10.4), so each update is read once; the
// state of StepItem is never written. Applied (report.ok): the new state is here, and the caller
// takes it as the weight's. Refused: what is here is unspecified, and every dequantized output
// holds DQ(W) of the unchanged weight (written after the apply wrote the new one there).
// Buffers of the weight's sizes, not overlapping it or any other item's.
struct StepNext {
  uint8_t* codes = nullptr;   // 16-byte aligned, the weight's codes_capacity
  uint8_t* scales = nullptr;  // the weight's scales_capacity
  float* global = nullptr;    // kGlobalFloats floats
  float* stats = nullptr;     // kStepStatFloats floats
  float* residual = nullptr;  // [rows, cols], 16-byte aligned: exactly when the item has one
  bool present() const { return codes != nullptr; }
};

// One weight's part of a step.
struct StepItem {
  // The stored weight: NVFP4, 1x16 or 16x16 blocks, plain (or swizzled) scale layout; read and
  // rewritten.
  QuantizedTensor weight;
  float* residual = nullptr;  // f32 [rows, cols] (error feedback) or null
  // kStepStatFloats floats; may be null under current scaling (then nothing is recorded).
  float* stats = nullptr;
  Scaling scaling = Scaling::kCurrent;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding key
  uint64_t step = 0;  // the request's step number: the stochastic rounding counter
  OptimizerState state;
  StepHyper hyper;
  UpdateKind kind = UpdateKind::kGradient;  // kDelta: plain SGD only (no state, no decay)
  // The updates of the data-parallel ranks in rank order (one for a single worker), each of the
  // weight's shape, f32 or bf16 (dtypes may differ between ranks). K > 1: their f32 sum in this
  // order, divided by K.
  std::vector<ConstTensor> updates;
  // DQ(W) after the step, one target per rank (rows x cols, f32 or bf16); a null `data` or an
  // empty vector writes none.
  std::vector<MutTensor> dequantized_out;
  // Check only: the weight already applied this step. Nothing is written for it; the check
  // compares the fingerprint of each of its updates with `expect_fingerprints` (one per
  // update, same order) and refuses the batch when one differs.
  bool check_only = false;
  std::vector<uint64_t> expect_fingerprints;
  StepNext next;  // one-pass steps only
};

// Whether an item can run in one pass (StepNext): plain SGD (no momentum, no weight decay) on a
// gradient from one update, delayed scaling, 1x16 blocks with plain scales, f32 or bf16, at most
// one dequantized output and of the update's dtype, not check-only. Validation requires it of an
// item with a StepNext; callers use it to choose the pass count.
bool OnePassItem(const StepItem& item);

enum class StepOutcome : int32_t {
  kOk = 0,
  kNonFiniteUpdate = 1,  // an update element is NaN/Inf (rank, index, value)
  kNonFiniteResult = 2,  // a result would be NaN/Inf (quantity, index, value) [current scaling]
  kOutOfRange = 3,       // a result could pass the f32 range (quantity, bound) [both]
  kFingerprintMismatch = 4,  // a check-only item's update differs from the applied one (rank)
};

// What StepCheck computes, per result quantity named in kNonFiniteResult / kOutOfRange.
enum class StepQuantity : int32_t {
  kNone = 0,
  kUpdateSum = 1,  // the rank sum / mean of the updates
  kWeight = 2,     // v, the new pre-quantization weight value (or its DQ)
  kResidual = 3,
  kMoment1 = 4,
  kMoment2 = 5,
  kDequantized = 6,  // DQ(W') in an output dtype (bf16's range is smaller)
};

// The outcome of one item, in host memory after StepReport. POD; layout shared with the CUDA
// side.
struct StepItemReport {
  StepOutcome outcome = StepOutcome::kOk;
  StepQuantity quantity = StepQuantity::kNone;
  int32_t rank = -1;     // kNonFiniteUpdate: which update
  int32_t reserved = 0;
  int64_t index = -1;    // first offending element (row-major), kNonFinite*
  float value = 0.0f;    // its value
  float amax = 0.0f;     // the global amax the new weight is (to be) quantized with
  double bound = 0.0;    // kOutOfRange: the bound that passed the limit
};

// A step's cancellation word: the check refuses the whole batch, as a failed item would, when
// the 32-bit word at `word` (backend memory) holds `token` as the check decides. fp4qd queues a
// step behind device-side waits for the worker's ready signals (Backend::WaitValue32); when a
// signal does not come in time it writes the token here, then releases the waits, so the queued
// step runs on and changes nothing. A null word: never cancelled.
struct StepCancel {
  const uint32_t* word = nullptr;
  uint32_t token = 0;
};

// A whole batch's outcome.
struct StepReport {
  bool ok = false;         // every item passed the check (and the step was not cancelled)
  // The StepCancel word held its token: no state was written, and a one-pass step's outputs
  // were not written either, or (a CUDA apply already under way when the word was written) hold
  // DQ(W) of the unchanged weights again. Only ok and cancelled are then defined: a one-pass
  // step's check runs inside its apply, which a cancelled step may skip, so items and
  // fingerprints can be partial.
  bool cancelled = false;
  std::vector<StepItemReport> items;
  // Fingerprint of every update, item by item and within an item in update order: a 64-bit
  // hash of the update's dtype, shape and bytes (NUMERICS 10.7), equal for equal updates.
  std::vector<std::vector<uint64_t>> fingerprints;
};

// The outcome of a state-changing quantization's device-side check (Backend::Quantize/Qdq with
// a guard). POD in backend memory.
// Checked in this order: x finite (kNonFiniteUpdate, kUpdateSum), v = RN(x + r) finite
// (kNonFiniteResult, kWeight), and the largest value the result can dequantize to below 2^127
// (below the largest finite bf16 for a bf16 QDQ output): kOutOfRange, kDequantized, `bound`.
// NVFP4: 2688 * S_dec of the amax used; MXFP4: 6 * 2^(b - 127) with b the amax's scale byte.
struct FiniteGuard {
  StepOutcome outcome = StepOutcome::kOk;  // kNonFiniteUpdate: x; kNonFiniteResult: v
  StepQuantity quantity = StepQuantity::kNone;  // kUpdateSum (x), kWeight (v), kDequantized
  int64_t index = -1;   // the first offending element (row-major), -1 for kOutOfRange / kOk
  float value = 0.0f;   // its value
  float amax = 0.0f;    // the global amax used (once x and v passed)
  double bound = 0.0;   // kOutOfRange: the largest dequantized value
};

// Bytes of backend memory a batch needs as workspace (item table, plan, outcome).
size_t StepWorkspaceBytes(const std::vector<StepItem>& items);

// A batch's items that ValidateStepItems (validate.h) accepted, made only by Check: the
// Backend's StepCheck and StepApply take it without validating the items again (a step
// validates once, not once a call). It refers to `items`, which must outlive it unchanged.
class ValidatedStep {
 public:
  static absl::StatusOr<ValidatedStep> Check(const std::vector<StepItem>& items);
  const std::vector<StepItem>& items() const { return *items_; }

 private:
  explicit ValidatedStep(const std::vector<StepItem>* items) : items_(items) {}
  const std::vector<StepItem>* items_;
};

// Bytes per element of one moment tensor in `dtype` (NVFP4: codes + scales, without the
// global record), for budgets and checkpoints.
double StateBytesPerElement(StateDType dtype);

}  // namespace fp4q::kernels

#endif  // FP4Q_KERNELS_STEP_H_
