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
#include <optional>
#include <string>
#include <utility>

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
  // Sends `r` without waiting for anything.
  bool Send(const v1::FastRequest& r) {
    const std::string bytes = r.SerializeAsString();
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Sends `a` and `b` as two frames in one system call.
  bool SendBoth(const v1::FastRequest& a, const v1::FastRequest& b) {
    std::string bytes[2] = {a.SerializeAsString(), b.SerializeAsString()};
    iovec iov[2];
    mmsghdr msgs[2] = {};
    for (int i = 0; i < 2; ++i) {
      iov[i] = {bytes[i].data(), bytes[i].size()};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    return ::sendmmsg(fd_, msgs, 2, MSG_NOSIGNAL) == 2;
  }
  // The next frame (code -1 when none came within 10 s).
  v1::FastReply Reply() {
    v1::FastReply reply;
    std::string buf(1 << 16, '\0');
    const ssize_t n = Readable(10000) ? ::recv(fd_, buf.data(), buf.size(), 0) : -1;
    if (n <= 0 || !reply.ParseFromArray(buf.data(), static_cast<int>(n))) reply.set_code(-1);
    return reply;
  }
  // Whether a frame is waiting to be read within `ms`.
  bool Readable(int ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) == 1;
  }
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

// A Quantize of a 1 x 16 f32 tensor sent inline: work for the device executor.
v1::FastRequest QuantizeCall(uint64_t id) {
  v1::QuantizeRequest q;
  v1::Tensor* t = q.mutable_input();
  t->add_shape(1);
  t->add_shape(16);
  t->set_dtype(v1::DTYPE_F32);
  std::string bytes(16 * sizeof(float), '\0');
  for (int i = 0; i < 16; ++i) {
    const float v = 0.25f * static_cast<float>(i - 7);
    std::memcpy(bytes.data() + sizeof(float) * i, &v, sizeof(float));
  }
  t->set_inline_data(bytes);
  v1::FastRequest r;
  r.set_call_id(id);
  r.set_method("Quantize");
  r.set_request(q.SerializeAsString());
  return r;
}

std::pair<uint64_t, int> IdAndCode(const v1::FastReply& r) { return {r.call_id(), r.code()}; }
std::pair<uint64_t, int> Want(uint64_t id, absl::StatusCode code) {
  return {id, static_cast<int>(code)};
}

v1::FastRequest HeadsUp(uint32_t micros, uint64_t id = 0) {
  v1::FastRequest r;
  r.set_call_id(id);
  r.set_heads_up_micros(micros);
  return r;
}

// A fast socket server over an engine on the fake IPC backend, for the heads-up and wake-up
// tests.
class ServedTest : public ::testing::Test {
 protected:
  void Serve(std::optional<absl::Duration> spin, int cpus, bool idle_inline = true) {
    EngineOptions eo;
    eo.allow_cuda_ipc = true;
    eo.cpu_workers = 1;
    eo.idle_inline = idle_inline;
    auto engine = FakeIpcEngine(eo, nullptr);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    layer_ = std::make_unique<CallLayer>(engine_.get(), nullptr, CallLayerOptions{});
    FastSocketOptions o;
    o.path = absl::StrCat("/tmp/fp4q-fast-served-", ::getpid(), ".sock");
    o.allowed_uids = {::geteuid()};
    o.spin = spin;
    o.usable_cpus = cpus;
    auto server = FastSocketServer::Create(layer_.get(), nullptr, o, &logger_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->Start();
    path_ = o.path;
  }
  // A connection bound to a new session.
  std::unique_ptr<Peer> Bound() {
    auto peer = std::make_unique<Peer>(path_);
    EXPECT_TRUE(peer->connected());
    v1::FastRequest hello;
    hello.set_call_id(1);
    hello.mutable_hello()->set_session_id(engine_->OpenSession("heads-up")->session_id);
    EXPECT_EQ(peer->Call(hello).code(), 0);
    return peer;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
  }

  Logger logger_{LogFormat::kText, stderr};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<CallLayer> layer_;
  std::unique_ptr<FastSocketServer> server_;
  std::string path_;
};
class HeadsUpTest : public ServedTest {};

// Under the automatic spin a connection's thread is woken after its last call's reply, to
// busy-poll for the next: by the thread that answered it. A call run on the connection's own
// thread (--idle_inline, its device idle) wakes nobody, since that thread is awake.
class ReleaseWakeupTest : public ServedTest, public ::testing::WithParamInterface<bool> {};

TEST_P(ReleaseWakeupTest, OnlyACallAnsweredOnAnotherThreadWakesTheConnectionsThread) {
  const bool inline_runs = GetParam();
  Serve(std::nullopt, 16, inline_runs);  // the automatic spin, as with 16 CPUs
  auto peer = Bound();
  const int64_t before = server_->release_wakeups();
  for (uint64_t id = 2; id < 42; ++id) {
    const v1::FastReply r = peer->Call(QuantizeCall(id));
    ASSERT_EQ(r.code(), 0) << r.message();
    ASSERT_EQ(r.call_id(), id);
  }
  const int64_t woken = server_->release_wakeups() - before;
  if (inline_runs) {
    EXPECT_EQ(woken, 0);
  } else {
    // Most calls' (none for the first, no gap known yet; none after a gap over 2 ms, which a
    // busy 2-core machine leaves now and then: 37 to 39 of 40 there).
    EXPECT_GE(woken, 10);
  }
}

INSTANTIATE_TEST_SUITE_P(IdleInline, ReleaseWakeupTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "OnTheConnectionsThread" : "OnTheDeviceWorkers";
                         });

// The limit ServerInfo reports follows the spin policy: none where the threads never spin.
TEST(FastSocketHeadsUpLimit, FollowsTheSpinPolicy) {
  EXPECT_EQ(FastSocketServer::HeadsUpLimitMicros(std::nullopt, 16), 2000u);
  EXPECT_EQ(FastSocketServer::HeadsUpLimitMicros(std::nullopt, 7), 0u);  // too few CPUs
  EXPECT_EQ(FastSocketServer::HeadsUpLimitMicros(absl::ZeroDuration(), 16), 0u);
  EXPECT_EQ(FastSocketServer::HeadsUpLimitMicros(absl::Microseconds(50), 2), 2000u);
}

// A caller back every 5 ms finds the thread asleep (the automatic spin's 2 ms are past), unless
// it sends a heads-up first: the call then comes to a busy-polling thread, and the heads-up
// itself is answered by nothing (each call's reply is the next frame, with its own call_id).
TEST_F(HeadsUpTest, TheCallAfterAHeadsUpFindsTheThreadPolling) {
  Serve(std::nullopt, 16);
  ASSERT_EQ(server_->heads_up_limit_micros(), 2000u);
  std::unique_ptr<Peer> peer = Bound();
  uint64_t id = 2;
  for (int i = 0; i < 10; ++i, ++id) {
    absl::SleepFor(absl::Milliseconds(5));
    const v1::FastReply r = peer->Call(KeepAlive(id));
    ASSERT_EQ(r.code(), 0) << r.message();
    ASSERT_EQ(r.call_id(), id);
  }
  EXPECT_EQ(server_->spin_pickups(), 0);
  for (int i = 0; i < 10; ++i, ++id) {
    absl::SleepFor(absl::Milliseconds(5));
    // Both frames in one sendmmsg: the call follows the heads-up at once.
    ASSERT_TRUE(peer->SendBoth(HeadsUp(2000), KeepAlive(id)));
    const v1::FastReply r = peer->Reply();
    ASSERT_EQ(r.code(), 0) << r.message();
    ASSERT_EQ(r.call_id(), id);
  }
  EXPECT_FALSE(peer->Readable(50)) << "a heads-up got a reply";
  EXPECT_EQ(server_->heads_ups(), 10);
  // The calls are read by the spin their heads-ups started (the heads-up itself by poll), where
  // without heads-ups none was. Not always every one on a 2-core machine: the kernel may
  // reschedule between sendmmsg's two frames, and the spinning thread may hold the core this
  // thread needs to send the second until its spin is over. The thread counts a pickup once the
  // call it read is handled, after its reply: the 50 ms above let the last one land.
  EXPECT_GE(server_->spin_pickups(), 5);
  // A heads-up whose call never comes: the thread goes back to sleep, and serves the next one.
  const int64_t picked = server_->spin_pickups();
  ASSERT_TRUE(peer->Send(HeadsUp(100)));
  absl::SleepFor(absl::Milliseconds(20));
  const v1::FastReply r = peer->Call(KeepAlive(id));
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.call_id(), id);
  EXPECT_EQ(server_->spin_pickups(), picked);
}

