// End to end: every tensor RPC over the inline transport against the real fp4qd (CPU backend),
// results compared bit for bit with the CPU backend called in this process.
#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "e2e_util.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

class E2eOpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto p = ServerProcess::Start({"--backend=auto", "--workers=2"});
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = p->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    stub_ = server_->Stub();
  }
  static ServerProcess* server_;
  std::unique_ptr<v1::Fp4q::Stub> stub_;
};
ServerProcess* E2eOpsTest::server_ = nullptr;

// One quantization setting, in both the wire and the kernels spelling.
struct Case {
  std::string name;
  kernels::DType dtype;
  int64_t rows, cols;
  kernels::QuantizeOptions k;
  v1::QuantOptions p;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, kernels::DType dt, int64_t r, int64_t c, auto fill) {
    Case x{std::move(name), dt, r, c, {}, {}};
    fill(x.k, x.p);
    cases.push_back(x);
  };
  using K = kernels::QuantizeOptions;
  using P = v1::QuantOptions;
  add("nvfp4_1x16_f32", kernels::DType::kF32, 7, 48, [](K&, P&) {});
  add("nvfp4_16x16_bf16", kernels::DType::kBF16, 32, 64, [](K& k, P& p) {
    k.block = kernels::BlockShape::k16x16;
    p.set_block(v1::BLOCK_SHAPE_16X16);
  });
  add("nvfp4_sr", kernels::DType::kF32, 16, 64, [](K& k, P& p) {
    k.rounding = kernels::Rounding::kStochastic;
    k.seed = 1234;
    k.step = 7;
    p.set_rounding(v1::ROUNDING_STOCHASTIC);
    p.set_seed(1234);
    p.set_step(7);
  });
  add("nvfp4_rht_both_outputs", kernels::DType::kF32, 32, 64, [](K& k, P& p) {
    k.rht = kernels::RhtMode::kDefaultSigns;
    k.columnwise = true;
    p.set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
    p.set_outputs(v1::OUTPUTS_BOTH);
  });
  add("nvfp4_swizzled_caller_amax", kernels::DType::kF32, 5, 32, [](K& k, P& p) {
    k.scale_layout = kernels::ScaleLayout::kSwizzled;
    k.has_amax = true;
    k.amax = 3.0f;
    p.set_scale_layout(v1::SCALE_LAYOUT_SWIZZLED);
    p.set_amax(3.0f);
  });
  add("four_over_six_mse_448", kernels::DType::kBF16, 16, 32, [](K& k, P& p) {
    k.scale_selection = kernels::ScaleSelection::kFourOverSixMse;
    k.four_over_six_emax = 448.0f;
    p.set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE);
    p.set_four_over_six_emax(448.0f);
  });
  add("mxfp4_floor_bf16", kernels::DType::kBF16, 3, 64, [](K& k, P& p) {
    k.format = kernels::Format::kMxfp4;
    k.block = kernels::BlockShape::k1x32;
    k.mx_rule = kernels::MxScaleRule::kFloor;
    p.set_format(v1::FORMAT_MXFP4);
    p.set_mx_scale_rule(v1::MX_SCALE_RULE_FLOOR);
  });
  add("mxfp4_seeded_rht_sr_columnwise", kernels::DType::kF32, 32, 64, [](K& k, P& p) {
    k.format = kernels::Format::kMxfp4;
    k.block = kernels::BlockShape::k1x32;
    k.rht = kernels::RhtMode::kSeeded;
    k.rht_seed = 99;
    k.rounding = kernels::Rounding::kStochastic;
    k.seed = 5;
    k.rowwise = false;
    k.columnwise = true;
    p.set_format(v1::FORMAT_MXFP4);
    p.set_rht(v1::RHT_MODE_SEEDED);
    p.set_rht_seed(99);
    p.set_rounding(v1::ROUNDING_STOCHASTIC);
    p.set_seed(5);
    p.set_outputs(v1::OUTPUTS_COLUMNWISE);
  });
  return cases;
}

std::string Input(const Case& c, uint32_t seed) {
  return c.dtype == kernels::DType::kF32 ? RandomF32(c.rows * c.cols, seed, 2.0f)
                                         : RandomBF16(c.rows * c.cols, seed, 2.0f);
}
v1::DType Wire(kernels::DType d) {
  return d == kernels::DType::kF32 ? v1::DTYPE_F32 : v1::DTYPE_BF16;
}

