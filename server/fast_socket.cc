#include "server/fast_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "fp4q/v1/fp4q.pb.h"
#include "server/grpc_service.h"
#include "server/proto_convert.h"
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

// Elements of `shape`, or 0 when a dimension is not positive or the product passes 2^40
// (the engine refuses such shapes itself, before it changes anything).
uint64_t Elements(const google::protobuf::RepeatedField<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0 || d > (int64_t{1} << 40) || n > (uint64_t{1} << 40) / static_cast<uint64_t>(d)) {
      return 0;
    }
    n *= static_cast<uint64_t>(d);
  }
  return shape.empty() ? 0 : n;
}

// A call that changes state (UpdateWeight, Qdq with a residual key) and returns a tensor
// inline must be refused before it runs when that tensor cannot fit a reply frame: afterwards
// the step would be applied and its reply lost. 4 bytes per element unless the dtype is known
// to be bf16; 4 KiB are left for the rest of the reply.
absl::Status StatefulReplyFits(const v1::FastRequest& req) {
  uint64_t inline_bytes = 0;
  if (req.op_case() == v1::FastRequest::kUpdateWeight) {
    const v1::UpdateWeightRequest& u = req.update_weight();
    if (u.return_dequantized() && !u.dequantized_out().has_region()) {
      inline_bytes = Elements(u.update().shape()) * 4;
    }
  } else if (req.op_case() == v1::FastRequest::kQdq) {
    const v1::QdqRequest& q = req.qdq();
    if (!q.options().residual_key().empty() && !q.out().has_region()) {
      const bool bf16 = q.out_dtype() == v1::DTYPE_BF16 ||
                        (q.out_dtype() == v1::DTYPE_UNSPECIFIED &&
                         q.input().dtype() == v1::DTYPE_BF16);
      inline_bytes = Elements(q.input().shape()) * (bf16 ? 2 : 4);
    }
  }
  constexpr uint64_t kRoom = FastSocketServer::kMaxFrameBytes - 4096;
  if (inline_bytes <= kRoom) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "reply: the inline output (", inline_bytes, " bytes) would not fit the fast socket's ",
      FastSocketServer::kMaxFrameBytes,
      "-byte frame; nothing was run: write it into a CUDA IPC region, or call over gRPC"));
}

}  // namespace

class FastSocketServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(FastSocketServer* server, int fd, int wake_fd, PeerInfo peer)
      : server_(server), fd_(fd), wake_fd_(wake_fd), peer_(peer) {}
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
  void Hello(const v1::FastRequest& req, std::chrono::steady_clock::time_point arrival);

  // Hands a request to the engine; the completion replies from the engine's thread.
  template <typename Res, typename ReplyMsg, typename Call>
  void Start(std::shared_ptr<const v1::FastRequest> request, const char* rpc,
             const RequestContext& rc,
             ReplyMsg* (v1::FastReply::*op)(), std::chrono::steady_clock::time_point arrival,
             Call call);
  // Answers a call the connection thread can answer at once (no device work): `fill` writes
  // the reply's operation or returns the error.
  template <typename ReplyMsg, typename Fill>
  void AnswerNow(uint64_t call_id, const char* rpc, std::chrono::steady_clock::time_point arrival,
                 ReplyMsg* (v1::FastReply::*op)(), Fill fill);
  void ReplyError(uint64_t call_id, const absl::Status& status, const char* rpc);
  // Sends (or queues) one reply; `counted`: it answers a call counted in in_flight_.
  void Send(const v1::FastReply& reply, bool counted);
  void FlushLocked();  // mu_ held
  void ReleaseLocked(bool counted);

  FastSocketServer* const server_;
  const int fd_;
  const int wake_fd_;  // eventfd: the outbox has replies, or a call slot freed up
  const PeerInfo peer_;
  std::string session_id_;  // bound by hello; connection thread only

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
  std::vector<char> buf(kMaxFrameBytes + 1);
  const int max = server_->options_.max_in_flight;
  const absl::Duration spin = server_->options_.spin;
  bool open = true;
  while (open) {
    bool can_read = false, want_write = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      can_read = in_flight_ < max && outbox_.size() < static_cast<size_t>(max);
      want_write = !outbox_.empty();
    }
    if (can_read && !want_write && spin > absl::ZeroDuration()) {
      const absl::Time until = absl::Now() + spin;
      Read r = Read::kNone;
      do {
        r = ReadFrame(&buf);
      } while (r == Read::kNone && absl::Now() < until && !server_->stopping_.load());
      if (r == Read::kClosed) break;
      if (r == Read::kFrame) continue;
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
  if (real_size == 0) {
    return ReplyError(0,
                      absl::InvalidArgumentError(
                          "frame: empty (a FastRequest needs an operation; call_id 0 and no op "
                          "serialize to zero bytes)"),
                      "FastSocket");
  }
  if (real_size > kMaxFrameBytes) {
    return ReplyError(0,
                      absl::InvalidArgumentError(absl::StrCat(
                          "frame: ", real_size, " bytes exceed the fast socket's limit of ",
                          kMaxFrameBytes, " bytes (send large inline tensors over gRPC)")),
                      "FastSocket");
  }
  // Shared: the engine's converted request points into its bytes (inline tensors) until the
  // call completes, so the completion keeps it alive.
  auto owned = std::make_shared<v1::FastRequest>();
  const v1::FastRequest& req = *owned;
  if (!owned->ParseFromArray(data, static_cast<int>(n))) {
    return ReplyError(0,
                      absl::InvalidArgumentError(absl::StrCat(
                          "frame: ", n, " bytes are not a fp4q.v1.FastRequest")),
                      "FastSocket");
  }
  const uint64_t id = req.call_id();
  if (req.op_case() == v1::FastRequest::OP_NOT_SET) {
    return ReplyError(id,
                      absl::InvalidArgumentError(
                          "FastRequest.op: no operation set (or one this server does not know)"),
                      "FastSocket");
  }
  if (req.timeout_micros() > kMaxTimeoutMicros) {
    return ReplyError(id,
                      absl::InvalidArgumentError(absl::StrCat(
                          "FastRequest.timeout_micros: ", req.timeout_micros(),
                          " exceeds one day (", kMaxTimeoutMicros, "); 0 means no deadline")),
                      "FastSocket");
  }
  if (req.op_case() == v1::FastRequest::kHello) return Hello(req, arrival);
  if (session_id_.empty()) {
    return ReplyError(id,
                      absl::FailedPreconditionError(
                          "FastRequest.op: the connection is not bound to a session; its "
                          "first frame must be a hello naming an open session"),
                      "FastSocket");
  }
  RequestContext rc;
  rc.deadline = req.timeout_micros() == 0
                    ? absl::InfiniteFuture()
                    : absl::Now() + absl::Microseconds(static_cast<int64_t>(req.timeout_micros()));
  rc.session_id = session_id_;
  rc.peer = peer_;
  {
    std::weak_ptr<Connection> weak = weak_from_this();
    rc.is_cancelled = [weak] {
      std::shared_ptr<Connection> c = weak.lock();
      return c == nullptr || c->gone_.load();
    };
  }
  if (absl::Status fits = StatefulReplyFits(req); !fits.ok()) {
    return ReplyError(id, fits, "FastSocket");
  }
  Engine* engine = server_->engine_;
  switch (req.op_case()) {
    case v1::FastRequest::kQuantize:
      return Start<QuantizeResult>(owned, "Quantize", rc, &v1::FastReply::mutable_quantize, arrival,
                                   [&](const RequestContext& c, auto done) {
                                     engine->Quantize(c, FromProto(req.quantize()),
                                                      std::move(done));
                                   });
    case v1::FastRequest::kDequantize:
      return Start<DequantizeResult>(owned, "Dequantize", rc, &v1::FastReply::mutable_dequantize,
                                     arrival, [&](const RequestContext& c, auto done) {
                                       engine->Dequantize(c, FromProto(req.dequantize()),
                                                          std::move(done));
                                     });
    case v1::FastRequest::kQdq:
      return Start<QdqResult>(owned, "Qdq", rc, &v1::FastReply::mutable_qdq, arrival,
                              [&](const RequestContext& c, auto done) {
                                engine->Qdq(c, FromProto(req.qdq()), std::move(done));
                              });
    case v1::FastRequest::kMatmul:
      return Start<MatmulResult>(owned, "Matmul", rc, &v1::FastReply::mutable_matmul, arrival,
                                 [&](const RequestContext& c, auto done) {
                                   engine->Matmul(c, FromProto(req.matmul()), std::move(done));
                                 });
    case v1::FastRequest::kUpdateWeight:
      return Start<UpdateWeightResult>(owned, "UpdateWeight", rc,
                                       &v1::FastReply::mutable_update_weight, arrival,
                                       [&](const RequestContext& c, auto done) {
                                         engine->UpdateWeight(c, FromProto(req.update_weight()),
                                                              std::move(done));
                                       });
    case v1::FastRequest::kKeepAlive:
      return AnswerNow(id, "KeepAlive", arrival, &v1::FastReply::mutable_keep_alive,
                       [&](v1::KeepAliveReply* m) -> absl::Status {
                         FP4Q_ASSIGN_OR_RETURN(const uint32_t lease, engine->KeepAlive(rc));
                         FillReplyHeader(*engine, nullptr, m->mutable_header());
                         m->set_lease_seconds(lease);
                         return absl::OkStatus();
                       });
    case v1::FastRequest::kListTensors:
      return AnswerNow(id, "ListTensors", arrival, &v1::FastReply::mutable_list_tensors,
                       [&](v1::ListTensorsReply* m) -> absl::Status {
                         FP4Q_ASSIGN_OR_RETURN(std::vector<TensorListing> list,
                                               engine->ListTensors());
                         FillReplyHeader(*engine, nullptr, m->mutable_header());
                         ToProto(std::move(list), m);
                         return absl::OkStatus();
                       });
    case v1::FastRequest::kServerInfo:
      return AnswerNow(id, "ServerInfo", arrival, &v1::FastReply::mutable_server_info,
                       [&](v1::ServerInfoReply* m) {
                         FillServerInfo(*engine, server_->options_.max_message_bytes, peer_, m);
                         return absl::OkStatus();
                       });
    default:
      return ReplyError(id, absl::InternalError("FastRequest.op: unhandled operation"),
                        "FastSocket");
  }
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
  const std::string& token = server_->options_.auth_token;
  if (!token.empty() && !SameSecret(req.hello().auth_token(), token)) {
    return ReplyError(id, absl::UnauthenticatedError("hello.auth_token: missing or wrong token"),
                      "FastHello");
  }
  if (req.hello().session_id().empty()) {
    return ReplyError(id,
                      absl::InvalidArgumentError(
                          "hello.session_id: empty (open a session with OpenSession first)"),
                      "FastHello");
  }
  RequestContext rc;
  rc.session_id = req.hello().session_id();
  rc.peer = peer_;
  Engine* engine = server_->engine_;
  if (server_->metrics_ != nullptr) server_->metrics_->RequestStarted();
  absl::StatusOr<uint32_t> lease = engine->KeepAlive(rc);
  if (server_->metrics_ != nullptr) {
    server_->metrics_->RequestFinished(
        "FastHello", lease.status().code(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - arrival).count(), 0, 0);
  }
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
  FillReplyHeader(*engine, nullptr, reply.mutable_hello()->mutable_header());
  reply.mutable_hello()->set_lease_seconds(*lease);
  Send(reply, /*counted=*/false);
}

