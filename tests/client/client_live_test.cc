// The client library against a real fp4qd (CPU backend, loopback, port 0): every RPC, the
// numerics checked against the golden vectors and an independent decode, the state lifecycle
// with idempotent steps, checkpoint + restart, and the server's errors as the client sees them.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fp4q/client/client.h"
#include "fp4q/client/session.h"
#include "fp4q/client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::ConnectTo;
using ::fp4q::client::testing::DecodeNvfp4;
using ::fp4q::client::testing::E2M1ToFloat;
using ::fp4q::client::testing::E4M3ToFloat;
using ::fp4q::client::testing::GoldenCase;
using ::fp4q::client::testing::ServerProcess;
using ::fp4q::client::testing::StartFp4qd;
using ::fp4q::client::testing::TempDir;
using ::fp4q::client::testing::ToFloats;
using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// Bitwise equality of float vectors (NaN == NaN), reporting the first mismatch.
::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

v1::DType WireDType(common::StDType d) {
  return d == common::StDType::kF32 ? v1::DTYPE_F32 : v1::DTYPE_BF16;
}

v1::QuantizedTensor GoldenTensor(const GoldenCase& g) {
  v1::QuantizedTensor q;
  q.set_format(v1::FORMAT_NVFP4);
  q.set_block(v1::BLOCK_SHAPE_1X16);  // 16x16 scales are stored per row (same decode)
  q.set_scale_layout(v1::SCALE_LAYOUT_PLAIN);
  q.add_shape(g.rows);
  q.add_shape(g.cols);
  q.set_global_amax(g.global_amax);
  q.set_s_enc(g.s_enc);
  q.set_codes(g.codes);
  q.set_scales(g.scales);
  return q;
}

class LiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    absl::StatusOr<std::unique_ptr<ServerProcess>> s =
        StartFp4qd({"--state_dir=" + dir_->path()});
    ASSERT_THAT(s, IsOk());
    server_ = s->release();
    absl::StatusOr<std::vector<GoldenCase>> g = testing::LoadGolden();
    ASSERT_THAT(g, IsOk());
    golden_ = new std::vector<GoldenCase>(*std::move(g));
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
    delete golden_;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    client_ = ConnectTo(server_->address());
    ASSERT_NE(client_, nullptr);
  }
  const GoldenCase& Golden(const std::string& key) {
    for (const GoldenCase& g : *golden_) {
      if (g.key == key) return g;
    }
    ADD_FAILURE() << "no golden case " << key;
    return golden_->front();
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  static std::vector<GoldenCase>* golden_;
  std::unique_ptr<Client> client_;
};
TempDir* LiveTest::dir_ = nullptr;
ServerProcess* LiveTest::server_ = nullptr;
std::vector<GoldenCase>* LiveTest::golden_ = nullptr;

TEST_F(LiveTest, ServerInfoHealthAndEpoch) {
  absl::StatusOr<v1::ServerInfoReply> info = client_->ServerInfo();
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->backend(), testing::TestBackend());
  EXPECT_FALSE(info->version().empty());
  EXPECT_NE(info->server_epoch(), 0u);
  EXPECT_EQ(info->limits().max_message_bytes(), 536870912u);
  EXPECT_EQ(info->limits().session_lease_seconds(), 30u);
  EXPECT_THAT(info->supported_modes(), ::testing::Contains("nvfp4"));
  EXPECT_EQ(client_->last_server_epoch(), info->server_epoch());
  EXPECT_EQ(client_->CheckHealth(kLivenessService).value_or(ServingStatus::kUnknown),
            ServingStatus::kServing);
  EXPECT_EQ(client_->CheckHealth(kReadinessService).value_or(ServingStatus::kUnknown),
            ServingStatus::kServing);
  EXPECT_EQ(client_->CheckHealth("").value_or(ServingStatus::kUnknown), ServingStatus::kServing);
}

