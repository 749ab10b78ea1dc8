// `fp4q quantize` and `fp4q dequantize`: safetensors files in, safetensors files out, the
// numerics done by the server (Quantize / Dequantize RPCs).
//
// Quantized layout (docs/DESIGN.md "CLI"), for each quantized tensor T [rows, cols]:
//   T          U8       [rows, cols/2]   packed E2M1 codes (element 2j in the low nibble)
//   T_scale    F8_E4M3  [rows, cols/16]  block scales, plain row-major (16x16 blocks: each
//                                        tile's scale repeated on its 16 rows)
//   T_scale_2  F32      [1]              S_dec = RN(1 / S_enc), the global decode scale
// Every other tensor and the file's metadata are copied unchanged.
//
// What is quantized: every 2-D tensor of dtype F32, BF16 or F16 (F16 is widened to F32
// exactly, which NUMERICS.md does first anyway) with rows >= 1 and cols a multiple of 16 (and
// rows a multiple of 16 for 16x16 blocks). A 2-D float tensor left out gets a note saying why.
//
// Large tensors. A request must fit the smaller of the server's and the client's message
// limits (less 64 KiB for the envelope). A tensor that does not is sent in chunks of whole
// rows (multiples of 16 rows for 16x16 blocks), which gives byte-identical results because
// NVFP4 blocks never span rows, provided every chunk uses the whole tensor's global amax:
// - without RHT the client computes it (max |x|, NaN ignored: exact, no rounding involved);
// - with RHT (amax of the transformed tensor) a first pass quantizes every chunk and takes the
//   largest global_amax the server reports, then the chunks are quantized with it;
// - stochastic rounding cannot be chunked (its random bits depend on each element's index in
//   the whole tensor): FAILED_PRECONDITION naming the tensor, its size and the limit;
// - a tensor holding Inf cannot be chunked either (a caller-given amax must be finite).
// Dequantize chunks by rows likewise (it is row-local given S_dec).
//
// Dequantize finds the triples (T U8 2-D, T_scale F8_E4M3 or U8 [rows, cols/16], T_scale_2 F32
// with one element) and writes T as F32 or BF16 [rows, cols]. The server takes S_enc, so the
// client sends the f32 S_enc whose RN(1/S_enc) is T_scale_2 (exact for files this tool wrote;
// otherwise the nearest, with a note).
#ifndef FP4Q_CLIENT_CLI_FILE_CONVERT_H_
#define FP4Q_CLIENT_CLI_FILE_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fp4q/client/client.h"

namespace fp4q::client::cli {

// Envelope allowance subtracted from the message limit for a request's non-tensor bytes.
inline constexpr uint64_t kEnvelopeBytes = 64 * 1024;

struct ConvertOptions {
  // 0: min(server limit, client limit) - kEnvelopeBytes. Otherwise the tensor-byte budget of
  // one request (chunking is forced on tensors above it; for tests and tuning).
  uint64_t max_request_bytes = 0;
  bool progress = false;           // print progress lines on stderr
  bool progress_terminal = false;  // rewrite the line in place
  CallOptions call;                // deadline of each RPC
};

struct ConvertStats {
  size_t converted = 0;       // tensors quantized / dequantized
  size_t passed_through = 0;  // tensors copied unchanged
  size_t requests = 0;        // Quantize / Dequantize RPCs made
  std::vector<std::string> notes;  // one line per 2-D float tensor left out, and similar
};

// `quant` carries the options (block, rounding, seed, step, RHT, scale selection, emax);
// format must be NVFP4, scale layout plain, outputs row-wise, no amax, no residual key
// (INVALID_ARGUMENT otherwise).
absl::StatusOr<ConvertStats> QuantizeFile(const Client& client, const std::string& in_path,
                                          const std::string& out_path,
                                          const v1::QuantOptions& quant,
                                          const ConvertOptions& options);

// out_dtype: DTYPE_F32 or DTYPE_BF16.
absl::StatusOr<ConvertStats> DequantizeFile(const Client& client, const std::string& in_path,
                                            const std::string& out_path, v1::DType out_dtype,
                                            const ConvertOptions& options);

// The f32 S_enc with RN(1 / S_enc) == s_dec, searched among the neighbours of RN(1 / s_dec);
// `exact` false when none matches (then the one whose reciprocal is nearest). INVALID_ARGUMENT
// when s_dec is not finite and positive.
struct EncodeScale {
  float s_enc = 1.0f;
  bool exact = true;
};
absl::StatusOr<EncodeScale> EncodeScaleFor(float s_dec);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_FILE_CONVERT_H_
