#include "server/engine.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "server/op_env.h"
#include "server/request_checks.h"

namespace fp4q::server {

// What a request touches, collected before it is queued.
struct Engine::Route {
  struct RegionUse {
    std::string region_id;
    std::string field;
  };
  std::vector<RegionUse> regions;
  std::vector<std::pair<std::string, std::string>> names;  // (state name, field)
  std::vector<std::string> serial;  // more names whose requests must not overlap (new names)
  std::string device_uuid;                                 // explicit placement (CreateWeight)
  bool place_by_state = false;  // new state: the device holding the fewest state bytes

  // `field` names the region field ("input.region").
  void Region(const BytesIn& b, const std::string& field) {
    if (b.source == Source::kRegion) regions.push_back({b.region.region_id, field});
  }
  void Target(const OutputTarget& t, const std::string& field) {
    if (t.has_region) regions.push_back({t.region.region_id, absl::StrCat(field, ".region")});
  }
  void Operand(const QuantizedOperandIn& op, const std::string& field) {
    if (op.is_weight) {
      names.emplace_back(op.weight_name, absl::StrCat(field, ".weight_name"));
    } else if (op.is_dense) {
      Region(op.dense.tensor.data, absl::StrCat(field, ".dense.tensor.region"));
    } else {
      Region(op.tensor.codes, absl::StrCat(field, ".tensor.codes_region"));
      Region(op.tensor.scales, absl::StrCat(field, ".tensor.scales_region"));
    }
  }
};

template <typename Req, typename Res>
struct Engine::Call {
  RequestContext ctx;
  Req req;
  Done<Res> done;
  RequestScope scope;
  Res result;
  absl::Time queued_at;
};

absl::Status DrainingStatus() {
  return absl::UnavailableError("the server is draining (shutting down); retry elsewhere or later");
}

Engine::Engine(std::unique_ptr<DeviceSet> devices, EngineOptions options, EngineObserver* observer,
               Logger* logger)
    : options_(std::move(options)),
      observer_(observer),
      logger_(logger != nullptr ? logger : Logger::Null()),
      epoch_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))),
      devices_(std::move(devices)) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<DeviceSet> devices,
                                                       EngineOptions options,
                                                       EngineObserver* observer, Logger* logger) {
  if (devices == nullptr || devices->size() == 0) {
    return absl::InvalidArgumentError("engine: no devices to serve");
  }
  if (options.max_queue_depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_depth: ", options.max_queue_depth, " must be >= 1"));
  }
  if (options.step_ready_timeout < absl::Milliseconds(1) ||
      options.step_ready_timeout > absl::Seconds(60)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step_ready_timeout: ", absl::FormatDuration(options.step_ready_timeout),
        " is not in [1ms, 60s]"));
  }
  if (options.worker_spin.has_value() &&
      (*options.worker_spin < absl::ZeroDuration() || *options.worker_spin > absl::Seconds(1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker_spin: ", absl::FormatDuration(*options.worker_spin), " is not in [0, 1s]"));
  }
  if (options.streams_per_gpu < 1 || options.streams_per_gpu > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams_per_gpu: ", options.streams_per_gpu, " must be in [1, 64]"));
  }
  if (options.max_open_handles < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_open_handles: ", options.max_open_handles, " must be >= 1"));
  }
  if (options.session_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("session_lease_s: must be > 0");
  }
  std::unique_ptr<Engine> e(new Engine(std::move(devices), std::move(options), observer, logger));
  std::vector<std::string> labels;
  for (int i = 0; i < e->devices_->size(); ++i) labels.push_back(e->devices_->device(i).label);
  e->store_ = std::make_unique<StateStore>(e->options_.state_budget_bytes, observer, labels);
  RegionsOptions ro;
  ro.allow_cuda_ipc = e->options_.allow_cuda_ipc;
  ro.max_open_handles = e->options_.max_open_handles;
  ro.lease = e->options_.session_lease;
  ro.now = e->options_.clock;
  e->regions_ = std::make_unique<RegionManager>(e->devices_.get(), ro, observer);
  Engine* engine = e.get();
  e->plans_ = std::make_unique<StepPlans>(e->options_.max_step_plans);
  e->regions_->SetSessionEndHandler([engine](const std::string& session) {
    engine->GroupSessionEnded(session);
    engine->plans_->SessionEnded(session);
  });
  for (int i = 0; i < e->devices_->size(); ++i) {
    const Device& d = e->devices_->device(i);
    Executor::Options xo;
    xo.device = d.label;
    xo.max_queue_depth = e->options_.max_queue_depth;
    xo.spin = e->options_.worker_spin;
    std::vector<kernels::Stream> streams;
    if (d.host_memory) {
      // The CPU backend's workers run the kernels on the cores a spin would hold.
      if (!xo.spin.has_value()) xo.spin = absl::ZeroDuration();
      const int hw = static_cast<int>(std::thread::hardware_concurrency());
      xo.threads = e->options_.cpu_workers > 0 ? e->options_.cpu_workers : std::max(1, hw);
    } else {
      xo.threads = e->options_.streams_per_gpu;  // one stream per worker (executor.h)
      // And one for requests run on their transport's thread (EngineOptions::idle_inline).
      const int count = xo.threads + (e->options_.idle_inline ? 1 : 0);
      for (int w = 0; w < count; ++w) {
        absl::StatusOr<kernels::Stream> st = d.backend->CreateStream();
        if (!st.ok()) {
          for (kernels::Stream made : streams) d.backend->DestroyStream(made);
          for (int j = 0; j < i; ++j) {
            for (kernels::Stream made : e->streams_[j]) {
              e->devices_->device(j).backend->DestroyStream(made);
            }
          }
          e->streams_.clear();
          return absl::Status(st.status().code(),
                              absl::StrCat("device ", d.label, ": cannot create stream ", w,
                                           " of ", count, ": ", st.status().message()));
        }
        streams.push_back(*st);
      }
      xo.streams.assign(streams.begin(), streams.begin() + xo.threads);
      if (e->options_.idle_inline) xo.inline_stream = streams.back();
    }
    xo.run_inline = e->options_.idle_inline;
    e->streams_.push_back(std::move(streams));
    e->pools_.push_back(
        std::make_unique<ScratchPool>(d.backend.get(), e->options_.scratch_cache_bytes));
    e->executors_.push_back(std::make_unique<Executor>(xo, observer));
  }
  Executor::Options co;
  co.device = "control";
  co.threads = 2;
  co.max_queue_depth = e->options_.max_queue_depth;
  e->control_ = std::make_unique<Executor>(co, /*observer=*/nullptr);
  e->groups_thread_ = std::thread([engine] { engine->GroupDeadlineLoop(); });
  return e;
}

Engine::~Engine() {
  Shutdown();
  // Sessions closed by the region manager's destructor no longer reach the groups (gone first).
  if (regions_ != nullptr) regions_->SetSessionEndHandler(nullptr);
  // The workers are joined: their streams are idle. Scratch goes before the streams.
  pools_.clear();
  for (size_t i = 0; i < streams_.size(); ++i) {
    for (kernels::Stream s : streams_[i]) {
      devices_->device(static_cast<int>(i)).backend->DestroyStream(s);
    }
  }
  streams_.clear();
}

void Engine::StartMaintenance() {
  std::lock_guard<std::mutex> lock(maintenance_mu_);
  if (maintenance_.joinable() || stop_maintenance_) return;
  maintenance_ = std::thread([this] { MaintenanceLoop(); });
}

void Engine::MaintenanceLoop() {
  absl::Time last_checkpoint = absl::Now();
  std::unique_lock<std::mutex> lock(maintenance_mu_);
  while (!stop_maintenance_) {
    maintenance_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.maintenance_period));
    if (stop_maintenance_) break;
    lock.unlock();
    const int ended = regions_->ExpireSessions();
    if (ended > 0) {
      logger_->Info("sessions expired", {{"count", absl::StrCat(ended)}});
    }
    if (options_.checkpoint_interval > absl::ZeroDuration() && !options_.state_dir.empty() &&
        !draining_.load() && absl::Now() - last_checkpoint >= options_.checkpoint_interval) {
      last_checkpoint = absl::Now();
      absl::StatusOr<CheckpointStats> s = CheckpointNow();
      if (!s.ok()) logger_->Error("periodic checkpoint failed", {{"error", s.status().ToString()}});
    }
    lock.lock();
  }
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(maintenance_mu_);
    stop_maintenance_ = true;
  }
  maintenance_cv_.notify_all();
  if (maintenance_.joinable()) maintenance_.join();
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    stop_groups_ = true;
  }
  groups_cv_.notify_all();
  if (groups_thread_.joinable()) groups_thread_.join();
  if (control_ != nullptr) control_->Shutdown();
  for (auto& x : executors_) x->Shutdown();
}

