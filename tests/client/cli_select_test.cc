// `fp4q quantize` against a real fp4qd (CPU backend): tensors it cannot quantize fail the
// command unless --skip-unsupported, the input is never overwritten (under any spelling of its
// path), a missing output directory is the user's error, and --include / --exclude / the
// default exclusions choose what is quantized. The layout written for inference engines is
// checked by cli_checkpoint_test.py.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::RunResult;
using ::fp4q::client::testing::ServerProcess;
using ::fp4q::client::testing::StartFp4qd;
using ::fp4q::client::testing::TempDir;
using ::fp4q::common::SafetensorsFile;
using ::fp4q::common::SafetensorsWriter;
using ::fp4q::common::StDType;
using ::fp4q::testing::IsOk;
using ::testing::HasSubstr;

std::string Values(size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 23) - 11.0f) / 7.0f;
  return F32Bytes(v);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string FileBytes(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::ReadFile(path);
  if (!f.ok()) return "<" + std::string(f.status().message()) + ">";
  SafetensorsWriter w;
  for (const auto& t : f->tensors()) (void)w.Add(t.name, t.dtype, t.shape, f->Data(t));
  for (const auto& [k, v] : f->metadata()) w.SetMetadata(k, v);
  return w.Serialize();
}

class CliSelectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> s = StartFp4qd();
    ASSERT_THAT(s, IsOk());
    server_ = s->release();
  }
  static void TearDownTestSuite() { delete server_; }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {testing::CliPath(), "--server", server_->address()});
    absl::StatusOr<RunResult> r = testing::Run(args, {"FP4Q_TOKEN="});
    EXPECT_THAT(r, IsOk());
    return r.ok() ? *r : RunResult{};
  }

  // A small model: what the selection must handle.
  std::string WriteModel(const std::string& name) {
    SafetensorsWriter w;
    EXPECT_THAT(w.Add("model.embed_tokens.weight", StDType::kF32, {32, 16}, Values(512)), IsOk());
    EXPECT_THAT(w.Add("model.layers.0.input_layernorm.weight", StDType::kF32, {16}, Values(16)),
                IsOk());
    EXPECT_THAT(w.Add("model.layers.0.self_attn.q_proj.weight", StDType::kF32, {16, 16},
                      Values(256)), IsOk());
    EXPECT_THAT(w.Add("model.layers.0.mlp.down_proj.weight", StDType::kF32, {16, 32},
                      Values(512, 2.0f)), IsOk());
    EXPECT_THAT(w.Add("model.layers.0.mlp.down_proj.bias", StDType::kF32, {16}, Values(16)),
                IsOk());
    EXPECT_THAT(w.Add("lm_head.weight", StDType::kF32, {32, 16}, Values(512)), IsOk());
    EXPECT_THAT(w.Add("position_ids", StDType::kI64, {1, 16}, std::string(128, '\0')), IsOk());
    const std::string path = dir_.File(name);
    EXPECT_THAT(w.WriteFile(path), IsOk());
    return path;
  }

  static ServerProcess* server_;
  TempDir dir_;
};
ServerProcess* CliSelectTest::server_ = nullptr;

