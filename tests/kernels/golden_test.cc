// Reproduces every case of tests/data/golden/nvfp4_rtn_public.safetensors byte for byte: packed
// codes, E4M3 scale bytes, the global amax and S_enc, for f32 and bf16 inputs and 1x16 and
// 16x16 blocks. The cases are those the file's `__metadata__.cases` lists (it may grow).
#include <cstdint>
#include <string>
#include <vector>

#include "fp4q/common/json.h"
#include "fp4q/common/safetensors.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/test_util.h"

namespace fp4q::kernels {
namespace {

using common::JsonValue;
using common::SafetensorsFile;
using common::StDType;
using testing::OwnedQuantized;

// Index of the first differing byte, or -1.
int64_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string Field(const JsonValue& c, const char* key) {
  const JsonValue* v = c.Find(key);
  return v != nullptr && v->is_string() ? v->text() : "";
}

TEST(GoldenTest, ReproducesEveryCaseByteForByte) {
  const std::string path = testing::GoldenDir() + "/nvfp4_rtn_public.safetensors";
  auto file = SafetensorsFile::ReadFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto cases_text = file->Metadata("cases");
  ASSERT_TRUE(cases_text.ok()) << cases_text.status();
  auto cases = common::ParseJson(*cases_text);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_TRUE(cases->is_array());
  ASSERT_GE(cases->items().size(), 10u) << "the public set has at least 10 cases";

  auto backend = CreateCpuBackend();
  int seen_bf16 = 0, seen_f32 = 0, seen_1x16 = 0, seen_16x16 = 0;
  for (const JsonValue& c : cases->items()) {
    const std::string key = Field(c, "key");
    const std::string block_name = Field(c, "block");
    const std::string dtype_name = Field(c, "dtype");
    SCOPED_TRACE("case " + key + " (" + Field(c, "dist") + ", " + block_name + ", " + dtype_name +
                 ")");
    ASSERT_FALSE(key.empty());
    ASSERT_TRUE(c.Find("rows") != nullptr && c.Find("cols") != nullptr);
    const auto rows_or = c.Find("rows")->AsInt64();
    const auto cols_or = c.Find("cols")->AsInt64();
    ASSERT_TRUE(rows_or.ok() && cols_or.ok());
    const int64_t rows = *rows_or, cols = *cols_or;
    ASSERT_TRUE(rows >= 1 && cols >= 16 && cols % 16 == 0) << rows << "x" << cols;
    ASSERT_TRUE(block_name == "1x16" || block_name == "16x16");
    const BlockShape block = block_name == "16x16" ? BlockShape::k16x16 : BlockShape::k1x16;
    (block == BlockShape::k16x16 ? seen_16x16 : seen_1x16)++;

    auto x_info = file->Find(key + ".x");
    ASSERT_TRUE(x_info.ok()) << x_info.status();
    ASSERT_EQ((*x_info)->shape, (std::vector<int64_t>{rows, cols}));
    std::vector<float> x_f32;
    std::vector<uint16_t> x_bf16;
    ConstTensor x;
    if ((*x_info)->dtype == StDType::kBF16) {
      ASSERT_EQ(dtype_name, "torch.bfloat16");
      x_bf16 = file->CopyTensor<uint16_t>(key + ".x", StDType::kBF16).value();
      x = testing::Bf16View(x_bf16, rows, cols);
      ++seen_bf16;
    } else {
      ASSERT_EQ(dtype_name, "torch.float32");
      x_f32 = file->CopyTensor<float>(key + ".x", StDType::kF32).value();
      x = testing::F32View(x_f32, rows, cols);
      ++seen_f32;
    }
    const auto codes = file->CopyTensor<uint8_t>(key + ".codes", StDType::kU8).value();
    const auto scales = file->CopyTensor<uint8_t>(key + ".scales", StDType::kU8).value();
    const auto amax = file->CopyTensor<uint32_t>(key + ".global_amax", StDType::kF32).value();
    const auto s_enc = file->CopyTensor<uint32_t>(key + ".s_enc", StDType::kF32).value();
    ASSERT_EQ(codes.size(), static_cast<size_t>(rows * cols / 2));
    ASSERT_EQ(scales.size(), static_cast<size_t>(rows * cols / 16));

    QuantizeOptions options;
    options.block = block;
    OwnedQuantized q(Format::kNvfp4, block, ScaleLayout::kPlain, rows, cols);
    ASSERT_TRUE(testing::QuantizeInto(*backend, x, options, &q).ok());
    EXPECT_EQ(FirstDifference(q.codes, codes), -1) << "codes differ";
    EXPECT_EQ(FirstDifference(q.scales, scales), -1) << "scales differ";
    EXPECT_EQ(testing::Bits(q.global[0]), amax[0]) << "global amax differs";
    EXPECT_EQ(testing::Bits(q.global[1]), s_enc[0]) << "S_enc differs";

    // The same bytes when the golden amax is given by the caller.
    options.has_amax = true;
    options.amax = testing::FromBits(amax[0]);
    OwnedQuantized given(Format::kNvfp4, block, ScaleLayout::kPlain, rows, cols);
    ASSERT_TRUE(testing::QuantizeInto(*backend, x, options, &given).ok());
    EXPECT_EQ(given.codes, codes);
    EXPECT_EQ(given.scales, scales);
  }
  EXPECT_GT(seen_bf16, 0);
  EXPECT_GT(seen_f32, 0);
  EXPECT_GT(seen_1x16, 0);
  EXPECT_GT(seen_16x16, 0);
}

}  // namespace
}  // namespace fp4q::kernels
