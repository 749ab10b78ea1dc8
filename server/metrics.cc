#include "server/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace fp4q::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

Histogram::BucketBoundaries LatencyBuckets() {
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30};
}
Histogram::BucketBoundaries RatioBuckets() {
  return {0, 0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1};
}
Histogram::BucketBoundaries SqnrBuckets() {
  return {0, 5, 10, 12, 14, 16, 18, 20, 22, 25, 30, 40, 60, 100};
}
Histogram::BucketBoundaries CheckpointBuckets() {
  return {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}

std::string S(absl::string_view v) { return std::string(v); }

// "HOST:PORT" -> HOST (brackets of "[::1]" removed) and PORT; "PORT" -> "" and PORT.
void SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    host->clear();
    *port = listen;
    return;
  }
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
}

// Why civetweb could not listen on `listen`: the errno of a bind there as civetweb does it
// (SO_REUSEADDR), 0 when that bind works now, -1 when the address does not resolve.
int BindErrno(const std::string& listen) {
  std::string host, port;
  SplitHostPort(listen, &host, &port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0) {
    return -1;
  }
  int err = -1;
  for (addrinfo* a = found; a != nullptr && err < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    err = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return err;
}

}  // namespace

absl::StatusOr<MetricsExposer> StartExposer(
    const std::string& listen, const std::weak_ptr<prometheus::Collectable>& collectable,
    const ExposerOptions& options) {
  if (listen.empty()) return absl::InvalidArgumentError("--metrics_listen: empty address");
  if (options.threads < 1 || options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics exposer threads: ", options.threads, " is not in [1, 1024]"));
  }
  if (options.request_timeout_ms < 1 || options.request_timeout_ms > 60000) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics exposer request_timeout_ms: ", options.request_timeout_ms,
                     " is not in [1, 60000]"));
  }
  // listen_backlog: civetweb's default (200) makes the kernel drop the SYNs of a scrape that
  // arrives behind 200 idle connections, and the scraper's TCP retries after 1 s, 3 s, ...;
  // with room in the backlog it waits in line instead (ceil(H / threads) * timeout).
  std::vector<std::string> civetweb = {
      "listening_ports",    listen,
      "num_threads",        absl::StrCat(options.threads),
      "request_timeout_ms", absl::StrCat(options.request_timeout_ms),
      "listen_backlog",     "1024",
  };
  MetricsExposer m;
  try {
    m.exposer = std::make_unique<prometheus::Exposer>(std::move(civetweb));
  } catch (const std::exception& e) {
    const int err = BindErrno(listen);
    if (err == EADDRINUSE) {
      return absl::UnavailableError(absl::StrCat(
          "--metrics_listen ", listen,
          ": address already in use (another fp4qd or another program listens there; choose "
          "another port, or port 0 for a free one)"));
    }
    if (err > 0) {
      return absl::UnavailableError(
          absl::StrCat("--metrics_listen ", listen, ": cannot listen: ", std::strerror(err)));
    }
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen ", listen, ": cannot listen: ", e.what()));
  }
  m.exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = m.exposer->GetListeningPorts();
  m.port = ports.empty() ? 0 : ports[0];
  return m;
}