void ExpectSame(const v1::QuantizedTensor& got, const HostQuantized& want, int64_t rows,
                int64_t cols, const std::string& what) {
  ASSERT_EQ(got.shape_size(), 2) << what;
  EXPECT_EQ(got.shape(0), rows) << what;
  EXPECT_EQ(got.shape(1), cols) << what;
  EXPECT_EQ(got.codes(), want.codes) << what << ": codes differ";
  EXPECT_EQ(got.scales(), want.scales) << what << ": scales differ";
  EXPECT_EQ(got.global_amax(), want.global[0]) << what;
  EXPECT_EQ(got.s_enc(), want.global[1]) << what;
}

// Creates a stored weight [rows, cols] from f32 bytes (NVFP4 1x16 RTN, CreateWeight's default).
void CreateWeight(v1::Fp4q::Stub* stub, const std::string& name, const std::string& f32,
                  int64_t rows, int64_t cols) {
  v1::CreateWeightRequest cw;
  cw.set_name(name);
  *cw.mutable_initial() = InlineTensor(f32, rows, cols);
  v1::CreateWeightReply cwr;
  auto ctx = Context();
  grpc::Status s = stub->CreateWeight(ctx.get(), cw, &cwr);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

void DeleteWeight(v1::Fp4q::Stub* stub, const std::string& name) {
  v1::DeleteWeightRequest del;
  del.set_name(name);
  v1::DeleteWeightReply delr;
  auto ctx = Context();
  EXPECT_TRUE(stub->DeleteWeight(ctx.get(), del, &delr).ok());
}

TEST_F(E2eOpsTest, QuantizeAndDequantizeMatchTheCpuBackendBitForBit) {
  uint32_t seed = 100;
  uint64_t epoch = 0;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string x = Input(c, ++seed);
    const RefQuantize ref = CpuQuantize(x, c.dtype, c.rows, c.cols, c.k);
    ASSERT_TRUE(ref.status.ok()) << ref.status;
    v1::QuantizeRequest req;
    *req.mutable_input() = InlineTensor(x, c.rows, c.cols, Wire(c.dtype));
    *req.mutable_options() = c.p;
    v1::QuantizeReply rep;
    auto ctx = Context();
    grpc::Status s = stub_->Quantize(ctx.get(), req, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.header().backend(), "cpu");
    EXPECT_EQ(rep.header().device_uuid(), "cpu");
    EXPECT_NE(rep.header().server_epoch(), 0u);
    // Where the time went: queue wait and kernel time lie within the server's time.
    EXPECT_GT(rep.header().server_micros(), 0.0);
    EXPECT_GE(rep.header().queue_micros(), 0.0);
    EXPECT_GE(rep.header().server_micros(),
              rep.header().queue_micros() + rep.header().kernel_micros());
    if (epoch != 0) EXPECT_EQ(rep.header().server_epoch(), epoch);
    epoch = rep.header().server_epoch();
    EXPECT_EQ(rep.has_rowwise(), c.k.rowwise);
    EXPECT_EQ(rep.has_columnwise(), c.k.columnwise);
    if (c.k.rowwise) ExpectSame(rep.rowwise(), ref.rowwise, c.rows, c.cols, "rowwise");
    if (c.k.columnwise) ExpectSame(rep.columnwise(), ref.columnwise, c.cols, c.rows, "columnwise");
    // Dequantize what came back (an inline operand), f32 and bf16.
    const v1::QuantizedTensor& q = c.k.rowwise ? rep.rowwise() : rep.columnwise();
    const HostQuantized& hq = c.k.rowwise ? ref.rowwise : ref.columnwise;
    const int64_t qr = c.k.rowwise ? c.rows : c.cols;
    const int64_t qc = c.k.rowwise ? c.cols : c.rows;
    for (v1::DType out : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
      v1::DequantizeRequest dreq;
      *dreq.mutable_input()->mutable_tensor() = q;
      dreq.set_out_dtype(out);
      v1::DequantizeReply drep;
      auto dctx = Context();
      grpc::Status ds = stub_->Dequantize(dctx.get(), dreq, &drep);
      ASSERT_TRUE(ds.ok()) << ds.error_message();
      auto want = CpuDequantize(
          hq, c.k, qr, qc, out == v1::DTYPE_F32 ? kernels::DType::kF32 : kernels::DType::kBF16);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(drep.output().inline_data(), *want) << "dequantized " << out;
      EXPECT_EQ(drep.output().dtype(), out);
      EXPECT_EQ(drep.output().shape(0), qr);
      EXPECT_EQ(drep.output().shape(1), qc);
    }
  }
}

