#include "server/server.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/call_layer.h"
#include "server/checkpoint.h"
#include "server/devices.h"
#include "server/fast_socket.h"
#include "server/grpc_service.h"
#include "server/metrics.h"
#include "server/request_checks.h"
#include "server/spin_policy.h"
#include "server/unix_listener.h"

namespace fp4q::server {
namespace {

std::atomic<bool> g_poisoned{false};

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

absl::Status InRange(int64_t v, int64_t lo, int64_t hi, absl::string_view flag) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": ", v, " is not in [", lo, ", ", hi, "]"));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const ServerOptions& o) {
  if (o.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadFile(o.tls_cert, "tls_cert");
  absl::StatusOr<std::string> key = ReadFile(o.tls_key, "tls_key");
  if (!cert.ok()) return cert.status();
  if (!key.ok()) return key.status();
  pair.cert_chain = *cert;
  pair.private_key = *key;
  grpc::SslServerCredentialsOptions options(
      o.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!o.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(o.tls_client_ca, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  options.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(options);
}

// The call layer's options from the token files.
absl::StatusOr<CallLayerOptions> LayerOptions(const ServerOptions& o) {
  CallLayerOptions c;
  c.max_message_bytes = static_cast<uint64_t>(o.max_message_bytes);
  c.fast_socket_frame_bytes = o.fast_socket.empty() ? 0 : v1::FAST_SOCKET_MAX_FRAME_BYTES;
  if (!o.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(o.auth_token_file, "auth_token_file");
    if (!token.ok()) return token.status();
    c.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (c.auth_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_token_file: ", o.auth_token_file, " is empty"));
    }
  }
  if (!o.namespace_tokens_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(o.namespace_tokens_file, "namespace_tokens_file");
    if (!text.ok()) return text.status();
    int line_no = 0;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      ++line_no;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      std::vector<absl::string_view> parts =
          absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--namespace_tokens_file: line ", line_no,
                         " is not \"NAMESPACE TOKEN\" (two fields)"));
      }
      const std::string field =
          absl::StrCat("--namespace_tokens_file: line ", line_no, ": namespace");
      if (absl::Status s = CheckNamespace(parts[0], field); !s.ok() || parts[0].empty()) {
        return s.ok() ? absl::InvalidArgumentError(absl::StrCat(
                            "--namespace_tokens_file: line ", line_no, ": namespace is empty"))
                      : s;
      }
      if (!c.namespace_tokens.emplace(std::string(parts[1]), std::string(parts[0])).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--namespace_tokens_file: line ", line_no, ": the token is listed twice"));
      }
    }
  }
  return c;
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

// Creates the engine and restores its checkpoint; an exit code on failure (logged).
absl::StatusOr<std::unique_ptr<Engine>> OpenEngine(const ServerOptions& o, Metrics* metrics,
                                                   std::unique_ptr<DeviceSet> devices,
                                                   Logger& log, int* exit_code) {
  *exit_code = kExitFailure;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(devices), o.engine, metrics, &log);
  if (!engine.ok()) {
    log.Error("engine", {{"error", engine.status().ToString()}});
    return engine.status();
  }
  absl::Status s = (*engine)->Restore();
  if (s.ok()) return engine;
  if (!absl::IsDataLoss(s)) return s;  // logged by Restore
  *exit_code = kExitCorruptCheckpoint;
  if (!o.ignore_corrupt_checkpoint) return s;
  const std::string path = absl::StrCat(o.engine.state_dir, "/", kCheckpointFileName);
  const std::string aside = absl::StrCat(path, ".corrupt-", absl::ToUnixSeconds(absl::Now()));
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    log.Error("cannot rename the corrupt checkpoint aside",
              {{"file", path}, {"error", std::strerror(errno)}});
    return s;
  }
  log.Warning("corrupt checkpoint renamed aside; starting empty", {{"file", aside}});
  return engine;
}

// Every listener of a running server, in start order.
struct Listeners {
  std::unique_ptr<UnixListener> unix_listener;
  std::unique_ptr<FastSocketServer> fast_socket;
  std::unique_ptr<GrpcService> service;
  std::unique_ptr<grpc::Server> grpc_server;
  int port = 0;
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
};

// How an fp4qd thread waits for work, for the start-up log: `spin` a fixed spin (zero: none), or
// unset, automatic.
std::string SpinDescription(std::optional<absl::Duration> spin, bool cpu_backend) {
  if (spin.has_value() && *spin > absl::ZeroDuration()) {
    return absl::StrCat("busy-polls ", absl::FormatDuration(*spin));
  }
  if (spin.has_value()) return "sleeps";
  if (cpu_backend) return "sleeps (automatic: never on the CPU backend)";
  const int cpus = UsableCpus();
  if (cpus < SpinPolicy::kAutoMinThreads) {
    return absl::StrCat("sleeps (automatic: never below ", SpinPolicy::kAutoMinThreads,
                        " usable CPUs; fp4qd may use ", cpus, ")");
  }
  return "automatic (busy-polls for a caller back within 2 ms)";
}

