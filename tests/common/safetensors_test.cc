#include "fp4q/common/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fp4q/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::common {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

// A file from a literal header and `data_size` data bytes valued 0, 1, 2, ...
std::string MakeFile(const std::string& header, size_t data_size) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out += header;
  for (size_t i = 0; i < data_size; ++i) out.push_back(static_cast<char>(i));
  return out;
}

TEST(SafetensorsTest, ReadsHandWrittenFile) {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
      R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}})";
  auto f = SafetensorsFile::FromBytes(MakeFile(header, 11));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "b");  // header order
  EXPECT_EQ(*f->Metadata("k"), "v");
  EXPECT_THAT(f->Metadata("zz"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("metadata key \"zz\"")));
  auto b = f->Find("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->dtype, StDType::kU8);
  EXPECT_EQ((*b)->num_elements(), 3u);
  EXPECT_EQ(f->Data(**b), std::string("\x08\x09\x0a", 3));
  auto a = f->CopyTensor<uint32_t>("a", StDType::kF32);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<uint32_t>{0x03020100u, 0x07060504u}));
  EXPECT_THAT(f->CopyTensor<uint8_t>("a", StDType::kU8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"a\": dtype is F32, expected U8")));
  EXPECT_THAT(f->Find("c"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tensor \"c\" not found")));
}

TEST(SafetensorsTest, WriterMatchesReferenceLayoutAndRoundTrips) {
  SafetensorsWriter w;
  const std::vector<uint8_t> u8 = {1, 2, 3};
  const std::vector<float> f32 = {1.5f, -2.0f};
  const std::vector<double> f64 = {3.25};
  ASSERT_TRUE(
      w.Add("u", StDType::kU8, {3}, std::string(reinterpret_cast<const char*>(u8.data()), 3)).ok());
  ASSERT_TRUE(
      w.Add("f", StDType::kF32, {1, 2}, std::string(reinterpret_cast<const char*>(f32.data()), 8))
          .ok());
  ASSERT_TRUE(
      w.Add("d", StDType::kF64, {}, std::string(reinterpret_cast<const char*>(f64.data()), 8))
          .ok());
  w.SetMetadata("cases", R"([{"key":"c00"}])");
  const std::string bytes = w.Serialize();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  // Largest elements first, then by name: d (F64) at 0, f (F32) at 8, u (U8) at 16.
  const std::string expected_header = R"({"__metadata__":{"cases":"[{\"key\":\"c00\"}]"},)"
                                      R"("d":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                                      R"("f":{"dtype":"F32","shape":[1,2],"data_offsets":[8,16]},)"
                                      R"("u":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})";
  EXPECT_EQ(bytes.substr(8, expected_header.size()), expected_header);
  EXPECT_EQ(n, (expected_header.size() + 7) / 8 * 8);
  EXPECT_EQ(bytes.size(), 8 + n + 19);

  auto f = SafetensorsFile::FromBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->CopyTensor<float>("f", StDType::kF32), f32);
  EXPECT_EQ(*f->CopyTensor<double>("d", StDType::kF64), f64);
  EXPECT_EQ(*f->CopyTensor<uint8_t>("u", StDType::kU8), u8);
  auto cases = ParseJson(*f->Metadata("cases"));
  ASSERT_TRUE(cases.ok());
  EXPECT_EQ(cases->items()[0].Find("key")->text(), "c00");
}

TEST(SafetensorsTest, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  EXPECT_THAT(w.Add("x", StDType::kF32, {2, 3}, std::string(20, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"x\": shape [2, 3] of F32 needs 24 bytes, got 20")));
  EXPECT_THAT(w.Add("x", StDType::kF32, {-1}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape[0]: -1 is negative")));
  EXPECT_THAT(w.Add("__metadata__", StDType::kU8, {0}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid tensor name")));
  ASSERT_TRUE(w.Add("x", StDType::kU8, {1}, "a").ok());
  EXPECT_THAT(w.Add("x", StDType::kU8, {1}, "a"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"x\": added twice")));
}

TEST(SafetensorsTest, FileRoundTripAndMissingFile) {
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string path = std::string(tmpdir ? tmpdir : "/tmp") + "/fp4q_st_test_" +
                           std::to_string(::getpid()) + ".safetensors";
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("t", StDType::kI32, {2}, std::string("\x01\0\0\0\xff\xff\xff\xff", 8)).ok());
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = SafetensorsFile::ReadFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->CopyTensor<int32_t>("t", StDType::kI32), (std::vector<int32_t>{1, -1}));
  std::remove(path.c_str());
  EXPECT_THAT(SafetensorsFile::ReadFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("cannot open")));
}

