// The fast socket: fp4q.v1 tensor calls over a SOCK_SEQPACKET Unix socket, without gRPC.
//
// Why: on the H200 VM a gRPC unary round trip alone costs 90-130 us (HTTP/2 framing and
// several thread hand-offs per call inside gRPC), more than the whole budget of an IPC call
// beyond its kernel. Here a call is one sendmsg, the engine's work, and one sendmsg back.
// The wire format is in proto/fp4q/v1/fp4q.proto ("the fast socket"): one message is one
// frame, a FastRequest or FastReply of at most kMaxFrameBytes.
//
// Contract
// - Create binds `path` (ListenUnix; mode 0600 when only fp4qd's own uid is allowed) and Start
//   accepts. Each connection's uid is checked at accept against `allowed_uids`; a refused or
//   surplus connection (more than max_connections) is closed at once and logged.
// - One thread per connection reads frames and hands each call to the engine, exactly as the
//   gRPC adapter does (same conversions, validation, metrics under the same method names). The
//   engine's completion sends the reply itself from its thread (non-blocking; when the peer's
//   queue is full the reply waits in the connection's outbox, flushed by the connection thread).
// - At most max_in_flight calls per connection are started and not yet answered; beyond that
//   the connection thread stops reading (back-pressure, no error).
// - The first frame must be a hello naming an open session (and the bearer token when
//   `auth_token` is set); until then every call is FAILED_PRECONDITION. Undecodable, oversized
//   or empty frames get INVALID_ARGUMENT and the connection stays usable (a zero-byte frame is
//   told from the peer's close by RDHUP).
// - Replies are at most kMaxFrameBytes: a bigger one becomes RESOURCE_EXHAUSTED. Calls that
//   change state (UpdateWeight returning DQ(W) inline, Qdq with a residual key and an inline
//   output) are refused with that code before they run when their inline output cannot fit,
//   so no step is applied without its reply.
// - A closed connection cancels its calls that have not started; its thread waits for the rest
//   before closing the fd. Stop stops accepting, closes every connection and joins the threads;
//   the engine must still be running then. Thread-safe.
#ifndef FP4Q_SERVER_FAST_SOCKET_H_
#define FP4Q_SERVER_FAST_SOCKET_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine.h"
#include "server/logging.h"
#include "server/metrics.h"

namespace fp4q::server {

struct FastSocketOptions {
  std::string path;
  std::set<uid_t> allowed_uids;  // must not be empty
  std::string auth_token;        // empty: hello needs none
  int max_connections = 64;
  int max_in_flight = 64;  // per connection
  uint64_t max_message_bytes = uint64_t{512} << 20;  // fp4qd's gRPC limit, for ServerInfo
  // Busy-poll the connection for this long before sleeping in poll(): trades a CPU core per
  // busy connection for the wake-up latency of the reading thread. Zero: always sleep.
  absl::Duration spin = absl::ZeroDuration();
};

class FastSocketServer {
 public:
  static constexpr size_t kMaxFrameBytes = 65536;

  // `engine`, `metrics` (may be null) and `logger` are not owned and outlive the server.
  static absl::StatusOr<std::unique_ptr<FastSocketServer>> Create(Engine* engine,
                                                                   Metrics* metrics,
                                                                   FastSocketOptions options,
                                                                   Logger* logger);
  ~FastSocketServer();  // Stop(); removes the socket file
  FastSocketServer(const FastSocketServer&) = delete;
  FastSocketServer& operator=(const FastSocketServer&) = delete;

  void Start();
  void Stop();

  int64_t connections() const { return open_.load(); }
  int64_t refused() const { return refused_.load(); }
  const std::string& path() const { return options_.path; }

 private:
  class Connection;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  FastSocketServer(Engine* engine, Metrics* metrics, FastSocketOptions options, Logger* logger)
      : engine_(engine), metrics_(metrics), options_(std::move(options)), logger_(logger) {}
  void AcceptLoop();
  void Accept(int fd);
  void Refuse(int fd, absl::string_view why, const std::optional<PeerInfo>& peer);
  void ReapFinished();

  Engine* const engine_;
  Metrics* const metrics_;
  const FastSocketOptions options_;
  Logger* const logger_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd, written once by Stop: readable for every poll() from then on
  std::thread accept_thread_;
  std::list<Worker> workers_;  // accept thread only, until Stop joins them
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> refused_{0};
  absl::Time last_refusal_log_ = absl::InfinitePast();  // accept thread only
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_FAST_SOCKET_H_
