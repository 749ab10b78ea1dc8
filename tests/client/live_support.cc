#include "live_support.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "fp4q/client/tensors.h"
#include "fp4q/common/json.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::client::testing {

absl::StatusOr<std::unique_ptr<ServerProcess>> StartFp4qd(const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--log_format=text"};
  bool metrics = false, backend = false;
  for (const std::string& f : extra) {
    metrics |= f.rfind("--metrics_listen", 0) == 0;
    backend |= f.rfind("--backend", 0) == 0;
  }
  if (!metrics) flags.push_back("--metrics_listen=");
  if (!backend) flags.push_back("--backend=" + TestBackend());
  flags.insert(flags.end(), extra.begin(), extra.end());
  return ServerProcess::Start(Fp4qdPath(), flags);
}

namespace {
std::string FromEnv(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}
}  // namespace

std::string Fp4qdPath() { return FromEnv("FP4Q_FP4QD", FP4Q_FP4QD); }
std::string CliPath() { return FromEnv("FP4Q_CLI", FP4Q_CLI); }
std::string GoldenDir() { return FromEnv("FP4Q_GOLDEN_DIR", FP4Q_GOLDEN_DIR); }
std::string TestBackend() { return FromEnv("FP4Q_TEST_BACKEND", "cpu"); }

std::unique_ptr<Client> ConnectTo(const std::string& address) {
  ClientOptions options;
  options.address = address;
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
  return c.ok() ? *std::move(c) : nullptr;
}

absl::StatusOr<std::vector<GoldenCase>> LoadGolden() {
  FP4Q_ASSIGN_OR_RETURN(
      common::SafetensorsFile file,
      common::SafetensorsFile::ReadFile(GoldenDir() + "/nvfp4_rtn_public.safetensors"));
  FP4Q_ASSIGN_OR_RETURN(std::string cases_text, file.Metadata("cases"));
  FP4Q_ASSIGN_OR_RETURN(common::JsonValue cases, common::ParseJson(cases_text));
  std::vector<GoldenCase> out;
  for (const common::JsonValue& c : cases.items()) {
    GoldenCase g;
    g.key = c.Find("key")->text();
    FP4Q_ASSIGN_OR_RETURN(g.rows, c.Find("rows")->AsInt64());
    FP4Q_ASSIGN_OR_RETURN(g.cols, c.Find("cols")->AsInt64());
    g.block = c.Find("block")->text();
    FP4Q_ASSIGN_OR_RETURN(const common::StTensorInfo* x, file.Find(g.key + ".x"));
    g.x_dtype = x->dtype;
    g.x = std::string(file.Data(*x));
    FP4Q_ASSIGN_OR_RETURN(const common::StTensorInfo* codes, file.Find(g.key + ".codes"));
    g.codes = std::string(file.Data(*codes));
    FP4Q_ASSIGN_OR_RETURN(const common::StTensorInfo* scales, file.Find(g.key + ".scales"));
    g.scales = std::string(file.Data(*scales));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> s_enc,
                          file.CopyTensor<float>(g.key + ".s_enc", common::StDType::kF32));
    FP4Q_ASSIGN_OR_RETURN(std::vector<float> amax,
                          file.CopyTensor<float>(g.key + ".global_amax", common::StDType::kF32));
    g.s_enc = s_enc.at(0);
    g.global_amax = amax.at(0);
    out.push_back(std::move(g));
  }
  return out;
}

float E4M3ToFloat(uint8_t bits) {
  const int sign = bits >> 7;
  const int exp = (bits >> 3) & 0xF;
  const int mant = bits & 0x7;
  float v;
  if (exp == 0xF && mant == 0x7) {
    v = std::nanf("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return sign ? -v : v;
}

float E2M1ToFloat(uint8_t code) {
  static const float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitudes[code & 0x7];
  return (code & 0x8) ? -m : m;
}

std::vector<float> DecodeNvfp4(const std::string& codes, const std::string& scales, int64_t rows,
                               int64_t cols, float s_enc) {
  const float s_dec = 1.0f / s_enc;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = static_cast<uint8_t>(codes[static_cast<size_t>((r * cols + c) / 2)]);
      const uint8_t code = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      const float sf =
          E4M3ToFloat(static_cast<uint8_t>(scales[static_cast<size_t>(r * (cols / 16) + c / 16)]));
      const float prod = E2M1ToFloat(code) * sf;  // exact
      out[static_cast<size_t>(r * cols + c)] = prod * s_dec;
    }
  }
  return out;
}

std::vector<float> ToFloats(common::StDType dtype, const std::string& bytes) {
  if (dtype == common::StDType::kF32) return BytesToF32(bytes);
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    out[i] = Bf16ToF32(b);
  }
  return out;
}

}  // namespace fp4q::client::testing