bool Engine::Admit() {
  if (draining_.load()) return false;
  in_flight_.fetch_add(1);
  if (draining_.load()) {
    Release();
    return false;
  }
  return true;
}

void Engine::Release() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_cv_.notify_all();
  }
}

void Engine::BeginDrain() { draining_.store(true); }

bool Engine::WaitIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [this] { return in_flight_.load() == 0; });
}

int Engine::RejectQueued() {
  int n = 0;
  for (auto& x : executors_) {
    n += x->RejectQueued(absl::UnavailableError("the server shut down before this request ran"));
  }
  return n;
}

absl::Status Engine::poisoned() const {
  std::lock_guard<std::mutex> lock(poison_mu_);
  return poisoned_;
}

void Engine::SetPoisonHandler(std::function<void(const absl::Status&)> handler) {
  std::lock_guard<std::mutex> lock(poison_mu_);
  poison_handler_ = std::move(handler);
}

void Engine::CheckHealth(Device& d) {
  absl::Status h = d.backend->Healthy();
  if (h.ok()) return;
  std::function<void(const absl::Status&)> handler;
  {
    std::lock_guard<std::mutex> lock(poison_mu_);
    if (!poisoned_.ok()) return;
    poisoned_ = h;
    handler = poison_handler_;
  }
  logger_->Error("device poisoned by a sticky error",
                 {{"device", d.label}, {"error", h.ToString()}});
  if (handler) handler(h);
}

