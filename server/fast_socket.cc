#include "server/fast_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/v1/fp4q.pb.h"
#include "server/unix_listener.h"

namespace fp4q::server {
namespace {

// A deadline further out than this is refused rather than risk overflowing absl::Time math.
constexpr uint64_t kMaxTimeoutMicros = uint64_t{86400} * 1000 * 1000;  // one day

void Poke(int fd) {
  const uint64_t one = 1;
  // An eventfd write fails only when the counter would overflow; it is then readable anyway.
  if (::write(fd, &one, sizeof(one)) < 0) return;
}

void Drain(int fd) {
  uint64_t v = 0;
  while (::read(fd, &v, sizeof(v)) > 0) {
  }
}

}  // namespace

class FastSocketServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(FastSocketServer* server, int fd, int wake_fd, PeerInfo peer)
      : server_(server),
        fd_(fd),
        wake_fd_(wake_fd),
        peer_(peer),
        spin_(server->options_.spin, server->options_.usable_cpus) {}
  ~Connection() {
    ::close(fd_);
    ::close(wake_fd_);
  }

  // The connection's thread: reads frames until the peer closes or the server stops, then
  // waits for its calls in flight.
  void Run(int stop_fd);

 private:
  enum class Read { kFrame, kNone, kClosed };
  Read ReadFrame(std::vector<char>* buf);
  void HandleFrame(const char* data, size_t n, size_t real_size);
  // A heads-up frame: checked, then the next wait busy-polls until `arrival` + its time.
  void HeadsUp(const v1::FastRequest& req, std::chrono::steady_clock::time_point arrival);
  void Hello(const v1::FastRequest& req, std::chrono::steady_clock::time_point arrival);
  // Hands a call to the call layer; the completion replies from the engine's thread.
  void Start(const v1::FastRequest& req, std::chrono::steady_clock::time_point arrival);
  void ReplyError(uint64_t call_id, const absl::Status& status, const char* rpc);
  // Sends (or queues) one reply; `counted`: it answers a call counted in in_flight_.
  void Send(const v1::FastReply& reply, bool counted);
  void FlushLocked();  // mu_ held
  void ReleaseLocked(bool counted);

  FastSocketServer* const server_;
  const int fd_;
  const int wake_fd_;  // eventfd: the outbox has replies, or a call slot freed up
  const PeerInfo peer_;
  SpinPolicy spin_;  // connection thread only, but for Budget's reads
  std::thread::id thread_;  // the connection's thread: set by Run before it reads a frame
  // Until when a heads-up asked this thread to busy-poll (connection thread only).
  std::chrono::steady_clock::time_point heads_up_until_{};
  std::string session_id_;  // bound by hello; connection thread only
  std::string bound_namespace_;  // the namespace the hello's token binds (with namespace_bound_)
  bool namespace_bound_ = false;

  std::mutex mu_;
  std::condition_variable idle_cv_;
  struct Pending {
    std::string bytes;
    bool counted;
  };
  std::deque<Pending> outbox_;  // replies the socket would not take yet (mu_)
  int in_flight_ = 0;           // calls started and not yet answered (mu_)
  bool closed_ = false;         // no more sends (mu_)
  std::atomic<bool> gone_{false};  // the connection ended: calls not started are cancelled
};