TEST(SafetensorsTest, ReadsGoldenFile) {
  const char* env = std::getenv("FP4Q_GOLDEN_DIR");
  const std::string dir = env != nullptr && *env != '\0' ? env : FP4Q_GOLDEN_DIR;
  auto f = SafetensorsFile::ReadFile(dir + "/nvfp4_rtn_public.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  auto cases_text = f->Metadata("cases");
  ASSERT_TRUE(cases_text.ok());
  auto cases = ParseJson(*cases_text);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_TRUE(cases->is_array());
  ASSERT_GE(cases->items().size(), 10u);
  EXPECT_EQ(cases->items()[0].Find("key")->text(), "c00");
  auto x = f->Find("c00.x");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ((*x)->shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ((*x)->dtype, StDType::kF32);
}

struct Malformed {
  const char* name;
  std::string file;
  const char* message;
};

std::vector<Malformed> MalformedFiles() {
  const std::string ok_entry = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32
  std::string short_len = MakeFile("{}", 0);
  short_len[0] = 50;  // header length 50 in a 10-byte file
  return {
      {"Short", "abc", "file of 3 bytes is shorter than the 8-byte header length"},
      {"HugeHeaderLength", huge_len, "header length 4294967296 exceeds the limit"},
      {"HeaderBeyondFile", short_len, "header length 50 exceeds the 2 bytes"},
      {"BadJson", MakeFile("{\"a\":", 0), "header: json: offset 5"},
      {"NotObject", MakeFile("[1]", 0), "header is a array, expected an object"},
      {"EntryNotObject", MakeFile(R"({"a":3})", 0), "tensor \"a\": entry is a number"},
      {"UnknownKey", MakeFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1}})", 0),
       "tensor \"a\": unknown key \"x\""},
      {"MissingDtype", MakeFile(R"({"a":{"shape":[0],"data_offsets":[0,0]}})", 0),
       "tensor \"a\": missing \"dtype\""},
      {"UnknownDtype", MakeFile(R"({"a":{"dtype":"F128","shape":[0],"data_offsets":[0,0]}})", 0),
       "tensor \"a\": unknown dtype \"F128\""},
      {"NegativeDim", MakeFile(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
       "tensor \"a\": shape[0]: -1 is negative"},
      {"FractionalDim", MakeFile(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", 0),
       "tensor \"a\": shape[0]: 1.5 is not an integer"},
      {"OffsetsNotPair", MakeFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
       "\"data_offsets\" is not an array of two integers"},
      {"Reversed", MakeFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
       "tensor \"a\": data_offsets [4, 0] are reversed"},
      {"BeyondData", MakeFile(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4),
       "tensor \"a\": data_offsets [0, 8] end beyond the data section of 4 bytes"},
      {"SizeMismatch", MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
       "tensor \"a\": shape [2] of F32 needs 8 bytes but data_offsets [0, 4] hold 4"},
      {"ShapeOverflow",
       MakeFile(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
       "tensor \"a\": shape [4294967296, 4294967296] overflows the byte size"},
      {"Overlap",
       MakeFile("{" + ok_entry + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
       "data_offsets [2, 4] overlap tensor \"a\" ending at 4"},
      {"Gap", MakeFile(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
       "tensor \"a\": data_offsets [2, 4] leave a gap: the previous tensor ends at 0"},
      {"TrailingData", MakeFile("{" + ok_entry + "}", 6),
       "the tensors cover 4 bytes of a data section of 6 bytes"},
      {"MetadataNotString", MakeFile(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__ value of \"k\" is a number, expected a string"},
      {"MetadataNotObject", MakeFile(R"({"__metadata__":"x"})", 0),
       "__metadata__ is a string, expected an object"},
      {"EmptyName", MakeFile(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", 0),
       "empty tensor name"},
      {"DuplicateName", MakeFile("{" + ok_entry + "," + ok_entry + "}", 4), "duplicate key \"a\""},
  };
}

class SafetensorsMalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformedTest, RejectedWithPreciseError) {
  EXPECT_THAT(SafetensorsFile::FromBytes(GetParam().file),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(Files, SafetensorsMalformedTest, ::testing::ValuesIn(MalformedFiles()),
                         [](const ::testing::TestParamInfo<Malformed>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace fp4q::common
