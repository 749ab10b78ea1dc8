// Hostile inputs of the state RPCs (weights, residual keys) and of sessions and
// regions on a server without working IPC (e2e_bad_input.h).
#include <cstdint>
#include <limits>

#include "e2e_bad_input.h"

namespace fp4q::server::testing {
namespace {

using Code = grpc::StatusCode;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

v1::Tensor W() { return InlineTensor(RandomF32(16 * 32, 1), 16, 32); }

// An UpdateWeight of "w" at step 6 changed by `set`.
template <typename F>
BadCase Upd(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::UpdateWeightRequest r = U("w", 6, W());
            set(&r);
            return Call(s, r);
          },
          code, std::move(message)};
}

// A CreateWeight of "n" [16, 32] changed by `set`.
template <typename F>
BadCase Cre(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::CreateWeightRequest r = C("n", W());
            set(&r);
            return Call(s, r);
          },
          code, std::move(message)};
}

// A GetWeight of "w" changed by `set`.
template <typename F>
BadCase Get(std::string name, F set, Code code, std::string message) {
  return {std::move(name),
          [set](v1::Fp4q::Stub& s, const BadEnv&) {
            v1::GetWeightRequest r;
            r.set_name("w");
            r.set_dequantized(true);
            set(&r);
            return Call(s, r);
          },
          code, std::move(message)};
}

v1::RegisterCudaRegionRequest Reg(size_t handle_bytes, uint64_t size) {
  v1::RegisterCudaRegionRequest r;
  r.set_ipc_handle(std::string(handle_bytes, 'h'));
  r.set_size(size);
  return r;
}

}  // namespace