TEST_F(LiveTest, QuantizeInlineReproducesEveryGoldenCase) {
  ASSERT_EQ(golden_->size(), 10u);
  for (const GoldenCase& g : *golden_) {
    v1::QuantizeRequest request;
    absl::StatusOr<v1::Tensor> x = InlineTensor(WireDType(g.x_dtype), {g.rows, g.cols}, g.x);
    ASSERT_THAT(x, IsOk());
    *request.mutable_input() = *x;
    request.mutable_options()->set_block(g.block == "16x16" ? v1::BLOCK_SHAPE_16X16
                                                            : v1::BLOCK_SHAPE_1X16);
    absl::StatusOr<v1::QuantizeReply> reply = client_->Quantize(request);
    ASSERT_THAT(reply, IsOk()) << g.key;
    const v1::QuantizedTensor& q = reply->rowwise();
    EXPECT_EQ(q.codes(), g.codes) << g.key;
    EXPECT_EQ(q.scales(), g.scales) << g.key;
    EXPECT_EQ(q.s_enc(), g.s_enc) << g.key;
    EXPECT_EQ(q.global_amax(), g.global_amax) << g.key;
    EXPECT_THAT(q.shape(), ::testing::ElementsAre(g.rows, g.cols));
    EXPECT_FALSE(reply->has_columnwise());
    EXPECT_EQ(reply->header().backend(), testing::TestBackend());
  }
}

TEST_F(LiveTest, DequantizeMatchesAnIndependentDecode) {
  for (const GoldenCase& g : *golden_) {
    const std::vector<float> expected = DecodeNvfp4(g.codes, g.scales, g.rows, g.cols, g.s_enc);
    v1::DequantizeRequest request;
    *request.mutable_input()->mutable_tensor() = GoldenTensor(g);
    absl::StatusOr<v1::DequantizeReply> f32 = client_->Dequantize(request);
    ASSERT_THAT(f32, IsOk()) << g.key;
    absl::StatusOr<std::vector<float>> got = ResultToF32(f32->output());
    ASSERT_THAT(got, IsOk());
    EXPECT_TRUE(SameBits(*got, expected)) << g.key;

    request.set_out_dtype(v1::DTYPE_BF16);
    absl::StatusOr<v1::DequantizeReply> bf16 = client_->Dequantize(request);
    ASSERT_THAT(bf16, IsOk()) << g.key;
    ASSERT_EQ(bf16->output().dtype(), v1::DTYPE_BF16);
    std::vector<float> rounded(expected.size());
    for (size_t i = 0; i < expected.size(); ++i) rounded[i] = Bf16ToF32(F32ToBf16(expected[i]));
    EXPECT_TRUE(SameBits(ResultToF32(bf16->output()).value(), rounded)) << g.key;
  }
}

TEST_F(LiveTest, QdqEqualsTheDecodeOfTheGoldenQuantization) {
  const GoldenCase& g = Golden("c02");
  v1::QdqRequest request;
  *request.mutable_input() = InlineTensor(v1::DTYPE_F32, {g.rows, g.cols}, g.x).value();
  absl::StatusOr<v1::QdqReply> reply = client_->Qdq(request);
  ASSERT_THAT(reply, IsOk());
  EXPECT_EQ(reply->global_amax(), g.global_amax);
  EXPECT_TRUE(SameBits(ResultToF32(reply->output()).value(),
                       DecodeNvfp4(g.codes, g.scales, g.rows, g.cols, g.s_enc)));
}

TEST_F(LiveTest, MatmulMatchesAnF64Reference) {
  const GoldenCase& a = Golden("c03");  // [32, 128] bf16 input
  const GoldenCase& b = Golden("c05");  // [16, 128]
  ASSERT_EQ(a.cols, b.cols);
  v1::MatmulRequest request;
  *request.mutable_a()->mutable_tensor() = GoldenTensor(a);
  *request.mutable_b()->mutable_tensor() = GoldenTensor(b);
  absl::StatusOr<v1::MatmulReply> reply = client_->Matmul(request);
  ASSERT_THAT(reply, IsOk());
  EXPECT_THAT(reply->output().shape(), ::testing::ElementsAre(a.rows, b.rows));
  auto element = [](const GoldenCase& g, int64_t r, int64_t c) {
    const uint8_t byte = static_cast<uint8_t>(g.codes[static_cast<size_t>((r * g.cols + c) / 2)]);
    const uint8_t code = c % 2 == 0 ? byte & 0xF : byte >> 4;
    const float sf =
        E4M3ToFloat(static_cast<uint8_t>(g.scales[static_cast<size_t>(r * (g.cols / 16) + c / 16)]));
    return static_cast<double>(E2M1ToFloat(code)) * static_cast<double>(sf);
  };
  std::vector<float> expected(static_cast<size_t>(a.rows * b.rows));
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t n = 0; n < b.rows; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < a.cols; ++k) acc += element(a, m, k) * element(b, n, k);
      acc = acc * static_cast<double>(1.0f / a.s_enc) * static_cast<double>(1.0f / b.s_enc);
      expected[static_cast<size_t>(m * b.rows + n)] = static_cast<float>(acc);
    }
  }
  const std::vector<float> got = ResultToF32(reply->output()).value();
  if (testing::TestBackend() == "cpu") {
    // The CPU reference is the definition (NUMERICS.md section 9): exact.
    EXPECT_TRUE(SameBits(got, expected));
  } else {
    // GPU paths accumulate in f32 in their own order: relative Frobenius error under 1e-5.
    ASSERT_EQ(got.size(), expected.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (double(got[i]) - expected[i]) * (double(got[i]) - expected[i]);
      den += double(expected[i]) * expected[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5);
  }
}

