// Calls, test data, baseline and snapshot of the hostile-input table
// (e2e_bad_input.h).
#include <cstring>
#include <limits>

#include "e2e_bad_input.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {

#define FP4Q_E2E_CALL(Req, Rep, Method)                                                \
  grpc::Status Call(v1::Fp4q::Stub& s, const v1::Req& r, const std::string& session) { \
    v1::Rep rep;                                                                       \
    auto ctx = Context(session);                                                       \
    return s.Method(ctx.get(), r, &rep);                                               \
  }
FP4Q_E2E_CALL(CreateWeightRequest, CreateWeightReply, CreateWeight)
FP4Q_E2E_CALL(GetWeightRequest, GetWeightReply, GetWeight)
FP4Q_E2E_CALL(DeleteWeightRequest, DeleteWeightReply, DeleteWeight)
FP4Q_E2E_CALL(ResetResidualRequest, ResetResidualReply, ResetResidual)
FP4Q_E2E_CALL(UnregisterCudaRegionRequest, UnregisterCudaRegionReply, UnregisterCudaRegion)
#undef FP4Q_E2E_CALL

namespace {
const TensorRoute* g_route = nullptr;
}  // namespace

void SetTensorRoute(const TensorRoute* route) { g_route = route; }

#define FP4Q_E2E_ROUTED_CALL(Req, Rep, Method, field)                                  \
  grpc::Status Call(v1::Fp4q::Stub& s, const v1::Req& r, const std::string& session) { \
    if (g_route != nullptr) return g_route->send(#Method, r, session);                 \
    v1::Rep rep;                                                                       \
    auto ctx = Context(session);                                                       \
    return s.Method(ctx.get(), r, &rep);                                               \
  }
FP4Q_E2E_ROUTED_CALL(QuantizeRequest, QuantizeReply, Quantize, quantize)
FP4Q_E2E_ROUTED_CALL(DequantizeRequest, DequantizeReply, Dequantize, dequantize)
FP4Q_E2E_ROUTED_CALL(QdqRequest, QdqReply, Qdq, qdq)
FP4Q_E2E_ROUTED_CALL(MatmulRequest, MatmulReply, Matmul, matmul)
FP4Q_E2E_ROUTED_CALL(UpdateWeightRequest, UpdateWeightReply, UpdateWeight, update_weight)
#undef FP4Q_E2E_ROUTED_CALL

grpc::Status Call(v1::Fp4q::Stub& s, const v1::RegisterCudaRegionRequest& r,
                  const std::string& session, v1::RegisterCudaRegionReply* reply) {
  v1::RegisterCudaRegionReply rep;
  auto ctx = Context(session);
  return s.RegisterCudaRegion(ctx.get(), r, reply != nullptr ? reply : &rep);
}

std::string NaNs(int64_t n, int64_t at) {
  std::string x = RandomF32(n, 5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    if (at < 0 || i == at) std::memcpy(x.data() + 4 * i, &nan, 4);
  }
  return x;
}

std::string WithInf(std::string f32, int64_t at, bool negative) {
  const float inf =
      negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  std::memcpy(f32.data() + 4 * at, &inf, 4);
  return f32;
}

v1::QuantizeRequest Q(const v1::Tensor& t) {
  v1::QuantizeRequest r;
  *r.mutable_input() = t;
  return r;
}

v1::UpdateWeightRequest U(const std::string& name, int64_t step, const v1::Tensor& t) {
  v1::UpdateWeightRequest r;
  r.set_name(name);
  r.set_step(step);
  *r.mutable_update() = t;
  r.set_lr(0.1f);
  return r;
}

v1::CreateWeightRequest C(const std::string& name, const v1::Tensor& t) {
  v1::CreateWeightRequest r;
  r.set_name(name);
  *r.mutable_initial() = t;
  return r;
}

v1::QdqRequest Qdq(const v1::Tensor& t, const std::string& key, uint64_t step) {
  v1::QdqRequest r;
  *r.mutable_input() = t;
  r.mutable_options()->set_residual_key(key);
  r.mutable_options()->set_step(step);
  return r;
}

v1::QuantizedTensor ZeroOperand(int64_t rows, int64_t cols) {
  v1::QuantizedTensor t;
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_s_enc(1.0f);
  t.set_codes(std::string(static_cast<size_t>(rows * cols / 2), '\0'));
  t.set_scales(std::string(static_cast<size_t>(rows * cols / 16), '\0'));
  return t;
}

bool CreateBaseline(v1::Fp4q::Stub& stub) {
  v1::CreateWeightRequest r = C("w", InlineTensor(RandomF32(16 * 32, 1), 16, 32));
  r.mutable_options()->set_error_feedback(true);
  r.set_step(5);
  grpc::Status s = Call(stub, r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  r.set_name("plain");
  r.mutable_options()->set_error_feedback(false);
  grpc::Status p = Call(stub, r);
  EXPECT_TRUE(p.ok()) << p.error_message();
  grpc::Status q = Call(stub, Qdq(InlineTensor(RandomF32(32, 2), 2, 16), "r", 3));
  EXPECT_TRUE(q.ok()) << q.error_message();
  return s.ok() && p.ok() && q.ok();
}

StateSnapshot TakeSnapshot(v1::Fp4q::Stub& stub) {
  StateSnapshot s;
  v1::ListTensorsReply list;
  auto ctx = Context();
  grpc::Status ls = stub.ListTensors(ctx.get(), v1::ListTensorsRequest(), &list);
  EXPECT_TRUE(ls.ok()) << ls.error_message();
  list.clear_header();
  s.listing = list.DebugString();
  for (const std::string name : {"w", "plain"}) {
    v1::GetWeightRequest r;
    r.set_name(name);
    r.set_quantized(true);
    r.set_residual(name == "w");
    v1::GetWeightReply rep;
    auto gctx = Context();
    grpc::Status gs = stub.GetWeight(gctx.get(), r, &rep);
    EXPECT_TRUE(gs.ok()) << name << ": " << gs.error_message();
    (name == "w" ? s.w_codes : s.plain_codes) = rep.quantized().codes();
    (name == "w" ? s.w_scales : s.plain_scales) = rep.quantized().scales();
    if (name == "w") s.w_residual = rep.residual().inline_data();
  }
  return s;
}

}  // namespace fp4q::server::testing
