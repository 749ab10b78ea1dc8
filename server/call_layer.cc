#include "server/call_layer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fp4q/v1/fp4q.pb.h"
#include "google/protobuf/descriptor.h"

namespace fp4q::server {
namespace {

namespace pb = google::protobuf;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The reply's ReplyHeader (every fp4q.v1 reply has one as field `header`), or null.
v1::ReplyHeader* HeaderOf(pb::Message* reply) {
  const pb::FieldDescriptor* f = reply->GetDescriptor()->FindFieldByName("header");
  if (f == nullptr || f->message_type() != v1::ReplyHeader::descriptor()) return nullptr;
  return static_cast<v1::ReplyHeader*>(reply->GetReflection()->MutableMessage(reply, f));
}

}  // namespace

bool SameSecret(absl::string_view a, absl::string_view b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

CallLayer::CallLayer(Engine* engine, Metrics* metrics, CallLayerOptions options)
    : engine_(engine), metrics_(metrics), options_(std::move(options)) {
  env_.engine = engine_;
  env_.max_message_bytes = options_.max_message_bytes;
  env_.fast_socket_frame_bytes = options_.fast_socket_frame_bytes;
  env_.fast_socket_heads_up_micros = options_.fast_socket_heads_up_micros;
}

std::unique_ptr<pb::Message> CallLayer::NewRequest(absl::string_view method) const {
  const Op* op = FindOp(method);
  if (op == nullptr) return nullptr;
  return std::unique_ptr<pb::Message>(op->request_prototype->New());
}

absl::StatusOr<std::string> CallLayer::Authenticate(const std::vector<std::string>& tokens,
                                                    absl::string_view field) const {
  if (options_.auth_token.empty() && options_.namespace_tokens.empty()) return std::string();
  // Every configured token is compared with every presented one (constant time each), so the
  // time taken does not tell which one matched.
  bool ok = false;
  std::string bound;
  for (const std::string& t : tokens) {
    if (!options_.auth_token.empty() && SameSecret(t, options_.auth_token)) ok = true;
    for (const auto& [token, ns] : options_.namespace_tokens) {
      if (SameSecret(t, token)) {
        ok = true;
        bound = ns;
      }
    }
  }
  if (!ok) {
    return absl::UnauthenticatedError(absl::StrCat(field, ": missing or wrong bearer token"));
  }
  return bound;
}

void CallLayer::Record(absl::string_view rpc, absl::StatusCode code, double seconds) const {
  if (metrics_ == nullptr) return;
  metrics_->RequestStarted();
  metrics_->RequestFinished(rpc, code, seconds, 0, 0);
}

void CallLayer::Run(IncomingCall call, std::unique_ptr<pb::Message> request, bool parsed,
                    size_t request_bytes, Finish finish) {
  const Op* op = FindOp(call.method);
  const char* rpc = op != nullptr ? op->name : "Unknown";
  if (metrics_ != nullptr) metrics_->RequestStarted();
  const auto arrival = call.arrival;
  // Every answer goes through here: metrics, then the transport.
  auto done = [this, rpc, arrival, finish](const absl::Status& s,
                                           std::unique_ptr<pb::Message> reply,
                                           const ReplyMeta* meta) {
    if (metrics_ != nullptr) {
      // A Step's wait for its workers' ready signals is theirs: the request's duration leaves
      // it out, and it is observed on its own.
      const double waited = meta != nullptr ? meta->ready_wait_micros * 1e-6 : 0.0;
      if (meta != nullptr && meta->ready_waited) metrics_->StepReadyWait(waited);
      metrics_->RequestFinished(rpc, s.code(), std::max(0.0, SecondsSince(arrival) - waited),
                                meta != nullptr ? meta->processed_bytes : 0,
                                meta != nullptr ? meta->processed_elements : 0);
    }
    finish(s, s.ok() ? std::move(reply) : nullptr);
  };
  if (op == nullptr || (call.fast_socket && !op->fast_socket)) {
    const std::string what = call.method.substr(0, 64);
    return done(op == nullptr
                    ? absl::UnimplementedError(
                          absl::StrCat("method: '", what, "' is not a method of fp4q.v1.Fp4q"))
                    : absl::InvalidArgumentError(absl::StrCat(
                          "method: ", what,
                          " is not served on the fast socket (a connection is bound to one "
                          "session by its hello); call it over gRPC")),
                nullptr, nullptr);
  }
  if (!call.authenticated) {
    absl::StatusOr<std::string> bound = Authenticate(call.tokens, "metadata authorization");
    if (!bound.ok()) return done(bound.status(), nullptr, nullptr);
    if (!bound->empty()) {
      call.context.namespace_bound = true;
      call.context.bound_namespace = *bound;
    }
  }
  if (!parsed || request == nullptr) {
    return done(absl::InvalidArgumentError(absl::StrCat(
                    "request: ", request_bytes, " bytes are not a valid ",
                    op->request_prototype->GetDescriptor()->full_name(),
                    " (truncated, invalid UTF-8 in a string field, or not protobuf)")),
                nullptr, nullptr);
  }
  const uint64_t limit = call.reply_limit;
  if (op->inline_reply_bound) {
    // The bound covers what a reply carries beyond its fixed fields; the margin covers those.
    const uint64_t bound = op->inline_reply_bound(*request) + v1::FAST_SOCKET_REPLY_MARGIN_BYTES;
    if (limit > 0 && bound > limit) {
      return done(absl::ResourceExhaustedError(absl::StrCat(
                      "reply: it could carry up to ", bound,
                      " bytes, over this transport's reply limit of ", limit,
                      " bytes; nothing was run: write the outputs into CUDA IPC regions",
                      call.fast_socket ? ", or call over gRPC" : " or raise --max_message_bytes")),
                  nullptr, nullptr);
    }
  }
  call.context.reply_limit = limit;
  std::shared_ptr<const pb::Message> req(std::move(request));
  op->start(env_, call.context, req,
            [this, done, arrival, limit, stateful = static_cast<bool>(op->inline_reply_bound)](
                absl::Status s, std::unique_ptr<pb::Message> reply, const ReplyMeta* meta) {
              if (!s.ok()) return done(s, nullptr, meta);
              if (v1::ReplyHeader* h = HeaderOf(reply.get()); h != nullptr) {
                h->set_server_epoch(engine_->epoch());
                h->set_backend(engine_->backend_kind());
                if (meta != nullptr) {
                  h->set_device_uuid(meta->device_uuid);
                  h->set_kernel_micros(meta->kernel_micros);
                  h->set_queue_micros(meta->queue_micros);
                  h->set_ready_wait_micros(meta->ready_wait_micros);
                  h->set_server_micros(SecondsSince(arrival) * 1e6);
                }
              }
              const uint64_t size = reply->ByteSizeLong();
              if (limit > 0 && size > limit) {
                // Stateless calls only: state-changing ones were bounded before they ran.
                return done(absl::ResourceExhaustedError(absl::StrCat(
                                "reply: ", size, " bytes exceed this transport's reply limit of ",
                                limit, " bytes",
                                stateful ? " (the call's state change stands)" : "",
                                "; write the outputs into CUDA IPC regions")),
                            nullptr, meta);
              }
              done(absl::OkStatus(), std::move(reply), meta);
            });
}

}  // namespace fp4q::server
