#include "fp4q/client/fast_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fp4q::client {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(
      absl::StrCat("fast socket ", path, ": ", what, ": ", std::strerror(err)));
}

absl::Status StatusOf(const v1::FastReply& reply) {
  if (reply.code() == 0) return absl::OkStatus();
  // google.rpc.Code numbering, as absl::StatusCode; anything else is reported as UNKNOWN.
  const int c = reply.code();
  const absl::StatusCode code = c > 0 && c <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                                    ? static_cast<absl::StatusCode>(c)
                                    : absl::StatusCode::kUnknown;
  return absl::Status(code, reply.message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<FastSocket>> FastSocket::Connect(const FastSocketOptions& options,
                                                                absl::string_view session_id) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("FastSocketOptions.path: '", options.path,
                                                   "' is empty or over ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("FastSocketOptions.timeout: must be > 0, got ",
                                                   absl::FormatDuration(options.timeout)));
  }
  if (options.spin.has_value() && *options.spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FastSocketOptions.spin: must be >= 0 (or unset: the automatic spin), got ",
                     absl::FormatDuration(*options.spin)));
  }
  if (session_id.empty()) {
    return absl::InvalidArgumentError("session_id: empty (open a Session first)");
  }
  std::memcpy(addr.sun_path, options.path.data(), options.path.size());
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", options.path, errno);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("connect", options.path, err);
  }
  std::unique_ptr<FastSocket> s(new FastSocket(fd, options));
  v1::FastRequest hello;
  hello.mutable_hello()->set_session_id(std::string(session_id));
  hello.mutable_hello()->set_auth_token(options.auth_token);
  absl::StatusOr<v1::FastReply> reply = s->Call(hello);
  if (!reply.ok()) return reply.status();
  s->lease_seconds_ = reply->hello().lease_seconds();
  return s;
}

FastSocket::~FastSocket() { ::close(fd_); }

absl::StatusOr<v1::FastReply> FastSocket::Call(v1::FastRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) {
    return absl::UnavailableError(
        absl::StrCat("fast socket ", options_.path, ": the connection was lost; connect again"));
  }
  const uint64_t id = next_call_id_++;
  request.set_call_id(id);
  request.set_timeout_micros(static_cast<uint64_t>(absl::ToInt64Microseconds(options_.timeout)));
  const size_t size = request.ByteSizeLong();
  if (size > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: ", size, " bytes exceed the fast socket's frame limit of ", kMaxFrameBytes,
        " (pass tensors as CUDA IPC regions, or call over gRPC)"));
  }
  buffer_.resize(kMaxFrameBytes + 1);
  request.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buffer_.data()));
  // The hello is waited for without a spin (as in the Python client): it is no call to count.
  const absl::Duration spin =
      request.has_hello() ? absl::ZeroDuration() : SpinForLocked(request.method());
  const std::optional<absl::Duration> wake =
      request.has_hello() || spin > absl::ZeroDuration() ? std::nullopt
                                                         : WakeAfterLocked(request.method());
  const absl::Time sent = absl::Now();
  const absl::Time deadline = sent + options_.timeout;
  while (true) {
    const ssize_t n = ::send(fd_, buffer_.data(), size, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) break;
    if (n < 0 && errno == EINTR) continue;
    broken_ = true;
    return Errno("send", options_.path, n < 0 ? errno : EMSGSIZE);
  }
  v1::FastReply reply;
  const absl::Time sleep_until = wake.has_value() ? sent + *wake : absl::InfinitePast();
  const absl::Duration poll = wake.has_value() ? 2 * kAutoSpinMax : spin;
  while (true) {
    absl::Status s = Receive(deadline, poll, sleep_until, &reply);
    idle_since_ = absl::Now();
    if (!s.ok()) return s;
    // Replies to earlier calls that timed out here may still arrive: skip them.
    if (reply.call_id() == id || reply.call_id() == 0) break;
    if (reply.call_id() > id) {
      broken_ = true;
      return absl::InternalError(absl::StrCat("fast socket ", options_.path, ": reply call_id ",
                                              reply.call_id(), " to call ", id,
                                              " that was never sent"));
    }
  }
  if (const int slot = AutoSlot(request.method()); slot >= 0 && !options_.spin.has_value()) {
    last_round_trip_[slot] = absl::Now() - sent;
  }
  if (absl::Status s = StatusOf(reply); !s.ok()) return s;
  if (request.has_hello() != reply.has_hello()) {
    return absl::InternalError(absl::StrCat("fast socket ", options_.path, ": reply to call ", id,
                                            request.has_hello() ? " carries no hello reply"
                                                                : " is a hello reply"));
  }
  return reply;
}

