// fp4qd as a library: every setting of the server in one struct, and the function that runs
// it from start to exit. main.cc turns flags into ServerOptions; tests may build one directly.
//
// RunServer's life: validate the options, open the devices, create and restore the engine,
// start the listeners (gRPC on TCP, the Unix socket, the fast socket, /metrics), print the two
// address lines on stdout, serve until SIGTERM/SIGINT (blocked by the caller in every thread)
// or a poisoned device, then drain, checkpoint and stop. It returns the process's exit code
// (see docs/DESIGN.md "Server flags": 0, 1 failure, 2 poisoned device, 3 corrupt checkpoint,
// 4 state directory held by another fp4qd); a poisoned device exits the process at once.
#ifndef FP4Q_SERVER_SERVER_H_
#define FP4Q_SERVER_SERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/engine.h"
#include "server/logging.h"
#include "server/state_dir.h"

namespace fp4q::server {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitPoisoned = 2;
inline constexpr int kExitCorruptCheckpoint = 3;
// kExitStateDirLocked (4): state_dir.h.

struct ServerOptions {
  std::string version = "0.0.0";
  // Listeners.
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks one
  std::string unix_socket;                 // empty: none
  std::string unix_socket_allowed_uids;    // comma-separated; empty: fp4qd's own uid
  std::string fast_socket;                 // empty: none
  int fast_socket_spin_us = -1;  // -1: automatic (FastSocketOptions::spin unset)
  int fast_socket_max_connections = 64;
  std::string metrics_listen = "127.0.0.1:9450";  // empty: none
  int64_t max_message_bytes = 536870912;
  // Security.
  std::string auth_token_file;
  std::string namespace_tokens_file;  // lines "NAMESPACE TOKEN"
  std::string tls_cert, tls_key, tls_client_ca;
  // Devices and the engine.
  std::string backend = "auto";
  std::string cuda_module;              // empty: CudaModule's search
  std::string cuda_row_kernels = "auto";  // "auto" or "rows" (kernel_choice.h)
  int cuda_bf16_block_ctas = 3;
  int cuda_step_prefetch = 2;  // slots ahead the step kernels prefetch (0..16)
  EngineOptions engine;
  bool ignore_corrupt_checkpoint = false;
  int64_t drain_timeout_s = 30;
};

// Checks every option that RunServer would otherwise trip over (ranges, pairs that go together,
// the state directory): INVALID_ARGUMENT naming the flag.
absl::Status ValidateServerOptions(const ServerOptions& options);

// Runs fp4qd; returns its exit code. SIGTERM and SIGINT must be blocked in every thread.
int RunServer(const ServerOptions& options, Logger& log);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_SERVER_H_
