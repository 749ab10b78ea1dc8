#include "server/state_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "server/request_checks.h"

namespace fp4q::server {

absl::StatusOr<EntrySizes> SizesFor(EntryKind kind, int64_t rows, int64_t cols,
                                    const WeightParams& params, absl::string_view field) {
  EntrySizes s;
  const std::string what(field);
  if (kind == EntryKind::kWeight) {
    FP4Q_ASSIGN_OR_RETURN(s.codes, kernels::CodeBytes(rows, cols, what));
    FP4Q_ASSIGN_OR_RETURN(s.scales, kernels::ScaleBytes(rows, cols, kernels::Format::kNvfp4,
                                                        kernels::ScaleLayout::kPlain, what));
    s.global = kernels::kGlobalFloats * sizeof(float);
    s.stats = kernels::kStepStatFloats * sizeof(float);
    if (params.error_feedback) {
      FP4Q_ASSIGN_OR_RETURN(s.residual,
                            kernels::DenseBytes(rows, cols, kernels::DType::kF32, what));
    }
  } else {
    FP4Q_ASSIGN_OR_RETURN(s.residual, kernels::DenseBytes(rows, cols, kernels::DType::kF32, what));
  }
  return s;
}

kernels::QuantizedTensor StateEntry::Weight() const {
  kernels::QuantizedTensor q;
  q.format = kernels::Format::kNvfp4;
  q.block = params.block;
  q.scale_layout = kernels::ScaleLayout::kPlain;
  q.rows = rows;
  q.cols = cols;
  q.codes = codes.as<uint8_t>();
  q.codes_capacity = codes.size();
  q.scales = scales.as<uint8_t>();
  q.scales_capacity = scales.size();
  q.global = global.as<float>();
  return q;
}

StateStore::StateStore(uint64_t budget_bytes, EngineObserver* observer,
                       std::vector<std::string> device_labels)
    : budget_(budget_bytes), observer_(observer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (observer_ != nullptr) observer_->StateBudget(budget_);
  for (const auto& label : device_labels) {
    device_bytes_[label] = 0;
    ReportLocked(label);
  }
}

absl::Status StateStore::Reserve(const std::shared_ptr<StateEntry>& entry,
                                 std::unique_lock<std::mutex>* lock, absl::string_view field) {
  const uint64_t need = entry->total_bytes();
  std::lock_guard<std::mutex> guard(mu_);
  if (entries_.count(entry->name) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(field, ": '", LocalName(entry->name), "' already exists"));
  }
  if (need > budget_ || used_ > budget_ - need) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": '", LocalName(entry->name), "' needs ", need, " bytes of state; ",
                     budget_ - used_, " of the ", budget_, "-byte state budget are free"));
  }
  *lock = std::unique_lock<std::mutex>(entry->op_mu);  // uncontended: nobody else has it
  entries_[entry->name] = entry;
  used_ += need;
  device_bytes_[entry->device->label] += need;
  ReportLocked(entry->device->label);
  return absl::OkStatus();
}

void StateStore::Publish(const std::shared_ptr<StateEntry>& entry) {
  std::lock_guard<std::mutex> guard(mu_);
  entry->live.store(true);
  ReportLocked(entry->device->label);
}

void StateStore::Drop(const std::shared_ptr<StateEntry>& entry) {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = entries_.find(entry->name);
  entry->live.store(false);
  if (it == entries_.end() || it->second != entry) return;
  entries_.erase(it);
  used_ -= entry->total_bytes();
  device_bytes_[entry->device->label] -= entry->total_bytes();
  ReportLocked(entry->device->label);
}

absl::Status StateStore::SetOptimizerBytes(const std::shared_ptr<StateEntry>& entry,
                                           uint64_t bytes, absl::string_view field) {
  return SetVariableBytes(entry, &entry->optimizer_bytes, bytes, field, "the optimizer state");
}

absl::Status StateStore::SetNextStateBytes(const std::shared_ptr<StateEntry>& entry,
                                           uint64_t bytes, absl::string_view field) {
  return SetVariableBytes(entry, &entry->next_bytes, bytes, field, "the one-pass copy");
}

absl::Status StateStore::SetVariableBytes(const std::shared_ptr<StateEntry>& entry,
                                          std::atomic<uint64_t>* slot, uint64_t bytes,
                                          absl::string_view field, absl::string_view what) {
  std::lock_guard<std::mutex> guard(mu_);
  const uint64_t old = slot->load();
  auto it = entries_.find(entry->name);
  const bool counted = it != entries_.end() && it->second == entry;
  if (counted && bytes > old) {
    const uint64_t more = bytes - old;
    if (more > budget_ || used_ > budget_ - more) {
      return absl::ResourceExhaustedError(absl::StrCat(
          field, ": ", what, " of '", LocalName(entry->name), "' needs ", more, " more bytes; ",
          budget_ - used_, " of the ", budget_, "-byte state budget are free"));
    }
  }
  slot->store(bytes);
  if (counted) {
    used_ = used_ - old + bytes;
    device_bytes_[entry->device->label] = device_bytes_[entry->device->label] - old + bytes;
    ReportLocked(entry->device->label);
  }
  return absl::OkStatus();
}

std::shared_ptr<StateEntry> StateStore::Find(absl::string_view name) const {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<StateEntry>> StateStore::Entries() const {
  std::lock_guard<std::mutex> guard(mu_);
  std::vector<std::shared_ptr<StateEntry>> out;
  for (const auto& [name, e] : entries_) {
    if (e->live.load()) out.push_back(e);
  }
  return out;
}

std::vector<TensorListing> StateStore::List(absl::string_view ns) const {
  std::vector<TensorListing> out;
  for (const auto& e : Entries()) {
    if (NamespaceOf(e->name) != ns) continue;
    TensorListing l;
    l.name = std::string(LocalName(e->name));
    l.kind = e->kind == EntryKind::kWeight ? TensorKind::kWeight : TensorKind::kResidual;
    l.shape = {e->rows, e->cols};
    l.bytes = e->total_bytes();
    l.device_uuid = e->device->label;
    l.last_step = e->has_step.load() ? e->last_step.load() : -1;
    out.push_back(std::move(l));
  }
  return out;
}

uint64_t StateStore::used_bytes() const {
  std::lock_guard<std::mutex> guard(mu_);
  return used_;
}

uint64_t StateStore::device_bytes(absl::string_view label) const {
  std::lock_guard<std::mutex> guard(mu_);
  auto it = device_bytes_.find(label);
  return it == device_bytes_.end() ? 0 : it->second;
}

void StateStore::ReportLocked(absl::string_view device) {
  if (observer_ == nullptr) return;
  int64_t weights = 0;
  int64_t residuals = 0;
  for (const auto& [name, e] : entries_) {
    if (e->device->label != device || !e->live.load()) continue;
    (e->kind == EntryKind::kWeight ? weights : residuals)++;
  }
  observer_->StateTensors(device, "weight", weights);
  observer_->StateTensors(device, "residual", residuals);
  auto it = device_bytes_.find(device);
  observer_->StateBytes(device, it == device_bytes_.end() ? 0 : static_cast<int64_t>(it->second));
}

}  // namespace fp4q::server
