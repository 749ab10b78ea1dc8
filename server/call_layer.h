// The call layer: what every call goes through, whichever transport carried it (the gRPC
// adapter, grpc_service.h; the fast socket, fast_socket.h). A transport reads a method name and
// the request's bytes, parses them into the request message the layer gives it, and hands the
// call over; the layer does the rest, once for every transport:
//   - metrics (fp4q_requests_total{rpc,code}, the duration, processed bytes, in-flight gauge);
//   - authentication: the bearer token (--auth_token_file) or a namespace-bound token
//     (--namespace_tokens_file), compared in constant time; UNAUTHENTICATED otherwise;
//   - undecodable requests: INVALID_ARGUMENT naming the request type;
//   - the reply limit: a state-changing call whose inline outputs could not fit the
//     transport's reply is refused with RESOURCE_EXHAUSTED before it runs (it changes nothing);
//     any other reply over the limit is RESOURCE_EXHAUSTED after the work;
//   - the op table entry (op_table.h), the engine's work, and the reply header
//     (server_epoch, backend, device, kernel/queue/server micros) of every reply.
// The transport turns the final status and reply message into its wire format (the one
// absl::Status -> grpc::Status conversion lives in grpc_service.cc).
// Thread-safe; Run's `finish` is called exactly once, on any thread.
#ifndef FP4Q_SERVER_CALL_LAYER_H_
#define FP4Q_SERVER_CALL_LAYER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "server/op_table.h"

namespace fp4q::server {

struct CallLayerOptions {
  std::string auth_token;  // empty: none (unless namespace_tokens is not empty)
  // Tokens that bind their callers to a namespace (token -> namespace).
  std::map<std::string, std::string> namespace_tokens;
  uint64_t max_message_bytes = uint64_t{512} << 20;  // gRPC's limit, for ServerInfo
  uint32_t fast_socket_frame_bytes = 0;               // 0: no fast socket (ServerInfo)
  uint32_t fast_socket_heads_up_micros = 0;           // 0: no heads-ups (ServerInfo)
};

// One call as the transport saw it.
struct IncomingCall {
  std::string method;      // as service Fp4q names it ("Step")
  RequestContext context;  // deadline, cancellation, session id, peer
  // The bearer tokens the caller presented (gRPC metadata "authorization: Bearer T"), or the
  // token of the fast-socket connection's hello. `authenticated`: the transport already ran
  // Authenticate for this connection (the fast socket, at hello) and set context.
  std::vector<std::string> tokens;
  bool authenticated = false;
  // Bytes the transport can carry back in one reply (gRPC: --max_message_bytes; the fast
  // socket: FAST_SOCKET_MAX_FRAME_BYTES less its own framing). State-changing calls must fit
  // their bound plus FAST_SOCKET_REPLY_MARGIN_BYTES (the reply's fixed fields) in it. 0: none.
  uint64_t reply_limit = 0;
  bool fast_socket = false;  // the method must be served on the fast socket
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

class CallLayer {
 public:
  using Finish =
      std::function<void(const absl::Status& status, std::unique_ptr<google::protobuf::Message>)>;

  // `engine` and `metrics` (may be null) are not owned and outlive the layer.
  CallLayer(Engine* engine, Metrics* metrics, CallLayerOptions options);

  // An empty request message of `method`, for the transport to parse into; null when the
  // method is unknown (Run then answers the call).
  std::unique_ptr<google::protobuf::Message> NewRequest(absl::string_view method) const;

  // Runs one call to completion. `request` is what NewRequest gave, parsed from
  // `request_bytes` bytes; `parsed` false when the bytes did not parse.
  void Run(IncomingCall call, std::unique_ptr<google::protobuf::Message> request, bool parsed,
           size_t request_bytes, Finish finish);

  // Checks presented tokens: OK with the namespace a token binds (empty: none) when one of
  // them is accepted (or no token is configured), else UNAUTHENTICATED (`field` names where the
  // token travels, e.g. "metadata authorization").
  absl::StatusOr<std::string> Authenticate(const std::vector<std::string>& tokens,
                                           absl::string_view field) const;

  // Counts a call answered by the transport itself (a fast-socket hello, a frame error).
  void Record(absl::string_view rpc, absl::StatusCode code, double seconds) const;

  Engine& engine() const { return *engine_; }

 private:
  Engine* const engine_;
  Metrics* const metrics_;
  const CallLayerOptions options_;
  OpEnvironment env_;
};

// Equal strings, compared in constant time (does not stop at the first differing byte).
bool SameSecret(absl::string_view a, absl::string_view b);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_CALL_LAYER_H_
