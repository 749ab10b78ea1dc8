// The fp4q CLI end to end against a real fp4qd (CPU backend): health/info/list/checkpoint,
// `fp4q quantize` reproducing the golden codes and scales byte for byte, dequantize round
// trips, chunked == one-shot, stochastic rounding, F16 inputs, progress, and errors. What is
// selected, refused and written for inference engines: cli_select_test.cc and
// cli_checkpoint_test.py.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/client/client.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::ConnectTo;
using ::fp4q::client::testing::DecodeNvfp4;
using ::fp4q::client::testing::GoldenCase;
using ::fp4q::client::testing::RunResult;
using ::fp4q::client::testing::ServerProcess;
using ::fp4q::client::testing::StartFp4qd;
using ::fp4q::client::testing::TempDir;
using ::fp4q::common::SafetensorsFile;
using ::fp4q::common::SafetensorsWriter;
using ::fp4q::common::StDType;
using ::fp4q::testing::IsOk;
using ::testing::HasSubstr;

std::string FloatBytes(const std::vector<float>& v) { return F32Bytes(v); }

float ReadFloat(const SafetensorsFile& f, const std::string& name) {
  float v = std::nanf("");
  auto t = f.Find(name);
  if (t.ok() && (*t)->num_bytes() == 4) std::memcpy(&v, f.Data(**t).data(), 4);
  return v;
}

std::string Bytes(const SafetensorsFile& f, const std::string& name) {
  auto t = f.Find(name);
  return t.ok() ? std::string(f.Data(**t)) : std::string("<missing " + name + ">");
}

std::string ReadAll(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::ReadFile(path);
  if (!f.ok()) return "";
  SafetensorsWriter w;
  for (const auto& t : f->tensors()) (void)w.Add(t.name, t.dtype, t.shape, f->Data(t));
  for (const auto& [k, v] : f->metadata()) w.SetMetadata(k, v);
  return w.Serialize();
}

class CliLiveTest : public ::testing::Test {
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
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {testing::CliPath(), "--server", server_->address()});
    absl::StatusOr<RunResult> r = testing::Run(args, {"FP4Q_TOKEN="});
    EXPECT_THAT(r, IsOk());
    return r.ok() ? *r : RunResult{};
  }

  // The golden inputs of one block shape as "cNN.x", plus pass-through tensors when `extras`.
  std::string WriteGoldenInput(const std::string& block, bool extras) {
    SafetensorsWriter w;
    for (const GoldenCase& g : *golden_) {
      if (g.block != block) continue;
      EXPECT_THAT(w.Add(g.key + ".x", g.x_dtype, {g.rows, g.cols}, g.x), IsOk());
    }
    if (extras) {
      EXPECT_THAT(w.Add("bias", StDType::kF32, {5}, FloatBytes({1, -2, 3, -4, 5})), IsOk());
      std::vector<float> odd(30);
      for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<float>(i) - 7.5f;
      EXPECT_THAT(w.Add("odd", StDType::kF32, {3, 10}, FloatBytes(odd)), IsOk());
      EXPECT_THAT(w.Add("ids", StDType::kI64, {2, 16}, std::string(2 * 16 * 8, '\x01')), IsOk());
    }
    w.SetMetadata("format", "pt");
    w.SetMetadata("origin", "cli_test");
    const std::string path = dir_->File("golden_" + block + (extras ? "_extras" : "") +
                                        ".safetensors");
    EXPECT_THAT(w.WriteFile(path), IsOk());
    return path;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  static std::vector<GoldenCase>* golden_;
};
TempDir* CliLiveTest::dir_ = nullptr;
ServerProcess* CliLiveTest::server_ = nullptr;
std::vector<GoldenCase>* CliLiveTest::golden_ = nullptr;

