// End to end, security: the Unix socket's peer-credential check, CUDA IPC only
// over that socket (unless --cuda_ipc_over_tcp) and off unless
// --allow_cuda_ipc, the bearer token on every listener, and error messages that
// carry only what the caller sent (no server paths, no other client's names or
// ids). IPC through the fake shared-memory GPU module.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "e2e_bad_input.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm_region.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

grpc::Status Info(v1::Fp4q::Stub& stub, v1::ServerInfoReply* rep = nullptr,
                  const std::string& token = "") {
  v1::ServerInfoReply r;
  auto ctx = Context("", absl::Seconds(10));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return stub.ServerInfo(ctx.get(), v1::ServerInfoRequest(), rep != nullptr ? rep : &r);
}

std::string OpenSession(v1::Fp4q::Stub& stub, const std::string& name) {
  v1::OpenSessionRequest r;
  r.set_client_name(name);
  v1::OpenSessionReply rep;
  auto ctx = Context();
  EXPECT_TRUE(stub.OpenSession(ctx.get(), r, &rep).ok());
  return rep.session_id();
}

v1::RegisterCudaRegionRequest Reg(const ShmRegion& shm) {
  v1::RegisterCudaRegionRequest r;
  r.set_ipc_handle(shm.Handle());
  r.set_size(shm.bytes());
  return r;
}

TEST(E2eSecurityTest, UnixSocketChecksThePeerUid) {
  TempDir dir;
  const std::string sock = dir.File("sock");
  const uid_t me = ::geteuid();
  {  // Default: only fp4qd's own uid; the file is owner-only too.
    auto server = ServerProcess::Start({"--unix_socket=" + sock});
    ASSERT_TRUE(server.ok()) << server.status();
    struct stat st;
    ASSERT_EQ(::stat(sock.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
    grpc::Status s = Info(*stub);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_THAT((*server)->Log(), Not(HasSubstr("peer refused")));
  }
  {  // Our uid not allowed: the file is open to all (0666), the uid check
     // refuses us.
    const std::string other = absl::StrCat(me + 4321);
    auto server =
        ServerProcess::Start({"--unix_socket=" + sock, "--unix_socket_allowed_uids=" + other});
    ASSERT_TRUE(server.ok()) << server.status();
    struct stat st;
    ASSERT_EQ(::stat(sock.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
    grpc::Status s = Info(*stub);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    const std::string log = (*server)->Log();
    EXPECT_THAT(log, HasSubstr("unix socket: peer refused (uid not in "
                               "--unix_socket_allowed_uids)"));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("\"peer_uid\":\"", me, "\"")));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("\"peer_pid\":\"", ::getpid(), "\"")));
    // TCP is not affected by the Unix socket's list.
    auto tcp = (*server)->Stub();
    EXPECT_TRUE(Info(*tcp).ok());
  }
  {  // Listed among others.
    auto server = ServerProcess::Start(
        {"--unix_socket=" + sock, absl::StrCat("--unix_socket_allowed_uids=", me + 1, ",", me)});
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
    EXPECT_TRUE(Info(*stub).ok());
  }
  for (const char* bad : {"abc", "1,,2", "-1", "99999999999", " 5"}) {
    std::string log;
    EXPECT_EQ(
        RunServerToExit({"--unix_socket=" + sock, absl::StrCat("--unix_socket_allowed_uids=", bad)},
                        &log),
        1)
        << bad;
    EXPECT_THAT(log, HasSubstr("--unix_socket_allowed_uids: '")) << bad;
  }
  // A regular file in the socket's place is never removed.
  const std::string file = dir.File("not-a-socket");
  { std::ofstream(file) << "data"; }
  std::string log;
  EXPECT_EQ(RunServerToExit({"--unix_socket=" + file}, &log), 1);
  EXPECT_THAT(log, HasSubstr("exists and is not a socket"));
  struct stat st;
  EXPECT_EQ(::stat(file.c_str(), &st), 0);
}

