// libFuzzer target: fp4qd's request path without the socket.
//
//   bytes -> byte 0 picks the RPC (and, with bit 0x80, "no session") -> the
//   rest is parsed as that RPC's fp4q.v1 request (protobuf) -> the gRPC
//   adapter's conversion (FromProto) -> the engine: routing, region pinning,
//   validation and, for valid requests, the CPU kernels -> the reply conversion
//   (ToProto) and its serialization.
//
// Each input runs against a fresh engine on the fake IPC backend over host
// memory (the engine tests' FakeIpcBackend), holding weights "w" (error
// feedback), "plain", "adam" (AdamW, NVFP4 moments, delayed scaling) and "mom"
// (SGD momentum, 16x16, SR), all [16, 32], residual key "r" ([2, 16]) and a 64 KiB
// region in the caller's session and one in another session. A region id "R" in
// the input is replaced by the caller's region's id and "S" by the other
// session's, so the fuzzer reaches the slice checks without guessing 128-bit
// ids.
//
// What counts as a bug: any sanitizer report (ASan, UBSan), a crash, a hang
// (libFuzzer's -timeout), or a broken invariant checked below (a result with an
// error status AND a reply, or a region byte outside the slices the reply names
// written).
//
// Seeds: FP4Q_FUZZ_WRITE_SEEDS=DIR makes the target write its built-in seed
// requests to DIR and exit (scripts/fuzz.sh --seed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fp4q/v1/fp4q.pb.h"
#include "server/engine.h"
#include "server/engine_test_util.h"
#include "fuzz/fuzz_fixture.h"
#include "server/proto_convert.h"

