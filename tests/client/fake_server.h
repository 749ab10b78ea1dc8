// An in-process fake of the fp4q service for client tests that need behaviour a real server
// only shows under faults (lost replies, scripted errors, every status code) or state it
// cannot reach without a GPU (accepted CUDA IPC registrations). It records what it received
// (metadata, region requests) so tests can assert the client sent it. Its numerics are not
// real: Qdq echoes its input, the rest return fixed shapes.
#ifndef FP4Q_TESTS_CLIENT_FAKE_SERVER_H_
#define FP4Q_TESTS_CLIENT_FAKE_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fp4q/v1/fp4q.grpc.pb.h"

namespace fp4q::client::testing {

namespace v1 = ::fp4q::v1;

inline constexpr uint64_t kFakeEpoch = 4242;

// What one UpdateWeight call does.
enum class UpdateMode {
  kNormal,                  // apply if step > last step, reply applied = true / false
  kUnavailableBeforeApply,  // UNAVAILABLE, nothing applied
  kApplyThenUnavailable,    // apply, then answer UNAVAILABLE (the reply is "lost")
  kApplyThenSleep,          // apply, then sleep past the client's deadline
  kInvalidArgument,         // INVALID_ARGUMENT "update.shape ..."
};

struct SeenMetadata {
  std::string session;        // "fp4q-session"
  std::string authorization;  // "authorization"
};

class FakeFp4q final : public v1::Fp4q::Service {
 public:
  // Scripts the next UpdateWeight calls, in order; kNormal afterwards.
  void ScriptUpdates(std::vector<UpdateMode> modes);
  void SetSleep(absl::Duration d);  // for kApplyThenSleep (default 400 ms)
  int update_calls() const;
  int64_t last_step(const std::string& name) const;

  SeenMetadata last_metadata(const std::string& rpc) const;
  int calls(const std::string& rpc) const;
  std::vector<v1::RegisterCudaRegionRequest> registrations() const;
  std::vector<std::string> unregistrations() const;
  // ServerInfo's reply is merged with `extra` (e.g. supported_modes, limits, gpus).
  void SetServerInfo(v1::ServerInfoReply extra);
  // Every CreateWeight and Step request received, in order.
  std::vector<v1::CreateWeightRequest> created() const;
  std::vector<v1::StepRequest> steps() const;
  // The ReplyHeader times Step answers with (kernel, queue, server; microseconds).
  static constexpr double kStepKernelMicros = 40.0, kStepQueueMicros = 2.0,
                          kStepServerMicros = 50.0;

  grpc::Status Quantize(grpc::ServerContext*, const v1::QuantizeRequest*,
                        v1::QuantizeReply*) override;
  grpc::Status Dequantize(grpc::ServerContext*, const v1::DequantizeRequest*,
                          v1::DequantizeReply*) override;
  grpc::Status Qdq(grpc::ServerContext*, const v1::QdqRequest*, v1::QdqReply*) override;
  grpc::Status Matmul(grpc::ServerContext*, const v1::MatmulRequest*,
                      v1::MatmulReply*) override;
  grpc::Status UpdateWeight(grpc::ServerContext*, const v1::UpdateWeightRequest*,
                            v1::UpdateWeightReply*) override;
  grpc::Status CreateWeight(grpc::ServerContext*, const v1::CreateWeightRequest*,
                            v1::CreateWeightReply*) override;
  grpc::Status GetWeight(grpc::ServerContext*, const v1::GetWeightRequest*,
                         v1::GetWeightReply*) override;
  // Name "code:N:message" answers status code N with that message (any code, for mapping
  // tests); otherwise OK.
  grpc::Status DeleteWeight(grpc::ServerContext*, const v1::DeleteWeightRequest*,
                            v1::DeleteWeightReply*) override;
  grpc::Status ResetResidual(grpc::ServerContext*, const v1::ResetResidualRequest*,
                             v1::ResetResidualReply*) override;
  grpc::Status ListTensors(grpc::ServerContext*, const v1::ListTensorsRequest*,
                           v1::ListTensorsReply*) override;
  grpc::Status Checkpoint(grpc::ServerContext*, const v1::CheckpointRequest*,
                          v1::CheckpointReply*) override;
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionReply*) override;
  grpc::Status KeepAlive(grpc::ServerContext*, const v1::KeepAliveRequest*,
                         v1::KeepAliveReply*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionReply*) override;
  grpc::Status RegisterCudaRegion(grpc::ServerContext*, const v1::RegisterCudaRegionRequest*,
                                  v1::RegisterCudaRegionReply*) override;
  grpc::Status UnregisterCudaRegion(grpc::ServerContext*, const v1::UnregisterCudaRegionRequest*,
                                    v1::UnregisterCudaRegionReply*) override;
  grpc::Status ServerInfo(grpc::ServerContext*, const v1::ServerInfoRequest*,
                          v1::ServerInfoReply*) override;
  // Applies every item whose step is newer than its name's last (applied = true), echoing the
  // names; the header carries the kStep* times.
  grpc::Status Step(grpc::ServerContext*, const v1::StepRequest*, v1::StepReply*) override;

 private:
  void Record(const std::string& rpc, grpc::ServerContext* context);

  mutable absl::Mutex mu_;
  std::deque<UpdateMode> script_ ABSL_GUARDED_BY(mu_);
  absl::Duration sleep_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(400);
  int update_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> steps_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SeenMetadata> seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterCudaRegionRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unregistrations_ ABSL_GUARDED_BY(mu_);
  int next_region_ ABSL_GUARDED_BY(mu_) = 1;
  v1::ServerInfoReply info_extra_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CreateWeightRequest> created_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepRequest> step_requests_ ABSL_GUARDED_BY(mu_);
};

// The fake on 127.0.0.1 (port chosen by the OS), with gRPC's health service enabled
// ("liveness" and "readiness" SERVING).
class FakeServer {
 public:
  struct Options {
    int max_message_bytes = 64 << 20;
    std::shared_ptr<grpc::ServerCredentials> credentials;  // null: insecure
  };
  FakeServer();
  explicit FakeServer(const Options& options);
  ~FakeServer();

  const std::string& address() const { return address_; }
  FakeFp4q& service() { return service_; }
  void SetHealth(const std::string& service_name, bool serving);

 private:
  FakeFp4q service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace fp4q::client::testing

#endif  // FP4Q_TESTS_CLIENT_FAKE_SERVER_H_