void FastSocketServer::Connection::Run(int stop_fd) {
  thread_ = std::this_thread::get_id();
  std::vector<char> buf(kMaxFrameBytes + 1);
  const int max = server_->options_.max_in_flight;
  bool open = true;
  while (open) {
    bool can_read = false, want_write = false, idle = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      can_read = in_flight_ < max && outbox_.size() < static_cast<size_t>(max);
      want_write = !outbox_.empty();
      idle = in_flight_ == 0;
    }
    // The automatic spin waits for the peer's next request once every reply is out (a caller
    // waiting for a reply sends nothing): ReleaseLocked wakes this thread for it. A heads-up
    // asks for a spin until its time is up.
    auto spin = can_read && !want_write && (idle || !spin_.automatic())
                    ? spin_.Budget()
                    : std::chrono::steady_clock::duration::zero();
    if (can_read && !want_write && heads_up_until_ != std::chrono::steady_clock::time_point{}) {
      spin = std::max(spin, heads_up_until_ - std::chrono::steady_clock::now());
      heads_up_until_ = {};  // one spin per heads-up
    }
    // Under the automatic spin at most kMaxAutoSpinners connections busy-poll at once.
    const bool capped = spin_.automatic();
    if (spin > spin.zero() &&
        (!capped || server_->auto_spinners_.fetch_add(1) < kMaxAutoSpinners)) {
      const auto until = std::chrono::steady_clock::now() + spin;
      Read r = Read::kNone;
      do {
        r = ReadFrame(&buf);
      } while (r == Read::kNone && std::chrono::steady_clock::now() < until &&
               !server_->stopping_.load());
      if (capped) server_->auto_spinners_.fetch_sub(1);
      if (r == Read::kClosed) break;
      if (r == Read::kFrame) {
        server_->spin_pickups_.fetch_add(1);
        continue;
      }
    } else if (spin > spin.zero()) {
      server_->auto_spinners_.fetch_sub(1);  // the cap was reached: sleep in poll()
    }
    pollfd fds[3] = {{fd_, static_cast<short>((can_read ? POLLIN : 0) | (want_write ? POLLOUT : 0)), 0},
                     {wake_fd_, POLLIN, 0},
                     {stop_fd, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      server_->logger_->Error("fast socket: poll failed", {{"error", std::strerror(errno)}});
      break;
    }
    if (fds[2].revents != 0) break;
    if (fds[1].revents != 0) Drain(wake_fd_);
    if ((fds[0].revents & POLLOUT) != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      FlushLocked();
    }
    if ((fds[0].revents & POLLIN) != 0) {
      open = ReadFrame(&buf) != Read::kClosed;
    } else if ((fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
      open = false;
    }
  }
  gone_.store(true);
  ::shutdown(fd_, SHUT_RDWR);
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  while (!outbox_.empty()) {
    ReleaseLocked(outbox_.front().counted);
    outbox_.pop_front();
  }
  idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
}

FastSocketServer::Connection::Read FastSocketServer::Connection::ReadFrame(std::vector<char>* buf) {
  iovec iov{buf->data(), buf->size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // MSG_TRUNC: the return value is the frame's real length even when it did not fit.
  const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Read::kNone;
    return Read::kClosed;
  }
  if (n == 0) {
    // A zero-byte frame and the peer's close both read as 0 on SOCK_SEQPACKET; only a close
    // (or shutdown) sets RDHUP.
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      return Read::kClosed;
    }
  }
  const size_t real = static_cast<size_t>(n);
  const bool truncated = (msg.msg_flags & MSG_TRUNC) != 0 || real > kMaxFrameBytes;
  HandleFrame(buf->data(), truncated ? 0 : real, real);
  return Read::kFrame;
}

void FastSocketServer::Connection::HandleFrame(const char* data, size_t n, size_t real_size) {
  const auto arrival = std::chrono::steady_clock::now();
  v1::FastRequest req;
  const bool parsed = real_size != 0 && real_size <= kMaxFrameBytes &&
                      req.ParseFromArray(data, static_cast<int>(n));
  // A heads-up is not an arrival of work: the automatic spin's gaps are between calls.
  if (parsed && req.heads_up_micros() != 0) return HeadsUp(req, arrival);
  spin_.Arrived(arrival);
  heads_up_until_ = {};  // the call a heads-up announced, or another frame: no spin for it
  if (real_size == 0) {
    return ReplyError(0,
                      absl::InvalidArgumentError(
                          "frame: empty (a FastRequest needs a method or a hello; call_id 0 and "
                          "nothing else serialize to zero bytes)"),
                      "FastSocket");
  }
  if (real_size > kMaxFrameBytes) {
    return ReplyError(0,
                      absl::InvalidArgumentError(absl::StrCat(
                          "frame: ", real_size, " bytes exceed the fast socket's limit of ",
                          kMaxFrameBytes, " bytes (send large inline tensors over gRPC)")),
                      "FastSocket");
  }
  if (!parsed) {
    return ReplyError(0,
                      absl::InvalidArgumentError(absl::StrCat(
                          "frame: ", n, " bytes are not a fp4q.v1.FastRequest")),
                      "FastSocket");
  }
  const uint64_t id = req.call_id();
  if (req.timeout_micros() > kMaxTimeoutMicros) {
    return ReplyError(id,
                      absl::InvalidArgumentError(absl::StrCat(
                          "FastRequest.timeout_micros: ", req.timeout_micros(),
                          " exceeds one day (", kMaxTimeoutMicros, "); 0 means no deadline")),
                      "FastSocket");
  }
  if (req.has_hello()) {
    if (!req.method().empty()) {
      return ReplyError(id,
                        absl::InvalidArgumentError(
                            "FastRequest.method: set beside hello (the hello frame carries no "
                            "call)"),
                        "FastHello");
    }
    return Hello(req, arrival);
  }
  if (req.method().empty()) {
    return ReplyError(id,
                      absl::InvalidArgumentError(
                          "FastRequest.method: empty (name a method of fp4q.v1.Fp4q, e.g. "
                          "\"Step\", or send a hello)"),
                      "FastSocket");
  }
  if (session_id_.empty()) {
    return ReplyError(id,
                      absl::FailedPreconditionError(
                          "FastRequest.method: the connection is not bound to a session; its "
                          "first frame must be a hello naming an open session"),
                      "FastSocket");
  }
  Start(req, arrival);
}

