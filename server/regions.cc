#include "server/regions.h"

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/request_checks.h"

namespace fp4q::server {

struct IpcMapping {
  Device* device = nullptr;
  std::string key;
  void* base = nullptr;
  // Bytes of the client's allocation behind `base` (Backend::IpcMappingSize); 0 when the
  // backend cannot tell, and then a region's declared size is trusted.
  uint64_t allocation_bytes = 0;
  int regions = 0;  // registered regions using this mapping
};

struct RegionRecord {
  std::string id;
  std::string session;
  std::shared_ptr<IpcMapping> mapping;
  uint64_t size = 0;
  int pins = 0;       // requests using it now
  bool gone = false;  // unregistered; waiting for pins to drop
};

namespace {

// Client-given ids are echoed only in a bounded, escaped form.
std::string Quoted(absl::string_view id) {
  if (id.size() > 64) return absl::StrCat("'", absl::CEscape(id.substr(0, 64)), "...'");
  return absl::StrCat("'", absl::CEscape(id), "'");
}

absl::Status UnknownSession() {
  return absl::NotFoundError(
      "session: unknown or expired session (send OpenSession's id as metadata 'fp4q-session')");
}

}  // namespace

// ---------------------------------------------------------------- RegionPin

RegionPin::RegionPin(RegionManager* manager, std::shared_ptr<RegionRecord> region)
    : manager_(manager), region_(std::move(region)) {}

RegionPin::RegionPin(RegionPin&& o) noexcept { *this = std::move(o); }

RegionPin& RegionPin::operator=(RegionPin&& o) noexcept {
  if (this != &o) {
    Release();
    manager_ = std::exchange(o.manager_, nullptr);
    region_ = std::move(o.region_);
  }
  return *this;
}

RegionPin::~RegionPin() { Release(); }

void RegionPin::Release() {
  if (region_ != nullptr) manager_->Unpin(region_.get());
  region_.reset();
  manager_ = nullptr;
}

Device* RegionPin::device() const { return region_->mapping->device; }
uint64_t RegionPin::size() const { return region_->size; }

absl::StatusOr<uint8_t*> RegionPin::Slice(uint64_t offset, uint64_t bytes,
                                          absl::string_view field) const {
  if (offset % kRegionAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".offset: ", offset, " is not a multiple of ", kRegionAlignment));
  }
  // offset + bytes <= size, without computing a sum that can wrap.
  if (offset > region_->size || bytes > region_->size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".offset: ", offset, " + ", bytes,
                                                   " bytes is past the end of the region (",
                                                   region_->size, " bytes)"));
  }
  return static_cast<uint8_t*>(region_->mapping->base) + offset;
}

// ---------------------------------------------------------------- RegionManager

RegionManager::RegionManager(DeviceSet* devices, RegionsOptions options, EngineObserver* observer)
    : devices_(devices), options_(std::move(options)), observer_(observer) {
  std::lock_guard<std::mutex> lock(mu_);
  ReportLocked();
}

RegionManager::~RegionManager() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : sessions_) ids.push_back(id);
  }
  for (const auto& id : ids) CloseSession(id).IgnoreError();
}

absl::Time RegionManager::Now() const { return options_.now ? options_.now() : absl::Now(); }

std::string RegionManager::RandomHex128() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&out, "%08x", rd());
  return out;
}

std::string RegionManager::NewRegionIdLocked() const {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::random_device rd;
  std::string id;
  do {
    id.clear();
    uint64_t bits = (static_cast<uint64_t>(rd()) << 32) | rd();
    uint32_t more = rd();
    for (int i = 0; i < 15; ++i) {
      if (i == 10) bits = more;  // 10 x 6 bits from the first 64, 5 x 6 from the next 32
      id.push_back(kAlphabet[bits & 63]);
      bits >>= 6;
    }
  } while (regions_.count(id) != 0);
  return id;
}

void RegionManager::ReportLocked() {
  if (observer_ == nullptr) return;
  observer_->Sessions(static_cast<int64_t>(sessions_.size()));
  observer_->CudaRegions(static_cast<int64_t>(regions_.size()));
  observer_->CudaOpenHandles(static_cast<int64_t>(mappings_.size()));
}

OpenSessionResult RegionManager::OpenSession(absl::string_view client_name,
                                             absl::string_view ns) {
  std::string id = RandomHex128();
  std::lock_guard<std::mutex> lock(mu_);
  Session& s = sessions_[id];
  s.client_name = std::string(client_name.substr(0, 256));
  s.ns = std::string(ns);
  s.renewed = Now();
  ReportLocked();
  return OpenSessionResult{id, static_cast<uint32_t>(absl::ToInt64Seconds(options_.lease)),
                           std::string(ns)};
}

