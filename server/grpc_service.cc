#include "server/grpc_service.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fp4q/v1/fp4q.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace fp4q::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both follow
  // google.rpc.Code), so the code converts one to one.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

constexpr absl::string_view kServicePrefix = "/fp4q.v1.Fp4q/";

absl::Time DeadlineOf(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  const absl::Time t = absl::FromChrono(deadline);
  // gRPC reports "no deadline" as a time far in the future.
  if (t - absl::Now() > absl::Hours(24 * 365 * 100)) return absl::InfiniteFuture();
  return t;
}

// What the call layer needs of a gRPC call: method, deadline, cancellation, session, tokens,
// peer and the reply limit.
IncomingCall IncomingOf(grpc::CallbackServerContext* ctx, std::string method,
                        const GrpcServiceOptions& options,
                        std::chrono::steady_clock::time_point arrival) {
  IncomingCall call;
  call.arrival = arrival;
  call.method = std::move(method);
  RequestContext& rc = call.context;
  rc.deadline = DeadlineOf(*ctx);
  rc.peer.transport = PeerInfo::Transport::kTcp;
  if (options.peer_lookup) {
    std::optional<PeerInfo> peer = options.peer_lookup(ctx->peer());
    if (peer.has_value()) rc.peer = *peer;
  }
  rc.is_cancelled = [ctx] { return ctx->IsCancelled(); };
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionMetadataKey);
  if (it != md.end()) rc.session_id.assign(it->second.data(), it->second.size());
  auto range = md.equal_range("authorization");
  for (auto a = range.first; a != range.second; ++a) {
    absl::string_view v(a->second.data(), a->second.size());
    if (absl::ConsumePrefix(&v, "Bearer ")) call.tokens.emplace_back(v);
  }
  call.reply_limit = options.max_message_bytes;
  return call;
}

}  // namespace

// fp4q.v1.Fp4q as server reflection sees it. Every method but ServerInfo is handed to the
// generic service; gRPC names a registered service after its non-generic methods, so one stays
// typed here and goes through the call layer like every other call.
class GrpcService::DescriptorService final : public v1::Fp4q::CallbackService {
 public:
  explicit DescriptorService(GrpcService* service) : service_(service) {
    const google::protobuf::ServiceDescriptor* d =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("fp4q.v1.Fp4q");
    for (int i = 0; i < d->method_count(); ++i) {
      if (d->method(i)->name() != "ServerInfo") MarkMethodGeneric(i);
    }
  }

  grpc::ServerUnaryReactor* ServerInfo(grpc::CallbackServerContext* ctx,
                                       const v1::ServerInfoRequest* request,
                                       v1::ServerInfoReply* reply) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    IncomingCall call = IncomingOf(ctx, "ServerInfo", service_->options_,
                                   std::chrono::steady_clock::now());
    auto copy = std::make_unique<v1::ServerInfoRequest>(*request);
    const size_t bytes = request->ByteSizeLong();
    service_->layer_->Run(
        std::move(call), std::move(copy), /*parsed=*/true, bytes,
        [reactor, reply](const absl::Status& s, std::unique_ptr<google::protobuf::Message> rep) {
          if (s.ok()) reply->CopyFrom(*rep);
          reactor->Finish(ToGrpcStatus(s));
        });
    return reactor;
  }

 private:
  GrpcService* const service_;
};

// One call: read the request, run it through the call layer, write the reply.
class GrpcService::Reactor final : public grpc::ServerGenericBidiReactor {
 public:
  Reactor(GrpcService* service, grpc::GenericCallbackServerContext* ctx)
      : service_(service), ctx_(ctx), arrival_(std::chrono::steady_clock::now()) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed without a request
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: no request message"));
      return;
    }
    const std::string& path = ctx_->method();
    IncomingCall call = IncomingOf(ctx_,
                                   absl::StartsWith(path, kServicePrefix)
                                       ? path.substr(kServicePrefix.size())
                                       : std::string(path),
                                   service_->options_, arrival_);

    const size_t bytes = in_.Length();
    std::unique_ptr<google::protobuf::Message> request =
        absl::StartsWith(path, kServicePrefix) ? service_->layer_->NewRequest(call.method)
                                               : nullptr;
    bool parsed = false;
    if (request != nullptr) {
      grpc::ProtoBufferReader reader(&in_);
      parsed = request->ParseFromZeroCopyStream(&reader);
    }
    service_->layer_->Run(
        std::move(call), std::move(request), parsed, bytes,
        [this](const absl::Status& s, std::unique_ptr<google::protobuf::Message> reply) {
          if (!s.ok()) return Finish(ToGrpcStatus(s));
          bool own = false;
          grpc::Status ser = grpc::GenericSerialize<grpc::ProtoBufferWriter,
                                                    google::protobuf::Message>(*reply, &out_, &own);
          if (!ser.ok()) return Finish(ser);
          StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
        });
  }

  void OnDone() override { delete this; }

 private:
  GrpcService* const service_;
  grpc::GenericCallbackServerContext* const ctx_;
  const std::chrono::steady_clock::time_point arrival_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
};

GrpcService::GrpcService(CallLayer* layer, GrpcServiceOptions options)
    : layer_(layer),
      options_(std::move(options)),
      descriptor_service_(std::make_unique<DescriptorService>(this)) {}

GrpcService::~GrpcService() = default;

void GrpcService::RegisterOn(grpc::ServerBuilder* builder) {
  builder->RegisterService(descriptor_service_.get());
  builder->RegisterCallbackGenericService(this);
}

grpc::ServerGenericBidiReactor* GrpcService::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new Reactor(this, ctx);
}

}  // namespace fp4q::server