Metrics::Metrics(prometheus::Registry& registry, const std::string& version,
                 const std::string& backend)
    : requests_total_(BuildCounter()
                          .Name("fp4q_requests_total")
                          .Help("RPCs finished, by method and gRPC status code")
                          .Register(registry)),
      request_duration_(BuildHistogram()
                            .Name("fp4q_request_duration_seconds")
                            .Help("RPC latency from arrival to reply, by method (a Step's wait "
                                  "for its ready signals left out)")
                            .Register(registry)),
      step_ready_wait_(BuildHistogram()
                           .Name("fp4q_step_ready_wait_seconds")
                           .Help("Steps with ready signals: how long they waited for them (the "
                                 "workers' backward passes)")
                           .Register(registry)
                           .Add({}, LatencyBuckets())),
      kernel_duration_(BuildHistogram()
                           .Name("fp4q_kernel_duration_seconds")
                           .Help("Kernel time (launch to stream synchronize), by op")
                           .Register(registry)),
      device_kernels_(BuildCounter()
                          .Name("fp4q_device_kernels_total")
                          .Help("Kernel ops run, by device (GPU UUID or cpu)")
                          .Register(registry)),
      device_kernel_seconds_(BuildCounter()
                                 .Name("fp4q_device_kernel_seconds_total")
                                 .Help("Kernel time (launch to stream synchronize), by device")
                                 .Register(registry)),
      processed_bytes_(BuildCounter()
                           .Name("fp4q_processed_bytes_total")
                           .Help("Tensor bytes read and written, by method")
                           .Register(registry)),
      processed_elements_(BuildCounter()
                              .Name("fp4q_processed_elements_total")
                              .Help("Tensor elements processed, by method")
                              .Register(registry)),
      in_flight_(BuildGauge()
                     .Name("fp4q_requests_in_flight")
                     .Help("RPCs received and not yet answered")
                     .Register(registry)
                     .Add({})),
      queue_depth_(BuildGauge()
                       .Name("fp4q_queue_depth")
                       .Help("Work queued on a device executor, not yet started")
                       .Register(registry)),
      queue_capacity_(BuildGauge()
                          .Name("fp4q_queue_capacity")
                          .Help("Bound of a device executor's queue (--max_queue_depth)")
                          .Register(registry)),
      queue_rejected_(BuildCounter()
                          .Name("fp4q_queue_rejected_total")
                          .Help("Requests refused with RESOURCE_EXHAUSTED: queue full")
                          .Register(registry)),
      spin_pickups_(BuildCounter()
                        .Name("fp4q_worker_spin_pickups_total")
                        .Help("Requests a busy-polling device worker started without a thread "
                              "wake-up (--worker_spin_us)")
                        .Register(registry)),
      queue_wait_(BuildHistogram()
                      .Name("fp4q_queue_wait_seconds")
                      .Help("Time a request waited in a device executor's queue before its "
                            "work started")
                      .Register(registry)),
      sessions_(BuildGauge()
                    .Name("fp4q_sessions")
                    .Help("Open client sessions")
                    .Register(registry)
                    .Add({})),
      fast_socket_connections_(BuildGauge()
                                   .Name("fp4q_fast_socket_connections")
                                   .Help("Open connections on --fast_socket")
                                   .Register(registry)
                                   .Add({})),
      cuda_regions_(BuildGauge()
                        .Name("fp4q_cuda_regions")
                        .Help("Registered CUDA IPC regions")
                        .Register(registry)
                        .Add({})),
      cuda_open_handles_(BuildGauge()
                             .Name("fp4q_cuda_open_handles")
                             .Help("Open CUDA IPC mappings (distinct handles)")
                             .Register(registry)
                             .Add({})),
      cuda_handle_opens_(BuildCounter()
                             .Name("fp4q_cuda_handle_opens_total")
                             .Help("cudaIpcOpenMemHandle calls")
                             .Register(registry)
                             .Add({})),
      state_tensors_(BuildGauge()
                         .Name("fp4q_state_tensors")
                         .Help("Named state tensors, by device and kind")
                         .Register(registry)),
      state_bytes_(BuildGauge()
                       .Name("fp4q_state_bytes")
                       .Help("Bytes of named state, by device")
                       .Register(registry)),
      state_budget_(BuildGauge()
                        .Name("fp4q_state_budget_bytes")
                        .Help("Memory budget for state tensors, all devices")
                        .Register(registry)
                        .Add({})),
      update_not_applied_(BuildCounter()
                              .Name("fp4q_update_not_applied_total")
                              .Help("UpdateWeight calls with an already applied step")
                              .Register(registry)
                              .Add({})),
      step_one_pass_(BuildCounter()
                         .Name("fp4q_step_one_pass_total")
                         .Help("Steps (one device's part) that asked for one pass, by outcome: "
                               "one_pass, or why they ran in two (items, retry, devices, "
                               "budget, memory)")
                         .Register(registry)),
      quant_sqnr_(BuildHistogram()
                      .Name("fp4q_quant_sqnr_db")
                      .Help("SQNR of sampled Quantize requests, dB")
                      .Register(registry)
                      .Add({}, SqnrBuckets())),
      quant_clipped_(BuildHistogram()
                         .Name("fp4q_quant_clipped_ratio")
                         .Help("Sampled requests: fraction of elements clipped to code +-6")
                         .Register(registry)
                         .Add({}, RatioBuckets())),
      quant_underflow_(BuildHistogram()
                           .Name("fp4q_quant_underflow_ratio")
                           .Help("Sampled requests: fraction of nonzero elements that became 0")
                           .Register(registry)
                           .Add({}, RatioBuckets())),
      checkpoint_duration_(BuildHistogram()
                               .Name("fp4q_checkpoint_duration_seconds")
                               .Help("Checkpoint write time")
                               .Register(registry)
                               .Add({}, CheckpointBuckets())),
      checkpoint_last_success_(
          BuildGauge()
              .Name("fp4q_checkpoint_last_success_timestamp_seconds")
              .Help("Unix time of the last successful checkpoint (absent before the first)")
              .Register(registry)),
      checkpoint_failures_(BuildCounter()
                               .Name("fp4q_checkpoint_failures_total")
                               .Help("Failed checkpoint attempts")
                               .Register(registry)
                               .Add({})),
      ready_(BuildGauge()
                 .Name("fp4q_ready")
                 .Help("1 when the readiness health service is SERVING")
                 .Register(registry)
                 .Add({})) {
  BuildGauge()
      .Name("fp4q_build_info")
      .Help("Build and backend of this server (value 1)")
      .Register(registry)
      .Add({{"version", version}, {"backend", backend}})
      .Set(1);
  for (const char* op : {"amax", "quantize", "dequantize", "qdq", "matmul", "step"}) {
    kernel_ops_[op] = &kernel_duration_.Add({{"op", op}}, LatencyBuckets());
  }
  for (const char* outcome : kOnePassOutcomes) step_one_pass_.Add({{"outcome", outcome}});
}