TEST_F(E2eOpsTest, NanFilledInputQuantizesAsNumericsDefines) {
  // NUMERICS.md: NaN elements give code 0x7 and are ignored by the amax, so an all-NaN block
  // gets scale 0 and an all-NaN tensor amax 0 (S_enc 1).
  std::string x(2 * 16 * 4, '\0');
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 32; ++i) std::memcpy(x.data() + 4 * i, &nan, 4);
  v1::QuantizeRequest req;
  *req.mutable_input() = InlineTensor(x, 2, 16);
  v1::QuantizeReply rep;
  auto ctx = Context();
  ASSERT_TRUE(stub_->Quantize(ctx.get(), req, &rep).ok());
  const RefQuantize ref = CpuQuantize(x, kernels::DType::kF32, 2, 16, {});
  ExpectSame(rep.rowwise(), ref.rowwise, 2, 16, "nan");
  EXPECT_EQ(rep.rowwise().codes(), std::string(16, '\x77'));
  EXPECT_EQ(rep.rowwise().scales(), std::string(2, '\0'));
  EXPECT_EQ(rep.rowwise().global_amax(), 0.0f);
  EXPECT_EQ(rep.rowwise().s_enc(), 1.0f);
}

TEST_F(E2eOpsTest, InlineTensorsAboveFourMebibytes) {
  const int64_t rows = 1024, cols = 2048;  // 8 MiB of f32 in, 8 MiB of f32 back
  const std::string x = RandomF32(rows * cols, 7);
  v1::QdqRequest req;
  *req.mutable_input() = InlineTensor(x, rows, cols);
  v1::QdqReply rep;
  auto ctx = Context();
  grpc::Status s = stub_->Qdq(ctx.get(), req, &rep);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto want = CpuQdq(x, kernels::DType::kF32, rows, cols, {}, kernels::DType::kF32);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(rep.output().inline_data().size(), size_t{8} << 20);
  EXPECT_TRUE(rep.output().inline_data() == *want);
}

TEST_F(E2eOpsTest, QdqMatchesTheCpuBackend) {
  uint32_t seed = 300;
  for (const Case& c : Cases()) {
    if (c.k.columnwise || c.k.rht != kernels::RhtMode::kOff) continue;  // QDQ: row-wise, no RHT
    for (kernels::DType out : {kernels::DType::kF32, kernels::DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(c.name, " -> ", kernels::DTypeName(out)));
      const std::string x = Input(c, ++seed);
      v1::QdqRequest req;
      *req.mutable_input() = InlineTensor(x, c.rows, c.cols, Wire(c.dtype));
      *req.mutable_options() = c.p;
      req.set_out_dtype(Wire(out));
      v1::QdqReply rep;
      auto ctx = Context();
      grpc::Status s = stub_->Qdq(ctx.get(), req, &rep);
      ASSERT_TRUE(s.ok()) << s.error_message();
      auto want = CpuQdq(x, c.dtype, c.rows, c.cols, c.k, out);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(rep.output().inline_data(), *want);
      const RefQuantize ref = CpuQuantize(x, c.dtype, c.rows, c.cols, c.k);
      EXPECT_EQ(rep.global_amax(), ref.rowwise.global[0]);
    }
  }
}

