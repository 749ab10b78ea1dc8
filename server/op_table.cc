#include "server/op_table.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "fp4q/v1/fp4q.pb.h"
#include "server/proto_convert.h"

namespace fp4q::server {
namespace {

namespace pb = google::protobuf;

// Elements of a shape, saturating at 2^62 (a bound, not a validation: the engine refuses bad
// shapes itself, before it changes anything).
uint64_t Elements(const pb::RepeatedField<int64_t>& shape) {
  if (shape.empty()) return 0;
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    const uint64_t u = static_cast<uint64_t>(d);
    if (n > (uint64_t{1} << 62) / u) return uint64_t{1} << 62;
    n *= u;
  }
  return n;
}

template <typename Msg>
std::shared_ptr<const Msg> As(const std::shared_ptr<const pb::Message>& m) {
  return std::static_pointer_cast<const Msg>(m);
}

// FromProto's result as a StatusOr (some conversions refuse unknown enum values).
template <typename T>
absl::StatusOr<T> Converted(T v) {
  return v;
}
template <typename T>
absl::StatusOr<T> Converted(absl::StatusOr<T> v) {
  return v;
}

// An entry whose engine operation completes through Done<Res> with a ReplyMeta.
template <typename ReqMsg, typename RepMsg, typename EngReq, typename Res>
Op Async(const char* name, void (Engine::*method)(const RequestContext&, EngReq, Done<Res>)) {
  Op op;
  op.name = name;
  op.request_prototype = &ReqMsg::default_instance();
  op.reply_prototype = &RepMsg::default_instance();
  op.start = [method](const OpEnvironment& env, const RequestContext& ctx,
                      std::shared_ptr<const pb::Message> m, OpReply reply) {
    std::shared_ptr<const ReqMsg> req = As<ReqMsg>(m);
    absl::StatusOr<EngReq> converted = Converted(FromProto(*req));
    if (!converted.ok()) return reply(converted.status(), nullptr, nullptr);
    (env.engine->*method)(ctx, *std::move(converted), [req, reply](absl::StatusOr<Res> r) {
      if (!r.ok()) return reply(r.status(), nullptr, nullptr);
      const ReplyMeta meta = r->meta;
      auto out = std::make_unique<RepMsg>();
      ToProto(std::move(*r), out.get());
      reply(absl::OkStatus(), std::move(out), &meta);
    });
  };
  return op;
}

// An entry answered at once by `fill` (no device work).
template <typename ReqMsg, typename RepMsg>
Op Now(const char* name,
       std::function<absl::Status(const OpEnvironment&, const RequestContext&, const ReqMsg&,
                                  RepMsg*)>
           fill) {
  Op op;
  op.name = name;
  op.request_prototype = &ReqMsg::default_instance();
  op.reply_prototype = &RepMsg::default_instance();
  op.start = [fill](const OpEnvironment& env, const RequestContext& ctx,
                    std::shared_ptr<const pb::Message> m, OpReply reply) {
    auto out = std::make_unique<RepMsg>();
    absl::Status s = fill(env, ctx, *As<ReqMsg>(m), out.get());
    if (!s.ok()) return reply(s, nullptr, nullptr);
    reply(absl::OkStatus(), std::move(out), nullptr);
  };
  return op;
}

// An entry whose engine operation completes through Done<T> without a meta; `fill` writes T
// into the reply.
template <typename ReqMsg, typename RepMsg, typename T>
Op Later(const char* name,
         std::function<void(const OpEnvironment&, const RequestContext&, const ReqMsg&,
                            Done<T>)>
             run,
         std::function<void(T&&, RepMsg*)> fill) {
  Op op;
  op.name = name;
  op.request_prototype = &ReqMsg::default_instance();
  op.reply_prototype = &RepMsg::default_instance();
  op.start = [run, fill](const OpEnvironment& env, const RequestContext& ctx,
                         std::shared_ptr<const pb::Message> m, OpReply reply) {
    std::shared_ptr<const ReqMsg> req = As<ReqMsg>(m);
    run(env, ctx, *req, [req, fill, reply](absl::StatusOr<T> r) {
      if (!r.ok()) return reply(r.status(), nullptr, nullptr);
      auto out = std::make_unique<RepMsg>();
      fill(std::move(*r), out.get());
      reply(absl::OkStatus(), std::move(out), nullptr);
    });
  };
  return op;
}

// Inline bytes of a dense output of `shape` (4 bytes an element unless known to be bf16).
uint64_t DenseInline(const pb::RepeatedField<int64_t>& shape, bool bf16) {
  return Elements(shape) * (bf16 ? 2 : 4);
}

// Inline bytes of a quantized output of `shape` (codes + scales, swizzle padding included).
uint64_t QuantizedInline(const pb::RepeatedField<int64_t>& shape) {
  if (shape.size() != 2 || shape[0] <= 0 || shape[1] <= 0) return 0;
  const uint64_t n = Elements(shape);
  const uint64_t rows = static_cast<uint64_t>(shape[0]);
  const uint64_t scale_cols = static_cast<uint64_t>(shape[1]) / 16 + 4;
  return n / 2 + 1 + (rows + 128) * scale_cols;
}

std::vector<Op> MakeTable() {
  std::vector<Op> t;
  {
    Op op = Async<v1::QuantizeRequest, v1::QuantizeReply>("Quantize", &Engine::Quantize);
    op.inline_reply_bound = [](const pb::Message& m) -> uint64_t {
      const auto& q = static_cast<const v1::QuantizeRequest&>(m);
      if (q.options().residual_key().empty()) return 0;  // stateless: checked after the work
      uint64_t bytes = 0;
      if (!q.has_rowwise_codes() || !q.rowwise_codes().has_region() ||
          !q.has_rowwise_scales() || !q.rowwise_scales().has_region()) {
        bytes += QuantizedInline(q.input().shape());
      }
      return bytes;
    };
    t.push_back(std::move(op));
  }
  t.push_back(Async<v1::DequantizeRequest, v1::DequantizeReply>("Dequantize", &Engine::Dequantize));
  {
    Op op = Async<v1::QdqRequest, v1::QdqReply>("Qdq", &Engine::Qdq);
    op.inline_reply_bound = [](const pb::Message& m) -> uint64_t {
      const auto& q = static_cast<const v1::QdqRequest&>(m);
      if (q.options().residual_key().empty() || q.out().has_region()) return 0;
      const bool bf16 = q.out_dtype() == v1::DTYPE_BF16 ||
                        (q.out_dtype() == v1::DTYPE_UNSPECIFIED &&
                         q.input().dtype() == v1::DTYPE_BF16);
      return DenseInline(q.input().shape(), bf16);
    };
    t.push_back(std::move(op));
  }
  t.push_back(Async<v1::MatmulRequest, v1::MatmulReply>("Matmul", &Engine::Matmul));
  {
    Op op = Async<v1::UpdateWeightRequest, v1::UpdateWeightReply>("UpdateWeight",
                                                                   &Engine::UpdateWeight);
    op.inline_reply_bound = [](const pb::Message& m) -> uint64_t {
      const auto& u = static_cast<const v1::UpdateWeightRequest&>(m);
      if (!u.return_dequantized() || u.dequantized_out().has_region()) return 0;
      return DenseInline(u.update().shape(), /*bf16=*/false);  // the weight's dtype: unknown here
    };
    t.push_back(std::move(op));
  }
  {
    Op op = Async<v1::CreateWeightRequest, v1::CreateWeightReply>("CreateWeight",
                                                                   &Engine::CreateWeight);
    op.inline_reply_bound = [](const pb::Message&) -> uint64_t { return 0; };
    t.push_back(std::move(op));
  }
  t.push_back(Async<v1::GetWeightRequest, v1::GetWeightReply>("GetWeight", &Engine::GetWeight));
  {
    Op op = Later<v1::DeleteWeightRequest, v1::DeleteWeightReply, EmptyResult>(
        "DeleteWeight",
        [](const OpEnvironment& env, const RequestContext& ctx,
           const v1::DeleteWeightRequest& r, Done<EmptyResult> done) {
          env.engine->DeleteWeight(ctx, NameRequest{r.name()}, std::move(done));
        },
        [](EmptyResult&&, v1::DeleteWeightReply*) {});
    op.inline_reply_bound = [](const pb::Message&) -> uint64_t { return 0; };
    t.push_back(std::move(op));
  }
  {
    Op op = Later<v1::ResetResidualRequest, v1::ResetResidualReply, EmptyResult>(
        "ResetResidual",
        [](const OpEnvironment& env, const RequestContext& ctx,
           const v1::ResetResidualRequest& r, Done<EmptyResult> done) {
          env.engine->ResetResidual(ctx, NameRequest{r.name()}, std::move(done));
        },
        [](EmptyResult&&, v1::ResetResidualReply*) {});
    op.inline_reply_bound = [](const pb::Message&) -> uint64_t { return 0; };
    t.push_back(std::move(op));
  }
  {
    Op op = Async<v1::ResetOptimizerRequest, v1::ResetOptimizerReply>("ResetOptimizer",
                                                                       &Engine::ResetOptimizer);
    op.inline_reply_bound = [](const pb::Message&) -> uint64_t { return 0; };
    t.push_back(std::move(op));
  }
  {
    Op op = Async<v1::StepRequest, v1::StepReply>("Step", &Engine::Step);
    op.inline_reply_bound = [](const pb::Message& m) -> uint64_t {
      const auto& r = static_cast<const v1::StepRequest&>(m);
      if (r.brief_reply()) return 0;  // no items (return_dequantized is refused)
      uint64_t bytes = 0;
      for (const v1::StepItem& it : r.items()) {
        bytes += it.name().size() + 48;  // an item result's fixed fields
        if (it.return_dequantized() && !it.dequantized_out().has_region()) {
          bytes += DenseInline(it.update().shape(), /*bf16=*/false) + 16;
        }
      }
      return bytes;
    };
    t.push_back(std::move(op));
  }
  t.push_back(Later<v1::JoinGroupRequest, v1::JoinGroupReply, JoinGroupResult>(
      "JoinGroup",
      [](const OpEnvironment& env, const RequestContext& ctx, const v1::JoinGroupRequest& r,
         Done<JoinGroupResult> done) { env.engine->JoinGroup(ctx, FromProto(r), std::move(done)); },
      [](JoinGroupResult&& r, v1::JoinGroupReply* m) { m->set_members(r.members); }));
  t.push_back(Later<v1::LeaveGroupRequest, v1::LeaveGroupReply, EmptyResult>(
      "LeaveGroup",
      [](const OpEnvironment& env, const RequestContext& ctx, const v1::LeaveGroupRequest& r,
         Done<EmptyResult> done) {
        env.engine->LeaveGroup(ctx, NameRequest{r.group()}, std::move(done));
      },
      [](EmptyResult&&, v1::LeaveGroupReply*) {}));
  {
    Op op = Later<v1::DeleteNamespaceRequest, v1::DeleteNamespaceReply, DeleteNamespaceResult>(
        "DeleteNamespace",
        [](const OpEnvironment& env, const RequestContext& ctx, const v1::DeleteNamespaceRequest&,
           Done<DeleteNamespaceResult> done) {
          env.engine->DeleteNamespace(ctx, std::move(done));
        },
        [](DeleteNamespaceResult&& r, v1::DeleteNamespaceReply* m) {
          m->set_deleted(r.deleted);
        });
    op.inline_reply_bound = [](const pb::Message&) -> uint64_t { return 0; };
    t.push_back(std::move(op));
  }
  t.push_back(Now<v1::ListTensorsRequest, v1::ListTensorsReply>(
      "ListTensors", [](const OpEnvironment& env, const RequestContext& ctx,
                        const v1::ListTensorsRequest&, v1::ListTensorsReply* rep) {
        absl::StatusOr<std::vector<TensorListing>> list = env.engine->ListTensors(ctx);
        if (!list.ok()) return list.status();
        ToProto(std::move(*list), rep);
        return absl::OkStatus();
      }));
  {
    Op op = Later<v1::CheckpointRequest, v1::CheckpointReply, CheckpointResult>(
        "Checkpoint",
        [](const OpEnvironment& env, const RequestContext& ctx, const v1::CheckpointRequest&,
           Done<CheckpointResult> done) { env.engine->Checkpoint(ctx, std::move(done)); },
        [](CheckpointResult&& r, v1::CheckpointReply* m) { ToProto(std::move(r), m); });
    t.push_back(std::move(op));
  }
  {
    Op op = Now<v1::OpenSessionRequest, v1::OpenSessionReply>(
        "OpenSession", [](const OpEnvironment& env, const RequestContext& ctx,
                          const v1::OpenSessionRequest& r, v1::OpenSessionReply* rep) {
          absl::StatusOr<OpenSessionResult> s =
              env.engine->OpenSession(ctx, r.client_name(), r.namespace_());
          if (!s.ok()) return s.status();
          rep->set_session_id(s->session_id);
          rep->set_lease_seconds(s->lease_seconds);
          rep->set_namespace_(s->ns);
          return absl::OkStatus();
        });
    op.fast_socket = false;  // a fast-socket connection is bound to one session by its hello
    t.push_back(std::move(op));
  }
  t.push_back(Now<v1::KeepAliveRequest, v1::KeepAliveReply>(
      "KeepAlive", [](const OpEnvironment& env, const RequestContext& ctx,
                      const v1::KeepAliveRequest&, v1::KeepAliveReply* rep) {
        absl::StatusOr<uint32_t> lease = env.engine->KeepAlive(ctx);
        if (!lease.ok()) return lease.status();
        rep->set_lease_seconds(*lease);
        return absl::OkStatus();
      }));
  t.push_back(Later<v1::CloseSessionRequest, v1::CloseSessionReply, uint32_t>(
      "CloseSession",
      [](const OpEnvironment& env, const RequestContext& ctx, const v1::CloseSessionRequest&,
         Done<uint32_t> done) { env.engine->CloseSession(ctx, std::move(done)); },
      [](uint32_t&& n, v1::CloseSessionReply* m) { m->set_regions_released(n); }));
  t.push_back(Later<v1::RegisterCudaRegionRequest, v1::RegisterCudaRegionReply, std::string>(
      "RegisterCudaRegion",
      [](const OpEnvironment& env, const RequestContext& ctx,
         const v1::RegisterCudaRegionRequest& r, Done<std::string> done) {
        env.engine->RegisterRegion(ctx, FromProto(r), std::move(done));
      },
      [](std::string&& id, v1::RegisterCudaRegionReply* m) { m->set_region_id(std::move(id)); }));
  t.push_back(Later<v1::UnregisterCudaRegionRequest, v1::UnregisterCudaRegionReply, EmptyResult>(
      "UnregisterCudaRegion",
      [](const OpEnvironment& env, const RequestContext& ctx,
         const v1::UnregisterCudaRegionRequest& r, Done<EmptyResult> done) {
        env.engine->UnregisterRegion(ctx, r.region_id(), std::move(done));
      },
      [](EmptyResult&&, v1::UnregisterCudaRegionReply*) {}));
  t.push_back(Now<v1::ServerInfoRequest, v1::ServerInfoReply>(
      "ServerInfo", [](const OpEnvironment& env, const RequestContext& ctx,
                       const v1::ServerInfoRequest&, v1::ServerInfoReply* rep) {
        ToProto(env.engine->ServerInfo(), env.max_message_bytes, rep);
        v1::Limits* l = rep->mutable_limits();
        l->set_fast_socket_max_frame_bytes(env.fast_socket_frame_bytes);
        const bool fast = env.fast_socket_frame_bytes != 0;
        l->set_fast_socket_reply_margin_bytes(fast ? v1::FAST_SOCKET_REPLY_MARGIN_BYTES : 0);
        l->set_fast_socket_reply_framing_bytes(fast ? v1::FAST_SOCKET_REPLY_FRAMING_BYTES : 0);
        l->set_fast_socket_max_heads_up_micros(fast ? env.fast_socket_heads_up_micros : 0);
        if (!env.engine->CudaIpcAllowedFor(ctx.peer)) {  // listed only for callers who may
          auto* modes = rep->mutable_supported_modes();
          for (int i = modes->size() - 1; i >= 0; --i) {
            const std::string& m = modes->Get(i);
            if (m == "cuda_ipc" || m == "step_done_signal" || m == "step_ready_signal" ||
                m == "step_plans") {
              modes->DeleteSubrange(i, 1);
            }
          }
        }
        rep->set_server_epoch(env.engine->epoch());
        return absl::OkStatus();
      }));
  return t;
}

}  // namespace

const std::vector<Op>& OpTable() {
  static const std::vector<Op>* table = new std::vector<Op>(MakeTable());
  return *table;
}

const Op* FindOp(absl::string_view method) {
  static const absl::flat_hash_map<std::string, const Op*>* index = [] {
    auto* m = new absl::flat_hash_map<std::string, const Op*>();
    for (const Op& op : OpTable()) (*m)[op.name] = &op;
    return m;
  }();
  auto it = index->find(method);
  return it == index->end() ? nullptr : it->second;
}

}  // namespace fp4q::server
