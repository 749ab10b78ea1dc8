// FastSocket's busy-poll policy (FastSocketOptions::spin, FastSocket::SpinFor, stats()) against
// a fake fast-socket server in this process: the automatic spin per method, the CPU backend
// turning it off, a fixed spin, and the options Connect refuses.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fp4q/client/fast_socket.h"
#include "fp4q/v1/fp4q.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint32_t kLeaseSeconds = 30;
// A server delay the spins under test (at most kAutoSpinMax = 2 ms) cannot wait out.
constexpr absl::Duration kSlowReply = absl::Milliseconds(5);

// A fast-socket server for one connection: answers the hello, then each call with its method's
// reply message after that method's delay, with that method's backend in the reply.
class FakeFastServer {
 public:
  struct Behaviour {
    absl::Duration delay = absl::ZeroDuration();
    std::string backend = "cuda";
  };

  FakeFastServer() {
    static std::atomic<int> next{0};
    path_ = absl::StrCat("/tmp/fp4q_spin_test_", ::getpid(), "_", next++, ".sock");
    ::unlink(path_.c_str());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 1) != 0 || ::pipe2(stop_, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "fake fast socket " << path_ << ": " << std::strerror(errno);
      return;
    }
    thread_ = std::thread([this] { Serve(); });
  }

  ~FakeFastServer() {
    if (stop_[1] >= 0) {
      const char byte = 0;
      (void)!::write(stop_[1], &byte, 1);
    }
    if (thread_.joinable()) thread_.join();
    for (int fd : {listen_fd_, stop_[0], stop_[1]}) {
      if (fd >= 0) ::close(fd);
    }
    ::unlink(path_.c_str());
  }

  FakeFastServer(const FakeFastServer&) = delete;
  FakeFastServer& operator=(const FakeFastServer&) = delete;

  const std::string& path() const { return path_; }

  // How calls of `method` are answered from now on (default: at once, backend "cuda").
  void Set(const std::string& method, Behaviour behaviour) {
    absl::MutexLock lock(&mu_);
    behaviours_[method] = std::move(behaviour);
  }

  int calls(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

  // The heads-up limit its ServerInfo replies report (0 by default: it takes none).
  void SetHeadsUpLimit(uint32_t micros) {
    absl::MutexLock lock(&mu_);
    heads_up_limit_ = micros;
  }
  // The heads_up_micros of the heads-up frames received (answered by nothing).
  std::vector<uint32_t> heads_ups() const {
    absl::MutexLock lock(&mu_);
    return heads_ups_;
  }

 private:
  // Waits until `fd` is readable; false once the destructor asked the thread to stop.
  bool WaitFor(int fd) const {
    while (true) {
      pollfd p[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      if (p[1].revents != 0) return false;
      if (p[0].revents != 0) return true;
    }
  }

  void Serve() {
    if (!WaitFor(listen_fd_)) return;
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return;
    std::vector<char> buffer(v1::FAST_SOCKET_MAX_FRAME_BYTES + 1);
    while (WaitFor(conn)) {
      const ssize_t n = ::recv(conn, buffer.data(), buffer.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the client closed the connection
      v1::FastRequest request;
      v1::FastReply reply;
      const bool parsed = request.ParseFromArray(buffer.data(), static_cast<int>(n));
      if (parsed && request.heads_up_micros() != 0) {
        absl::MutexLock lock(&mu_);
        heads_ups_.push_back(request.heads_up_micros());
        continue;  // as fp4qd: no reply
      }
      if (!parsed) {
        reply.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        reply.set_message("not a fp4q.v1.FastRequest");
      } else {
        reply.set_call_id(request.call_id());
        Answer(request, &reply);
      }
      const std::string frame = reply.SerializeAsString();
      if (::send(conn, frame.data(), frame.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(frame.size())) {
        break;
      }
    }
    ::close(conn);
  }

  void Answer(const v1::FastRequest& request, v1::FastReply* reply) {
    if (request.has_hello()) {
      reply->mutable_hello()->set_lease_seconds(kLeaseSeconds);
      return;
    }
    Behaviour behaviour;
    {
      absl::MutexLock lock(&mu_);
      ++calls_[request.method()];
      auto it = behaviours_.find(request.method());
      if (it != behaviours_.end()) behaviour = it->second;
    }
    if (behaviour.delay > absl::ZeroDuration()) absl::SleepFor(behaviour.delay);
    v1::ReplyHeader header;
    header.set_backend(behaviour.backend);
    std::string bytes;
    if (request.method() == "Step") {
      v1::StepReply r;
      *r.mutable_header() = header;
      bytes = r.SerializeAsString();
    } else if (request.method() == "UpdateWeight") {
      v1::UpdateWeightReply r;
      *r.mutable_header() = header;
      r.set_applied(true);
      bytes = r.SerializeAsString();
    } else if (request.method() == "ServerInfo") {
      v1::ServerInfoReply r;
      *r.mutable_header() = header;
      r.set_backend(behaviour.backend);
      {
        absl::MutexLock lock(&mu_);
        r.mutable_limits()->set_fast_socket_max_heads_up_micros(heads_up_limit_);
      }
      bytes = r.SerializeAsString();
    } else if (request.method() == "KeepAlive") {
      v1::KeepAliveReply r;
      *r.mutable_header() = header;
      r.set_lease_seconds(kLeaseSeconds);
      bytes = r.SerializeAsString();
    } else {
      reply->set_code(static_cast<int>(absl::StatusCode::kUnimplemented));
      reply->set_message(absl::StrCat("fake fast socket: no method ", request.method()));
      return;
    }
    reply->set_code(0);
    reply->set_reply(std::move(bytes));
  }

  std::string path_;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::map<std::string, Behaviour> behaviours_;  // mu_
  std::map<std::string, int> calls_;             // mu_
  uint32_t heads_up_limit_ = 0;                  // mu_
  std::vector<uint32_t> heads_ups_;              // mu_
};

std::unique_ptr<FastSocket> ConnectTo(const FakeFastServer& server,
                                      std::optional<absl::Duration> spin = std::nullopt) {
  FastSocketOptions options;
  options.path = server.path();
  options.timeout = absl::Seconds(10);
  options.spin = spin;
  absl::StatusOr<std::unique_ptr<FastSocket>> s = FastSocket::Connect(options, "session-1");
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_EQ((*s)->lease_seconds(), kLeaseSeconds);
  return *std::move(s);
}

uint64_t Waited(const FastSocketStats& s) { return s.polled + s.polled_then_slept; }

// Steps until one call's round trip, timed here around the call, is under kAutoSpinMax (the
// first, nearly always, even on a loaded machine); returns that time. `spun` counts the calls
// that busy-polled (SpinFor("Step") > 0 before them).
absl::Duration FastStep(FastSocket& socket, uint64_t* spun) {
  absl::Duration elapsed = absl::InfiniteDuration();
  for (int i = 0; i < 50 && elapsed >= FastSocket::kAutoSpinMax; ++i) {
    if (socket.SpinFor("Step") > absl::ZeroDuration()) ++*spun;
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::StepReply> r = socket.Step(v1::StepRequest());
    elapsed = absl::Now() - start;
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
  }
  return elapsed;
}

TEST(FastSocketSpin, AutomaticSpinFollowsEachMethodsLastRoundTrip) {
  FakeFastServer server;
  std::unique_ptr<FastSocket> socket = ConnectTo(server);
  ASSERT_NE(socket, nullptr);
  const absl::Duration max = FastSocket::kAutoSpinMax;
  EXPECT_EQ(max, absl::Milliseconds(2));

  // Before any Step or UpdateWeight: the most; never for the other methods.
  EXPECT_EQ(socket->SpinFor("Step"), max);
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), max);
  EXPECT_EQ(socket->SpinFor("KeepAlive"), absl::ZeroDuration());
  EXPECT_EQ(socket->SpinFor("ServerInfo"), absl::ZeroDuration());
  EXPECT_EQ(socket->SpinFor("Quantize"), absl::ZeroDuration());
  EXPECT_EQ(Waited(socket->stats()), 0u);  // the hello did not spin

  // A Step answered at once: twice its round trip (at most twice the time seen here), capped.
  uint64_t spun = 0;
  const absl::Duration fast = FastStep(*socket, &spun);
  ASSERT_LT(fast, max) << "no Step came back within " << max << " in 50 tries";
  EXPECT_GE(spun, 1u);
  const absl::Duration step_spin = socket->SpinFor("Step");
  EXPECT_GT(step_spin, absl::ZeroDuration());
  EXPECT_LE(step_spin, max);
  EXPECT_LE(step_spin, 2 * fast);
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), max);  // per method: still never measured
  EXPECT_EQ(socket->SpinFor("KeepAlive"), absl::ZeroDuration());
  EXPECT_EQ(Waited(socket->stats()), spun);

  // A Step the server holds 5 ms: the spin (<= 2 ms) runs out, the thread sleeps for it, and
  // the next Step does not spin from the send: it sleeps until 2 ms before the last round
  // trip's time, then busy-polls (kAutoWakeMax's rule).
  server.Set("Step", {kSlowReply, "cuda"});
  FastSocketStats before = socket->stats();
  ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
  FastSocketStats after = socket->stats();
  EXPECT_EQ(after.polled, before.polled);
  EXPECT_EQ(after.polled_then_slept, before.polled_then_slept + 1);
  EXPECT_GE(after.polled_then_slept, 1u);
  EXPECT_EQ(Waited(after), spun + 1);  // 2 after two Steps, unless the first fast one was slow
  EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), max);
  std::optional<absl::Duration> wake = socket->WakeAfter("Step");
  ASSERT_TRUE(wake.has_value());
  EXPECT_GE(*wake, kSlowReply - max);
  EXPECT_EQ(socket->WakeAfter("UpdateWeight"), std::nullopt);  // not measured yet
  EXPECT_EQ(socket->WakeAfter("KeepAlive"), std::nullopt);

  // Another slow Step: counted once, by one of the sleep-then-poll outcomes.
  before = socket->stats();
  ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
  after = socket->stats();
  EXPECT_EQ(Waited(after) + after.replied_before_spin,
            Waited(before) + before.replied_before_spin + 1);
  EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());

  // KeepAlive never spins: nothing counted.
  before = socket->stats();
  ASSERT_TRUE(socket->KeepAlive().ok());
  after = socket->stats();
  EXPECT_EQ(after.polled, before.polled);
  EXPECT_EQ(after.polled_then_slept, before.polled_then_slept);

  // A fast round trip again brings the spin back.
  server.Set("Step", {absl::ZeroDuration(), "cuda"});
  uint64_t spun_again = 0;
  const absl::Duration fast_again = FastStep(*socket, &spun_again);
  ASSERT_LT(fast_again, max);
  EXPECT_GT(socket->SpinFor("Step"), absl::ZeroDuration());
  EXPECT_LE(socket->SpinFor("Step"), std::min(2 * fast_again, max));
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), max);
  EXPECT_EQ(server.calls("KeepAlive"), 1);
}