template <typename Res, typename ReplyMsg, typename Call>
void FastSocketServer::Connection::Start(std::shared_ptr<const v1::FastRequest> request,
                                         const char* rpc, const RequestContext& rc,
                                         ReplyMsg* (v1::FastReply::*op)(),
                                         std::chrono::steady_clock::time_point arrival,
                                         Call call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
  }
  Metrics* metrics = server_->metrics_;
  if (metrics != nullptr) metrics->RequestStarted();
  std::shared_ptr<Connection> self = shared_from_this();
  call(rc, [self, request, rpc, op, arrival, metrics](absl::StatusOr<Res> r) {
    v1::FastReply reply;
    reply.set_call_id(request->call_id());
    ReplyMeta meta;
    absl::StatusCode code = r.status().code();
    if (r.ok()) {
      meta = r->meta;
      ReplyMsg* m = (reply.*op)();
      ToProto(std::move(*r), m);
      FillReplyHeader(*self->server_->engine_, &meta, m->mutable_header());
      m->mutable_header()->set_server_micros(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - arrival)
              .count());
    } else {
      reply.set_code(static_cast<int32_t>(code));
      reply.set_message(std::string(r.status().message()));
    }
    if (metrics != nullptr) {
      metrics->RequestFinished(
          rpc, code,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - arrival).count(),
          meta.processed_bytes, meta.processed_elements);
    }
    self->Send(reply, /*counted=*/true);
  });
}

