// Support for the tests against a live fp4qd: temporary directories, the server process, the
// golden vectors, and an independent NVFP4 decode (NUMERICS.md section 2, "Dequantize") to
// check the server's outputs against.
#ifndef FP4Q_TESTS_CLIENT_LIVE_SUPPORT_H_
#define FP4Q_TESTS_CLIENT_LIVE_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/client/client.h"
#include "fp4q/common/safetensors.h"
#include "subprocess.h"

namespace fp4q::client::testing {

// Paths of fp4qd, the fp4q CLI and the golden vectors' folder: the environment variables
// FP4Q_FP4QD, FP4Q_CLI and FP4Q_GOLDEN_DIR when set (e.g. on a GPU machine the build was copied
// to), else the paths the build recorded (the golden folder: tests/data/golden).
std::string Fp4qdPath();
std::string CliPath();
std::string GoldenDir();
// The backend the live tests run fp4qd with: $FP4Q_TEST_BACKEND ("cpu" or "cuda"), default cpu.
std::string TestBackend();

// fp4qd on 127.0.0.1:0 with --backend=TestBackend() and metrics off unless `extra` sets them, plus
// `extra` flags.
absl::StatusOr<std::unique_ptr<ServerProcess>> StartFp4qd(
    const std::vector<std::string>& extra = {});

std::unique_ptr<Client> ConnectTo(const std::string& address);

// One golden case (tests/data/golden/README.md).
struct GoldenCase {
  std::string key;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string block;  // "1x16" or "16x16"
  common::StDType x_dtype = common::StDType::kF32;
  std::string x;       // raw input bytes
  std::string codes;   // [rows, cols/2]
  std::string scales;  // [rows, cols/16]
  float s_enc = 1.0f;
  float global_amax = 0.0f;
};
absl::StatusOr<std::vector<GoldenCase>> LoadGolden();

// Independent decode: DQ = RN(RN(e2m1(code) * float(sf)) * S_dec), S_dec = RN(1 / s_enc).
float E4M3ToFloat(uint8_t bits);
float E2M1ToFloat(uint8_t code);
std::vector<float> DecodeNvfp4(const std::string& codes, const std::string& scales, int64_t rows,
                               int64_t cols, float s_enc);

// Input bytes (F32 or BF16) as f32 values.
std::vector<float> ToFloats(common::StDType dtype, const std::string& bytes);

}  // namespace fp4q::client::testing

#endif  // FP4Q_TESTS_CLIENT_LIVE_SUPPORT_H_