void FastSocketServer::Connection::HeadsUp(const v1::FastRequest& req,
                                           std::chrono::steady_clock::time_point arrival) {
  const uint64_t id = req.call_id();
  const uint32_t limit = server_->heads_up_limit_micros_;
  absl::Status bad;
  if (req.has_hello() || !req.method().empty()) {
    bad = absl::InvalidArgumentError(
        "FastRequest.heads_up_micros: set beside a method or a hello (a heads-up is a frame of "
        "its own, answered by nothing)");
  } else if (limit == 0) {
    bad = absl::InvalidArgumentError(
        "FastRequest.heads_up_micros: this fp4qd takes no heads-ups (ServerInfo "
        "limits.fast_socket_max_heads_up_micros is 0: its fast socket threads never busy-poll)");
  } else if (req.heads_up_micros() > limit) {
    bad = absl::InvalidArgumentError(absl::StrCat(
        "FastRequest.heads_up_micros: ", req.heads_up_micros(), " exceeds this fp4qd's limit of ",
        limit, " (ServerInfo limits.fast_socket_max_heads_up_micros)"));
  } else if (session_id_.empty()) {
    bad = absl::FailedPreconditionError(
        "FastRequest.heads_up_micros: the connection is not bound to a session; its first "
        "frame must be a hello naming an open session");
  }
  if (!bad.ok()) return ReplyError(id, bad, "FastSocket");
  heads_up_until_ = arrival + std::chrono::microseconds(req.heads_up_micros());
  server_->heads_ups_.fetch_add(1);
}

void FastSocketServer::Connection::Hello(const v1::FastRequest& req,
                                         std::chrono::steady_clock::time_point arrival) {
  const uint64_t id = req.call_id();
  if (!session_id_.empty()) {
    return ReplyError(id,
                      absl::FailedPreconditionError(
                          "hello: the connection is already bound to a session (one per "
                          "connection; open another connection for another session)"),
                      "FastHello");
  }
  CallLayer* layer = server_->layer_;
  absl::StatusOr<std::string> bound =
      layer->Authenticate({req.hello().auth_token()}, "hello.auth_token");
  if (!bound.ok()) return ReplyError(id, bound.status(), "FastHello");
  if (req.hello().session_id().empty()) {
    return ReplyError(id,
                      absl::InvalidArgumentError(
                          "hello.session_id: empty (open a session with OpenSession first)"),
                      "FastHello");
  }
  RequestContext rc;
  rc.session_id = req.hello().session_id();
  rc.peer = peer_;
  rc.namespace_bound = !bound->empty();
  rc.bound_namespace = *bound;
  Engine& engine = layer->engine();
  absl::StatusOr<uint32_t> lease = engine.KeepAlive(rc);
  layer->Record("FastHello", lease.status().code(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - arrival).count());
  v1::FastReply reply;
  reply.set_call_id(id);
  if (!lease.ok()) {
    reply.set_code(static_cast<int32_t>(lease.status().code()));
    reply.set_message(
        lease.status().code() == absl::StatusCode::kNotFound
            ? "hello.session_id: unknown or expired session (open one with OpenSession over "
              "gRPC, then send its id here)"
            : absl::StrCat("hello.session_id: ", lease.status().message()));
    return Send(reply, /*counted=*/false);
  }
  session_id_ = rc.session_id;
  namespace_bound_ = rc.namespace_bound;
  bound_namespace_ = rc.bound_namespace;
  reply.mutable_hello()->mutable_header()->set_server_epoch(engine.epoch());
  reply.mutable_hello()->mutable_header()->set_backend(engine.backend_kind());
  reply.mutable_hello()->set_lease_seconds(*lease);
  Send(reply, /*counted=*/false);
}

