#include "fp4q/client/session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client {

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const Client& client,
                                                       const SessionOptions& options) {
  if (options.keep_alive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SessionOptions.keep_alive_interval must be >= 0, got ",
                     absl::FormatDuration(options.keep_alive_interval)));
  }
  v1::OpenSessionRequest request;
  request.set_client_name(options.client_name);
  FP4Q_ASSIGN_OR_RETURN(v1::OpenSessionReply reply, client.OpenSession(request));
  if (reply.session_id().empty()) {
    return absl::InternalError("OpenSession replied with an empty session_id");
  }
  std::unique_ptr<Session> session(
      new Session(client, reply.session_id(), reply.lease_seconds(), options));
  absl::Duration interval = options.keep_alive_interval;
  if (interval == absl::ZeroDuration()) {
    interval = std::max(absl::Seconds(reply.lease_seconds()) / 3, absl::Seconds(1));
  }
  if (interval != absl::InfiniteDuration()) {
    session->keep_alive_ = std::thread([s = session.get(), interval] { s->KeepAliveLoop(interval); });
  }
  return session;
}

Session::Session(const Client& client, std::string id, uint32_t lease_seconds,
                 const SessionOptions& options)
    : client_(client), id_(std::move(id)), lease_seconds_(lease_seconds), options_(options) {}

Session::~Session() {
  bool closed;
  {
    absl::MutexLock lock(&mu_);
    closed = closed_;
  }
  if (!closed) {
    // Best effort: the server releases the session's regions at its lease's end regardless.
    StopKeepAlive();
    v1::CloseSessionRequest request;
    (void)client_.CloseSession(request, call_options(absl::Seconds(2)));
  }
  StopKeepAlive();
}

CallOptions Session::call_options(absl::Duration deadline) const {
  CallOptions call;
  call.deadline = deadline;
  call.session_id = id_;
  return call;
}

absl::Status Session::CheckOpen() const {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::FailedPreconditionError(absl::StrCat("session ", id_, " is closed"));
  }
  return absl::OkStatus();
}

absl::Status Session::keep_alive_status() const {
  absl::MutexLock lock(&mu_);
  return keep_alive_status_;
}

absl::StatusOr<uint32_t> Session::KeepAlive() {
  FP4Q_RETURN_IF_ERROR(CheckOpen());
  absl::StatusOr<v1::KeepAliveReply> reply =
      client_.KeepAlive(v1::KeepAliveRequest(), call_options());
  absl::MutexLock lock(&mu_);
  keep_alive_status_ = reply.status();
  if (!reply.ok()) return reply.status();
  return reply->lease_seconds();
}

void Session::KeepAliveLoop(absl::Duration interval) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), interval);
      if (stop_) return;
    }
    absl::StatusOr<v1::KeepAliveReply> reply =
        client_.KeepAlive(v1::KeepAliveRequest(), call_options());
    absl::MutexLock lock(&mu_);
    keep_alive_status_ = reply.status();
  }
}

void Session::StopKeepAlive() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (keep_alive_.joinable()) keep_alive_.join();
}

absl::StatusOr<uint32_t> Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return 0u;
  }
  StopKeepAlive();
  FP4Q_ASSIGN_OR_RETURN(v1::CloseSessionReply reply,
                        client_.CloseSession(v1::CloseSessionRequest(), call_options()));
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  absl::MutexLock lock(&regions_mu_);
  by_base_.clear();
  return reply.regions_released();
}

absl::StatusOr<std::string> Session::RegisterCudaRegion(const std::string& ipc_handle,
                                                        uint64_t size,
                                                        const std::string& device_uuid) {
  FP4Q_RETURN_IF_ERROR(CheckOpen());
  v1::RegisterCudaRegionRequest request;
  request.set_ipc_handle(ipc_handle);
  request.set_size(size);
  request.set_device_uuid(device_uuid);
  FP4Q_ASSIGN_OR_RETURN(v1::RegisterCudaRegionReply reply,
                        client_.RegisterCudaRegion(request, call_options()));
  if (reply.region_id().empty()) {
    return absl::InternalError("RegisterCudaRegion replied with an empty region_id");
  }
  return reply.region_id();
}

