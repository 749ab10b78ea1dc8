// fp4q.v1 messages <-> engine structs (requests.h). Part of the gRPC adapter: the only code, with
// grpc_service.cc, that sees both. Conversions copy no tensor bytes into requests: request
// structs hold string_views into the message, which must outlive them. Result bytes are moved
// into the reply.
#ifndef FP4Q_SERVER_PROTO_CONVERT_H_
#define FP4Q_SERVER_PROTO_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/v1/fp4q.pb.h"
#include "server/requests.h"

namespace fp4q::server {

namespace v1 = ::fp4q::v1;

QuantizeRequest FromProto(const v1::QuantizeRequest& m);
DequantizeRequest FromProto(const v1::DequantizeRequest& m);
QdqRequest FromProto(const v1::QdqRequest& m);
MatmulRequest FromProto(const v1::MatmulRequest& m);
absl::StatusOr<CreateWeightRequest> FromProto(const v1::CreateWeightRequest& m);
UpdateWeightRequest FromProto(const v1::UpdateWeightRequest& m);
GetWeightRequest FromProto(const v1::GetWeightRequest& m);
RegisterRegionRequest FromProto(const v1::RegisterCudaRegionRequest& m);
// These convert enums at the edge: an unknown value is INVALID_ARGUMENT naming the field.
absl::StatusOr<StepRequest> FromProto(const v1::StepRequest& m);
absl::StatusOr<ResetOptimizerRequest> FromProto(const v1::ResetOptimizerRequest& m);
JoinGroupRequest FromProto(const v1::JoinGroupRequest& m);
absl::StatusOr<OptimizerSpecIn> FromProto(const v1::OptimizerSpec& m, const std::string& field);

void ToProto(QuantizeResult&& r, v1::QuantizeReply* m);
void ToProto(DequantizeResult&& r, v1::DequantizeReply* m);
void ToProto(QdqResult&& r, v1::QdqReply* m);
void ToProto(MatmulResult&& r, v1::MatmulReply* m);
void ToProto(CreateWeightResult&& r, v1::CreateWeightReply* m);
void ToProto(UpdateWeightResult&& r, v1::UpdateWeightReply* m);
void ToProto(GetWeightResult&& r, v1::GetWeightReply* m);
void ToProto(CheckpointResult&& r, v1::CheckpointReply* m);
void ToProto(StepResult&& r, v1::StepReply* m);
void ToProto(ResetOptimizerResult&& r, v1::ResetOptimizerReply* m);
inline void ToProto(EmptyResult&& /*r*/, v1::DeleteWeightReply* /*m*/) {}
inline void ToProto(EmptyResult&& /*r*/, v1::ResetResidualReply* /*m*/) {}
void ToProto(std::vector<TensorListing>&& r, v1::ListTensorsReply* m);
// Limits.max_message_bytes comes from the transport.
void ToProto(ServerInfoResult&& r, uint64_t max_message_bytes, v1::ServerInfoReply* m);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_PROTO_CONVERT_H_