absl::StatusOr<std::string> RegionManager::SessionNamespace(absl::string_view session_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || Now() - it->second.renewed > options_.lease) {
    return UnknownSession();
  }
  return it->second.ns;
}

void RegionManager::SetSessionEndHandler(std::function<void(const std::string&)> handler) {
  on_session_end_ = std::move(handler);
}

absl::Status RegionManager::KeepAlive(absl::string_view session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || Now() - it->second.renewed > options_.lease) {
    return UnknownSession();
  }
  it->second.renewed = Now();
  return absl::OkStatus();
}

std::shared_ptr<RegionRecord> RegionManager::DetachLocked(const std::string& region_id) {
  auto it = regions_.find(region_id);
  if (it == regions_.end()) return nullptr;
  std::shared_ptr<RegionRecord> region = it->second;
  regions_.erase(it);
  auto s = sessions_.find(region->session);
  if (s != sessions_.end()) s->second.regions.erase(region_id);
  region->gone = true;
  return region;
}

void RegionManager::WaitAndRelease(const std::shared_ptr<RegionRecord>& region) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    unpinned_.wait(lock, [&] { return region->pins == 0; });
  }
  std::shared_ptr<IpcMapping> to_close;
  std::lock_guard<std::mutex> open_lock(open_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--region->mapping->regions == 0) {
      to_close = region->mapping;
      mappings_.erase(to_close->key);
    }
    ReportLocked();
  }
  if (to_close != nullptr) {
    to_close->device->backend->CloseIpcHandle(to_close->base).IgnoreError();
  }
}

void RegionManager::Unpin(RegionRecord* region) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--region->pins == 0 && region->gone) unpinned_.notify_all();
}

absl::StatusOr<uint32_t> RegionManager::CloseSession(absl::string_view session_id) {
  std::vector<std::shared_ptr<RegionRecord>> detached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return UnknownSession();
    std::vector<std::string> ids(it->second.regions.begin(), it->second.regions.end());
    for (const auto& id : ids) detached.push_back(DetachLocked(id));
    sessions_.erase(it);
    ReportLocked();
  }
  for (const auto& r : detached) WaitAndRelease(r);
  if (on_session_end_) on_session_end_(std::string(session_id));
  return static_cast<uint32_t>(detached.size());
}

int RegionManager::ExpireSessions() {
  std::vector<std::shared_ptr<RegionRecord>> detached;
  std::vector<std::string> ended_ids;
  int ended = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = Now();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (now - it->second.renewed <= options_.lease) {
        ++it;
        continue;
      }
      std::vector<std::string> ids(it->second.regions.begin(), it->second.regions.end());
      for (const auto& id : ids) detached.push_back(DetachLocked(id));
      ended_ids.push_back(it->first);
      it = sessions_.erase(it);
      ++ended;
    }
    if (ended > 0) ReportLocked();
  }
  for (const auto& r : detached) WaitAndRelease(r);
  if (on_session_end_) {
    for (const std::string& id : ended_ids) on_session_end_(id);
  }
  return ended;
}

const IpcMapping* RegionManager::OpenOnOtherDevice(absl::string_view handle,
                                                   const Device* device) const {
  for (const auto& [key, mapping] : mappings_) {
    if (mapping->device != device &&
        absl::string_view(key).substr(mapping->device->label.size() + 1) == handle) {
      return mapping.get();
    }
  }
  return nullptr;
}

