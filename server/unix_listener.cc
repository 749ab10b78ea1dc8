#include "server/unix_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace fp4q::server {
namespace {

constexpr char kFdPeerPrefix[] = "fd:";

absl::Status Errno(absl::string_view flag, absl::string_view what, const std::string& path,
                   int err) {
  return absl::UnavailableError(
      absl::StrCat("--", flag, ": ", what, " ", path, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<std::set<uid_t>> ParseUidList(absl::string_view text, absl::string_view flag) {
  std::set<uid_t> uids;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    uint64_t v = 0;
    const bool digits = !item.empty() && item.find_first_not_of("0123456789") == item.npos;
    if (!digits || !absl::SimpleAtoi(item, &v) || v >= std::numeric_limits<uid_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", item.substr(0, 32),
                                                     "' is not a uid (comma-separated numbers)"));
    }
    uids.insert(static_cast<uid_t>(v));
  }
  return uids;
}

absl::StatusOr<int> ListenUnix(const std::string& path, int type, bool owner_only,
                               absl::string_view flag) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' is empty or over ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--", flag, ": ", path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());  // stale socket of an earlier run
  }
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno(flag, "socket", path, errno);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno(flag, "bind", path, err);
  }
  if (::chmod(path.c_str(), owner_only ? 0600 : 0666) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Errno(flag, "chmod/listen", path, err);
  }
  return fd;
}

std::optional<PeerInfo> UnixPeer(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    return std::nullopt;
  }
  PeerInfo peer;
  peer.transport = PeerInfo::Transport::kUnix;
  peer.uid = cred.uid;
  peer.pid = cred.pid;
  return peer;
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Create(const std::string& path,
                                                                   std::set<uid_t> allowed_uids,
                                                                   Logger* logger) {
  if (allowed_uids.empty()) {
    return absl::InvalidArgumentError("--unix_socket_allowed_uids: no uid allowed");
  }
  const bool owner_only = allowed_uids.size() == 1 && *allowed_uids.begin() == ::geteuid();
  absl::StatusOr<int> fd = ListenUnix(path, SOCK_STREAM, owner_only, "unix_socket");
  if (!fd.ok()) return fd.status();
  std::unique_ptr<UnixListener> l(new UnixListener(path, std::move(allowed_uids), logger));
  l->listen_fd_ = *fd;
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake_fd_ < 0) return Errno("unix_socket", "eventfd for", path, errno);
  return l;
}

UnixListener::~UnixListener() {
  Stop();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(path_.c_str());
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void UnixListener::Start(grpc::Server* server) {
  if (thread_.joinable()) return;
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // Cannot happen for a fresh eventfd; the poll timeout below ends the loop
    // anyway.
  }
  thread_.join();
}

void UnixListener::AcceptLoop(grpc::Server* server) {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    const int n = ::poll(fds, 2, /*timeout_ms=*/1000);
    if (n < 0 && errno != EINTR) {
      logger_->Error("unix socket: poll failed", {{"error", std::strerror(errno)}});
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (fds[1].revents != 0) return;
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    while (true) {
      // Non-blocking, as gRPC's endpoints expect.
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        Accept(server, fd);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        logger_->Warning("unix socket: accept failed; retrying", {{"error", std::strerror(errno)}});
        absl::SleepFor(absl::Milliseconds(100));
      }
      break;  // EAGAIN: drained
    }
  }
}

void UnixListener::Accept(grpc::Server* server, int fd) {
  const std::optional<PeerInfo> peer = UnixPeer(fd);
  if (!peer.has_value() || allowed_.count(static_cast<uid_t>(peer->uid)) == 0) {
    // Logged before the close, so a peer that sees its connection end finds the line written.
    const int64_t refused = ++refused_;
    const absl::Time now = absl::Now();
    if (now - last_refusal_log_ >= absl::Seconds(1)) {
      last_refusal_log_ = now;
      logger_->Warning("unix socket: peer refused (uid not in --unix_socket_allowed_uids)",
                       {{"peer_uid", peer ? absl::StrCat(peer->uid) : "unknown"},
                        {"peer_pid", peer ? absl::StrCat(peer->pid) : "unknown"},
                        {"refused_total", absl::StrCat(refused)}});
    }
    ::close(fd);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_[fd] = *peer;
  }
  ++accepted_;
  grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns the fd from here on
}

std::optional<PeerInfo> UnixListener::Find(absl::string_view peer) const {
  if (!absl::ConsumePrefix(&peer, kFdPeerPrefix)) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

}  // namespace fp4q::server
