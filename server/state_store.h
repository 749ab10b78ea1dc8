// The named training state: stored NVFP4 weights (codes, scales, global record, optional f32
// residual) and QDQ/Quantize residuals keyed by name, on one device each.
//
// Contract
// - One namespace for both kinds. A name is reserved (Reserve) before its memory is filled and
//   becomes visible (live) with Publish; a failed creation is dropped and leaves no trace.
// - Per-name locking: `StateEntry::op_mu` is held for every read or write of an entry's tensors,
//   so concurrent requests on one name serialize while distinct names run in parallel. Lookups
//   take the entry, lock op_mu, then check `live` (it may have been deleted meanwhile).
// - The budget counts every byte of every entry (all devices); Reserve answers
//   RESOURCE_EXHAUSTED and reserves nothing beyond it.
// - last_step / live are atomics so listings never wait for an entry's lock.
// Thread-safe.
#ifndef FP4Q_SERVER_STATE_STORE_H_
#define FP4Q_SERVER_STATE_STORE_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fp4q/kernels/types.h"
#include "server/device_buffer.h"
#include "server/devices.h"
#include "server/observer.h"
#include "server/optimizer_state.h"
#include "server/requests.h"

namespace fp4q::server {

enum class EntryKind { kWeight = 1, kResidual = 2 };

// A stored weight's fixed options (normalized; see fp4q.v1.WeightOptions).
struct WeightParams {
  kernels::BlockShape block = kernels::BlockShape::k1x16;
  kernels::Rounding rounding = kernels::Rounding::kNearest;
  uint64_t seed = 0;
  bool error_feedback = false;
  kernels::DType dtype = kernels::DType::kF32;  // GetWeight's default output dtype
  kernels::Scaling scaling = kernels::Scaling::kCurrent;
};

// Byte sizes of an entry's fixed parts (the optimizer state is counted apart: it can change).
struct EntrySizes {
  size_t codes = 0;
  size_t scales = 0;
  size_t global = 0;  // kGlobalFloats floats for weights
  size_t stats = 0;   // kStepStatFloats floats for weights
  size_t residual = 0;
  uint64_t total() const { return codes + scales + global + stats + residual; }
};
absl::StatusOr<EntrySizes> SizesFor(EntryKind kind, int64_t rows, int64_t cols,
                                    const WeightParams& params, absl::string_view field);

class StateEntry {
 public:
  StateEntry(std::string name, EntryKind kind, Device* device, int64_t rows, int64_t cols,
             WeightParams params, EntrySizes sizes)
      : name(std::move(name)),
        kind(kind),
        device(device),
        rows(rows),
        cols(cols),
        params(params),
        sizes(sizes) {}

  const std::string name;
  const EntryKind kind;
  Device* const device;
  const int64_t rows;
  const int64_t cols;
  const WeightParams params;
  const EntrySizes sizes;

  std::mutex op_mu;
  // Guarded by op_mu.
  DeviceBuffer codes, scales, global, stats, residual;
  OptimizerStorage optimizer;  // weights; no moments for plain SGD
  int64_t optimizer_steps = 0;  // applied optimizer steps since creation or ResetOptimizer
  // The last applied step's update fingerprints (one per data-parallel rank, NUMERICS 10.7) and
  // a hash of its hyperparameters: a retry of that step must match them.
  std::vector<uint64_t> last_fingerprints;
  uint64_t last_hyper_hash = 0;
  std::atomic<bool> live{false};
  std::atomic<int64_t> last_step{0};
  std::atomic<bool> has_step{false};  // false: no step applied yet (any step is accepted)
  // Bytes of the optimizer state (StateStore::SetOptimizerBytes); readable without op_mu.
  std::atomic<uint64_t> optimizer_bytes{0};
  // A weight's second copy of codes, scales, record, statistics and residual, written by its
  // one-pass steps (fp4q.v1.StepRequest.one_pass), which commit by swapping it with the state
  // above. Allocated by the first one-pass step (guarded by op_mu); its bytes
  // (StateStore::SetNextStateBytes) count in the budget.
  DeviceBuffer next_codes, next_scales, next_global, next_stats, next_residual;
  std::atomic<uint64_t> next_bytes{0};

  uint64_t total_bytes() const {
    return sizes.total() + optimizer_bytes.load() + next_bytes.load();
  }
  // Views of a weight's tensors (op_mu held).
  kernels::QuantizedTensor Weight() const;
  float* residual_data() const { return residual.as<float>(); }
  float* stats_data() const { return stats.as<float>(); }
};

class StateStore {
 public:
  // `observer` may be null. `device_labels` pre-creates per-device gauges.
  StateStore(uint64_t budget_bytes, EngineObserver* observer,
             std::vector<std::string> device_labels);

  // Reserves the entry's name and bytes and returns with entry->op_mu locked in `*lock`.
  // ALREADY_EXISTS when the name is taken, RESOURCE_EXHAUSTED over the budget (`field` names
  // the request field in both).
  absl::Status Reserve(const std::shared_ptr<StateEntry>& entry, std::unique_lock<std::mutex>* lock,
                       absl::string_view field);
  // Makes a reserved entry visible.
  void Publish(const std::shared_ptr<StateEntry>& entry);
  // Removes an entry (reserved or live; caller holds op_mu) and releases its budget.
  void Drop(const std::shared_ptr<StateEntry>& entry);
  // Sets the bytes an entry's optimizer state takes (caller holds op_mu): RESOURCE_EXHAUSTED
  // naming `field` when the change does not fit the budget, and then nothing changes.
  absl::Status SetOptimizerBytes(const std::shared_ptr<StateEntry>& entry, uint64_t bytes,
                                 absl::string_view field);
  // The same for the bytes of a weight's one-pass copy (StateEntry::next_bytes).
  absl::Status SetNextStateBytes(const std::shared_ptr<StateEntry>& entry, uint64_t bytes,
                                 absl::string_view field);

  // Null when absent (the entry may still be not live: lock it and check).
  std::shared_ptr<StateEntry> Find(absl::string_view name) const;
  // Live entries sorted by name.
  std::vector<std::shared_ptr<StateEntry>> Entries() const;
  // Live entries of namespace `ns`, sorted by name, named without the namespace.
  std::vector<TensorListing> List(absl::string_view ns) const;

  uint64_t budget_bytes() const { return budget_; }
  uint64_t used_bytes() const;
  uint64_t device_bytes(absl::string_view label) const;

 private:
  void ReportLocked(absl::string_view device);
  // SetOptimizerBytes / SetNextStateBytes: `slot` is the entry's counter, `what` names it.
  absl::Status SetVariableBytes(const std::shared_ptr<StateEntry>& entry,
                                std::atomic<uint64_t>* slot, uint64_t bytes,
                                absl::string_view field, absl::string_view what);

  const uint64_t budget_;
  EngineObserver* const observer_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<StateEntry>, std::less<>> entries_;
  uint64_t used_ = 0;
  std::map<std::string, uint64_t, std::less<>> device_bytes_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_STATE_STORE_H_