int FastSocket::AutoSlot(absl::string_view method) {
  if (method == "Step") return 0;
  if (method == "UpdateWeight") return 1;
  return -1;
}

absl::Duration FastSocket::SpinForLocked(absl::string_view method) const {
  if (options_.spin.has_value()) return *options_.spin;
  const int slot = AutoSlot(method);
  if (slot < 0 || server_on_cpu_) return absl::ZeroDuration();
  const absl::Duration last = last_round_trip_[slot];
  if (last < absl::ZeroDuration()) return kAutoSpinMax;
  return last > kAutoSpinMax ? absl::ZeroDuration() : std::min(2 * last, kAutoSpinMax);
}

std::optional<absl::Duration> FastSocket::WakeAfterLocked(absl::string_view method) const {
  const int slot = AutoSlot(method);
  if (options_.spin.has_value() || slot < 0 || server_on_cpu_) return std::nullopt;
  const absl::Duration last = last_round_trip_[slot];
  if (last <= kAutoSpinMax || last > kAutoWakeMax) return std::nullopt;
  return last - kAutoSpinMax;
}

std::optional<absl::Duration> FastSocket::WakeAfter(absl::string_view method) const {
  std::lock_guard<std::mutex> lock(mu_);
  return WakeAfterLocked(method);
}

bool FastSocket::HeadsUp() {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || heads_up_limit_ == 0 || absl::Now() - idle_since_ < kHeadsUpAfter) return false;
  v1::FastRequest request;
  request.set_heads_up_micros(std::min(heads_up_limit_, kHeadsUpMicros));
  const std::string bytes = request.SerializeAsString();
  ssize_t n = 0;
  do {
    n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // the server is behind
  if (n != static_cast<ssize_t>(bytes.size())) {
    broken_ = true;
    return false;
  }
  ++stats_.heads_ups;
  idle_since_ = absl::Now();
  return true;
}

absl::Duration FastSocket::SpinFor(absl::string_view method) const {
  std::lock_guard<std::mutex> lock(mu_);
  return SpinForLocked(method);
}

FastSocketStats FastSocket::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void FastSocket::SeeBackend(const google::protobuf::Message& reply) {
  const std::string* backend = nullptr;
  if (const auto* info = dynamic_cast<const v1::ServerInfoReply*>(&reply)) {
    backend = &info->backend();
    std::lock_guard<std::mutex> lock(mu_);
    heads_up_limit_ = info->limits().fast_socket_max_heads_up_micros();
  } else if (const auto* step = dynamic_cast<const v1::StepReply*>(&reply)) {
    if (step->has_header()) backend = &step->header().backend();
  } else if (const auto* update = dynamic_cast<const v1::UpdateWeightReply*>(&reply)) {
    if (update->has_header()) backend = &update->header().backend();
  }
  if (backend == nullptr || backend->empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  server_on_cpu_ = *backend == "cpu";
}

absl::Status FastSocket::Receive(absl::Time deadline, absl::Duration spin, absl::Time sleep_until,
                                v1::FastReply* reply) {
  bool early = false;
  const absl::Duration first = std::min(sleep_until, deadline) - absl::Now();
  if (first > absl::ZeroDuration()) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(first, absl::Milliseconds(1))),
                          60000));
    const int ready = ::poll(&p, 1, ms);
    if (ready < 0 && errno != EINTR) {
      broken_ = true;
      return Errno("poll", options_.path, errno);
    }
    if (ready > 0) {
      early = true;  // the reply (or the peer's close) came while the thread slept first
      spin = absl::ZeroDuration();
    }
  }
  const absl::Time spin_until = absl::Now() + spin;
  bool slept = false;
  while (true) {
    const bool spinning = absl::Now() < spin_until;
    if (!spinning) {
      slept = true;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "fast socket ", options_.path, ": no reply within ", absl::FormatDuration(options_.timeout)));
      }
      pollfd p{fd_, POLLIN, 0};
      const int ms = static_cast<int>(std::min<int64_t>(
          std::max<int64_t>(1, absl::ToInt64Milliseconds(left + absl::Milliseconds(1))), 60000));
      if (::poll(&p, 1, ms) < 0 && errno != EINTR) {
        broken_ = true;
        return Errno("poll", options_.path, errno);
      }
    }
    const ssize_t n = ::recv(fd_, buffer_.data(), buffer_.size(), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      broken_ = true;
      return Errno("recv", options_.path, errno);
    }
    if (n == 0) {
      broken_ = true;
      return absl::UnavailableError(
          absl::StrCat("fast socket ", options_.path, ": the server closed the connection"));
    }
    if (static_cast<size_t>(n) > kMaxFrameBytes ||
        !reply->ParseFromArray(buffer_.data(), static_cast<int>(n))) {
      broken_ = true;
      return absl::InternalError(absl::StrCat("fast socket ", options_.path, ": a reply of ", n,
                                              " bytes is not a fp4q.v1.FastReply"));
    }
    if (early) {
      ++stats_.replied_before_spin;
    } else if (spin > absl::ZeroDuration()) {
      ++(slept ? stats_.polled_then_slept : stats_.polled);
    }
    return absl::OkStatus();
  }
}

