// The fast socket: fp4q.v1 tensor calls over a SOCK_SEQPACKET Unix socket, without gRPC.
//
// Why: on the H200 VM a gRPC unary round trip alone costs 90-130 us (HTTP/2 framing and
// several thread hand-offs per call inside gRPC), more than the whole budget of an IPC call
// beyond its kernel. Here a call is one sendmsg, the engine's work, and one sendmsg back.
// The wire format is in proto/fp4q/v1/fp4q.proto ("the fast socket"): one message is one
// frame, a FastRequest (method name + serialized request) or FastReply of at most
// kMaxFrameBytes. Calls go through the call layer (call_layer.h) exactly as gRPC's do: the
// same op table, authentication, metrics, errors and reply header.
//
// Contract
// - Create binds `path` (ListenUnix; mode 0600 when only fp4qd's own uid is allowed) and Start
//   accepts. Each connection's uid is checked at accept against `allowed_uids`; a refused or
//   surplus connection (more than max_connections) is closed at once and logged.
// - One thread per connection reads frames and hands each call to the call layer. The
//   engine's completion sends the reply itself from its thread (non-blocking; when the peer's
//   queue is full the reply waits in the connection's outbox, flushed by the connection thread).
// - At most max_in_flight calls per connection are started and not yet answered; beyond that
//   the connection thread stops reading (back-pressure, no error).
// - The first frame must be a hello naming an open session (and a bearer token the call layer
//   accepts, when one is configured); until then every call is FAILED_PRECONDITION.
//   Undecodable, oversized or empty frames get INVALID_ARGUMENT and the connection stays usable
//   (a zero-byte frame is told from the peer's close by RDHUP).
// - Replies are at most kMaxFrameBytes: the call layer refuses state-changing calls whose
//   inline outputs could not fit before they run, and answers others over the limit with
//   RESOURCE_EXHAUSTED.
// - A heads-up frame (FastRequest.heads_up_micros) gets no reply: the connection's thread
//   busy-polls for the next frame until then (heads_up_limit_micros() at most; 0 where the
//   spin policy never spins, and the frame is then INVALID_ARGUMENT like any bad field).
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
#include "fp4q/v1/fp4q.pb.h"
#include "server/call_layer.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/spin_policy.h"

namespace fp4q::server {

struct FastSocketOptions {
  std::string path;
  std::set<uid_t> allowed_uids;  // must not be empty
  int max_connections = 64;
  int max_in_flight = 64;  // per connection
  // Busy-poll the connection for this long before sleeping in poll(): trades a CPU core per
  // busy connection for the wake-up latency of the reading thread. Zero: always sleep. Unset:
  // automatic (spin_policy.h: twice the last gap between two of the connection's frames when it
  // was at most 2 ms), for at most kMaxAutoSpinners connections at a time.
  std::optional<absl::Duration> spin = absl::ZeroDuration();
  // The CPUs fp4qd may use, for the automatic spin (SpinPolicy; 0: UsableCpus()).
  int usable_cpus = 0;
};

class FastSocketServer {
 public:
  static constexpr size_t kMaxFrameBytes = v1::FAST_SOCKET_MAX_FRAME_BYTES;
  // Connections busy-polling at once under the automatic spin (a fixed spin has no such cap:
  // the operator gave the cores).
  static constexpr int kMaxAutoSpinners = 2;
  // The longest heads-up (FastRequest.heads_up_micros) taken where the threads may spin.
  static constexpr uint32_t kMaxHeadsUpMicros = 2000;

  // The heads-up limit ServerInfo reports (limits.fast_socket_max_heads_up_micros) for a fast
  // socket with this spin: kMaxHeadsUpMicros where its threads may busy-poll (SpinPolicy), else 0.
  static uint32_t HeadsUpLimitMicros(const std::optional<absl::Duration>& spin, int usable_cpus);

  // `layer`, `metrics` (may be null) and `logger` are not owned and outlive the server.
  static absl::StatusOr<std::unique_ptr<FastSocketServer>> Create(CallLayer* layer,
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
  // Frames a busy-polling connection thread read without a wake-up.
  int64_t spin_pickups() const { return spin_pickups_.load(); }
  // Heads-ups taken (FastRequest.heads_up_micros).
  int64_t heads_ups() const { return heads_ups_.load(); }
  // Times another thread woke a connection's thread when its last call was answered or a call
  // slot freed up (a call answered on the connection's own thread wakes nobody).
  int64_t release_wakeups() const { return release_wakeups_.load(); }
  uint32_t heads_up_limit_micros() const { return heads_up_limit_micros_; }
  const std::string& path() const { return options_.path; }

 private:
  class Connection;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  FastSocketServer(CallLayer* layer, Metrics* metrics, FastSocketOptions options, Logger* logger)
      : layer_(layer),
        metrics_(metrics),
        options_(std::move(options)),
        logger_(logger),
        heads_up_limit_micros_(HeadsUpLimitMicros(options_.spin, options_.usable_cpus)) {}
  void AcceptLoop();
  void Accept(int fd);
  void Refuse(int fd, absl::string_view why, const std::optional<PeerInfo>& peer);
  void ReapFinished();

  CallLayer* const layer_;
  Metrics* const metrics_;
  const FastSocketOptions options_;
  Logger* const logger_;
  const uint32_t heads_up_limit_micros_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd, written once by Stop: readable for every poll() from then on
  std::thread accept_thread_;
  std::list<Worker> workers_;  // accept thread only, until Stop joins them
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> open_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int> auto_spinners_{0};  // connections busy-polling under the automatic spin
  std::atomic<int64_t> spin_pickups_{0};
  std::atomic<int64_t> heads_ups_{0};
  std::atomic<int64_t> release_wakeups_{0};
  absl::Time last_refusal_log_ = absl::InfinitePast();  // accept thread only
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_FAST_SOCKET_H_