TEST_F(E2eOpsTest, MatmulOfInlineOperandsAndOfAStoredWeight) {
  for (kernels::Format f : {kernels::Format::kNvfp4, kernels::Format::kMxfp4}) {
    SCOPED_TRACE(kernels::FormatName(f));
    kernels::QuantizeOptions o;
    o.format = f;
    o.block =
        f == kernels::Format::kMxfp4 ? kernels::BlockShape::k1x32 : kernels::BlockShape::k1x16;
    const int64_t m = 24, n = 40, k = 64;
    const std::string a = RandomF32(m * k, 11), b = RandomF32(n * k, 12);
    RefQuantize qa = CpuQuantize(a, kernels::DType::kF32, m, k, o);
    RefQuantize qb = CpuQuantize(b, kernels::DType::kF32, n, k, o);
    auto operand = [&](const HostQuantized& h, int64_t rows) {
      v1::QuantizedTensor t;
      t.set_format(f == kernels::Format::kMxfp4 ? v1::FORMAT_MXFP4 : v1::FORMAT_NVFP4);
      t.add_shape(rows);
      t.add_shape(k);
      t.set_global_amax(h.global[0]);
      t.set_s_enc(h.global[1]);
      t.set_codes(h.codes);
      t.set_scales(h.scales);
      return t;
    };
    for (kernels::DType out : {kernels::DType::kF32, kernels::DType::kBF16}) {
      v1::MatmulRequest req;
      *req.mutable_a()->mutable_tensor() = operand(qa.rowwise, m);
      *req.mutable_b()->mutable_tensor() = operand(qb.rowwise, n);
      req.set_out_dtype(Wire(out));
      v1::MatmulReply rep;
      auto ctx = Context();
      grpc::Status s = stub_->Matmul(ctx.get(), req, &rep);
      ASSERT_TRUE(s.ok()) << s.error_message();
      auto want = CpuMatmul(qa.rowwise, m, qb.rowwise, n, k, o, out);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(rep.output().inline_data(), *want);
      EXPECT_EQ(rep.output().shape(0), m);
      EXPECT_EQ(rep.output().shape(1), n);
    }
  }
  // B as a stored weight (NVFP4 1x16, created from b): same result as its quantization inline.
  const int64_t m = 8, n = 32, k = 32;
  const std::string a = RandomF32(m * k, 13), b = RandomF32(n * k, 14);
  ASSERT_NO_FATAL_FAILURE(CreateWeight(stub_.get(), "ops/matmul_b", b, n, k));
  RefQuantize qa = CpuQuantize(a, kernels::DType::kF32, m, k, {});
  RefQuantize qb = CpuQuantize(b, kernels::DType::kF32, n, k, {});
  v1::MatmulRequest req;
  v1::QuantizedTensor* ta = req.mutable_a()->mutable_tensor();
  ta->add_shape(m);
  ta->add_shape(k);
  ta->set_global_amax(qa.rowwise.global[0]);
  ta->set_s_enc(qa.rowwise.global[1]);
  ta->set_codes(qa.rowwise.codes);
  ta->set_scales(qa.rowwise.scales);
  req.mutable_b()->set_weight_name("ops/matmul_b");
  v1::MatmulReply rep;
  auto ctx = Context();
  grpc::Status s = stub_->Matmul(ctx.get(), req, &rep);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto want = CpuMatmul(qa.rowwise, m, qb.rowwise, n, k, {}, kernels::DType::kF32);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(rep.output().inline_data(), *want);
  DeleteWeight(stub_.get(), "ops/matmul_b");
}