absl::Status FastSocket::Invoke(absl::string_view method, const google::protobuf::Message& request,
                               google::protobuf::Message* reply) {
  v1::FastRequest r;
  r.set_method(std::string(method));
  if (!request.SerializeToString(r.mutable_request())) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: a ", request.GetDescriptor()->full_name(), " cannot be serialized"));
  }
  absl::StatusOr<v1::FastReply> frame = Call(r);
  if (!frame.ok()) return frame.status();
  if (!reply->ParseFromString(frame->reply())) {
    return absl::InternalError(absl::StrCat("fast socket ", options_.path, ": the reply to ",
                                            method, " is not a ",
                                            reply->GetDescriptor()->full_name()));
  }
  SeeBackend(*reply);
  return absl::OkStatus();
}

template <typename Reply>
absl::StatusOr<Reply> FastSocket::Typed(absl::string_view method,
                                        const google::protobuf::Message& request) {
  Reply reply;
  if (absl::Status s = Invoke(method, request, &reply); !s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::QuantizeReply> FastSocket::Quantize(const v1::QuantizeRequest& request) {
  return Typed<v1::QuantizeReply>("Quantize", request);
}

absl::StatusOr<v1::DequantizeReply> FastSocket::Dequantize(const v1::DequantizeRequest& request) {
  return Typed<v1::DequantizeReply>("Dequantize", request);
}

absl::StatusOr<v1::QdqReply> FastSocket::Qdq(const v1::QdqRequest& request) {
  return Typed<v1::QdqReply>("Qdq", request);
}

absl::StatusOr<v1::MatmulReply> FastSocket::Matmul(const v1::MatmulRequest& request) {
  return Typed<v1::MatmulReply>("Matmul", request);
}

absl::StatusOr<v1::UpdateWeightReply> FastSocket::UpdateWeight(
    const v1::UpdateWeightRequest& request) {
  return Typed<v1::UpdateWeightReply>("UpdateWeight", request);
}

absl::StatusOr<v1::StepReply> FastSocket::Step(const v1::StepRequest& request) {
  return Typed<v1::StepReply>("Step", request);
}

absl::StatusOr<v1::GetWeightReply> FastSocket::GetWeight(const v1::GetWeightRequest& request) {
  return Typed<v1::GetWeightReply>("GetWeight", request);
}

absl::StatusOr<v1::KeepAliveReply> FastSocket::KeepAlive() {
  return Typed<v1::KeepAliveReply>("KeepAlive", v1::KeepAliveRequest());
}

absl::StatusOr<v1::ListTensorsReply> FastSocket::ListTensors() {
  return Typed<v1::ListTensorsReply>("ListTensors", v1::ListTensorsRequest());
}

absl::StatusOr<v1::ServerInfoReply> FastSocket::ServerInfo() {
  return Typed<v1::ServerInfoReply>("ServerInfo", v1::ServerInfoRequest());
}

}  // namespace fp4q::client
