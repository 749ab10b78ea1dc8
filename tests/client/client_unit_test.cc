// Client pieces that need no server: status conversion, tensor helpers, the CLI's argument
// parser and its S_dec -> S_enc inversion.
#include <grpcpp/support/status.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "args.h"
#include "file_convert.h"
#include "fp4q/client/client.h"
#include "fp4q/client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FromGrpcStatus, KeepsCodeAndMessage) {
  EXPECT_THAT(FromGrpcStatus(grpc::Status::OK), IsOk());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s =
        FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), "m" + std::to_string(code)));
    EXPECT_EQ(static_cast<int>(s.code()), code);
    EXPECT_EQ(s.message(), "m" + std::to_string(code));
  }
  EXPECT_THAT(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(99), "odd")),
              StatusIs(absl::StatusCode::kUnknown, "gRPC status code 99: odd"));
}

TEST(Tensors, InlineTensorChecksBytesAgainstDtypeAndShape) {
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 7.0f};
  absl::StatusOr<v1::Tensor> t = InlineTensorF32(v, {2, 3});
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->dtype(), v1::DTYPE_F32);
  EXPECT_THAT(t->shape(), ::testing::ElementsAre(2, 3));
  ASSERT_EQ(t->inline_data().size(), 24u);
  EXPECT_EQ(BytesToF32(t->inline_data()), v);

  EXPECT_THAT(InlineTensorF32(v, {4, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "inline_data has 24 bytes; dtype F32 shape [4, 3] needs 48"));
  EXPECT_THAT(InlineTensorF32(v, {2, -3}),
              StatusIs(absl::StatusCode::kInvalidArgument, "shape[1] = -3 is negative"));
  EXPECT_THAT(InlineTensor(v1::DTYPE_UNSPECIFIED, {1}, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "dtype DTYPE_UNSPECIFIED has no size"));
  EXPECT_THAT(NumElements({int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has more than 2^63-1 elements")));
  EXPECT_THAT(DenseBytes(v1::DTYPE_F32, {int64_t{1} << 61, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  const std::vector<uint16_t> bits = {0x3FC0, 0xC000};
  absl::StatusOr<v1::Tensor> b = InlineTensorBF16(bits, {1, 2});
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(b->inline_data(), std::string("\xC0\x3F\x00\xC0", 4));
}

TEST(Tensors, RegionTensorAndTarget) {
  v1::RegionSlice slice;
  slice.set_region_id("r7");
  slice.set_offset(4096);
  absl::StatusOr<v1::Tensor> t = RegionTensor(v1::DTYPE_BF16, {16, 32}, slice);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->region().region_id(), "r7");
  EXPECT_EQ(t->region().offset(), 4096u);
  EXPECT_TRUE(t->inline_data().empty());
  EXPECT_EQ(RegionTarget(slice).region().offset(), 4096u);
  slice.set_region_id("");
  EXPECT_THAT(RegionTensor(v1::DTYPE_F32, {1}, slice),
              StatusIs(absl::StatusCode::kInvalidArgument, "region.region_id is empty"));
}

TEST(Tensors, ResultToF32WidensBf16AndChecksSizes) {
  v1::TensorResult r;
  r.set_dtype(v1::DTYPE_BF16);
  r.add_shape(1);
  r.add_shape(3);
  const uint16_t bits[3] = {0x3F80, 0xC0A0, 0x7F80};  // 1, -5, +Inf
  r.set_inline_data(std::string(reinterpret_cast<const char*>(bits), 6));
  absl::StatusOr<std::vector<float>> v = ResultToF32(r);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ((*v)[0], 1.0f);
  EXPECT_EQ((*v)[1], -5.0f);
  EXPECT_EQ((*v)[2], std::numeric_limits<float>::infinity());
  r.add_shape(2);
  EXPECT_THAT(ResultToF32(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "result inline_data has 6 bytes; dtype BF16 shape "
                                       "[1, 3, 2] needs 12"));
  v1::TensorResult in_region;
  in_region.set_dtype(v1::DTYPE_F32);
  in_region.mutable_region()->set_region_id("r1");
  in_region.mutable_region()->set_offset(64);
  EXPECT_THAT(ResultToF32(in_region),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("written to region \"r1\" at offset 64")));
  v1::TensorResult u8;
  u8.set_dtype(v1::DTYPE_U8);
  EXPECT_THAT(ResultToF32(u8), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "result dtype U8 is not F32 or BF16"));
}

TEST(Tensors, HalfAndBfloatConversions) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC500), -5.0f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x0200), std::ldexp(1.0f, -15));
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3F80);     // exactly halfway: to even
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3F82);     // halfway above an odd: up to even
  EXPECT_EQ(F32ToBf16(std::nextafter(1.00390625f, 2.0f)), 0x3F81);  // just above halfway
  EXPECT_EQ(Bf16ToF32(F32ToBf16(-3.5f)), -3.5f);
  const uint16_t nan = F32ToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToF32(nan)));
}

// ---- CLI pieces.

