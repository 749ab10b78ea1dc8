// The optimizer step on the CUDA backend (step.h): the host builds the batch's item table
// (descriptors with the host scalars of step_scalars.h, the update and output tables, and one
// list of items per kernel variant), copies it into the workspace once, and queues
//   StepCheck:      one kernel setting the header and accumulators, one grouped check launch
//                   per variant
//                   (updates-only for delayed scaling and check-only items; the full
//                   recurrence per optimizer x state dtype for current scaling), the decide
//                   kernel;
//   StepApply:      one grouped apply launch per variant (optimizer x state dtype x rounding x
//                   block shape), the epilogue (records, statistics), the swizzle padding of
//                   swizzled weights; every kernel reads the batch flag and returns when the
//                   check refused the batch;
//   StepReadReport: one device-to-host copy of the report prefix and a stream synchronization.
// Nothing here waits for the device except StepReadReport: the item table goes out of pinned
// host memory (an asynchronous copy; a copy from pageable memory would first synchronize the
// stream), and its buffer is reused once an event recorded after the copy has completed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_status.h"
#include "cuda/kernel_codes_host.h"
#include "cuda/launch.h"
#include "cuda/step_launch.h"
#include "fp4q/common/status_macros.h"
#include "step_layout.h"
#include "step_report.h"
#include "step_scalars.h"

namespace fp4q::kernels::cuda {
namespace {

using step_ws::ItemDesc;
using step_ws::Layout;
using step_ws::ListEntry;

// Pinned host buffers for the item tables, reused, one pool per device: a buffer is free again
// once the event recorded after the copy out of it has completed (an event, not a host callback:
// a callback would hold the stream until the driver's callback thread ran it).
class PinnedPool {
 public:
  static PinnedPool& ForDevice(int ordinal) {
    static absl::Mutex* mu = new absl::Mutex;
    static auto* pools = new std::map<int, PinnedPool*>;
    absl::MutexLock lock(mu);
    PinnedPool*& p = (*pools)[ordinal];
    if (p == nullptr) p = new PinnedPool;
    return *p;
  }

  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy out of it (on this pool's device)
  };

  // A buffer of >= `bytes` whose last copy has completed (the current device is the pool's).
  absl::StatusOr<Buffer> Acquire(size_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].size < bytes) continue;
        const cudaError_t q = cudaEventQuery(free_[i].done);
        if (q == cudaErrorNotReady) continue;
        FP4Q_CUDA_RETURN_IF_ERROR(q);
        const Buffer b = free_[i];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    Buffer b;
    b.size = std::max<size_t>(bytes, size_t{1} << 16);
    FP4Q_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&b.data, b.size, cudaHostAllocPortable));
    const cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaFreeHost(b.data);
      return FP4Q_CUDA_STATUS(e);
    }
    return b;
  }

  // Returns `b` to the pool, free once `s` has passed this point.
  absl::Status ReleaseAfter(const Buffer& b, cudaStream_t s) {
    const cudaError_t e = cudaEventRecord(b.done, s);
    if (e != cudaSuccess) {
      // Cannot mark it: wait for the stream, then it is free.
      const cudaError_t sync = cudaStreamSynchronize(s);
      if (sync == cudaSuccess) Return(b);
      FP4Q_CUDA_RETURN_IF_ERROR(sync);
      return FP4Q_CUDA_STATUS(e);
    }
    Return(b);
    return absl::OkStatus();
  }

 private:
  void Return(const Buffer& b) {
    absl::MutexLock lock(&mu_);
    free_.push_back(b);
  }

  absl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
};

// Warp-units of an item (step_device.cuh's UnitsOf).
int64_t Units(int64_t rows, int64_t cols, bool tile) {
  if (tile) return (rows / 16) * ((cols / 16 + 1) / 2);
  return (rows * cols + step_ws::kUnitElems - 1) / step_ws::kUnitElems;
}

int OptOf(const OptimizerState& st) {
  if (st.kind == OptimizerKind::kAdamW) {
    return st.amsgrad ? step_ws::kOptAdamWAmsgrad : step_ws::kOptAdamW;
  }
  return st.momentum ? step_ws::kOptSgdMomentum : step_ws::kOptSgdPlain;
}

