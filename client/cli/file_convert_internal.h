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
void CopyMetadata(const common::SafetensorsFile& in, common::SafetensorsWriter* out);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_FILE_CONVERT_INTERNAL_H_
