// The gRPC adapter: service fp4q.v1.Fp4q on gRPC's callback API, over the call layer
// (call_layer.h), which does everything but the wire.
//
// - Served as a generic service: the adapter reads the method from the call's path and the
//   request's bytes, parses them into the layer's request message (an undecodable request is
//   INVALID_ARGUMENT with a message, not gRPC's silent UNIMPLEMENTED), and writes the layer's
//   reply. fp4q.v1.Fp4q is registered beside it with every method but ServerInfo marked generic,
//   so server reflection lists the service (gRPC names a service after its typed methods);
//   ServerInfo goes through the call layer from there.
// - Reactors never block: the call layer hands the request to the engine and returns; the
//   engine's completion (on an executor thread) writes the reply and finishes the call.
// - absl::Status becomes grpc::Status in exactly one function, ToGrpcStatus; codes map one to one.
// - Per call: the session id from metadata "fp4q-session", the bearer tokens from metadata
//   "authorization: Bearer <token>", the deadline and cancellation, and the peer: the Unix
//   socket's checked uid/pid (GrpcServiceOptions::peer_lookup) or TCP.
#ifndef FP4Q_SERVER_GRPC_SERVICE_H_
#define FP4Q_SERVER_GRPC_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "server/call_layer.h"

namespace fp4q::server {

// The single absl -> gRPC status conversion.
grpc::Status ToGrpcStatus(const absl::Status& status);

inline constexpr char kSessionMetadataKey[] = "fp4q-session";

struct GrpcServiceOptions {
  uint64_t max_message_bytes = uint64_t{512} << 20;  // the reply limit of every call
  // The credentials of a connection by its gRPC peer string (UnixListener::Find). Calls whose
  // peer it does not know, or all calls when it is empty, are PeerInfo::Transport::kTcp.
  std::function<std::optional<PeerInfo>(absl::string_view peer)> peer_lookup;
};

class GrpcService final : public grpc::CallbackGenericService {
 public:
  // `layer` is not owned and outlives the service.
  GrpcService(CallLayer* layer, GrpcServiceOptions options);
  ~GrpcService() override;

  // Registers the service (and the descriptor-only fp4q.v1.Fp4q) on `builder`. The service
  // must outlive the server built.
  void RegisterOn(grpc::ServerBuilder* builder);

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  class Reactor;
  class DescriptorService;

  CallLayer* const layer_;
  const GrpcServiceOptions options_;
  std::unique_ptr<DescriptorService> descriptor_service_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_GRPC_SERVICE_H_
