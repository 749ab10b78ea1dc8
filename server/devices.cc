#include "server/devices.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::server {

DeviceSet::~DeviceSet() {
  devices_.clear();  // Backends first: their code lives in the module.
  module_.reset();
}

std::unique_ptr<DeviceSet> DeviceSet::CreateCpu() {
  std::unique_ptr<DeviceSet> set(new DeviceSet());
  auto device = std::make_unique<Device>();
  device->index = 0;
  device->backend = kernels::CreateCpuBackend();
  device->info = device->backend->Info();
  device->label = "cpu";
  device->host_memory = true;
  set->devices_.push_back(std::move(device));
  set->kind_ = "cpu";
  return set;
}

absl::StatusOr<std::unique_ptr<DeviceSet>> DeviceSet::CreateCuda(const DeviceSetOptions& options) {
  std::unique_ptr<DeviceSet> set(new DeviceSet());
  FP4Q_ASSIGN_OR_RETURN(set->module_, kernels::CudaModule::Load(options.cuda_module));
  FP4Q_ASSIGN_OR_RETURN(int count, set->module_->DeviceCount());
  if (count < 1) return absl::UnavailableError("CUDA: no visible devices");
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    auto device = std::make_unique<Device>();
    device->index = ordinal;
    FP4Q_ASSIGN_OR_RETURN(device->backend, set->module_->CreateBackend(ordinal, options.cuda));
    device->info = device->backend->Info();
    device->label = device->info.uuid;
    if (device->label.empty()) {
      return absl::InternalError(absl::StrCat("CUDA device ", ordinal, " reports no UUID"));
    }
    device->host_memory = false;
    set->devices_.push_back(std::move(device));
  }
  set->kind_ = "cuda";
  return set;
}

absl::StatusOr<std::unique_ptr<DeviceSet>> DeviceSet::Create(const DeviceSetOptions& options) {
  if (options.backend == "cpu") return CreateCpu();
  if (options.backend == "cuda") return CreateCuda(options);
  if (options.backend != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend: '", options.backend, "' is not one of auto, cpu, cuda"));
  }
  absl::StatusOr<std::unique_ptr<DeviceSet>> cuda = CreateCuda(options);
  if (cuda.ok()) return cuda;
  std::unique_ptr<DeviceSet> cpu = CreateCpu();
  cpu->fallback_reason_ = cuda.status().ToString();
  return cpu;
}

std::unique_ptr<DeviceSet> DeviceSet::FromBackends(
    std::vector<std::unique_ptr<kernels::Backend>> backends, bool host_memory) {
  std::unique_ptr<DeviceSet> set(new DeviceSet());
  for (auto& backend : backends) {
    auto device = std::make_unique<Device>();
    device->index = static_cast<int>(set->devices_.size());
    device->info = backend->Info();
    device->backend = std::move(backend);
    device->label = device->info.uuid.empty() ? device->info.backend : device->info.uuid;
    device->host_memory = host_memory;
    set->devices_.push_back(std::move(device));
  }
  set->kind_ = set->devices_.empty() ? "cpu" : set->devices_[0]->info.backend;
  return set;
}

Device* DeviceSet::FindByUuid(absl::string_view uuid) {
  for (auto& d : devices_) {
    if (d->label == uuid) return d.get();
  }
  return nullptr;
}

}  // namespace fp4q::server
