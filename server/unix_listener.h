// fp4qd's Unix-socket listener, with a peer-credential check per connection.
//
// Why fp4qd accepts on the socket itself: gRPC 1.51 tells a handler nothing
// about who is on the other end of a Unix socket. So the listener owns the
// accept loop: for each connection it reads SO_PEERCRED (uid, gid and pid of
// the process that connected), closes the connection at once when the uid is
// not allowed, else records the credentials under the connection's fd and hands
// the fd to gRPC (grpc::AddInsecureChannelFromFd). gRPC names such a
// connection's peer "fd:<N>", so a handler finds its credentials with
// Find(ctx->peer()). Connections on the TCP listener have peers "ipv4:..." /
// "ipv6:..." and no entry.
//
// Contract
// - Create: binds `path` (an earlier run's stale socket file is replaced; any
// other existing
//   file is an error, never removed) and listens. The file's mode is 0600 when
//   only the server's own uid is allowed, else 0666 (the uid check is then the
//   gate; the directory's permissions still apply). Start begins accepting into
//   `server`, which must be started and outlive the listener; Stop (and the
//   destructor) stops accepting and removes the socket file. Connections
//   already handed to gRPC stay gRPC's.
// - fd reuse: an entry is written before its fd reaches gRPC, and an fd number
// comes back from
//   accept only after gRPC closed the previous connection on it, so Find never
//   returns the credentials of another connection.
// - Refused peers are logged (uid, pid) at most once a second, with the count
// so far. Thread-safe.
#ifndef FP4Q_SERVER_UNIX_LISTENER_H_
#define FP4Q_SERVER_UNIX_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/logging.h"
#include "server/requests.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace fp4q::server {

// "1000,1001" -> {1000, 1001}; INVALID_ARGUMENT naming `flag` for anything else
// (empty items, signs, non-digits, values beyond uid_t).
absl::StatusOr<std::set<uid_t>> ParseUidList(absl::string_view text, absl::string_view flag);

// A listening, non-blocking, close-on-exec Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET)
// bound at `path`. An earlier run's stale socket file is replaced; any other existing file is
// an error, never removed. Mode 0600 when `owner_only`, else 0666. Errors name `flag`.
absl::StatusOr<int> ListenUnix(const std::string& path, int type, bool owner_only,
                               absl::string_view flag);

// The connecting process's credentials (SO_PEERCRED) as a kUnix PeerInfo; nullopt when the
// kernel does not say.
std::optional<PeerInfo> UnixPeer(int fd);

class UnixListener {
 public:
  // `logger` is not owned and outlives the listener. `allowed_uids` must not be
  // empty.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Create(const std::string& path,
                                                              std::set<uid_t> allowed_uids,
                                                              Logger* logger);
  ~UnixListener();  // Stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  void Start(grpc::Server* server);
  void Stop();

  // The credentials of the connection gRPC calls `peer` ("fd:<N>"); nullopt for
  // any other peer (TCP) or an fd this listener did not accept.
  std::optional<PeerInfo> Find(absl::string_view peer) const;

  const std::string& path() const { return path_; }
  int64_t accepted() const { return accepted_.load(); }
  int64_t refused() const { return refused_.load(); }

 private:
  UnixListener(std::string path, std::set<uid_t> allowed, Logger* logger)
      : path_(std::move(path)), allowed_(std::move(allowed)), logger_(logger) {}
  void AcceptLoop(grpc::Server* server);
  void Accept(grpc::Server* server, int fd);

  const std::string path_;
  const std::set<uid_t> allowed_;
  Logger* const logger_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() wakes the accept loop
  std::thread thread_;
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_{0};
  absl::Time last_refusal_log_ = absl::InfinitePast();  // accept thread only

  mutable std::mutex mu_;
  std::map<int, PeerInfo> peers_;  // by fd
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_UNIX_LISTENER_H_