std::vector<BadCase> StateCases() {
  using UR = v1::UpdateWeightRequest;
  using CR = v1::CreateWeightRequest;
  using GR = v1::GetWeightRequest;
  std::vector<BadCase> cases = {
      // ---- UpdateWeight: name, step, update, lr, kind, targets.
      Upd(
          "update of an unknown weight", [](UR* r) { r->set_name("ghost"); }, Code::NOT_FOUND,
          "name: no weight 'ghost'"),
      Upd(
          "update with an empty name", [](UR* r) { r->set_name(""); }, Code::INVALID_ARGUMENT,
          "name: empty"),
      Upd(
          "update of a residual key", [](UR* r) { r->set_name("r"); }, Code::INVALID_ARGUMENT,
          "name: 'r' is a residual key, not a weight"),
      Upd(
          "update shape mismatch",
          [](UR* r) { *r->mutable_update() = InlineTensor(RandomF32(256, 1), 16, 16); },
          Code::INVALID_ARGUMENT,
          "update.shape: [16, 16] does not match weight 'w' of shape [16, 32]"),
      Upd(
          "update transposed shape",
          [](UR* r) { *r->mutable_update() = InlineTensor(RandomF32(512, 1), 32, 16); },
          Code::INVALID_ARGUMENT,
          "update.shape: [32, 16] does not match weight 'w' of shape [16, 32]"),
      Upd(
          "update dtype F8",
          [](UR* r) {
            *r->mutable_update() = InlineTensor(std::string(512, '\0'), 16, 32, v1::DTYPE_F8_E4M3);
          },
          Code::INVALID_ARGUMENT, "update.dtype: DTYPE_F8_E4M3; expected DTYPE_F32 or DTYPE_BF16"),
      Upd(
          "update bytes short", [](UR* r) { r->mutable_update()->set_inline_data("abcd"); },
          Code::INVALID_ARGUMENT, "update.inline_data: 4 bytes; DTYPE_F32 [16, 32] needs 2048"),
      Upd(
          "update without data", [](UR* r) { r->mutable_update()->clear_inline_data(); },
          Code::INVALID_ARGUMENT, "update: no data (set inline_data or region)"),
      Upd(
          "NaN-filled update",
          [](UR* r) { *r->mutable_update() = InlineTensor(NaNs(512), 16, 32); },
          Code::INVALID_ARGUMENT, "update: element 0 is NaN (weight 'w', step 6); nothing was applied"),
      Upd(
          "update with one +Inf",
          [](UR* r) {
            *r->mutable_update() = InlineTensor(WithInf(RandomF32(512, 1), 511), 16, 32);
          },
          Code::INVALID_ARGUMENT, "update: element 511 is Inf"),
      Upd(
          "older step", [](UR* r) { r->set_step(4); }, Code::FAILED_PRECONDITION,
          "step: 4 is older than the last step 5 of weight 'w'"),
      Upd(
          "negative step", [](UR* r) { r->set_step(-1); }, Code::FAILED_PRECONDITION,
          "step: -1 is older than the last step 5 of weight 'w'"),
      Upd(
          "int64 min step", [](UR* r) { r->set_step(std::numeric_limits<int64_t>::min()); },
          Code::FAILED_PRECONDITION,
          "step: -9223372036854775808 is older than the last step 5 of weight "
          "'w'"),
      Upd(
          "unknown update kind", [](UR* r) { r->set_kind(static_cast<v1::UpdateKind>(9)); },
          Code::INVALID_ARGUMENT, "kind: unknown value 9"),
      Upd(
          "lr NaN", [](UR* r) { r->set_lr(kNaN); }, Code::INVALID_ARGUMENT,
          "lr: nan is not finite"),
      Upd(
          "lr -Inf", [](UR* r) { r->set_lr(-kInf); }, Code::INVALID_ARGUMENT,
          "lr: -inf is not finite"),
      Upd(
          "dequantized_out region without a session",
          [](UR* r) { r->mutable_dequantized_out()->mutable_region()->set_region_id("x"); },
          Code::NOT_FOUND, "dequantized_out.region.region_id: no region 'x'"),
      // ---- CreateWeight: name, initial, options, step, device.
      Cre(
          "create an existing name", [](CR* r) { r->set_name("w"); }, Code::ALREADY_EXISTS,
          "name: 'w' already exists"),
      Cre(
          "create over a residual key", [](CR* r) { r->set_name("r"); }, Code::ALREADY_EXISTS,
          "name: 'r' already exists"),
      Cre(
          "create with a bad name", [](CR* r) { r->set_name("a b"); }, Code::INVALID_ARGUMENT,
          "name: byte 1 (0x20) is not allowed"),
      Cre(
          "create with an empty name", [](CR* r) { r->set_name(""); }, Code::INVALID_ARGUMENT,
          "name: empty"),
      Cre(
          "create with a 257-byte name", [](CR* r) { r->set_name(std::string(257, 'n')); },
          Code::INVALID_ARGUMENT, "name: 257 bytes, at most 256"),
      Cre(
          "create with a non-ASCII name", [](CR* r) { r->set_name("w\xc3\xa9"); },
          Code::INVALID_ARGUMENT, "name: byte 1 (0xc3) is not allowed"),
      Cre(
          "create with NaN",
          [](CR* r) { *r->mutable_initial() = InlineTensor(NaNs(512, 3), 16, 32); },
          Code::INVALID_ARGUMENT, "initial: element 3 is NaN"),
      Cre(
          "create with bf16 +Inf",
          [](CR* r) {
            std::string b = RandomBF16(512, 1);
            b[2 * 17] = 0x80;
            b[2 * 17 + 1] = 0x7f;
            *r->mutable_initial() = InlineTensor(b, 16, 32, v1::DTYPE_BF16);
          },
          Code::INVALID_ARGUMENT, "initial: element 17 is Inf"),
      Cre(
          "create with U8 initial",
          [](CR* r) {
            *r->mutable_initial() = InlineTensor(std::string(512, 'a'), 16, 32, v1::DTYPE_U8);
          },
          Code::INVALID_ARGUMENT, "initial.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"),
      Cre(
          "create with cols % 16",
          [](CR* r) { *r->mutable_initial() = InlineTensor(RandomF32(16 * 8, 1), 16, 8); },
          Code::INVALID_ARGUMENT, "initial.shape[1]: 8 is not a multiple of the block size 16"),
      Cre(
          "create 16x16 with rows % 16",
          [](CR* r) {
            *r->mutable_initial() = InlineTensor(RandomF32(8 * 32, 1), 8, 32);
            r->mutable_options()->set_block(v1::BLOCK_SHAPE_16X16);
          },
          Code::INVALID_ARGUMENT, "initial.shape[0]: 8 is not a multiple of 16 (16x16 blocks)"),
      Cre(
          "create with an MXFP4 block",
          [](CR* r) { r->mutable_options()->set_block(v1::BLOCK_SHAPE_1X32); },
          Code::INVALID_ARGUMENT, "options.block: BLOCK_SHAPE_1X32 is MXFP4's"),
      Cre(
          "create with an unknown block",
          [](CR* r) { r->mutable_options()->set_block(static_cast<v1::BlockShape>(12)); },
          Code::INVALID_ARGUMENT, "options.block: unknown value 12"),
      Cre(
          "create with an unknown rounding",
          [](CR* r) { r->mutable_options()->set_rounding(static_cast<v1::Rounding>(5)); },
          Code::INVALID_ARGUMENT, "options.rounding: unknown value 5"),
      Cre(
          "create with dtype option U8",
          [](CR* r) { r->mutable_options()->set_dtype(v1::DTYPE_U8); }, Code::INVALID_ARGUMENT,
          "options.dtype: DTYPE_U8; expected DTYPE_F32 or DTYPE_BF16"),
      Cre(
          "create with a negative step", [](CR* r) { r->set_step(-5); }, Code::INVALID_ARGUMENT,
          "step: -5 must be >= 0"),
      Cre(
          "create on an unknown device", [](CR* r) { r->set_device_uuid("GPU-nope"); },
          Code::INVALID_ARGUMENT, "device_uuid: 'GPU-nope' is not a device this server serves"),
      Cre(
          "create over the memory budget",
          [](CR* r) {
            r->set_name("big");
            *r->mutable_initial() = InlineTensor(RandomF32(256 * 256, 1), 256, 256);
          },
          Code::RESOURCE_EXHAUSTED,
          "name: 'big' needs 36904 bytes of state; 17168 of the 20000-byte "
          "state budget are free"),
      // ---- GetWeight / DeleteWeight / ResetResidual.
      Get(
          "get an unknown weight", [](GR* r) { r->set_name("ghost"); }, Code::NOT_FOUND,
          "name: no weight 'ghost'"),
      Get(
          "get with a bad name", [](GR* r) { r->set_name("w*"); }, Code::INVALID_ARGUMENT,
          "name: byte 1 (0x2a) is not allowed"),
      Get(
          "get with an unknown out dtype",
          [](GR* r) { r->set_out_dtype(static_cast<v1::DType>(6)); }, Code::INVALID_ARGUMENT,
          "out_dtype: unknown value 6"),
      Get(
          "get with out dtype E8M0", [](GR* r) { r->set_out_dtype(v1::DTYPE_F8_E8M0); },
          Code::INVALID_ARGUMENT, "out_dtype: DTYPE_F8_E8M0; expected DTYPE_F32 or DTYPE_BF16"),
      Get(
          "get a target without dequantized",
          [](GR* r) {
            r->set_dequantized(false);
            r->mutable_out()->mutable_region()->set_region_id("x");
          },
          Code::NOT_FOUND, "out.region.region_id: no region 'x'"),
      Get(
          "residual of a weight without error feedback",
          [](GR* r) {
            r->set_name("plain");
            r->set_residual(true);
          },
          Code::FAILED_PRECONDITION, "residual: weight 'plain' keeps no residual"),
      {"reset an unknown residual",
       [](auto& s, auto&) {
         v1::ResetResidualRequest r;
         r.set_name("ghost");
         return Call(s, r);
       },
       Code::NOT_FOUND, "name: no weight or residual 'ghost'"},
      {"reset a weight without error feedback",
       [](auto& s, auto&) {
         v1::ResetResidualRequest r;
         r.set_name("plain");
         return Call(s, r);
       },
       Code::FAILED_PRECONDITION, "name: weight 'plain' keeps no residual"},
      {"reset with an empty name",
       [](auto& s, auto&) { return Call(s, v1::ResetResidualRequest()); }, Code::INVALID_ARGUMENT,
       "name: empty"},
      {"delete an unknown weight",
       [](auto& s, auto&) {
         v1::DeleteWeightRequest r;
         r.set_name("ghost");
         return Call(s, r);
       },
       Code::NOT_FOUND, "name: no weight or residual 'ghost'"},
      {"delete with a path-like name",
       [](auto& s, auto&) {
         v1::DeleteWeightRequest r;
         r.set_name("/etc/passwd\n");
         return Call(s, r);
       },
       Code::INVALID_ARGUMENT, "name: byte 11 (0x0a) is not allowed"},
      // ---- Residual keys (Qdq).
      {"residual step repeated",
       [](auto& s, auto&) { return Call(s, Qdq(InlineTensor(RandomF32(32, 2), 2, 16), "r", 3)); },
       Code::ALREADY_EXISTS, "options.step: 3 was already applied to residual 'r'"},
      {"residual step older",
       [](auto& s, auto&) { return Call(s, Qdq(InlineTensor(RandomF32(32, 2), 2, 16), "r", 2)); },
       Code::FAILED_PRECONDITION, "options.step: 2 is older than the last step 3 of residual 'r'"},
      {"residual shape mismatch",
       [](auto& s, auto&) { return Call(s, Qdq(InlineTensor(RandomF32(64, 2), 4, 16), "r", 4)); },
       Code::INVALID_ARGUMENT, "input.shape: [4, 16] does not match residual 'r' of shape [2, 16]"},
      {"residual dtype bf16 input with Inf",
       [](auto& s, auto&) {
         std::string b = RandomBF16(32, 1);
         b[0] = 0x80;
         b[1] = static_cast<char>(0xff);
         return Call(s, Qdq(InlineTensor(b, 2, 16, v1::DTYPE_BF16), "r", 4));
       },
       Code::INVALID_ARGUMENT, "input: element 0 is -Inf"},
      {"residual key names a weight",
       [](auto& s, auto&) {
         return Call(s, Qdq(InlineTensor(RandomF32(16 * 32, 2), 16, 32), "w", 9));
       },
       Code::INVALID_ARGUMENT, "options.residual_key: 'w' is a stored weight"},
  };
  return cases;
}

