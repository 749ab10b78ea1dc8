// Helpers shared by file_convert.cc and file_dequantize.cc.
#ifndef FP4Q_CLIENT_CLI_FILE_CONVERT_INTERNAL_H_
#define FP4Q_CLIENT_CLI_FILE_CONVERT_INTERNAL_H_

#include <cstdint>
#include <string>

#include "file_convert.h"
#include "fp4q/common/safetensors.h"

namespace fp4q::client::cli {

// Tensor bytes one request may carry (see ConvertOptions::max_request_bytes).
uint64_t RequestBudget(const Client& client, const ConvertOptions& options,
                       const v1::ServerInfoReply& info);
// The 4 little-endian bytes of an f32.
std::string FloatBytes(float v);
// A tensor's values as F32 or BF16 bytes for a request (F16 widened to F32).
struct WireInput {
  v1::DType dtype;
  std::string owned;       // set when converted
  absl::string_view data;  // the bytes to send
};
WireInput ToWire(const common::SafetensorsFile& file, const common::StTensorInfo& t);

// max |x| over F32 or BF16 bytes, NaN ignored (NUMERICS G1).
float HostAmax(v1::DType dtype, absl::string_view data);

// A tensor's row-wise NVFP4 codes, plain scales and encode scale.
struct QuantizedOutput {
  std::string codes;
  std::string scales;
  float s_enc = 1.0f;
};
// Quantizes `in` ([rows, cols]) with `base` in requests of at most `budget` bytes (whole rows,
// whole 16-row blocks for 16x16), counting them in *requests; checks each reply's shape and sizes.
absl::StatusOr<QuantizedOutput> QuantizeTensor(const Client& client, const std::string& name,
                                               const WireInput& in, int64_t rows, int64_t cols,
                                               const v1::QuantOptions& base, uint64_t budget,
                                               const CallOptions& call, size_t* requests);

void CopyMetadata(const common::SafetensorsFile& in, common::SafetensorsWriter* out);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_FILE_CONVERT_INTERNAL_H_
