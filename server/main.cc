// fp4qd: the fp4q server. The only place with flags; see docs/DESIGN.md "Server flags".
//
// Stdout carries exactly two lines, flushed as soon as each listener is up:
//   fp4qd: listening on HOST:PORT
//   fp4qd: metrics on HOST:PORT        (unless --metrics_listen is empty)
// Logs go to stderr (JSON lines by default).
//
// Exit codes: 0 after a clean SIGTERM/SIGINT drain, 1 on a startup or shutdown failure (bad flag,
// no backend, listener, final checkpoint), 2 when a device is poisoned by a sticky error,
// 3 when the checkpoint in --state_dir is corrupt or truncated (unless
// --ignore_corrupt_checkpoint, which renames it aside and starts empty).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/checkpoint.h"
#include "server/devices.h"
#include "server/engine.h"
#include "server/fast_socket.h"
#include "server/grpc_service.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/unix_listener.h"

#ifndef FP4Q_VERSION
#define FP4Q_VERSION "0.0.0"
#endif

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address HOST:PORT; port 0 picks one");
ABSL_FLAG(std::string, unix_socket, "",
          "also listen on this Unix domain socket path; each connection's uid is checked "
          "(SO_PEERCRED) against --unix_socket_allowed_uids");
ABSL_FLAG(std::string, unix_socket_allowed_uids, "",
          "comma-separated uids that may connect to --unix_socket; empty = fp4qd's own uid "
          "(the socket file is then mode 0600, else 0666)");
ABSL_FLAG(std::string, fast_socket, "",
          "also serve Quantize/Dequantize/Qdq/Matmul/UpdateWeight/KeepAlive/ListTensors/ServerInfo "
          "on this Unix socket "
          "path (SOCK_SEQPACKET, one protobuf frame per message, no gRPC: see FastRequest in "
          "fp4q.proto); peers checked like --unix_socket; empty = off");
ABSL_FLAG(int32_t, fast_socket_spin_us, 0,
          "busy-poll each --fast_socket connection this long before sleeping (lower latency "
          "for a CPU core per busy connection); 0-1000000");
ABSL_FLAG(int32_t, fast_socket_max_connections, 64, "cap on open --fast_socket connections");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9450",
          "Prometheus /metrics address HOST:PORT; empty disables; port 0 picks one");
ABSL_FLAG(std::string, backend, "auto",
          "auto (CUDA when a GPU is usable, else CPU), cpu, or cuda (fail if none)");
ABSL_FLAG(std::string, cuda_module, "", "path of libfp4q_cuda.so (default: search beside fp4qd)");
ABSL_FLAG(std::string, state_dir, "", "checkpoint directory; empty = no persistence");
ABSL_FLAG(int64_t, checkpoint_interval_s, 0,
          "periodic checkpoint interval; 0 = only on request and on SIGTERM");
ABSL_FLAG(uint64_t, state_budget_bytes, uint64_t{4294967296},
          "memory budget for state tensors, all devices");
ABSL_FLAG(int64_t, max_message_bytes, 536870912, "gRPC receive/send limit in bytes");
ABSL_FLAG(int32_t, max_queue_depth, 64,
          "per-device bound of queued work; beyond it: RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, workers, 0, "CPU backend worker threads (0 = hardware threads)");
ABSL_FLAG(int32_t, streams_per_gpu, 4,
          "CUDA backend: workers per GPU, each with its own CUDA stream, so requests on one GPU "
          "overlap (requests on the same state name still run one at a time, in order); 1-64");
ABSL_FLAG(int32_t, worker_spin_us, 0,
          "an idle device worker busy-polls this long for new work before sleeping (one per "
          "device at a time): saves a thread wake-up per request for a CPU core while requests "
          "keep coming; 0-1000000");
ABSL_FLAG(int64_t, scratch_cache_mb, 256,
          "request scratch buffers kept cached per device (MiB; 0 = allocate and free per "
          "request)");
ABSL_FLAG(int32_t, max_open_handles, 1024, "cap on open CUDA IPC handles");
ABSL_FLAG(int64_t, session_lease_s, 30,
          "a session not renewed for this long ends; its regions are released");
ABSL_FLAG(bool, allow_cuda_ipc, false,
          "accept RegisterCudaRegion (client shared memory is off unless set)");
ABSL_FLAG(bool, cuda_ipc_over_tcp, false,
          "with --allow_cuda_ipc, accept RegisterCudaRegion over TCP too (default: only on "
          "--unix_socket, from its allowed uids)");
ABSL_FLAG(int64_t, drain_timeout_s, 30, "SIGTERM: wait this long for in-flight work");
ABSL_FLAG(std::string, log_format, "json", "json or text; logs go to stderr");
ABSL_FLAG(bool, ignore_corrupt_checkpoint, false,
          "rename a corrupt checkpoint aside and start empty instead of exiting with code 3");
ABSL_FLAG(int32_t, quality_sample_every, 16,
          "quantization quality metrics on 1 in N Quantize requests (skipped while an earlier "
          "sample is still being computed); 0 = off");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token every fp4q.v1 call must present; empty = no auth");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain (TLS on --listen)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key (with --tls_cert)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)");