std::vector<BadCase> SessionCases() {
  std::vector<BadCase> cases = {
      {"IPC handle of the wrong size",
       [](auto& s, auto& env) { return Call(s, Reg(10, 1 << 20), env.session); },
       Code::INVALID_ARGUMENT, "ipc_handle: 10 bytes, expected 64"},
      {"IPC handle empty", [](auto& s, auto& env) { return Call(s, Reg(0, 1 << 20), env.session); },
       Code::INVALID_ARGUMENT, "ipc_handle: 0 bytes, expected 64"},
      {"region size 0", [](auto& s, auto& env) { return Call(s, Reg(64, 0), env.session); },
       Code::INVALID_ARGUMENT, "size: 0, must be > 0"},
      {"region on an unknown device",
       [](auto& s, auto& env) {
         v1::RegisterCudaRegionRequest r = Reg(64, 4096);
         r.set_device_uuid("GPU-00000000-dead");
         return Call(s, r, env.session);
       },
       Code::INVALID_ARGUMENT,
       "device_uuid: 'GPU-00000000-dead' is not a device this server serves"},
      {"IPC on the CPU backend",
       [](auto& s, auto& env) { return Call(s, Reg(64, 1 << 20), env.session); },
       Code::FAILED_PRECONDITION, "CUDA IPC is not available on the CPU backend"},
      {"register without a session", [](auto& s, auto&) { return Call(s, Reg(64, 1 << 20)); },
       Code::NOT_FOUND, "session: unknown or expired session"},
      {"register with a forged session",
       [](auto& s, auto&) { return Call(s, Reg(64, 1 << 20), std::string(32, 'f')); },
       Code::NOT_FOUND, "session: unknown or expired session"},
      {"unregister an unknown region",
       [](auto& s, auto& env) {
         v1::UnregisterCudaRegionRequest r;
         r.set_region_id("r-x");
         return Call(s, r, env.session);
       },
       Code::NOT_FOUND, "region_id: no region 'r-x' in this session"},
      {"unregister with an empty id",
       [](auto& s, auto& env) { return Call(s, v1::UnregisterCudaRegionRequest(), env.session); },
       Code::NOT_FOUND, "region_id: no region '' in this session"},
      {"keep-alive of an unknown session",
       [](auto& s, auto&) {
         v1::KeepAliveReply rep;
         auto ctx = Context("0123456789abcdef0123456789abcdef");
         return s.KeepAlive(ctx.get(), v1::KeepAliveRequest(), &rep);
       },
       Code::NOT_FOUND, "session: unknown or expired session"},
      {"keep-alive without session metadata",
       [](auto& s, auto&) {
         v1::KeepAliveReply rep;
         auto ctx = Context();
         return s.KeepAlive(ctx.get(), v1::KeepAliveRequest(), &rep);
       },
       Code::NOT_FOUND, "session: unknown or expired session"},
      {"close an unknown session",
       [](auto& s, auto&) {
         v1::CloseSessionReply rep;
         auto ctx = Context(std::string(100, 'a'));
         return s.CloseSession(ctx.get(), v1::CloseSessionRequest(), &rep);
       },
       Code::NOT_FOUND, "session: unknown or expired session"},
  };
  return cases;
}

}  // namespace fp4q::server::testing