Device* Engine::LeastStateDevice() {
  Device* best = &devices_->device(0);
  uint64_t best_bytes = store_->device_bytes(best->label);
  for (int i = 1; i < devices_->size(); ++i) {
    const uint64_t b = store_->device_bytes(devices_->device(i).label);
    if (b < best_bytes) {
      best = &devices_->device(i);
      best_bytes = b;
    }
  }
  return best;
}

namespace {

struct Placement {
  Device* device = nullptr;
  std::string field;
  absl::Status Agree(Device* d, const std::string& f) {
    if (device == nullptr) {
      device = d;
      field = f;
      return absl::OkStatus();
    }
    if (device != d) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": on device ", d->label, ", but ", field,
                                                     " is on device ", device->label));
    }
    return absl::OkStatus();
  }
};

}  // namespace

template <typename Req, typename Res>
void Engine::Dispatch(const RequestContext& ctx, Req req, Done<Res> done,
                      void (*route_fn)(const Req&, Route*),
                      absl::Status (Engine::*body)(OpEnv&, const Req&, Res*)) {
  if (!Admit()) {
    done(DrainingStatus());
    return;
  }
  auto call = std::make_shared<Call<Req, Res>>();
  call->ctx = ctx;
  {
    absl::StatusOr<std::string> ns = ResolveNamespace(ctx);
    if (!ns.ok()) {
      done(ns.status());
      Release();
      return;
    }
    call->ctx.ns = *std::move(ns);
  }
  call->req = std::move(req);
  call->done = std::move(done);
  auto finish = [this, call](absl::StatusOr<Res> r) {
    Done<Res> d = std::move(call->done);
    d(std::move(r));
    Release();
  };

  Route route;
  route_fn(call->req, &route);
  Placement where;
  for (const auto& use : route.regions) {
    auto it = call->scope.pins.find(use.region_id);
    if (it == call->scope.pins.end()) {
      absl::StatusOr<RegionPin> pin = regions_->Acquire(ctx.session_id, use.region_id, use.field);
      if (!pin.ok()) return finish(pin.status());
      it = call->scope.pins.emplace(use.region_id, std::move(*pin)).first;
    }
    absl::Status s = where.Agree(it->second.device(), use.field);
    if (!s.ok()) return finish(s);
  }
  for (auto& [name, field] : route.names) {
    if (name.empty()) continue;
    name = QualifiedName(call->ctx.ns, name);
    std::shared_ptr<StateEntry> e = store_->Find(name);
    if (e == nullptr) continue;  // the body answers NOT_FOUND or creates it
    absl::Status s = where.Agree(e->device, field);
    if (!s.ok()) return finish(s);
  }
  if (!route.device_uuid.empty()) {
    Device* d = devices_->FindByUuid(route.device_uuid);
    if (d == nullptr) {
      return finish(
          absl::InvalidArgumentError(absl::StrCat("device_uuid: '", route.device_uuid.substr(0, 64),
                                                  "' is not a device this server serves")));
    }
    absl::Status s = where.Agree(d, "device_uuid");
    if (!s.ok()) return finish(s);
  }
  Device* device = where.device;
  if (device == nullptr && route.place_by_state) device = LeastStateDevice();
  if (device == nullptr) {
    // Least loaded (queued + running, relative to its workers).
    device = &devices_->device(0);
    for (int i = 1; i < devices_->size(); ++i) {
      const Executor& x = *executors_[i];
      const Executor& best = ExecutorFor(*device);
      if (x.load() * best.threads() < best.load() * x.threads()) device = &devices_->device(i);
    }
  }
  Executor::Keys keys;
  for (const auto& name_field : route.names) {
    if (!name_field.first.empty()) keys.push_back(Executor::KeyOf(name_field.first));
  }
  for (const std::string& name : route.serial) {
    if (!name.empty()) keys.push_back(Executor::KeyOf(QualifiedName(call->ctx.ns, name)));
  }

  ScratchPool* pool = pools_[device->index].get();
  call->queued_at = absl::Now();
  absl::Status queued = ExecutorFor(*device).Submit(
      ctx,
      [this, call, device, body, finish, pool](kernels::Stream stream) {
        const double waited = absl::ToDoubleSeconds(absl::Now() - call->queued_at);
        if (observer_ != nullptr) observer_->QueueWait(device->label, waited);
        absl::Status s;
        call->result.meta.device_uuid = device->label;
        call->result.meta.queue_micros = waited * 1e6;
        OpEnv env(device, stream, &call->scope, observer_, &call->result.meta, pool);
        env.set_namespace(call->ctx.ns);
        env.set_context(&call->ctx);
        s = (this->*body)(env, call->req, &call->result);
        CheckHealth(*device);
        call->scope.pins.clear();  // the reply means client memory is no longer touched
        if (s.ok()) {
          finish(std::move(call->result));
        } else {
          finish(s);
        }
        env.RunDeferred();  // after the reply; then ~OpEnv returns the scratch
      },
      [finish](absl::Status s) { finish(s); }, /*bypass_bound=*/false, std::move(keys));
  if (!queued.ok()) finish(queued);
}