absl::StatusOr<std::string> RegionManager::Register(absl::string_view session_id,
                                                    const RegisterRegionRequest& request) {
  // Fields first, then whether this server accepts client memory at all.
  if (request.ipc_handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ipc_handle: ", request.ipc_handle.size(),
                                                   " bytes, expected ", kIpcHandleBytes,
                                                   " (a cudaIpcMemHandle_t)"));
  }
  if (request.size == 0) return absl::InvalidArgumentError("size: 0, must be > 0");
  Device* device = nullptr;
  if (request.device_uuid.empty()) {
    if (devices_->size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("device_uuid: empty, but this server serves ",
                                                     devices_->size(), " devices"));
    }
    device = &devices_->device(0);
  } else {
    device = devices_->FindByUuid(request.device_uuid);
    if (device == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("device_uuid: ", Quoted(request.device_uuid),
                                                     " is not a device this server serves"));
    }
  }
  if (!options_.allow_cuda_ipc) {
    return absl::FailedPreconditionError(
        "RegisterCudaRegion: client shared memory is disabled on this server "
        "(start fp4qd with --allow_cuda_ipc)");
  }

  std::lock_guard<std::mutex> open_lock(open_mu_);
  const std::string key = absl::StrCat(device->label, "/", request.ipc_handle);
  std::shared_ptr<IpcMapping> mapping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = sessions_.find(session_id);
    if (s == sessions_.end() || Now() - s->second.renewed > options_.lease) {
      return UnknownSession();
    }
    s->second.renewed = Now();
    auto m = mappings_.find(key);
    if (m != mappings_.end()) {
      mapping = m->second;
    } else if (const IpcMapping* other = OpenOnOtherDevice(request.ipc_handle, device)) {
      // The same allocation registered for two GPUs: it lives on the one it was first opened
      // on (the CUDA runtime reports the opening GPU for a peer mapping, so this is the check
      // that holds).
      return absl::InvalidArgumentError(absl::StrCat(
          "ipc_handle: already registered on ", other->device->label, "; the allocation lives "
          "there, not on ", device->label, " (device_uuid: ", Quoted(device->label), ")"));
    } else if (mappings_.size() >= static_cast<size_t>(options_.max_open_handles)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("ipc_handle: the server holds ", mappings_.size(),
                       " open IPC handles, its cap (--max_open_handles)"));
    }
  }
  bool opened = false;
  if (mapping == nullptr) {
    absl::StatusOr<void*> base = device->backend->OpenIpcHandle(request.ipc_handle);
    if (!base.ok()) {
      const absl::Status& s = base.status();  // messages name ipc_handle (backend.h)
      if (s.code() != absl::StatusCode::kInvalidArgument) return s;
      return absl::InvalidArgumentError(
          absl::StrCat(s.message(), " (device_uuid: ", Quoted(device->label), ")"));
    }
    if (observer_ != nullptr) observer_->CudaHandleOpened();
    mapping = std::make_shared<IpcMapping>();
    mapping->device = device;
    mapping->key = key;
    mapping->base = *base;
    opened = true;
    absl::StatusOr<size_t> bytes = device->backend->IpcMappingSize(*base);
    if (bytes.ok()) {
      mapping->allocation_bytes = *bytes;
    } else if (bytes.status().code() != absl::StatusCode::kUnimplemented) {
      device->backend->CloseIpcHandle(*base).IgnoreError();
      return bytes.status();
    }
  }
  // A region may not reach past the allocation it was exported from: the server would read or
  // write another allocation or fault (a sticky error that takes the device down).
  if (mapping->allocation_bytes != 0 && request.size > mapping->allocation_bytes) {
    if (opened) device->backend->CloseIpcHandle(mapping->base).IgnoreError();
    return absl::InvalidArgumentError(
        absl::StrCat("size: ", request.size, " bytes is larger than the allocation behind ",
                     "ipc_handle (", mapping->allocation_bytes, " bytes)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto s = sessions_.find(session_id);
  if (s == sessions_.end()) {  // closed while the handle was being opened
    if (opened) device->backend->CloseIpcHandle(mapping->base).IgnoreError();
    return UnknownSession();
  }
  if (opened) mappings_[key] = mapping;
  auto region = std::make_shared<RegionRecord>();
  region->id = NewRegionIdLocked();
  region->session = std::string(session_id);
  region->mapping = mapping;
  region->size = request.size;
  ++mapping->regions;
  regions_[region->id] = region;
  s->second.regions.insert(region->id);
  ReportLocked();
  return region->id;
}

absl::Status RegionManager::Unregister(absl::string_view session_id, absl::string_view region_id) {
  std::shared_ptr<RegionRecord> region;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(region_id);
    if (it == regions_.end() || it->second->session != session_id) {
      return absl::NotFoundError(
          absl::StrCat("region_id: no region ", Quoted(region_id), " in this session"));
    }
    region = DetachLocked(it->second->id);
    ReportLocked();
  }
  WaitAndRelease(region);
  return absl::OkStatus();
}

absl::StatusOr<RegionPin> RegionManager::Acquire(absl::string_view session_id,
                                                 absl::string_view region_id,
                                                 absl::string_view field) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(region_id);
  // Unknown id, another session's id, or an expired session: one message for all.
  if (it == regions_.end() || session_id.empty() || it->second->session != session_id) {
    return absl::NotFoundError(
        absl::StrCat(field, ".region_id: no region ", Quoted(region_id), " in this session",
                     session_id.empty() ? " (no 'fp4q-session' metadata was sent)" : ""));
  }
  auto s = sessions_.find(session_id);
  if (s == sessions_.end() || Now() - s->second.renewed > options_.lease) {
    return absl::NotFoundError(
        absl::StrCat(field, ".region_id: no region ", Quoted(region_id), " in this session"));
  }
  s->second.renewed = Now();
  ++it->second->pins;
  return RegionPin(this, it->second);
}

int64_t RegionManager::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}
int64_t RegionManager::regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(regions_.size());
}
int64_t RegionManager::open_handles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(mappings_.size());
}

}  // namespace fp4q::server
