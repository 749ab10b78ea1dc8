// The op table: every method of fp4q.v1.Fp4q, once, as both transports serve it (the gRPC
// adapter, grpc_service.h, and the fast socket, fast_socket.h, walk this table through the call
// layer, call_layer.h). An entry converts its request message to the engine's request
// (proto_convert.h), starts the engine operation and converts the result back. It knows nothing
// of the transport: no gRPC types, no sockets, no metrics, no authentication, no reply header
// (the call layer fills those).
//
// Contract of an entry's `start`: `reply` is called exactly once, on any thread, with either an
// error (and no message) or OK and the reply message; `meta` (may be null) is the engine's
// ReplyMeta of a tensor operation. The request stays alive until then.
#ifndef FP4Q_SERVER_OP_TABLE_H_
#define FP4Q_SERVER_OP_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "server/engine.h"
#include "server/requests.h"

namespace fp4q::server {

// What an entry needs besides the engine and its request.
struct OpEnvironment {
  Engine* engine = nullptr;
  uint64_t max_message_bytes = 0;        // reported in ServerInfo.limits
  uint32_t fast_socket_frame_bytes = 0;  // 0: no fast socket (ServerInfo.limits)
  uint32_t fast_socket_heads_up_micros = 0;  // 0: no heads-ups (ServerInfo.limits)
};

using OpReply = std::function<void(absl::Status status,
                                   std::unique_ptr<google::protobuf::Message> reply,
                                   const ReplyMeta* meta)>;

struct Op {
  const char* name = "";  // the method's name in service Fp4q
  const google::protobuf::Message* request_prototype = nullptr;
  const google::protobuf::Message* reply_prototype = nullptr;
  bool fast_socket = true;  // served on the fast socket
  // State-changing calls that can return tensors inline: an upper bound of the inline tensor
  // bytes the reply will carry (0 when none), so the call layer refuses a call whose reply
  // could not be sent before it changes anything. Null: the call changes no state (a reply
  // over the limit is refused after the work instead).
  std::function<uint64_t(const google::protobuf::Message& request)> inline_reply_bound;
  std::function<void(const OpEnvironment& env, const RequestContext& ctx,
                     std::shared_ptr<const google::protobuf::Message> request, OpReply reply)>
      start;
};

// Every method of fp4q.v1.Fp4q, in the service's order.
const std::vector<Op>& OpTable();
// The entry of `method` (as the service names it, e.g. "Step"), or null.
const Op* FindOp(absl::string_view method);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_OP_TABLE_H_