// Heads-ups a server does not take, or that are malformed, are refused by field; the connection
// goes on serving.
TEST_F(HeadsUpTest, BadHeadsUpsAreRefusedByField) {
  Serve(std::nullopt, 16);
  {
    Peer unbound(path_);
    ASSERT_TRUE(unbound.connected());
    const v1::FastReply r = unbound.Call(HeadsUp(100, 7));
    EXPECT_EQ(IdAndCode(r), Want(7, absl::StatusCode::kFailedPrecondition));
    EXPECT_EQ(r.message(),
              "FastRequest.heads_up_micros: the connection is not bound to a session; its first "
              "frame must be a hello naming an open session");
  }
  std::unique_ptr<Peer> peer = Bound();
  v1::FastReply r = peer->Call(HeadsUp(2001, 8));
  EXPECT_EQ(IdAndCode(r), Want(8, absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.message(),
            "FastRequest.heads_up_micros: 2001 exceeds this fp4qd's limit of 2000 (ServerInfo "
            "limits.fast_socket_max_heads_up_micros)");
  v1::FastRequest both = KeepAlive(9);
  both.set_heads_up_micros(100);
  r = peer->Call(both);
  EXPECT_EQ(IdAndCode(r), Want(9, absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.message(),
            "FastRequest.heads_up_micros: set beside a method or a hello (a heads-up is a frame "
            "of its own, answered by nothing)");
  EXPECT_EQ(server_->heads_ups(), 0);
  r = peer->Call(KeepAlive(10));
  EXPECT_EQ(IdAndCode(r), Want(10, absl::StatusCode::kOk));
}

TEST_F(HeadsUpTest, AServerWhoseThreadsNeverSpinTakesNone) {
  Serve(absl::ZeroDuration(), 16);
  EXPECT_EQ(server_->heads_up_limit_micros(), 0u);
  std::unique_ptr<Peer> peer = Bound();
  v1::FastReply r = peer->Call(HeadsUp(1, 4));
  EXPECT_EQ(IdAndCode(r), Want(4, absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.message(),
            "FastRequest.heads_up_micros: this fp4qd takes no heads-ups (ServerInfo "
            "limits.fast_socket_max_heads_up_micros is 0: its fast socket threads never "
            "busy-poll)");
  r = peer->Call(KeepAlive(5));
  EXPECT_EQ(IdAndCode(r), Want(5, absl::StatusCode::kOk));
}

}  // namespace
}  // namespace fp4q::server