// One grouped launch.
struct Launch {
  int opt = 0;
  int st = step_ws::kStF32;
  bool full = false;  // check: current scaling (else updates only)
  bool sr = false;    // apply
  bool tile = false;  // apply
  bool one_rank = true;  // every item has one update
  bool lean = true;      // apply: every item is LeanSgdItem
  bool outs = false;     // some item has a dequantized output
  int32_t first_entry = 0;
  int32_t n_entries = 0;
  int64_t total_units = 0;
};

// The host side of a batch: its layout, the table copied into the workspace, the launches.
struct HostPlan {
  Layout layout;
  std::vector<uint8_t> table;  // the workspace's [layout.descs, layout.host_end)
  std::vector<Launch> checks;
  std::vector<Launch> applies;
  std::vector<int> swizzled;  // applied items whose scales are swizzled
};

template <typename T>
T* TableAt(HostPlan& h, size_t offset) {
  return reinterpret_cast<T*>(h.table.data() + (offset - h.layout.descs));
}

ItemDesc Describe(const StepItem& item, int32_t first_update, int32_t first_out, int32_t n_outs) {
  ItemDesc d;
  std::memset(&d, 0, sizeof(d));
  d.codes = item.weight.codes;
  d.scales = item.weight.scales;
  d.global = item.weight.global;
  d.residual = item.residual;
  d.stats = item.stats;
  const StepNext& next = item.next;
  d.codes_next = next.present() ? next.codes : item.weight.codes;
  d.scales_next = next.present() ? next.scales : item.weight.scales;
  d.global_next = next.present() ? next.global : item.weight.global;
  d.stats_next = next.present() ? next.stats : item.stats;
  d.residual_next = next.present() ? next.residual : item.residual;
  const OptimizerState& st = item.state;
  const MomentTensor* m[3] = {&st.moment1, &st.moment2, &st.max_moment2};
  for (int j = 0; j < 3; ++j) {
    if (!m[j]->present()) continue;
    if (st.dtype == StateDType::kNvfp4) {
      d.m_codes[j] = m[j]->quantized.codes;
      d.m_scales[j] = m[j]->quantized.scales;
      d.m_global[j] = m[j]->quantized.global;
    } else {
      d.m_dense[j] = m[j]->dense;
    }
  }
  d.rows = item.weight.rows;
  d.cols = item.weight.cols;
  d.n = d.rows * d.cols;
  d.seed = item.seed;
  d.sr_step = item.step;
  d.t = item.hyper.t;
  d.first_update = first_update;
  d.n_updates = static_cast<int32_t>(item.updates.size());
  d.first_out = first_out;
  d.n_outs = n_outs;
  d.opt = OptOf(st);
  d.state_dtype = static_cast<int32_t>(st.dtype);
  d.delayed = item.scaling == Scaling::kDelayed;
  d.sr = item.rounding == Rounding::kStochastic;
  d.tile16 = item.weight.block == BlockShape::k16x16;
  d.swizzled = item.weight.scale_layout == ScaleLayout::kSwizzled;
  d.delta = item.kind == UpdateKind::kDelta;
  d.nesterov = item.hyper.nesterov;
  d.check_only = item.check_only;
  for (const MutTensor& o : item.dequantized_out) {
    d.bf16_out = d.bf16_out || (o.data != nullptr && o.dtype == DType::kBF16);
  }
  const StepScalars s = ComputeStepScalars(item.hyper, d.n_updates);
  d.lr = s.lr;
  d.wd = s.wd;
  d.mu = s.mu;
  d.cd = s.cd;
  d.b1 = s.b1;
  d.b2 = s.b2;
  d.c1 = s.c1;
  d.c2 = s.c2;
  d.eps = s.eps;
  d.sbc2 = s.sbc2;
  d.alpha = s.alpha;
  d.lrwd = s.lrwd;
  d.kf = s.k;
  return d;
}