TEST(E2eSecurityTest, CudaIpcIsOffByDefaultAndOnlyOnTheUnixSocket) {
  TempDir dir;
  const std::string sock = dir.File("sock");
  ShmRegion shm(4096);
  ASSERT_TRUE(shm.ok());
  const std::vector<std::string> base = {"--backend=cuda", "--cuda_module=" FAKE_SHM_MODULE,
                                         "--unix_socket=" + sock};
  {  // No --allow_cuda_ipc: refused everywhere, and not advertised.
    auto server = ServerProcess::Start(base);
    ASSERT_TRUE(server.ok()) << server.status();
    auto unix_stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
    const std::string session = OpenSession(*unix_stub, "c");
    grpc::Status s = Call(*unix_stub, Reg(shm), session);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("client shared memory is disabled on this server "
                                             "(start fp4qd with --allow_cuda_ipc)"));
    v1::ServerInfoReply info;
    ASSERT_TRUE(Info(*unix_stub, &info).ok());
    EXPECT_EQ(info.backend(), "cuda");
    EXPECT_THAT(info.supported_modes(), Not(::testing::Contains("cuda_ipc")));
  }
  std::vector<std::string> flags = base;
  flags.push_back("--allow_cuda_ipc");
  {  // --allow_cuda_ipc: over the Unix socket only.
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto unix_stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
    auto tcp_stub = (*server)->Stub();
    const std::string session = OpenSession(*tcp_stub, "c");
    grpc::Status tcp = Call(*tcp_stub, Reg(shm), session);
    EXPECT_EQ(tcp.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(tcp.error_message(), HasSubstr("CUDA IPC is accepted only on the Unix socket "
                                               "(--unix_socket, peers "
                                               "checked by uid); this call came over TCP"));
    v1::RegisterCudaRegionReply reg;
    grpc::Status local = Call(*unix_stub, Reg(shm), session, &reg);
    ASSERT_TRUE(local.ok()) << local.error_message();
    // Who registered it is in the log.
    EXPECT_THAT((*server)->Log(), HasSubstr(absl::StrCat("\"peer_pid\":\"", ::getpid(), "\"")));
    // Using a registered region is a matter of the session, whatever the
    // transport.
    shm.data()[0] = 0;
    v1::QuantizeRequest q = Q(RegionTensor(reg.region_id(), 0, 2, 16));
    EXPECT_TRUE(Call(*tcp_stub, q, session).ok());
    // Each caller is offered what it may use.
    v1::ServerInfoReply info;
    ASSERT_TRUE(Info(*unix_stub, &info).ok());
    EXPECT_THAT(info.supported_modes(), ::testing::Contains("cuda_ipc"));
    ASSERT_TRUE(Info(*tcp_stub, &info).ok());
    EXPECT_THAT(info.supported_modes(), Not(::testing::Contains("cuda_ipc")));
    EXPECT_THAT(info.supported_modes(), ::testing::Contains("nvfp4"));
  }
  flags.push_back("--cuda_ipc_over_tcp");
  {  // --cuda_ipc_over_tcp: TCP too.
    auto server = ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto tcp_stub = (*server)->Stub();
    const std::string session = OpenSession(*tcp_stub, "c");
    grpc::Status s = Call(*tcp_stub, Reg(shm), session);
    EXPECT_TRUE(s.ok()) << s.error_message();
    v1::ServerInfoReply info;
    ASSERT_TRUE(Info(*tcp_stub, &info).ok());
    EXPECT_THAT(info.supported_modes(), ::testing::Contains("cuda_ipc"));
  }
}

