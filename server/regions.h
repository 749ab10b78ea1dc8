// Sessions and CUDA IPC regions.
//
// Contract
// - OpenSession returns a 128-bit random id (32 hex digits). A session lives while it is renewed
//   (KeepAlive, or any request that uses one of its regions) at least every `lease`; then it
//   ends as if closed. Closing a session unregisters its regions.
// - RegisterRegion opens a cudaIpcMemHandle_t (exactly 64 bytes) on the GPU with the given UUID
//   through the backend. Mappings are cached by (device, handle bytes): a handle registered
//   again (by any session) reuses its mapping; a mapping is closed when its last region is gone.
//   At most `max_open_handles` mappings are open (RESOURCE_EXHAUSTED beyond).
// - A region is visible only to its session: another session's id is NOT_FOUND with exactly the
//   message of an unknown id.
// - Acquire pins a region for one request. Unregister (and session close or expiry) hides the
//   region at once and then waits until no request pins it, so when it returns the server no
//   longer touches that memory.
// - RegionPin::Slice checks offset and size in 64-bit arithmetic without overflow against the
//   region's declared size. The declared size is the client's promise about its allocation; the
//   Backend API cannot query the real size of an IPC mapping.
// Thread-safe.
#ifndef FP4Q_SERVER_REGIONS_H_
#define FP4Q_SERVER_REGIONS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/devices.h"
#include "server/observer.h"
#include "server/requests.h"

namespace fp4q::server {

inline constexpr size_t kIpcHandleBytes = 64;
// Region offsets must be multiples of this (vectorized GPU access).
inline constexpr uint64_t kRegionAlignment = 16;

struct RegionsOptions {
  bool allow_cuda_ipc = false;  // RegisterRegion is FAILED_PRECONDITION unless set
  int max_open_handles = 1024;
  absl::Duration lease = absl::Seconds(30);
  std::function<absl::Time()> now;  // clock (tests); absl::Now when empty
};

class RegionManager;
struct IpcMapping;    // regions.cc
struct RegionRecord;  // regions.cc

// A region pinned for one request. Move-only; unpins on destruction.
class RegionPin {
 public:
  RegionPin() = default;
  RegionPin(RegionPin&& o) noexcept;
  RegionPin& operator=(RegionPin&& o) noexcept;
  ~RegionPin();

  Device* device() const;
  uint64_t size() const;
  // base + offset, after checking that [offset, offset + bytes) lies inside the region and that
  // offset is aligned. INVALID_ARGUMENT names `field` ("input.region", ...).
  absl::StatusOr<uint8_t*> Slice(uint64_t offset, uint64_t bytes, absl::string_view field) const;

 private:
  friend class RegionManager;
  RegionPin(RegionManager* manager, std::shared_ptr<RegionRecord> region);
  void Release();
  RegionManager* manager_ = nullptr;
  std::shared_ptr<RegionRecord> region_;
};

class RegionManager {
 public:
  // `devices` and `observer` (may be null) are not owned and outlive this.
  RegionManager(DeviceSet* devices, RegionsOptions options, EngineObserver* observer);
  ~RegionManager();  // closes every session

  // `ns` is the session's namespace (already checked).
  OpenSessionResult OpenSession(absl::string_view client_name, absl::string_view ns = "");
  // NOT_FOUND for an unknown or expired session.
  absl::Status KeepAlive(absl::string_view session_id);
  // The session's namespace; NOT_FOUND for an unknown or expired session.
  absl::StatusOr<std::string> SessionNamespace(absl::string_view session_id) const;
  // Called (outside the manager's lock) with the id of every session that ends: closed,
  // expired, or at destruction. Set once, before sessions are opened.
  void SetSessionEndHandler(std::function<void(const std::string& session_id)> handler);
  // Number of regions released; NOT_FOUND for an unknown session. Waits for pinned regions.
  absl::StatusOr<uint32_t> CloseSession(absl::string_view session_id);
  // Ends sessions whose lease lapsed (waits for their pinned regions); returns how many.
  int ExpireSessions();

  absl::StatusOr<std::string> Register(absl::string_view session_id,
                                       const RegisterRegionRequest& request);
  // Waits until no request pins the region.
  absl::Status Unregister(absl::string_view session_id, absl::string_view region_id);

  // Pins `region_id` of `session_id` and renews the session. `field` names the request field
  // ("input.region") in errors.
  absl::StatusOr<RegionPin> Acquire(absl::string_view session_id, absl::string_view region_id,
                                    absl::string_view field);

  int64_t sessions() const;
  int64_t regions() const;
  int64_t open_handles() const;
  absl::Duration lease() const { return options_.lease; }

 private:
  friend class RegionPin;
  struct Session {
    std::string client_name;
    std::string ns;
    absl::Time renewed;
    std::set<std::string> regions;
  };

  absl::Time Now() const;
  // Removes the region from every index (mu_ held), marks it gone.
  std::shared_ptr<RegionRecord> DetachLocked(const std::string& region_id);
  // Waits until nobody pins `region` then drops its mapping reference (mu_ not held).
  void WaitAndRelease(const std::shared_ptr<RegionRecord>& region);
  void Unpin(RegionRecord* region);
  void ReportLocked();
  // The mapping of the same handle bytes opened for another device, if any (mu_ held).
  const IpcMapping* OpenOnOtherDevice(absl::string_view handle, const Device* device) const;
  // A session id: 128 random bits in hex (it stands for the caller).
  static std::string RandomHex128();
  // A region id unused by any session (mu_ held): 90 random bits in 15 URL-safe characters.
  // Only its session may use it (Acquire), so it needs no more bits; at 15 characters every
  // copy of it (each item of a step names its regions) fits std::string's inline buffer.
  std::string NewRegionIdLocked() const;

  DeviceSet* const devices_;
  const RegionsOptions options_;
  std::function<void(const std::string&)> on_session_end_;
  EngineObserver* const observer_;

  std::mutex open_mu_;  // serializes Register (handle opens happen outside mu_)
  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  std::map<std::string, Session, std::less<>> sessions_;
  std::map<std::string, std::shared_ptr<RegionRecord>, std::less<>> regions_;
  std::map<std::string, std::shared_ptr<IpcMapping>, std::less<>> mappings_;  // key: uuid + handle
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_REGIONS_H_