// Groups item indices by variant key, in a fixed order, into launches over the list table.
template <typename Key>
void AddLaunches(const std::map<Key, std::vector<int>>& groups, bool apply,
                 const std::vector<StepItem>& items, const std::vector<bool>& lean,
                 ListEntry* lists, int32_t* next_entry, std::vector<Launch>* out) {
  for (const auto& [key, members] : groups) {
    Launch l;
    l.opt = std::get<0>(key);
    l.st = std::get<1>(key);
    if constexpr (std::tuple_size_v<Key> == 4) {
      l.sr = std::get<2>(key);
      l.tile = std::get<3>(key);
    } else {
      l.full = std::get<2>(key);
    }
    l.first_entry = *next_entry;
    l.n_entries = static_cast<int32_t>(members.size());
    int64_t units = 0;
    for (int i : members) {
      const StepItem& it = items[i];
      ListEntry& e = lists[(*next_entry)++];
      e = ListEntry{i, 0, units};
      l.one_rank = l.one_rank && it.updates.size() == 1;
      l.lean = l.lean && lean[i];
      l.outs = l.outs || !it.dequantized_out.empty();
      units += Units(it.weight.rows, it.weight.cols, apply && l.tile);
    }
    lists[(*next_entry)++] = ListEntry{-1, 0, units};  // the sentinel: the launch's total
    l.total_units = units;
    out->push_back(l);
  }
}

HostPlan BuildPlan(const std::vector<StepItem>& items) {
  HostPlan h;
  h.layout = StepLayoutOf(items);
  const Layout& l = h.layout;
  h.table.assign(l.host_end - l.descs, 0);
  ItemDesc* descs = TableAt<ItemDesc>(h, l.descs);
  auto* updates = TableAt<step_ws::UpdateDesc>(h, l.updates);
  auto* outs = TableAt<step_ws::OutDesc>(h, l.outs);
  ListEntry* lists = TableAt<ListEntry>(h, l.lists);
  // (opt, state dtype, full) and (opt, state dtype, sr, tile).
  std::map<std::tuple<int, int, bool>, std::vector<int>> checks;
  std::map<std::tuple<int, int, bool, bool>, std::vector<int>> applies;
  std::vector<bool> lean(items.size(), false);
  int32_t nu = 0, no = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    const int32_t first_update = nu, first_out = no;
    for (size_t k = 0; k < it.updates.size(); ++k) {
      step_ws::UpdateDesc& u = updates[nu++];
      u.data = it.updates[k].data;
      u.dtype = DtypeCode(it.updates[k].dtype);
      u.rank = static_cast<int32_t>(k);
      u.expect = it.check_only ? it.expect_fingerprints[k] : 0;
    }
    for (const MutTensor& o : it.dequantized_out) {
      if (o.data == nullptr) continue;
      outs[no++] = step_ws::OutDesc{o.data, DtypeCode(o.dtype), 0};
    }
    descs[i] = Describe(it, first_update, first_out, no - first_out);
    lean[i] = LeanSgdItem(descs[i], it.updates.empty() ? 0 : updates[first_update].dtype,
                          no > first_out ? outs[first_out].dtype : 0);
    const int opt = descs[i].opt;
    const int st = opt == step_ws::kOptSgdPlain ? step_ws::kStF32 : descs[i].state_dtype;
    const bool full = !it.check_only && it.scaling == Scaling::kCurrent;
    checks[{full ? opt : 0, full ? st : step_ws::kStF32, full}].push_back(static_cast<int>(i));
    if (!it.check_only) {
      applies[{opt, st, descs[i].sr != 0, descs[i].tile16 != 0}].push_back(static_cast<int>(i));
      if (descs[i].swizzled) h.swizzled.push_back(static_cast<int>(i));
    }
  }
  int32_t next = 0;
  AddLaunches(checks, false, items, lean, lists, &next, &h.checks);
  AddLaunches(applies, true, items, lean, lists, &next, &h.applies);
  return h;
}

StepKernelArgs ArgsFor(const Layout& l, uint8_t* ws, const Launch& launch, int prefetch_slots) {
  StepKernelArgs a;
  a.prefetch_slots = prefetch_slots;
  a.header = reinterpret_cast<const step_ws::Header*>(ws);
  a.descs = reinterpret_cast<const ItemDesc*>(ws + l.descs);
  a.updates = reinterpret_cast<const step_ws::UpdateDesc*>(ws + l.updates);
  a.outs = reinterpret_cast<const step_ws::OutDesc*>(ws + l.outs);
  a.list = reinterpret_cast<const ListEntry*>(ws + l.lists) + launch.first_entry;
  a.n_entries = launch.n_entries;
  a.total_units = launch.total_units;
  a.plans = reinterpret_cast<const step_ws::Plan*>(ws + l.plans);
  a.idx_acc = reinterpret_cast<uint64_t*>(ws + l.idx_acc);
  a.upd_idx_acc = reinterpret_cast<uint64_t*>(ws + l.upd_idx_acc);
  a.max_acc = reinterpret_cast<uint32_t*>(ws + l.max_acc);
  a.fp_acc = reinterpret_cast<uint64_t*>(ws + l.fp_acc);
  return a;
}