// Matmul of dense operands (DenseOperand): each quantized by the server with exactly Quantize's
// numerics, row-wise (Q(x)) or column-wise (Q(x^T)), so the result is the CPU backend's GEMM of
// the two quantizations, bit for bit; and a dense A against a stored weight.
TEST_F(E2eOpsTest, MatmulOfDenseOperandsIsTheGemmOfTheirQuantizations) {
  struct Dense {
    kernels::QuantizeOptions k;
    v1::QuantOptions p;
  };
  Dense fwd_x, fwd_w, wgrad;  // nn.Linear's fprop operands, and wgrad's (RHT + SR, column-wise)
  fwd_w.k.block = kernels::BlockShape::k16x16;
  fwd_w.p.set_block(v1::BLOCK_SHAPE_16X16);
  wgrad.k.rht = kernels::RhtMode::kDefaultSigns;
  wgrad.k.rounding = kernels::Rounding::kStochastic;
  wgrad.k.seed = 77;
  wgrad.k.step = 3;
  wgrad.k.rowwise = false;
  wgrad.k.columnwise = true;
  wgrad.p.set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
  wgrad.p.set_rounding(v1::ROUNDING_STOCHASTIC);
  wgrad.p.set_seed(77);
  wgrad.p.set_step(3);
  wgrad.p.set_outputs(v1::OUTPUTS_COLUMNWISE);
  auto dense = [](v1::QuantizedOperand* op, const std::string& x, int64_t r, int64_t c,
                  kernels::DType dt, const v1::QuantOptions& o) {
    *op->mutable_dense()->mutable_tensor() = InlineTensor(x, r, c, Wire(dt));
    *op->mutable_dense()->mutable_options() = o;
  };
  const int64_t m = 24, n = 48, k = 64;
  for (kernels::DType out : {kernels::DType::kF32, kernels::DType::kBF16}) {
    SCOPED_TRACE(out == kernels::DType::kF32 ? "f32 out" : "bf16 out");
    {  // fprop: x [m, k] bf16 row-wise 1x16, W [n, k] f32 row-wise 16x16
      const std::string x = RandomBF16(m * k, 21, 2.0f), w = RandomF32(n * k, 22);
      RefQuantize qx = CpuQuantize(x, kernels::DType::kBF16, m, k, fwd_x.k);
      RefQuantize qw = CpuQuantize(w, kernels::DType::kF32, n, k, fwd_w.k);
      ASSERT_TRUE(qx.status.ok() && qw.status.ok());
      v1::MatmulRequest req;
      dense(req.mutable_a(), x, m, k, kernels::DType::kBF16, fwd_x.p);
      dense(req.mutable_b(), w, n, k, kernels::DType::kF32, fwd_w.p);
      req.set_out_dtype(Wire(out));
      v1::MatmulReply rep;
      auto ctx = Context();
      grpc::Status s = stub_->Matmul(ctx.get(), req, &rep);
      ASSERT_TRUE(s.ok()) << s.error_message();
      auto want = CpuMatmul(qx.rowwise, fwd_x.k, m, qw.rowwise, fwd_w.k, n, k, out);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(rep.output().inline_data(), *want);
      ASSERT_EQ(rep.output().shape_size(), 2);
      EXPECT_EQ(rep.output().shape(0), m);
      EXPECT_EQ(rep.output().shape(1), n);
    }
    {  // wgrad: dW [n, mw] = Q(H g^T) Q(H x^T)^T with g [tokens, n], x [tokens, mw]
      const int64_t tokens = 64, mw = 32;  // the quantizer takes 16-multiples on both axes
      const std::string g = RandomF32(tokens * n, 23), x = RandomBF16(tokens * mw, 24, 2.0f);
      RefQuantize qg = CpuQuantize(g, kernels::DType::kF32, tokens, n, wgrad.k);
      RefQuantize qx = CpuQuantize(x, kernels::DType::kBF16, tokens, mw, wgrad.k);
      ASSERT_TRUE(qg.status.ok()) << qg.status;
      ASSERT_TRUE(qx.status.ok()) << qx.status;
      v1::MatmulRequest req;
      dense(req.mutable_a(), g, tokens, n, kernels::DType::kF32, wgrad.p);
      dense(req.mutable_b(), x, tokens, mw, kernels::DType::kBF16, wgrad.p);
      req.set_out_dtype(Wire(out));
      v1::MatmulReply rep;
      auto ctx = Context();
      grpc::Status s = stub_->Matmul(ctx.get(), req, &rep);
      ASSERT_TRUE(s.ok()) << s.error_message();
      auto want = CpuMatmul(qg.columnwise, wgrad.k, n, qx.columnwise, wgrad.k, mw, tokens, out);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(rep.output().inline_data(), *want);
      EXPECT_EQ(rep.output().shape(0), n);
      EXPECT_EQ(rep.output().shape(1), mw);
    }
  }
  // A dense A against a stored weight (NVFP4 1x16 RTN, as CreateWeight quantizes).
  const std::string a = RandomF32(m * k, 25), b = RandomF32(n * k, 26);
  ASSERT_NO_FATAL_FAILURE(CreateWeight(stub_.get(), "ops/dense_b", b, n, k));
  RefQuantize qa = CpuQuantize(a, kernels::DType::kF32, m, k, {});
  RefQuantize qb = CpuQuantize(b, kernels::DType::kF32, n, k, {});
  v1::MatmulRequest req;
  dense(req.mutable_a(), a, m, k, kernels::DType::kF32, v1::QuantOptions());
  req.mutable_b()->set_weight_name("ops/dense_b");
  v1::MatmulReply rep;
  auto ctx = Context();
  grpc::Status s = stub_->Matmul(ctx.get(), req, &rep);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto want = CpuMatmul(qa.rowwise, m, qb.rowwise, n, k, {}, kernels::DType::kF32);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(rep.output().inline_data(), *want);
  DeleteWeight(stub_.get(), "ops/dense_b");
}

