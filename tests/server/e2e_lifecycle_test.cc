// End to end: fp4qd's process lifecycle and access control: drain on SIGTERM (readiness
// NOT_SERVING while in-flight work finishes), a corrupt checkpoint at start, bearer-token auth,
// the Unix socket listener, TLS and mTLS, flags.
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "e2e_util.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;
using ::testing::Not;

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

grpc::Status Info(v1::Fp4q::Stub& stub, grpc::ClientContext* ctx) {
  v1::ServerInfoReply rep;
  return stub.ServerInfo(ctx, v1::ServerInfoRequest(), &rep);
}

TEST(E2eLifecycleTest, SigtermDrainsInFlightWorkWithReadinessNotServing) {
  TempDir dir;
  auto server = ServerProcess::Start({"--workers=1", "--state_dir=" + dir.path()});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  // Slow work for the single worker: exact CPU matmuls, queued back to back.
  const int64_t m = 384, n = 384, k = 1024;
  const RefQuantize qa = CpuQuantize(RandomF32(m * k, 1), kernels::DType::kF32, m, k, {});
  v1::MatmulRequest req;
  for (v1::QuantizedOperand* op : {req.mutable_a(), req.mutable_b()}) {
    v1::QuantizedTensor* t = op->mutable_tensor();
    t->add_shape(m);
    t->add_shape(k);
    t->set_global_amax(qa.rowwise.global[0]);
    t->set_s_enc(qa.rowwise.global[1]);
    t->set_codes(qa.rowwise.codes);
    t->set_scales(qa.rowwise.scales);
  }
  constexpr int kSlow = 3;
  std::vector<std::future<grpc::Status>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::async(std::launch::async, [&] {
      auto my = (*server)->Stub();
      v1::MatmulReply rep;
      auto ctx = Context();
      return my->Matmul(ctx.get(), req, &rep);
    }));
  }
  // Wait until the server holds all of them.
  for (int i = 0; i < 200; ++i) {
    auto text = HttpGet((*server)->metrics_address(), "/metrics");
    if (text.ok() && MetricValue(*text, "fp4q_requests_in_flight").value_or(0) >= kSlow) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time t0 = absl::Now();
  (*server)->Signal(SIGTERM);
  auto health = (*server)->Health();
  bool saw_not_serving = false;
  while (absl::Now() - t0 < absl::Seconds(10)) {
    auto r = CheckHealth(*health, "readiness");
    if (r.ok() && *r == HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(saw_not_serving) << (*server)->Log();
  auto overall = CheckHealth(*health, "");
  ASSERT_TRUE(overall.ok());
  EXPECT_EQ(*overall, HealthCheckResponse::NOT_SERVING);
  auto live = CheckHealth(*health, "liveness");
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(*live, HealthCheckResponse::SERVING) << "draining is not dead";
  // New work is refused while draining.
  v1::QuantizeRequest q;
  *q.mutable_input() = InlineTensor(RandomF32(16, 2), 1, 16);
  v1::QuantizeReply qrep;
  auto qctx = Context();
  grpc::Status refused = stub->Quantize(qctx.get(), q, &qrep);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("draining"));
  // The in-flight work completes.
  for (auto& f : slow) {
    grpc::Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ((*server)->Wait(), 0) << (*server)->Log();
  EXPECT_TRUE(std::filesystem::exists(dir.File("fp4q-state.ckpt")));
}

TEST(E2eLifecycleTest, CorruptCheckpointStopsStartupUnlessIgnored) {
  TempDir dir;
  WriteFile(dir.File("fp4q-state.ckpt"), std::string("FP4QCKP1") + std::string(100, 'x'));
  std::string log;
  EXPECT_EQ(RunServerToExit({"--state_dir=" + dir.path()}, &log), 3) << log;
  EXPECT_THAT(log, HasSubstr("checkpoint not restored"));
  EXPECT_THAT(log, HasSubstr("DATA_LOSS"));
  auto server = ServerProcess::Start({"--state_dir=" + dir.path(), "--ignore_corrupt_checkpoint"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE(std::filesystem::exists(dir.File("fp4q-state.ckpt")));
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    aside += e.path().filename().string().rfind("fp4q-state.ckpt.corrupt-", 0) == 0;
  }
  EXPECT_EQ(aside, 1);
  auto stub = (*server)->Stub();
  v1::ListTensorsReply list;
  auto ctx = Context();
  ASSERT_TRUE(stub->ListTensors(ctx.get(), v1::ListTensorsRequest(), &list).ok());
  EXPECT_EQ(list.tensors_size(), 0);
}

TEST(E2eLifecycleTest, BadFlagsFailStartup) {
  std::string log;
  EXPECT_EQ(RunServerToExit({"--backend=tpu"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("backend: 'tpu' is not one of auto, cpu, cuda"));
  EXPECT_EQ(RunServerToExit({"--log_format=xml"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--log_format: 'xml' is not json or text"));
  EXPECT_EQ(RunServerToExit({"--state_dir=/nonexistent/fp4q"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("is not an existing directory"));
  // --backend=cuda on a machine without the CUDA module or a GPU fails; auto serves on the CPU.
  if (std::getenv("FP4Q_EXPECT_GPU") == nullptr) {
    EXPECT_EQ(
        RunServerToExit({"--backend=cuda", "--cuda_module=/nonexistent/libfp4q_cuda.so"}, &log), 1);
    EXPECT_THAT(log, HasSubstr("no backend"));
    // fp4qd, not the kernels library, reads $FP4Q_CUDA_MODULE; the flag wins over it.
    const char* before = std::getenv("FP4Q_CUDA_MODULE");
    const std::string saved = before == nullptr ? "" : before;
    ASSERT_EQ(setenv("FP4Q_CUDA_MODULE", "/nonexistent/from-env/libfp4q_cuda.so", 1), 0);
    EXPECT_EQ(RunServerToExit({"--backend=cuda"}, &log), 1);
    EXPECT_THAT(log, HasSubstr("tried: /nonexistent/from-env/libfp4q_cuda.so"));
    EXPECT_EQ(
        RunServerToExit({"--backend=cuda", "--cuda_module=/nonexistent/flag/libfp4q_cuda.so"}, &log),
        1);
    EXPECT_THAT(log, HasSubstr("tried: /nonexistent/flag/libfp4q_cuda.so"));
    EXPECT_THAT(log, Not(HasSubstr("from-env")));
    ASSERT_EQ(saved.empty() ? unsetenv("FP4Q_CUDA_MODULE")
                            : setenv("FP4Q_CUDA_MODULE", saved.c_str(), 1),
              0);
  }
  EXPECT_EQ(RunServerToExit({"--cuda_row_kernels=cols"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--cuda_row_kernels: 'cols' is not auto or rows"));
  EXPECT_EQ(RunServerToExit({"--cuda_bf16_block_ctas=5"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--cuda_bf16_block_ctas: 5 is not 3 or 4"));
  EXPECT_EQ(RunServerToExit({"--cuda_step_prefetch=17"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--cuda_step_prefetch: 17 is not in [0, 16]"));
  EXPECT_EQ(RunServerToExit({"--cuda_step_prefetch=-1"}, &log), 1);
  EXPECT_THAT(log, HasSubstr("--cuda_step_prefetch: -1 is not in [0, 16]"));
}

TEST(E2eLifecycleTest, BearerTokenGuardsTheServiceButNotHealth) {
  TempDir dir;
  WriteFile(dir.File("token"), "s3cret-token\n");
  auto server = ServerProcess::Start({"--auth_token_file=" + dir.File("token")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  auto none = Context();
  grpc::Status s = Info(*stub, none.get());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("bearer token"));
  auto wrong = Context();
  wrong->AddMetadata("authorization", "Bearer s3cret-tokeN");
  EXPECT_EQ(Info(*stub, wrong.get()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto right = Context();
  right->AddMetadata("authorization", "Bearer s3cret-token");
  EXPECT_TRUE(Info(*stub, right.get()).ok());
  auto health = (*server)->Health();
  auto h = CheckHealth(*health, "readiness");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, HealthCheckResponse::SERVING);
}

TEST(E2eLifecycleTest, UnixSocketListenerIsOwnerOnly) {
  TempDir dir;
  const std::string sock = dir.File("fp4qd.sock");
  auto server = ServerProcess::Start({"--unix_socket=" + sock});
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  ASSERT_EQ(stat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto stub = v1::Fp4q::NewStub(MakeChannel("unix:" + sock));
  auto ctx = Context();
  EXPECT_TRUE(Info(*stub, ctx.get()).ok());
}

TEST(E2eLifecycleTest, TlsAndMutualTls) {
  if (std::system("command -v openssl > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed: no certificates to test TLS with";
  }
  TempDir dir;
  auto make_cert = [&](const std::string& name) {
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
        "subjectAltName=DNS:localhost -keyout ",
        dir.File(name + ".key"), " -out ", dir.File(name + ".pem"), " > /dev/null 2>&1");
    return std::system(cmd.c_str()) == 0;
  };
  ASSERT_TRUE(make_cert("server"));
  ASSERT_TRUE(make_cert("client"));
  auto read = [&](const std::string& name) {
    std::ifstream in(dir.File(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto server = ServerProcess::Start({"--tls_cert=" + dir.File("server.pem"),
                                      "--tls_key=" + dir.File("server.key"),
                                      "--tls_client_ca=" + dir.File("client.pem")});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = [&](bool with_client_cert) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = read("server.pem");
    if (with_client_cert) {
      o.pem_private_key = read("client.key");
      o.pem_cert_chain = read("client.pem");
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel((*server)->address(), grpc::SslCredentials(o), args);
  };
  auto mtls = v1::Fp4q::NewStub(channel(true));
  auto ok_ctx = Context("", absl::Seconds(10));
  grpc::Status ok = Info(*mtls, ok_ctx.get());
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  auto no_cert = v1::Fp4q::NewStub(channel(false));
  auto bad_ctx = Context("", absl::Seconds(10));
  EXPECT_EQ(Info(*no_cert, bad_ctx.get()).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto plain = (*server)->Stub();
  auto plain_ctx = Context("", absl::Seconds(10));
  EXPECT_EQ(Info(*plain, plain_ctx.get()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(E2eLifecycleTest, ServerReflectionListsTheService) {
  auto server = ServerProcess::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  // grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with a hand-encoded
  // ServerReflectionRequest{list_services: ""} (field 7, length 0), through the generic stub.
  grpc::GenericStub stub((*server)->Channel());
  grpc::CompletionQueue cq;
  auto ctx = Context();
  auto call = stub.PrepareCall(
      ctx.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto next = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && reinterpret_cast<intptr_t>(tag) == want && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next(1));
  const char request[] = {0x3a, 0x00};
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(next(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(next(3));
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  ASSERT_TRUE(next(4));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string reply;
  for (const auto& s : slices) reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(reply, HasSubstr("fp4q.v1.Fp4q"));
  EXPECT_THAT(reply, HasSubstr("grpc.health.v1.Health"));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(next(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace fp4q::server::testing
