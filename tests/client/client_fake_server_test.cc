// Client behaviour against the in-process fake service (fake_server.h): status mapping over
// the wire, metadata, deadlines, message limits, health, UpdateWeight's retries.
#include <grpcpp/security/server_credentials.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "fake_server.h"
#include "subprocess.h"
#include "fp4q/client/client.h"
#include "fp4q/client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::FakeServer;
using ::fp4q::client::testing::kFakeEpoch;
using ::fp4q::client::testing::UpdateMode;
using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<Client> MustConnect(const std::string& address, ClientOptions options = {}) {
  options.address = address;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_THAT(client, IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(ClientConnect, RejectsBadOptionsNamingTheField) {
  ClientOptions o;
  o.address = "";
  EXPECT_THAT(Client::Connect(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("ClientOptions.address is empty")));
  o = ClientOptions();
  o.max_message_bytes = 0;
  EXPECT_THAT(Client::Connect(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ClientOptions.max_message_bytes must be in [1, 2147483647], "
                                 "got 0")));
  o.max_message_bytes = int64_t{INT_MAX} + 1;
  EXPECT_THAT(Client::Connect(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("got 2147483648")));
  o = ClientOptions();
  o.update_retry.max_attempts = 0;
  EXPECT_THAT(Client::Connect(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("update_retry.max_attempts must be >= 1, got 0")));
  o = ClientOptions();
  o.deadline = absl::ZeroDuration();
  EXPECT_THAT(Client::Connect(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("ClientOptions.deadline must be positive")));
  o = ClientOptions();
  o.tls = TlsOptions();
  o.tls->client_cert_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_THAT(Client::Connect(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("client_cert_pem and TlsOptions.client_key_pem")));
}

TEST(ClientErrors, EveryStatusCodeMapsOneToOneWithTheServersMessage) {
  FakeServer server;
  auto client = MustConnect(server.address());
  ASSERT_NE(client, nullptr);
  for (int code = 1; code <= 16; ++code) {
    v1::DeleteWeightRequest request;
    const std::string message = "fake message " + std::to_string(code) + ": name \"w\"";
    request.set_name("code:" + std::to_string(code) + ":" + message);
    absl::StatusOr<v1::DeleteWeightReply> reply = client->DeleteWeight(request);
    ASSERT_FALSE(reply.ok()) << code;
    EXPECT_EQ(static_cast<int>(reply.status().code()), code);
    EXPECT_EQ(reply.status().message(), message);
  }
  v1::DeleteWeightRequest ok;
  ok.set_name("w");
  EXPECT_THAT(client->DeleteWeight(ok), IsOk());
}

TEST(ClientErrors, UnreachableServerIsUnavailable) {
  auto client = MustConnect("127.0.0.1:1");
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->ServerInfo(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("127.0.0.1:1")));
}

TEST(ClientCalls, SendsSessionAndBearerMetadataAndTracksTheEpoch) {
  FakeServer server;
  ClientOptions options;
  options.bearer_token = "tok-123";
  auto client = MustConnect(server.address(), options);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->last_server_epoch(), 0u);
  CallOptions call;
  call.session_id = "feedbeef";
  ASSERT_THAT(client->ListTensors({}, call), IsOk());
  EXPECT_EQ(server.service().last_metadata("ListTensors").session, "feedbeef");
  EXPECT_EQ(server.service().last_metadata("ListTensors").authorization, "Bearer tok-123");
  EXPECT_EQ(client->last_server_epoch(), kFakeEpoch);

  auto plain = MustConnect(server.address());
  ASSERT_THAT(plain->Checkpoint(), IsOk());
  EXPECT_EQ(server.service().last_metadata("Checkpoint").session, "");
  EXPECT_EQ(server.service().last_metadata("Checkpoint").authorization, "");
}

TEST(ClientCalls, DeadlineFromCallOptionsAndFromClientOptions) {
  FakeServer server;
  server.service().SetSleep(absl::Milliseconds(500));
  auto client = MustConnect(server.address());
  server.service().ScriptUpdates({UpdateMode::kApplyThenSleep});
  v1::UpdateWeightRequest request;
  request.set_name("w");
  request.set_step(1);
  CallOptions call;
  call.deadline = absl::Milliseconds(50);
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->UpdateWeightOnce(request, call),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("Deadline Exceeded")));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(450));

  ClientOptions short_deadline;
  short_deadline.deadline = absl::Milliseconds(50);
  auto impatient = MustConnect(server.address(), short_deadline);
  server.service().ScriptUpdates({UpdateMode::kApplyThenSleep});
  request.set_step(2);
  EXPECT_THAT(impatient->UpdateWeightOnce(request),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("Deadline Exceeded")));
}

