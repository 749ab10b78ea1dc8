// The gRPC adapter: fp4q.v1.Fp4q on the callback API over the engine.
//
// - Reactors never block: each handler converts the request, hands it to the engine and
//   returns; the engine's completion (on an executor thread) fills the reply and finishes the
//   reactor. Only ListTensors, ServerInfo, OpenSession and KeepAlive answer inline (no waits).
// - absl::Status becomes grpc::Status in exactly one function, ToGrpcStatus; codes map one to one.
// - Every reply carries ReplyHeader{server_epoch, backend, device_uuid, kernel_micros}.
// - Session id: metadata "fp4q-session". Deadlines and cancellation are passed to the engine,
//   which checks them before work starts.
// - Peer: each call's RequestContext::peer says whether it came over the Unix socket (with the
//   uid/pid checked there) or TCP (ServiceOptions::peer_lookup).
// - Auth: with a non-empty `auth_token`, every fp4q.v1 call must carry metadata
//   "authorization: Bearer <token>" (compared in constant time), else UNAUTHENTICATED. The health
//   service is exempt (probes carry no token; it reveals nothing).
#ifndef FP4Q_SERVER_GRPC_SERVICE_H_
#define FP4Q_SERVER_GRPC_SERVICE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "fp4q/v1/fp4q.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/engine.h"
#include "server/metrics.h"

namespace fp4q::server {

// The single absl -> gRPC status conversion.
grpc::Status ToGrpcStatus(const absl::Status& status);

inline constexpr char kSessionMetadataKey[] = "fp4q-session";

// Shared by the gRPC adapter and the fast socket (fast_socket.h).
// Equal strings, compared in constant time (does not stop at the first differing byte).
bool SameSecret(absl::string_view a, absl::string_view b);
// ReplyHeader{server_epoch, backend} and, with a meta, {device_uuid, kernel/queue micros}.
void FillReplyHeader(const Engine& engine, const ReplyMeta* meta, v1::ReplyHeader* header);
// ServerInfo as `peer` may see it: "cuda_ipc" listed only when that peer may register regions.
void FillServerInfo(Engine& engine, uint64_t max_message_bytes, const PeerInfo& peer,
                    v1::ServerInfoReply* reply);

struct ServiceOptions {
  std::string auth_token;                            // empty: no authentication
  uint64_t max_message_bytes = uint64_t{512} << 20;  // reported in ServerInfo.limits
  // The credentials of a connection by its gRPC peer string (UnixListener::Find). Calls whose
  // peer it does not know, or all calls when it is empty, are PeerInfo::Transport::kTcp.
  std::function<std::optional<PeerInfo>(absl::string_view peer)> peer_lookup;
};

class Fp4qService final : public ::fp4q::v1::Fp4q::CallbackService {
 public:
  // `engine` and `metrics` (may be null) are not owned and outlive the service.
  Fp4qService(Engine* engine, Metrics* metrics, ServiceOptions options);

  using Ctx = grpc::CallbackServerContext;
  using Reactor = grpc::ServerUnaryReactor;

  Reactor* Quantize(Ctx* ctx, const v1::QuantizeRequest* req, v1::QuantizeReply* rep) override;
  Reactor* Dequantize(Ctx* ctx, const v1::DequantizeRequest* req,
                      v1::DequantizeReply* rep) override;
  Reactor* Qdq(Ctx* ctx, const v1::QdqRequest* req, v1::QdqReply* rep) override;
  Reactor* Matmul(Ctx* ctx, const v1::MatmulRequest* req, v1::MatmulReply* rep) override;
  Reactor* UpdateWeight(Ctx* ctx, const v1::UpdateWeightRequest* req,
                        v1::UpdateWeightReply* rep) override;
  Reactor* CreateWeight(Ctx* ctx, const v1::CreateWeightRequest* req,
                        v1::CreateWeightReply* rep) override;
  Reactor* GetWeight(Ctx* ctx, const v1::GetWeightRequest* req, v1::GetWeightReply* rep) override;
  Reactor* DeleteWeight(Ctx* ctx, const v1::DeleteWeightRequest* req,
                        v1::DeleteWeightReply* rep) override;
  Reactor* ResetResidual(Ctx* ctx, const v1::ResetResidualRequest* req,
                         v1::ResetResidualReply* rep) override;
  Reactor* ListTensors(Ctx* ctx, const v1::ListTensorsRequest* req,
                       v1::ListTensorsReply* rep) override;
  Reactor* Checkpoint(Ctx* ctx, const v1::CheckpointRequest* req,
                      v1::CheckpointReply* rep) override;
  Reactor* OpenSession(Ctx* ctx, const v1::OpenSessionRequest* req,
                       v1::OpenSessionReply* rep) override;
  Reactor* KeepAlive(Ctx* ctx, const v1::KeepAliveRequest* req, v1::KeepAliveReply* rep) override;
  Reactor* CloseSession(Ctx* ctx, const v1::CloseSessionRequest* req,
                        v1::CloseSessionReply* rep) override;
  Reactor* RegisterCudaRegion(Ctx* ctx, const v1::RegisterCudaRegionRequest* req,
                              v1::RegisterCudaRegionReply* rep) override;
  Reactor* UnregisterCudaRegion(Ctx* ctx, const v1::UnregisterCudaRegionRequest* req,
                                v1::UnregisterCudaRegionReply* rep) override;
  Reactor* ServerInfo(Ctx* ctx, const v1::ServerInfoRequest* req,
                      v1::ServerInfoReply* rep) override;

 private:
  class Call;
  // Handles an engine operation that completes through Done<Res>, with Res carrying a meta.
  template <typename Res, typename Reply, typename Start>
  Reactor* Async(Ctx* ctx, const char* rpc, Reply* reply, Start start);
  // Starts a call: metrics, authentication, the engine's request context. Null when refused
  // (the reactor is finished then).
  Call* Begin(Ctx* ctx, const char* rpc, Reactor** reactor);
  void SetHeader(v1::ReplyHeader* header, const ReplyMeta* meta) const;

  Engine* const engine_;
  Metrics* const metrics_;
  const ServiceOptions options_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_GRPC_SERVICE_H_
