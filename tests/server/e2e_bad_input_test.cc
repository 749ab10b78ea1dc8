// End to end: issue 3's bad inputs (and more), each answered with its code and a message naming
// the field, while fp4qd keeps serving and no state changes.
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "e2e_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

struct BadCase {
  std::string name;
  std::function<grpc::Status(v1::Fp4q::Stub&, const std::string& session)> call;
  grpc::StatusCode code;
  std::string message;  // substring, naming the field
};

std::string NaNs(int64_t n, int64_t at = -1) {
  std::string x = RandomF32(n, 5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    if (at < 0 || i == at) std::memcpy(x.data() + 4 * i, &nan, 4);
  }
  return x;
}

grpc::Status Quantize(v1::Fp4q::Stub& stub, const v1::QuantizeRequest& req,
                      const std::string& session = "") {
  v1::QuantizeReply rep;
  auto ctx = Context(session);
  return stub.Quantize(ctx.get(), req, &rep);
}
v1::QuantizeRequest Q(const v1::Tensor& t) {
  v1::QuantizeRequest r;
  *r.mutable_input() = t;
  return r;
}
grpc::Status Update(v1::Fp4q::Stub& stub, const std::string& name, int64_t step,
                    const v1::Tensor& t, float lr = 0.1f, int kind = 0) {
  v1::UpdateWeightRequest r;
  r.set_name(name);
  r.set_step(step);
  *r.mutable_update() = t;
  r.set_lr(lr);
  r.set_kind(static_cast<v1::UpdateKind>(kind));
  v1::UpdateWeightReply rep;
  auto ctx = Context();
  return stub.UpdateWeight(ctx.get(), r, &rep);
}
grpc::Status Create(v1::Fp4q::Stub& stub, const std::string& name, const v1::Tensor& t,
                    int block = 0) {
  v1::CreateWeightRequest r;
  r.set_name(name);
  *r.mutable_initial() = t;
  r.mutable_options()->set_block(static_cast<v1::BlockShape>(block));
  v1::CreateWeightReply rep;
  auto ctx = Context();
  return stub.CreateWeight(ctx.get(), r, &rep);
}
grpc::Status Qdq(v1::Fp4q::Stub& stub, const v1::Tensor& t, const std::string& key, uint64_t step,
                 int rht = 0) {
  v1::QdqRequest r;
  *r.mutable_input() = t;
  r.mutable_options()->set_residual_key(key);
  r.mutable_options()->set_step(step);
  r.mutable_options()->set_rht(static_cast<v1::RhtMode>(rht));
  v1::QdqReply rep;
  auto ctx = Context();
  return stub.Qdq(ctx.get(), r, &rep);
}

