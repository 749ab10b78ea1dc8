// Hostile inputs of the tensor operations: Quantize, Qdq, Dequantize, Matmul
// (e2e_bad_input.h).
#include <cstdint>
#include <limits>

#include "e2e_bad_input.h"

namespace fp4q::server::testing {
namespace {

using Code = grpc::StatusCode;
constexpr int64_t kBig = int64_t{1} << 40;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

v1::Tensor Good() { return InlineTensor(RandomF32(2 * 16, 1), 2, 16); }

v1::Tensor Shaped(std::vector<int64_t> shape, const std::string& bytes = "x") {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_inline_data(bytes);
  return t;
}

// A Quantize of Good() with one option changed by `set`.
template <typename F>
BadCase Opt(std::string name, F set, Code code, std::string message, v1::Tensor t = Good()) {
  return {std::move(name),
          [set, t](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::QuantizeRequest r = Q(t);
            set(r.mutable_options());
            return Call(s, r);
          },
          code, std::move(message)};
}

// A Dequantize of an operand changed by `set`.
template <typename F>
BadCase Deq(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::DequantizeRequest r;
            *r.mutable_input()->mutable_tensor() = ZeroOperand(2, 16);
            set(&r);
            return Call(s, r);
          },
          code, std::move(message)};
}

// A Matmul of two [2, 32] operands changed by `set`.
template <typename F>
BadCase Mm(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::MatmulRequest r;
            *r.mutable_a()->mutable_tensor() = ZeroOperand(2, 32);
            *r.mutable_b()->mutable_tensor() = ZeroOperand(2, 32);
            set(&r);
            return Call(s, r);
          },
          code, std::move(message)};
}

}  // namespace