TEST(CliArgs, ParsesValuesFlagsAndPositionals) {
  cli::ArgSpec spec;
  spec.valued = {"block", "seed"};
  spec.boolean = {"progress"};
  absl::StatusOr<cli::ParsedArgs> a =
      cli::ParseArgs({"x", "in.st", "--block", "16x16", "--seed=9", "--progress", "out.st"}, 1,
                     spec);
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->positional, ::testing::ElementsAre("in.st", "out.st"));
  EXPECT_EQ(a->values.at("block"), "16x16");
  EXPECT_EQ(cli::GetUint64(*a, "seed", 0).value(), 9u);
  EXPECT_EQ(a->flags.count("progress"), 1u);

  EXPECT_THAT(cli::ParseArgs({"--bogus"}, 0, spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown option '--bogus'"));
  EXPECT_THAT(cli::ParseArgs({"--block"}, 0, spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "option '--block' needs a value"));
  EXPECT_THAT(cli::ParseArgs({"--progress=yes"}, 0, spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "option '--progress' takes no value (got 'yes')"));
  EXPECT_THAT(cli::ParseArgs({"--seed", "1", "--seed", "2"}, 0, spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "option '--seed' given twice"));
  absl::StatusOr<cli::ParsedArgs> neg = cli::ParseArgs({"--seed", "-4"}, 0, spec);
  ASSERT_THAT(neg, IsOk());
  EXPECT_THAT(cli::GetUint64(*neg, "seed", 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "option '--seed' wants an unsigned integer, got '-4'"));
  absl::StatusOr<cli::ParsedArgs> choice = cli::ParseArgs({"--block", "8x8"}, 0, spec);
  EXPECT_THAT(cli::GetChoice(*choice, "block", {"1x16", "16x16"}, "1x16"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "option '--block' must be one of 1x16, 16x16; got '8x8'"));
  absl::StatusOr<cli::ParsedArgs> dashdash = cli::ParseArgs({"--", "--block"}, 0, spec);
  ASSERT_THAT(dashdash, IsOk());
  EXPECT_THAT(dashdash->positional, ::testing::ElementsAre("--block"));
}

TEST(CliArgs, GlobalParseStopsAtTheCommand) {
  cli::ArgSpec spec;
  spec.valued = {"server"};
  spec.stop_at_positional = true;
  absl::StatusOr<cli::ParsedArgs> a =
      cli::ParseArgs({"fp4q", "--server", "h:1", "quantize", "--block", "16x16"}, 1, spec);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->values.at("server"), "h:1");
  EXPECT_THAT(a->positional, ::testing::ElementsAre("quantize", "--block", "16x16"));
}

// RN(1/s_enc) -> s_enc: every encode scale the server can produce (RN(2688 / amax)) has its
// decode scale inverted exactly.
TEST(EncodeScaleFor, InvertsEveryServerDecodeScale) {
  int checked = 0;
  for (float amax : {1e-30f, 1e-6f, 0.1f, 0.3f, 1.0f, 3.0f, 6.0f, 7.25f, 448.0f, 1000.0f,
                     2688.0f, 1e6f, 2e38f}) {
    for (int k = 0; k < 200; ++k) {
      const float a = std::nextafter(amax, 0.0f) * (1.0f + static_cast<float>(k) * 1e-3f);
      const float s_enc = std::min(2688.0f / a, std::numeric_limits<float>::max());
      const float s_dec = 1.0f / s_enc;
      absl::StatusOr<cli::EncodeScale> e = cli::EncodeScaleFor(s_dec);
      ASSERT_THAT(e, IsOk());
      ASSERT_TRUE(e->exact) << "s_dec " << s_dec;
      ASSERT_EQ(1.0f / e->s_enc, s_dec) << "amax " << a;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 13 * 200);
  EXPECT_EQ(cli::EncodeScaleFor(1.0f).value().s_enc, 1.0f);
  EXPECT_THAT(cli::EncodeScaleFor(0.0f),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not finite and positive")));
  EXPECT_THAT(cli::EncodeScaleFor(-1.0f), StatusIs(absl::StatusCode::kInvalidArgument,
                                                   HasSubstr("not finite and positive")));
  EXPECT_THAT(cli::EncodeScaleFor(std::numeric_limits<float>::infinity()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not finite and positive")));
}

TEST(EncodeScaleFor, NearestWhenNoF32HasThatReciprocal) {
  // Search for a decode scale that no f32 maps to (they exist: 1/x skips some f32 values).
  int inexact = 0;
  float v = 1.5f;
  for (int i = 0; i < 100000 && inexact == 0; ++i, v = std::nextafter(v, 2.0f)) {
    absl::StatusOr<cli::EncodeScale> e = cli::EncodeScaleFor(v);
    ASSERT_THAT(e, IsOk());
    if (!e->exact) {
      ++inexact;
      const float back = 1.0f / e->s_enc;
      EXPECT_NE(back, v);
      // Nearest: neither neighbour of s_enc maps closer.
      for (float n : {std::nextafter(e->s_enc, 0.0f), std::nextafter(e->s_enc, 10.0f)}) {
        EXPECT_GE(std::fabs(1.0f / n - v), std::fabs(back - v));
      }
    }
  }
  EXPECT_EQ(inexact, 1) << "no f32 in [1.5, 2) lacked an exact reciprocal preimage";
}

}  // namespace
}  // namespace fp4q::client
