// The non-virtual Backend entry points: validate every argument (validate.h), then run the
// backend's implementation. Nothing is read or written when validation fails. UpdateWeight is a
// one-item step run to completion.
#include "fp4q/kernels/backend.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/validate.h"

namespace fp4q::kernels {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status CheckGuard(const FiniteGuard* guard, const float* residual) {
  if (guard != nullptr && residual == nullptr) {
    return absl::InvalidArgumentError(
        "guard: set without residual (only error-feedback quantization changes state)");
  }
  return absl::OkStatus();
}

absl::Status CheckWorkspace(const void* workspace) {
  if (workspace == nullptr) return absl::InvalidArgumentError("workspace: null");
  if (!Aligned16(workspace)) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace: ", reinterpret_cast<uintptr_t>(workspace) % 16,
                     " bytes past a 16-byte boundary (it must be 16-byte aligned)"));
  }
  return absl::OkStatus();
}

// A workspace for a step's check: non-null, aligned, and of the batch's size.
// One-pass items (StepNext) run only as a whole step: StepCheckAndApply.
absl::Status CheckTwoPass(const ValidatedStep& step) {
  if (step.items()[0].next.present()) {
    return absl::FailedPreconditionError(
        "items[0].next: a one-pass step runs with StepCheckAndApply, not StepCheck / StepApply");
  }
  return absl::OkStatus();
}

absl::Status CheckStepWorkspace(const ValidatedStep& step, const void* workspace,
                                size_t workspace_bytes) {
  FP4Q_RETURN_IF_ERROR(CheckWorkspace(workspace));
  const size_t need = StepWorkspaceBytes(step.items());
  if (workspace_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("workspace_bytes: ", workspace_bytes,
                                                   " is smaller than the ", need, " needed"));
  }
  return absl::OkStatus();
}

// Aligned stand-ins, in the backend's memory, for the caller buffers of an UpdateWeight that are
// not 16-byte aligned (the step's kernels read 16 bytes at a time). Copies in at Use, back at
// Finish; frees what it allocated.
class Stager {
 public:
  Stager(Backend& backend, Stream stream) : backend_(backend), stream_(stream) {}
  ~Stager() {
    for (const Entry& e : entries_) backend_.Free(e.staged);
  }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  template <typename T>
  absl::StatusOr<T*> Use(T* p, size_t bytes, bool copy_out) {
    if (p == nullptr || Aligned16(p)) return p;
    FP4Q_ASSIGN_OR_RETURN(void* staged, backend_.Allocate(bytes));
    entries_.push_back(Entry{const_cast<void*>(static_cast<const void*>(p)), staged, bytes,
                             copy_out});
    FP4Q_RETURN_IF_ERROR(backend_.CopyDeviceToDevice(staged, p, bytes, stream_));
    return static_cast<T*>(staged);
  }

  absl::Status Finish() {
    if (entries_.empty()) return absl::OkStatus();
    for (const Entry& e : entries_) {
      if (e.copy_out) {
        FP4Q_RETURN_IF_ERROR(backend_.CopyDeviceToDevice(e.user, e.staged, e.bytes, stream_));
      }
    }
    return backend_.Synchronize(stream_);
  }

 private:
  struct Entry {
    void* user;
    void* staged;
    size_t bytes;
    bool copy_out;
  };
  Backend& backend_;
  Stream stream_;
  std::vector<Entry> entries_;
};

