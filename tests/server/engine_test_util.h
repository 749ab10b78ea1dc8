// Helpers for the engine unit tests: a fake "IPC" backend over host memory, synchronous calls of
// the engine's asynchronous API, and test tensors.
#ifndef FP4Q_TESTS_SERVER_ENGINE_TEST_UTIL_H_
#define FP4Q_TESTS_SERVER_ENGINE_TEST_UTIL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"
#include "server/engine.h"

namespace fp4q::server::testing {

// The CPU backend, plus CUDA-IPC-like handles over host memory: Export(ptr) gives a 64-byte
// handle that OpenIpcHandle maps back to ptr. Counts opens and closes. Reports itself as a GPU
// with UUID `uuid` so that tests exercise the region paths of the engine on this machine.
class FakeIpcBackend final : public kernels::Backend {
 public:
  explicit FakeIpcBackend(std::string uuid = "GPU-fake-0")
      : cpu_(kernels::CreateCpuBackend()), uuid_(std::move(uuid)) {}

  // `bytes`: the size of the exported allocation, which IpcMappingSize then reports; 0 leaves
  // it unknown (UNIMPLEMENTED, as on a backend that cannot tell).
  std::string Export(void* base, size_t bytes = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string handle(64, '\0');
    const uint64_t id = ++next_id_;
    std::memcpy(handle.data(), "FAKEIPC:", 8);
    std::memcpy(handle.data() + 8, &id, 8);
    exported_[handle] = base;
    if (bytes != 0) sizes_[base] = bytes;
    return handle;
  }
  int opens() const { return opens_.load(); }
  // From now on Healthy() reports a sticky device error.
  void Poison() { poisoned_.store(true); }
  int closes() const { return closes_.load(); }

  kernels::DeviceInfo Info() const override {
    kernels::DeviceInfo i = cpu_->Info();
    i.backend = "cuda";
    i.ordinal = 0;
    i.uuid = uuid_;
    i.name = "fake IPC device over host memory";
    return i;
  }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  void Free(void* p) override { cpu_->Free(p); }
  absl::Status CopyFromHost(void* d, const void* s, size_t n, kernels::Stream st) override {
    return Run(st, [=] { return cpu_->CopyFromHost(d, s, n, st); });
  }
  absl::Status CopyToHost(void* d, const void* s, size_t n, kernels::Stream st) override {
    return Run(st, [=] { return cpu_->CopyToHost(d, s, n, st); });
  }
  absl::Status CopyDeviceToDevice(void* d, const void* s, size_t n, kernels::Stream st) override {
    return Run(st, [=] { return cpu_->CopyDeviceToDevice(d, s, n, st); });
  }
  absl::Status Memset(void* d, int v, size_t n, kernels::Stream st) override {
    return Run(st, [=] { return cpu_->Memset(d, v, n, st); });
  }
  absl::Status Synchronize(kernels::Stream st) override {
    FP4Q_RETURN_IF_ERROR(Drain(st, /*block=*/true));
    return cpu_->Synchronize(st);
  }

