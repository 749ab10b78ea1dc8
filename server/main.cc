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
// --ignore_corrupt_checkpoint, which renames it aside and starts empty), 4 when another fp4qd
// holds --state_dir. Everything but the flags is server.h's RunServer.
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "server/logging.h"
#include "server/server.h"

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
          "also serve every fp4q.v1 method but OpenSession on this Unix socket path "
          "(SOCK_SEQPACKET, one protobuf frame per message, no gRPC: see FastRequest in "
          "fp4q.proto); peers checked like --unix_socket; empty = off");
ABSL_FLAG(int32_t, fast_socket_spin_us, -1,
          "busy-poll each --fast_socket connection this long before sleeping (lower latency "
          "for a CPU core per busy connection); 0-1000000, or -1: automatic (twice the gap "
          "between the connection's last two requests when it was at most 2 ms, at most 2 "
          "connections at a time; never on the CPU backend or where fp4qd may use fewer than 8 "
          "CPUs)");
ABSL_FLAG(int32_t, fast_socket_max_connections, 64, "cap on open --fast_socket connections");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9450",
          "Prometheus /metrics address HOST:PORT; empty disables; port 0 picks one");
ABSL_FLAG(std::string, backend, "auto",
          "auto (CUDA when a GPU is usable, else CPU), cpu, or cuda (fail if none)");
ABSL_FLAG(std::string, cuda_module, "",
          "path of libfp4q_cuda.so (default: $FP4Q_CUDA_MODULE when set, else beside fp4qd, "
          "../lib, then the dynamic linker's path)");
ABSL_FLAG(std::string, cuda_row_kernels, "auto",
          "CUDA backend: auto (each quantization pass on the kernel "
          "kernels/src/cuda/kernel_choice.h picks) or rows (the general row kernel for every "
          "row-wise pass and the shared tiles for every row + column-wise one; for A/B "
          "measurements)");
ABSL_FLAG(int32_t, cuda_bf16_block_ctas, 3,
          "CUDA backend: CTAs per SM of the bf16 one-block-a-lane quantize kernel (3 or 4)");
ABSL_FLAG(int32_t, cuda_step_prefetch, 2,
          "CUDA backend: slots of 256 elements past those in a lane's shared-memory ring that "
          "each warp of the SGD step's kernels asks L2 for (0..16; 0 = none)");
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
ABSL_FLAG(int32_t, worker_spin_us, -1,
          "an idle device worker busy-polls this long for new work before sleeping (one per "
          "device at a time): saves a thread wake-up per request for a CPU core while requests "
          "keep coming; 0-1000000, or -1: automatic (twice the gap between the device's last "
          "two requests when it was at most 2 ms; never on the CPU backend or where fp4qd may "
          "use fewer than 8 CPUs)");
ABSL_FLAG(bool, idle_inline, true,
          "a fast socket request whose device has nothing queued or running runs on its "
          "connection's thread (on a CUDA stream of its own per GPU) instead of waking a device "
          "worker: saves that wake-up for a request that comes after an idle gap, such as a "
          "training loop's synchronous step; false: every request runs on a device worker");
ABSL_FLAG(int32_t, step_ready_timeout_ms, 5000,
          "the longest a Step polls its ready signal (the worker's gradients complete) before "
          "refusing with DEADLINE_EXCEEDED, and the wait of a request that names none; the "
          "device's other work waits meanwhile; 1-60000");
ABSL_FLAG(bool, step_device_signals, true,
          "CUDA backend: queue a Step behind device-side waits for its ready signals and write "
          "its done signals from the device (cuStreamWaitValue32 / cuStreamWriteValue32), so "
          "the GPU goes from the worker's backward pass to the step without the host; false: "
          "fp4qd polls and writes them from the host");
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
ABSL_FLAG(std::string, namespace_tokens_file, "",
          "file of lines \"NAMESPACE TOKEN\": a caller presenting TOKEN (where "
          "--auth_token_file's token travels) is bound to NAMESPACE and may open sessions of it "
          "only; empty = none");
ABSL_FLAG(int32_t, max_step_items, 4096, "most items in one Step request");
ABSL_FLAG(int32_t, max_step_plans, 16,
          "step plans (StepRequest.keep_plan) each session keeps; one more drops the least "
          "recently used; 0: none (keep_plan refused)");
ABSL_FLAG(int32_t, max_world_size, 64, "most ranks in one replica group (JoinGroup)");
ABSL_FLAG(uint64_t, cpu_max_request_flops, uint64_t{200000000000},
          "CPU backend: refuse a request whose work is estimated above this many "
          "multiply-adds (Matmul M*N*K) with RESOURCE_EXHAUSTED before it runs; 0 = no limit");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain (TLS on --listen)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key (with --tls_cert)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mTLS)");