TEST(E2eSecurityTest, BearerTokenAppliesOnTheUnixSocketToo) {
  TempDir dir;
  const std::string sock = dir.File("sock");
  { std::ofstream(dir.File("token")) << "tok-123\n"; }
  auto server =
      ServerProcess::Start({"--unix_socket=" + sock, "--auth_token_file=" + dir.File("token")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
  grpc::Status none = Info(*stub);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), Not(HasSubstr("tok-123")));
  grpc::Status wrong = Info(*stub, nullptr, "tok-124");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), Not(HasSubstr("tok-123")));
  EXPECT_TRUE(Info(*stub, nullptr, "tok-123").ok());
}

// --namespace_tokens_file: a token binds its caller to one namespace; a weight of one team is
// invisible to the other, and neither can open the other's sessions.
TEST(E2eSecurityTest, NamespaceTokensBindCallersToTheirNamespace) {
  TempDir dir;
  { std::ofstream(dir.File("ns")) << "# team tokens\nteam-a tok-a\n\nteam-b\ttok-b\n"; }
  auto server = ServerProcess::Start({"--namespace_tokens_file=" + dir.File("ns")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  auto open = [&](const std::string& token, const std::string& ns, std::string* id) {
    v1::OpenSessionRequest r;
    r.set_client_name("team client");
    r.set_namespace_(ns);
    v1::OpenSessionReply rep;
    auto ctx = Context();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    grpc::Status st = stub->OpenSession(ctx.get(), r, &rep);
    if (id != nullptr) *id = rep.session_id();
    return st;
  };
  std::string a, b;
  ASSERT_TRUE(open("tok-a", "team-a", &a).ok());
  ASSERT_TRUE(open("tok-b", "team-b", &b).ok());
  grpc::Status cross = open("tok-a", "team-b", nullptr);
  EXPECT_EQ(cross.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cross.error_message(),
              HasSubstr("namespace: 'team-b' is not the namespace this caller's token is bound "
                        "to ('team-a')"));
  EXPECT_THAT(cross.error_message(), Not(HasSubstr("tok-")));
  EXPECT_EQ(open("", "team-a", nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(open("tok-c", "team-a", nullptr).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Team A's weight, in its session.
  auto call = [&](const std::string& token, const std::string& session, auto&& rpc) {
    auto ctx = Context(session);
    ctx->AddMetadata("authorization", "Bearer " + token);
    return rpc(ctx.get());
  };
  v1::CreateWeightRequest cw = C("shared-name", InlineTensor(RandomF32(32, 1), 2, 16));
  v1::CreateWeightReply cwr;
  ASSERT_TRUE(call("tok-a", a, [&](grpc::ClientContext* c) {
                return stub->CreateWeight(c, cw, &cwr);
              }).ok());
  // Team B sees nothing of it, and may create the same name in its own namespace.
  v1::ListTensorsReply list;
  ASSERT_TRUE(call("tok-b", b, [&](grpc::ClientContext* c) {
                return stub->ListTensors(c, v1::ListTensorsRequest(), &list);
              }).ok());
  EXPECT_EQ(list.tensors_size(), 0);
  v1::GetWeightRequest g;
  g.set_name("shared-name");
  v1::GetWeightReply gr;
  EXPECT_EQ(call("tok-b", b, [&](grpc::ClientContext* c) { return stub->GetWeight(c, g, &gr); })
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(call("tok-b", b, [&](grpc::ClientContext* c) {
                return stub->CreateWeight(c, cw, &cwr);
              }).ok());
  // Team B's token with team A's session id is refused.
  grpc::Status stolen =
      call("tok-b", a, [&](grpc::ClientContext* c) { return stub->GetWeight(c, g, &gr); });
  EXPECT_EQ(stolen.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(stolen.error_message(), HasSubstr("the session's namespace 'team-a'"));
  ASSERT_TRUE(call("tok-a", a, [&](grpc::ClientContext* c) {
                return stub->ListTensors(c, v1::ListTensorsRequest(), &list);
              }).ok());
  EXPECT_EQ(list.tensors_size(), 1);
}

TEST(E2eSecurityTest, BadNamespaceTokenFilesStopStartupNamingTheLine) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"team-a tok-a extra\n", "line 1 is not"},
      {"team-a tok-a\nteam-b tok-a\n", "line 2: the token is listed twice"},
      {"bad!name tok\n", "line 1: namespace"},
  };
  for (const auto& [text, want] : cases) {
    { std::ofstream(dir.File("ns")) << text; }
    auto server = ServerProcess::Start({"--namespace_tokens_file=" + dir.File("ns")},
                                       absl::Seconds(10));
    ASSERT_FALSE(server.ok()) << text;
    EXPECT_THAT(server.status().message(), HasSubstr(want)) << text;
  }
}

TEST(E2eSecurityTest, ErrorsCarryOnlyWhatTheCallerSent) {
  TempDir dir;
  const std::string state = dir.File("state");
  ASSERT_EQ(::mkdir(state.c_str(), 0700), 0);
  const std::string sock = dir.File("sock");
  ShmRegion shm(4096);
  ASSERT_TRUE(shm.ok());
  auto server =
      ServerProcess::Start({"--backend=cuda", "--cuda_module=" FAKE_SHM_MODULE, "--allow_cuda_ipc",
                            "--unix_socket=" + sock, "--state_dir=" + state});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
  const std::string alice = OpenSession(*stub, "alice-secret-client");
  const std::string bob = OpenSession(*stub, "bob");
  v1::RegisterCudaRegionReply reg;
  ASSERT_TRUE(Call(*stub, Reg(shm), alice, &reg).ok());
  v1::CreateWeightRequest cw = C("alice/private-weight", InlineTensor(RandomF32(32, 1), 2, 16));
  ASSERT_TRUE(Call(*stub, cw).ok());
  std::vector<std::pair<std::string, grpc::Status>> answers;
  // Bob names Alice's region, in every place a region can go.
  answers.push_back({"input", Call(*stub, Q(RegionTensor(reg.region_id(), 0, 2, 16)), bob)});
  {
    v1::UnregisterCudaRegionRequest r;
    r.set_region_id(reg.region_id());
    answers.push_back({"unregister", Call(*stub, r, bob)});
  }
  // Unknown names and a weight of someone else's that Bob misspells.
  {
    v1::GetWeightRequest r;
    r.set_name("alice/private-weigh");
    answers.push_back({"get", Call(*stub, r, bob)});
  }
  answers.push_back({"update", Call(*stub, U("ghost", 1, InlineTensor(RandomF32(32, 1), 2, 16)))});
  // A checkpoint that fails: the state directory is gone (with its lock file, server/state_dir.h).
  ::unlink((state + "/fp4q-state.lock").c_str());
  ASSERT_EQ(::rmdir(state.c_str()), 0);
  {
    v1::CheckpointReply rep;
    auto ctx = Context();
    grpc::Status s = stub->Checkpoint(ctx.get(), v1::CheckpointRequest(), &rep);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("checkpoint: cannot open the state directory: No such file"));
    answers.push_back({"checkpoint", s});
  }
  for (const auto& [what, s] : answers) {
    EXPECT_FALSE(s.ok()) << what;
    const std::string& m = s.error_message();
    EXPECT_THAT(m, Not(HasSubstr(dir.path()))) << what << ": " << m;
    EXPECT_THAT(m, Not(HasSubstr("/tmp"))) << what << ": " << m;
    EXPECT_THAT(m, Not(HasSubstr("alice-secret-client"))) << what << ": " << m;
    EXPECT_THAT(m, Not(HasSubstr(alice))) << what << ": " << m;
    EXPECT_THAT(m, Not(HasSubstr(shm.name()))) << what << ": " << m;
    EXPECT_THAT(m, Not(HasSubstr("alice/private-weight'"))) << what << ": " << m;
  }
  EXPECT_THAT(answers[2].second.error_message(),
              HasSubstr("name: no weight 'alice/private-weigh'"));
}

}  // namespace
}  // namespace fp4q::server::testing
