// End to end: fp4qd's --fast_socket (server/fast_socket.h) with the C++ client
// (client/include/fp4q/client/fast_socket.h) and raw frames.
// - The hostile-input table (e2e_bad_input.h) gives the same codes and messages over the fast
//   socket as over gRPC, and changes no state.
// - Results are byte-identical to gRPC's; pipelined calls all come back with their ids.
// - Frames that are not calls (garbage, oversized, no op, before hello) get INVALID_ARGUMENT
//   or FAILED_PRECONDITION and the connection stays usable; the uid check, the token, the
//   connection cap; a client that dies mid-call leaves no connection behind.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <map>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "e2e_bad_input.h"
#include "fp4q/client/fast_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::fp4q::client::FastSocket;
using ::fp4q::client::FastSocketOptions;
using ::testing::HasSubstr;
using ::testing::Not;

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::unique_ptr<FastSocket> Connect(const std::string& path, const std::string& session,
                                    const std::string& token = "") {
  FastSocketOptions o;
  o.path = path;
  o.auth_token = token;
  o.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(o, session);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

// A raw SOCK_SEQPACKET connection for frames the client library would never send.
class RawConnection {
 public:
  explicit RawConnection(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  bool SendBytes(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  bool Send(const v1::FastRequest& r) { return SendBytes(r.SerializeAsString()); }
  // The next reply; call_id -1 and the error in message when none came within `timeout`.
  v1::FastReply Receive(absl::Duration timeout = absl::Seconds(20)) {
    v1::FastReply reply;
    pollfd p{fd_, POLLIN, 0};
    std::string buf(70000, '\0');
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) {
      reply.set_code(-1);
      reply.set_message("no reply");
      return reply;
    }
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n <= 0 || !reply.ParseFromArray(buf.data(), static_cast<int>(n))) {
      reply.set_code(-1);
      reply.set_message(n == 0 ? "closed" : "undecodable reply");
    }
    return reply;
  }
  // True when the server closed the connection within `timeout`.
  bool ClosedByServer(absl::Duration timeout = absl::Seconds(10)) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return false;
    char c;
    return ::recv(fd_, &c, 1, MSG_DONTWAIT) == 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

v1::FastRequest Hello(const std::string& session, uint64_t id = 1) {
  v1::FastRequest r;
  r.set_call_id(id);
  r.mutable_hello()->set_session_id(session);
  return r;
}

// A call frame: `method` with `request` serialized.
v1::FastRequest Frame(uint64_t id, const std::string& method,
                      const google::protobuf::Message& request) {
  v1::FastRequest r;
  r.set_call_id(id);
  r.set_method(method);
  request.SerializeToString(r.mutable_request());
  return r;
}

v1::QuantizeRequest QuantizeOf(uint32_t seed, int64_t rows = 16, int64_t cols = 64) {
  v1::QuantizeRequest q;
  *q.mutable_input() = InlineTensor(RandomF32(rows * cols, seed), rows, cols);
  return q;
}

v1::FastRequest QuantizeFrame(uint64_t id, uint32_t seed, int64_t rows = 16, int64_t cols = 64) {
  return Frame(id, "Quantize", QuantizeOf(seed, rows, cols));
}

// The reply message of a successful call frame.
template <typename Reply>
Reply ReplyOf(const v1::FastReply& r) {
  Reply m;
  EXPECT_TRUE(m.ParseFromString(r.reply())) << "reply of call " << r.call_id();
  return m;
}

absl::StatusOr<double> Gauge(const ServerProcess& server, const std::string& name) {
  absl::StatusOr<std::string> text = HttpGet(server.metrics_address(), "/metrics");
  if (!text.ok()) return text.status();
  return MetricValue(*text, name);
}

TEST(E2eFastSocketTest, HostileTableGivesTheSameAnswersAsGrpcAndChangesNothing) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  auto server = ServerProcess::Start({"--state_budget_bytes=20000", "--allow_cuda_ipc",
                                      "--cuda_ipc_over_tcp", "--fast_socket=" + sock});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  ASSERT_TRUE(CreateBaseline(*stub));
  BadEnv env;
  env.session = OpenSession(*stub, "bad-input-test");
  env.other_session = OpenSession(*stub, "another-client");
  const StateSnapshot before = TakeSnapshot(*stub);

  std::vector<BadCase> cases = TensorOpCases();
  for (BadCase& c : StateCases()) cases.push_back(std::move(c));
  std::vector<grpc::Status> over_grpc;
  for (const BadCase& c : cases) over_grpc.push_back(c.call(*stub, env));

  // Over the fast socket: one connection per session a case names; a case that names none
  // runs on a connection of env.session (the fast socket has no session-less calls).
  std::map<std::string, std::unique_ptr<FastSocket>> connections;
  TensorRoute route;
  int routed = 0;
  route.send = [&](const std::string& method, const google::protobuf::Message& r,
                   const std::string& session) {
    ++routed;
    const std::string s = session.empty() ? env.session : session;
    std::unique_ptr<FastSocket>& f = connections[s];
    if (f == nullptr) f = Connect(sock, s);
    if (f == nullptr) return grpc::Status(grpc::StatusCode::INTERNAL, "no fast connection");
    std::unique_ptr<google::protobuf::Message> reply(r.New());  // any message parses its fields
    return ToGrpc(f->Invoke(method, r, reply.get()));
  };
  SetTensorRoute(&route);
  int compared = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const BadCase& c = cases[i];
    const int routed_before = routed;
    grpc::Status s = c.call(*stub, env);
    if (routed == routed_before) continue;  // a state RPC the fast socket does not carry
    ++compared;
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_EQ(s.error_code(), over_grpc[i].error_code()) << c.name;
    // The one difference: gRPC adds a hint when a call naming a region carried no session;
    // a fast-socket call always has its connection's session.
    std::string expected = over_grpc[i].error_message();
    const std::string hint = " (no 'fp4q-session' metadata was sent)";
    if (expected.size() > hint.size() &&
        expected.compare(expected.size() - hint.size(), hint.size(), hint) == 0) {
      expected.resize(expected.size() - hint.size());
    }
    EXPECT_EQ(s.error_message(), expected) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr(dir.path()))) << c.name;
    EXPECT_THAT(s.error_message(), Not(HasSubstr(env.other_session))) << c.name;
    EXPECT_TRUE(TakeSnapshot(*stub) == before) << c.name << " changed the state";
  }
  SetTensorRoute(nullptr);
  EXPECT_GE(compared, 60);
  EXPECT_TRUE(TakeSnapshot(*stub) == before);
  // Still serving on both transports.
  std::unique_ptr<FastSocket>& f = connections[env.session];
  ASSERT_NE(f, nullptr);
  absl::StatusOr<v1::QuantizeReply> q = f->Quantize(QuantizeOf(7));
  EXPECT_TRUE(q.ok()) << q.status();
  v1::ServerInfoReply info;
  auto ictx = Context();
  EXPECT_TRUE(stub->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
}