  // Device-side signals, emulated: work queued on a stream behind a WaitValue32 whose word does
  // not hold its value yet is deferred, and runs in order once it does (when the stream is
  // synchronized or its report read, polling, or when WriteValue32Now writes a word). Off until
  // called; counts the waits queued.
  void EmulateDeviceSignals() { signals_.store(true); }
  int device_waits() const { return waits_.load(); }
  bool DeviceSignals() const override { return signals_.load(); }
  absl::Status WaitValue32(const void* at, uint32_t value, kernels::Stream st) override {
    if (!signals_.load()) return kernels::Backend::WaitValue32(at, value, st);
    ++waits_;
    std::lock_guard<std::mutex> lock(q_mu_);
    queues_[st].push_back(Op{static_cast<const uint32_t*>(at), value, nullptr});
    return absl::OkStatus();
  }
  absl::Status WriteValue32(void* at, uint32_t value, kernels::Stream st) override {
    if (!signals_.load()) return kernels::Backend::WriteValue32(at, value, st);
    return Run(st, [at, value] {
      __atomic_store_n(static_cast<uint32_t*>(at), value, __ATOMIC_RELEASE);
      return absl::OkStatus();
    });
  }
  absl::StatusOr<uint32_t> ReadValue32Now(const void* at) override {
    if (!signals_.load()) return kernels::Backend::ReadValue32Now(at);
    return __atomic_load_n(static_cast<const uint32_t*>(at), __ATOMIC_ACQUIRE);
  }
  absl::Status WriteValue32Now(void* at, uint32_t value) override {
    if (!signals_.load()) return kernels::Backend::WriteValue32Now(at, value);
    __atomic_store_n(static_cast<uint32_t*>(at), value, __ATOMIC_RELEASE);
    std::vector<kernels::Stream> streams;
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      for (const auto& [st, q] : queues_) streams.push_back(st);
    }
    for (kernels::Stream st : streams) FP4Q_RETURN_IF_ERROR(Drain(st, /*block=*/false));
    return absl::OkStatus();
  }
  absl::Status Healthy() const override {
    if (poisoned_.load()) return absl::InternalError("an illegal memory access was encountered");
    return cpu_->Healthy();
  }
  absl::StatusOr<void*> OpenIpcHandle(const std::string& handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exported_.find(handle);
    if (it == exported_.end()) return absl::InvalidArgumentError("ipc_handle: not exported");
    ++opens_;
    return it->second;
  }
  absl::StatusOr<size_t> IpcMappingSize(void* base) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(base);
    if (it == sizes_.end()) return kernels::Backend::IpcMappingSize(base);
    return it->second;
  }
  absl::Status CloseIpcHandle(void*) override {
    ++closes_;
    return absl::OkStatus();
  }

 protected:
  absl::Status DoAmax(const kernels::ConstTensor& x, float* amax, int64_t* first_nonfinite,
                      kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Amax(x, amax, s, first_nonfinite); });
  }
  absl::Status DoQuantize(const kernels::ConstTensor& x, const kernels::QuantizeOptions& o,
                          float* r, const kernels::QuantizedTensor* rw,
                          const kernels::QuantizedTensor* cw, kernels::FiniteGuard* guard,
                          kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Quantize(x, o, r, rw, cw, s, guard); });
  }
  absl::Status DoDequantize(const kernels::ConstQuantizedTensor& q, const kernels::MutTensor& out,
                            kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Dequantize(q, out, s); });
  }
  absl::Status DoQdq(const kernels::ConstTensor& x, const kernels::QuantizeOptions& o, float* r,
                     const kernels::MutTensor& out, kernels::FiniteGuard* guard,
                     kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Qdq(x, o, r, out, s, guard); });
  }
  absl::Status DoMatmul(const kernels::ConstQuantizedTensor& a,
                        const kernels::ConstQuantizedTensor& b, const kernels::MutTensor& c,
                        kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Matmul(a, b, c, s); });
  }
  absl::Status DoStepCheck(const std::vector<kernels::StepItem>& items, void* ws,
                           kernels::Stream s, const kernels::StepCancel& cancel) override {
    return Run(s, [=] {
      return cpu_->StepCheck(items, ws, kernels::StepWorkspaceBytes(items), s, cancel);
    });
  }
  absl::Status DoStepApply(const std::vector<kernels::StepItem>& items, void* ws,
                           kernels::Stream s) override {
    return Run(s, [=] { return cpu_->StepApply(items, ws, s); });
  }
  absl::Status DoStepCheckAndApply(const std::vector<kernels::StepItem>& items, void* ws,
                                   kernels::Stream s, const kernels::StepCancel& cancel) override {
    return Run(s, [=] {
      absl::StatusOr<kernels::ValidatedStep> step = kernels::ValidatedStep::Check(items);
      if (!step.ok()) return step.status();
      return cpu_->StepCheckAndApply(*step, ws, kernels::StepWorkspaceBytes(items), s, cancel);
    });
  }
  absl::Status DoStepReadReport(const std::vector<kernels::StepItem>& items, const void* ws,
                                kernels::StepReport* report, kernels::Stream s) override {
    FP4Q_RETURN_IF_ERROR(Drain(s, /*block=*/true));
    return cpu_->StepReadReport(items, ws, report, s);
  }
  absl::Status DoRht(const kernels::ConstTensor& in, kernels::RhtMode m, uint64_t seed, bool inv,
                     const kernels::MutTensor& out, kernels::Stream s) override {
    return Run(s, [=] { return cpu_->Rht(in, m, seed, inv, out, s); });
  }

 private:
  std::unique_ptr<kernels::Backend> cpu_;
  std::string uuid_;
  mutable std::mutex mu_;
  uint64_t next_id_ = 0;
  std::map<std::string, void*> exported_;
  std::map<void*, size_t> sizes_;
  std::atomic<int> opens_{0};
  std::atomic<int> closes_{0};
  std::atomic<bool> poisoned_{false};

  // A stream's deferred work: a wait (`at` non-null) or a call.
  struct Op {
    const uint32_t* at = nullptr;
    uint32_t value = 0;
    std::function<absl::Status()> call;
  };
  // Runs `call` now, or after the stream's deferred work when it has any.
  absl::Status Run(kernels::Stream st, std::function<absl::Status()> call) {
    {
      std::lock_guard<std::mutex> lock(q_mu_);
      auto it = queues_.find(st);
      if (it != queues_.end() && !it->second.empty()) {
        it->second.push_back(Op{nullptr, 0, std::move(call)});
        return absl::OkStatus();
      }
    }
    return call();
  }
  // Runs the stream's deferred work up to a wait whose word does not hold its value yet; with
  // `block`, polls until none is left (at most 20 s) and returns the first error of the deferred
  // calls.
  absl::Status Drain(kernels::Stream st, bool block) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      Op op;
      {
        std::lock_guard<std::mutex> lock(q_mu_);
        std::deque<Op>& q = queues_[st];
        if (q.empty()) {
          if (!block) return absl::OkStatus();
          absl::Status e = std::move(errors_[st]);
          errors_.erase(st);
          return e;
        }
        if (q.front().at != nullptr) {
          const uint32_t v = __atomic_load_n(q.front().at, __ATOMIC_ACQUIRE);
          if (static_cast<int32_t>(v - q.front().value) >= 0) {
            q.pop_front();
            continue;
          }
          if (!block) return absl::OkStatus();
          if (std::chrono::steady_clock::now() > until) {
            return absl::DeadlineExceededError("fake stream: still waiting on a word");
          }
        } else {
          op = std::move(q.front());
          q.pop_front();
        }
      }
      if (op.call == nullptr) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      absl::Status r = op.call();
      if (!r.ok()) {
        std::lock_guard<std::mutex> lock(q_mu_);
        if (errors_[st].ok()) errors_[st] = r;
      }
    }
  }
  std::atomic<bool> signals_{false};
  std::atomic<int> waits_{0};
  std::mutex q_mu_;
  std::map<kernels::Stream, std::deque<Op>> queues_;
  std::map<kernels::Stream, absl::Status> errors_;
};

