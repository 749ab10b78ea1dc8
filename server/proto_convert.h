// fp4q.v1 messages <-> engine structs (requests.h): the edge both transports share (the op
// table calls it for the gRPC adapter and the fast socket alike), the only code besides them that
// sees both. Conversions copy no tensor bytes into requests: request structs hold string_views
// into the message, which must outlive them. Result bytes are moved into the reply.
//
// Each proto enum is converted here, once, to the kernels' type: an unknown value (or an
// UNSPECIFIED one where the field has no default, e.g. a tensor's dtype) is INVALID_ARGUMENT
// naming the field path ("options.rounding: unknown value 7", "items[2].update.dtype: DTYPE_U8;
// expected DTYPE_F32 or DTYPE_BF16"); where 0 / UNSPECIFIED means a default, the default is
// filled in (QuantOptionsIn, WeightOptionsIn and requests.h say which).
#ifndef FP4Q_SERVER_PROTO_CONVERT_H_
#define FP4Q_SERVER_PROTO_CONVERT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/v1/fp4q.pb.h"
#include "server/requests.h"

namespace fp4q::server {

namespace v1 = ::fp4q::v1;

absl::StatusOr<QuantizeRequest> FromProto(const v1::QuantizeRequest& m);
absl::StatusOr<DequantizeRequest> FromProto(const v1::DequantizeRequest& m);
absl::StatusOr<QdqRequest> FromProto(const v1::QdqRequest& m);
absl::StatusOr<MatmulRequest> FromProto(const v1::MatmulRequest& m);
absl::StatusOr<CreateWeightRequest> FromProto(const v1::CreateWeightRequest& m);
absl::StatusOr<UpdateWeightRequest> FromProto(const v1::UpdateWeightRequest& m);
absl::StatusOr<GetWeightRequest> FromProto(const v1::GetWeightRequest& m);
absl::StatusOr<StepRequest> FromProto(const v1::StepRequest& m);
absl::StatusOr<ResetOptimizerRequest> FromProto(const v1::ResetOptimizerRequest& m);
// `field` prefixes the messages ("options.optimizer.kind: unknown value 5").
absl::StatusOr<OptimizerSpecIn> FromProto(const v1::OptimizerSpec& m, const FieldPath& field);
// No enums: these cannot fail.
RegisterRegionRequest FromProto(const v1::RegisterCudaRegionRequest& m);
JoinGroupRequest FromProto(const v1::JoinGroupRequest& m);

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