// Both ways fp4qd can run a fast socket call's work: on its connection's thread when the device
// is idle (--idle_inline), or always on a device worker.
class E2eFastSocketResultsTest : public ::testing::TestWithParam<bool> {};

TEST_P(E2eFastSocketResultsTest, ResultsAreByteIdenticalToGrpcAndPipelinedCallsAllReturn) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  auto server = ServerProcess::Start(
      {"--fast_socket=" + sock, GetParam() ? "--idle_inline=true" : "--idle_inline=false"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  const std::string session = OpenSession(*stub, "identity");
  std::unique_ptr<FastSocket> f = Connect(sock, session);
  ASSERT_NE(f, nullptr);
  EXPECT_GT(f->lease_seconds(), 0u);

  // Quantize with stochastic rounding and a seed, and QDQ: same bytes both ways.
  v1::QuantizeRequest q = QuantizeOf(11, 32, 128);
  q.mutable_options()->set_rounding(v1::ROUNDING_STOCHASTIC);
  q.mutable_options()->set_seed(1234);
  v1::QuantizeReply by_grpc;
  auto ctx = Context(session);
  ASSERT_TRUE(stub->Quantize(ctx.get(), q, &by_grpc).ok());
  absl::StatusOr<v1::QuantizeReply> by_fast = f->Quantize(q);
  ASSERT_TRUE(by_fast.ok()) << by_fast.status();
  ASSERT_FALSE(by_grpc.rowwise().codes().empty());
  EXPECT_EQ(by_fast->rowwise().codes(), by_grpc.rowwise().codes());
  EXPECT_EQ(by_fast->rowwise().scales(), by_grpc.rowwise().scales());
  EXPECT_EQ(by_fast->rowwise().s_enc(), by_grpc.rowwise().s_enc());
  EXPECT_EQ(by_fast->header().server_epoch(), by_grpc.header().server_epoch());
  EXPECT_GT(by_fast->header().server_micros(), 0.0);

  v1::QdqRequest qdq;
  *qdq.mutable_input() = InlineTensor(RandomF32(16 * 64, 12), 16, 64);
  v1::QdqReply qdq_grpc;
  auto ctx2 = Context(session);
  ASSERT_TRUE(stub->Qdq(ctx2.get(), qdq, &qdq_grpc).ok());
  absl::StatusOr<v1::QdqReply> qdq_fast = f->Qdq(qdq);
  ASSERT_TRUE(qdq_fast.ok()) << qdq_fast.status();
  ASSERT_FALSE(qdq_grpc.output().inline_data().empty());
  EXPECT_EQ(qdq_fast->output().inline_data(), qdq_grpc.output().inline_data());

  // UpdateWeight: two weights created alike, updated alike, one per transport.
  for (const char* name : {"via-grpc", "via-fast"}) {
    v1::CreateWeightReply rep;
    auto c = Context(session);
    ASSERT_TRUE(stub->CreateWeight(c.get(), C(name, InlineTensor(RandomF32(16 * 32, 3), 16, 32)),
                                   &rep)
                    .ok());
  }
  v1::Tensor last_g;  // step 3's update
  for (int step = 1; step <= 3; ++step) {
    const v1::Tensor g = InlineTensor(RandomF32(16 * 32, 100 + step, 0.01f), 16, 32);
    last_g = g;
    v1::UpdateWeightReply rep;
    auto c = Context(session);
    ASSERT_TRUE(stub->UpdateWeight(c.get(), U("via-grpc", step, g), &rep).ok());
    absl::StatusOr<v1::UpdateWeightReply> r = f->UpdateWeight(U("via-fast", step, g));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->applied());
    EXPECT_EQ(r->last_step(), step);
  }
  // A repeated step with its update: applied=false, as over gRPC; with another update: refused.
  absl::StatusOr<v1::UpdateWeightReply> dup = f->UpdateWeight(U("via-fast", 3, last_g));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_FALSE(dup->applied());
  EXPECT_EQ(f->UpdateWeight(U("via-fast", 3, InlineTensor(RandomF32(16 * 32, 9), 16, 32)))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  std::string codes[2];
  for (int i = 0; i < 2; ++i) {
    v1::GetWeightRequest g;
    g.set_name(i == 0 ? "via-grpc" : "via-fast");
    g.set_quantized(true);
    v1::GetWeightReply rep;
    auto c = Context(session);
    grpc::Status gs = stub->GetWeight(c.get(), g, &rep);
    ASSERT_TRUE(gs.ok()) << gs.error_message();
    codes[i] = rep.quantized().codes() + rep.quantized().scales() + rep.residual().inline_data();
  }
  EXPECT_FALSE(codes[0].empty());
  EXPECT_EQ(codes[0], codes[1]);

  absl::StatusOr<v1::KeepAliveReply> k = f->KeepAlive();
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_GT(k->lease_seconds(), 0u);

  // The small calls: the same listing and server description as over gRPC.
  absl::StatusOr<v1::ListTensorsReply> list_fast = f->ListTensors();
  ASSERT_TRUE(list_fast.ok()) << list_fast.status();
  v1::ListTensorsReply list_grpc;
  auto lctx = Context(session);
  ASSERT_TRUE(stub->ListTensors(lctx.get(), v1::ListTensorsRequest(), &list_grpc).ok());
  ASSERT_EQ(list_fast->tensors_size(), 2);  // via-grpc and via-fast
  EXPECT_EQ(list_fast->SerializeAsString(), list_grpc.SerializeAsString());
  absl::StatusOr<v1::ServerInfoReply> info_fast = f->ServerInfo();
  ASSERT_TRUE(info_fast.ok()) << info_fast.status();
  v1::ServerInfoReply info_grpc;
  auto ictx2 = Context(session);
  ASSERT_TRUE(stub->ServerInfo(ictx2.get(), v1::ServerInfoRequest(), &info_grpc).ok());
  EXPECT_EQ(info_fast->backend(), "cpu");
  EXPECT_GT(info_fast->limits().max_message_bytes(), 0u);
  // The frame limit, the reply margin and the reply envelope's bytes, served from one place.
  EXPECT_EQ(info_fast->limits().fast_socket_max_frame_bytes(), 65536u);
  EXPECT_EQ(info_fast->limits().fast_socket_reply_margin_bytes(), 4096u);
  EXPECT_EQ(info_fast->limits().fast_socket_reply_framing_bytes(), 32u);
  // The CPU backend's fast socket threads never busy-poll: no heads-ups.
  EXPECT_EQ(info_fast->limits().fast_socket_max_heads_up_micros(), 0u);
  EXPECT_EQ(info_fast->SerializeAsString(), info_grpc.SerializeAsString());

  // Pipelining: 200 frames sent before any reply is read (beyond the per-connection limit of
  // 64 in flight: back-pressure, no error); every id comes back once, OK.
  RawConnection raw(sock);
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(raw.Send(Hello(session, 1)));
  ASSERT_EQ(raw.Receive().code(), 0);
  std::thread sender([&] {
    for (uint64_t id = 100; id < 300; ++id) raw.Send(QuantizeFrame(id, static_cast<uint32_t>(id)));
  });
  std::map<uint64_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    v1::FastReply r = raw.Receive();
    ASSERT_EQ(r.code(), 0) << r.message();
    ASSERT_TRUE(ReplyOf<v1::QuantizeReply>(r).has_rowwise());
    ++seen[r.call_id()];
  }
  sender.join();
  ASSERT_EQ(seen.size(), 200u);
  EXPECT_EQ(seen.begin()->first, 100u);
  EXPECT_EQ(seen.rbegin()->first, 299u);
}

