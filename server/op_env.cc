#include "server/op_env.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::server {

absl::StatusOr<uint8_t*> OpEnv::RegionSliceFor(const RegionSlice& slice, uint64_t bytes,
                                               const FieldPath& field, bool output) {
  auto it = scope_->pins.find(slice.region_id);
  if (it == scope_->pins.end()) {
    // Routing pins every region a request names; reaching here is a bug.
    return absl::InternalError(absl::StrCat(field.str(), ": region was not pinned"));
  }
  if (it->second.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat(field.str(), ".region_id: the region is on another device"));
  }
  Slice& s = slices_.emplace_back();  // kept: CheckNoOverlap names the slices
  s.length = field.SpellTo(s.text, sizeof(s.text));
  if (s.length > sizeof(s.text)) s.long_text = field.str();
  absl::StatusOr<uint8_t*> p = it->second.Slice(slice.offset, bytes, s.field());
  if (!p.ok()) {
    slices_.pop_back();
    return p.status();
  }
  s.begin = reinterpret_cast<uintptr_t>(*p);
  s.end = s.begin + bytes;
  s.output = output;
  return *p;
}

absl::Status OpEnv::StillWanted() const {
  if (ctx_ == nullptr) return absl::OkStatus();
  if (ctx_->is_cancelled && ctx_->is_cancelled()) {
    return absl::CancelledError("the caller cancelled the request; the rest of the work was not done");
  }
  if (absl::Now() > ctx_->deadline) {
    return absl::DeadlineExceededError(
        "the request's deadline passed during the work; the rest of it was not done");
  }
  return absl::OkStatus();
}

absl::Status OpEnv::InlineFits(const OutputTarget& target, uint64_t bytes,
                               const FieldPath& field) const {
  if (target.has_region || ctx_ == nullptr || ctx_->reply_limit == 0) return absl::OkStatus();
  if (bytes <= ctx_->reply_limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field.str(), ": the inline output (", bytes,
                   " bytes) would exceed this transport's reply limit of ",
                   ctx_->reply_limit,
                   " bytes; nothing was run: give a CUDA IPC region for it"));
}

absl::StatusOr<kernels::ConstTensor> OpEnv::Input(const TensorIn& t,
                                                  const DenseShape& shape,
                                                  const FieldPath& field) {
  FP4Q_ASSIGN_OR_RETURN(
      const uint8_t* p,
      InputBytes(t.data, shape.bytes, field.Member("inline_data"),
                 field.Member("region")));
  return kernels::ConstTensor{p, shape.dtype, shape.rows, shape.cols};
}

absl::StatusOr<const uint8_t*> OpEnv::InputBytes(const BytesIn& b, size_t bytes,
                                                 const FieldPath& inline_field,
                                                 const FieldPath& region_field) {
  AddProcessed(bytes);
  switch (b.source) {
    case Source::kNone:
      return absl::InvalidArgumentError(
          absl::StrCat(inline_field.str(), ": no data (set the inline bytes or a region)"));
    case Source::kRegion:
      return RegionSliceFor(b.region, bytes, region_field, /*output=*/false);
    case Source::kInline:
      break;
  }
  if (b.inline_data.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(inline_field.str(), ": ", b.inline_data.size(), " bytes, expected ", bytes));
  }
  const auto* src = reinterpret_cast<const uint8_t*>(b.inline_data.data());
  if (device_->host_memory && reinterpret_cast<uintptr_t>(src) % 16 == 0) return src;
  FP4Q_ASSIGN_OR_RETURN(void* dst, Scratch(bytes));
  if (device_->host_memory) {
    std::memcpy(dst, src, bytes);
  } else {
    FP4Q_RETURN_IF_ERROR(backend().CopyFromHost(dst, src, bytes, stream_));
  }
  return static_cast<const uint8_t*>(dst);
}

absl::StatusOr<uint8_t*> OpEnv::Output(const OutputTarget& target, size_t bytes,
                                       const FieldPath& field, std::string* inline_out,
                                       bool* in_region, RegionSlice* region_out) {
  AddProcessed(bytes);
  if (target.has_region) {
    FP4Q_ASSIGN_OR_RETURN(
        uint8_t * p, RegionSliceFor(target.region, bytes, field.Member("region"), true));
    *in_region = true;
    *region_out = target.region;
    inline_out->clear();
    return p;
  }
  FP4Q_ASSIGN_OR_RETURN(void* p, Scratch(bytes));
  *in_region = false;
  pending_.push_back(PendingCopy{p, inline_out, bytes});
  return static_cast<uint8_t*>(p);
}

