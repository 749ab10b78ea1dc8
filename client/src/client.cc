// Client: the channel, per-call context setup (deadline, metadata) and one unary call per RPC.
#include "fp4q/client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/v1/fp4q.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace fp4q::client {

const char* ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown: return "UNKNOWN";
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

const char* UpdateOutcomeName(UpdateOutcome outcome) {
  switch (outcome) {
    case UpdateOutcome::kApplied: return "applied";
    case UpdateOutcome::kAppliedByEarlierAttempt: return "applied by an earlier attempt";
    case UpdateOutcome::kAlreadyApplied: return "already applied before this call";
  }
  return "unknown";
}

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Fp4q::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::atomic<uint64_t> epoch{0};

  void Setup(grpc::ClientContext* context, const CallOptions& call) const {
    const absl::Duration deadline =
        call.deadline == absl::ZeroDuration() ? options.deadline : call.deadline;
    if (deadline != absl::InfiniteDuration()) {
      context->set_deadline(std::chrono::system_clock::now() +
                            absl::ToChronoNanoseconds(deadline));
    }
    if (!call.session_id.empty()) {
      context->AddMetadata(kSessionMetadataKey, call.session_id);
    }
    if (!options.bearer_token.empty()) {
      context->AddMetadata(kAuthorizationMetadataKey,
                           absl::StrCat("Bearer ", options.bearer_token));
    }
    context->set_wait_for_ready(call.wait_for_ready);
  }

  template <typename Reply, typename Request>
  absl::StatusOr<Reply> Unary(
      grpc::Status (v1::Fp4q::Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
      const Request& request, const CallOptions& call) {
    grpc::ClientContext context;
    Setup(&context, call);
    Reply reply;
    const grpc::Status status = (stub.get()->*method)(&context, request, &reply);
    if (!status.ok()) return FromGrpcStatus(status);
    if (reply.header().server_epoch() != 0) {
      epoch.store(reply.header().server_epoch(), std::memory_order_relaxed);
    }
    return reply;
  }
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("ClientOptions.address is empty");
  }
  if (options.max_message_bytes < 1 || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_message_bytes must be in [1, ", INT_MAX, "], got ",
                     options.max_message_bytes));
  }
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.deadline must be positive, got ",
                     absl::FormatDuration(options.deadline)));
  }
  const RetryOptions& retry = options.update_retry;
  if (retry.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.update_retry.max_attempts must be >= 1, got ", retry.max_attempts));
  }
  if (retry.initial_backoff < absl::ZeroDuration() || retry.max_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.update_retry backoffs must be >= 0, got initial_backoff ",
        absl::FormatDuration(retry.initial_backoff), " and max_backoff ",
        absl::FormatDuration(retry.max_backoff)));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  if (options.tls.has_value()) {
    const TlsOptions& tls = *options.tls;
    if (tls.client_cert_pem.empty() != tls.client_key_pem.empty()) {
      return absl::InvalidArgumentError(
          "TlsOptions.client_cert_pem and TlsOptions.client_key_pem must be given together");
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.root_certs_pem;
    ssl.pem_cert_chain = tls.client_cert_pem;
    ssl.pem_private_key = tls.client_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!tls.target_name_override.empty()) {
      args.SetSslTargetNameOverride(tls.target_name_override);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  const int limit = static_cast<int>(options.max_message_bytes);
  args.SetMaxSendMessageSize(limit);
  args.SetMaxReceiveMessageSize(limit);

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->channel = grpc::CreateCustomChannel(options.address, credentials, args);
  impl->stub = v1::Fp4q::NewStub(impl->channel);
  impl->health = grpc::health::v1::Health::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options; }

uint64_t Client::last_server_epoch() const {
  return impl_->epoch.load(std::memory_order_relaxed);
}

absl::StatusOr<v1::QuantizeReply> Client::Quantize(const v1::QuantizeRequest& request,
                                                   const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Quantize, request, call);
}

absl::StatusOr<v1::DequantizeReply> Client::Dequantize(const v1::DequantizeRequest& request,
                                                       const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Dequantize, request, call);
}

absl::StatusOr<v1::QdqReply> Client::Qdq(const v1::QdqRequest& request,
                                         const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Qdq, request, call);
}

absl::StatusOr<v1::MatmulReply> Client::Matmul(const v1::MatmulRequest& request,
                                               const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Matmul, request, call);
}

absl::StatusOr<v1::UpdateWeightReply> Client::UpdateWeightOnce(
    const v1::UpdateWeightRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::UpdateWeight, request, call);
}

