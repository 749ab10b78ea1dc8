#include "server/grpc_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/proto_convert.h"

namespace fp4q::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both follow
  // google.rpc.Code), so the code converts one to one.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  const absl::Time t = absl::FromChrono(deadline);
  // gRPC reports "no deadline" as a time far in the future.
  if (t - absl::Now() > absl::Hours(24 * 365 * 100)) return absl::InfiniteFuture();
  return t;
}

}  // namespace

bool SameSecret(absl::string_view a, absl::string_view b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

void FillReplyHeader(const Engine& engine, const ReplyMeta* meta, v1::ReplyHeader* header) {
  header->set_server_epoch(engine.epoch());
  header->set_backend(engine.backend_kind());
  if (meta != nullptr) {
    header->set_device_uuid(meta->device_uuid);
    header->set_kernel_micros(meta->kernel_micros);
    header->set_queue_micros(meta->queue_micros);
  }
}

// One RPC from arrival to Finish. Deletes itself when finished.
class Fp4qService::Call {
 public:
  Call(Fp4qService* service, Ctx* ctx, Reactor* reactor, const char* rpc)
      : service_(service), reactor_(reactor), rpc_(rpc), start_(std::chrono::steady_clock::now()) {
    request.deadline = DeadlineOf(*ctx);
    request.peer.transport = PeerInfo::Transport::kTcp;
    if (service->options_.peer_lookup) {
      std::optional<PeerInfo> peer = service->options_.peer_lookup(ctx->peer());
      if (peer.has_value()) request.peer = *peer;
    }
    request.is_cancelled = [ctx] { return ctx->IsCancelled(); };
    auto it = ctx->client_metadata().find(kSessionMetadataKey);
    if (it != ctx->client_metadata().end()) {
      request.session_id.assign(it->second.data(), it->second.size());
    }
  }

  void Finish(const absl::Status& status, const ReplyMeta* meta) {
    if (service_->metrics_ != nullptr) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      service_->metrics_->RequestFinished(rpc_, status.code(), seconds,
                                          meta != nullptr ? meta->processed_bytes : 0,
                                          meta != nullptr ? meta->processed_elements : 0);
    }
    reactor_->Finish(ToGrpcStatus(status));
    delete this;
  }

  // Microseconds since the request arrived.
  double micros() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  }

  RequestContext request;

 private:
  Fp4qService* const service_;
  Reactor* const reactor_;
  const char* const rpc_;
  const std::chrono::steady_clock::time_point start_;
};

Fp4qService::Fp4qService(Engine* engine, Metrics* metrics, ServiceOptions options)
    : engine_(engine), metrics_(metrics), options_(std::move(options)) {}

Fp4qService::Call* Fp4qService::Begin(Ctx* ctx, const char* rpc, Reactor** reactor) {
  *reactor = ctx->DefaultReactor();
  if (metrics_ != nullptr) metrics_->RequestStarted();
  Call* call = new Call(this, ctx, *reactor, rpc);
  if (!options_.auth_token.empty()) {
    bool ok = false;
    auto range = ctx->client_metadata().equal_range("authorization");
    for (auto it = range.first; it != range.second; ++it) {
      ok = ok || SameSecret(absl::string_view(it->second.data(), it->second.size()),
                            absl::StrCat("Bearer ", options_.auth_token));
    }
    if (!ok) {
      call->Finish(
          absl::UnauthenticatedError("metadata authorization: missing or wrong bearer token"),
          nullptr);
      return nullptr;
    }
  }
  return call;
}

void Fp4qService::SetHeader(v1::ReplyHeader* header, const ReplyMeta* meta) const {
  FillReplyHeader(*engine_, meta, header);
}

template <typename Res, typename Reply, typename Start>
Fp4qService::Reactor* Fp4qService::Async(Ctx* ctx, const char* rpc, Reply* reply, Start start) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, rpc, &reactor);
  if (call == nullptr) return reactor;
  start(call->request, [this, call, reply](absl::StatusOr<Res> r) {
    if (!r.ok()) return call->Finish(r.status(), nullptr);
    const ReplyMeta meta = r->meta;
    ToProto(std::move(*r), reply);
    SetHeader(reply->mutable_header(), &meta);
    reply->mutable_header()->set_server_micros(call->micros());
    call->Finish(absl::OkStatus(), &meta);
  });
  return reactor;
}