// An engine on one CPU backend with options `o`.
inline absl::StatusOr<std::unique_ptr<Engine>> CpuEngine(const EngineOptions& o) {
  std::vector<std::unique_ptr<kernels::Backend>> b;
  b.push_back(kernels::CreateCpuBackend());
  return Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, nullptr, nullptr);
}

// An engine on one FakeIpcBackend ("GPU-fake-0") with options `o`; *fake (when not null) gets
// the backend, which the engine owns.
inline absl::StatusOr<std::unique_ptr<Engine>> FakeIpcEngine(const EngineOptions& o,
                                                            FakeIpcBackend** fake,
                                                            EngineObserver* observer = nullptr) {
  auto backend = std::make_unique<FakeIpcBackend>("GPU-fake-0");
  if (fake != nullptr) *fake = backend.get();
  std::vector<std::unique_ptr<kernels::Backend>> b;
  b.push_back(std::move(backend));
  return Engine::Create(DeviceSet::FromBackends(std::move(b), true), o, observer, nullptr);
}

// A CPU engine for a test: `budget` bytes of state, two CPU workers, checkpoints in `state_dir`
// (none when empty), at most `max_step_items` items a Step. A failure to start fails the test
// and gives a null engine.
inline std::unique_ptr<Engine> TestCpuEngine(uint64_t budget, const std::string& state_dir = "",
                                             int max_step_items = EngineOptions().max_step_items) {
  EngineOptions o;
  o.state_budget_bytes = budget;
  o.cpu_workers = 2;
  o.state_dir = state_dir;
  o.max_step_items = max_step_items;
  auto e = CpuEngine(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// Calls an asynchronous engine method and waits for its completion.
template <typename T, typename F>
absl::StatusOr<T> Await(F start) {
  auto p = std::make_shared<std::promise<absl::StatusOr<T>>>();
  auto f = p->get_future();
  start([p](absl::StatusOr<T> r) { p->set_value(std::move(r)); });
  return f.get();
}

// Deterministic f32 values, normal(0, scale), as little-endian bytes.
inline std::string RandomF32(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::string out(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(gen);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

inline std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// A view of `bytes`, which must outlive every request built with it (hence no temporaries).
inline TensorIn InlineF32(const std::string& bytes, int64_t rows, int64_t cols) {
  TensorIn t;
  t.dtype = kernels::DType::kF32;
  t.shape = {rows, cols};
  t.data.source = Source::kInline;
  t.data.inline_data = bytes;
  return t;
}
TensorIn InlineF32(std::string&& bytes, int64_t rows, int64_t cols) = delete;

inline TensorIn RegionF32(const std::string& region, uint64_t offset, int64_t rows, int64_t cols) {
  TensorIn t;
  t.dtype = kernels::DType::kF32;
  t.shape = {rows, cols};
  t.data.source = Source::kRegion;
  t.data.region = RegionSlice{region, offset};
  return t;
}

inline OutputTarget RegionTarget(const std::string& region, uint64_t offset) {
  OutputTarget t;
  t.has_region = true;
  t.region = RegionSlice{region, offset};
  return t;
}

// Reference: the CPU backend's row-wise NVFP4 1x16 RTN quantization of host f32 data.
struct RefQuantized {
  std::string codes, scales;
  float global[2] = {0, 0};
};
inline RefQuantized RefQuantize(const std::string& x, int64_t rows, int64_t cols,
                                kernels::QuantizeOptions o = {}) {
  auto cpu = kernels::CreateCpuBackend();
  RefQuantized r;
  r.codes.assign(*kernels::CodeBytes(rows, cols, "x"), '\0');
  r.scales.assign(*kernels::ScaleBytes(rows, cols, o.format, o.scale_layout, "x"), '\0');
  kernels::QuantizedTensor q;
  q.format = o.format;
  q.block = o.block;
  q.scale_layout = o.scale_layout;
  q.rows = rows;
  q.cols = cols;
  q.codes = reinterpret_cast<uint8_t*>(r.codes.data());
  q.codes_capacity = r.codes.size();
  q.scales = reinterpret_cast<uint8_t*>(r.scales.data());
  q.scales_capacity = r.scales.size();
  q.global = r.global;
  kernels::ConstTensor t{x.data(), kernels::DType::kF32, rows, cols};
  absl::Status s = cpu->Quantize(t, o, nullptr, &q, nullptr, nullptr);
  if (!s.ok()) r.codes = "ERROR: " + s.ToString();
  return r;
}

}  // namespace fp4q::server::testing

#endif  // FP4Q_TESTS_SERVER_ENGINE_TEST_UTIL_H_