std::vector<BadCase> Cases() {
  using C = grpc::StatusCode;
  const v1::Tensor good = InlineTensor(RandomF32(2 * 16, 1), 2, 16);
  std::vector<BadCase> cases = {
      {"unknown region",
       [](auto& s, auto& sess) {
         return Quantize(s, Q(RegionTensor("r-unknown", 0, 2, 16)), sess);
       },
       C::NOT_FOUND, "input.region.region_id: no region 'r-unknown' in this session"},
      {"region without session",
       [](auto& s, auto&) { return Quantize(s, Q(RegionTensor("r-unknown", 0, 2, 16))); },
       C::NOT_FOUND, "(no 'fp4q-session' metadata was sent)"},
      {"unknown output region",
       [good](auto& s, auto& sess) {
         v1::QuantizeRequest r = Q(good);
         r.mutable_rowwise_codes()->mutable_region()->set_region_id("nope");
         return Quantize(s, r, sess);
       },
       C::NOT_FOUND, "rowwise_codes.region.region_id: no region 'nope'"},
      {"dtype U8 as input",
       [](auto& s, auto&) {
         return Quantize(s, Q(InlineTensor(std::string(32, 'a'), 2, 16, v1::DTYPE_U8)));
       },
       C::INVALID_ARGUMENT, "input.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"},
      {"unknown dtype value",
       [](auto& s, auto&) {
         return Quantize(s,
                         Q(InlineTensor(std::string(128, 'a'), 2, 16, static_cast<v1::DType>(9))));
       },
       C::INVALID_ARGUMENT, "input.dtype: unknown value 9"},
      {"inline bytes do not match dtype and shape",
       [](auto& s, auto&) { return Quantize(s, Q(InlineTensor(std::string(100, 'a'), 2, 16))); },
       C::INVALID_ARGUMENT, "input.inline_data: 100 bytes; DTYPE_F32 [2, 16] needs 128"},
      {"rank 3",
       [](auto& s, auto&) {
         v1::Tensor t = InlineTensor(RandomF32(32, 1), 2, 16);
         t.add_shape(1);
         return Quantize(s, Q(t));
       },
       C::INVALID_ARGUMENT, "input.shape: [2, 16, 1] has rank 3; expected [rows, cols]"},
      {"zero rows", [](auto& s, auto&) { return Quantize(s, Q(InlineTensor("", 0, 16))); },
       C::INVALID_ARGUMENT, "input.shape[0]: 0 must be >= 1"},
      {"cols not a multiple of 16",
       [](auto& s, auto&) { return Quantize(s, Q(InlineTensor(RandomF32(2 * 40, 1), 2, 40))); },
       C::INVALID_ARGUMENT, "input.shape[1]: 40 is not a multiple of the block size 16"},
      {"16x16 blocks need rows % 16",
       [](auto& s, auto&) {
         v1::QuantizeRequest r = Q(InlineTensor(RandomF32(8 * 16, 1), 8, 16));
         r.mutable_options()->set_block(v1::BLOCK_SHAPE_16X16);
         return Quantize(s, r);
       },
       C::INVALID_ARGUMENT, "input.shape[0]: 8 is not a multiple of 16 (16x16 blocks)"},
      {"dimensions overflow, inline",
       [](auto& s, auto&) {
         return Quantize(s, Q(InlineTensor("x", int64_t{1} << 40, int64_t{1} << 40)));
       },
       C::INVALID_ARGUMENT, "[1099511627776, 1099511627776] exceed the limit of 2^62 bytes"},
      {"unknown enum value",
       [good](auto& s, auto&) {
         v1::QuantizeRequest r = Q(good);
         r.mutable_options()->set_format(static_cast<v1::Format>(7));
         return Quantize(s, r);
       },
       C::INVALID_ARGUMENT, "options.format: unknown value 7"},
      {"MXFP4 with a caller amax",
       [](auto& s, auto&) {
         v1::QuantizeRequest r = Q(InlineTensor(RandomF32(2 * 32, 1), 2, 32));
         r.mutable_options()->set_format(v1::FORMAT_MXFP4);
         r.mutable_options()->set_amax(2.0f);
         return Quantize(s, r);
       },
       C::INVALID_ARGUMENT, "options.amax: 2 given, but MXFP4 has no global scale"},
      {"column-wise output needs rows % 16",
       [](auto& s, auto&) {
         v1::QuantizeRequest r = Q(InlineTensor(RandomF32(8 * 16, 1), 8, 16));
         r.mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
         return Quantize(s, r);
       },
       C::INVALID_ARGUMENT, "input.shape[0]: 8 is not a multiple of the block size 16"},
      {"no data",
       [](auto& s, auto&) {
         v1::Tensor t;
         t.set_dtype(v1::DTYPE_F32);
         t.add_shape(2);
         t.add_shape(16);
         return Quantize(s, Q(t));
       },
       C::INVALID_ARGUMENT, "input: no data (set inline_data or region)"},
      {"dequantize codes of the wrong size",
       [](auto& s, auto&) {
         v1::DequantizeRequest r;
         v1::QuantizedTensor* t = r.mutable_input()->mutable_tensor();
         t->add_shape(2);
         t->add_shape(16);
         t->set_s_enc(1);
         t->set_codes("abc");
         t->set_scales("ab");
         v1::DequantizeReply rep;
         auto ctx = Context();
         return s.Dequantize(ctx.get(), r, &rep);
       },
       C::INVALID_ARGUMENT, "input.tensor.codes: 3 bytes, expected 16"},
      {"dequantize with s_enc 0",
       [](auto& s, auto&) {
         v1::DequantizeRequest r;
         v1::QuantizedTensor* t = r.mutable_input()->mutable_tensor();
         t->add_shape(2);
         t->add_shape(16);
         t->set_codes(std::string(16, '\0'));
         t->set_scales(std::string(2, '\0'));
         v1::DequantizeReply rep;
         auto ctx = Context();
         return s.Dequantize(ctx.get(), r, &rep);
       },
       C::INVALID_ARGUMENT, "input.tensor.s_enc: 0 must be finite and > 0"},
      {"matmul K mismatch",
       [](auto& s, auto&) {
         v1::MatmulRequest r;
         for (auto [op, k] : {std::pair{r.mutable_a(), 64}, std::pair{r.mutable_b(), 32}}) {
           v1::QuantizedTensor* t = op->mutable_tensor();
           t->add_shape(2);
           t->add_shape(k);
           t->set_s_enc(1);
           t->set_codes(std::string(k, '\0'));
           t->set_scales(std::string(2 * k / 16, '\0'));
         }
         v1::MatmulReply rep;
         auto ctx = Context();
         return s.Matmul(ctx.get(), r, &rep);
       },
       C::INVALID_ARGUMENT, "b.tensor.shape[1]: 32 does not match a.cols 64 (K)"},
      {"matmul with an unknown weight",
       [](auto& s, auto&) {
         v1::MatmulRequest r;
         r.mutable_a()->set_weight_name("w");
         r.mutable_b()->set_weight_name("ghost");
         v1::MatmulReply rep;
         auto ctx = Context();
         return s.Matmul(ctx.get(), r, &rep);
       },
       C::NOT_FOUND, "b.weight_name: no weight 'ghost'"},
      {"update of an unknown weight",
       [good](auto& s, auto&) { return Update(s, "ghost", 1, good); }, C::NOT_FOUND,
       "name: no weight 'ghost'"},
      {"update shape mismatch",
       [](auto& s, auto&) {
         return Update(s, "w", 6, InlineTensor(RandomF32(16 * 16, 1), 16, 16));
       },
       C::INVALID_ARGUMENT, "update.shape: [16, 16] does not match weight 'w' of shape [16, 32]"},
      {"update dtype mismatch",
       [](auto& s, auto&) {
         return Update(s, "w", 6,
                       InlineTensor(std::string(16 * 32, '\0'), 16, 32, v1::DTYPE_F8_E4M3));
       },
       C::INVALID_ARGUMENT, "update.dtype: DTYPE_F8_E4M3; expected DTYPE_F32 or DTYPE_BF16"},
      {"NaN-filled update",
       [](auto& s, auto&) { return Update(s, "w", 6, InlineTensor(NaNs(16 * 32), 16, 32)); },
       C::INVALID_ARGUMENT, "update: element 0 is NaN; non-finite values would corrupt"},
      {"older step",
       [](auto& s, auto&) {
         return Update(s, "w", 4, InlineTensor(RandomF32(16 * 32, 1), 16, 32));
       },
       C::FAILED_PRECONDITION, "step: 4 is older than the last step 5 of weight 'w'"},
      {"unknown update kind",
       [](auto& s, auto&) {
         return Update(s, "w", 6, InlineTensor(RandomF32(16 * 32, 1), 16, 32), 0.1f, 9);
       },
       C::INVALID_ARGUMENT, "kind: unknown value 9"},
      {"lr NaN",
       [](auto& s, auto&) {
         return Update(s, "w", 6, InlineTensor(RandomF32(16 * 32, 1), 16, 32),
                       std::numeric_limits<float>::quiet_NaN());
       },
       C::INVALID_ARGUMENT, "lr: nan is not finite"},
      {"create over the memory budget",
       [](auto& s, auto&) {
         return Create(s, "big", InlineTensor(RandomF32(256 * 256, 1), 256, 256));
       },
       C::RESOURCE_EXHAUSTED, "name: 'big' needs 36872 bytes of state"},
      {"create an existing name",
       [](auto& s, auto&) { return Create(s, "w", InlineTensor(RandomF32(16 * 32, 1), 16, 32)); },
       C::ALREADY_EXISTS, "name: 'w' already exists"},
      {"create with NaN",
       [](auto& s, auto&) { return Create(s, "n", InlineTensor(NaNs(16 * 32, 3), 16, 32)); },
       C::INVALID_ARGUMENT, "initial: element 3 is NaN"},
      {"create with a bad name", [good](auto& s, auto&) { return Create(s, "a b", good); },
       C::INVALID_ARGUMENT, "name: byte 1 (0x20) is not allowed"},
      {"create with an MXFP4 block", [good](auto& s, auto&) { return Create(s, "m", good, 3); },
       C::INVALID_ARGUMENT, "options.block: BLOCK_SHAPE_1X32 is MXFP4's"},
      {"residual step repeated",
       [](auto& s, auto&) { return Qdq(s, InlineTensor(RandomF32(32, 2), 2, 16), "r", 3); },
       C::ALREADY_EXISTS, "options.step: 3 was already applied to residual 'r'"},
      {"residual step older",
       [](auto& s, auto&) { return Qdq(s, InlineTensor(RandomF32(32, 2), 2, 16), "r", 2); },
       C::FAILED_PRECONDITION, "options.step: 2 is older than the last step 3 of residual 'r'"},
      {"residual shape mismatch",
       [](auto& s, auto&) { return Qdq(s, InlineTensor(RandomF32(64, 2), 4, 16), "r", 4); },
       C::INVALID_ARGUMENT, "input.shape: [4, 16] does not match residual 'r' of shape [2, 16]"},
      {"residual key names a weight",
       [](auto& s, auto&) { return Qdq(s, InlineTensor(RandomF32(16 * 32, 2), 16, 32), "w", 9); },
       C::INVALID_ARGUMENT, "options.residual_key: 'w' is a stored weight"},
      {"QDQ with RHT",
       [](auto& s, auto&) { return Qdq(s, InlineTensor(RandomF32(32, 2), 2, 16), "", 0, 2); },
       C::INVALID_ARGUMENT, "options.rht: default_signs is not supported by QDQ"},
      {"IPC handle of the wrong size",
       [](auto& s, auto& sess) {
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(std::string(10, 'h'));
         r.set_size(1 << 20);
         v1::RegisterCudaRegionReply rep;
         auto ctx = Context(sess);
         return s.RegisterCudaRegion(ctx.get(), r, &rep);
       },
       C::INVALID_ARGUMENT, "ipc_handle: 10 bytes, expected 64"},
      {"IPC on the CPU backend",
       [](auto& s, auto& sess) {
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(std::string(64, 'h'));
         r.set_size(1 << 20);
         v1::RegisterCudaRegionReply rep;
         auto ctx = Context(sess);
         return s.RegisterCudaRegion(ctx.get(), r, &rep);
       },
       C::FAILED_PRECONDITION, "CUDA IPC is not available on the CPU backend"},
      {"register without a session",
       [](auto& s, auto&) {
         v1::RegisterCudaRegionRequest r;
         r.set_ipc_handle(std::string(64, 'h'));
         r.set_size(1 << 20);
         v1::RegisterCudaRegionReply rep;
         auto ctx = Context();
         return s.RegisterCudaRegion(ctx.get(), r, &rep);
       },
       C::NOT_FOUND, "session: unknown or expired session"},
      {"unregister an unknown region",
       [](auto& s, auto& sess) {
         v1::UnregisterCudaRegionRequest r;
         r.set_region_id("r-x");
         v1::UnregisterCudaRegionReply rep;
         auto ctx = Context(sess);
         return s.UnregisterCudaRegion(ctx.get(), r, &rep);
       },
       C::NOT_FOUND, "region_id: no region 'r-x' in this session"},
      {"residual of a weight without error feedback",
       [](auto& s, auto&) {
         v1::GetWeightRequest r;
         r.set_name("plain");
         r.set_residual(true);
         v1::GetWeightReply rep;
         auto ctx = Context();
         return s.GetWeight(ctx.get(), r, &rep);
       },
       C::FAILED_PRECONDITION, "residual: weight 'plain' keeps no residual"},
      {"reset an unknown residual",
       [](auto& s, auto&) {
         v1::ResetResidualRequest r;
         r.set_name("ghost");
         v1::ResetResidualReply rep;
         auto ctx = Context();
         return s.ResetResidual(ctx.get(), r, &rep);
       },
       C::NOT_FOUND, "name: no weight or residual 'ghost'"},
      {"delete an unknown weight",
       [](auto& s, auto&) {
         v1::DeleteWeightRequest r;
         r.set_name("ghost");
         v1::DeleteWeightReply rep;
         auto ctx = Context();
         return s.DeleteWeight(ctx.get(), r, &rep);
       },
       C::NOT_FOUND, "name: no weight or residual 'ghost'"},
      {"keep-alive of an unknown session",
       [](auto& s, auto&) {
         v1::KeepAliveReply rep;
         auto ctx = Context("0123456789abcdef0123456789abcdef");
         return s.KeepAlive(ctx.get(), v1::KeepAliveRequest(), &rep);
       },
       C::NOT_FOUND, "session: unknown or expired session"},
  };
  return cases;
}