void FillServerInfo(Engine& engine, uint64_t max_message_bytes, const PeerInfo& peer,
                    v1::ServerInfoReply* reply) {
  FillReplyHeader(engine, nullptr, reply->mutable_header());
  ToProto(engine.ServerInfo(), max_message_bytes, reply);
  if (!engine.CudaIpcAllowedFor(peer)) {  // not for this caller
    auto* modes = reply->mutable_supported_modes();
    for (int i = modes->size() - 1; i >= 0; --i) {
      if (modes->Get(i) == "cuda_ipc") modes->DeleteSubrange(i, 1);
    }
  }
  reply->set_server_epoch(engine.epoch());
}

// ---------------------------------------------------------------- tensor operations

Fp4qService::Reactor* Fp4qService::Quantize(Ctx* ctx, const v1::QuantizeRequest* req,
                                            v1::QuantizeReply* rep) {
  return Async<QuantizeResult>(ctx, "Quantize", rep, [&](const RequestContext& rc, auto done) {
    engine_->Quantize(rc, FromProto(*req), std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::Dequantize(Ctx* ctx, const v1::DequantizeRequest* req,
                                              v1::DequantizeReply* rep) {
  return Async<DequantizeResult>(ctx, "Dequantize", rep, [&](const RequestContext& rc, auto done) {
    engine_->Dequantize(rc, FromProto(*req), std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::Qdq(Ctx* ctx, const v1::QdqRequest* req, v1::QdqReply* rep) {
  return Async<QdqResult>(ctx, "Qdq", rep, [&](const RequestContext& rc, auto done) {
    engine_->Qdq(rc, FromProto(*req), std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::Matmul(Ctx* ctx, const v1::MatmulRequest* req,
                                          v1::MatmulReply* rep) {
  return Async<MatmulResult>(ctx, "Matmul", rep, [&](const RequestContext& rc, auto done) {
    engine_->Matmul(rc, FromProto(*req), std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::UpdateWeight(Ctx* ctx, const v1::UpdateWeightRequest* req,
                                                v1::UpdateWeightReply* rep) {
  return Async<UpdateWeightResult>(ctx, "UpdateWeight", rep,
                                   [&](const RequestContext& rc, auto done) {
                                     engine_->UpdateWeight(rc, FromProto(*req), std::move(done));
                                   });
}

Fp4qService::Reactor* Fp4qService::CreateWeight(Ctx* ctx, const v1::CreateWeightRequest* req,
                                                v1::CreateWeightReply* rep) {
  return Async<CreateWeightResult>(ctx, "CreateWeight", rep,
                                   [&](const RequestContext& rc, auto done) {
                                     engine_->CreateWeight(rc, FromProto(*req), std::move(done));
                                   });
}

Fp4qService::Reactor* Fp4qService::GetWeight(Ctx* ctx, const v1::GetWeightRequest* req,
                                             v1::GetWeightReply* rep) {
  return Async<GetWeightResult>(ctx, "GetWeight", rep, [&](const RequestContext& rc, auto done) {
    engine_->GetWeight(rc, FromProto(*req), std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::DeleteWeight(Ctx* ctx, const v1::DeleteWeightRequest* req,
                                                v1::DeleteWeightReply* rep) {
  return Async<EmptyResult>(ctx, "DeleteWeight", rep, [&](const RequestContext& rc, auto done) {
    engine_->DeleteWeight(rc, NameRequest{req->name()}, std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::ResetResidual(Ctx* ctx, const v1::ResetResidualRequest* req,
                                                 v1::ResetResidualReply* rep) {
  return Async<EmptyResult>(ctx, "ResetResidual", rep, [&](const RequestContext& rc, auto done) {
    engine_->ResetResidual(rc, NameRequest{req->name()}, std::move(done));
  });
}

Fp4qService::Reactor* Fp4qService::Checkpoint(Ctx* ctx, const v1::CheckpointRequest* /*req*/,
                                              v1::CheckpointReply* rep) {
  return Async<CheckpointResult>(ctx, "Checkpoint", rep, [&](const RequestContext& rc, auto done) {
    engine_->Checkpoint(rc, std::move(done));
  });
}

// ---------------------------------------------------------------- inline answers

Fp4qService::Reactor* Fp4qService::ListTensors(Ctx* ctx, const v1::ListTensorsRequest* /*req*/,
                                               v1::ListTensorsReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "ListTensors", &reactor);
  if (call == nullptr) return reactor;
  absl::StatusOr<std::vector<TensorListing>> list = engine_->ListTensors();
  if (!list.ok()) {
    call->Finish(list.status(), nullptr);
    return reactor;
  }
  SetHeader(rep->mutable_header(), nullptr);
  ToProto(std::move(*list), rep);
  call->Finish(absl::OkStatus(), nullptr);
  return reactor;
}

Fp4qService::Reactor* Fp4qService::ServerInfo(Ctx* ctx, const v1::ServerInfoRequest* /*req*/,
                                              v1::ServerInfoReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "ServerInfo", &reactor);
  if (call == nullptr) return reactor;
  FillServerInfo(*engine_, options_.max_message_bytes, call->request.peer, rep);
  call->Finish(absl::OkStatus(), nullptr);
  return reactor;
}

Fp4qService::Reactor* Fp4qService::OpenSession(Ctx* ctx, const v1::OpenSessionRequest* req,
                                               v1::OpenSessionReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "OpenSession", &reactor);
  if (call == nullptr) return reactor;
  absl::StatusOr<OpenSessionResult> s = engine_->OpenSession(req->client_name());
  if (s.ok()) {
    SetHeader(rep->mutable_header(), nullptr);
    rep->set_session_id(s->session_id);
    rep->set_lease_seconds(s->lease_seconds);
  }
  call->Finish(s.status(), nullptr);
  return reactor;
}

Fp4qService::Reactor* Fp4qService::KeepAlive(Ctx* ctx, const v1::KeepAliveRequest* /*req*/,
                                             v1::KeepAliveReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "KeepAlive", &reactor);
  if (call == nullptr) return reactor;
  absl::StatusOr<uint32_t> lease = engine_->KeepAlive(call->request);
  if (lease.ok()) {
    SetHeader(rep->mutable_header(), nullptr);
    rep->set_lease_seconds(*lease);
  }
  call->Finish(lease.status(), nullptr);
  return reactor;
}

// ---------------------------------------------------------------- control operations

Fp4qService::Reactor* Fp4qService::CloseSession(Ctx* ctx, const v1::CloseSessionRequest* /*req*/,
                                                v1::CloseSessionReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "CloseSession", &reactor);
  if (call == nullptr) return reactor;
  engine_->CloseSession(call->request, [this, call, rep](absl::StatusOr<uint32_t> n) {
    if (n.ok()) {
      SetHeader(rep->mutable_header(), nullptr);
      rep->set_regions_released(*n);
    }
    call->Finish(n.status(), nullptr);
  });
  return reactor;
}

Fp4qService::Reactor* Fp4qService::RegisterCudaRegion(Ctx* ctx,
                                                      const v1::RegisterCudaRegionRequest* req,
                                                      v1::RegisterCudaRegionReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "RegisterCudaRegion", &reactor);
  if (call == nullptr) return reactor;
  engine_->RegisterRegion(call->request, FromProto(*req),
                          [this, call, rep](absl::StatusOr<std::string> id) {
                            if (id.ok()) {
                              SetHeader(rep->mutable_header(), nullptr);
                              rep->set_region_id(*id);
                            }
                            call->Finish(id.status(), nullptr);
                          });
  return reactor;
}

Fp4qService::Reactor* Fp4qService::UnregisterCudaRegion(Ctx* ctx,
                                                        const v1::UnregisterCudaRegionRequest* req,
                                                        v1::UnregisterCudaRegionReply* rep) {
  Reactor* reactor = nullptr;
  Call* call = Begin(ctx, "UnregisterCudaRegion", &reactor);
  if (call == nullptr) return reactor;
  engine_->UnregisterRegion(call->request, req->region_id(),
                            [this, call, rep](absl::StatusOr<EmptyResult> r) {
                              if (r.ok()) SetHeader(rep->mutable_header(), nullptr);
                              call->Finish(r.status(), nullptr);
                            });
  return reactor;
}

}  // namespace fp4q::server
