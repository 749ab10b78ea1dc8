// Engine: sessions, CUDA IPC regions, namespaces (DeleteNamespace) and inspection (ListTensors,
// ServerInfo). The operations and their dispatch are in engine.cc.
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fp4q/common/status_macros.h"
#include "server/engine.h"
#include "server/request_checks.h"

namespace fp4q::server {

// ---------------------------------------------------------------- sessions and regions

absl::StatusOr<OpenSessionResult> Engine::OpenSession(const RequestContext& ctx,
                                                      const std::string& client_name,
                                                      const std::string& ns) {
  if (draining_.load()) return DrainingStatus();
  FP4Q_RETURN_IF_ERROR(CheckNamespace(ns, "namespace"));
  if (ctx.namespace_bound && ns != ctx.bound_namespace) {
    return absl::PermissionDeniedError(absl::StrCat(
        "namespace: '", ns, "' is not the namespace this caller's token is bound to ('",
        ctx.bound_namespace, "')"));
  }
  return regions_->OpenSession(client_name, ns);
}

absl::StatusOr<std::string> Engine::ResolveNamespace(const RequestContext& ctx) const {
  if (ctx.session_id.empty()) return ctx.namespace_bound ? ctx.bound_namespace : std::string();
  absl::StatusOr<std::string> ns = regions_->SessionNamespace(ctx.session_id);
  if (!ns.ok()) {
    return absl::NotFoundError(
        "metadata fp4q-session: unknown or expired session (its namespace is unknown; open a "
        "new session with OpenSession and send its id)");
  }
  if (ctx.namespace_bound && *ns != ctx.bound_namespace) {
    return absl::PermissionDeniedError(
        absl::StrCat("metadata fp4q-session: the session's namespace '", *ns,
                     "' is not the one this caller's token is bound to ('", ctx.bound_namespace,
                     "')"));
  }
  return ns;
}

absl::StatusOr<uint32_t> Engine::KeepAlive(const RequestContext& ctx) {
  FP4Q_RETURN_IF_ERROR(regions_->KeepAlive(ctx.session_id));
  return static_cast<uint32_t>(absl::ToInt64Seconds(regions_->lease()));
}

void Engine::CloseSession(const RequestContext& ctx, Done<uint32_t> done) {
  const std::string id = ctx.session_id;
  Control<uint32_t>(ctx, std::move(done), [this, id] { return regions_->CloseSession(id); });
}

void Engine::RegisterRegion(const RequestContext& ctx, RegisterRegionRequest req,
                            Done<std::string> done) {
  if (draining_.load()) {
    done(DrainingStatus());
    return;
  }
  if (options_.allow_cuda_ipc && !CudaIpcAllowedFor(ctx.peer)) {
    done(absl::PermissionDeniedError(
        "RegisterCudaRegion: CUDA IPC is accepted only on the Unix socket (--unix_socket, peers "
        "checked by uid); this call came over TCP (fp4qd --cuda_ipc_over_tcp allows it)"));
    return;
  }
  const std::string id = ctx.session_id;
  const PeerInfo peer = ctx.peer;
  auto shared = std::make_shared<RegisterRegionRequest>(std::move(req));
  Control<std::string>(ctx, std::move(done),
                       [this, id, shared, peer]() -> absl::StatusOr<std::string> {
                         absl::StatusOr<std::string> region = regions_->Register(id, *shared);
                         if (region.ok()) {
                           logger_->Info("cuda region registered",
                                         {{"bytes", absl::StrCat(shared->size)},
                                          {"peer_uid", absl::StrCat(peer.uid)},
                                          {"peer_pid", absl::StrCat(peer.pid)}});
                         }
                         return region;
                       });
}

void Engine::UnregisterRegion(const RequestContext& ctx, std::string region_id,
                              Done<EmptyResult> done) {
  const std::string id = ctx.session_id;
  Control<EmptyResult>(ctx, std::move(done),
                       [this, id, region_id]() -> absl::StatusOr<EmptyResult> {
                         FP4Q_RETURN_IF_ERROR(regions_->Unregister(id, region_id));
                         return EmptyResult{};
                       });
}

// ---------------------------------------------------------------- inspection

bool Engine::CudaIpcAllowedFor(const PeerInfo& peer) const {
  return options_.allow_cuda_ipc &&
         (options_.cuda_ipc_over_tcp || peer.transport == PeerInfo::Transport::kUnix);
}

absl::StatusOr<std::vector<TensorListing>> Engine::ListTensors(const RequestContext& ctx) {
  FP4Q_ASSIGN_OR_RETURN(const std::string ns, ResolveNamespace(ctx));
  return store_->List(ns);
}

ServerInfoResult Engine::ServerInfo() const {
  ServerInfoResult r;
  r.version = options_.version;
  r.backend = devices_->kind();
  for (int i = 0; i < devices_->size(); ++i) {
    const Device& d = devices_->device(i);
    if (d.info.backend != "cuda") continue;
    GpuListing g;
    g.uuid = d.label;
    g.name = d.info.name;
    g.cc_major = d.info.cc_major;
    g.cc_minor = d.info.cc_minor;
    g.total_memory = d.info.total_memory;
    g.state_bytes = store_->device_bytes(d.label);
    r.gpus.push_back(std::move(g));
  }
  r.supported_modes = {"nvfp4",
                       "mxfp4",
                       "block_1x16",
                       "block_16x16",
                       "rtn",
                       "sr",
                       "rht",
                       "four_over_six",
                       "swizzled_scales",
                       "columnwise",
                       "error_feedback",
                       "stored_weights",
                       "step",
                       "sgd",
                       "adamw",
                       "delayed_scaling",
                       "step_one_pass",
                       "replica_groups",
                       "namespaces"};
  if (options_.allow_cuda_ipc && devices_->kind() == "cuda") {
    r.supported_modes.push_back("cuda_ipc");
    r.supported_modes.push_back("step_done_signal");
    r.supported_modes.push_back("step_ready_signal");
    if (options_.max_step_plans > 0) r.supported_modes.push_back("step_plans");
  }
  r.state_budget_bytes = options_.state_budget_bytes;
  r.max_queue_depth = static_cast<uint32_t>(options_.max_queue_depth);
  r.max_open_handles = static_cast<uint32_t>(options_.max_open_handles);
  r.session_lease_seconds = static_cast<uint32_t>(absl::ToInt64Seconds(options_.session_lease));
  r.max_step_items = static_cast<uint32_t>(options_.max_step_items);
  r.max_step_plans = static_cast<uint32_t>(options_.max_step_plans);
  r.max_world_size = static_cast<uint32_t>(options_.max_world_size);
  r.cpu_max_request_flops = devices_->kind() == "cpu" ? options_.cpu_max_request_flops : 0;
  return r;
}

void Engine::DeleteNamespace(const RequestContext& ctx, Done<DeleteNamespaceResult> done) {
  absl::StatusOr<std::string> ns = ResolveNamespace(ctx);
  if (!ns.ok()) return done(ns.status());
  if (ns->empty()) {
    return done(absl::FailedPreconditionError(
        "namespace: the default namespace cannot be deleted at once (delete its names one by "
        "one; open sessions with a namespace for jobs)"));
  }
  const std::string target = *ns;
  Control<DeleteNamespaceResult>(
      ctx, std::move(done), [this, target]() -> absl::StatusOr<DeleteNamespaceResult> {
        DeleteNamespaceResult r;
        for (const std::shared_ptr<StateEntry>& e : store_->Entries()) {
          if (NamespaceOf(e->name) != target) continue;
          std::unique_lock<std::mutex> lock(e->op_mu);
          if (!e->live.load()) continue;
          store_->Drop(e);
          ++r.deleted;
        }
        r.deleted += DropGroupsOf(target);
        return r;
      });
}

}  // namespace fp4q::server