TEST(ClientCalls, InlineTensorsAbove4MiBRoundTrip) {
  FakeServer server;  // 64 MiB limits
  auto client = MustConnect(server.address());
  const int64_t rows = 1536, cols = 1024;  // 6 MiB of f32
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 977) * 0.25f - 100.0f;
  v1::QdqRequest request;
  absl::StatusOr<v1::Tensor> t = InlineTensorF32(x, {rows, cols});
  ASSERT_THAT(t, IsOk());
  *request.mutable_input() = *t;
  absl::StatusOr<v1::QdqReply> reply = client->Qdq(request);
  ASSERT_THAT(reply, IsOk());
  absl::StatusOr<std::vector<float>> back = ResultToF32(reply->output());
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, x);

  ClientOptions small;
  small.max_message_bytes = 1 << 20;
  auto limited = MustConnect(server.address(), small);
  EXPECT_THAT(limited->Qdq(request), StatusIs(absl::StatusCode::kResourceExhausted,
                                              HasSubstr("larger than max")));
}

TEST(ClientHealth, LivenessReadinessAndUnknownService) {
  FakeServer server;
  auto client = MustConnect(server.address());
  EXPECT_EQ(client->CheckHealth(kLivenessService).value_or(ServingStatus::kUnknown),
            ServingStatus::kServing);
  EXPECT_EQ(client->CheckHealth(kReadinessService).value_or(ServingStatus::kUnknown),
            ServingStatus::kServing);
  server.SetHealth(kReadinessService, false);
  EXPECT_EQ(client->CheckHealth(kReadinessService).value_or(ServingStatus::kUnknown),
            ServingStatus::kNotServing);
  EXPECT_THAT(client->CheckHealth("no-such-service"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("service name unknown")));
}

// ---- TLS and bearer tokens.

struct Pem {
  std::string cert, key;
};

// A self-signed certificate for "fp4q.test" made with the openssl tool (skip if absent).
absl::StatusOr<Pem> SelfSigned(const testing::TempDir& dir, const std::string& stem) {
  const std::string cert = dir.File(stem + ".crt"), key = dir.File(stem + ".key");
  absl::StatusOr<testing::RunResult> r = testing::Run(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
       "-subj", "/CN=fp4q.test", "-addext", "subjectAltName=DNS:fp4q.test"});
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return absl::InternalError("openssl: " + r->err);
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  return Pem{read(cert), read(key)};
}

TEST(ClientTls, TlsChannelWithPrivateCaAndBearerToken) {
  if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/openssl to make certificates";
  testing::TempDir dir;
  absl::StatusOr<Pem> server_pem = SelfSigned(dir, "server");
  absl::StatusOr<Pem> other_pem = SelfSigned(dir, "other");
  ASSERT_THAT(server_pem, IsOk());
  ASSERT_THAT(other_pem, IsOk());
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({server_pem->key, server_pem->cert});
  FakeServer::Options server_options;
  server_options.credentials = grpc::SslServerCredentials(ssl);
  FakeServer server(server_options);

  ClientOptions options;
  options.tls = TlsOptions();
  options.tls->root_certs_pem = server_pem->cert;
  options.tls->target_name_override = "fp4q.test";
  options.bearer_token = "tls-token";
  auto client = MustConnect(server.address(), options);
  ASSERT_THAT(client->ServerInfo(), IsOk());
  EXPECT_EQ(server.service().last_metadata("ServerInfo").authorization, "Bearer tls-token");

  // Plaintext against a TLS server, and TLS trusting another CA: no connection.
  auto plain = MustConnect(server.address());
  EXPECT_THAT(plain->ServerInfo(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  options.tls->root_certs_pem = other_pem->cert;
  auto untrusting = MustConnect(server.address(), options);
  EXPECT_THAT(untrusting->ServerInfo(), StatusIs(absl::StatusCode::kUnavailable, ::testing::_));
  EXPECT_EQ(server.service().calls("ServerInfo"), 1);
}

// ---- UpdateWeight retries.

class UpdateRetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClientOptions options;
    options.address = server_.address();
    options.update_retry.max_attempts = 3;
    options.update_retry.initial_backoff = absl::Milliseconds(5);
    options.update_retry.max_backoff = absl::Milliseconds(20);
    client_ = Client::Connect(options).value();
    request_.set_name("layer.w");
    request_.set_step(7);
  }
  FakeServer server_;
  std::unique_ptr<Client> client_;
  v1::UpdateWeightRequest request_;
};