// HeadsUp sends nothing before the server said it takes heads-ups, and nothing to a server that
// takes none; after an idle gap on a server that takes them it sends one frame, which nothing
// answers (the next call's reply is its own).
TEST(FastSocketHeadsUp, SentAfterAnIdleGapWhereTheServerTakesThem) {
  FakeFastServer server;
  std::unique_ptr<FastSocket> socket = ConnectTo(server);
  ASSERT_NE(socket, nullptr);
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(socket->HeadsUp()) << "sent before any ServerInfo reply";
  ASSERT_TRUE(socket->ServerInfo().ok());  // limit 0: takes none
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(socket->HeadsUp());

  server.SetHeadsUpLimit(1500);
  ASSERT_TRUE(socket->ServerInfo().ok());
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(socket->HeadsUp());
  EXPECT_EQ(socket->stats().heads_ups, 1u);
  absl::StatusOr<v1::StepReply> step = socket->Step(v1::StepRequest());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(server.calls("Step"), 1);
  // The frame carried the server's limit (under the client's 2000 us), and nothing else.
  EXPECT_EQ(server.heads_ups(), std::vector<uint32_t>({1500u}));
  ASSERT_TRUE(socket->KeepAlive().ok());

  // A server limit over the client's own: the client's.
  server.SetHeadsUpLimit(5000);
  ASSERT_TRUE(socket->ServerInfo().ok());
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(socket->HeadsUp());
  ASSERT_TRUE(socket->KeepAlive().ok());
  EXPECT_EQ(server.heads_ups(), std::vector<uint32_t>({1500u, FastSocket::kHeadsUpMicros}));
  EXPECT_EQ(socket->stats().heads_ups, 2u);
}