// The backend memory of one step's workspace.
class Workspace {
 public:
  explicit Workspace(Backend& backend) : backend_(backend) {}
  ~Workspace() { backend_.Free(p_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  absl::Status Allocate(size_t bytes) {
    FP4Q_ASSIGN_OR_RETURN(p_, backend_.Allocate(bytes));
    return absl::OkStatus();
  }
  void* get() const { return p_; }

 private:
  Backend& backend_;
  void* p_ = nullptr;
};

std::string ValueText(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrCat(v);
}

// The refusal of an UpdateWeight, from its one-item step report.
absl::Status UpdateRefused(const StepItemReport& r) {
  switch (r.outcome) {
    case StepOutcome::kNonFiniteUpdate:
      return absl::InvalidArgumentError(
          absl::StrCat("update: element ", r.index, " is ", ValueText(r.value),
                       "; non-finite values would corrupt stored state"));
    case StepOutcome::kNonFiniteResult:
      return absl::InvalidArgumentError(
          absl::StrCat("update: element ", r.index, " makes the new weight value ",
                       ValueText(r.value), "; the weight is left unchanged"));
    case StepOutcome::kOutOfRange:
      if (r.quantity == StepQuantity::kDequantized) {
        return absl::InvalidArgumentError(
            absl::StrCat("dequantized_out: the new weight (amax ", r.amax,
                         ") could dequantize to ", r.bound,
                         ", past the bf16 range; the weight is left unchanged"));
      }
      if (r.quantity == StepQuantity::kResidual) {
        return absl::InvalidArgumentError(
            absl::StrCat("residual: the new residual could reach ", r.bound,
                         ", past 2^127; the weight is left unchanged"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("update: the new weight (amax ", r.amax, ") could dequantize to ", r.bound,
                       ", past 2^127; the weight is left unchanged"));
    default:
      break;
  }
  return absl::InternalError(absl::StrCat("UpdateWeight: the step refused with outcome ",
                                          static_cast<int>(r.outcome)));
}

}  // namespace

absl::Status Backend::WaitValue32(const void*, uint32_t, Stream) {
  return absl::UnimplementedError("WaitValue32: no device-side signals on this backend");
}

absl::Status Backend::WriteValue32(void*, uint32_t, Stream) {
  return absl::UnimplementedError("WriteValue32: no device-side signals on this backend");
}

absl::StatusOr<uint32_t> Backend::ReadValue32Now(const void*) {
  return absl::UnimplementedError("ReadValue32Now: no device-side signals on this backend");
}

absl::Status Backend::WriteValue32Now(void*, uint32_t) {
  return absl::UnimplementedError("WriteValue32Now: no device-side signals on this backend");
}

absl::Status Backend::Amax(const ConstTensor& x, float* amax, Stream stream,
                           int64_t* first_nonfinite) {
  FP4Q_RETURN_IF_ERROR(ValidateConstTensor(x, "x"));
  if (amax == nullptr) return absl::InvalidArgumentError("amax: null");
  return DoAmax(x, amax, first_nonfinite, stream);
}

absl::Status Backend::Quantize(const ConstTensor& x, const QuantizeOptions& options,
                               float* residual, const QuantizedTensor* rowwise,
                               const QuantizedTensor* columnwise, Stream stream,
                               FiniteGuard* guard) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizeArgs(x, options, residual, rowwise, columnwise));
  FP4Q_RETURN_IF_ERROR(CheckGuard(guard, residual));
  return DoQuantize(x, options, residual, options.rowwise ? rowwise : nullptr,
                    options.columnwise ? columnwise : nullptr, guard, stream);
}

absl::Status Backend::Dequantize(const ConstQuantizedTensor& q, const MutTensor& out,
                                 Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateQuantizedInput(q, "q"));
  FP4Q_RETURN_IF_ERROR(ValidateMutTensor(out, "out"));
  if (out.rows != q.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("out.rows: ", out.rows, " does not match q.rows ", q.rows));
  }
  if (out.cols != q.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("out.cols: ", out.cols, " does not match q.cols ", q.cols));
  }
  return DoDequantize(q, out, stream);
}

absl::Status Backend::Qdq(const ConstTensor& x, const QuantizeOptions& options, float* residual,
                          const MutTensor& out, Stream stream, FiniteGuard* guard) {
  FP4Q_RETURN_IF_ERROR(ValidateQdqArgs(x, options, residual, out));
  FP4Q_RETURN_IF_ERROR(CheckGuard(guard, residual));
  return DoQdq(x, options, residual, out, guard, stream);
}

absl::Status Backend::Matmul(const ConstQuantizedTensor& a, const ConstQuantizedTensor& b,
                             const MutTensor& c, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateMatmulArgs(a, b, c));
  return DoMatmul(a, b, c, stream);
}