namespace fp4q::server {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitPoisoned = 2;
constexpr int kExitCorruptCheckpoint = 3;

std::atomic<bool> g_poisoned{false};

// libprotobuf logs an ERROR line for each request it cannot parse (e.g. invalid UTF-8 in a
// string field), on gRPC and the fast socket alike: a hostile client could flood stderr. Its
// messages go through our logger instead, at most one a second, with the count suppressed.
Logger* g_protobuf_logger = nullptr;
std::atomic<int64_t> g_protobuf_last_ns{0};
std::atomic<int64_t> g_protobuf_suppressed{0};

void ProtobufLog(google::protobuf::LogLevel level, const char* /*filename*/, int /*line*/,
                 const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    std::fprintf(stderr, "libprotobuf FATAL: %s\n", message.c_str());
    return;  // protobuf aborts after its handler returns
  }
  const int64_t now = absl::GetCurrentTimeNanos();
  int64_t last = g_protobuf_last_ns.load();
  if (now - last < 1000 * 1000 * 1000 || !g_protobuf_last_ns.compare_exchange_strong(last, now)) {
    g_protobuf_suppressed.fetch_add(1);
    return;
  }
  if (g_protobuf_logger == nullptr) return;
  g_protobuf_logger->Warning(
      "libprotobuf", {{"message", message.substr(0, 512)},
                      {"suppressed_since_last", absl::StrCat(g_protobuf_suppressed.exchange(0))}});
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "HOST:PORT" -> HOST ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

void PrintAddress(absl::string_view what, const std::string& host, int port) {
  std::printf("fp4qd: %s on %s:%d\n", std::string(what).c_str(), host.c_str(), port);
  std::fflush(stdout);
}

absl::Status CheckFlags() {
  const std::string log_format = absl::GetFlag(FLAGS_log_format);
  if (log_format != "json" && log_format != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format: '", log_format, "' is not json or text"));
  }
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message < 1 || max_message > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: ", max_message, " is not in [1, 2^31 - 1]"));
  }
  if (absl::GetFlag(FLAGS_max_queue_depth) < 1) {
    return absl::InvalidArgumentError("--max_queue_depth: must be >= 1");
  }
  if (absl::GetFlag(FLAGS_workers) < 0) {
    return absl::InvalidArgumentError("--workers: must be >= 0");
  }
  if (const int s = absl::GetFlag(FLAGS_streams_per_gpu); s < 1 || s > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--streams_per_gpu: ", s, " is not in [1, 64]"));
  }
  if (const int s = absl::GetFlag(FLAGS_worker_spin_us); s < 0 || s > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_spin_us: ", s, " is not in [0, 1000000]"));
  }
  if (const int s = absl::GetFlag(FLAGS_fast_socket_spin_us); s < 0 || s > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fast_socket_spin_us: ", s, " is not in [0, 1000000]"));
  }
  if (const int64_t mb = absl::GetFlag(FLAGS_scratch_cache_mb); mb < 0 || mb > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scratch_cache_mb: ", mb, " is not in [0, 1048576]"));
  }
  if (absl::GetFlag(FLAGS_max_open_handles) < 1) {
    return absl::InvalidArgumentError("--max_open_handles: must be >= 1");
  }
  if (absl::GetFlag(FLAGS_session_lease_s) < 1) {
    return absl::InvalidArgumentError("--session_lease_s: must be >= 1");
  }
  if (absl::GetFlag(FLAGS_checkpoint_interval_s) < 0 || absl::GetFlag(FLAGS_drain_timeout_s) < 0 ||
      absl::GetFlag(FLAGS_quality_sample_every) < 0) {
    return absl::InvalidArgumentError(
        "--checkpoint_interval_s, --drain_timeout_s and --quality_sample_every must be >= 0");
  }
  if (absl::GetFlag(FLAGS_tls_cert).empty() != absl::GetFlag(FLAGS_tls_key).empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!absl::GetFlag(FLAGS_tls_client_ca).empty() && absl::GetFlag(FLAGS_tls_cert).empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  const std::string dir = absl::GetFlag(FLAGS_state_dir);
  if (!dir.empty()) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--state_dir: ", dir, " is not an existing directory"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials() {
  const std::string cert_path = absl::GetFlag(FLAGS_tls_cert);
  if (cert_path.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadFile(cert_path, "tls_cert");
  absl::StatusOr<std::string> key = ReadFile(absl::GetFlag(FLAGS_tls_key), "tls_key");
  if (!cert.ok()) return cert.status();
  if (!key.ok()) return key.status();
  pair.cert_chain = *cert;
  pair.private_key = *key;
  const std::string ca_path = absl::GetFlag(FLAGS_tls_client_ca);
  grpc::SslServerCredentialsOptions options(
      ca_path.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                      : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!ca_path.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(ca_path, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  options.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(options);
}

// Sets every health service name for the current state.
void SetHealth(grpc::Server* server, Metrics* metrics, bool live, bool ready) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("liveness", live);
    health->SetServingStatus("readiness", ready);
    health->SetServingStatus("", ready);
  }
  metrics->SetReady(ready);
}

int Run(Logger& log) {
  if (absl::Status s = CheckFlags(); !s.ok()) {
    log.Error("bad flag", {{"error", s.ToString()}});
    return kExitFailure;
  }

  DeviceSetOptions device_options;
  device_options.backend = absl::GetFlag(FLAGS_backend);
  device_options.cuda_module = absl::GetFlag(FLAGS_cuda_module);
  absl::StatusOr<std::unique_ptr<DeviceSet>> devices = DeviceSet::Create(device_options);
  if (!devices.ok()) {
    log.Error("no backend",
              {{"backend", device_options.backend}, {"error", devices.status().ToString()}});
    return kExitFailure;
  }
  if (!(*devices)->fallback_reason().empty()) {
    log.Info("backend auto: CUDA unavailable, serving on the CPU backend",
             {{"reason", (*devices)->fallback_reason()}});
  }
  for (int i = 0; i < (*devices)->size(); ++i) {
    const Device& d = (*devices)->device(i);
    log.Info("device", {{"backend", d.info.backend}, {"uuid", d.label}, {"name", d.info.name}});
  }
  const std::string backend_kind = (*devices)->kind();

  auto registry = std::make_shared<prometheus::Registry>();
  Metrics metrics(*registry, FP4Q_VERSION, backend_kind);

  EngineOptions options;
  options.state_budget_bytes = absl::GetFlag(FLAGS_state_budget_bytes);
  options.max_queue_depth = absl::GetFlag(FLAGS_max_queue_depth);
  options.cpu_workers = absl::GetFlag(FLAGS_workers);
  options.streams_per_gpu = absl::GetFlag(FLAGS_streams_per_gpu);
  options.worker_spin = absl::Microseconds(absl::GetFlag(FLAGS_worker_spin_us));
  options.scratch_cache_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_scratch_cache_mb)) << 20;
  options.max_open_handles = absl::GetFlag(FLAGS_max_open_handles);
  options.session_lease = absl::Seconds(absl::GetFlag(FLAGS_session_lease_s));
  options.allow_cuda_ipc = absl::GetFlag(FLAGS_allow_cuda_ipc);
  options.cuda_ipc_over_tcp = absl::GetFlag(FLAGS_cuda_ipc_over_tcp);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.checkpoint_interval = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  options.quality_sample_every = absl::GetFlag(FLAGS_quality_sample_every);
  options.version = FP4Q_VERSION;
  absl::StatusOr<std::unique_ptr<Engine>> engine_or =
      Engine::Create(std::move(*devices), options, &metrics, &log);
  if (!engine_or.ok()) {
    log.Error("engine", {{"error", engine_or.status().ToString()}});
    return kExitFailure;
  }
  Engine& engine = **engine_or;