absl::Status CheckWorkspaceAligned(const void* ws) {
  if (reinterpret_cast<uintptr_t>(ws) % 16 != 0) {
    return absl::InvalidArgumentError("workspace: not 16-byte aligned");
  }
  return absl::OkStatus();
}

// The kernels index blocks and block rows in 32 bits (step_device.cuh's LocateHalf).
absl::Status CheckKernelLimits(const std::vector<StepItem>& items) {
  constexpr int64_t kMaxElements = int64_t{1} << 36;
  for (size_t i = 0; i < items.size(); ++i) {
    const QuantizedTensor& w = items[i].weight;
    if (w.rows * w.cols >= kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].weight: ", w.rows, " x ", w.cols,
          " elements; the CUDA step kernels take weights of fewer than 2^36 elements"));
    }
  }
  return absl::OkStatus();
}

// The batch's plan `h` (BuildPlan) copied into the workspace and the accumulators set.
absl::Status QueueTable(int ordinal, const HostPlan& h, void* workspace, cudaStream_t s) {
  const Layout& l = h.layout;
  auto* ws = static_cast<uint8_t*>(workspace);
  // The header and accumulators first: if a launch below fails, no stale "ok" of an earlier
  // batch remains. A table that fits rides in the same launch (no copy between it and the
  // step's kernels, which then start as programmatic dependent launches behind it).
  if (h.table.size() <= kInlineTableBytes && InlineTables()) {
    return FP4Q_CUDA_STATUS(LaunchStepInitWithTable(ws, l.idx_acc, l.ff_end, l.total,
                                                    h.table.data(), l.descs, h.table.size(), s));
  }
  FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchStepInit(ws, l.idx_acc, l.ff_end, l.total, s)));
  PinnedPool& pool = PinnedPool::ForDevice(ordinal);
  FP4Q_ASSIGN_OR_RETURN(PinnedPool::Buffer pinned, pool.Acquire(h.table.size()));
  std::memcpy(pinned.data, h.table.data(), h.table.size());
  const cudaError_t copy =
      cudaMemcpyAsync(ws + l.descs, pinned.data, h.table.size(), cudaMemcpyHostToDevice, s);
  FP4Q_RETURN_IF_ERROR(pool.ReleaseAfter(pinned, s));
  return FP4Q_CUDA_STATUS(copy);
}

// The decision's parameters over the accumulators of the batch in `workspace`.
StepDecideArgs DecideArgsFor(const Layout& l, uint8_t* ws, const StepCancel& cancel) {
  StepDecideArgs d;
  d.header = reinterpret_cast<step_ws::Header*>(ws);
  d.descs = reinterpret_cast<const ItemDesc*>(ws + l.descs);
  d.updates = reinterpret_cast<const step_ws::UpdateDesc*>(ws + l.updates);
  d.n_items = static_cast<int32_t>(l.n_items);
  d.n_updates = static_cast<int32_t>(l.n_updates);
  d.reports = reinterpret_cast<step_ws::ReportPod*>(ws + l.reports);
  d.fingerprints = reinterpret_cast<uint64_t*>(ws + l.fingerprints);
  d.plans = reinterpret_cast<step_ws::Plan*>(ws + l.plans);
  d.idx_acc = reinterpret_cast<const uint64_t*>(ws + l.idx_acc);
  d.upd_idx_acc = reinterpret_cast<const uint64_t*>(ws + l.upd_idx_acc);
  d.max_acc = reinterpret_cast<const uint32_t*>(ws + l.max_acc);
  d.fp_acc = reinterpret_cast<const uint64_t*>(ws + l.fp_acc);
  d.cancel_word = cancel.word;
  d.cancel_token = cancel.token;
  return d;
}

// The decide kernel over the accumulators of the batch in `workspace`.
absl::Status QueueDecide(const Layout& l, void* workspace, cudaStream_t s,
                         const StepCancel& cancel) {
  return FP4Q_CUDA_STATUS(
      LaunchStepDecide(DecideArgsFor(l, static_cast<uint8_t*>(workspace), cancel), s));
}