// --fast_socket_spin_us: -1 is automatic (unset).
std::optional<absl::Duration> FastSpinFlag(const ServerOptions& o) {
  if (o.fast_socket_spin_us < 0) return std::nullopt;
  return absl::Microseconds(o.fast_socket_spin_us);
}

// The fast socket's spin: the flag's, where automatic never on the CPU backend.
std::optional<absl::Duration> FastSpin(const ServerOptions& o, bool cpu_backend) {
  const std::optional<absl::Duration> spin = FastSpinFlag(o);
  return spin.has_value() || !cpu_backend ? spin : absl::ZeroDuration();
}

// `cpu_backend`: the devices are the CPU backend's (no automatic spin: its workers need the cores).
absl::Status StartListeners(const ServerOptions& o, bool cpu_backend, CallLayer* layer,
                            Metrics* metrics, std::shared_ptr<prometheus::Registry> registry,
                            Logger& log, Listeners* l) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = TcpCredentials(o);
  if (!creds.ok()) return creds.status();
  std::set<uid_t> allowed = {::geteuid()};
  if (!o.unix_socket_allowed_uids.empty()) {
    absl::StatusOr<std::set<uid_t>> parsed =
        ParseUidList(o.unix_socket_allowed_uids, "unix_socket_allowed_uids");
    if (!parsed.ok()) return parsed.status();
    allowed = *std::move(parsed);
  }
  // The Unix socket: fp4qd accepts on it itself to check each peer's uid (unix_listener.h).
  if (!o.unix_socket.empty()) {
    absl::StatusOr<std::unique_ptr<UnixListener>> u =
        UnixListener::Create(o.unix_socket, allowed, &log);
    if (!u.ok()) return u.status();
    l->unix_listener = *std::move(u);
  }
  const std::optional<absl::Duration> fast_spin = FastSpinFlag(o);
  if (!o.fast_socket.empty()) {
    FastSocketOptions fo;
    fo.path = o.fast_socket;
    fo.allowed_uids = allowed;
    fo.max_connections = o.fast_socket_max_connections;
    fo.spin = FastSpin(o, cpu_backend);
    absl::StatusOr<std::unique_ptr<FastSocketServer>> f =
        FastSocketServer::Create(layer, metrics, std::move(fo), &log);
    if (!f.ok()) return f.status();
    l->fast_socket = *std::move(f);
  }
  GrpcServiceOptions go;
  go.max_message_bytes = static_cast<uint64_t>(o.max_message_bytes);
  if (l->unix_listener != nullptr) {
    UnixListener* u = l->unix_listener.get();
    go.peer_lookup = [u](absl::string_view peer) { return u->Find(peer); };
  }
  l->service = std::make_unique<GrpcService>(layer, std::move(go));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, *creds, &l->port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  l->service->RegisterOn(&builder);
  l->grpc_server = builder.BuildAndStart();
  if (l->grpc_server == nullptr || l->port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", o.listen));
  }
  if (!o.metrics_listen.empty()) {
    absl::StatusOr<MetricsExposer> exposer = StartExposer(o.metrics_listen, registry);
    if (!exposer.ok()) return exposer.status();
    l->exposer = std::move(exposer->exposer);
    l->metrics_port = exposer->port;
  }
  // Started last: no early return can leave them running.
  if (l->unix_listener != nullptr) {
    l->unix_listener->Start(l->grpc_server.get());
    log.Info("listening on a Unix socket", {{"path", o.unix_socket}});
  }
  if (l->fast_socket != nullptr) {
    l->fast_socket->Start();
    log.Info("listening on the fast socket",
             {{"path", l->fast_socket->path()},
              {"spin", SpinDescription(fast_spin, cpu_backend)},
              {"heads_up_max_us", absl::StrCat(l->fast_socket->heads_up_limit_micros())}});
  }
  return absl::OkStatus();
}

// Waits for SIGTERM / SIGINT (blocked in every thread) or a poisoned device; the signal.
int WaitForStop() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  while (!g_poisoned.load()) {
    const timespec tick{0, 200 * 1000 * 1000};
    const int signal_number = sigtimedwait(&signals, nullptr, &tick);
    if (signal_number > 0) return signal_number;
  }
  return 0;
}

}  // namespace