TEST(FastSocketSpin, CpuBackendTurnsTheAutomaticSpinOff) {
  FakeFastServer server;
  server.Set("Step", {absl::ZeroDuration(), "cpu"});
  std::unique_ptr<FastSocket> socket = ConnectTo(server);
  ASSERT_NE(socket, nullptr);
  const absl::Duration max = FastSocket::kAutoSpinMax;

  // The first Step spins (the backend is not known yet); its reply says "cpu".
  EXPECT_EQ(socket->SpinFor("Step"), max);
  ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
  EXPECT_EQ(Waited(socket->stats()), 1u);
  EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::ZeroDuration());

  // Later Steps to the CPU server do not spin: nothing counted.
  ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
  ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
  EXPECT_EQ(Waited(socket->stats()), 1u);
  EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());

  // KeepAlive's header is not where the backend is learnt.
  server.Set("KeepAlive", {absl::ZeroDuration(), "cuda"});
  ASSERT_TRUE(socket->KeepAlive().ok());
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::ZeroDuration());

  // ServerInfo says "cuda": UpdateWeight, never measured, spins the most again.
  server.Set("ServerInfo", {absl::ZeroDuration(), "cuda"});
  absl::StatusOr<v1::ServerInfoReply> info = socket->ServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->backend(), "cuda");
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), max);
  EXPECT_EQ(socket->SpinFor("KeepAlive"), absl::ZeroDuration());
  EXPECT_EQ(Waited(socket->stats()), 1u);

  // An UpdateWeight reply saying "cpu" turns it off again, for both methods.
  server.Set("UpdateWeight", {absl::ZeroDuration(), "cpu"});
  ASSERT_TRUE(socket->UpdateWeight(v1::UpdateWeightRequest()).ok());
  EXPECT_EQ(Waited(socket->stats()), 2u);  // that UpdateWeight spun
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::ZeroDuration());
  EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());

  // A reply without a backend changes nothing.
  server.Set("ServerInfo", {absl::ZeroDuration(), ""});
  ASSERT_TRUE(socket->ServerInfo().ok());
  EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::ZeroDuration());
  EXPECT_EQ(server.calls("Step"), 3);
}