struct Snapshot {
  std::string listing;
  std::string w_codes, w_residual, plain_codes;
};

Snapshot Take(v1::Fp4q::Stub& stub) {
  Snapshot s;
  v1::ListTensorsReply list;
  auto ctx = Context();
  EXPECT_TRUE(stub.ListTensors(ctx.get(), v1::ListTensorsRequest(), &list).ok());
  list.clear_header();
  s.listing = list.DebugString();
  for (const char* name : {"w", "plain"}) {
    v1::GetWeightRequest r;
    r.set_name(name);
    r.set_quantized(true);
    r.set_residual(std::string(name) == "w");
    v1::GetWeightReply rep;
    auto gctx = Context();
    EXPECT_TRUE(stub.GetWeight(gctx.get(), r, &rep).ok());
    (std::string(name) == "w" ? s.w_codes : s.plain_codes) = rep.quantized().codes();
    if (std::string(name) == "w") s.w_residual = rep.residual().inline_data();
  }
  return s;
}

TEST(E2eBadInputTest, EachBadInputGetsItsCodeAndFieldAndChangesNothing) {
  // Budget: room for the baseline state only.
  auto server = ServerProcess::Start({"--state_budget_bytes=20000", "--allow_cuda_ipc"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = (*server)->Stub();
  {
    v1::CreateWeightRequest r;
    r.set_name("w");
    *r.mutable_initial() = InlineTensor(RandomF32(16 * 32, 1), 16, 32);
    r.mutable_options()->set_error_feedback(true);
    r.set_step(5);
    v1::CreateWeightReply rep;
    auto ctx = Context();
    ASSERT_TRUE(stub->CreateWeight(ctx.get(), r, &rep).ok());
    r.set_name("plain");
    r.mutable_options()->set_error_feedback(false);
    auto ctx2 = Context();
    ASSERT_TRUE(stub->CreateWeight(ctx2.get(), r, &rep).ok());
    ASSERT_TRUE(Qdq(*stub, InlineTensor(RandomF32(32, 2), 2, 16), "r", 3).ok());
  }
  v1::OpenSessionReply session;
  {
    v1::OpenSessionRequest r;
    r.set_client_name("bad-input-test");
    auto ctx = Context();
    ASSERT_TRUE(stub->OpenSession(ctx.get(), r, &session).ok());
  }
  const Snapshot before = Take(*stub);
  const std::vector<BadCase> cases = Cases();
  EXPECT_GE(cases.size(), 40u);
  for (const BadCase& c : cases) {
    grpc::Status s = c.call(*stub, session.session_id());
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("/tmp"))) << c.name;
  }
  // A repeated step is a safe retry: OK, applied=false.
  v1::UpdateWeightRequest dup;
  dup.set_name("w");
  dup.set_step(5);
  *dup.mutable_update() = InlineTensor(RandomF32(16 * 32, 3), 16, 32);
  v1::UpdateWeightReply dup_rep;
  auto ctx = Context();
  ASSERT_TRUE(stub->UpdateWeight(ctx.get(), dup, &dup_rep).ok());
  EXPECT_FALSE(dup_rep.applied());
  EXPECT_EQ(dup_rep.last_step(), 5);
  // Still serving, nothing changed.
  v1::ServerInfoReply info;
  auto ictx = Context();
  EXPECT_TRUE(stub->ServerInfo(ictx.get(), v1::ServerInfoRequest(), &info).ok());
  const Snapshot after = Take(*stub);
  EXPECT_EQ(after.listing, before.listing);
  EXPECT_EQ(after.w_codes, before.w_codes);
  EXPECT_EQ(after.w_residual, before.w_residual);
  EXPECT_EQ(after.plain_codes, before.plain_codes);
}

}  // namespace
}  // namespace fp4q::server::testing