void Engine::SubmitControl(const RequestContext& ctx, std::function<void()> work,
                           std::function<void(const absl::Status&)> refused) {
  in_flight_.fetch_add(1);
  absl::Status s = control_->Submit(
      ctx,
      [this, work](kernels::Stream) {
        work();
        Release();
      },
      [this, refused](absl::Status st) {
        refused(st);
        Release();
      });
  if (!s.ok()) {
    refused(s);
    Release();
  }
}

// ---------------------------------------------------------------- operations

void Engine::Quantize(const RequestContext& ctx, QuantizeRequest req, Done<QuantizeResult> done) {
  Dispatch<QuantizeRequest, QuantizeResult>(
      ctx, std::move(req), std::move(done),
      [](const QuantizeRequest& r, Route* route) {
        route->Region(r.input.data, "input.region");
        route->Target(r.rowwise_codes, "rowwise_codes");
        route->Target(r.rowwise_scales, "rowwise_scales");
        route->Target(r.columnwise_codes, "columnwise_codes");
        route->Target(r.columnwise_scales, "columnwise_scales");
        route->names.emplace_back(r.options.residual_key, "options.residual_key");
      },
      &Engine::RunQuantize);
}

void Engine::Dequantize(const RequestContext& ctx, DequantizeRequest req,
                        Done<DequantizeResult> done) {
  Dispatch<DequantizeRequest, DequantizeResult>(
      ctx, std::move(req), std::move(done),
      [](const DequantizeRequest& r, Route* route) {
        route->Operand(r.input, "input");
        route->Target(r.out, "out");
      },
      &Engine::RunDequantize);
}