// A dense operand's refusals name its fields; nothing is computed.
TEST_F(E2eOpsTest, MatmulDenseOperandRefusalsNameTheField) {
  const int64_t m = 16, n = 32, k = 64;
  const std::string a = RandomF32(m * k, 31), b = RandomF32(n * k, 32);
  auto request = [&](auto edit) {
    v1::MatmulRequest req;
    *req.mutable_a()->mutable_dense()->mutable_tensor() = InlineTensor(a, m, k);
    *req.mutable_b()->mutable_dense()->mutable_tensor() = InlineTensor(b, n, k);
    edit(req);
    v1::MatmulReply rep;
    auto ctx = Context();
    return stub_->Matmul(ctx.get(), req, &rep);
  };
  struct Bad {
    std::string name;
    std::function<void(v1::MatmulRequest&)> edit;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"both outputs",
       [](v1::MatmulRequest& r) {
         r.mutable_a()->mutable_dense()->mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
       },
       "a.dense.options.outputs: OUTPUTS_BOTH, but an operand is one quantization"},
      {"error feedback",
       [](v1::MatmulRequest& r) {
         r.mutable_b()->mutable_dense()->mutable_options()->set_residual_key("r");
       },
       "b.dense.options.residual_key: set, but Matmul changes no state"},
      {"unknown block",
       [](v1::MatmulRequest& r) {
         r.mutable_a()->mutable_dense()->mutable_options()->set_block(
             static_cast<v1::BlockShape>(77));
       },
       "a.dense.options.block"},
      {"K mismatch (b column-wise: its K is shape[0])",
       [](v1::MatmulRequest& r) {
         r.mutable_b()->mutable_dense()->mutable_options()->set_outputs(v1::OUTPUTS_COLUMNWISE);
       },
       "b.dense.tensor.shape[0]"},
      {"dtype",
       [](v1::MatmulRequest& r) {
         r.mutable_a()->mutable_dense()->mutable_tensor()->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       "a.dense.tensor.dtype"},
      {"bytes short",
       [&](v1::MatmulRequest& r) {
         r.mutable_a()->mutable_dense()->mutable_tensor()->set_inline_data(a.substr(4));
       },
       "a.dense.tensor.inline_data"},
  };
  for (const Bad& c : bad) {
    SCOPED_TRACE(c.name);
    grpc::Status s = request(c.edit);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(request([](v1::MatmulRequest&) {}).ok());  // the unedited request runs
  // Dequantize takes no dense input.
  v1::DequantizeRequest dq;
  *dq.mutable_input()->mutable_dense()->mutable_tensor() = InlineTensor(a, m, k);
  v1::DequantizeReply dqr;
  auto ctx = Context();
  grpc::Status s = stub_->Dequantize(ctx.get(), dq, &dqr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("input.dense: Dequantize takes a quantized tensor"));
}

TEST_F(E2eOpsTest, ServerInfoAndHealth) {
  v1::ServerInfoReply info;
  auto ctx = Context();
  ASSERT_TRUE(stub_->ServerInfo(ctx.get(), v1::ServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.version(), "0.1.0");
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.gpus_size(), 0);
  EXPECT_EQ(info.limits().max_message_bytes(), 536870912u);
  EXPECT_EQ(info.limits().state_budget_bytes(), 4294967296u);
  EXPECT_EQ(info.limits().max_queue_depth(), 64u);
  EXPECT_EQ(info.limits().max_open_handles(), 1024u);
  EXPECT_EQ(info.limits().session_lease_seconds(), 30u);
  EXPECT_EQ(info.limits().fast_socket_max_frame_bytes(), 0u);  // no --fast_socket: none
  EXPECT_EQ(info.limits().fast_socket_reply_margin_bytes(), 0u);
  EXPECT_EQ(info.limits().fast_socket_reply_framing_bytes(), 0u);
  EXPECT_EQ(info.limits().fast_socket_max_heads_up_micros(), 0u);
  EXPECT_NE(info.server_epoch(), 0u);
  EXPECT_EQ(info.header().server_epoch(), info.server_epoch());
  EXPECT_THAT(info.supported_modes(), ::testing::Contains("nvfp4"));
  EXPECT_THAT(info.supported_modes(), ::testing::Contains("mxfp4"));
  EXPECT_THAT(info.supported_modes(), ::testing::Not(::testing::Contains("cuda_ipc")));
  auto health = server_->Health();
  for (const char* service : {"liveness", "readiness", ""}) {
    auto h = CheckHealth(*health, service);
    ASSERT_TRUE(h.ok()) << service << ": " << h.status();
    EXPECT_EQ(*h, grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  auto unknown = CheckHealth(*health, "nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fp4q::server::testing