TEST_F(LiveTest, InlineTensorsAbove4MiB) {
  const int64_t rows = 1024, cols = 2048;  // 8 MiB of f32 each way
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(static_cast<float>(i) * 0.001f) * (1.0f + static_cast<float>(i % 7));
  }
  v1::QuantizeRequest q;
  *q.mutable_input() = InlineTensorF32(x, {rows, cols}).value();
  absl::StatusOr<v1::QuantizeReply> quantized = client_->Quantize(q);
  ASSERT_THAT(quantized, IsOk());
  v1::QdqRequest request;
  *request.mutable_input() = q.input();
  absl::StatusOr<v1::QdqReply> reply = client_->Qdq(request);
  ASSERT_THAT(reply, IsOk());
  ASSERT_EQ(reply->output().inline_data().size(), x.size() * 4);
  EXPECT_TRUE(SameBits(ResultToF32(reply->output()).value(),
                       DecodeNvfp4(quantized->rowwise().codes(), quantized->rowwise().scales(),
                                   rows, cols, quantized->rowwise().s_enc())));
}

TEST_F(LiveTest, WeightLifecycleWithIdempotentSteps) {
  const GoldenCase& g = Golden("c04");  // [32, 64] f32
  const std::string name = "live.lifecycle.w";
  v1::CreateWeightRequest create;
  create.set_name(name);
  *create.mutable_initial() = InlineTensor(v1::DTYPE_F32, {g.rows, g.cols}, g.x).value();
  create.mutable_options()->set_error_feedback(true);
  absl::StatusOr<v1::CreateWeightReply> created = client_->CreateWeight(create);
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(created->weight().name(), name);
  EXPECT_THAT(created->weight().shape(), ::testing::ElementsAre(32, 64));
  EXPECT_EQ(created->weight().last_step(), 0);
  EXPECT_THAT(client_->CreateWeight(create),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(name)));

  v1::GetWeightRequest get;
  get.set_name(name);
  get.set_dequantized(true);
  get.set_residual(true);
  get.set_quantized(true);
  absl::StatusOr<v1::GetWeightReply> w0 = client_->GetWeight(get);
  ASSERT_THAT(w0, IsOk());
  // The stored weight is the golden 1x16 RTN quantization of its initial value.
  EXPECT_EQ(w0->quantized().codes(), g.codes);
  EXPECT_EQ(w0->quantized().scales(), g.scales);
  EXPECT_TRUE(SameBits(ResultToF32(w0->dequantized()).value(),
                       DecodeNvfp4(g.codes, g.scales, g.rows, g.cols, g.s_enc)));

  std::vector<float> grad(static_cast<size_t>(g.rows * g.cols));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.01f * static_cast<float>(int(i % 13) - 6);
  v1::UpdateWeightRequest update;
  update.set_name(name);
  update.set_step(1);
  update.set_lr(0.5f);
  update.set_kind(v1::UPDATE_KIND_GRADIENT);
  update.set_return_dequantized(true);
  *update.mutable_update() = InlineTensorF32(grad, {g.rows, g.cols}).value();
  absl::StatusOr<UpdateWeightResult> u1 = client_->UpdateWeight(update);
  ASSERT_THAT(u1, IsOk());
  EXPECT_EQ(u1->outcome, UpdateOutcome::kApplied);
  EXPECT_EQ(u1->attempts, 1);
  EXPECT_EQ(u1->reply.last_step(), 1);
  const std::vector<float> after1 = ResultToF32(u1->reply.dequantized()).value();
  EXPECT_FALSE(SameBits(after1, ResultToF32(w0->dequantized()).value()));

  // The same step again: not applied, weight unchanged.
  absl::StatusOr<UpdateWeightResult> again = client_->UpdateWeight(update);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->outcome, UpdateOutcome::kAlreadyApplied);
  EXPECT_FALSE(again->reply.applied());
  EXPECT_EQ(again->reply.last_step(), 1);
  EXPECT_TRUE(SameBits(ResultToF32(again->reply.dequantized()).value(), after1));
  update.set_step(0);
  EXPECT_THAT(client_->UpdateWeight(update),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("step: 0 is older than"), HasSubstr(name))));

  absl::StatusOr<v1::GetWeightReply> w1 = client_->GetWeight(get);
  ASSERT_THAT(w1, IsOk());
  EXPECT_EQ(w1->weight().last_step(), 1);
  EXPECT_TRUE(SameBits(ResultToF32(w1->dequantized()).value(), after1));
  const std::vector<float> residual = ResultToF32(w1->residual()).value();
  ASSERT_EQ(residual.size(), grad.size());
  EXPECT_NE(std::count(residual.begin(), residual.end(), 0.0f),
            static_cast<std::ptrdiff_t>(residual.size()));

  absl::StatusOr<v1::ListTensorsReply> list = client_->ListTensors();
  ASSERT_THAT(list, IsOk());
  bool listed = false;
  for (const v1::TensorListing& t : list->tensors()) {
    if (t.name() == name && t.kind() == v1::TENSOR_KIND_WEIGHT) {
      listed = true;
      EXPECT_EQ(t.last_step(), 1);
      EXPECT_THAT(t.shape(), ::testing::ElementsAre(32, 64));
      EXPECT_GT(t.bytes(), 32u * 64u / 2u);
    }
  }
  EXPECT_TRUE(listed);

  v1::ResetResidualRequest reset;
  reset.set_name(name);
  ASSERT_THAT(client_->ResetResidual(reset), IsOk());
  const std::vector<float> zeroed = ResultToF32(client_->GetWeight(get).value().residual()).value();
  EXPECT_EQ(std::count(zeroed.begin(), zeroed.end(), 0.0f),
            static_cast<std::ptrdiff_t>(zeroed.size()));

  v1::DeleteWeightRequest del;
  del.set_name(name);
  ASSERT_THAT(client_->DeleteWeight(del), IsOk());
  EXPECT_THAT(client_->GetWeight(get), StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
  EXPECT_THAT(client_->DeleteWeight(del), StatusIs(absl::StatusCode::kNotFound, HasSubstr(name)));
}