absl::StatusOr<UpdateWeightResult> Client::UpdateWeight(const v1::UpdateWeightRequest& request,
                                                        const CallOptions& call) const {
  const RetryOptions& retry = impl_->options.update_retry;
  UpdateWeightResult result;
  absl::Duration backoff = retry.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<v1::UpdateWeightReply> reply = UpdateWeightOnce(request, call);
    if (reply.ok()) {
      result.attempts = attempt;
      result.reply = *std::move(reply);
      if (result.reply.applied()) {
        result.outcome = UpdateOutcome::kApplied;
      } else if (attempt == 1) {
        result.outcome = UpdateOutcome::kAlreadyApplied;
      } else {
        result.outcome = UpdateOutcome::kAppliedByEarlierAttempt;
      }
      return result;
    }
    const absl::StatusCode code = reply.status().code();
    const bool unknown_outcome = code == absl::StatusCode::kUnavailable ||
                                 code == absl::StatusCode::kDeadlineExceeded;
    if (!unknown_outcome) {
      if (attempt == 1) return reply.status();
      // E.g. a stale step: an attempt whose outcome was unknown may have applied this step
      // and a later one been applied since. Say so rather than hide the retries.
      return absl::Status(code, absl::StrCat(reply.status().message(), " (attempt ", attempt,
                                             "; the previous attempt ended with ",
                                             result.retried_errors.back().ToString(),
                                             " and may have applied the step)"));
    }
    if (attempt >= retry.max_attempts) {
      return absl::Status(code, absl::StrCat(reply.status().message(), " (after ", attempt,
                                             attempt == 1 ? " attempt)" : " attempts)"));
    }
    result.retried_errors.push_back(reply.status());
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, retry.max_backoff);
  }
}

absl::StatusOr<v1::CreateWeightReply> Client::CreateWeight(const v1::CreateWeightRequest& request,
                                                           const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::CreateWeight, request, call);
}

absl::StatusOr<v1::GetWeightReply> Client::GetWeight(const v1::GetWeightRequest& request,
                                                     const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::GetWeight, request, call);
}

absl::StatusOr<v1::DeleteWeightReply> Client::DeleteWeight(const v1::DeleteWeightRequest& request,
                                                           const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::DeleteWeight, request, call);
}

absl::StatusOr<v1::ResetResidualReply> Client::ResetResidual(
    const v1::ResetResidualRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::ResetResidual, request, call);
}

absl::StatusOr<v1::ListTensorsReply> Client::ListTensors(const v1::ListTensorsRequest& request,
                                                         const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::ListTensors, request, call);
}

absl::StatusOr<v1::CheckpointReply> Client::Checkpoint(const v1::CheckpointRequest& request,
                                                       const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Checkpoint, request, call);
}

absl::StatusOr<v1::ResetOptimizerReply> Client::ResetOptimizer(
    const v1::ResetOptimizerRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::ResetOptimizer, request, call);
}

absl::StatusOr<v1::StepReply> Client::Step(const v1::StepRequest& request,
                                           const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::Step, request, call);
}

absl::StatusOr<v1::JoinGroupReply> Client::JoinGroup(const v1::JoinGroupRequest& request,
                                                     const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::JoinGroup, request, call);
}

absl::StatusOr<v1::LeaveGroupReply> Client::LeaveGroup(const v1::LeaveGroupRequest& request,
                                                       const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::LeaveGroup, request, call);
}

absl::StatusOr<v1::DeleteNamespaceReply> Client::DeleteNamespace(
    const v1::DeleteNamespaceRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::DeleteNamespace, request, call);
}

absl::StatusOr<v1::OpenSessionReply> Client::OpenSession(const v1::OpenSessionRequest& request,
                                                         const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::OpenSession, request, call);
}

absl::StatusOr<v1::KeepAliveReply> Client::KeepAlive(const v1::KeepAliveRequest& request,
                                                     const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::KeepAlive, request, call);
}

absl::StatusOr<v1::CloseSessionReply> Client::CloseSession(const v1::CloseSessionRequest& request,
                                                           const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::CloseSession, request, call);
}

absl::StatusOr<v1::RegisterCudaRegionReply> Client::RegisterCudaRegion(
    const v1::RegisterCudaRegionRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::RegisterCudaRegion, request, call);
}

absl::StatusOr<v1::UnregisterCudaRegionReply> Client::UnregisterCudaRegion(
    const v1::UnregisterCudaRegionRequest& request, const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::UnregisterCudaRegion, request, call);
}

absl::StatusOr<v1::ServerInfoReply> Client::ServerInfo(const v1::ServerInfoRequest& request,
                                                       const CallOptions& call) const {
  return impl_->Unary(&v1::Fp4q::Stub::ServerInfo, request, call);
}

absl::StatusOr<ServingStatus> Client::CheckHealth(const std::string& service,
                                                  const CallOptions& call) const {
  grpc::ClientContext context;
  impl_->Setup(&context, call);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = impl_->health->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING: return ServingStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING: return ServingStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return ServingStatus::kServiceUnknown;
    default: return ServingStatus::kUnknown;
  }
}

}  // namespace fp4q::client