// The check's work by the batch's plan `h`: the table, the check launches, the decide kernel.
absl::Status QueueCheck(int ordinal, int prefetch_slots, const HostPlan& h, void* workspace,
                        cudaStream_t s, const StepCancel& cancel) {
  const Layout& l = h.layout;
  auto* ws = static_cast<uint8_t*>(workspace);
  FP4Q_RETURN_IF_ERROR(QueueTable(ordinal, h, workspace, s));
  for (const Launch& launch : h.checks) {
    const StepKernelArgs a = ArgsFor(l, ws, launch, prefetch_slots);
    if (launch.full) {
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(LaunchStepCheckFull(a, launch.opt, launch.st, s)));
    } else {
      FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(launch.one_rank ? LaunchStepCheckOneRank(a, s)
                                                             : LaunchStepCheckUpdates(a, s)));
    }
  }
  return QueueDecide(l, workspace, s, cancel);
}

// The apply's epilogue: the new records and statistics (gated on the batch flag).
absl::Status QueueFinish(const Layout& l, void* workspace, cudaStream_t s) {
  auto* ws = static_cast<uint8_t*>(workspace);
  StepFinishArgs f;
  f.header = reinterpret_cast<const step_ws::Header*>(ws);
  f.descs = reinterpret_cast<const ItemDesc*>(ws + l.descs);
  f.n_items = static_cast<int32_t>(l.n_items);
  f.plans = reinterpret_cast<const step_ws::Plan*>(ws + l.plans);
  f.max_acc = reinterpret_cast<const uint32_t*>(ws + l.max_acc);
  return FP4Q_CUDA_STATUS(LaunchStepFinish(f, s));
}

// The apply's work for `items` by the plan `h` the check copied into the workspace.
absl::Status QueueApply(int prefetch_slots, const std::vector<StepItem>& items, const HostPlan& h,
                        void* workspace, cudaStream_t s) {
  const Layout& l = h.layout;
  auto* ws = static_cast<uint8_t*>(workspace);
  for (const Launch& launch : h.applies) {
    const StepKernelArgs a = ArgsFor(l, ws, launch, prefetch_slots);
    const bool sgd = launch.opt == step_ws::kOptSgdPlain || launch.opt == step_ws::kOptSgdMomentum;
    cudaError_t e;
    if (launch.opt == step_ws::kOptSgdPlain && launch.lean) {
      e = LaunchStepApplySgdLean(a, launch.sr, s);
    } else if (sgd) {
      e = LaunchStepApplySgd(a, launch.opt, launch.st, launch.sr, launch.tile, s);
    } else {
      e = LaunchStepApplyAdamW(a, launch.opt, launch.st, launch.sr, launch.tile, s);
    }
    FP4Q_RETURN_IF_ERROR(FP4Q_CUDA_STATUS(e));
  }
  FP4Q_RETURN_IF_ERROR(QueueFinish(l, workspace, s));
  const int32_t* gate = &reinterpret_cast<const step_ws::Header*>(ws)->ok;
  for (int i : h.swizzled) {
    const QuantizedTensor& w = items[i].weight;
    FP4Q_RETURN_IF_ERROR(
        FP4Q_CUDA_STATUS(LaunchZeroSwizzlePadding(w.scales, w.rows, w.cols / 16, s, gate, 1)));
  }
  return absl::OkStatus();
}