namespace fp4q::server {
namespace {

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

ServerOptions OptionsFromFlags() {
  ServerOptions o;
  o.version = FP4Q_VERSION;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.unix_socket = absl::GetFlag(FLAGS_unix_socket);
  o.unix_socket_allowed_uids = absl::GetFlag(FLAGS_unix_socket_allowed_uids);
  o.fast_socket = absl::GetFlag(FLAGS_fast_socket);
  o.fast_socket_spin_us = absl::GetFlag(FLAGS_fast_socket_spin_us);
  o.fast_socket_max_connections = absl::GetFlag(FLAGS_fast_socket_max_connections);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.namespace_tokens_file = absl::GetFlag(FLAGS_namespace_tokens_file);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.cuda_module = absl::GetFlag(FLAGS_cuda_module);
  if (const char* env = std::getenv("FP4Q_CUDA_MODULE"); o.cuda_module.empty() && env != nullptr) {
    o.cuda_module = env;
  }
  o.cuda_row_kernels = absl::GetFlag(FLAGS_cuda_row_kernels);
  o.cuda_bf16_block_ctas = absl::GetFlag(FLAGS_cuda_bf16_block_ctas);
  o.cuda_step_prefetch = absl::GetFlag(FLAGS_cuda_step_prefetch);
  o.ignore_corrupt_checkpoint = absl::GetFlag(FLAGS_ignore_corrupt_checkpoint);
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  EngineOptions& e = o.engine;
  e.state_budget_bytes = absl::GetFlag(FLAGS_state_budget_bytes);
  e.max_queue_depth = absl::GetFlag(FLAGS_max_queue_depth);
  e.cpu_workers = absl::GetFlag(FLAGS_workers);
  e.streams_per_gpu = absl::GetFlag(FLAGS_streams_per_gpu);
  const int32_t worker_spin_us = absl::GetFlag(FLAGS_worker_spin_us);
  if (worker_spin_us == -1) {
    e.worker_spin = std::nullopt;  // automatic
  } else {
    e.worker_spin = absl::Microseconds(worker_spin_us);  // ValidateServerOptions checks it
  }
  e.idle_inline = absl::GetFlag(FLAGS_idle_inline);
  e.step_ready_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_step_ready_timeout_ms));
  e.step_device_signals = absl::GetFlag(FLAGS_step_device_signals);
  const int64_t scratch_mb = absl::GetFlag(FLAGS_scratch_cache_mb);
  e.scratch_cache_bytes = scratch_mb < 0 || scratch_mb > (int64_t{1} << 20)
                              ? ~uint64_t{0}  // refused by ValidateServerOptions
                              : static_cast<uint64_t>(scratch_mb) << 20;
  e.max_open_handles = absl::GetFlag(FLAGS_max_open_handles);
  e.session_lease = absl::Seconds(absl::GetFlag(FLAGS_session_lease_s));
  e.allow_cuda_ipc = absl::GetFlag(FLAGS_allow_cuda_ipc);
  e.cuda_ipc_over_tcp = absl::GetFlag(FLAGS_cuda_ipc_over_tcp);
  e.state_dir = absl::GetFlag(FLAGS_state_dir);
  e.checkpoint_interval = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  e.quality_sample_every = absl::GetFlag(FLAGS_quality_sample_every);
  e.max_step_items = absl::GetFlag(FLAGS_max_step_items);
  e.max_step_plans = absl::GetFlag(FLAGS_max_step_plans);
  e.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  e.cpu_max_request_flops = absl::GetFlag(FLAGS_cpu_max_request_flops);
  e.version = FP4Q_VERSION;
  return o;
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
      "fp4q server: 4-bit (NVFP4) stored weights and their optimizer step, NVFP4/MXFP4\n"
      "quantization and FP4 GEMM, over gRPC and the fast socket.\n"
      "Usage: fp4qd [--listen HOST:PORT] [--metrics_listen HOST:PORT] [--backend auto|cpu|cuda]\n"
      "             [--state_dir DIR] [flags...]\n"
      "Prints 'fp4qd: listening on HOST:PORT' and 'fp4qd: metrics on HOST:PORT' on stdout.\n"
      "Exit codes: 0 clean shutdown, 1 failure, 2 poisoned device, 3 corrupt checkpoint,\n"
      "4 state directory held by another fp4qd.");
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
  if (const std::string f = absl::GetFlag(FLAGS_log_format); f != "json" && f != "text") {
    log.Error("bad flag", {{"error", absl::StrCat("--log_format: '", f, "' is not json or text")}});
    return fp4q::server::kExitFailure;
  }
  return fp4q::server::RunServer(fp4q::server::OptionsFromFlags(), log);
}
