// Loader of the CUDA backend module; see cuda_module.h.
#include "fp4q/kernels/cuda_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp4q::kernels {
namespace {

constexpr char kModuleName[] = "libfp4q_cuda.so";

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Directory of the running executable, or "" when /proc/self/exe cannot be read.
std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModule>> CudaModule::Load(const std::string& path) {
  // The candidates in search order; `explicit_path` ones must exist.
  struct Candidate {
    std::string path;
    bool file;  // a file path (checked for existence) rather than a bare soname
    std::string origin;
  };
  std::vector<Candidate> candidates;
  if (!path.empty()) {
    candidates.push_back({path, true, "the given path"});
  } else {
    const std::string dir = ExecutableDir();
    if (!dir.empty()) {
      candidates.push_back(
          {absl::StrCat(dir, "/", kModuleName), true, "the executable's directory"});
      candidates.push_back({absl::StrCat(dir, "/../lib/", kModuleName), true, "../lib"});
    }
    candidates.push_back({kModuleName, false, "the dynamic linker's path"});
  }

  std::vector<std::string> tried;
  for (const Candidate& c : candidates) {
    if (c.file && !FileExists(c.path)) {
      tried.push_back(c.path);
      continue;
    }
    dlerror();
    void* handle = dlopen(c.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const std::string err = DlError();
      if (!c.file) {  // not on the linker's path: fall through to NOT_FOUND
        tried.push_back(absl::StrCat(c.path, " (", err, ")"));
        continue;
      }
      return absl::FailedPreconditionError(
          absl::StrCat("cuda module ", c.path, " (", c.origin, ") cannot be loaded: ", err));
    }
    auto module = std::unique_ptr<CudaModule>(new CudaModule());
    module->handle_ = handle;
    module->path_ = c.path;
    const auto abi =
        reinterpret_cast<decltype(&fp4q_cuda_abi_version)>(dlsym(handle, "fp4q_cuda_abi_version"));
    module->device_count_ = reinterpret_cast<decltype(&fp4q_cuda_device_count)>(
        dlsym(handle, "fp4q_cuda_device_count"));
    module->create_backend_ = reinterpret_cast<decltype(&fp4q_cuda_create_backend)>(
        dlsym(handle, "fp4q_cuda_create_backend"));
    if (abi == nullptr || module->device_count_ == nullptr || module->create_backend_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda module ", c.path,
                       " lacks the fp4q_cuda_* C ABI (fp4q_cuda_abi_version, "
                       "fp4q_cuda_device_count, fp4q_cuda_create_backend)"));
    }
    const int version = abi();
    if (version != FP4Q_CUDA_ABI_VERSION) {
      return absl::FailedPreconditionError(absl::StrCat("cuda module ", c.path, " has ABI version ",
                                                        version, ", this build needs ",
                                                        FP4Q_CUDA_ABI_VERSION));
    }
    return module;
  }
  return absl::NotFoundError(
      absl::StrCat("cuda module ", kModuleName, " not found; tried: ", absl::StrJoin(tried, ", ")));
}

CudaModule::~CudaModule() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<int> CudaModule::DeviceCount() const {
  char err[512] = {0};
  const int n = device_count_(err, sizeof(err));
  if (n < 0) {
    err[sizeof(err) - 1] = '\0';
    return absl::UnavailableError(
        absl::StrCat("cuda module ", path_, ": no usable CUDA devices: ", err));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> CudaModule::CreateBackend(
    int ordinal, const CudaBackendOptions& options) const {
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  if (ordinal < 0 || ordinal >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("ordinal: ", ordinal, " is not in [0, ", *count, ")"));
  }
  const fp4q_cuda_options abi_options{options.rows_only ? 1 : 0, options.bf16_block_ctas,
                                      options.step_prefetch_slots};
  char err[512] = {0};
  Backend* backend = create_backend_(ordinal, &abi_options, err, sizeof(err));
  if (backend == nullptr) {
    err[sizeof(err) - 1] = '\0';
    return absl::UnavailableError(absl::StrCat(
        "cuda module ", path_, ": cannot create a backend on device ", ordinal, ": ", err));
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace fp4q::kernels