std::vector<BadCase> TensorOpCases() {
  using O = v1::QuantOptions;
  std::vector<BadCase> cases = {
      // ---- input tensor: dtype, shape, bytes.
      {"dtype U8 as input",
       [](auto& s, auto&) {
         return Call(s, Q(InlineTensor(std::string(32, 'a'), 2, 16, v1::DTYPE_U8)));
       },
       Code::INVALID_ARGUMENT, "input.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"},
      {"dtype unspecified",
       [](auto& s, auto&) {
         return Call(s, Q(InlineTensor(RandomF32(32, 1), 2, 16, v1::DTYPE_UNSPECIFIED)));
       },
       Code::INVALID_ARGUMENT, "input.dtype: DTYPE_UNSPECIFIED; expected DTYPE_F32 or DTYPE_BF16"},
      {"unknown dtype value",
       [](auto& s, auto&) {
         return Call(s, Q(InlineTensor(std::string(128, 'a'), 2, 16, static_cast<v1::DType>(9))));
       },
       Code::INVALID_ARGUMENT, "input.dtype: unknown value 9"},
      {"negative dtype value",
       [](auto& s, auto&) {
         return Call(s, Q(InlineTensor(std::string(128, 'a'), 2, 16, static_cast<v1::DType>(-3))));
       },
       Code::INVALID_ARGUMENT, "input.dtype: unknown value -3"},
      {"inline bytes too few",
       [](auto& s, auto&) { return Call(s, Q(InlineTensor(std::string(100, 'a'), 2, 16))); },
       Code::INVALID_ARGUMENT, "input.inline_data: 100 bytes; DTYPE_F32 [2, 16] needs 128"},
      {"inline bytes too many",
       [](auto& s, auto&) { return Call(s, Q(InlineTensor(std::string(129, 'a'), 2, 16))); },
       Code::INVALID_ARGUMENT, "input.inline_data: 129 bytes; DTYPE_F32 [2, 16] needs 128"},
      {"bf16 bytes for an f32 shape",
       [](auto& s, auto&) {
         return Call(s, Q(InlineTensor(RandomBF16(32, 1), 2, 16, v1::DTYPE_F32)));
       },
       Code::INVALID_ARGUMENT, "input.inline_data: 64 bytes; DTYPE_F32 [2, 16] needs 128"},
      {"rank 3",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({2, 16, 1})));
       },
       Code::INVALID_ARGUMENT, "input.shape: [2, 16, 1] has rank 3; expected [rows, cols]"},
      {"rank 1", [](auto& s, auto&) { return Call(s, Q(Shaped({32}))); }, Code::INVALID_ARGUMENT,
       "input.shape: [32] has rank 1; expected [rows, cols]"},
      {"rank 0", [](auto& s, auto&) { return Call(s, Q(Shaped({}))); }, Code::INVALID_ARGUMENT,
       "input.shape: [] has rank 0; expected [rows, cols]"},
      {"zero rows",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({0, 16}, "")));
       },
       Code::INVALID_ARGUMENT, "input.shape[0]: 0 must be >= 1"},
      {"negative cols",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({2, -16})));
       },
       Code::INVALID_ARGUMENT, "input.shape[1]: -16 must be >= 1"},
      {"cols not a multiple of 16",
       [](auto& s, auto&) { return Call(s, Q(InlineTensor(RandomF32(2 * 40, 1), 2, 40))); },
       Code::INVALID_ARGUMENT, "input.shape[1]: 40 is not a multiple of the block size 16"},
      {"dimensions overflow 2^62 bytes",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({kBig, kBig})));
       },
       Code::INVALID_ARGUMENT, "[1099511627776, 1099511627776] exceed the limit of 2^62 bytes"},
      {"dimensions whose product wraps 64 bits",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({int64_t{1} << 33, int64_t{1} << 31})));
       },
       Code::INVALID_ARGUMENT, "[8589934592, 2147483648] exceed the limit of 2^62 bytes"},
      {"int64 max rows",
       [](auto& s, auto&) {
         return Call(s, Q(Shaped({kMax, 16})));
       },
       Code::INVALID_ARGUMENT, "[9223372036854775807, 16] exceed the limit of 2^62 bytes"},
      {"no data",
       [](auto& s, auto&) {
         v1::Tensor t = Good();
         t.clear_inline_data();
         return Call(s, Q(t));
       },
       Code::INVALID_ARGUMENT, "input: no data (set inline_data or region)"},
      {"no input at all", [](auto& s, auto&) { return Call(s, v1::QuantizeRequest()); },
       Code::INVALID_ARGUMENT, "input.dtype: DTYPE_UNSPECIFIED"},
      // ---- options: every enum out of range, and the combinations the
      // numerics refuse.
      Opt(
          "unknown format", [](O* o) { o->set_format(static_cast<v1::Format>(7)); },
          Code::INVALID_ARGUMENT, "options.format: unknown value 7"),
      Opt(
          "unknown block", [](O* o) { o->set_block(static_cast<v1::BlockShape>(4)); },
          Code::INVALID_ARGUMENT, "options.block: unknown value 4"),
      Opt(
          "unknown rounding", [](O* o) { o->set_rounding(static_cast<v1::Rounding>(3)); },
          Code::INVALID_ARGUMENT, "options.rounding: unknown value 3"),
      Opt(
          "unknown rht", [](O* o) { o->set_rht(static_cast<v1::RhtMode>(-1)); },
          Code::INVALID_ARGUMENT, "options.rht: unknown value -1"),
      Opt(
          "unknown scale selection",
          [](O* o) { o->set_scale_selection(static_cast<v1::ScaleSelection>(4)); },
          Code::INVALID_ARGUMENT, "options.scale_selection: unknown value 4"),
      Opt(
          "unknown scale layout",
          [](O* o) { o->set_scale_layout(static_cast<v1::ScaleLayout>(3)); },
          Code::INVALID_ARGUMENT, "options.scale_layout: unknown value 3"),
      Opt(
          "unknown mx scale rule",
          [](O* o) { o->set_mx_scale_rule(static_cast<v1::MxScaleRule>(3)); },
          Code::INVALID_ARGUMENT, "options.mx_scale_rule: unknown value 3"),
      Opt(
          "unknown outputs", [](O* o) { o->set_outputs(static_cast<v1::Outputs>(4)); },
          Code::INVALID_ARGUMENT, "options.outputs: unknown value 4"),
      Opt(
          "16x16 blocks need rows % 16", [](O* o) { o->set_block(v1::BLOCK_SHAPE_16X16); },
          Code::INVALID_ARGUMENT, "input.shape[0]: 2 is not a multiple of 16 (16x16 blocks)"),
      Opt(
          "NVFP4 with a 1x32 block", [](O* o) { o->set_block(v1::BLOCK_SHAPE_1X32); },
          Code::INVALID_ARGUMENT, "options.block: 1x32 is not an NVFP4 block (1x16 or 16x16)"),
      Opt(
          "MXFP4 with a 1x16 block",
          [](O* o) {
            o->set_format(v1::FORMAT_MXFP4);
            o->set_block(v1::BLOCK_SHAPE_1X16);
          },
          Code::INVALID_ARGUMENT, "options.block: 1x16 is not an MXFP4 block (1x32)"),
      Opt(
          "MXFP4 with a caller amax",
          [](O* o) {
            o->set_format(v1::FORMAT_MXFP4);
            o->set_amax(2.0f);
          },
          Code::INVALID_ARGUMENT, "options.amax: 2 given, but MXFP4 has no global scale",
          InlineTensor(RandomF32(2 * 32, 1), 2, 32)),
      Opt(
          "amax NaN", [](O* o) { o->set_amax(kNaN); }, Code::INVALID_ARGUMENT,
          "options.amax: nan is not finite and >= 0"),
      Opt(
          "amax Inf", [](O* o) { o->set_amax(kInf); }, Code::INVALID_ARGUMENT,
          "options.amax: inf is not finite and >= 0"),
      Opt(
          "amax negative", [](O* o) { o->set_amax(-1.0f); }, Code::INVALID_ARGUMENT,
          "options.amax: -1 is not finite and >= 0"),
      Opt(
          "four-over-six emax 300",
          [](O* o) {
            o->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE);
            o->set_four_over_six_emax(300.0f);
          },
          Code::INVALID_ARGUMENT, "options.four_over_six_emax: 300 is not 256 or 448"),
      Opt(
          "four-over-six with stochastic rounding",
          [](O* o) {
            o->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE);
            o->set_rounding(v1::ROUNDING_STOCHASTIC);
          },
          Code::INVALID_ARGUMENT,
          "options.scale_selection: four_over_six_mae needs options.rounding "
          "nearest"),
      Opt(
          "four-over-six with MXFP4",
          [](O* o) {
            o->set_format(v1::FORMAT_MXFP4);
            o->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MAE);
          },
          Code::INVALID_ARGUMENT,
          "options.scale_selection: four_over_six_mae is NVFP4 only (format "
          "mxfp4)",
          InlineTensor(RandomF32(64, 1), 2, 32)),
      Opt(
          "column-wise output needs rows % 16", [](O* o) { o->set_outputs(v1::OUTPUTS_BOTH); },
          Code::INVALID_ARGUMENT, "input.shape[0]: 2 is not a multiple of the block size 16"),
      Opt(
          "residual key with a column-wise output",
          [](O* o) {
            o->set_residual_key("rk");
            o->set_outputs(v1::OUTPUTS_COLUMNWISE);
          },
          Code::INVALID_ARGUMENT,
          "options.outputs: OUTPUTS_COLUMNWISE, but error feedback (options.residual_key) is "
          "row-wise only",
          InlineTensor(RandomF32(16 * 16, 1), 16, 16)),
      Opt(
          "residual key with RHT",
          [](O* o) {
            o->set_residual_key("rk");
            o->set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
          },
          Code::INVALID_ARGUMENT,
          "options.residual_key: error feedback is not combined with "
          "options.rht default_signs"),
      Opt(
          "residual key with a space", [](O* o) { o->set_residual_key("a b"); },
          Code::INVALID_ARGUMENT, "options.residual_key: byte 1 (0x20) is not allowed"),
      Opt(
          "residual key of 257 bytes", [](O* o) { o->set_residual_key(std::string(257, 'k')); },
          Code::INVALID_ARGUMENT, "options.residual_key: 257 bytes, at most 256"),
      Opt(
          "residual key with a NUL byte", [](O* o) { o->set_residual_key(std::string("a\0b", 3)); },
          Code::INVALID_ARGUMENT, "options.residual_key: byte 1 (0x00) is not allowed"),
      Opt(
          "residual step above 2^63 - 1",
          [](O* o) {
            o->set_residual_key("rk");
            o->set_step(uint64_t{1} << 63);
          },
          Code::INVALID_ARGUMENT, "options.step: 9223372036854775808 is above 2^63 - 1"),
      {"residual key input with NaN",
       [](auto& s, auto&) { return Call(s, Qdq(InlineTensor(NaNs(32, 7), 2, 16), "rk", 1)); },
       Code::INVALID_ARGUMENT, "input: element 7 is NaN"},
      {"residual key input with -Inf",
       [](auto& s, auto&) {
         v1::QuantizeRequest r = Q(InlineTensor(WithInf(RandomF32(32, 1), 9, true), 2, 16));
         r.mutable_options()->set_residual_key("rk");
         r.mutable_options()->set_step(1);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "input: element 9 is -Inf"},
      // ---- output targets.
      {"unknown output region",
       [](auto& s, auto& env) {
         v1::QuantizeRequest r = Q(Good());
         r.mutable_rowwise_codes()->mutable_region()->set_region_id("nope");
         return Call(s, r, env.session);
       },
       Code::NOT_FOUND, "rowwise_codes.region.region_id: no region 'nope'"},
      {"unknown input region",
       [](auto& s, auto& env) {
         return Call(s, Q(RegionTensor("r-unknown", 0, 2, 16)), env.session);
       },
       Code::NOT_FOUND, "input.region.region_id: no region 'r-unknown' in this session"},
      {"region without session",
       [](auto& s, auto&) { return Call(s, Q(RegionTensor("r-unknown", 0, 2, 16))); },
       Code::NOT_FOUND, "(no 'fp4q-session' metadata was sent)"},
      {"region id of 10 KiB is echoed bounded",
       [](auto& s, auto& env) {
         return Call(s, Q(RegionTensor(std::string(10240, 'z'), 0, 2, 16)), env.session);
       },
       Code::NOT_FOUND,
       "input.region.region_id: no region "
       "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...'"},
      // ---- Qdq.
      {"QDQ with RHT",
       [](auto& s, auto&) {
         v1::QdqRequest r = Qdq(Good());
         r.mutable_options()->set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "options.rht: default_signs is not supported by QDQ"},
      {"QDQ column-wise",
       [](auto& s, auto&) {
         v1::QdqRequest r = Qdq(InlineTensor(RandomF32(16 * 16, 1), 16, 16));
         r.mutable_options()->set_outputs(v1::OUTPUTS_COLUMNWISE);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.outputs: OUTPUTS_COLUMNWISE, but QDQ is row-wise only; use OUTPUTS_ROWWISE"},
      {"QDQ both outputs",
       [](auto& s, auto&) {
         v1::QdqRequest r = Qdq(InlineTensor(RandomF32(16 * 16, 1), 16, 16));
         r.mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT,
       "options.outputs: OUTPUTS_BOTH, but QDQ is row-wise only; use OUTPUTS_ROWWISE"},
      {"QDQ out dtype U8",
       [](auto& s, auto&) {
         v1::QdqRequest r = Qdq(Good());
         r.set_out_dtype(v1::DTYPE_U8);
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "out_dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"},
      {"QDQ unknown out dtype",
       [](auto& s, auto&) {
         v1::QdqRequest r = Qdq(Good());
         r.set_out_dtype(static_cast<v1::DType>(77));
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "out_dtype: unknown value 77"},
      // ---- Dequantize.
      Deq(
          "dequantize codes of the wrong size",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->set_codes("abc"); },
          Code::INVALID_ARGUMENT, "input.tensor.codes: 3 bytes, expected 16"),
      Deq(
          "dequantize scales of the wrong size",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->set_scales("a"); },
          Code::INVALID_ARGUMENT, "input.tensor.scales: 1 bytes, expected 2"),
      Deq(
          "dequantize with s_enc 0",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->set_s_enc(0); },
          Code::INVALID_ARGUMENT, "input.tensor.s_enc: 0 must be finite and > 0"),
      Deq(
          "dequantize with s_enc NaN",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->set_s_enc(kNaN); },
          Code::INVALID_ARGUMENT, "input.tensor.s_enc: nan must be finite and > 0"),
      Deq(
          "dequantize with s_enc -Inf",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->set_s_enc(-kInf); },
          Code::INVALID_ARGUMENT, "input.tensor.s_enc: -inf must be finite and > 0"),
      Deq(
          "dequantize unknown format",
          [](v1::DequantizeRequest* r) {
            r->mutable_input()->mutable_tensor()->set_format(static_cast<v1::Format>(3));
          },
          Code::INVALID_ARGUMENT, "input.tensor.format: unknown value 3"),
      Deq(
          "dequantize unknown scale layout",
          [](v1::DequantizeRequest* r) {
            r->mutable_input()->mutable_tensor()->set_scale_layout(static_cast<v1::ScaleLayout>(9));
          },
          Code::INVALID_ARGUMENT, "input.tensor.scale_layout: unknown value 9"),
      Deq(
          "dequantize rank 3",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->add_shape(1); },
          Code::INVALID_ARGUMENT, "input.tensor.shape: [2, 16, 1] has rank 3"),
      Deq(
          "dequantize shape overflow",
          [](v1::DequantizeRequest* r) {
            r->mutable_input()->mutable_tensor()->set_shape(0, kBig);
            r->mutable_input()->mutable_tensor()->set_shape(1, kBig);
          },
          Code::INVALID_ARGUMENT,
          "input.tensor: code bytes of [1099511627776, 1099511627776] exceed "
          "the limit of 2^62"),
      Deq(
          "dequantize without codes",
          [](v1::DequantizeRequest* r) { r->mutable_input()->mutable_tensor()->clear_codes(); },
          Code::INVALID_ARGUMENT, "input.tensor.codes: no data (set the inline bytes or a region)"),
      Deq(
          "dequantize operand not set",
          [](v1::DequantizeRequest* r) { r->mutable_input()->Clear(); }, Code::INVALID_ARGUMENT,
          "input: set tensor or weight_name"),
      Deq(
          "dequantize out dtype U8",
          [](v1::DequantizeRequest* r) { r->set_out_dtype(v1::DTYPE_U8); }, Code::INVALID_ARGUMENT,
          "out_dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"),
      Deq(
          "dequantize weight with a bad name",
          [](v1::DequantizeRequest* r) { r->mutable_input()->set_weight_name("w;rm"); },
          Code::INVALID_ARGUMENT, "input.weight_name: byte 1 (0x3b) is not allowed"),
      Deq(
          "dequantize a path-like weight name (only a key)",
          [](v1::DequantizeRequest* r) { r->mutable_input()->set_weight_name("../etc/passwd"); },
          Code::NOT_FOUND, "input.weight_name: no weight '../etc/passwd'"),
      Deq(
          "dequantize an unknown weight",
          [](v1::DequantizeRequest* r) { r->mutable_input()->set_weight_name("ghost"); },
          Code::NOT_FOUND, "input.weight_name: no weight 'ghost'"),
      Deq(
          "dequantize a residual as a weight",
          [](v1::DequantizeRequest* r) { r->mutable_input()->set_weight_name("r"); },
          Code::INVALID_ARGUMENT, "input.weight_name: 'r' is a residual, not a weight"),
      // ---- Matmul.
      Mm(
          "matmul K mismatch",
          [](v1::MatmulRequest* r) { *r->mutable_b()->mutable_tensor() = ZeroOperand(2, 16); },
          Code::INVALID_ARGUMENT, "b.tensor.shape[1]: 16 does not match a.tensor.shape[1] 32 (K)"),
      Mm(
          "matmul with an unknown weight",
          [](v1::MatmulRequest* r) { r->mutable_b()->set_weight_name("ghost"); }, Code::NOT_FOUND,
          "b.weight_name: no weight 'ghost'"),
      Mm(
          "matmul a not set", [](v1::MatmulRequest* r) { r->mutable_a()->Clear(); },
          Code::INVALID_ARGUMENT, "a: set tensor, weight_name or dense"),
      Mm(
          "matmul formats differ",
          [](v1::MatmulRequest* r) {
            v1::QuantizedTensor* b = r->mutable_b()->mutable_tensor();
            b->set_format(v1::FORMAT_MXFP4);
            b->set_scales(std::string(2, '\0'));
          },
          Code::INVALID_ARGUMENT, "b.tensor.format: mxfp4 does not match a.tensor.format nvfp4"),
      Mm(
          "matmul out dtype F8", [](v1::MatmulRequest* r) { r->set_out_dtype(v1::DTYPE_F8_E4M3); },
          Code::INVALID_ARGUMENT, "out_dtype: DTYPE_F8_E4M3; expected DTYPE_F32 or DTYPE_BF16"),
      Mm(
          "matmul scales NaN-free but s_enc Inf",
          [](v1::MatmulRequest* r) { r->mutable_a()->mutable_tensor()->set_s_enc(kInf); },
          Code::INVALID_ARGUMENT, "a.tensor.s_enc: inf must be finite and > 0"),
      // Dense operands (quantized by the Matmul).
      Mm(
          "matmul dense a with both outputs",
          [](v1::MatmulRequest* r) {
            v1::DenseOperand* d = r->mutable_a()->mutable_dense();
            *d->mutable_tensor() = InlineTensor(RandomF32(2 * 32, 2), 2, 32);
            d->mutable_options()->set_outputs(v1::OUTPUTS_BOTH);
          },
          Code::INVALID_ARGUMENT, "a.dense.options.outputs: OUTPUTS_BOTH, but an operand is"),
      Mm(
          "matmul dense b with a residual key",
          [](v1::MatmulRequest* r) {
            v1::DenseOperand* d = r->mutable_b()->mutable_dense();
            *d->mutable_tensor() = InlineTensor(RandomF32(2 * 32, 3), 2, 32);
            d->mutable_options()->set_residual_key("r");
          },
          Code::INVALID_ARGUMENT, "b.dense.options.residual_key: set, but Matmul changes no"),
      Mm(
          "matmul dense a with bytes short",
          [](v1::MatmulRequest* r) {
            *r->mutable_a()->mutable_dense()->mutable_tensor() =
                InlineTensor(RandomF32(2 * 32, 4).substr(8), 2, 32);
          },
          Code::INVALID_ARGUMENT,
          "a.dense.tensor.inline_data: 248 bytes; DTYPE_F32 [2, 32] needs 256"),
      Mm(
          "matmul dense b column-wise: its K is the tensor's rows",
          [](v1::MatmulRequest* r) {
            v1::DenseOperand* d = r->mutable_b()->mutable_dense();
            *d->mutable_tensor() = InlineTensor(RandomF32(16 * 32, 5), 16, 32);
            d->mutable_options()->set_outputs(v1::OUTPUTS_COLUMNWISE);
          },
          Code::INVALID_ARGUMENT,
          "b.dense.tensor.shape[0]: 16 does not match a.tensor.shape[1] 32 (K)"),
      Deq(
          "dequantize a dense input",
          [](v1::DequantizeRequest* r) {
            *r->mutable_input()->mutable_dense()->mutable_tensor() =
                InlineTensor(RandomF32(2 * 16, 6), 2, 16);
          },
          Code::INVALID_ARGUMENT, "input.dense: Dequantize takes a quantized tensor"),
  };
  return cases;
}

}  // namespace fp4q::server::testing