TEST(FastSocketSpin, FixedSpinAppliesToEveryReply) {
  {
    FakeFastServer server;
    server.Set("Step", {absl::ZeroDuration(), "cpu"});
    std::unique_ptr<FastSocket> socket = ConnectTo(server, absl::Milliseconds(50));
    ASSERT_NE(socket, nullptr);
    for (const char* method : {"Step", "UpdateWeight", "KeepAlive", "ServerInfo", "Quantize"}) {
      EXPECT_EQ(socket->SpinFor(method), absl::Milliseconds(50)) << method;
    }
    EXPECT_EQ(Waited(socket->stats()), 0u);  // the hello is not busy-polled for
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(socket->KeepAlive().ok());
    FastSocketStats s = socket->stats();
    EXPECT_EQ(s.polled, 3u);
    EXPECT_EQ(s.polled_then_slept, 0u);
    // Neither a measured round trip nor a CPU backend changes a fixed spin.
    ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
    EXPECT_EQ(socket->SpinFor("Step"), absl::Milliseconds(50));
    EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::Milliseconds(50));
    s = socket->stats();
    EXPECT_EQ(Waited(s), 4u);
  }
  {
    // Zero: always sleep in poll(), nothing counted.
    FakeFastServer server;
    std::unique_ptr<FastSocket> socket = ConnectTo(server, absl::ZeroDuration());
    ASSERT_NE(socket, nullptr);
    EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());
    EXPECT_EQ(socket->SpinFor("UpdateWeight"), absl::ZeroDuration());
    ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
    ASSERT_TRUE(socket->KeepAlive().ok());
    const FastSocketStats s = socket->stats();
    EXPECT_EQ(s.polled, 0u);
    EXPECT_EQ(s.polled_then_slept, 0u);
    EXPECT_EQ(socket->SpinFor("Step"), absl::ZeroDuration());
  }
  {
    // 1 ms against a reply the server holds 5 ms: the spin runs out, then the thread sleeps.
    FakeFastServer server;
    server.Set("Step", {kSlowReply, "cuda"});
    std::unique_ptr<FastSocket> socket = ConnectTo(server, absl::Milliseconds(1));
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(socket->Step(v1::StepRequest()).ok());
    const FastSocketStats s = socket->stats();
    EXPECT_EQ(s.polled, 0u);
    EXPECT_EQ(s.polled_then_slept, 1u);
    EXPECT_EQ(socket->SpinFor("Step"), absl::Milliseconds(1));
  }
}

TEST(FastSocketSpin, ConnectRefusesBadOptions) {
  FastSocketOptions options;
  options.path = "/nonexistent/fp4q_spin_test.sock";  // never reached
  options.spin = absl::Microseconds(-1);
  EXPECT_THAT(FastSocket::Connect(options, "session-1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("FastSocketOptions.spin")));

  options.spin = std::nullopt;
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(FastSocket::Connect(options, "session-1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("FastSocketOptions.timeout")));
  options.timeout = -absl::Seconds(1);
  EXPECT_THAT(FastSocket::Connect(options, "session-1"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("FastSocketOptions.timeout")));
}

}  // namespace
}  // namespace fp4q::client
