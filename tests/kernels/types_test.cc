// Names and size arithmetic of types.h.
#include "fp4q/kernels/types.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TypesTest, Names) {
  EXPECT_STREQ(DTypeName(DType::kF32), "f32");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(static_cast<DType>(9)), "unknown");
  EXPECT_STREQ(FormatName(Format::kMxfp4), "mxfp4");
  EXPECT_STREQ(BlockShapeName(BlockShape::k16x16), "16x16");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(static_cast<DType>(9)), 0u);
  EXPECT_EQ(BlockElems(Format::kNvfp4), 16);
  EXPECT_EQ(BlockElems(Format::kMxfp4), 32);
}

TEST(TypesTest, Sizes) {
  EXPECT_EQ(DenseBytes(7, 48, DType::kBF16, "x").value(), 7u * 48 * 2);
  EXPECT_EQ(CodeBytes(7, 48, "q").value(), 168u);
  EXPECT_EQ(ScaleBytes(7, 48, Format::kNvfp4, ScaleLayout::kPlain, "q").value(), 21u);
  EXPECT_EQ(ScaleBytes(7, 64, Format::kMxfp4, ScaleLayout::kPlain, "q").value(), 14u);
  EXPECT_EQ(ScaleBytes(7, 48, Format::kNvfp4, ScaleLayout::kSwizzled, "q").value(), 512u);
  EXPECT_EQ(ScaleBytes(300, 16 * 9, Format::kNvfp4, ScaleLayout::kSwizzled, "q").value(),
            384u * 12);
  EXPECT_THAT(ScaleBytes(7, 40, Format::kNvfp4, ScaleLayout::kPlain, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("q.cols: 40 is not a multiple of the block size 16")));
  EXPECT_THAT(CodeBytes(3, 7, "q"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("q.cols: 7 is odd")));
  EXPECT_THAT(
      DenseBytes(3, 7, static_cast<DType>(0), "y"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("y.dtype: 0 is not a valid dtype")));
}

}  // namespace
}  // namespace fp4q::kernels
