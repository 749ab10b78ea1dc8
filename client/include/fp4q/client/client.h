// The fp4q C++ client: one object per server connection, one method per RPC of
// proto/fp4q/v1/fp4q.proto, plus the standard health check.
//
// Contract
// - Errors: every method returns absl::Status / absl::StatusOr. A gRPC status becomes an
//   absl::Status with the same code and the server's message unchanged (FromGrpcStatus); the
//   codes the server uses are listed at the top of fp4q.proto. Client-side checks (bad options,
//   malformed replies) use INVALID_ARGUMENT / INTERNAL with a message naming the field.
// - Deadlines: each call gets CallOptions::deadline, or ClientOptions::deadline when that is
//   zero; a call past it fails with DEADLINE_EXCEEDED. InfiniteDuration() means no deadline.
// - Message sizes: the channel's send and receive limits are set explicitly to
//   ClientOptions::max_message_bytes (default 512 MiB, the server's default --max_message_bytes),
//   so inline tensors above gRPC's 4 MiB default work. A request above the client's limit fails
//   locally with RESOURCE_EXHAUSTED; above the server's limit, the server answers the same code.
// - Retries: only UpdateWeight retries (UNAVAILABLE and DEADLINE_EXCEEDED, same request, same
//   step; see UpdateWeightResult). Every other call is attempted once.
// - Thread safety: a Client is safe to use from any number of threads at once; it holds one
//   gRPC channel whose connections are shared by all calls.
// - Ownership: Connect returns the only owner. Sessions (session.h) borrow the Client, which
//   must outlive them.
#ifndef FP4Q_CLIENT_CLIENT_H_
#define FP4Q_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fp4q/v1/fp4q.pb.h"

namespace grpc {
class Status;
}  // namespace grpc

namespace fp4q::client {

namespace v1 = ::fp4q::v1;

// The gRPC status as an absl::Status: same code (the numbering is identical), same message.
// The only place the two meet.
absl::Status FromGrpcStatus(const grpc::Status& status);

// TLS for the channel. Empty strings mean "not given".
struct TlsOptions {
  std::string root_certs_pem;        // CA bundle; empty: gRPC's default roots
  std::string client_cert_pem;       // mutual TLS: certificate chain (with client_key_pem)
  std::string client_key_pem;        // mutual TLS: private key (with client_cert_pem)
  std::string target_name_override;  // expected server name, for tests with a private CA
};

// How UpdateWeight retries a call whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED).
struct RetryOptions {
  int max_attempts = 5;                                   // >= 1; 1 disables retries
  absl::Duration initial_backoff = absl::Milliseconds(50);  // sleep before the 2nd attempt
  absl::Duration max_backoff = absl::Seconds(2);          // backoff doubles up to this
};

struct ClientOptions {
  // gRPC target: "host:port", "unix:/path" or any gRPC URI.
  std::string address = "127.0.0.1:50051";
  // Default per-call deadline (each attempt of a retried call gets its own).
  absl::Duration deadline = absl::Seconds(60);
  // Channel send and receive limit in bytes, 1..INT32_MAX.
  int64_t max_message_bytes = int64_t{512} << 20;
  // Absent: plaintext (loopback, Unix sockets). Present: TLS with these settings.
  std::optional<TlsOptions> tls;
  // Non-empty: every call carries metadata "authorization: Bearer <token>".
  std::string bearer_token;
  // UpdateWeight's retry policy.
  RetryOptions update_retry;
};

// Per-call settings.
struct CallOptions {
  // Zero: ClientOptions::deadline. InfiniteDuration(): none.
  absl::Duration deadline = absl::ZeroDuration();
  // Non-empty: sent as metadata "fp4q-session" (requests naming regions need it; see
  // session.h, whose Session::call_options() fills it).
  std::string session_id;
  // Wait for the channel to connect instead of failing fast with UNAVAILABLE.
  bool wait_for_ready = false;
};

// Metadata keys of the protocol (docs/DESIGN.md).
inline constexpr char kSessionMetadataKey[] = "fp4q-session";
inline constexpr char kAuthorizationMetadataKey[] = "authorization";

// Health service names (docs/DESIGN.md "Health").
inline constexpr char kLivenessService[] = "liveness";
inline constexpr char kReadinessService[] = "readiness";

enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* ServingStatusName(ServingStatus status);

// How an UpdateWeight call ended when it returned OK.
enum class UpdateOutcome {
  // This call's (last) attempt applied the step: reply.applied() is true.
  kApplied,
  // A retry was answered applied=false after an earlier attempt of this call ended with
  // UNAVAILABLE or DEADLINE_EXCEEDED: the step is in effect, applied by that earlier attempt
  // (or by another client that sent the same step in between; the server cannot tell apart).
  kAppliedByEarlierAttempt,
  // The first attempt was answered applied=false: the step had been applied before this call
  // (a duplicate step, e.g. another data-parallel worker sent it first). Not applied again.
  kAlreadyApplied,
};
const char* UpdateOutcomeName(UpdateOutcome outcome);

struct UpdateWeightResult {
  v1::UpdateWeightReply reply;  // the last attempt's reply
  UpdateOutcome outcome = UpdateOutcome::kApplied;
  int attempts = 1;                        // RPC attempts made (>= 1)
  std::vector<absl::Status> retried_errors;  // the errors that caused each retry, in order
};

class Client {
 public:
  // Creates the channel (connection is lazy: the first call connects). INVALID_ARGUMENT for an
  // empty address, max_message_bytes outside 1..INT32_MAX, max_attempts < 1, a negative
  // deadline or backoff, or a client certificate without its key (or the reverse).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const;

