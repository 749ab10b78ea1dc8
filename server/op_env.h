// OpEnv: what one request's work sees on its executor thread: the device, its stream, the
// regions the request pinned while being routed, and scratch memory. It turns request tensors
// (inline bytes or region slices) into kernels views and collects outputs.
//
// - Inline inputs are used in place on host-memory devices when aligned, else copied to
//   scratch. Region inputs/outputs are bounds-checked slices of pinned regions (RegionPin).
// - Inline outputs are written to scratch and copied into the result's bytes by
//   FinishOutputs(); region outputs are written in place (zero copy).
// - Slices of client regions must not overlap an output (CheckNoOverlap), except an exact alias
//   the operation allows.
// - Scratch comes from the device's ScratchPool when one is given; the destructor synchronizes
//   the stream (only when it handed out device scratch) and gives the buffers back.
// - Defer(fn): work that needs nothing from the client any more (host-side statistics) runs
//   after the reply was sent, on the same thread (RunDeferred).
// Not thread-safe: one request, one thread.
#ifndef FP4Q_SERVER_OP_ENV_H_
#define FP4Q_SERVER_OP_ENV_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fp4q/common/field_path.h"
#include "fp4q/kernels/backend.h"
#include "server/device_buffer.h"
#include "server/devices.h"
#include "server/observer.h"
#include "server/regions.h"
#include "server/request_checks.h"
#include "server/requests.h"
#include "server/scratch_pool.h"

namespace fp4q::server {

// Regions a request pinned while it was routed, by region id. Lives until the request is done.
struct RequestScope {
  std::map<std::string, RegionPin, std::less<>> pins;
};

class OpEnv {
 public:
  // `pool` may be null (scratch is then allocated and freed per request).
  OpEnv(Device* device, kernels::Stream stream, RequestScope* scope, EngineObserver* observer,
        ReplyMeta* meta, ScratchPool* pool = nullptr)
      : device_(device),
        stream_(stream),
        scope_(scope),
        observer_(observer),
        meta_(meta),
        pool_(pool) {}
  ~OpEnv();
  OpEnv(const OpEnv&) = delete;
  OpEnv& operator=(const OpEnv&) = delete;

  Device& device() { return *device_; }
  // The namespace of the request's names (Engine::ResolveNamespace) and a name's store key.
  void set_namespace(std::string ns) { ns_ = std::move(ns); }
  // The request's context (deadline, cancellation, reply limit); set before the body runs.
  void set_context(const RequestContext* ctx) { ctx_ = ctx; }
  // DEADLINE_EXCEEDED / CANCELLED when the request's deadline passed or its caller went away:
  // long work checks this between chunks and stops.
  absl::Status StillWanted() const;
  // RESOURCE_EXHAUSTED naming `field` when `bytes` returned inline could not fit the reply
  // (checked before the work, so nothing is computed for a reply that cannot be sent).
  absl::Status InlineFits(const OutputTarget& target, uint64_t bytes,
                          const FieldPath& field) const;
  const std::string& ns() const { return ns_; }
  std::string Key(absl::string_view name) const { return QualifiedName(ns_, name); }
  kernels::Backend& backend() { return *device_->backend; }
  kernels::Stream stream() const { return stream_; }
  ReplyMeta& meta() { return *meta_; }

  // A dense input checked by CheckDenseTensor.
  absl::StatusOr<kernels::ConstTensor> Input(const TensorIn& t, const DenseShape& shape,
                                             const FieldPath& field);
  // `bytes` bytes given inline (exactly that many; errors name `inline_field`) or by region
  // (errors name `region_field`, e.g. "input.region.offset").
  absl::StatusOr<const uint8_t*> InputBytes(const BytesIn& b, size_t bytes,
                                            const FieldPath& inline_field,
                                            const FieldPath& region_field);
  // An output of `bytes` bytes: in the target's region (errors name "<field>.region"), or
  // scratch landing in *inline_out.
  absl::StatusOr<uint8_t*> Output(const OutputTarget& target, size_t bytes,
                                  const FieldPath& field,
                                  std::string* inline_out, bool* in_region,
                                  RegionSlice* region_out);
  absl::StatusOr<uint8_t*> Output(const OutputTarget& target, size_t bytes,
                                  const FieldPath& field, TensorResult* out) {
    return Output(target, bytes, field, &out->inline_data, &out->in_region,
                  &out->region);
  }
  absl::StatusOr<uint8_t*> Output(const OutputTarget& target, size_t bytes,
                                  const FieldPath& field, BytesResult* out) {
    return Output(target, bytes, field, &out->inline_data, &out->in_region, &out->region);
  }
  // Device scratch freed when the request ends.
  absl::StatusOr<void*> Scratch(size_t bytes);

  // Outputs may not overlap any other slice of a region; `allowed` lists (output, input) field
  // pairs that may alias exactly (same offset and size).
  absl::Status CheckNoOverlap(
      const std::vector<std::pair<std::string, std::string>>& allowed = {}) const;

  // Runs `launch`, synchronizes the stream, and records the time under kernel op `op`.
  absl::Status Kernel(absl::string_view op, const std::function<absl::Status()>& launch);
  // Copies scratch outputs into their result bytes (synchronizes when it copied anything).
  absl::Status FinishOutputs();
  // Device -> host copy (synchronizes). On host-memory devices a plain copy.
  absl::Status ToHost(void* dst, const void* src, size_t bytes);
  // Host view of a device input (copied when the device is not host memory).
  absl::StatusOr<const void*> HostView(const void* device_ptr, size_t bytes);

  void AddProcessed(uint64_t bytes) { meta_->processed_bytes += bytes; }

  // Runs `fn` after the reply (see above). Scratch memory stays valid until then.
  void Defer(std::function<void()> fn) { deferred_.push_back(std::move(fn)); }
  void RunDeferred();

 private:
  // A region slice and its field path, spelled into the slice itself (a step names two slices
  // an item; only a path longer than `text` is kept on the heap).
  struct Slice {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    bool output = false;
    size_t length = 0;
    char text[64];
    std::string long_text;
    absl::string_view field() const {
      return length <= sizeof(text) ? absl::string_view(text, length)
                                    : absl::string_view(long_text);
    }
  };
  struct PendingCopy {
    const void* src = nullptr;
    std::string* dst = nullptr;
    size_t bytes = 0;
  };
  absl::StatusOr<uint8_t*> RegionSliceFor(const RegionSlice& slice, uint64_t bytes,
                                          const FieldPath& field, bool output);

  Device* device_;
  kernels::Stream stream_;
  RequestScope* scope_;
  EngineObserver* observer_;
  ReplyMeta* meta_;
  ScratchPool* pool_;
  std::string ns_;
  const RequestContext* ctx_ = nullptr;
  std::vector<DeviceBuffer> scratch_;
  std::vector<std::function<void()>> deferred_;
  std::vector<PendingCopy> pending_;
  std::vector<Slice> slices_;
  std::vector<std::unique_ptr<char[]>> host_copies_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_OP_ENV_H_