INSTANTIATE_TEST_SUITE_P(IdleInline, E2eFastSocketResultsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "OnConnectionThreadWhenIdle" : "OnWorkers";
                         });

TEST(E2eFastSocketTest, FramesThatAreNotCallsGetTheirCodeAndTheConnectionStays) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  auto server = ServerProcess::Start({"--fast_socket=" + sock});
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  ASSERT_EQ(::stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto stub = (*server)->Stub();
  const std::string session = OpenSession(*stub, "frames");
  const std::string other = OpenSession(*stub, "another-client");
  RawConnection raw(sock);
  ASSERT_TRUE(raw.connected());

  struct Case {
    std::string name;
    std::string frame;
    int code;
    uint64_t call_id;
    std::string message;
  };
  v1::FastRequest no_op;
  no_op.set_call_id(5);
  v1::FastRequest before_hello = QuantizeFrame(6, 1);
  v1::FastRequest keepalive_before_hello = Frame(7, "KeepAlive", v1::KeepAliveRequest());
  v1::FastRequest empty_session = Hello("", 8);
  v1::FastRequest unknown_session = Hello("not-a-session-0123", 9);
  v1::FastRequest long_timeout = QuantizeFrame(10, 1);
  long_timeout.set_timeout_micros(uint64_t{1} << 63);
  std::string unknown_op;  // field 99 (a newer client's field), length-delimited, empty
  unknown_op.push_back(static_cast<char>(0x08));
  unknown_op.push_back(static_cast<char>(11));  // call_id 11
  unknown_op.push_back(static_cast<char>(0x9a));
  unknown_op.push_back(static_cast<char>(0x06));
  unknown_op.push_back(static_cast<char>(0x00));
  const std::vector<Case> cases = {
      {"empty frame", "", 3, 0, "frame: empty"},
      {"garbage", std::string("\xff\xff\xff\xff garbage", 13), 3, 0, "are not a fp4q.v1.FastRequest"},
      {"oversized", std::string(70000, 'x'), 3, 0, "70000 bytes exceed the fast socket's limit of 65536"},
      {"no method", no_op.SerializeAsString(), 3, 5, "FastRequest.method: empty"},
      {"unknown field", unknown_op, 3, 11, "FastRequest.method: empty"},
      {"quantize before hello", before_hello.SerializeAsString(), 9, 6, "not bound to a session"},
      {"keepalive before hello", keepalive_before_hello.SerializeAsString(), 9, 7,
       "not bound to a session"},
      {"empty session", empty_session.SerializeAsString(), 3, 8, "hello.session_id: empty"},
      {"unknown session", unknown_session.SerializeAsString(), 5, 9, "hello.session_id: "},
      {"timeout beyond a day", long_timeout.SerializeAsString(), 3, 10,
       "FastRequest.timeout_micros: 9223372036854775808 exceeds one day"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(raw.SendBytes(c.frame)) << c.name;
    v1::FastReply r = raw.Receive();
    EXPECT_EQ(r.code(), c.code) << c.name << ": " << r.message();
    EXPECT_EQ(r.call_id(), c.call_id) << c.name;
    EXPECT_THAT(r.message(), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(r.reply().empty() && !r.has_hello()) << c.name;
    EXPECT_THAT(r.message(), Not(HasSubstr(other))) << c.name;
    EXPECT_THAT(r.message(), Not(HasSubstr(dir.path()))) << c.name;
  }
  // Invalid UTF-8 in a string field: each such frame makes libprotobuf log an error; fp4qd
  // routes those through its logger at most once a second, so 50 of them cannot flood stderr.
  const std::string bad_utf8("\x08\x01\x1a\x04\x0a\x02\xff\xfe", 8);  // hello.session_id
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(raw.SendBytes(bad_utf8));
    v1::FastReply r = raw.Receive();
    EXPECT_EQ(r.code(), 3);
    EXPECT_THAT(r.message(), HasSubstr("8 bytes are not a fp4q.v1.FastRequest"));
  }
  {
    const std::string log = (*server)->Log();
    EXPECT_THAT(log, Not(HasSubstr("[libprotobuf ERROR")));
    size_t lines = 0;
    for (size_t at = log.find("\"msg\":\"libprotobuf\""); at != std::string::npos;
         at = log.find("\"msg\":\"libprotobuf\"", at + 1)) {
      ++lines;
    }
    EXPECT_GE(lines, 1u);
    EXPECT_LE(lines, 3u);
  }
  // The same connection still works: hello, a call, a second hello refused.
  ASSERT_TRUE(raw.Send(Hello(session, 20)));
  v1::FastReply h = raw.Receive();
  EXPECT_EQ(h.code(), 0) << h.message();
  EXPECT_TRUE(h.has_hello());
  EXPECT_GT(h.hello().lease_seconds(), 0u);
  ASSERT_TRUE(raw.Send(QuantizeFrame(21, 2)));
  v1::FastReply q = raw.Receive();
  EXPECT_EQ(q.code(), 0) << q.message();
  EXPECT_EQ(q.call_id(), 21u);
  EXPECT_TRUE(ReplyOf<v1::QuantizeReply>(q).has_rowwise());
  ASSERT_TRUE(raw.Send(Hello(other, 22)));
  v1::FastReply again = raw.Receive();
  EXPECT_EQ(again.code(), 9);
  EXPECT_THAT(again.message(), HasSubstr("already bound to a session"));
  // A reply that would not fit a frame: RESOURCE_EXHAUSTED naming the limit (Dequantize of a
  // 128x256 operand: 18 KiB in, 128 KiB of f32 out).
  v1::DequantizeRequest big_dq;
  *big_dq.mutable_input()->mutable_tensor() = ZeroOperand(128, 256);
  v1::FastRequest big = Frame(23, "Dequantize", big_dq);
  ASSERT_TRUE(raw.Send(big));
  v1::FastReply too_big = raw.Receive();
  EXPECT_EQ(too_big.code(), 8) << too_big.message();
  EXPECT_EQ(too_big.call_id(), 23u);
  EXPECT_THAT(too_big.message(), HasSubstr("exceed this transport's reply limit of 655"));
  // Calls that change state are refused before they run when their inline output cannot fit
  // a reply frame: 125x128 f32 (64000 bytes in) with DQ(W) or the QDQ output asked inline.
  {
    v1::CreateWeightReply created;
    auto c = Context(session);
    ASSERT_TRUE(
        stub->CreateWeight(c.get(), C("big", InlineTensor(RandomF32(125 * 128, 4), 125, 128)),
                           &created)
            .ok());
  }
  v1::UpdateWeightRequest update_req =
      U("big", 1, InlineTensor(RandomF32(125 * 128, 5, 0.01f), 125, 128));
  update_req.set_return_dequantized(true);
  v1::FastRequest update = Frame(24, "UpdateWeight", update_req);
  v1::FastRequest residual_qdq =
      Frame(25, "Qdq", Qdq(InlineTensor(RandomF32(125 * 128, 6), 125, 128), "big-r", 1));
  for (const v1::FastRequest* r : {&update, &residual_qdq}) {
    ASSERT_LE(r->ByteSizeLong(), 65536u);
    ASSERT_TRUE(raw.Send(*r));
    v1::FastReply refused = raw.Receive();
    EXPECT_EQ(refused.code(), 8) << refused.message();
    EXPECT_EQ(refused.call_id(), r->call_id());
    EXPECT_THAT(refused.message(), HasSubstr("reply: it could carry up to 68096 bytes, over "
                                             "this transport's reply limit of 65504 bytes; "
                                             "nothing was run"));
  }
  {  // Nothing ran: the weight is at step 0 and no residual "big-r" exists.
    v1::ListTensorsReply list;
    auto c = Context(session);
    ASSERT_TRUE(stub->ListTensors(c.get(), v1::ListTensorsRequest(), &list).ok());
    bool saw_big = false;
    for (const auto& t : list.tensors()) {
      EXPECT_NE(t.name(), "big-r");
      if (t.name() == "big") {
        saw_big = true;
        EXPECT_EQ(t.last_step(), 0);
      }
    }
    EXPECT_TRUE(saw_big);
  }
  // Without the inline output the same update runs.
  update_req.set_return_dequantized(false);
  update = Frame(24, "UpdateWeight", update_req);
  ASSERT_TRUE(raw.Send(update));
  v1::FastReply applied = raw.Receive();
  EXPECT_EQ(applied.code(), 0) << applied.message();
  EXPECT_TRUE(ReplyOf<v1::UpdateWeightReply>(applied).applied());
  // The client library refuses an oversized request before sending it.
  std::unique_ptr<FastSocket> f = Connect(sock, session);
  ASSERT_NE(f, nullptr);
  absl::StatusOr<v1::QuantizeReply> r = f->Quantize(QuantizeOf(3, 64, 512));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("exceed the fast socket's frame limit of 65536"));
  EXPECT_TRUE(f->KeepAlive().ok());
  // The server never died and gRPC is unaffected.
  v1::ServerInfoReply info;
  auto ictx = Context();
  EXPECT_TRUE(stub->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
}

TEST(E2eFastSocketTest, PeerUidTokenAndConnectionCapAreChecked) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  const uid_t me = ::geteuid();
  {  // Our uid not allowed: the connection is closed at once, and logged.
    auto server = ServerProcess::Start({"--fast_socket=" + sock,
                                        absl::StrCat("--unix_socket_allowed_uids=", me + 4321)});
    ASSERT_TRUE(server.ok()) << server.status();
    struct stat st;
    ASSERT_EQ(::stat(sock.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    RawConnection raw(sock);
    ASSERT_TRUE(raw.connected());
    EXPECT_TRUE(raw.ClosedByServer());
    EXPECT_THAT((*server)->Log(),
                HasSubstr("fast socket: connection refused: uid not in --unix_socket_allowed_uids"));
    FastSocketOptions o;
    o.path = sock;
    absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(o, "any");
    EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << f.status();
  }
  {  // A token: hello must carry it.
    const std::string token_file = dir.File("token");
    { std::ofstream(token_file) << "s3cret-token\n"; }
    auto server = ServerProcess::Start({"--fast_socket=" + sock, "--auth_token_file=" + token_file,
                                        "--fast_socket_max_connections=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    auto channel = MakeChannel((*server)->address());
    // OpenSession over gRPC needs the token too.
    v1::OpenSessionRequest req;
    v1::OpenSessionReply rep;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer s3cret-token");
    ASSERT_TRUE(v1::Fp4q::NewStub(channel)->OpenSession(&ctx, req, &rep).ok());
    FastSocketOptions o;
    o.path = sock;
    o.auth_token = "wrong";
    absl::StatusOr<std::unique_ptr<FastSocket>> bad = FastSocket::Connect(o, rep.session_id());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated) << bad.status();
    EXPECT_THAT(bad.status().message(), HasSubstr("hello.auth_token: missing or wrong bearer token"));
    EXPECT_THAT(bad.status().message(), Not(HasSubstr("s3cret")));
    bad = absl::StatusOr<std::unique_ptr<FastSocket>>(nullptr);
    // The refused connection counts against the cap until the server sees it closed.
    for (int i = 0; i < 200; ++i) {
      absl::StatusOr<double> open = Gauge(**server, "fp4q_fast_socket_connections");
      if (open.ok() && *open == 0) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::unique_ptr<FastSocket> a = Connect(sock, rep.session_id(), "s3cret-token");
    std::unique_ptr<FastSocket> b = Connect(sock, rep.session_id(), "s3cret-token");
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    // A third connection is over --fast_socket_max_connections=2: closed at once.
    RawConnection third(sock);
    ASSERT_TRUE(third.connected());
    EXPECT_TRUE(third.ClosedByServer());
    EXPECT_THAT((*server)->Log(), HasSubstr("--fast_socket_max_connections reached"));
    EXPECT_TRUE(a->KeepAlive().ok());
    b.reset();  // frees a slot
    absl::Time until = absl::Now() + absl::Seconds(10);
    std::unique_ptr<FastSocket> c;
    while (c == nullptr && absl::Now() < until) {
      FastSocketOptions ok = o;
      ok.auth_token = "s3cret-token";
      absl::StatusOr<std::unique_ptr<FastSocket>> f = FastSocket::Connect(ok, rep.session_id());
      if (f.ok()) c = *std::move(f);
      else absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_NE(c, nullptr);
  }
  for (const char* bad : {"--fast_socket_spin_us=-2", "--worker_spin_us=-2",
                          "--fast_socket_spin_us=1000001", "--fast_socket_max_connections=0"}) {
    std::string log;
    EXPECT_EQ(RunServerToExit({"--fast_socket=" + sock, bad}, &log), 1) << bad;
    EXPECT_THAT(log, HasSubstr(std::string(bad).substr(0, std::string(bad).find('=')))) << bad;
  }
}

TEST(E2eFastSocketTest, AClientThatDiesMidCallLeavesNoConnection) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  auto server = ServerProcess::Start({"--fast_socket=" + sock});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  const std::string session = OpenSession(*stub, "dies");
  {
    RawConnection raw(sock);
    ASSERT_TRUE(raw.Send(Hello(session, 1)));
    ASSERT_EQ(raw.Receive().code(), 0);
    absl::StatusOr<double> open = Gauge(**server, "fp4q_fast_socket_connections");
    ASSERT_TRUE(open.ok()) << open.status();
    EXPECT_EQ(*open, 1.0);
    // 40 large-ish calls queued, then the client vanishes without reading a reply.
    for (uint64_t id = 2; id < 42; ++id) {
      ASSERT_TRUE(raw.Send(QuantizeFrame(id, static_cast<uint32_t>(id), 64, 240)));
    }
  }
  const absl::Time until = absl::Now() + absl::Seconds(20);
  absl::StatusOr<double> open = Gauge(**server, "fp4q_fast_socket_connections");
  while ((!open.ok() || *open != 0.0) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
    open = Gauge(**server, "fp4q_fast_socket_connections");
  }
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(*open, 0.0);
  // Still serving, the session still valid.
  std::unique_ptr<FastSocket> f = Connect(sock, session);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->Quantize(QuantizeOf(5)).ok());
  // SIGTERM with a connection open: fp4qd still stops cleanly.
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(), 0);
}

// A connection busy-polling (--fast_socket_spin_us at its maximum, 1 s) does not hold up a
// SIGTERM: fp4qd exits cleanly well within the spin time.
TEST(E2eFastSocketTest, SigtermEndsABusyPollingConnectionAtOnce) {
  TempDir dir;
  const std::string sock = dir.File("fast.sock");
  auto server = ServerProcess::Start({"--fast_socket=" + sock, "--fast_socket_spin_us=1000000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  std::unique_ptr<FastSocket> f = Connect(sock, OpenSession(*stub, "spin"));
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(f->KeepAlive().ok());  // the connection thread now spins for 1 s
  // An open gRPC connection alone holds fp4qd's gRPC shutdown for its 2 s grace period: close
  // it so that only the fast socket is left to time.
  stub.reset();
  const absl::Time t0 = absl::Now();
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->Wait(), 0);
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(900)) << (*server)->Log();
  EXPECT_EQ(f->KeepAlive().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fp4q::server::testing