TEST_F(CliLiveTest, HealthInfoListCheckpoint) {
  RunResult r = Cli({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "liveness   SERVING\nreadiness  SERVING\n");

  r = Cli({"info"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("backend          " + testing::TestBackend() + "\n"));
  EXPECT_THAT(r.out, HasSubstr("max message        512.0 MiB (536870912 bytes)"));
  if (testing::TestBackend() == "cpu") {
    EXPECT_THAT(r.out, HasSubstr("gpus             (none)"));
  } else {
    EXPECT_THAT(r.out, ::testing::ContainsRegex("gpus             [1-9]\n  GPU-[0-9a-f-]{36}  "));
  }

  auto client = ConnectTo(server_->address());
  v1::CreateWeightRequest create;
  create.set_name("cli.list.w");
  *create.mutable_initial() = InlineTensorF32(std::vector<float>(16 * 32, 0.5f), {16, 32}).value();
  create.set_step(41);
  ASSERT_THAT(client->CreateWeight(create), IsOk());
  r = Cli({"list"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("NAME"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("cli\\.list\\.w +weight +\\[16, 32\\] +U8 +[0-9]+ +"
                                              "(cpu|GPU-[0-9a-f-]{36}) +41\n"));

  r = Cli({"checkpoint"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::MatchesRegex("checkpoint fp4q-state\\.ckpt: [1-9][0-9]* bytes, "
                                             "[1-9][0-9]* tensors\n"));
  v1::DeleteWeightRequest del;
  del.set_name("cli.list.w");
  EXPECT_THAT(client->DeleteWeight(del), IsOk());
}

TEST_F(CliLiveTest, QuantizeReproducesTheGoldenCodesAndScalesByteForByte) {
  int checked = 0;
  for (const std::string block : {"1x16", "16x16"}) {
    const std::string in = WriteGoldenInput(block, /*extras=*/true);
    const std::string out = dir_->File("golden_out_" + block + ".safetensors");
    RunResult r = Cli({"quantize", in, out, "--block", block, "--skip-unsupported"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const int n = block == "1x16" ? 8 : 2;
    EXPECT_EQ(r.out, absl::StrCat("quantized ", n, " tensor(s), copied 3 (0 excluded, 1 "
                                  "unsupported), in ", n, " request(s) -> ", out, "\nwrote ",
                                  dir_->File("hf_quant_config.json"), "\n"));
    EXPECT_EQ(r.err, "fp4q quantize: skipped (unsupported, copied unquantized) \"odd\" [3, 10] "
                     "F32: cols 10 is not a multiple of 16\n");
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::ReadFile(out);
    ASSERT_THAT(f, IsOk());
    for (const GoldenCase& g : *golden_) {
      if (g.block != block) continue;
      const std::string t = g.key + ".x";
      auto codes = f->Find(t);
      auto scales = f->Find(t + "_scale");
      auto scale2 = f->Find(t + "_scale_2");
      ASSERT_THAT(codes, IsOk());
      ASSERT_THAT(scales, IsOk());
      ASSERT_THAT(scale2, IsOk());
      EXPECT_EQ((*codes)->dtype, StDType::kU8);
      EXPECT_THAT((*codes)->shape, ::testing::ElementsAre(g.rows, g.cols / 2));
      EXPECT_EQ((*scales)->dtype, StDType::kF8E4M3);
      EXPECT_THAT((*scales)->shape, ::testing::ElementsAre(g.rows, g.cols / 16));
      EXPECT_EQ((*scale2)->dtype, StDType::kF32);
      EXPECT_THAT((*scale2)->shape, ::testing::ElementsAre(1));
      EXPECT_EQ(Bytes(*f, t), g.codes) << t;
      EXPECT_EQ(Bytes(*f, t + "_scale"), g.scales) << t;
      const float s_dec = 1.0f / g.s_enc;
      const float got = ReadFloat(*f, t + "_scale_2");
      EXPECT_EQ(std::memcmp(&got, &s_dec, 4), 0) << t << ": " << got << " vs RN(1/s_enc) " << s_dec;
      ++checked;
    }
    // Pass-through tensors and metadata unchanged.
    absl::StatusOr<SafetensorsFile> src = SafetensorsFile::ReadFile(in);
    ASSERT_THAT(src, IsOk());
    for (const char* name : {"bias", "odd", "ids"}) {
      EXPECT_EQ(Bytes(*f, name), Bytes(*src, name)) << name;
      EXPECT_EQ((*f->Find(name))->dtype, (*src->Find(name))->dtype) << name;
      EXPECT_EQ((*f->Find(name))->shape, (*src->Find(name))->shape) << name;
    }
    // The input's metadata, plus the record of how it was quantized.
    std::map<std::string, std::string> expected = src->metadata();
    expected["fp4q.format"] = "nvfp4";
    expected["fp4q.block"] = block;
    expected["fp4q.rounding"] = "rtn";
    expected["fp4q.rht"] = "off";
    expected["fp4q.scale_selection"] = "map6";
    expected["fp4q.input_scale"] = "1";
    expected["fp4q.scale_groups"] = "{}";
    std::string dtypes;
    for (const GoldenCase& g : *golden_) {
      if (g.block != block) continue;
      absl::StrAppend(&dtypes, dtypes.empty() ? "" : ", ", "\"", g.key, ".x\": \"",
                      common::StDTypeName(g.x_dtype), "\"");
    }
    expected["fp4q.original_dtypes"] = "{" + dtypes + "}";
    EXPECT_EQ(f->metadata(), expected);
    EXPECT_EQ(f->tensors().size(), static_cast<size_t>(3 * n + 3));
  }
  EXPECT_EQ(checked, 10);
}

TEST_F(CliLiveTest, DequantizeRoundTrip) {
  const std::string in = WriteGoldenInput("1x16", /*extras=*/true);
  const std::string q = dir_->File("rt_q.safetensors");
  const std::string d = dir_->File("rt_d.safetensors");
  const std::string b = dir_->File("rt_b.safetensors");
  ASSERT_EQ(Cli({"quantize", in, q, "--skip-unsupported"}).exit_code, 0);
  RunResult r = Cli({"dequantize", q, d});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("dequantized 8 tensor(s), copied 3, in 8 request(s) -> ", d, "\n"));
  ASSERT_EQ(Cli({"dequantize", q, b, "--dtype", "bf16"}).exit_code, 0);
  absl::StatusOr<SafetensorsFile> fd = SafetensorsFile::ReadFile(d);
  absl::StatusOr<SafetensorsFile> fb = SafetensorsFile::ReadFile(b);
  absl::StatusOr<SafetensorsFile> src = SafetensorsFile::ReadFile(in);
  ASSERT_THAT(fd, IsOk());
  ASSERT_THAT(fb, IsOk());
  for (const GoldenCase& g : *golden_) {
    if (g.block != "1x16") continue;
    const std::string t = g.key + ".x";
    const std::vector<float> expected = DecodeNvfp4(g.codes, g.scales, g.rows, g.cols, g.s_enc);
    auto info = fd->Find(t);
    ASSERT_THAT(info, IsOk());
    EXPECT_EQ((*info)->dtype, StDType::kF32);
    EXPECT_THAT((*info)->shape, ::testing::ElementsAre(g.rows, g.cols));
    EXPECT_EQ(Bytes(*fd, t), F32Bytes(expected)) << t;
    std::string bf16;
    for (float v : expected) {
      const uint16_t h = F32ToBf16(v);
      bf16.append(reinterpret_cast<const char*>(&h), 2);
    }
    EXPECT_EQ((*fb->Find(t))->dtype, StDType::kBF16);
    EXPECT_EQ(Bytes(*fb, t), bf16) << t;
    EXPECT_FALSE(fd->Find(t + "_scale").ok());
    EXPECT_FALSE(fd->Find(t + "_scale_2").ok());
    // And close to the original: relative Frobenius error of NVFP4 on normal data ~ 0.1.
    if (g.key == "c00" || g.key == "c09") {
      const std::vector<float> x = testing::ToFloats(g.x_dtype, g.x);
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        num += (double(expected[i]) - x[i]) * (double(expected[i]) - x[i]);
        den += double(x[i]) * x[i];
      }
      EXPECT_LT(std::sqrt(num / den), 0.15) << t;
      EXPECT_GT(std::sqrt(num / den), 0.0) << t;
    }
  }
  EXPECT_EQ(Bytes(*fd, "bias"), Bytes(*src, "bias"));
  EXPECT_EQ(Bytes(*fd, "odd"), Bytes(*src, "odd"));
  EXPECT_EQ(fd->metadata(), src->metadata());
}

TEST_F(CliLiveTest, ChunkedRequestsGiveIdenticalFiles) {
  const std::string in1 = WriteGoldenInput("1x16", false);
  const std::string in16 = WriteGoldenInput("16x16", false);
  struct Case {
    std::string in;
    std::vector<std::string> options;
    std::string limit;
  } cases[] = {
      {in1, {}, "5000"},
      {in16, {"--block", "16x16"}, "10000"},
      {in1, {"--rht", "default"}, "3000"},
      {in1, {"--rht", "seeded", "--rht-seed", "99"}, "3000"},
      {in1, {"--scale-selection", "4over6-mse", "--emax", "448"}, "3000"},
  };
  std::string plain_1x16;
  int index = 0;
  for (const Case& c : cases) {
    const std::string one = dir_->File(absl::StrCat("one_", index, ".safetensors"));
    const std::string chunked = dir_->File(absl::StrCat("chunked_", index, ".safetensors"));
    std::vector<std::string> a = {"quantize", c.in, one};
    a.insert(a.end(), c.options.begin(), c.options.end());
    RunResult r1 = Cli(a);
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    a[2] = chunked;
    a.push_back("--max-request-bytes");
    a.push_back(c.limit);
    RunResult r2 = Cli(a);
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    // More requests than tensors: it did chunk.
    int tensors = 0, requests = 0;
    ASSERT_EQ(std::sscanf(r2.out.c_str(), "quantized %d tensor(s), copied 0, in %d", &tensors,
                          &requests), 2) << r2.out;
    EXPECT_GT(requests, tensors) << ::testing::PrintToString(c.options);
    const std::string bytes = ReadAll(one);
    ASSERT_FALSE(bytes.empty());
    EXPECT_EQ(ReadAll(chunked), bytes) << ::testing::PrintToString(c.options);
    if (index == 0) plain_1x16 = bytes;
    if (index >= 2) EXPECT_NE(bytes, plain_1x16) << "option changed nothing";
    ++index;
  }
  // Dequantize chunked == one-shot.
  const std::string q = dir_->File("one_0.safetensors");
  ASSERT_EQ(Cli({"dequantize", q, dir_->File("dq_one.safetensors")}).exit_code, 0);
  RunResult r = Cli({"dequantize", q, dir_->File("dq_chunked.safetensors"),
                     "--max-request-bytes", "3000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadAll(dir_->File("dq_chunked.safetensors")),
            ReadAll(dir_->File("dq_one.safetensors")));
}

TEST_F(CliLiveTest, StochasticRoundingIsKeyedAndNeverChunked) {
  const std::string in = WriteGoldenInput("1x16", false);
  auto run = [&](const std::string& out, const std::string& step) {
    return Cli({"quantize", in, dir_->File(out), "--rounding", "sr", "--seed", "7", "--step",
                step});
  };
  ASSERT_EQ(run("sr_a.safetensors", "1").exit_code, 0);
  ASSERT_EQ(run("sr_b.safetensors", "1").exit_code, 0);
  ASSERT_EQ(run("sr_c.safetensors", "2").exit_code, 0);
  const std::string a = ReadAll(dir_->File("sr_a.safetensors"));
  EXPECT_EQ(a, ReadAll(dir_->File("sr_b.safetensors")));
  EXPECT_NE(a, ReadAll(dir_->File("sr_c.safetensors")));
  // Scales are round-to-nearest under SR: identical to the RTN scales.
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::ReadFile(dir_->File("sr_a.safetensors"));
  ASSERT_THAT(f, IsOk());
  for (const GoldenCase& g : *golden_) {
    if (g.block == "1x16") EXPECT_EQ(Bytes(*f, g.key + ".x_scale"), g.scales) << g.key;
  }
  const std::string out = dir_->File("sr_chunked.safetensors");
  RunResult r = Cli({"quantize", in, out, "--rounding", "sr", "--max-request-bytes", "3000"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q quantize: FAILED_PRECONDITION: tensor \"c02.x\" (65536 "
                               "bytes) exceeds the request budget of 3000 bytes"));
  EXPECT_THAT(r.err, HasSubstr("stochastic rounding cannot be chunked"));
  EXPECT_NE(access(out.c_str(), F_OK), 0) << "no output on error";
}

TEST_F(CliLiveTest, F16InputsAreWidenedExactly) {
  // Values exactly representable in f16: the F16 file must quantize like the F32 one.
  std::vector<float> v(32 * 64);
  std::string f16;
  for (size_t i = 0; i < v.size(); ++i) {
    const int k = static_cast<int>((i * 37) % 2001) - 1000;
    v[i] = static_cast<float>(k) / 64.0f;  // |k/64| <= 15.6, 1/64 steps: exact in f16
    // Encode as f16: sign, exponent, 10-bit mantissa.
    uint16_t h = 0;
    if (k != 0) {
      float a = std::fabs(v[i]);
      int e = 0;
      const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
      const int exp = e - 1 + 15;
      const int mant = static_cast<int>((m * 2.0f - 1.0f) * 1024.0f);
      h = static_cast<uint16_t>((k < 0 ? 0x8000 : 0) | (exp << 10) | mant);
    }
    ASSERT_EQ(F16ToF32(h), v[i]) << i;
    f16.append(reinterpret_cast<const char*>(&h), 2);
  }
  SafetensorsWriter w16, w32;
  ASSERT_THAT(w16.Add("w", StDType::kF16, {32, 64}, f16), IsOk());
  ASSERT_THAT(w32.Add("w", StDType::kF32, {32, 64}, F32Bytes(v)), IsOk());
  ASSERT_THAT(w16.WriteFile(dir_->File("f16.safetensors")), IsOk());
  ASSERT_THAT(w32.WriteFile(dir_->File("f32.safetensors")), IsOk());
  ASSERT_EQ(Cli({"quantize", dir_->File("f16.safetensors"), dir_->File("q16.safetensors")})
                .exit_code, 0);
  ASSERT_EQ(Cli({"quantize", dir_->File("f32.safetensors"), dir_->File("q32.safetensors")})
                .exit_code, 0);
  // The same tensors; only the recorded original dtype differs.
  absl::StatusOr<SafetensorsFile> q16 = SafetensorsFile::ReadFile(dir_->File("q16.safetensors"));
  absl::StatusOr<SafetensorsFile> q32 = SafetensorsFile::ReadFile(dir_->File("q32.safetensors"));
  ASSERT_THAT(q16, IsOk());
  ASSERT_THAT(q32, IsOk());
  ASSERT_EQ(q16->tensors().size(), 3u);
  for (const char* t : {"w", "w_scale", "w_scale_2"}) EXPECT_EQ(Bytes(*q16, t), Bytes(*q32, t)) << t;
  EXPECT_EQ(*q16->Metadata("fp4q.original_dtypes"), "{\"w\": \"F16\"}");
  EXPECT_EQ(*q32->Metadata("fp4q.original_dtypes"), "{\"w\": \"F32\"}");
}

TEST_F(CliLiveTest, ProgressLinesOnRequest) {
  const std::string in = WriteGoldenInput("1x16", false);
  RunResult r = Cli({"quantize", in, dir_->File("progress.safetensors"), "--progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fp4q: [1/8] quantized c00.x (1.0 KiB)"));
  EXPECT_THAT(r.err, HasSubstr("fp4q: [8/8] quantized c09.x (256.0 KiB) 100.0%\n"));
  r = Cli({"quantize", in, dir_->File("quiet.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "") << "stderr is not a terminal here: no progress without --progress";
}

TEST_F(CliLiveTest, ServerErrorsExitOneAndWriteNothing) {
  // Four-over-six with RHT is a combination the server rejects (DESIGN.md).
  const std::string in = WriteGoldenInput("1x16", false);
  const std::string out = dir_->File("rejected_out.safetensors");
  RunResult r = Cli({"quantize", in, out, "--scale-selection", "4over6-mae", "--rht", "default"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q quantize: INVALID_ARGUMENT: "));
  EXPECT_THAT(r.err, HasSubstr("rht"));
  EXPECT_EQ(r.out, "");
  EXPECT_NE(access(out.c_str(), F_OK), 0);

  // An input that already holds T_scale for a tensor T.
  SafetensorsWriter q;
  ASSERT_THAT(q.Add("w", StDType::kF32, {1, 16}, F32Bytes(std::vector<float>(16, 1.0f))), IsOk());
  ASSERT_THAT(q.Add("w_scale", StDType::kF32, {1}, F32Bytes({1.0f})), IsOk());
  ASSERT_THAT(q.WriteFile(dir_->File("clash.safetensors")), IsOk());
  r = Cli({"quantize", dir_->File("clash.safetensors"), dir_->File("clash_out.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION: cannot quantize \"w\": the input already "
                               "has a tensor \"w_scale\""));

  // A malformed triple on dequantize.
  SafetensorsWriter bad;
  ASSERT_THAT(bad.Add("w", StDType::kU8, {2, 8}, std::string(16, '\x11')), IsOk());
  ASSERT_THAT(bad.Add("w_scale", StDType::kF8E4M3, {2, 2}, std::string(4, '\x38')), IsOk());
  ASSERT_THAT(bad.Add("w_scale_2", StDType::kF32, {1}, F32Bytes({1.0f})), IsOk());
  ASSERT_THAT(bad.WriteFile(dir_->File("bad_triple.safetensors")), IsOk());
  r = Cli({"dequantize", dir_->File("bad_triple.safetensors"), dir_->File("bad_out.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: quantized tensor \"w\" [2, 8] codes: "
                               "\"w_scale\" has shape [2, 2], expected [2, 1]"));
}

}  // namespace
}  // namespace fp4q::client
