#include "fake_server.h"

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace fp4q::client::testing {
namespace {

std::string Meta(grpc::ServerContext* context, const char* key) {
  const auto& md = context->client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

void Header(v1::ReplyHeader* header) {
  header->set_server_epoch(kFakeEpoch);
  header->set_backend("fake");
}

}  // namespace

void FakeFp4q::Record(const std::string& rpc, grpc::ServerContext* context) {
  absl::MutexLock lock(&mu_);
  seen_[rpc] = SeenMetadata{Meta(context, "fp4q-session"), Meta(context, "authorization")};
  ++calls_[rpc];
}

void FakeFp4q::ScriptUpdates(std::vector<UpdateMode> modes) {
  absl::MutexLock lock(&mu_);
  script_.assign(modes.begin(), modes.end());
}

void FakeFp4q::SetSleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  sleep_ = d;
}

int FakeFp4q::update_calls() const {
  absl::MutexLock lock(&mu_);
  return update_calls_;
}

int64_t FakeFp4q::last_step(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(name);
  return it == steps_.end() ? -1 : it->second;
}

SeenMetadata FakeFp4q::last_metadata(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  auto it = seen_.find(rpc);
  return it == seen_.end() ? SeenMetadata{} : it->second;
}

int FakeFp4q::calls(const std::string& rpc) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(rpc);
  return it == calls_.end() ? 0 : it->second;
}

std::vector<v1::RegisterCudaRegionRequest> FakeFp4q::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

std::vector<std::string> FakeFp4q::unregistrations() const {
  absl::MutexLock lock(&mu_);
  return unregistrations_;
}

void FakeFp4q::SetServerInfo(v1::ServerInfoReply extra) {
  absl::MutexLock lock(&mu_);
  info_extra_ = std::move(extra);
}

std::vector<v1::CreateWeightRequest> FakeFp4q::created() const {
  absl::MutexLock lock(&mu_);
  return created_;
}

std::vector<v1::StepRequest> FakeFp4q::steps() const {
  absl::MutexLock lock(&mu_);
  return step_requests_;
}