TEST_F(LiveTest, BadInputsAreAnsweredWithCodeAndField) {
  std::vector<float> x(4 * 40, 1.0f);
  v1::QuantizeRequest q;
  *q.mutable_input() = InlineTensorF32(x, {4, 40}).value();
  EXPECT_THAT(client_->Quantize(q), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("40")));

  *q.mutable_input() = InlineTensorF32(x, {10, 16}).value();
  q.mutable_input()->mutable_inline_data()->resize(100);
  EXPECT_THAT(client_->Quantize(q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inline_data")));

  *q.mutable_input() = InlineTensorF32(std::vector<float>(32, 1.0f), {2, 16}).value();
  q.mutable_input()->set_dtype(v1::DTYPE_U8);
  q.mutable_input()->mutable_inline_data()->resize(32);
  EXPECT_THAT(client_->Quantize(q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input.dtype")));

  v1::GetWeightRequest get;
  get.set_name("live.no.such.weight");
  EXPECT_THAT(client_->GetWeight(get),
              StatusIs(absl::StatusCode::kNotFound, "name: no weight 'live.no.such.weight'"));

  v1::QuantizeRequest by_region;
  v1::RegionSlice slice;
  slice.set_region_id("deadbeef");
  *by_region.mutable_input() = RegionTensor(v1::DTYPE_F32, {16, 16}, slice).value();
  EXPECT_THAT(client_->Quantize(by_region),
              StatusIs(absl::StatusCode::kNotFound,
                       "input.region.region_id: no region 'deadbeef' in this session (no "
                       "'fp4q-session' metadata was sent)"));
  // The server keeps serving.
  EXPECT_THAT(client_->ServerInfo(), IsOk());
}

TEST_F(LiveTest, SessionsAndRegionRegistration) {
  SessionOptions options;
  options.client_name = "client_live_test";
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Open(*client_, options);
  ASSERT_THAT(s, IsOk());
  Session& session = **s;
  EXPECT_EQ(session.id().size(), 32u);
  EXPECT_EQ(session.lease_seconds(), 30u);
  EXPECT_EQ(session.KeepAlive().value_or(0), 30u);
  EXPECT_THAT(session.RegisterCudaRegion(std::string(63, 'h'), 4096, ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ipc_handle: 63 bytes, expected 64")));
  EXPECT_THAT(session.RegisterCudaRegion(std::string(64, 'h'), 4096, ""),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--allow_cuda_ipc")));

  v1::QuantizeRequest by_region;
  v1::RegionSlice slice;
  slice.set_region_id("deadbeef");
  *by_region.mutable_input() = RegionTensor(v1::DTYPE_F32, {16, 16}, slice).value();
  EXPECT_THAT(client_->Quantize(by_region, session.call_options()),
              StatusIs(absl::StatusCode::kNotFound,
                       "input.region.region_id: no region 'deadbeef' in this session"));
  EXPECT_THAT(session.UnregisterCudaRegion("deadbeef"),
              StatusIs(absl::StatusCode::kNotFound,
                       "region_id: no region 'deadbeef' in this session"));
  EXPECT_EQ(session.Close().value_or(99), 0u);
  CallOptions stale;
  stale.session_id = session.id();
  EXPECT_THAT(client_->KeepAlive({}, stale), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
}

// State written by Checkpoint survives a restart; the client sees the new epoch, and a
// repeated step is still recognised as applied.
TEST(LiveRestart, CheckpointRestartRestoresStateAndSteps) {
  TempDir dir;
  const std::string name = "live.restart.w";
  std::vector<float> init(32 * 32);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * static_cast<float>(int(i % 17) - 8);
  std::vector<float> before;
  uint64_t epoch1 = 0;
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        StartFp4qd({"--state_dir=" + dir.path()});
    ASSERT_THAT(server, IsOk());
    auto client = ConnectTo((*server)->address());
    v1::CreateWeightRequest create;
    create.set_name(name);
    *create.mutable_initial() = InlineTensorF32(init, {32, 32}).value();
    ASSERT_THAT(client->CreateWeight(create), IsOk());
    v1::UpdateWeightRequest update;
    update.set_name(name);
    update.set_step(3);
    update.set_kind(v1::UPDATE_KIND_DELTA);
    update.set_return_dequantized(true);
    *update.mutable_update() = InlineTensorF32(std::vector<float>(32 * 32, 0.25f), {32, 32}).value();
    absl::StatusOr<UpdateWeightResult> u = client->UpdateWeight(update);
    ASSERT_THAT(u, IsOk());
    before = ResultToF32(u->reply.dequantized()).value();
    absl::StatusOr<v1::CheckpointReply> ck = client->Checkpoint();
    ASSERT_THAT(ck, IsOk());
    EXPECT_EQ(ck->path(), "fp4q-state.ckpt");
    EXPECT_EQ(ck->tensors(), 1u);
    EXPECT_GT(ck->bytes(), 32u * 32u / 2u);
    epoch1 = client->last_server_epoch();
    EXPECT_EQ((*server)->Stop(), 0) << (*server)->Log();
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      StartFp4qd({"--state_dir=" + dir.path()});
  ASSERT_THAT(server, IsOk()) << "restart with the checkpoint";
  auto client = ConnectTo((*server)->address());
  absl::StatusOr<v1::ListTensorsReply> list = client->ListTensors();
  ASSERT_THAT(list, IsOk());
  ASSERT_EQ(list->tensors_size(), 1);
  EXPECT_EQ(list->tensors(0).name(), name);
  EXPECT_EQ(list->tensors(0).last_step(), 3);
  EXPECT_NE(client->last_server_epoch(), epoch1);
  EXPECT_NE(client->last_server_epoch(), 0u);
  v1::GetWeightRequest get;
  get.set_name(name);
  get.set_dequantized(true);
  EXPECT_TRUE(SameBits(ResultToF32(client->GetWeight(get).value().dequantized()).value(), before));
  v1::UpdateWeightRequest retry;
  retry.set_name(name);
  retry.set_step(3);
  retry.set_kind(v1::UPDATE_KIND_DELTA);
  *retry.mutable_update() = InlineTensorF32(std::vector<float>(32 * 32, 0.25f), {32, 32}).value();
  absl::StatusOr<UpdateWeightResult> r = client->UpdateWeight(retry);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kAlreadyApplied);
  retry.set_step(4);
  r = client->UpdateWeight(retry);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->outcome, UpdateOutcome::kApplied);
}

}  // namespace
}  // namespace fp4q::client