absl::Status ValidateServerOptions(const ServerOptions& o) {
  const EngineOptions& e = o.engine;
  absl::Status s = InRange(o.max_message_bytes, 1, INT32_MAX, "max_message_bytes");
  if (s.ok()) s = InRange(e.max_queue_depth, 1, INT32_MAX, "max_queue_depth");
  if (s.ok()) s = InRange(e.cpu_workers, 0, 4096, "workers");
  if (s.ok()) s = InRange(e.streams_per_gpu, 1, 64, "streams_per_gpu");
  if (s.ok()) {
    s = e.worker_spin.has_value()
            ? InRange(absl::ToInt64Microseconds(*e.worker_spin), -1, 1000000, "worker_spin_us")
            : absl::OkStatus();
  }
  if (s.ok()) {
    s = InRange(absl::ToInt64Milliseconds(e.step_ready_timeout), 1, 60000,
                "step_ready_timeout_ms");
  }
  if (s.ok()) s = InRange(o.fast_socket_spin_us, -1, 1000000, "fast_socket_spin_us");
  if (s.ok()) s = InRange(o.fast_socket_max_connections, 1, 65536, "fast_socket_max_connections");
  if (s.ok()) {
    s = InRange(static_cast<int64_t>(e.scratch_cache_bytes >> 20), 0, int64_t{1} << 20,
                "scratch_cache_mb");
  }
  if (s.ok()) s = InRange(e.max_open_handles, 1, INT32_MAX, "max_open_handles");
  if (s.ok()) {
    s = InRange(absl::ToInt64Seconds(e.session_lease), 1, int64_t{1} << 31, "session_lease_s");
  }
  if (s.ok()) {
    s = InRange(absl::ToInt64Seconds(e.checkpoint_interval), 0, int64_t{1} << 31,
                "checkpoint_interval_s");
  }
  if (s.ok()) s = InRange(o.drain_timeout_s, 0, int64_t{1} << 31, "drain_timeout_s");
  if (s.ok()) s = InRange(e.quality_sample_every, 0, INT32_MAX, "quality_sample_every");
  if (s.ok()) s = InRange(e.max_step_items, 1, 1 << 20, "max_step_items");
  if (s.ok()) s = InRange(e.max_step_plans, 0, 1024, "max_step_plans");
  if (s.ok()) s = InRange(e.max_world_size, 1, 1024, "max_world_size");
  if (!s.ok()) return s;
  if (o.cuda_row_kernels != "auto" && o.cuda_row_kernels != "rows") {
    return absl::InvalidArgumentError(absl::StrCat("--cuda_row_kernels: '", o.cuda_row_kernels,
                                                   "' is not auto or rows"));
  }
  if (o.cuda_bf16_block_ctas != 3 && o.cuda_bf16_block_ctas != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_bf16_block_ctas: ", o.cuda_bf16_block_ctas, " is not 3 or 4"));
  }
  if (o.cuda_step_prefetch < 0 || o.cuda_step_prefetch > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_step_prefetch: ", o.cuda_step_prefetch, " is not in [0, 16]"));
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
  }
  if (!e.state_dir.empty()) {
    struct stat st;
    if (::stat(e.state_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--state_dir: ", e.state_dir, " is not an existing directory"));
    }
  }
  return absl::OkStatus();
}

int RunServer(const ServerOptions& o, Logger& log) {
  if (absl::Status s = ValidateServerOptions(o); !s.ok()) {
    log.Error("bad flag", {{"error", s.ToString()}});
    return kExitFailure;
  }
  absl::StatusOr<CallLayerOptions> layer_options = LayerOptions(o);
  if (!layer_options.ok()) {
    log.Error("bad flag", {{"error", layer_options.status().ToString()}});
    return kExitFailure;
  }

  // One fp4qd per state directory, locked before anything is restored (held until exit).
  std::unique_ptr<StateDirLock> state_lock;
  if (!o.engine.state_dir.empty()) {
    absl::StatusOr<std::unique_ptr<StateDirLock>> lock = LockStateDir(o.engine.state_dir);
    if (!lock.ok()) {
      log.Error("state directory", {{"error", lock.status().ToString()}});
      return IsStateDirLocked(lock.status()) ? kExitStateDirLocked : kExitFailure;
    }
    state_lock = *std::move(lock);
  }

  DeviceSetOptions device_options;
  device_options.backend = o.backend;
  device_options.cuda_module = o.cuda_module;
  device_options.cuda.rows_only = o.cuda_row_kernels == "rows";
  device_options.cuda.bf16_block_ctas = o.cuda_bf16_block_ctas;
  device_options.cuda.step_prefetch_slots = o.cuda_step_prefetch;
  absl::StatusOr<std::unique_ptr<DeviceSet>> devices = DeviceSet::Create(device_options);
  if (!devices.ok()) {
    log.Error("no backend", {{"backend", o.backend}, {"error", devices.status().ToString()}});
    return kExitFailure;
  }
  if (!(*devices)->fallback_reason().empty()) {
    log.Info("backend auto: CUDA unavailable, serving on the CPU backend",
             {{"reason", (*devices)->fallback_reason()}});
  }
  for (int i = 0; i < (*devices)->size(); ++i) {
    const Device& d = (*devices)->device(i);
    log.Info("device", {{"backend", d.info.backend},
                        {"uuid", d.label},
                        {"name", d.info.name},
                        {"step_signals", d.backend->DeviceSignals() && o.engine.step_device_signals
                                             ? "device"
                                             : "host"}});
  }
  const std::string backend_kind = (*devices)->kind();

  auto registry = std::make_shared<prometheus::Registry>();
  Metrics metrics(*registry, o.version, backend_kind);
  int exit_code = kExitFailure;
  absl::StatusOr<std::unique_ptr<Engine>> engine_or =
      OpenEngine(o, &metrics, std::move(*devices), log, &exit_code);
  if (!engine_or.ok()) return exit_code;
  Engine& engine = **engine_or;

  if (!o.fast_socket.empty()) {
    layer_options->fast_socket_heads_up_micros =
        FastSocketServer::HeadsUpLimitMicros(FastSpin(o, backend_kind == "cpu"), 0);
  }
  CallLayer layer(&engine, &metrics, *std::move(layer_options));
  Listeners l;
  if (absl::Status s =
          StartListeners(o, backend_kind == "cpu", &layer, &metrics, registry, log, &l);
      !s.ok()) {
    log.Error("cannot listen", {{"error", s.ToString()}});
    if (l.grpc_server != nullptr) l.grpc_server->Shutdown();
    return kExitFailure;
  }
  engine.SetPoisonHandler([](const absl::Status&) { g_poisoned.store(true); });
  engine.StartMaintenance();
  // Ready (health and fp4q_ready) before the address lines tell anyone the server is up.
  SetHealth(l.grpc_server.get(), &metrics, /*live=*/true, /*ready=*/true);
  PrintAddress("listening", HostOf(o.listen), l.port);
  if (l.exposer != nullptr) PrintAddress("metrics", HostOf(o.metrics_listen), l.metrics_port);
  log.Info("serving", {{"listen", absl::StrCat(HostOf(o.listen), ":", l.port)},
                       {"backend", backend_kind},
                       {"worker_spin",
                        SpinDescription(o.engine.worker_spin, backend_kind == "cpu")},
                       {"version", o.version},
                       {"epoch", absl::StrCat(engine.epoch())}});

  const int signal_number = WaitForStop();
  if (g_poisoned.load()) {
    SetHealth(l.grpc_server.get(), &metrics, /*live=*/false, /*ready=*/false);
    log.Error("exiting: a device is poisoned; the orchestrator should restart fp4qd",
              {{"error", engine.poisoned().ToString()}});
    absl::SleepFor(absl::Seconds(1));  // let probes observe NOT_SERVING
    std::fflush(nullptr);
    std::_Exit(kExitPoisoned);  // device state is unusable; no orderly teardown
  }

  log.Info("draining",
           {{"signal", strsignal(signal_number)}, {"in_flight", absl::StrCat(engine.in_flight())}});
  SetHealth(l.grpc_server.get(), &metrics, /*live=*/true, /*ready=*/false);
  engine.BeginDrain();
  if (!engine.WaitIdle(absl::Seconds(o.drain_timeout_s))) {
    const int refused = engine.RejectQueued();
    log.Warning(
        "drain timeout: queued work refused",
        {{"in_flight", absl::StrCat(engine.in_flight())}, {"refused", absl::StrCat(refused)}});
  }
  int rc = 0;
  if (!o.engine.state_dir.empty()) {
    absl::StatusOr<CheckpointStats> c = engine.CheckpointNow();
    if (!c.ok()) rc = kExitFailure;  // logged by CheckpointNow
  }
  if (l.unix_listener != nullptr) l.unix_listener->Stop();
  if (l.fast_socket != nullptr) l.fast_socket->Stop();  // its calls in flight finish first
  l.grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.Shutdown();
  log.Info("stopped", {{"exit_code", absl::StrCat(rc)}});
  // Everything that must outlive us is on disk (the checkpoint is fsync'd). Skip the slow
  // teardown of the metrics HTTP server (civetweb stops in ~1 s) and of gRPC's globals.
  std::fflush(nullptr);
  std::_Exit(rc);
}

}  // namespace fp4q::server