void Engine::Qdq(const RequestContext& ctx, QdqRequest req, Done<QdqResult> done) {
  Dispatch<QdqRequest, QdqResult>(
      ctx, std::move(req), std::move(done),
      [](const QdqRequest& r, Route* route) {
        route->Region(r.input.data, "input.region");
        route->Target(r.out, "out");
        route->names.emplace_back(r.options.residual_key, "options.residual_key");
      },
      &Engine::RunQdq);
}

void Engine::Matmul(const RequestContext& ctx, MatmulRequest req, Done<MatmulResult> done) {
  Dispatch<MatmulRequest, MatmulResult>(
      ctx, std::move(req), std::move(done),
      [](const MatmulRequest& r, Route* route) {
        route->Operand(r.a, "a");
        route->Operand(r.b, "b");
        route->Target(r.out, "out");
      },
      &Engine::RunMatmul);
}

void Engine::UpdateWeight(const RequestContext& ctx, UpdateWeightRequest req,
                          Done<UpdateWeightResult> done) {
  Dispatch<UpdateWeightRequest, UpdateWeightResult>(
      ctx, std::move(req), std::move(done),
      [](const UpdateWeightRequest& r, Route* route) {
        route->names.emplace_back(r.name, "name");
        route->Region(r.update.data, "update.region");
        route->Target(r.dequantized_out, "dequantized_out");
      },
      &Engine::RunUpdateWeight);
}

void Engine::CreateWeight(const RequestContext& ctx, CreateWeightRequest req,
                          Done<CreateWeightResult> done) {
  Dispatch<CreateWeightRequest, CreateWeightResult>(
      ctx, std::move(req), std::move(done),
      [](const CreateWeightRequest& r, Route* route) {
        route->Region(r.initial.data, "initial.region");
        route->device_uuid = r.device_uuid;
        route->place_by_state = true;
        route->serial.push_back(r.name);
      },
      &Engine::RunCreateWeight);
}

void Engine::GetWeight(const RequestContext& ctx, GetWeightRequest req,
                       Done<GetWeightResult> done) {
  Dispatch<GetWeightRequest, GetWeightResult>(
      ctx, std::move(req), std::move(done),
      [](const GetWeightRequest& r, Route* route) {
        route->names.emplace_back(r.name, "name");
        route->Target(r.out, "out");
      },
      &Engine::RunGetWeight);
}

void Engine::DeleteWeight(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done) {
  Dispatch<NameRequest, EmptyResult>(
      ctx, std::move(req), std::move(done),
      [](const NameRequest& r, Route* route) { route->names.emplace_back(r.name, "name"); },
      &Engine::RunDeleteWeight);
}

void Engine::ResetResidual(const RequestContext& ctx, NameRequest req, Done<EmptyResult> done) {
  Dispatch<NameRequest, EmptyResult>(
      ctx, std::move(req), std::move(done),
      [](const NameRequest& r, Route* route) { route->names.emplace_back(r.name, "name"); },
      &Engine::RunResetResidual);
}

void Engine::ResetOptimizer(const RequestContext& ctx, ResetOptimizerRequest req,
                            Done<ResetOptimizerResult> done) {
  Dispatch<ResetOptimizerRequest, ResetOptimizerResult>(
      ctx, std::move(req), std::move(done),
      [](const ResetOptimizerRequest& r, Route* route) { route->names.emplace_back(r.name, "name"); },
      &Engine::RunResetOptimizer);
}

}  // namespace fp4q::server
