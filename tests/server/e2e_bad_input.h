// The hostile-input table of the end-to-end tests: malformed fp4q.v1 requests,
// each with the status code and message substring fp4qd must answer. Shared by
// e2e_bad_input_test.cc (a CPU fp4qd) and e2e_region_input_test.cc (region
// cases, on the fake shared-memory GPU module).
//
// Every case runs against a server holding the baseline state below; none may
// change it.
//   weight "w":     [16, 32] f32, error feedback, last step 5
//   weight "plain": [16, 32] f32, no error feedback, last step 5
//   residual "r":   [2, 16], last step 3
#ifndef FP4Q_TESTS_SERVER_E2E_BAD_INPUT_H_
#define FP4Q_TESTS_SERVER_E2E_BAD_INPUT_H_

#include <functional>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fp4q::server::testing {

// What a case may refer to besides its own literals.
struct BadEnv {
  std::string session;        // a session of this client
  std::string other_session;  // another client's session
  std::string region;         // a region of `session` (region tests only)
  std::string other_region;   // a region of `other_session` (region tests only)
  uint64_t region_bytes = 0;  // size of `region`
};

struct BadCase {
  std::string name;
  std::function<grpc::Status(v1::Fp4q::Stub&, const BadEnv&)> call;
  grpc::StatusCode code;
  std::string message;  // substring: names the field and the offending value
};

// Quantize, Dequantize, Qdq, Matmul.
std::vector<BadCase> TensorOpCases();
// CreateWeight, UpdateWeight, GetWeight, DeleteWeight, ResetResidual, residual
// keys.
std::vector<BadCase> StateCases();
// OpenSession/KeepAlive/CloseSession and the region RPCs on a server whose IPC
// cannot work (CPU backend).
std::vector<BadCase> SessionCases();

// Creates the baseline state; false (with a gtest failure) when that fails.
bool CreateBaseline(v1::Fp4q::Stub& stub);

// The baseline as seen through ListTensors and GetWeight: listing, codes,
// scales, residuals.
struct StateSnapshot {
  std::string listing;
  std::string w_codes, w_scales, w_residual, plain_codes, plain_scales, r_listing;
  bool operator==(const StateSnapshot& o) const {
    return listing == o.listing && w_codes == o.w_codes && w_scales == o.w_scales &&
           w_residual == o.w_residual && plain_codes == o.plain_codes &&
           plain_scales == o.plain_scales;
  }
};
StateSnapshot TakeSnapshot(v1::Fp4q::Stub& stub);

// One call per RPC, with `session` as "fp4q-session" metadata when non-empty.
grpc::Status Call(v1::Fp4q::Stub& s, const v1::QuantizeRequest& r, const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::DequantizeRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::QdqRequest& r, const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::MatmulRequest& r, const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::CreateWeightRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::UpdateWeightRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::GetWeightRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::DeleteWeightRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::ResetResidualRequest& r,
                  const std::string& session = "");
grpc::Status Call(v1::Fp4q::Stub& s, const v1::RegisterCudaRegionRequest& r,
                  const std::string& session = "", v1::RegisterCudaRegionReply* reply = nullptr);
grpc::Status Call(v1::Fp4q::Stub& s, const v1::UnregisterCudaRegionRequest& r,
                  const std::string& session = "");

// While a route is set, Call() hands Quantize, Dequantize, Qdq, Matmul and UpdateWeight to it
// (method name and request) instead of the stub: e2e_fast_socket_test.cc runs the table over
// fp4qd's --fast_socket. Null: back to gRPC.
struct TensorRoute {
  std::function<grpc::Status(const std::string& method, const google::protobuf::Message& request,
                             const std::string& session)>
      send;
};
void SetTensorRoute(const TensorRoute* route);

// Test data.
std::string NaNs(int64_t n,
                 int64_t at = -1);  // f32; all NaN, or only element `at`
std::string WithInf(std::string f32, int64_t at, bool negative = false);
v1::QuantizeRequest Q(const v1::Tensor& t);
v1::UpdateWeightRequest U(const std::string& name, int64_t step, const v1::Tensor& t);
v1::CreateWeightRequest C(const std::string& name, const v1::Tensor& t);
v1::QdqRequest Qdq(const v1::Tensor& t, const std::string& key = "", uint64_t step = 0);
// A valid inline NVFP4 operand [rows, cols] (codes and scales zero, s_enc 1).
v1::QuantizedTensor ZeroOperand(int64_t rows, int64_t cols);

}  // namespace fp4q::server::testing

#endif  // FP4Q_TESTS_SERVER_E2E_BAD_INPUT_H_