void FastSocketServer::Connection::Start(const v1::FastRequest& req,
                                         std::chrono::steady_clock::time_point arrival) {
  CallLayer* layer = server_->layer_;
  IncomingCall call;
  call.method = req.method();
  call.arrival = arrival;
  call.fast_socket = true;
  call.authenticated = true;  // at hello
  call.reply_limit = kMaxFrameBytes - v1::FAST_SOCKET_REPLY_FRAMING_BYTES;
  RequestContext& rc = call.context;
  rc.session_id = session_id_;
  rc.peer = peer_;
  rc.namespace_bound = namespace_bound_;
  rc.bound_namespace = bound_namespace_;
  if (req.timeout_micros() > 0) {
    rc.deadline = absl::Now() + absl::Microseconds(static_cast<int64_t>(req.timeout_micros()));
  }
  std::shared_ptr<Connection> self = shared_from_this();
  rc.is_cancelled = [self] { return self->gone_.load(); };
  // The work may run on this thread when its device is idle: a caller waiting for this reply
  // then pays no worker wake-up. Requests pipelined behind it on this connection are read when
  // it is done.
  rc.run_inline_when_idle = true;
  std::unique_ptr<google::protobuf::Message> request = layer->NewRequest(call.method);
  const bool parsed = request != nullptr && request->ParseFromString(req.request());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
  }
  const uint64_t id = req.call_id();
  layer->Run(std::move(call), std::move(request), parsed, req.request().size(),
             [self, id](const absl::Status& s, std::unique_ptr<google::protobuf::Message> rep) {
               v1::FastReply reply;
               reply.set_call_id(id);
               if (s.ok()) {
                 rep->SerializeToString(reply.mutable_reply());
               } else {
                 reply.set_code(static_cast<int32_t>(s.code()));
                 reply.set_message(std::string(s.message()));
               }
               self->Send(reply, /*counted=*/true);
             });
}

void FastSocketServer::Connection::ReplyError(uint64_t call_id, const absl::Status& status,
                                              const char* rpc) {
  server_->layer_->Record(rpc, status.code(), 0.0);
  v1::FastReply reply;
  reply.set_call_id(call_id);
  reply.set_code(static_cast<int32_t>(status.code()));
  reply.set_message(std::string(status.message()));
  Send(reply, /*counted=*/false);
}

void FastSocketServer::Connection::Send(const v1::FastReply& reply, bool counted) {
  std::string bytes;
  if (!reply.SerializeToString(&bytes) || bytes.size() > kMaxFrameBytes) {
    v1::FastReply error;
    error.set_call_id(reply.call_id());
    error.set_code(static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
    error.set_message(absl::StrCat(
        "reply: ", bytes.size(), " bytes exceed the fast socket's limit of ", kMaxFrameBytes,
        " bytes; write the outputs into CUDA IPC regions, or call over gRPC"));
    bytes.clear();
    error.SerializeToString(&bytes);
  }
  bool poke = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      outbox_.push_back(Pending{std::move(bytes), counted});
      FlushLocked();
      poke = !outbox_.empty();  // the connection thread waits for POLLOUT
    } else {
      ReleaseLocked(counted);
    }
  }
  if (poke) Poke(wake_fd_);
}