absl::Status Session::UnregisterCudaRegion(const std::string& region_id) {
  FP4Q_RETURN_IF_ERROR(CheckOpen());
  v1::UnregisterCudaRegionRequest request;
  request.set_region_id(region_id);
  return client_.UnregisterCudaRegion(request, call_options()).status();
}

absl::StatusOr<const CudaIpc*> Session::Ipc() {
  if (!ipc_tried_) {
    ipc_tried_ = true;
    absl::StatusOr<std::unique_ptr<CudaIpc>> ipc = CudaIpc::Load(options_.cuda_runtime_candidates);
    if (ipc.ok()) {
      ipc_ = *std::move(ipc);
    } else {
      ipc_status_ = ipc.status();
    }
  }
  if (ipc_ == nullptr) return ipc_status_;
  return ipc_.get();
}

absl::StatusOr<v1::RegionSlice> Session::RegionFor(const void* ptr, uint64_t bytes) {
  FP4Q_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock lock(&regions_mu_);
  FP4Q_ASSIGN_OR_RETURN(const CudaIpc* ipc, Ipc());
  FP4Q_ASSIGN_OR_RETURN(CudaIpcExport exported, ipc->Export(ptr));
  if (bytes > exported.allocation_bytes - exported.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes = ", bytes, " at offset ", exported.offset, " overruns the allocation of ",
        exported.allocation_bytes, " bytes"));
  }
  auto it = by_base_.find(exported.base);
  if (it != by_base_.end()) {
    const Registration& reg = it->second;
    if (reg.handle == exported.handle && reg.bytes == exported.allocation_bytes &&
        reg.device_uuid == exported.device_uuid) {
      v1::RegionSlice slice;
      slice.set_region_id(reg.region_id);
      slice.set_offset(exported.offset);
      return slice;
    }
    // The allocation was freed and another made at the same base: the old region maps memory
    // that no longer exists. Drop it (best effort: it may be gone already) and register anew.
    (void)UnregisterCudaRegion(reg.region_id);
    by_base_.erase(it);
  }
  FP4Q_ASSIGN_OR_RETURN(std::string region_id,
                        RegisterCudaRegion(exported.handle, exported.allocation_bytes,
                                           exported.device_uuid));
  Registration reg;
  reg.region_id = region_id;
  reg.handle = exported.handle;
  reg.bytes = exported.allocation_bytes;
  reg.device_uuid = exported.device_uuid;
  by_base_.emplace(exported.base, std::move(reg));
  v1::RegionSlice slice;
  slice.set_region_id(std::move(region_id));
  slice.set_offset(exported.offset);
  return slice;
}

absl::Status Session::ReleaseAllocation(const void* ptr) {
  FP4Q_RETURN_IF_ERROR(CheckOpen());
  absl::MutexLock lock(&regions_mu_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  // The registration whose [base, base + bytes) holds p, found without calling CUDA (the
  // memory may be on its way to being freed).
  auto it = by_base_.upper_bound(p);
  if (it == by_base_.begin()) {
    return absl::NotFoundError(absl::StrCat("no registered allocation holds pointer ",
                                            absl::Hex(p)));
  }
  --it;
  if (p - it->first >= it->second.bytes) {
    return absl::NotFoundError(absl::StrCat("no registered allocation holds pointer ",
                                            absl::Hex(p)));
  }
  const std::string region_id = it->second.region_id;
  by_base_.erase(it);
  return UnregisterCudaRegion(region_id);
}

size_t Session::registered_allocations() const {
  absl::MutexLock lock(&regions_mu_);
  return by_base_.size();
}

}  // namespace fp4q::client