  if (absl::Status s = engine.Restore(); !s.ok()) {
    if (!absl::IsDataLoss(s)) return kExitFailure;  // logged by Restore
    if (!absl::GetFlag(FLAGS_ignore_corrupt_checkpoint)) return kExitCorruptCheckpoint;
    const std::string path = absl::StrCat(options.state_dir, "/", kCheckpointFileName);
    const std::string aside = absl::StrCat(path, ".corrupt-", absl::ToUnixSeconds(absl::Now()));
    if (::rename(path.c_str(), aside.c_str()) != 0) {
      log.Error("cannot rename the corrupt checkpoint aside",
                {{"file", path}, {"error", std::strerror(errno)}});
      return kExitCorruptCheckpoint;
    }
    log.Warning("corrupt checkpoint renamed aside; starting empty", {{"file", aside}});
  }

  std::string auth_token;
  if (const std::string f = absl::GetFlag(FLAGS_auth_token_file); !f.empty()) {
    absl::StatusOr<std::string> token = ReadFile(f, "auth_token_file");
    if (!token.ok()) {
      log.Error("auth token", {{"error", token.status().ToString()}});
      return kExitFailure;
    }
    auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (auth_token.empty()) {
      log.Error("auth token file is empty", {{"file", f}});
      return kExitFailure;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = TcpCredentials();
  if (!creds.ok()) {
    log.Error("TLS", {{"error", creds.status().ToString()}});
    return kExitFailure;
  }

  // The Unix socket: fp4qd accepts on it itself to check each peer's uid (unix_listener.h).
  std::unique_ptr<UnixListener> unix_listener;
  const std::string unix_socket = absl::GetFlag(FLAGS_unix_socket);
  if (!unix_socket.empty()) {
    std::set<uid_t> allowed = {::geteuid()};
    if (const std::string uids = absl::GetFlag(FLAGS_unix_socket_allowed_uids); !uids.empty()) {
      absl::StatusOr<std::set<uid_t>> parsed = ParseUidList(uids, "unix_socket_allowed_uids");
      if (!parsed.ok()) {
        log.Error("bad flag", {{"error", parsed.status().ToString()}});
        return kExitFailure;
      }
      allowed = *std::move(parsed);
    }
    absl::StatusOr<std::unique_ptr<UnixListener>> l =
        UnixListener::Create(unix_socket, std::move(allowed), &log);
    if (!l.ok()) {
      log.Error("cannot listen", {{"unix_socket", unix_socket}, {"error", l.status().ToString()}});
      return kExitFailure;
    }
    unix_listener = *std::move(l);
  }

  std::unique_ptr<FastSocketServer> fast_socket;
  if (const std::string path = absl::GetFlag(FLAGS_fast_socket); !path.empty()) {
    FastSocketOptions fo;
    fo.path = path;
    fo.allowed_uids = {::geteuid()};
    if (const std::string uids = absl::GetFlag(FLAGS_unix_socket_allowed_uids); !uids.empty()) {
      absl::StatusOr<std::set<uid_t>> parsed = ParseUidList(uids, "unix_socket_allowed_uids");
      if (!parsed.ok()) {
        log.Error("bad flag", {{"error", parsed.status().ToString()}});
        return kExitFailure;
      }
      fo.allowed_uids = *std::move(parsed);
    }
    fo.auth_token = auth_token;
    fo.max_connections = absl::GetFlag(FLAGS_fast_socket_max_connections);
    fo.spin = absl::Microseconds(absl::GetFlag(FLAGS_fast_socket_spin_us));
    fo.max_message_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_message_bytes));
    absl::StatusOr<std::unique_ptr<FastSocketServer>> f =
        FastSocketServer::Create(&engine, &metrics, std::move(fo), &log);
    if (!f.ok()) {
      log.Error("cannot listen", {{"fast_socket", path}, {"error", f.status().ToString()}});
      return kExitFailure;
    }
    fast_socket = *std::move(f);
  }