  // The server epoch of the last reply seen by this client (0 before any): a change means the
  // server restarted and restored its state from its last checkpoint.
  uint64_t last_server_epoch() const;

  // ---- Numerics.
  absl::StatusOr<v1::QuantizeReply> Quantize(const v1::QuantizeRequest& request,
                                             const CallOptions& call = {}) const;
  absl::StatusOr<v1::DequantizeReply> Dequantize(const v1::DequantizeRequest& request,
                                                 const CallOptions& call = {}) const;
  absl::StatusOr<v1::QdqReply> Qdq(const v1::QdqRequest& request,
                                   const CallOptions& call = {}) const;
  absl::StatusOr<v1::MatmulReply> Matmul(const v1::MatmulRequest& request,
                                         const CallOptions& call = {}) const;

  // Applies one update; retried per ClientOptions::update_retry with the same request (hence
  // the same step: the server applies a step at most once, so retries are safe). Errors other
  // than UNAVAILABLE/DEADLINE_EXCEEDED are returned at once; when attempts run out the last
  // error is returned with " (after N attempts)" appended to its message.
  absl::StatusOr<UpdateWeightResult> UpdateWeight(const v1::UpdateWeightRequest& request,
                                                  const CallOptions& call = {}) const;
  // One attempt, no retry.
  absl::StatusOr<v1::UpdateWeightReply> UpdateWeightOnce(const v1::UpdateWeightRequest& request,
                                                         const CallOptions& call = {}) const;

  // ---- Named state.
  absl::StatusOr<v1::CreateWeightReply> CreateWeight(const v1::CreateWeightRequest& request,
                                                     const CallOptions& call = {}) const;
  absl::StatusOr<v1::GetWeightReply> GetWeight(const v1::GetWeightRequest& request,
                                               const CallOptions& call = {}) const;
  absl::StatusOr<v1::DeleteWeightReply> DeleteWeight(const v1::DeleteWeightRequest& request,
                                                     const CallOptions& call = {}) const;
  absl::StatusOr<v1::ResetResidualReply> ResetResidual(const v1::ResetResidualRequest& request,
                                                       const CallOptions& call = {}) const;
  absl::StatusOr<v1::ListTensorsReply> ListTensors(const v1::ListTensorsRequest& request = {},
                                                   const CallOptions& call = {}) const;
  absl::StatusOr<v1::CheckpointReply> Checkpoint(const v1::CheckpointRequest& request = {},
                                                 const CallOptions& call = {}) const;
  absl::StatusOr<v1::ResetOptimizerReply> ResetOptimizer(const v1::ResetOptimizerRequest& request,
                                                         const CallOptions& call = {}) const;

  // ---- The trainer's step: many weights' updates as one unit (fp4q.v1.StepRequest). One
  // attempt; a retry with the same request is safe (an applied step answers applied=false).
  absl::StatusOr<v1::StepReply> Step(const v1::StepRequest& request,
                                     const CallOptions& call = {}) const;
  // Replica groups and namespaces (need CallOptions::session_id).
  absl::StatusOr<v1::JoinGroupReply> JoinGroup(const v1::JoinGroupRequest& request,
                                               const CallOptions& call = {}) const;
  absl::StatusOr<v1::LeaveGroupReply> LeaveGroup(const v1::LeaveGroupRequest& request,
                                                 const CallOptions& call = {}) const;
  absl::StatusOr<v1::DeleteNamespaceReply> DeleteNamespace(
      const v1::DeleteNamespaceRequest& request = {}, const CallOptions& call = {}) const;

  // ---- Sessions and regions (session.h wraps these; KeepAlive, CloseSession and the region
  // calls need CallOptions::session_id).
  absl::StatusOr<v1::OpenSessionReply> OpenSession(const v1::OpenSessionRequest& request,
                                                   const CallOptions& call = {}) const;
  absl::StatusOr<v1::KeepAliveReply> KeepAlive(const v1::KeepAliveRequest& request,
                                               const CallOptions& call = {}) const;
  absl::StatusOr<v1::CloseSessionReply> CloseSession(const v1::CloseSessionRequest& request,
                                                     const CallOptions& call = {}) const;
  absl::StatusOr<v1::RegisterCudaRegionReply> RegisterCudaRegion(
      const v1::RegisterCudaRegionRequest& request, const CallOptions& call = {}) const;
  absl::StatusOr<v1::UnregisterCudaRegionReply> UnregisterCudaRegion(
      const v1::UnregisterCudaRegionRequest& request, const CallOptions& call = {}) const;

  // ---- Server.
  absl::StatusOr<v1::ServerInfoReply> ServerInfo(const v1::ServerInfoRequest& request = {},
                                                 const CallOptions& call = {}) const;
  // grpc.health.v1.Health/Check for `service` ("" overall, kLivenessService,
  // kReadinessService). An unknown service name is NOT_FOUND (the health protocol's answer).
  absl::StatusOr<ServingStatus> CheckHealth(const std::string& service,
                                            const CallOptions& call = {}) const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_CLIENT_H_
