// fp4qd's fast socket (server/fast_socket.h) in this process, over an engine on the fake IPC
// backend: the connection thread's automatic spin (spin_policy.h) against a caller that comes
// back quickly and one that does not. (The end-to-end tests start fp4qd on the CPU backend,
// where the automatic spin never runs, and on a 2-core CI machine it would not either: here the
// server is told it may use 16 CPUs.)
#include "server/fast_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine_test_util.h"
#include "fp4q/v1/fp4q.pb.h"
#include "gtest/gtest.h"
#include "server/call_layer.h"
#include "server/engine.h"
#include "server/logging.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::FakeIpcEngine;

// One SOCK_SEQPACKET connection: a frame out, a frame back.
class Peer {
 public:
  explicit Peer(const std::string& path)
      : fd_(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Peer() { ::close(fd_); }
  bool connected() const { return connected_; }
  // Sends `r` and returns the reply (code -1 when none came within 10 s).
  v1::FastReply Call(const v1::FastRequest& r) {
    v1::FastReply reply;
    const std::string bytes = r.SerializeAsString();
    pollfd p{fd_, POLLIN, 0};
    std::string buf(1 << 16, '\0');
    const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent != static_cast<ssize_t>(bytes.size()) || ::poll(&p, 1, 10000) != 1) {
      reply.set_code(-1);
      return reply;
    }
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n <= 0 || !reply.ParseFromArray(buf.data(), static_cast<int>(n))) reply.set_code(-1);
    return reply;
  }

 private:
  const int fd_;
  bool connected_ = false;
};

v1::FastRequest KeepAlive(uint64_t id) {
  v1::FastRequest r;
  r.set_call_id(id);
  r.set_method("KeepAlive");
  r.set_request(v1::KeepAliveRequest().SerializeAsString());
  return r;
}

// A caller back 300 us after each reply finds the connection's thread busy-polling (it reads
// the frame without a wake-up); one back after 5 ms does not, and no thread spins for it.
TEST(FastSocketServerTest, AutomaticSpinPicksUpACallerThatComesBackWithin2Ms) {
  EngineOptions eo;
  eo.allow_cuda_ipc = true;
  eo.cpu_workers = 1;
  auto engine = FakeIpcEngine(eo, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  CallLayer layer(engine->get(), nullptr, CallLayerOptions{});
  Logger logger(LogFormat::kText, stderr);
  FastSocketOptions o;
  o.path = absl::StrCat("/tmp/fp4q-fast-spin-", ::getpid(), ".sock");
  o.allowed_uids = {::geteuid()};
  o.spin = std::nullopt;  // automatic
  o.usable_cpus = 16;
  auto server = FastSocketServer::Create(&layer, nullptr, o, &logger);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Start();
  Peer peer(o.path);
  ASSERT_TRUE(peer.connected());
  v1::FastRequest hello;
  hello.set_call_id(1);
  hello.mutable_hello()->set_session_id((*engine)->OpenSession("spin")->session_id);
  ASSERT_EQ(peer.Call(hello).code(), 0);

  uint64_t id = 2;
  const auto calls = [&](absl::Duration gap, int n) {
    for (int i = 0; i < n; ++i, ++id) {
      const v1::FastReply r = peer.Call(KeepAlive(id));
      ASSERT_EQ(r.code(), 0) << r.message();
      ASSERT_EQ(r.call_id(), id);
      absl::SleepFor(gap);
    }
  };
  calls(absl::Milliseconds(5), 20);
  EXPECT_EQ((*server)->spin_pickups(), 0) << "a 5 ms pace is past the automatic spin's 2 ms";
  calls(absl::Microseconds(300), 100);
  const int64_t picked = (*server)->spin_pickups();
  // 300 us after a reply the thread has been woken by it and is polling for the next frame.
  EXPECT_GE(picked, 10);
  calls(absl::Milliseconds(5), 20);
  EXPECT_LE((*server)->spin_pickups() - picked, 1) << "back to a slow pace: no spin after one gap";
  (*server)->Stop();
  std::printf("fast socket spin pickups: %lld of 100 calls 300 us apart\n",
              static_cast<long long>(picked));
}

}  // namespace
}  // namespace fp4q::server