absl::Status Backend::UpdateWeight(const QuantizedTensor& weight, float* residual,
                                   const ConstTensor& update, float lr, UpdateKind kind,
                                   const QuantizeOptions& options, const MutTensor* dequantized_out,
                                   Stream stream) {
  FP4Q_RETURN_IF_ERROR(
      ValidateUpdateWeightArgs(weight, update, lr, kind, options, dequantized_out));
  const size_t n = static_cast<size_t>(weight.rows * weight.cols);
  Stager stage(*this, stream);
  StepItem item;
  item.weight = weight;
  FP4Q_ASSIGN_OR_RETURN(item.weight.codes, stage.Use(weight.codes, n / 2, true));
  FP4Q_ASSIGN_OR_RETURN(item.residual, stage.Use(residual, n * sizeof(float), true));
  item.scaling = Scaling::kCurrent;
  item.rounding = options.rounding;
  item.seed = options.seed;
  item.step = options.step;
  item.kind = kind;
  item.hyper.lr = kind == UpdateKind::kGradient ? lr : 0.0f;  // plain SGD; lr may be negative
  item.hyper.t = 1;
  ConstTensor u = update;
  FP4Q_ASSIGN_OR_RETURN(u.data, stage.Use(update.data, n * DTypeSize(update.dtype), false));
  item.updates.push_back(u);
  if (dequantized_out != nullptr) {
    MutTensor out = *dequantized_out;
    FP4Q_ASSIGN_OR_RETURN(out.data, stage.Use(out.data, n * DTypeSize(out.dtype), true));
    item.dequantized_out.push_back(out);
  }
  const std::vector<StepItem> items = {item};
  Workspace ws(*this);
  FP4Q_RETURN_IF_ERROR(ws.Allocate(StepWorkspaceBytes(items)));
  // ValidateUpdateWeightArgs covered what the step needs (its lr may be negative, which
  // ValidateStepItem refuses): call the implementation directly.
  FP4Q_RETURN_IF_ERROR(DoStepCheck(items, ws.get(), stream, StepCancel{}));
  FP4Q_RETURN_IF_ERROR(DoStepApply(items, ws.get(), stream));
  StepReport report;
  FP4Q_RETURN_IF_ERROR(DoStepReadReport(items, ws.get(), &report, stream));
  FP4Q_RETURN_IF_ERROR(stage.Finish());
  if (!report.ok) return UpdateRefused(report.items[0]);
  return absl::OkStatus();
}

absl::Status Backend::StepCheck(const std::vector<StepItem>& items, void* workspace,
                                size_t workspace_bytes, Stream stream, const StepCancel& cancel) {
  FP4Q_ASSIGN_OR_RETURN(const ValidatedStep step, ValidatedStep::Check(items));
  return StepCheck(step, workspace, workspace_bytes, stream, cancel);
}

absl::Status Backend::StepApply(const std::vector<StepItem>& items, void* workspace,
                                Stream stream) {
  FP4Q_ASSIGN_OR_RETURN(const ValidatedStep step, ValidatedStep::Check(items));
  return StepApply(step, workspace, stream);
}

absl::Status Backend::StepCheck(const ValidatedStep& step, void* workspace,
                                size_t workspace_bytes, Stream stream, const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(CheckTwoPass(step));
  FP4Q_RETURN_IF_ERROR(CheckStepWorkspace(step, workspace, workspace_bytes));
  return DoStepCheck(step.items(), workspace, stream, cancel);
}

absl::Status Backend::StepApply(const ValidatedStep& step, void* workspace, Stream stream) {
  FP4Q_RETURN_IF_ERROR(CheckTwoPass(step));
  FP4Q_RETURN_IF_ERROR(CheckWorkspace(workspace));
  return DoStepApply(step.items(), workspace, stream);
}

absl::Status Backend::StepCheckAndApply(const ValidatedStep& step, void* workspace,
                                        size_t workspace_bytes, Stream stream,
                                        const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(CheckStepWorkspace(step, workspace, workspace_bytes));
  return DoStepCheckAndApply(step.items(), workspace, stream, cancel);
}

absl::Status Backend::DoStepCheckAndApply(const std::vector<StepItem>& items, void* workspace,
                                          Stream stream, const StepCancel& cancel) {
  if (items[0].next.present()) {  // a backend runs one-pass steps by overriding this
    return absl::UnimplementedError("items[0].next: this backend runs no one-pass steps");
  }
  FP4Q_RETURN_IF_ERROR(DoStepCheck(items, workspace, stream, cancel));
  return DoStepApply(items, workspace, stream);
}

absl::Status Backend::StepReadReport(const std::vector<StepItem>& items, const void* workspace,
                                     StepReport* report, Stream stream) {
  if (items.empty()) return absl::InvalidArgumentError("items: empty");
  FP4Q_RETURN_IF_ERROR(CheckWorkspace(workspace));
  if (report == nullptr) return absl::InvalidArgumentError("report: null");
  return DoStepReadReport(items, workspace, report, stream);
}

absl::Status Backend::Rht(const ConstTensor& in, RhtMode mode, uint64_t rht_seed, bool inverse,
                          const MutTensor& out, Stream stream) {
  FP4Q_RETURN_IF_ERROR(ValidateRhtArgs(in, mode, out));
  return DoRht(in, mode, rht_seed, inverse, out, stream);
}

}  // namespace fp4q::kernels
