// A client session: the owner of CUDA IPC regions on the server (docs/DESIGN.md "Sessions and
// regions").
//
// Contract
// - Open calls OpenSession. A background thread calls KeepAlive every
//   SessionOptions::keep_alive_interval (default: a third of the server's lease), so a session
//   stays alive while this object lives even when no request uses it; requests made with
//   call_options() renew the lease too.
// - Close() (and the destructor, best effort, with a short deadline) stops the thread and
//   calls CloseSession; the server then unregisters every region of the session. After Close()
//   every method returns FAILED_PRECONDITION "session ... is closed".
// - A keep-alive failure does not end the object: keep_alive_status() reports the last error
//   (NOT_FOUND when the server no longer knows the session, e.g. after its lease lapsed or the
//   server restarted); regions registered under it are gone then and calls naming them fail
//   with NOT_FOUND. Open a new session to recover.
// - RegionFor(ptr, bytes) exports ptr's allocation through CUDA IPC (cuda_ipc.h) and registers
//   it once per allocation: later pointers into the same allocation reuse the region. The
//   cache notices an allocation freed and replaced by a new one at the same base (its IPC
//   handle differs) and registers the new one (unregistering the stale region). Call
//   ReleaseAllocation(ptr) before freeing memory that was registered, so the server drops its
//   mapping at once rather than at session end.
// - Thread safety: every method may be called from any thread. Registrations are serialised.
// - Lifetime: the Client must outlive the Session.
#ifndef FP4Q_CLIENT_SESSION_H_
#define FP4Q_CLIENT_SESSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fp4q/client/client.h"
#include "fp4q/client/cuda_ipc.h"

namespace fp4q::client {

struct SessionOptions {
  std::string client_name;  // free text for the server's logs
  // Zero: a third of the lease the server grants (at least 1 s).
  // InfiniteDuration(): no keep-alive thread (renew by using the session, or not at all).
  absl::Duration keep_alive_interval = absl::ZeroDuration();
  // CUDA runtime libraries to try (empty: CudaIpc::DefaultRuntimeLibraries()).
  std::vector<std::string> cuda_runtime_candidates;
};

class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Open(const Client& client,
                                                       const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  uint32_t lease_seconds() const { return lease_seconds_; }

  // CallOptions carrying this session's id (and `deadline`; zero = the client's default).
  CallOptions call_options(absl::Duration deadline = absl::ZeroDuration()) const;

  // OK, or the last keep-alive error (see the contract).
  absl::Status keep_alive_status() const;
  // One KeepAlive now; returns the lease the server granted.
  absl::StatusOr<uint32_t> KeepAlive();

  // Ends the session (idempotent: a second call returns OK). Returns the server's count of
  // regions it released.
  absl::StatusOr<uint32_t> Close();

  // ---- Regions.
  // Registers a raw IPC handle (bytes of cudaIpcMemHandle_t) of `size` bytes on `device_uuid`.
  absl::StatusOr<std::string> RegisterCudaRegion(const std::string& ipc_handle, uint64_t size,
                                                 const std::string& device_uuid);
  absl::Status UnregisterCudaRegion(const std::string& region_id);

  // The region slice for `bytes` bytes at device pointer `ptr`, registering its allocation on
  // first use (see the contract). INVALID_ARGUMENT when [ptr, ptr + bytes) overruns the
  // allocation; CudaIpc's errors (FAILED_PRECONDITION without CUDA) otherwise.
  absl::StatusOr<v1::RegionSlice> RegionFor(const void* ptr, uint64_t bytes);
  // Unregisters the region of ptr's allocation, if registered (NOT_FOUND otherwise).
  absl::Status ReleaseAllocation(const void* ptr);
  // Number of allocations registered by RegionFor and not released.
  size_t registered_allocations() const;

 private:
  struct Registration {
    std::string region_id;
    std::string handle;
    uint64_t bytes = 0;
    std::string device_uuid;
  };

  Session(const Client& client, std::string id, uint32_t lease_seconds,
          const SessionOptions& options);
  absl::Status CheckOpen() const;
  absl::StatusOr<const CudaIpc*> Ipc() ABSL_EXCLUSIVE_LOCKS_REQUIRED(regions_mu_);
  void KeepAliveLoop(absl::Duration interval);
  void StopKeepAlive();

  const Client& client_;
  const std::string id_;
  const uint32_t lease_seconds_;
  const SessionOptions options_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status keep_alive_status_ ABSL_GUARDED_BY(mu_);
  std::thread keep_alive_;

  // Held across a registration's RPC; taken before mu_ when both are held.
  mutable absl::Mutex regions_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<CudaIpc> ipc_ ABSL_GUARDED_BY(regions_mu_);
  absl::Status ipc_status_ ABSL_GUARDED_BY(regions_mu_);
  bool ipc_tried_ ABSL_GUARDED_BY(regions_mu_) = false;
  std::map<uintptr_t, Registration> by_base_ ABSL_GUARDED_BY(regions_mu_);
};

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_SESSION_H_