OpEnv::~OpEnv() {
  RunDeferred();
  if (pool_ == nullptr || scratch_.empty()) return;
  // Work of this request may still read or write its scratch (a failed request stops without
  // synchronizing): wait before another stream may get the buffers.
  if (!device_->host_memory && !backend().Synchronize(stream_).ok()) return;  // freed instead
  for (DeviceBuffer& b : scratch_) pool_->Give(std::move(b));
}

void OpEnv::RunDeferred() {
  std::vector<std::function<void()>> fns;
  fns.swap(deferred_);
  for (auto& fn : fns) fn();
}

absl::StatusOr<void*> OpEnv::Scratch(size_t bytes) {
  DeviceBuffer b;
  if (pool_ != nullptr) {
    FP4Q_ASSIGN_OR_RETURN(b, pool_->Take(bytes == 0 ? 1 : bytes));
  } else {
    FP4Q_ASSIGN_OR_RETURN(b, DeviceBuffer::Allocate(&backend(), bytes == 0 ? 1 : bytes));
  }
  void* p = b.data();
  scratch_.push_back(std::move(b));
  return p;
}

absl::Status OpEnv::CheckNoOverlap(
    const std::vector<std::pair<std::string, std::string>>& allowed) const {
  // The slices by start address: only slices that start before one ends can overlap it, so the
  // sweep compares overlapping pairs only. Each violation is ordered as an (output, other) pair
  // (two outputs: the first given is the output), and the first in the order the slices were
  // given is named.
  const size_t n = slices_.size();
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return slices_[a].begin < slices_[b].begin; });
  std::pair<size_t, size_t> first{n, n};
  auto consider = [&](size_t i, size_t j) {  // slices_[i] an output overlapping slices_[j]
    const Slice& o = slices_[i];
    const Slice& s = slices_[j];
    if (!o.output || (s.output && j < i)) return;
    if (o.begin == s.begin && o.end == s.end) {
      for (const auto& [out, in] : allowed) {
        if (o.field() == out && s.field() == in) return;
      }
    }
    first = std::min(first, std::make_pair(i, j));
  };
  for (size_t a = 0; a < n; ++a) {
    const Slice& x = slices_[order[a]];
    for (size_t b = a + 1; b < n && slices_[order[b]].begin < x.end; ++b) {
      const Slice& y = slices_[order[b]];
      if (x.begin >= y.end || y.begin >= x.end) continue;
      consider(order[a], order[b]);
      consider(order[b], order[a]);
    }
  }
  if (first.first == n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(slices_[first.first].field(), ": overlaps ",
                                                 slices_[first.second].field(),
                                                 " in the same client memory"));
}

absl::Status OpEnv::Kernel(absl::string_view op, const std::function<absl::Status()>& launch) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = launch();
  if (s.ok()) s = backend().Synchronize(stream_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (observer_ != nullptr) observer_->KernelDuration(device_->label, op, seconds);
  meta_->kernel_micros += seconds * 1e6;
  return s;
}

absl::Status OpEnv::FinishOutputs() {
  for (const PendingCopy& c : pending_) {
    c.dst->resize(c.bytes);
    if (device_->host_memory) {
      std::memcpy(c.dst->data(), c.src, c.bytes);
    } else {
      FP4Q_RETURN_IF_ERROR(backend().CopyToHost(c.dst->data(), c.src, c.bytes, stream_));
    }
  }
  const bool copied = !pending_.empty();
  pending_.clear();
  // Nothing copied: the work before was already synchronized (Kernel).
  if (copied && !device_->host_memory) return backend().Synchronize(stream_);
  return absl::OkStatus();
}

absl::Status OpEnv::ToHost(void* dst, const void* src, size_t bytes) {
  if (device_->host_memory) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  FP4Q_RETURN_IF_ERROR(backend().CopyToHost(dst, src, bytes, stream_));
  return backend().Synchronize(stream_);
}

absl::StatusOr<const void*> OpEnv::HostView(const void* device_ptr, size_t bytes) {
  if (device_->host_memory) return device_ptr;
  host_copies_.push_back(std::make_unique<char[]>(bytes == 0 ? 1 : bytes));
  FP4Q_RETURN_IF_ERROR(ToHost(host_copies_.back().get(), device_ptr, bytes));
  return static_cast<const void*>(host_copies_.back().get());
}

}  // namespace fp4q::server