// A one-pass step (every item with a StepNext, every one LeanSgdItem under delayed scaling):
// the table, the one-pass applies (writing the new state beside the old and accumulating the
// check's words; the last one's last CTA decides and, for an accepted batch, writes the new
// records and statistics), and the restore of the outputs, which runs only when the batch was
// refused. A step whose applies have no warp-units to walk queues the decide and finish kernels
// instead. Every launch is checked before the first is queued; once an apply is queued, a later
// failure still queues the restores (the header QueueTable zeroed refuses the batch for them),
// so that no output is left holding DQ of a state that is never committed, and the first error
// is returned.
absl::Status QueueOnePass(int ordinal, int prefetch_slots, const HostPlan& h, void* workspace,
                          cudaStream_t s, const StepCancel& cancel) {
  const Layout& l = h.layout;
  auto* ws = static_cast<uint8_t*>(workspace);
  size_t last = h.applies.size();  // the launch that decides (none: the kernels decide)
  for (size_t i = 0; i < h.applies.size(); ++i) {
    const Launch& launch = h.applies[i];
    if (launch.opt != step_ws::kOptSgdPlain || !launch.lean || launch.tile) {
      return absl::InternalError("one-pass step: an item the lean apply does not take");
    }
    if (launch.total_units > 0) last = i;
  }
  FP4Q_RETURN_IF_ERROR(QueueTable(ordinal, h, workspace, s));
  absl::Status st;
  size_t queued = 0;  // the applies queued
  for (size_t i = 0; i < h.applies.size(); ++i) {
    StepOnePassArgs a;
    a.apply = ArgsFor(l, ws, h.applies[i], prefetch_slots);
    a.apply.cancel_word = cancel.word;
    a.apply.cancel_token = cancel.token;
    a.apply.ran = &reinterpret_cast<step_ws::Header*>(ws)->one_pass_ran;
    a.decide_last = i == last;
    if (a.decide_last) a.decide = DecideArgsFor(l, ws, cancel);
    st = FP4Q_CUDA_STATUS(LaunchStepApplySgdOnePass(a, h.applies[i].sr, s));
    if (!st.ok()) break;
    ++queued;
  }
  if (st.ok() && last == h.applies.size()) {
    st = QueueDecide(l, workspace, s, cancel);
    if (st.ok()) st = QueueFinish(l, workspace, s);
  }
  for (size_t i = 0; i < queued; ++i) {
    if (!h.applies[i].outs) continue;  // nothing to restore
    const absl::Status r =
        FP4Q_CUDA_STATUS(LaunchStepRestoreOutputs(ArgsFor(l, ws, h.applies[i], prefetch_slots), s));
    if (st.ok()) st = r;
  }
  return st;
}

}  // namespace

absl::Status CudaBackend::StepCheckImpl(const std::vector<StepItem>& items, void* workspace,
                                        cudaStream_t s, const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(CheckWorkspaceAligned(workspace));
  FP4Q_RETURN_IF_ERROR(CheckKernelLimits(items));
  return QueueCheck(ordinal_, tuning_.step_prefetch_slots, BuildPlan(items), workspace, s,
                    cancel);
}

absl::Status CudaBackend::StepApplyImpl(const std::vector<StepItem>& items, void* workspace,
                                        cudaStream_t s) {
  FP4Q_RETURN_IF_ERROR(CheckWorkspaceAligned(workspace));
  FP4Q_RETURN_IF_ERROR(CheckKernelLimits(items));
  // The same plan as the check's: the lists it copied into the workspace.
  return QueueApply(tuning_.step_prefetch_slots, items, BuildPlan(items), workspace, s);
}

absl::Status CudaBackend::StepCheckAndApplyImpl(const std::vector<StepItem>& items,
                                                void* workspace, cudaStream_t s,
                                                const StepCancel& cancel) {
  FP4Q_RETURN_IF_ERROR(CheckWorkspaceAligned(workspace));
  FP4Q_RETURN_IF_ERROR(CheckKernelLimits(items));
  const HostPlan h = BuildPlan(items);
  if (items[0].next.present()) {
    return QueueOnePass(ordinal_, tuning_.step_prefetch_slots, h, workspace, s, cancel);
  }
  FP4Q_RETURN_IF_ERROR(QueueCheck(ordinal_, tuning_.step_prefetch_slots, h, workspace, s, cancel));
  return QueueApply(tuning_.step_prefetch_slots, items, h, workspace, s);
}

absl::Status CudaBackend::StepReadReportImpl(const std::vector<StepItem>& items,
                                             const void* workspace, StepReport* report,
                                             cudaStream_t s) {
  const Layout l = StepLayoutOf(items);
  // Into pinned memory: a copy to pageable memory is staged through the driver's own buffer.
  PinnedPool& pool = PinnedPool::ForDevice(ordinal_);
  FP4Q_ASSIGN_OR_RETURN(PinnedPool::Buffer pinned, pool.Acquire(l.report_end));
  cudaError_t e = cudaMemcpyAsync(pinned.data, workspace, l.report_end, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) {
    DecodeStepReport(items, l, static_cast<const uint8_t*>(pinned.data), report);
  }
  FP4Q_RETURN_IF_ERROR(pool.ReleaseAfter(pinned, s));
  return FP4Q_CUDA_STATUS(e);
}

}  // namespace fp4q::kernels::cuda