grpc::Status FakeFp4q::Quantize(grpc::ServerContext* context, const v1::QuantizeRequest* request,
                                v1::QuantizeReply* reply) {
  Record("Quantize", context);
  Header(reply->mutable_header());
  v1::QuantizedTensor* q = reply->mutable_rowwise();
  for (int64_t d : request->input().shape()) q->add_shape(d);
  q->set_global_amax(1.0f);
  q->set_s_enc(2688.0f);
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::Dequantize(grpc::ServerContext* context, const v1::DequantizeRequest*,
                                  v1::DequantizeReply* reply) {
  Record("Dequantize", context);
  Header(reply->mutable_header());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::Qdq(grpc::ServerContext* context, const v1::QdqRequest* request,
                           v1::QdqReply* reply) {
  Record("Qdq", context);
  Header(reply->mutable_header());
  v1::TensorResult* out = reply->mutable_output();
  out->set_dtype(request->input().dtype());
  *out->mutable_shape() = request->input().shape();
  out->set_inline_data(request->input().inline_data());  // echo
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::Matmul(grpc::ServerContext* context, const v1::MatmulRequest*,
                              v1::MatmulReply* reply) {
  Record("Matmul", context);
  Header(reply->mutable_header());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::UpdateWeight(grpc::ServerContext* context,
                                    const v1::UpdateWeightRequest* request,
                                    v1::UpdateWeightReply* reply) {
  Record("UpdateWeight", context);
  UpdateMode mode = UpdateMode::kNormal;
  absl::Duration sleep;
  bool applied = false;
  int64_t last = 0;
  {
    absl::MutexLock lock(&mu_);
    ++update_calls_;
    if (!script_.empty()) {
      mode = script_.front();
      script_.pop_front();
    }
    sleep = sleep_;
    if (mode == UpdateMode::kUnavailableBeforeApply) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: connection reset");
    }
    if (mode == UpdateMode::kInvalidArgument) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "update.shape [3] mismatch");
    }
    int64_t& step = steps_[request->name()];
    if (request->step() > step) {
      step = request->step();
      applied = true;
    }
    last = step;
  }
  if (mode == UpdateMode::kApplyThenUnavailable) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: reply lost");
  }
  if (mode == UpdateMode::kApplyThenSleep) absl::SleepFor(sleep);
  Header(reply->mutable_header());
  reply->set_applied(applied);
  reply->set_last_step(last);
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::CreateWeight(grpc::ServerContext* context,
                                    const v1::CreateWeightRequest* request,
                                    v1::CreateWeightReply* reply) {
  Record("CreateWeight", context);
  {
    absl::MutexLock lock(&mu_);
    created_.push_back(*request);
  }
  Header(reply->mutable_header());
  reply->mutable_weight()->set_name(request->name());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::GetWeight(grpc::ServerContext* context,
                                 const v1::GetWeightRequest* request, v1::GetWeightReply* reply) {
  Record("GetWeight", context);
  Header(reply->mutable_header());
  reply->mutable_weight()->set_name(request->name());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::DeleteWeight(grpc::ServerContext* context,
                                    const v1::DeleteWeightRequest* request,
                                    v1::DeleteWeightReply* reply) {
  Record("DeleteWeight", context);
  const std::vector<std::string> parts = absl::StrSplit(request->name(), absl::MaxSplits(':', 2));
  int code = 0;
  if (parts.size() == 3 && parts[0] == "code" && absl::SimpleAtoi(parts[1], &code)) {
    return grpc::Status(static_cast<grpc::StatusCode>(code), parts[2]);
  }
  Header(reply->mutable_header());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::ResetResidual(grpc::ServerContext* context,
                                     const v1::ResetResidualRequest*,
                                     v1::ResetResidualReply* reply) {
  Record("ResetResidual", context);
  Header(reply->mutable_header());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::ListTensors(grpc::ServerContext* context, const v1::ListTensorsRequest*,
                                   v1::ListTensorsReply* reply) {
  Record("ListTensors", context);
  Header(reply->mutable_header());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest*,
                                  v1::CheckpointReply* reply) {
  Record("Checkpoint", context);
  Header(reply->mutable_header());
  reply->set_path("fp4q-state.ckpt");
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::OpenSession(grpc::ServerContext* context, const v1::OpenSessionRequest*,
                                   v1::OpenSessionReply* reply) {
  Record("OpenSession", context);
  Header(reply->mutable_header());
  reply->set_session_id("0123456789abcdef0123456789abcdef");
  reply->set_lease_seconds(30);
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest*,
                                 v1::KeepAliveReply* reply) {
  Record("KeepAlive", context);
  if (Meta(context, "fp4q-session").empty()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "fake: no session");
  }
  Header(reply->mutable_header());
  reply->set_lease_seconds(30);
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::CloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest*,
                                    v1::CloseSessionReply* reply) {
  Record("CloseSession", context);
  Header(reply->mutable_header());
  absl::MutexLock lock(&mu_);
  reply->set_regions_released(
      static_cast<uint32_t>(registrations_.size() - unregistrations_.size()));
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::RegisterCudaRegion(grpc::ServerContext* context,
                                          const v1::RegisterCudaRegionRequest* request,
                                          v1::RegisterCudaRegionReply* reply) {
  Record("RegisterCudaRegion", context);
  Header(reply->mutable_header());
  absl::MutexLock lock(&mu_);
  registrations_.push_back(*request);
  reply->set_region_id(absl::StrCat("region-", next_region_++));
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::UnregisterCudaRegion(grpc::ServerContext* context,
                                            const v1::UnregisterCudaRegionRequest* request,
                                            v1::UnregisterCudaRegionReply* reply) {
  Record("UnregisterCudaRegion", context);
  Header(reply->mutable_header());
  absl::MutexLock lock(&mu_);
  unregistrations_.push_back(request->region_id());
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::ServerInfo(grpc::ServerContext* context, const v1::ServerInfoRequest*,
                                  v1::ServerInfoReply* reply) {
  Record("ServerInfo", context);
  Header(reply->mutable_header());
  reply->set_version("fake");
  reply->set_backend("fake");
  reply->set_server_epoch(kFakeEpoch);
  absl::MutexLock lock(&mu_);
  reply->MergeFrom(info_extra_);
  return grpc::Status::OK;
}

grpc::Status FakeFp4q::Step(grpc::ServerContext* context, const v1::StepRequest* request,
                            v1::StepReply* reply) {
  Record("Step", context);
  Header(reply->mutable_header());
  reply->mutable_header()->set_kernel_micros(kStepKernelMicros);
  reply->mutable_header()->set_queue_micros(kStepQueueMicros);
  reply->mutable_header()->set_server_micros(kStepServerMicros);
  absl::MutexLock lock(&mu_);
  step_requests_.push_back(*request);
  uint32_t applied = 0;
  for (const v1::StepItem& item : request->items()) {
    int64_t& step = steps_[item.name()];
    const bool newer = request->step() > step;
    applied += newer ? 1 : 0;
    if (newer) step = request->step();
    if (request->brief_reply()) continue;  // counted, not listed (as fp4qd)
    v1::StepItemResult* r = reply->add_items();
    r->set_name(item.name());
    r->set_applied(newer);
    r->set_last_step(step);
  }
  reply->set_applied_items(applied);
  reply->set_world_size(1);
  return grpc::Status::OK;
}

FakeServer::FakeServer() : FakeServer(Options{}) {}

FakeServer::FakeServer(const Options& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      "127.0.0.1:0",
      options.credentials ? options.credentials : grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  address_ = absl::StrCat("127.0.0.1:", port);
  SetHealth("liveness", true);
  SetHealth("readiness", true);
}

FakeServer::~FakeServer() { server_->Shutdown(std::chrono::system_clock::now()); }

void FakeServer::SetHealth(const std::string& service_name, bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(service_name, serving);
}

}  // namespace fp4q::client::testing