void FastSocketServer::Connection::FlushLocked() {
  while (!outbox_.empty()) {
    const Pending& p = outbox_.front();
    const ssize_t n = ::send(fd_, p.bytes.data(), p.bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // Sent, or the peer is gone (EPIPE, ECONNRESET): either way this reply is done with.
    const bool lost = n < 0;
    ReleaseLocked(p.counted);
    outbox_.pop_front();
    if (lost) {
      closed_ = true;
      while (!outbox_.empty()) {
        ReleaseLocked(outbox_.front().counted);
        outbox_.pop_front();
      }
      gone_.store(true);
      ::shutdown(fd_, SHUT_RDWR);  // wakes the connection thread
      return;
    }
  }
}

void FastSocketServer::Connection::ReleaseLocked(bool counted) {
  if (!counted) return;
  // A call answered on the connection's own thread (run there while its device was idle) wakes
  // nobody: that thread is awake, and its next turn of Run's loop reads on (and spins) anyway.
  // A wake-up it sent itself would be a system call now and another (Drain) later, and would
  // end its next poll() at once.
  const bool elsewhere = std::this_thread::get_id() != thread_;
  const int max = server_->options_.max_in_flight;
  bool wake = in_flight_-- == max;  // a reader held back by back-pressure may go on
  if (in_flight_ == 0) {
    idle_cv_.notify_all();
    // The automatic spin: the thread wakes now, off the reply's path, and busy-polls for the
    // next request.
    wake = wake ||
           (spin_.automatic() && spin_.Budget() > std::chrono::steady_clock::duration::zero());
  }
  if (wake && elsewhere) {
    server_->release_wakeups_.fetch_add(1);
    Poke(wake_fd_);
  }
}

// ---------------------------------------------------------------- the server

uint32_t FastSocketServer::HeadsUpLimitMicros(const std::optional<absl::Duration>& spin,
                                              int usable_cpus) {
  return SpinPolicy(spin, usable_cpus).may_spin() ? kMaxHeadsUpMicros : 0;
}

absl::StatusOr<std::unique_ptr<FastSocketServer>> FastSocketServer::Create(
    CallLayer* layer, Metrics* metrics, FastSocketOptions options, Logger* logger) {
  if (options.allowed_uids.empty()) {
    return absl::InvalidArgumentError("--unix_socket_allowed_uids: no uid allowed");
  }
  if (options.max_connections < 1 || options.max_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fast_socket_max_connections (", options.max_connections,
        ") and the per-connection call limit (", options.max_in_flight, ") must be >= 1"));
  }
  if (options.spin.has_value() &&
      (*options.spin < absl::ZeroDuration() || *options.spin > absl::Seconds(1))) {
    return absl::InvalidArgumentError(absl::StrCat("--fast_socket_spin_us: ",
                                                   absl::FormatDuration(*options.spin),
                                                   " is outside 0..1000000 us (or -1: "
                                                   "automatic)"));
  }
  const bool owner_only =
      options.allowed_uids.size() == 1 && *options.allowed_uids.begin() == ::geteuid();
  absl::StatusOr<int> fd = ListenUnix(options.path, SOCK_SEQPACKET, owner_only, "fast_socket");
  if (!fd.ok()) return fd.status();
  std::unique_ptr<FastSocketServer> s(
      new FastSocketServer(layer, metrics, std::move(options), logger));
  s->listen_fd_ = *fd;
  s->stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("--fast_socket: eventfd: ", std::strerror(errno)));
  }
  return s;
}

FastSocketServer::~FastSocketServer() {
  Stop();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(options_.path.c_str());
  }
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void FastSocketServer::Start() {
  if (accept_thread_.joinable()) return;
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void FastSocketServer::Stop() {
  if (!accept_thread_.joinable()) return;
  stopping_.store(true);  // ends busy-polling connections at once
  Poke(stop_fd_);
  accept_thread_.join();
  for (Worker& w : workers_) w.thread.join();
  workers_.clear();
}

void FastSocketServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    const int n = ::poll(fds, 2, /*timeout_ms=*/1000);
    if (n < 0 && errno != EINTR) {
      logger_->Error("fast socket: poll failed", {{"error", std::strerror(errno)}});
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (fds[1].revents != 0) return;
    ReapFinished();
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    while (true) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        Accept(fd);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        logger_->Warning("fast socket: accept failed; retrying", {{"error", std::strerror(errno)}});
        absl::SleepFor(absl::Milliseconds(100));
      }
      break;  // EAGAIN: drained
    }
  }
}

void FastSocketServer::Refuse(int fd, absl::string_view why, const std::optional<PeerInfo>& peer) {
  const int64_t refused = ++refused_;
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ >= absl::Seconds(1)) {
    last_refusal_log_ = now;
    logger_->Warning(absl::StrCat("fast socket: connection refused: ", why),
                     {{"peer_uid", peer ? absl::StrCat(peer->uid) : "unknown"},
                      {"peer_pid", peer ? absl::StrCat(peer->pid) : "unknown"},
                      {"refused_total", absl::StrCat(refused)}});
  }
  ::close(fd);  // after the log line: a peer that sees the close finds the reason logged
}

void FastSocketServer::Accept(int fd) {
  const std::optional<PeerInfo> peer = UnixPeer(fd);
  if (!peer.has_value() || options_.allowed_uids.count(static_cast<uid_t>(peer->uid)) == 0) {
    return Refuse(fd, "uid not in --unix_socket_allowed_uids", peer);
  }
  ReapFinished();
  if (open_.load() >= options_.max_connections) {
    return Refuse(fd, "--fast_socket_max_connections reached", peer);
  }
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Refuse(fd, "eventfd failed", peer);
  auto conn = std::make_shared<Connection>(this, fd, wake, *peer);
  auto done = std::make_shared<std::atomic<bool>>(false);
  ++open_;
  if (metrics_ != nullptr) metrics_->FastSocketConnectionsChanged(+1);
  workers_.push_back(Worker{std::thread([this, conn, done] {
                              conn->Run(stop_fd_);
                              --open_;
                              if (metrics_ != nullptr) metrics_->FastSocketConnectionsChanged(-1);
                              done->store(true);
                            }),
                            done});
}

void FastSocketServer::ReapFinished() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace fp4q::server
