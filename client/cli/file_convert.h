// `fp4q quantize` and `fp4q dequantize`: safetensors files in, safetensors files out, the
// numerics done by the server (Quantize / Dequantize RPCs).
//
// Quantized layout (ModelOpt's NVFP4 layout, which vLLM's and SGLang's ModelOpt loaders read;
// docs/CHECKPOINTS.md), for each quantized tensor T [rows, cols]:
//   T          U8       [rows, cols/2]   packed E2M1 codes (element 2j in the low nibble)
//   T_scale    F8_E4M3  [rows, cols/16]  block scales, plain row-major (16x16 blocks: each
//                                        tile's scale repeated on its 16 rows)
//   T_scale_2  F32      [1]              S_dec = RN(1 / S_enc), the global decode scale
//                                        (amax / 2688 with map-to-6 scales)
//   M.input_scale F32   [1]              for T = "M.weight" only: the activation global scale
//                                        W4A4 loaders quantize M's input with (not measured
//                                        here: ConvertOptions::input_scale)
// Every other tensor and the file's metadata are copied unchanged; the metadata gains
// "fp4q.*" keys recording how it was quantized (format, block, rounding and its seed/step, RHT,
// scale selection, each quantized tensor's original dtype, the input scale, shared scale
// groups). Beside the output goes hf_quant_config.json (file_select.h), unless RHT was used
// (the stored weights are then in the transformed domain, which no inference loader undoes).
//
// What is quantized: see file_select.h for the name selection. A selected tensor of a float
// dtype (F32, BF16, F16, F64, F8_*) with two or more dimensions is quantized when it is 2-D
// F32/BF16/F16 (F16 is widened to F32 exactly, which docs/NUMERICS.md does first anyway) with
// rows >= 1 and cols a multiple of 16 (and rows a multiple of 16 for 16x16 blocks); any other
// one is unsupported: the command fails with FAILED_PRECONDITION listing them (writing
// nothing), or copies them unquantized with ConvertOptions::skip_unsupported. Tensors with
// fewer than two dimensions (biases, norm weights, scalars) and non-float tensors are copied.
//
// Global scales: each tensor's own amax, except that the members of a shared-scale group
// (file_select.h) are quantized with the group's largest amax (ConvertOptions::shared_scales;
// not with RHT, whose amax is the transformed tensor's).
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
// with one element) and writes T as F32 or BF16 [rows, cols]; the "M.input_scale" of a triple
// "M.weight" and the "fp4q.*" metadata keys are dropped. The server takes S_enc, so the
// client sends the f32 S_enc whose RN(1/S_enc) is T_scale_2 (exact for files this tool wrote;
// otherwise the nearest, with a note).
#ifndef FP4Q_CLIENT_CLI_FILE_CONVERT_H_
#define FP4Q_CLIENT_CLI_FILE_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "file_select.h"
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
  // Quantize only:
  SelectOptions select;            // which names are quantized (file_select.h)
  bool skip_unsupported = false;   // copy unsupported tensors instead of failing
  bool shared_scales = true;       // one global amax per shared-scale group
  float input_scale = 1.0f;        // the M.input_scale written (finite, > 0)
  bool hf_quant_config = true;     // write hf_quant_config.json beside the output
};

struct ConvertStats {
  size_t converted = 0;       // tensors quantized / dequantized
  size_t passed_through = 0;  // tensors copied unchanged (excluded and skipped included)
  size_t requests = 0;        // Quantize / Dequantize RPCs made
  std::vector<std::string> notes;     // lines for the user (chunking, scale groups, ...)
  std::vector<std::string> excluded;  // "NAME: reason" per tensor the selection left out
  std::vector<std::string> skipped;   // "NAME [shape] DTYPE: reason" per unsupported tensor
  std::string hf_quant_config_path;   // written, or "" (with a note saying why)
};

// The checks both commands make before any work, each error naming the path:
// INVALID_ARGUMENT when `out` is the file `in` (under any spelling: same device and inode,
// symbolic links followed); NOT_FOUND when out's directory does not exist, FAILED_PRECONDITION
// when it is not a directory, PERMISSION_DENIED when it is not writable.
absl::Status CheckPaths(const std::string& in_path, const std::string& out_path);

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