Metrics::RpcSeries& Metrics::Rpc(absl::string_view rpc) {
  std::lock_guard<std::mutex> lock(series_mu_);
  auto it = rpcs_.find(rpc);
  if (it == rpcs_.end()) {
    auto s = std::make_unique<RpcSeries>();
    s->duration = &request_duration_.Add({{"rpc", S(rpc)}}, LatencyBuckets());
    s->bytes = &processed_bytes_.Add({{"rpc", S(rpc)}});
    s->elements = &processed_elements_.Add({{"rpc", S(rpc)}});
    it = rpcs_.emplace(S(rpc), std::move(s)).first;
  }
  return *it->second;
}

Metrics::DeviceSeries& Metrics::Device(absl::string_view device) {
  std::lock_guard<std::mutex> lock(series_mu_);
  auto it = devices_.find(device);
  if (it == devices_.end()) {
    auto s = std::make_unique<DeviceSeries>();
    s->depth = &queue_depth_.Add({{"device", S(device)}});
    s->capacity = &queue_capacity_.Add({{"device", S(device)}});
    s->rejected = &queue_rejected_.Add({{"device", S(device)}});
    s->spin_pickups = &spin_pickups_.Add({{"device", S(device)}});
    s->wait = &queue_wait_.Add({{"device", S(device)}}, LatencyBuckets());
    it = devices_.emplace(S(device), std::move(s)).first;
  }
  return *it->second;
}

void Metrics::RequestStarted() { in_flight_.Increment(); }

void Metrics::RequestFinished(absl::string_view rpc, absl::StatusCode code, double seconds,
                              uint64_t bytes, uint64_t elements) {
  in_flight_.Decrement();
  RpcSeries& r = Rpc(rpc);
  const size_t c = static_cast<size_t>(code) < r.codes.size() ? static_cast<size_t>(code) : 2;
  prometheus::Counter* total;
  {
    std::lock_guard<std::mutex> lock(series_mu_);
    total = r.codes[c];
    if (total == nullptr) {
      total = r.codes[c] = &requests_total_.Add(
          {{"rpc", S(rpc)}, {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(c))}});
    }
  }
  total->Increment();
  r.duration->Observe(seconds);
  if (bytes > 0) r.bytes->Increment(static_cast<double>(bytes));
  if (elements > 0) r.elements->Increment(static_cast<double>(elements));
}