namespace fp4q::server {
namespace {

namespace v1 = ::fp4q::v1;
using testing::Await;
using testing::FakeIpcBackend;

enum Rpc : uint8_t {
  kQuantize,
  kDequantize,
  kQdq,
  kMatmul,
  kUpdateWeight,
  kCreateWeight,
  kGetWeight,
  kDeleteWeight,
  kResetResidual,
  kRegister,
  kUnregister,
  kStep,
  kResetOptimizer,
  kRpcCount,
};

using fuzzing::Check;
using fuzzing::Fixture;
using fuzzing::MakeFixture;

struct Ids {
  const Fixture& f;
  void operator()(RegionSlice& s) const {
    if (s.region_id == "R") s.region_id = f.region;
    if (s.region_id == "S") s.region_id = f.other_region;
  }
  void operator()(BytesIn& b) const { (*this)(b.region); }
  void operator()(TensorIn& t) const { (*this)(t.data.region); }
  void operator()(OutputTarget& t) const { (*this)(t.region); }
  void operator()(QuantizedOperandIn& q) const {
    (*this)(q.tensor.codes);
    (*this)(q.tensor.scales);
  }
};

// Runs one engine call; checks that an error comes without a reply and a
// success with one.
bool Verbose() {
  static const bool verbose = std::getenv("FP4Q_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

template <typename Res, typename Reply, typename Start>
void Run(Start start, Reply* reply) {
  absl::StatusOr<Res> r = Await<Res>(start);
  if (Verbose()) std::fprintf(stderr, "fuzz_request: %s\n", r.status().ToString().c_str());
  if (!r.ok()) {
    Check(r.status().code() != absl::StatusCode::kOk, "error status");
    Check(!r.status().message().empty(), "an error names what is wrong");
    return;
  }
  ToProto(std::move(*r), reply);
  std::string bytes;
  Check(reply->SerializeToString(&bytes), "reply serializes");
}

template <typename Msg>
bool Parse(Msg* m, const uint8_t* data, size_t size) {
  return m->ParseFromArray(data, static_cast<int>(size));
}

// The adapter's conversion of `m` into *out; false when it refuses the request (its error must
// name what is wrong).
template <typename Req, typename Msg>
bool Convert(const Msg& m, Req* out) {
  absl::StatusOr<Req> r = FromProto(m);
  if (!r.ok()) {
    Check(!r.status().message().empty(), "a conversion error names the field");
    return false;
  }
  *out = std::move(*r);
  return true;
}

void RunOne(Fixture& f, uint8_t selector, const uint8_t* data, size_t size) {
  Engine& e = *f.engine;
  const RequestContext& ctx = (selector & 0x80) ? f.none : f.mine;
  const Ids fix{f};
  switch ((selector & 0x7F) % kRpcCount) {
    case kQuantize: {
      v1::QuantizeRequest m;
      if (!Parse(&m, data, size)) return;
      QuantizeRequest r;
      if (!Convert(m, &r)) return;
      fix(r.input);
      for (auto* t :
           {&r.rowwise_codes, &r.rowwise_scales, &r.columnwise_codes, &r.columnwise_scales}) {
        fix(*t);
      }
      v1::QuantizeReply rep;
      Run<QuantizeResult>([&](auto d) { e.Quantize(ctx, r, d); }, &rep);
      return;
    }
    case kDequantize: {
      v1::DequantizeRequest m;
      if (!Parse(&m, data, size)) return;
      DequantizeRequest r;
      if (!Convert(m, &r)) return;
      fix(r.input);
      fix(r.out);
      v1::DequantizeReply rep;
      Run<DequantizeResult>([&](auto d) { e.Dequantize(ctx, r, d); }, &rep);
      return;
    }
    case kQdq: {
      v1::QdqRequest m;
      if (!Parse(&m, data, size)) return;
      QdqRequest r;
      if (!Convert(m, &r)) return;
      fix(r.input);
      fix(r.out);
      v1::QdqReply rep;
      Run<QdqResult>([&](auto d) { e.Qdq(ctx, r, d); }, &rep);
      return;
    }
    case kMatmul: {
      v1::MatmulRequest m;
      if (!Parse(&m, data, size)) return;
      MatmulRequest r;
      if (!Convert(m, &r)) return;
      fix(r.a);
      fix(r.b);
      fix(r.out);
      v1::MatmulReply rep;
      Run<MatmulResult>([&](auto d) { e.Matmul(ctx, r, d); }, &rep);
      return;
    }
    case kUpdateWeight: {
      v1::UpdateWeightRequest m;
      if (!Parse(&m, data, size)) return;
      UpdateWeightRequest r;
      if (!Convert(m, &r)) return;
      fix(r.update);
      fix(r.dequantized_out);
      v1::UpdateWeightReply rep;
      Run<UpdateWeightResult>([&](auto d) { e.UpdateWeight(ctx, r, d); }, &rep);
      return;
    }
    case kCreateWeight: {
      v1::CreateWeightRequest m;
      if (!Parse(&m, data, size)) return;
      CreateWeightRequest r;
      if (!Convert(m, &r)) return;
      fix(r.initial);
      v1::CreateWeightReply rep;
      Run<CreateWeightResult>([&](auto d) { e.CreateWeight(ctx, r, d); }, &rep);
      return;
    }
    case kGetWeight: {
      v1::GetWeightRequest m;
      if (!Parse(&m, data, size)) return;
      GetWeightRequest r;
      if (!Convert(m, &r)) return;
      fix(r.out);
      v1::GetWeightReply rep;
      Run<GetWeightResult>([&](auto d) { e.GetWeight(ctx, r, d); }, &rep);
      return;
    }
    case kDeleteWeight:
    case kResetResidual: {
      v1::DeleteWeightRequest m;  // same wire shape as ResetResidualRequest
      if (!Parse(&m, data, size)) return;
      v1::DeleteWeightReply rep;
      if ((selector & 0x7F) % kRpcCount == kDeleteWeight) {
        Run<EmptyResult>([&](auto d) { e.DeleteWeight(ctx, NameRequest{m.name()}, d); }, &rep);
      } else {
        Run<EmptyResult>([&](auto d) { e.ResetResidual(ctx, NameRequest{m.name()}, d); }, &rep);
      }
      return;
    }
    case kRegister: {
      v1::RegisterCudaRegionRequest m;
      if (!Parse(&m, data, size)) return;
      absl::StatusOr<std::string> id =
          Await<std::string>([&](auto d) { e.RegisterRegion(ctx, FromProto(m), d); });
      Check(!id.ok(), "the fuzzer cannot know an exported handle");
      return;
    }
    case kUnregister: {
      v1::UnregisterCudaRegionRequest m;
      if (!Parse(&m, data, size)) return;
      RegionSlice s{m.region_id(), 0};
      fix(s);
      Await<EmptyResult>([&](auto d) { e.UnregisterRegion(ctx, s.region_id, d); }).IgnoreError();
      return;
    }
    case kStep: {
      v1::StepRequest m;
      if (!Parse(&m, data, size)) return;
      StepRequest r;
      if (!Convert(m, &r)) return;
      for (StepItemIn& item : r.items) {
        fix(item.update);
        fix(item.dequantized_out);
      }
      v1::StepReply rep;
      Run<StepResult>([&](auto d) { e.Step(ctx, std::move(r), d); }, &rep);
      return;
    }
    case kResetOptimizer: {
      v1::ResetOptimizerRequest m;
      if (!Parse(&m, data, size)) return;
      ResetOptimizerRequest r;
      if (!Convert(m, &r)) return;
      v1::ResetOptimizerReply rep;
      Run<ResetOptimizerResult>([&](auto d) { e.ResetOptimizer(ctx, std::move(r), d); }, &rep);
      return;
    }
  }
}

// ---------------------------------------------------------------- seeds

void Seed(const char* dir, const std::string& name, Rpc rpc, const google::protobuf::Message& m) {
  std::string bytes(1, static_cast<char>(rpc));
  m.AppendToString(&bytes);
  std::ofstream(std::string(dir) + "/seed-" + name, std::ios::binary) << bytes;
}

void WriteSeeds(const char* dir) {
  const std::string x = testing::RandomF32(2 * 32, 3);
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(2);
  t.add_shape(32);
  t.set_inline_data(x);
  v1::Tensor rt = t;
  rt.mutable_region()->set_region_id("R");
  {
    v1::QuantizeRequest q;
    *q.mutable_input() = t;
    Seed(dir, "quantize-inline", kQuantize, q);
    q.mutable_options()->set_rounding(v1::ROUNDING_STOCHASTIC);
    q.mutable_options()->set_rht(v1::RHT_MODE_SEEDED);
    q.mutable_options()->set_scale_layout(v1::SCALE_LAYOUT_SWIZZLED);
    Seed(dir, "quantize-sr-rht", kQuantize, q);
    q.mutable_options()->Clear();
    q.mutable_options()->set_format(v1::FORMAT_MXFP4);
    q.mutable_options()->set_mx_scale_rule(v1::MX_SCALE_RULE_FLOOR);
    Seed(dir, "quantize-mxfp4", kQuantize, q);
    q.mutable_options()->Clear();
    q.mutable_options()->set_scale_selection(v1::SCALE_SELECTION_FOUR_OVER_SIX_MSE);
    q.mutable_options()->set_amax(3.0f);
    Seed(dir, "quantize-4over6", kQuantize, q);
    q.mutable_options()->Clear();
    q.mutable_options()->set_residual_key("k");
    q.mutable_options()->set_step(1);
    Seed(dir, "quantize-residual", kQuantize, q);
    *q.mutable_input() = rt;
    q.mutable_options()->Clear();
    q.mutable_rowwise_codes()->mutable_region()->set_region_id("R");
    q.mutable_rowwise_codes()->mutable_region()->set_offset(4096);
    q.mutable_rowwise_scales()->mutable_region()->set_region_id("R");
    q.mutable_rowwise_scales()->mutable_region()->set_offset(8192);
    Seed(dir, "quantize-region", kQuantize, q);
  }
  {
    v1::QdqRequest q;
    *q.mutable_input() = t;
    q.mutable_options()->set_residual_key("r2");
    Seed(dir, "qdq-residual", kQdq, q);
    *q.mutable_input() = rt;
    q.mutable_options()->Clear();
    q.mutable_out()->mutable_region()->set_region_id("R");
    Seed(dir, "qdq-in-place", kQdq, q);
  }
  v1::QuantizedTensor op;
  op.add_shape(2);
  op.add_shape(32);
  op.set_s_enc(1.0f);
  op.set_codes(std::string(32, '\x21'));
  op.set_scales(std::string(4, '\x38'));
  {
    v1::DequantizeRequest d;
    *d.mutable_input()->mutable_tensor() = op;
    Seed(dir, "dequantize-inline", kDequantize, d);
    d.mutable_input()->set_weight_name("w");
    d.set_out_dtype(v1::DTYPE_BF16);
    Seed(dir, "dequantize-weight", kDequantize, d);
    *d.mutable_input()->mutable_tensor() = op;
    d.mutable_input()->mutable_tensor()->mutable_codes_region()->set_region_id("R");
    Seed(dir, "dequantize-region", kDequantize, d);
  }
  {
    v1::MatmulRequest m;
    *m.mutable_a()->mutable_tensor() = op;
    *m.mutable_b()->mutable_tensor() = op;
    Seed(dir, "matmul-inline", kMatmul, m);
    m.mutable_a()->set_weight_name("w");
    m.mutable_b()->set_weight_name("plain");
    Seed(dir, "matmul-weights", kMatmul, m);
    // Dense operands, quantized in the call: row-wise against a weight, then both column-wise.
    v1::Tensor dense;
    dense.set_dtype(v1::DTYPE_F32);
    dense.add_shape(16);
    dense.add_shape(32);
    dense.set_inline_data(testing::RandomF32(16 * 32, 5, 1.0f));
    *m.mutable_a()->mutable_dense()->mutable_tensor() = dense;
    Seed(dir, "matmul-dense-weight", kMatmul, m);
    *m.mutable_b()->mutable_dense()->mutable_tensor() = dense;
    for (v1::QuantizedOperand* o : {m.mutable_a(), m.mutable_b()}) {
      v1::QuantOptions* q = o->mutable_dense()->mutable_options();
      q->set_outputs(v1::OUTPUTS_COLUMNWISE);
      q->set_rht(v1::RHT_MODE_DEFAULT_SIGNS);
      q->set_rounding(v1::ROUNDING_STOCHASTIC);
    }
    Seed(dir, "matmul-dense-columnwise", kMatmul, m);
  }
  v1::Tensor wt;
  wt.set_dtype(v1::DTYPE_F32);
  wt.add_shape(16);
  wt.add_shape(32);
  wt.set_inline_data(testing::RandomF32(16 * 32, 4, 0.01f));
  {
    v1::UpdateWeightRequest u;
    u.set_name("w");
    u.set_step(6);
    *u.mutable_update() = wt;
    u.set_lr(0.5f);
    u.set_return_dequantized(true);
    Seed(dir, "update-gradient", kUpdateWeight, u);
    u.set_kind(v1::UPDATE_KIND_DELTA);
    u.set_name("plain");
    u.mutable_dequantized_out()->mutable_region()->set_region_id("R");
    Seed(dir, "update-delta-region", kUpdateWeight, u);
  }
  {
    v1::CreateWeightRequest c;
    c.set_name("n/1");
    *c.mutable_initial() = wt;
    c.mutable_options()->set_rounding(v1::ROUNDING_STOCHASTIC);
    c.mutable_options()->set_error_feedback(true);
    Seed(dir, "create", kCreateWeight, c);
  }
  {
    v1::GetWeightRequest g;
    g.set_name("w");
    g.set_dequantized(true);
    g.set_quantized(true);
    g.set_residual(true);
    Seed(dir, "get-all", kGetWeight, g);
    g.mutable_out()->mutable_region()->set_region_id("R");
    g.set_out_dtype(v1::DTYPE_BF16);
    Seed(dir, "get-region", kGetWeight, g);
  }
  {
    v1::DeleteWeightRequest d;
    d.set_name("r");
    Seed(dir, "delete", kDeleteWeight, d);
    d.set_name("w");
    Seed(dir, "reset", kResetResidual, d);
  }
  {
    v1::RegisterCudaRegionRequest r;
    r.set_ipc_handle(std::string(64, 'h'));
    r.set_size(4096);
    r.set_device_uuid("GPU-fake-0");
    Seed(dir, "register", kRegister, r);
    v1::UnregisterCudaRegionRequest u;
    u.set_region_id("R");
    Seed(dir, "unregister", kUnregister, u);
  }
  {
    v1::StepRequest st;
    st.set_step(7);
    v1::Hyperparameters* g = st.add_groups();
    g->set_lr(0.5f);
    g->mutable_sgd()->set_weight_decay(0.01f);
    for (const char* name : {"w", "plain"}) {
      v1::StepItem* item = st.add_items();
      item->set_name(name);
      *item->mutable_update() = wt;
    }
    st.mutable_items(0)->set_return_dequantized(true);
    Seed(dir, "step-two-weights", kStep, st);
    st.mutable_items(1)->mutable_dequantized_out()->mutable_region()->set_region_id("R");
    st.mutable_items(1)->mutable_update()->mutable_region()->set_region_id("R");
    st.mutable_items(1)->mutable_update()->mutable_region()->set_offset(32768);
    st.mutable_items(1)->mutable_update()->clear_inline_data();
    Seed(dir, "step-regions", kStep, st);
    {
      // The step's signals in the caller's region: a done word, and a ready word that holds the
      // value already (0) or never will (1, then DEADLINE_EXCEEDED after 1 ms).
      v1::StepRequest signals = st;
      v1::DoneSignal* done = signals.mutable_done_signal();
      done->mutable_region()->set_region_id("R");
      done->mutable_region()->set_offset(40960);
      done->set_value(7);
      v1::ReadySignal* ready = signals.mutable_ready_signal();
      ready->mutable_region()->set_region_id("R");
      ready->mutable_region()->set_offset(40976);
      Seed(dir, "step-done-ready", kStep, signals);
      ready->set_value(1);
      ready->set_timeout_ms(1);
      Seed(dir, "step-ready-unwritten", kStep, signals);
    }
    {
      // A step plan kept of the region items (brief), and a step naming plan 1 alone.
      v1::StepRequest keep = st;
      keep.mutable_items(0)->set_return_dequantized(false);
      *keep.mutable_items(0)->mutable_update() = *keep.mutable_items(1)->mutable_update();
      keep.mutable_items(0)->mutable_update()->mutable_region()->set_offset(0);
      keep.set_brief_reply(true);
      keep.set_keep_plan(true);
      Seed(dir, "step-keep-plan", kStep, keep);
      v1::StepRequest planned;
      planned.set_step(8);
      *planned.add_groups() = st.groups(0);
      planned.set_brief_reply(true);
      planned.set_plan_id(1);
      Seed(dir, "step-plan-id", kStep, planned);
    }
    st.set_kind(v1::UPDATE_KIND_DELTA);
    st.mutable_groups(0)->clear_sgd();
    Seed(dir, "step-delta", kStep, st);
    v1::StepRequest adam;
    adam.set_step(9);
    v1::AdamWHyperparameters* h = adam.add_groups()->mutable_adamw();
    adam.mutable_groups(0)->set_lr(1e-3f);
    h->set_beta1(0.9f);
    h->set_beta2(0.999f);
    h->set_eps(1e-8f);
    h->set_weight_decay(0.01f);
    v1::Hyperparameters* sgd = adam.add_groups();
    sgd->set_lr(0.1f);
    sgd->mutable_sgd()->set_momentum(0.9f);
    sgd->mutable_sgd()->set_nesterov(true);
    for (const char* name : {"adam", "mom"}) {
      v1::StepItem* item = adam.add_items();
      item->set_name(name);
      *item->mutable_update() = wt;
      item->set_group(std::string(name) == "mom" ? 1 : 0);
      item->set_return_dequantized(true);
    }
    Seed(dir, "step-adamw-momentum", kStep, adam);
    v1::ResetOptimizerRequest ro;
    ro.set_name("w");
    ro.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAMW);
    Seed(dir, "reset-optimizer", kResetOptimizer, ro);
  }
}

}  // namespace
}  // namespace fp4q::server

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FP4Q_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir != '\0') {
    fp4q::server::WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto f = fp4q::server::MakeFixture();
  const std::vector<uint8_t> before = f->other_memory;
  fp4q::server::RunOne(*f, data[0], data + 1, size - 1);
  // The other session's memory is never touched, whatever the request.
  fp4q::server::fuzzing::Check(f->other_memory == before, "another session's region was written");
  return 0;
}