TEST_F(CliSelectTest, UnsupportedTensorsFailTheCommandListingThem) {
  SafetensorsWriter w;
  ASSERT_THAT(w.Add("ok.weight", StDType::kF32, {2, 16}, Values(32)), IsOk());
  ASSERT_THAT(w.Add("wide.weight", StDType::kF64, {2, 16}, std::string(2 * 16 * 8, '\0')),
              IsOk());
  ASSERT_THAT(w.Add("odd.weight", StDType::kF32, {3, 10}, Values(30)), IsOk());
  ASSERT_THAT(w.Add("conv.weight", StDType::kF32, {2, 2, 16}, Values(64)), IsOk());
  const std::string in = dir_.File("unsupported.safetensors");  // F64 first, then by name
  ASSERT_THAT(w.WriteFile(in), IsOk());
  const std::string out = dir_.File("unsupported_q.safetensors");

  RunResult r = Cli({"quantize", in, out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "fp4q quantize: FAILED_PRECONDITION: 3 tensor(s) cannot be quantized, nothing was "
            "written (--skip-unsupported copies them unquantized, --exclude leaves them out):\n"
            "  \"wide.weight\" [2, 16] F64: dtype F64 is not quantized (F32, BF16 and F16 are)\n"
            "  \"conv.weight\" [2, 2, 16] F32: 3-D: only 2-D tensors are quantized (reshape it to "
            "[rows, cols] first)\n"
            "  \"odd.weight\" [3, 10] F32: cols 10 is not a multiple of 16\n");
  EXPECT_FALSE(Exists(out));
  EXPECT_FALSE(Exists(dir_.File("hf_quant_config.json")));

  r = Cli({"quantize", in, out, "--skip-unsupported"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, absl::StrCat("quantized 1 tensor(s), copied 3 (0 excluded, 3 unsupported), in "
                                "1 request(s) -> ", out, "\nwrote ",
                                dir_.File("hf_quant_config.json"), "\n"));
  EXPECT_EQ(r.err,
            "fp4q quantize: skipped (unsupported, copied unquantized) \"wide.weight\" [2, 16] "
            "F64: dtype F64 is not quantized (F32, BF16 and F16 are)\n"
            "fp4q quantize: skipped (unsupported, copied unquantized) \"conv.weight\" [2, 2, 16] "
            "F32: 3-D: only 2-D tensors are quantized (reshape it to [rows, cols] first)\n"
            "fp4q quantize: skipped (unsupported, copied unquantized) \"odd.weight\" [3, 10] F32: "
            "cols 10 is not a multiple of 16\n");
  absl::StatusOr<SafetensorsFile> q = SafetensorsFile::ReadFile(out);
  absl::StatusOr<SafetensorsFile> src = SafetensorsFile::ReadFile(in);
  ASSERT_THAT(q, IsOk());
  ASSERT_THAT(src, IsOk());
  for (const char* name : {"wide.weight", "odd.weight", "conv.weight"}) {
    auto a = q->Find(name);
    auto b = src->Find(name);
    ASSERT_THAT(a, IsOk());
    EXPECT_EQ((*a)->dtype, (*b)->dtype) << name;
    EXPECT_EQ((*a)->shape, (*b)->shape) << name;
    EXPECT_EQ(q->Data(**a), src->Data(**b)) << name;
    EXPECT_FALSE(q->Find(std::string(name) + "_scale").ok()) << name;
  }
  EXPECT_TRUE(q->Find("ok.weight_scale_2").ok());
  EXPECT_TRUE(q->Find("ok.input_scale").ok());
}

TEST_F(CliSelectTest, SixteenBySixteenBlocksNeedRowsOfSixteen) {
  SafetensorsWriter w;
  ASSERT_THAT(w.Add("short.weight", StDType::kF32, {8, 16}, Values(128)), IsOk());
  const std::string in = dir_.File("short.safetensors");
  ASSERT_THAT(w.WriteFile(in), IsOk());
  RunResult r = Cli({"quantize", in, dir_.File("short_q.safetensors"), "--block", "16x16"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("  \"short.weight\" [8, 16] F32: rows 8 is not a multiple of 16 "
                               "(needed by 16x16 blocks)\n"));
  // The same file with 1x16 blocks is fine.
  r = Cli({"quantize", in, dir_.File("short_q.safetensors")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliSelectTest, TheInputIsNeverTheOutput) {
  const std::string in = WriteModel("same.safetensors");
  const std::string before = FileBytes(in);
  ASSERT_EQ(mkdir(dir_.File("sub").c_str(), 0755), 0);
  ASSERT_EQ(symlink(in.c_str(), dir_.File("link.safetensors").c_str()), 0);
  ASSERT_EQ(link(in.c_str(), dir_.File("hard.safetensors").c_str()), 0);
  for (const std::string& out :
       {in, dir_.File("sub/../same.safetensors"), dir_.path() + "//same.safetensors",
        dir_.File("link.safetensors"), dir_.File("hard.safetensors")}) {
    SCOPED_TRACE(out);
    RunResult r = Cli({"quantize", in, out});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err, absl::StrCat("fp4q quantize: OUT \"", out, "\" is the input file \"", in,
                                  "\": writing it would replace the input; choose another "
                                  "output path\nTry 'fp4q quantize --help'.\n"));
    r = Cli({"dequantize", in, out});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("fp4q dequantize: OUT \"" + out + "\" is the input file"));
  }
  EXPECT_EQ(FileBytes(in), before);
  EXPECT_FALSE(Exists(dir_.File("hf_quant_config.json")));
}

TEST_F(CliSelectTest, AMissingOutputDirectoryIsTheUsersError) {
  const std::string in = WriteModel("model.safetensors");
  const std::string missing = dir_.File("no/such/dir");
  RunResult r = Cli({"quantize", in, missing + "/out.safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, absl::StrCat("fp4q quantize: NOT_FOUND: output directory \"", missing,
                                "\" of \"", missing, "/out.safetensors\" does not exist; create "
                                "it first\n"));
  r = Cli({"dequantize", in, missing + "/out.safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp4q dequantize: NOT_FOUND: output directory \"" + missing));
  // A file where the directory should be.
  r = Cli({"quantize", in, in + "/out.safetensors"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, absl::StrCat("fp4q quantize: FAILED_PRECONDITION: output directory \"", in,
                                "\" of \"", in, "/out.safetensors\" is not a directory\n"));
}

TEST_F(CliSelectTest, DefaultExclusionsAndPatterns) {
  const std::string in = WriteModel("select.safetensors");
  const std::string out = dir_.File("select_q.safetensors");
  RunResult r = Cli({"quantize", in, out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // In the file's order (the writer sorts by element size, then name).
  EXPECT_EQ(r.err,
            "fp4q quantize: excluded lm_head.weight: default exclusion: LM head (name part "
            "\"lm_head\")\n"
            "fp4q quantize: excluded model.embed_tokens.weight: default exclusion: embedding "
            "(name part \"embed_tokens\")\n");
  EXPECT_THAT(r.out, HasSubstr("quantized 2 tensor(s), copied 5 (2 excluded, 0 unsupported), "));
  absl::StatusOr<SafetensorsFile> q = SafetensorsFile::ReadFile(out);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ((*q->Find("model.embed_tokens.weight"))->dtype, StDType::kF32);
  EXPECT_EQ((*q->Find("model.layers.0.self_attn.q_proj.weight"))->dtype, StDType::kU8);
  EXPECT_EQ((*q->Find("model.layers.0.mlp.down_proj.weight"))->dtype, StDType::kU8);
  EXPECT_EQ((*q->Find("model.layers.0.input_layernorm.weight"))->dtype, StDType::kF32);

  // --exclude, given twice, and --include.
  r = Cli({"quantize", in, dir_.File("select_x.safetensors"), "--exclude", "*down_proj*",
           "--exclude=*q_proj*"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("excluded model.layers.0.mlp.down_proj.weight: --exclude "
                               "'*down_proj*'\n"));
  EXPECT_THAT(r.err, HasSubstr("excluded model.layers.0.self_attn.q_proj.weight: --exclude "
                               "'*q_proj*'\n"));
  EXPECT_THAT(r.out, HasSubstr("quantized 0 tensor(s), copied 7 (4 excluded, 0 unsupported)"));

  r = Cli({"quantize", in, dir_.File("select_i.safetensors"), "--include", "*.mlp.*"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("excluded model.layers.0.self_attn.q_proj.weight: not matched by "
                               "--include\n"));
  EXPECT_THAT(r.out, HasSubstr("quantized 1 tensor(s), copied 6 (3 excluded, 0 unsupported)"));

  r = Cli({"quantize", in, dir_.File("select_all.safetensors"), "--no-default-excludes"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("quantized 4 tensor(s), copied 3, in 4 request(s)"));

  r = Cli({"quantize", in, dir_.File("select_bad.safetensors"), "--include", ""});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("an --include/--exclude pattern is empty"));
  r = Cli({"quantize", in, dir_.File("select_bad.safetensors"), "--input-scale", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("option '--input-scale' must be a finite f32 > 0, got '0'"));
}

}  // namespace
}  // namespace fp4q::client