void Metrics::StepReadyWait(double seconds) { step_ready_wait_.Observe(seconds); }

void Metrics::SetReady(bool ready) { ready_.Set(ready ? 1 : 0); }

void Metrics::KernelDuration(absl::string_view device, absl::string_view op, double seconds) {
  DeviceSeries& d = Device(device);
  prometheus::Histogram* h;
  prometheus::Counter* kernels;
  prometheus::Counter* kernel_seconds;
  {
    std::lock_guard<std::mutex> lock(series_mu_);
    auto it = kernel_ops_.find(op);
    if (it == kernel_ops_.end()) {
      it = kernel_ops_.emplace(S(op), &kernel_duration_.Add({{"op", S(op)}}, LatencyBuckets()))
               .first;
    }
    h = it->second;
    if (d.kernels == nullptr) {  // these series appear with the device's first kernel op
      d.kernels = &device_kernels_.Add({{"device", S(device)}});
      d.kernel_seconds = &device_kernel_seconds_.Add({{"device", S(device)}});
    }
    kernels = d.kernels;
    kernel_seconds = d.kernel_seconds;
  }
  h->Observe(seconds);
  kernels->Increment();
  kernel_seconds->Increment(seconds);
}

void Metrics::QueueDepth(absl::string_view device, int64_t depth) {
  Device(device).depth->Set(static_cast<double>(depth));
}
void Metrics::QueueCapacity(absl::string_view device, int64_t capacity) {
  Device(device).capacity->Set(static_cast<double>(capacity));
}
void Metrics::QueueRejected(absl::string_view device) { Device(device).rejected->Increment(); }
void Metrics::SpinPickup(absl::string_view device) { Device(device).spin_pickups->Increment(); }
void Metrics::QueueWait(absl::string_view device, double seconds) {
  Device(device).wait->Observe(seconds);
}
void Metrics::Sessions(int64_t open) { sessions_.Set(static_cast<double>(open)); }

void Metrics::FastSocketConnectionsChanged(int delta) {
  fast_socket_connections_.Increment(static_cast<double>(delta));
}
void Metrics::CudaRegions(int64_t registered) {
  cuda_regions_.Set(static_cast<double>(registered));
}
void Metrics::CudaOpenHandles(int64_t open) { cuda_open_handles_.Set(static_cast<double>(open)); }
void Metrics::CudaHandleOpened() { cuda_handle_opens_.Increment(); }
void Metrics::StateTensors(absl::string_view device, absl::string_view kind, int64_t count) {
  state_tensors_.Add({{"device", S(device)}, {"kind", S(kind)}}).Set(static_cast<double>(count));
}
void Metrics::StateBytes(absl::string_view device, int64_t bytes) {
  state_bytes_.Add({{"device", S(device)}}).Set(static_cast<double>(bytes));
}
void Metrics::StateBudget(uint64_t bytes) { state_budget_.Set(static_cast<double>(bytes)); }
void Metrics::UpdateNotApplied() { update_not_applied_.Increment(); }
void Metrics::StepOnePass(absl::string_view outcome) {
  step_one_pass_.Add({{"outcome", S(outcome)}}).Increment();
}

void Metrics::Quality(double sqnr_db, double clipped_ratio, double underflow_ratio) {
  quant_sqnr_.Observe(sqnr_db);
  quant_clipped_.Observe(clipped_ratio);
  quant_underflow_.Observe(underflow_ratio);
}

void Metrics::CheckpointFinished(bool ok, double seconds, absl::Time when) {
  checkpoint_duration_.Observe(seconds);
  if (ok) {
    checkpoint_last_success_.Add({}).Set(absl::ToDoubleSeconds(when - absl::UnixEpoch()));
  } else {
    checkpoint_failures_.Increment();
  }
}

}  // namespace fp4q::server