TEST_F(UpdateRetryTest, AppliedOnFirstAttempt) {
  absl::StatusOr<UpdateWeightResult> r = client_->UpdateWeight(request_);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kApplied);
  EXPECT_EQ(r->attempts, 1);
  EXPECT_TRUE(r->reply.applied());
  EXPECT_EQ(r->reply.last_step(), 7);
  EXPECT_TRUE(r->retried_errors.empty());
  EXPECT_EQ(server_.service().update_calls(), 1);
}

TEST_F(UpdateRetryTest, LostReplyRetriedAndReportedAsAppliedByEarlierAttempt) {
  server_.service().ScriptUpdates({UpdateMode::kApplyThenUnavailable});
  absl::StatusOr<UpdateWeightResult> r = client_->UpdateWeight(request_);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kAppliedByEarlierAttempt);
  EXPECT_STREQ(UpdateOutcomeName(r->outcome), "applied by an earlier attempt");
  EXPECT_EQ(r->attempts, 2);
  EXPECT_FALSE(r->reply.applied());
  EXPECT_EQ(r->reply.last_step(), 7);
  ASSERT_EQ(r->retried_errors.size(), 1u);
  EXPECT_THAT(r->retried_errors[0],
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("reply lost")));
  EXPECT_EQ(server_.service().update_calls(), 2);
  EXPECT_EQ(server_.service().last_step("layer.w"), 7);
}

TEST_F(UpdateRetryTest, DeadlineExceededRetriedWithTheSameStep) {
  server_.service().SetSleep(absl::Milliseconds(300));
  server_.service().ScriptUpdates({UpdateMode::kApplyThenSleep});
  CallOptions call;
  call.deadline = absl::Milliseconds(60);
  absl::StatusOr<UpdateWeightResult> r = client_->UpdateWeight(request_, call);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kAppliedByEarlierAttempt);
  EXPECT_EQ(r->attempts, 2);
  ASSERT_EQ(r->retried_errors.size(), 1u);
  EXPECT_EQ(r->retried_errors[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(server_.service().last_step("layer.w"), 7);
}

TEST_F(UpdateRetryTest, FailureBeforeApplyRetriedAndApplied) {
  server_.service().ScriptUpdates({UpdateMode::kUnavailableBeforeApply,
                                   UpdateMode::kUnavailableBeforeApply});
  absl::StatusOr<UpdateWeightResult> r = client_->UpdateWeight(request_);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kApplied);
  EXPECT_EQ(r->attempts, 3);
  EXPECT_TRUE(r->reply.applied());
  EXPECT_EQ(r->retried_errors.size(), 2u);
}

TEST_F(UpdateRetryTest, DuplicateStepOnFirstAttemptIsAlreadyApplied) {
  ASSERT_THAT(client_->UpdateWeight(request_), IsOk());
  absl::StatusOr<UpdateWeightResult> r = client_->UpdateWeight(request_);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kAlreadyApplied);
  EXPECT_EQ(r->attempts, 1);
  EXPECT_FALSE(r->reply.applied());
}

TEST_F(UpdateRetryTest, GivesUpAfterMaxAttemptsWithTheLastError) {
  server_.service().ScriptUpdates({UpdateMode::kUnavailableBeforeApply,
                                   UpdateMode::kUnavailableBeforeApply,
                                   UpdateMode::kUnavailableBeforeApply});
  EXPECT_THAT(client_->UpdateWeight(request_),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("fake: connection reset (after 3 attempts)")));
  EXPECT_EQ(server_.service().update_calls(), 3);
  EXPECT_EQ(server_.service().last_step("layer.w"), -1);
}

TEST_F(UpdateRetryTest, OtherErrorsAreNotRetried) {
  server_.service().ScriptUpdates({UpdateMode::kInvalidArgument});
  EXPECT_THAT(client_->UpdateWeight(request_),
              StatusIs(absl::StatusCode::kInvalidArgument, "update.shape [3] mismatch"));
  EXPECT_EQ(server_.service().update_calls(), 1);
}

TEST_F(UpdateRetryTest, ErrorAfterARetrySaysAnEarlierAttemptMayHaveApplied) {
  server_.service().ScriptUpdates({UpdateMode::kApplyThenUnavailable,
                                   UpdateMode::kInvalidArgument});
  EXPECT_THAT(client_->UpdateWeight(request_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(attempt 2; the previous attempt ended with UNAVAILABLE: "
                                 "fake: reply lost and may have applied the step)")));
}

}  // namespace
}  // namespace fp4q::client
