// Prometheus metrics of fp4qd (names and labels: docs/DESIGN.md "Metrics").
//
// Every family is built once, in the constructor, from a registry passed in; nothing is global.
// The series of a label set are looked up once (Family::Add hashes and locks) and their
// pointers cached here, so a request costs a few atomic adds. Labels never carry tensor names,
// region ids or session ids. Thread-safe.
#ifndef FP4Q_SERVER_METRICS_H_
#define FP4Q_SERVER_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/observer.h"

namespace fp4q::server {

class Metrics final : public EngineObserver {
 public:
  // `registry` is not owned and outlives this object. `backend` is "cpu" or "cuda".
  Metrics(prometheus::Registry& registry, const std::string& version, const std::string& backend);

  // ---- Requests (the gRPC adapter).
  void RequestStarted();
  // `rpc` is the method name ("Quantize"); `code` the final status code.
  // `seconds` leaves out a Step's wait for its ready signals, which StepReadyWait observes.
  void RequestFinished(absl::string_view rpc, absl::StatusCode code, double seconds, uint64_t bytes,
                       uint64_t elements);
  void StepReadyWait(double seconds);
  void SetReady(bool ready);
  // ---- The fast socket (fast_socket.h): +1 per connection opened, -1 per connection ended.
  void FastSocketConnectionsChanged(int delta);

  // ---- EngineObserver.
  void KernelDuration(absl::string_view device, absl::string_view op, double seconds) override;
  void QueueDepth(absl::string_view device, int64_t depth) override;
  void QueueCapacity(absl::string_view device, int64_t capacity) override;
  void QueueRejected(absl::string_view device) override;
  void SpinPickup(absl::string_view device) override;
  void QueueWait(absl::string_view device, double seconds) override;
  void Sessions(int64_t open) override;
  void CudaRegions(int64_t registered) override;
  void CudaOpenHandles(int64_t open) override;
  void CudaHandleOpened() override;
  void StateTensors(absl::string_view device, absl::string_view kind, int64_t count) override;
  void StateBytes(absl::string_view device, int64_t bytes) override;
  void StateBudget(uint64_t bytes) override;
  void UpdateNotApplied() override;
  void StepOnePass(absl::string_view outcome) override;
  void Quality(double sqnr_db, double clipped_ratio, double underflow_ratio) override;
  void CheckpointFinished(bool ok, double seconds, absl::Time when) override;

 private:
  // The series of one RPC method; codes filled in on first use.
  struct RpcSeries {
    prometheus::Histogram* duration = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* elements = nullptr;
    std::array<prometheus::Counter*, 17> codes{};  // by absl::StatusCode (0..16)
  };
  // The series of one device label.
  struct DeviceSeries {
    prometheus::Gauge* depth = nullptr;
    prometheus::Gauge* capacity = nullptr;
    prometheus::Counter* rejected = nullptr;
    prometheus::Counter* spin_pickups = nullptr;
    prometheus::Histogram* wait = nullptr;
    prometheus::Counter* kernels = nullptr;
    prometheus::Counter* kernel_seconds = nullptr;
  };
  RpcSeries& Rpc(absl::string_view rpc);
  DeviceSeries& Device(absl::string_view device);

  std::mutex series_mu_;  // guards the maps (not the series, which are thread-safe)
  std::map<std::string, std::unique_ptr<RpcSeries>, std::less<>> rpcs_;
  std::map<std::string, std::unique_ptr<DeviceSeries>, std::less<>> devices_;
  std::map<std::string, prometheus::Histogram*, std::less<>> kernel_ops_;

  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Histogram& step_ready_wait_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  prometheus::Family<prometheus::Counter>& device_kernels_;
  prometheus::Family<prometheus::Counter>& device_kernel_seconds_;
  prometheus::Family<prometheus::Counter>& processed_bytes_;
  prometheus::Family<prometheus::Counter>& processed_elements_;
  prometheus::Gauge& in_flight_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Gauge>& queue_capacity_;
  prometheus::Family<prometheus::Counter>& queue_rejected_;
  prometheus::Family<prometheus::Counter>& spin_pickups_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& fast_socket_connections_;
  prometheus::Gauge& cuda_regions_;
  prometheus::Gauge& cuda_open_handles_;
  prometheus::Counter& cuda_handle_opens_;
  prometheus::Family<prometheus::Gauge>& state_tensors_;
  prometheus::Family<prometheus::Gauge>& state_bytes_;
  prometheus::Gauge& state_budget_;
  prometheus::Counter& update_not_applied_;
  prometheus::Family<prometheus::Counter>& step_one_pass_;
  prometheus::Histogram& quant_sqnr_;
  prometheus::Histogram& quant_clipped_;
  prometheus::Histogram& quant_underflow_;
  prometheus::Histogram& checkpoint_duration_;
  prometheus::Family<prometheus::Gauge>& checkpoint_last_success_;
  prometheus::Counter& checkpoint_failures_;
  prometheus::Gauge& ready_;
};

// ---- The /metrics HTTP server: prometheus-cpp's Exposer over civetweb, bounded.
//
// civetweb gives each connection a worker thread from first byte to close, and a connection that
// has not yet sent a whole request keeps its worker until the request timeout. With the plain
// Exposer(address) (2 workers, civetweb's 30 s timeout) two idle connections stop every scrape
// for 30 s, and a few hundred half-open ones stop it for many minutes. Here every connection
// must send its request, and take its reply, within `request_timeout_ms`, and `threads` workers
// serve at once, so H connections that never send a request delay a scrape by about
// ceil(H / threads) * request_timeout_ms (300 idle connections with the defaults: ~1.2 s; the
// test holding this is tests/server/metrics_exposer_test.cc).
struct ExposerOptions {
  int threads = 64;              // civetweb num_threads: connections served at once (1-1024)
  int request_timeout_ms = 250;  // civetweb request_timeout_ms: read/write limit per request
                                 // (1-60000); a scrape's request and reply take well under 10 ms
                                 // on loopback or a pod network
};

struct MetricsExposer {
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;  // the port bound (the one chosen when `listen` asked for port 0)
};

// Serves `collectable` (the registry) at http://`listen`/metrics, `listen` being HOST:PORT as
// --metrics_listen takes it ("127.0.0.1:9450", "[::1]:0"). Errors name the flag and the address:
// INVALID_ARGUMENT for a bad option value; UNAVAILABLE "--metrics_listen 127.0.0.1:9450: address
// already in use (...)" when another socket holds the port, else UNAVAILABLE with the bind
// error (civetweb's own message when none can be found). Thread-compatible: call once, from main.
absl::StatusOr<MetricsExposer> StartExposer(
    const std::string& listen, const std::weak_ptr<prometheus::Collectable>& collectable,
    const ExposerOptions& options = {});

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_METRICS_H_