template <typename ReplyMsg, typename Fill>
void FastSocketServer::Connection::AnswerNow(uint64_t call_id, const char* rpc,
                                             std::chrono::steady_clock::time_point arrival,
                                             ReplyMsg* (v1::FastReply::*op)(), Fill fill) {
  Metrics* metrics = server_->metrics_;
  if (metrics != nullptr) metrics->RequestStarted();
  v1::FastReply reply;
  const absl::Status status = fill((reply.*op)());
  if (!status.ok()) {
    reply.Clear();
    reply.set_code(static_cast<int32_t>(status.code()));
    reply.set_message(std::string(status.message()));
  }
  reply.set_call_id(call_id);
  if (metrics != nullptr) {
    metrics->RequestFinished(
        rpc, status.code(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - arrival).count(), 0, 0);
  }
  Send(reply, /*counted=*/false);
}

void FastSocketServer::Connection::ReplyError(uint64_t call_id, const absl::Status& status,
                                              const char* rpc) {
  if (server_->metrics_ != nullptr) {
    server_->metrics_->RequestStarted();
    server_->metrics_->RequestFinished(rpc, status.code(), 0.0, 0, 0);
  }
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
  const int max = server_->options_.max_in_flight;
  if (in_flight_-- == max) Poke(wake_fd_);  // a reader held back by back-pressure may go on
  if (in_flight_ == 0) idle_cv_.notify_all();
}

// ---------------------------------------------------------------- the server

absl::StatusOr<std::unique_ptr<FastSocketServer>> FastSocketServer::Create(
    Engine* engine, Metrics* metrics, FastSocketOptions options, Logger* logger) {
  if (options.allowed_uids.empty()) {
    return absl::InvalidArgumentError("--unix_socket_allowed_uids: no uid allowed");
  }
  if (options.max_connections < 1 || options.max_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fast_socket_max_connections (", options.max_connections,
        ") and the per-connection call limit (", options.max_in_flight, ") must be >= 1"));
  }
  if (options.spin < absl::ZeroDuration() || options.spin > absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("--fast_socket_spin_us: ",
                                                   absl::FormatDuration(options.spin),
                                                   " is outside 0..1000000 us"));
  }
  const bool owner_only =
      options.allowed_uids.size() == 1 && *options.allowed_uids.begin() == ::geteuid();
  absl::StatusOr<int> fd = ListenUnix(options.path, SOCK_SEQPACKET, owner_only, "fast_socket");
  if (!fd.ok()) return fd.status();
  std::unique_ptr<FastSocketServer> s(
      new FastSocketServer(engine, metrics, std::move(options), logger));
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