  ServiceOptions service_options;
  service_options.auth_token = auth_token;
  if (unix_listener != nullptr) {
    UnixListener* l = unix_listener.get();
    service_options.peer_lookup = [l](absl::string_view peer) { return l->Find(peer); };
  }
  service_options.max_message_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_message_bytes));
  Fp4qService service(&engine, &metrics, service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  int port = 0;
  builder.AddListeningPort(listen, *creds, &port);
  const int max_message = static_cast<int>(absl::GetFlag(FLAGS_max_message_bytes));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    log.Error("cannot listen", {{"listen", listen}, {"unix_socket", unix_socket}});
    return kExitFailure;
  }

  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_listen);
    } catch (const std::exception& e) {
      log.Error("cannot serve metrics", {{"metrics_listen", metrics_listen}, {"error", e.what()}});
      server->Shutdown();
      return kExitFailure;
    }
    exposer->RegisterCollectable(registry);
    const std::vector<int> ports = exposer->GetListeningPorts();
    metrics_port = ports.empty() ? 0 : ports[0];
  }

  if (unix_listener != nullptr) {  // started last: no early return can leave it running
    unix_listener->Start(server.get());
    log.Info("listening on a Unix socket", {{"path", unix_socket}});
  }
  if (fast_socket != nullptr) {
    fast_socket->Start();
    log.Info("listening on the fast socket", {{"path", fast_socket->path()}});
  }
  engine.SetPoisonHandler([](const absl::Status&) { g_poisoned.store(true); });
  engine.StartMaintenance();
  // Ready (health and fp4q_ready) before the address lines tell anyone the server is up.
  SetHealth(server.get(), &metrics, /*live=*/true, /*ready=*/true);
  PrintAddress("listening", HostOf(listen), port);
  if (exposer != nullptr) PrintAddress("metrics", HostOf(metrics_listen), metrics_port);
  log.Info("serving", {{"listen", absl::StrCat(HostOf(listen), ":", port)},
                       {"backend", backend_kind},
                       {"version", FP4Q_VERSION},
                       {"epoch", absl::StrCat(engine.epoch())}});

  // Wait for SIGTERM / SIGINT (blocked in every thread since main's start) or a poisoned device.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int signal_number = 0;
  while (!g_poisoned.load()) {
    const timespec tick{0, 200 * 1000 * 1000};
    signal_number = sigtimedwait(&signals, nullptr, &tick);
    if (signal_number > 0) break;
  }

  if (g_poisoned.load()) {
    SetHealth(server.get(), &metrics, /*live=*/false, /*ready=*/false);
    log.Error("exiting: a device is poisoned; the orchestrator should restart fp4qd",
              {{"error", engine.poisoned().ToString()}});
    absl::SleepFor(absl::Seconds(1));  // let probes observe NOT_SERVING
    std::fflush(nullptr);
    std::_Exit(kExitPoisoned);  // device state is unusable; no orderly teardown
  }

  log.Info("draining",
           {{"signal", strsignal(signal_number)}, {"in_flight", absl::StrCat(engine.in_flight())}});
  SetHealth(server.get(), &metrics, /*live=*/true, /*ready=*/false);
  engine.BeginDrain();
  const absl::Duration drain = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  if (!engine.WaitIdle(drain)) {
    const int refused = engine.RejectQueued();
    log.Warning(
        "drain timeout: queued work refused",
        {{"in_flight", absl::StrCat(engine.in_flight())}, {"refused", absl::StrCat(refused)}});
  }
  int rc = 0;
  if (!options.state_dir.empty()) {
    absl::StatusOr<CheckpointStats> c = engine.CheckpointNow();
    if (!c.ok()) rc = kExitFailure;  // logged by CheckpointNow
  }
  if (unix_listener != nullptr) unix_listener->Stop();
  if (fast_socket != nullptr) fast_socket->Stop();  // its calls in flight finish first
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.Shutdown();
  log.Info("stopped", {{"exit_code", absl::StrCat(rc)}});
  // Everything that must outlive us is on disk (the checkpoint is fsync'd). Skip the slow
  // teardown of the metrics HTTP server (civetweb stops in ~1 s) and of gRPC's globals.
  std::fflush(nullptr);
  std::_Exit(rc);
}

}  // namespace
}  // namespace fp4q::server

int main(int argc, char** argv) {
  // Before any thread starts: SIGTERM/SIGINT are taken with sigtimedwait by main only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "fp4q server: NVFP4/MXFP4 quantization, FP4 GEMM and named training state over gRPC.\n"
      "Usage: fp4qd [--listen HOST:PORT] [--metrics_listen HOST:PORT] [--backend auto|cpu|cuda]\n"
      "             [--state_dir DIR] [flags...]\n"
      "Prints 'fp4qd: listening on HOST:PORT' and 'fp4qd: metrics on HOST:PORT' on stdout.\n"
      "Exit codes: 0 clean shutdown, 1 failure, 2 poisoned device, 3 corrupt checkpoint.");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  fp4q::server::Logger log(absl::GetFlag(FLAGS_log_format) == "text"
                               ? fp4q::server::LogFormat::kText
                               : fp4q::server::LogFormat::kJson);
  fp4q::server::g_protobuf_logger = &log;
  google::protobuf::SetLogHandler(&fp4q::server::ProtobufLog);
  return fp4q::server::Run(log);
}
