// The CUDA backend's optimizer step against the CPU reference, bit for bit: every optimizer x
// state dtype x scaling x rounding x block x error feedback over awkward shapes (1x16, 7x48,
// 217x256; 16x16 tiles with rows % 16 == 0) and value ranges, several steps, whole batches of
// mixed variants (one grouped launch per variant; item tables in each of the init launch's
// argument sizes and by the copy), every refusal (reported identically, nothing
// written on the device), and the step queued behind a device-side wait. Device buffers start
// poisoned. FiniteGuard and Amax: cuda_finite_guard_test.cc.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/cuda_step_util.h"
#include "kernels/step_test_util.h"

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DeviceBuffer;
using cuda_testing::DeviceState;
using cuda_testing::SameReport;
using cuda_testing::Dist;
using step_testing::MakeItem;
using step_testing::MakeState;
using step_testing::SameState;
using step_testing::kSweepOptimizers;
using step_testing::SweepHyper;
using step_testing::SweepOptimizer;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;

// Runs the batch on a backend: check, report (first, as a multi-device caller does), apply.
absl::Status RunBatch(Backend& b, const std::vector<StepItem>& items, StepReport* report) {
  const size_t bytes = StepWorkspaceBytes(items);
  auto ws = b.Allocate(bytes);
  if (!ws.ok()) return ws.status();
  absl::Status s = b.StepCheck(items, *ws, bytes, nullptr);
  if (s.ok()) s = b.StepReadReport(items, *ws, report, nullptr);
  if (s.ok()) s = b.StepApply(items, *ws, nullptr);
  if (s.ok()) s = b.Synchronize(nullptr);
  b.Free(*ws);
  return s;
}

// Runs the batch as fp4qd runs one device's step: validated once, check and apply queued
// together (StepCheckAndApply: the CUDA backend builds its item table once), then the report.
absl::Status RunBatchTogether(Backend& b, const std::vector<StepItem>& items, StepReport* report) {
  absl::StatusOr<ValidatedStep> step = ValidatedStep::Check(items);
  if (!step.ok()) return step.status();
  const size_t bytes = StepWorkspaceBytes(items);
  auto ws = b.Allocate(bytes);
  if (!ws.ok()) return ws.status();
  absl::Status s = b.StepCheckAndApply(*step, *ws, bytes, nullptr);
  if (s.ok()) s = b.StepReadReport(items, *ws, report, nullptr);
  b.Free(*ws);
  return s;
}

Updates RandomUpdates(const StepCase& c, Dist dist, float scale, std::mt19937& rng) {
  Updates u;
  for (DType d : c.update_dtypes) {
    std::vector<float> v = cuda_testing::RandomValues(c.n(), dist, rng);
    for (float& x : v) x *= scale;
    if (d == DType::kF32) {
      u.push_back(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(v.data()),
                                       reinterpret_cast<uint8_t*>(v.data() + v.size())));
    } else {
      const std::vector<uint16_t> b = cuda_testing::ToBf16(v);
      u.push_back(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()),
                                       reinterpret_cast<const uint8_t*>(b.data() + b.size())));
    }
  }
  return u;
}

// Every variant the kernels template over, with shapes and cheap options spread over them.
std::vector<StepCase> Variants() {
  std::vector<StepCase> out;
  const std::pair<int64_t, int64_t> flat[] = {{1, 16}, {7, 48}, {217, 256}, {3, 1040}};
  const std::pair<int64_t, int64_t> tiles[] = {{16, 16}, {32, 48}, {48, 144}, {256, 272}};
  int id = 0;
  for (const SweepOptimizer& opt : kSweepOptimizers) {
    for (StateDType dtype : {StateDType::kF32, StateDType::kBF16, StateDType::kNvfp4}) {
      if (opt.kind == OptimizerKind::kSgd && !opt.momentum && dtype != StateDType::kF32) continue;
      for (Scaling scaling : {Scaling::kCurrent, Scaling::kDelayed}) {
        for (BlockShape block : {BlockShape::k1x16, BlockShape::k16x16}) {
          for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
            for (bool ef : {false, true}) {
              ++id;
              StepCase c;
              c.opt = opt.kind;
              c.momentum = opt.momentum;
              c.amsgrad = opt.amsgrad;
              c.dtype = dtype;
              c.scaling = scaling;
              c.block = block;
              c.rounding = rounding;
              c.residual = ef;
              c.kind = opt.delta ? UpdateKind::kDelta : UpdateKind::kGradient;
              const auto shape = block == BlockShape::k1x16 ? flat[id % 4] : tiles[id % 4];
              c.rows = shape.first;
              c.cols = shape.second;
              c.layout = id % 5 == 2 ? ScaleLayout::kSwizzled : ScaleLayout::kPlain;
              c.update_dtypes.clear();
              for (int k = 0; k <= id % 3; ++k) {
                c.update_dtypes.push_back((id + k) % 2 ? DType::kBF16 : DType::kF32);
              }
              c.out_dtypes = id % 3 == 0   ? std::vector<DType>{DType::kBF16}
                             : id % 3 == 1 ? std::vector<DType>{}
                                           : std::vector<DType>{DType::kF32, DType::kBF16};
              c.hyper = SweepHyper(opt, id);
              c.seed = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(id);
              out.push_back(c);
            }
          }
        }
      }
    }
  }
  return out;
}

// One item over three steps on both backends; the value range changes per step.
TEST_F(CudaTest, StepMatchesCpuForEveryVariant) {
  const Dist dists[] = {Dist::kNormal, Dist::kOutliers, Dist::kMidpoints, Dist::kHeavyTail};
  int id = 0;
  for (StepCase c : Variants()) {
    ++id;
    SCOPED_TRACE(c.Name());
    auto rng = Rng(7000 + id);
    StepState host = MakeState(cpu(), c, 100 + id);
    StepState dev_shape = host;
    DeviceState dev(gpu(), host, {});
    for (int t = 1; t <= 3; ++t) {
      SCOPED_TRACE(absl::StrCat("step ", t));
      c.hyper.t = t;
      c.step = static_cast<uint64_t>(t);
      const Dist dist = dists[(id + t) % 4];
      const Updates u = RandomUpdates(c, dist, dist == Dist::kHeavyTail ? 1e-3f : 0.5f, rng);
      DeviceState du(gpu(), host, u);  // fresh updates and outputs; the state carried below
      du.weight = std::move(dev.weight);
      du.residual = std::move(dev.residual);
      du.stats = std::move(dev.stats);
      for (int j = 0; j < 3; ++j) {
        du.m_dense[j] = std::move(dev.m_dense[j]);
        du.m_q[j] = std::move(dev.m_q[j]);
      }
      step_testing::PoisonOutputs(&host);
      StepReport want, got;
      ASSERT_TRUE(RunBatch(cpu(), {MakeItem(c, &host, u)}, &want).ok());
      const absl::Status s = RunBatch(gpu(), {du.Item(c, &dev_shape, u)}, &got);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(SameReport(got, want));
      StepState got_state = du.Download(host);
      if (!want.ok) {
        // Refused on both: nothing written on the device either (outputs still poisoned).
        for (auto& o : got_state.outs) {
          EXPECT_EQ(o, std::vector<uint8_t>(o.size(), cuda_testing::kDevicePoison));
        }
        got_state.outs = host.outs;
      }
      EXPECT_TRUE(SameState(got_state, host));
      dev = std::move(du);
    }
  }
}

// A batch of every variant at once (grouped launches over mixed items), twice; then the same
// batch with one bad item: the report matches and no device byte changes.
TEST_F(CudaTest, BatchesMatchCpuAndRefuseWhole) {
  std::vector<StepCase> cases = Variants();
  std::vector<StepState> host;
  std::vector<Updates> updates;
  std::vector<std::unique_ptr<DeviceState>> dev;
  std::vector<StepState> shapes;
  auto rng = Rng(8000);
  cases[5].out_dtypes.clear();  // a check-only item writes nothing (outputs stay as they were)
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].hyper.t = 1;
    host.push_back(MakeState(cpu(), cases[i], 200 + static_cast<uint32_t>(i)));
    updates.push_back(RandomUpdates(cases[i], Dist::kNormal, 0.5f, rng));
    dev.push_back(std::make_unique<DeviceState>(gpu(), host[i], updates[i]));
  }
  shapes = host;
  auto items = [&](bool on_gpu) {
    std::vector<StepItem> v;
    for (size_t i = 0; i < cases.size(); ++i) {
      v.push_back(on_gpu ? dev[i]->Item(cases[i], &shapes[i], updates[i])
                         : MakeItem(cases[i], &host[i], updates[i]));
    }
    // Item 5 only checks a fingerprint (its own, right).
    v[5].check_only = true;
    v[5].expect_fingerprints.clear();
    for (size_t k = 0; k < updates[5].size(); ++k) {
      v[5].expect_fingerprints.push_back(step_testing::ReferenceFingerprint(
          updates[5][k].data(), cases[5].update_dtypes[k], cases[5].rows, cases[5].cols));
    }
    return v;
  };
  StepReport want, got;
  ASSERT_TRUE(RunBatch(cpu(), items(false), &want).ok());
  ASSERT_TRUE(RunBatch(gpu(), items(true), &got).ok());
  ASSERT_TRUE(want.ok);
  EXPECT_TRUE(SameReport(got, want));
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(SameState(dev[i]->Download(host[i]), host[i])) << cases[i].Name();
  }
  // Item 3 gets an Inf: nothing of any item changes, on either backend.
  const std::vector<StepState> before = host;
  std::vector<StepState> dev_before;
  for (size_t i = 0; i < cases.size(); ++i) dev_before.push_back(dev[i]->Download(host[i]));
  const float inf = std::numeric_limits<float>::infinity();
  const size_t at = cases[3].n() / 2;
  if (cases[3].update_dtypes[0] == DType::kF32) {
    std::memcpy(updates[3][0].data() + 4 * at, &inf, 4);
  } else {
    const uint16_t b = 0x7F80;
    std::memcpy(updates[3][0].data() + 2 * at, &b, 2);
  }
  dev[3]->updates[0]->Upload(updates[3][0].data(), updates[3][0].size());
  for (size_t i = 0; i < cases.size(); ++i) cases[i].hyper.t = 2;
  ASSERT_TRUE(RunBatch(cpu(), items(false), &want).ok());
  ASSERT_TRUE(RunBatchTogether(gpu(), items(true), &got).ok());  // as fp4qd runs it
  EXPECT_FALSE(want.ok);
  EXPECT_EQ(want.items[3].outcome, StepOutcome::kNonFiniteUpdate);
  EXPECT_EQ(want.items[3].index, static_cast<int64_t>(at));
  EXPECT_TRUE(SameReport(got, want));
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(SameState(host[i], before[i])) << cases[i].Name();
    EXPECT_TRUE(SameState(dev[i]->Download(host[i]), dev_before[i])) << cases[i].Name();
  }
}

// Batches of 1, 10, 36 and 80 items, as fp4qd queues them (StepCheckAndApply): the item table
// goes to the device inside the init kernel's launch in each of its three argument sizes (about
// 1.6, 6 and 17 KB here) and, for 80 items (over 24 KB), by the host-to-device copy. Every size
// must apply alike, bit for bit against the CPU backend.
TEST_F(CudaTest, ItemTablesOfEverySizeMatchCpu) {
  const std::vector<StepCase> variants = Variants();
  for (size_t n : {size_t{1}, size_t{10}, size_t{36}, size_t{80}}) {
    SCOPED_TRACE(absl::StrCat(n, " items"));
    std::vector<StepCase> cases;
    std::vector<StepState> host, shapes;
    std::vector<Updates> updates;
    std::vector<std::unique_ptr<DeviceState>> dev;
    auto rng = Rng(8500 + static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) {
      cases.push_back(variants[(7 * i + n) % variants.size()]);
      cases[i].hyper.t = 1;
      host.push_back(MakeState(cpu(), cases[i], 600 + static_cast<uint32_t>(i)));
      updates.push_back(RandomUpdates(cases[i], Dist::kNormal, 0.5f, rng));
      dev.push_back(std::make_unique<DeviceState>(gpu(), host[i], updates[i]));
    }
    shapes = host;
    std::vector<StepItem> want_items, got_items;
    for (size_t i = 0; i < n; ++i) {
      want_items.push_back(MakeItem(cases[i], &host[i], updates[i]));
      got_items.push_back(dev[i]->Item(cases[i], &shapes[i], updates[i]));
    }
    StepReport want, got;
    ASSERT_TRUE(RunBatch(cpu(), want_items, &want).ok());
    const absl::Status s = RunBatchTogether(gpu(), got_items, &got);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(want.ok);
    EXPECT_TRUE(SameReport(got, want));
    for (size_t i = 0; i < n; ++i) {
      EXPECT_TRUE(SameState(dev[i]->Download(host[i]), host[i])) << cases[i].Name();
    }
  }
}

// Steps the batch `cases` `steps` times on both backends: fresh updates (normal at step 1,
// outliers after) and poisoned outputs each step, the weights and their state carried over from
// step to step (`host` on the CPU, `dev` on the device, `shape` the device items' host layout).
// Every step must be applied alike, bit for bit, whether the device's check and apply are
// queued together or apart.
void StepCarriedOver(Backend& cpu, Backend& gpu, std::vector<StepCase>& cases,
                     std::vector<StepState>& host, std::vector<StepState>& shape,
                     std::vector<std::unique_ptr<DeviceState>>& dev, std::mt19937& rng,
                     int steps) {
  for (int t = 1; t <= steps; ++t) {
    SCOPED_TRACE(absl::StrCat(cases[0].Name(), " step ", t));
    std::vector<Updates> u;
    std::vector<std::unique_ptr<DeviceState>> du;
    std::vector<StepItem> want_items, got_items;
    for (size_t i = 0; i < cases.size(); ++i) {
      cases[i].hyper.t = t;
      cases[i].step = static_cast<uint64_t>(t);
      u.push_back(RandomUpdates(cases[i], t == 1 ? Dist::kNormal : Dist::kOutliers, 0.5f, rng));
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      // Fresh updates and (poisoned) outputs on the device; the state carried over.
      auto d = std::make_unique<DeviceState>(gpu, host[i], u[i]);
      d->weight = std::move(dev[i]->weight);
      d->residual = std::move(dev[i]->residual);
      d->stats = std::move(dev[i]->stats);
      for (int j = 0; j < 3; ++j) {
        d->m_dense[j] = std::move(dev[i]->m_dense[j]);
        d->m_q[j] = std::move(dev[i]->m_q[j]);
      }
      step_testing::PoisonOutputs(&host[i]);
      want_items.push_back(MakeItem(cases[i], &host[i], u[i]));
      got_items.push_back(d->Item(cases[i], &shape[i], u[i]));
      du.push_back(std::move(d));
    }
    StepReport want, got;
    ASSERT_TRUE(RunBatch(cpu, want_items, &want).ok());
    // Odd steps as fp4qd runs one device's step, even ones as it runs a part of several.
    const absl::Status s = t % 2 == 1 ? RunBatchTogether(gpu, got_items, &got)
                                      : RunBatch(gpu, got_items, &got);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(want.ok);
    EXPECT_TRUE(SameReport(got, want));
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_TRUE(SameState(du[i]->Download(host[i]), host[i])) << cases[i].Name();
    }
    dev = std::move(du);
  }
}

// Batches large enough that every warp of a grouped launch walks a long run of slots (the grid is
// capped at the resident CTAs, so a warp's run spans ~16+ slots here, where the sweeps above give
// it two), crossing item boundaries mid-run: the step kernels' slot ring and L2 prefetch in their
// steady state. One batch per variant family (three items each, 18M elements), two steps.
TEST_F(CudaTest, LongWarpRunsMatchCpu) {
  struct Family {
    int opt;  // index into kSweepOptimizers
    StateDType dtype;
    Scaling scaling;
    BlockShape block;
    Rounding rounding;
    bool ef;
    std::vector<DType> updates, outs;
  };
  const Family families[] = {
      {0, StateDType::kF32, Scaling::kCurrent, BlockShape::k1x16, Rounding::kNearest, true,
       {DType::kBF16}, {DType::kBF16}},
      {0, StateDType::kF32, Scaling::kDelayed, BlockShape::k16x16, Rounding::kStochastic, true,
       {DType::kF32}, {}},
      {3, StateDType::kBF16, Scaling::kDelayed, BlockShape::k1x16, Rounding::kNearest, true,
       {DType::kBF16, DType::kF32}, {DType::kF32}},
      {4, StateDType::kF32, Scaling::kCurrent, BlockShape::k1x16, Rounding::kStochastic, true,
       {DType::kBF16}, {DType::kBF16}},
      {4, StateDType::kNvfp4, Scaling::kDelayed, BlockShape::k16x16, Rounding::kNearest, false,
       {DType::kBF16}, {DType::kBF16}},
      {5, StateDType::kF32, Scaling::kCurrent, BlockShape::k1x16, Rounding::kNearest, true,
       {DType::kF32}, {DType::kF32, DType::kBF16}},
  };
  int id = 0;
  for (const Family& f : families) {
    const SweepOptimizer& opt = kSweepOptimizers[f.opt];
    const bool tile = f.block == BlockShape::k16x16;
    const std::pair<int64_t, int64_t> shapes[] = {
        {2000, 4112}, {tile ? 1552 : 1537, 2064}, {4096, 1536}};
    std::vector<StepCase> cases;
    std::vector<StepState> host, shape;
    std::vector<std::unique_ptr<DeviceState>> dev;
    for (const auto& [rows, cols] : shapes) {
      ++id;
      StepCase c;
      c.opt = opt.kind;
      c.momentum = opt.momentum;
      c.amsgrad = opt.amsgrad;
      c.dtype = f.dtype;
      c.scaling = f.scaling;
      c.block = f.block;
      c.rounding = f.rounding;
      c.residual = f.ef;
      c.kind = opt.delta ? UpdateKind::kDelta : UpdateKind::kGradient;
      c.rows = rows;
      c.cols = cols;
      c.layout = id % 2 ? ScaleLayout::kPlain : ScaleLayout::kSwizzled;
      c.update_dtypes = f.updates;
      c.out_dtypes = f.outs;
      c.hyper = SweepHyper(opt, id);
      c.seed = 0xD1B54A32D192ED03ull * static_cast<uint64_t>(id);
      cases.push_back(c);
      host.push_back(MakeState(cpu(), c, 900 + static_cast<uint32_t>(id)));
      dev.push_back(std::make_unique<DeviceState>(gpu(), host.back(), Updates{}));
    }
    shape = host;
    auto rng = Rng(9100 + id);
    StepCarriedOver(cpu(), gpu(), cases, host, shape, dev, rng, 2);
  }
}

// The lean SGD run (step_apply.cuh LeanSgdRun) against the CPU, in long warp runs: plain SGD
// items with one update that is a gradient, no weight decay and row-major scales, in every
// combination it is compiled for (bf16 / f32, error feedback or not, an output of the update's
// dtype or none, RTN / SR), batched with items the generic loop takes (weight decay, two ranks,
// swizzled scales, a bf16 update with an f32 output) so that warps cross from one loop to the
// other mid-run. Sizes leave a partial last warp-unit (n % 512 != 0). Two steps; RTN under
// delayed scaling, SR under current scaling.
TEST_F(CudaTest, LeanSgdRunsMatchCpu) {
  struct Lean {
    DType dt;
    bool ef;
    bool out;
  };
  std::vector<Lean> leans;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (bool ef : {true, false}) {
      for (bool out : {true, false}) leans.push_back({dt, ef, out});
    }
  }
  int id = 0;
  for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
    std::vector<StepCase> cases;
    const auto add = [&](DType dt, bool ef, std::vector<DType> outs, std::vector<DType> updates,
                         float wd, ScaleLayout layout) {
      ++id;
      StepCase c;
      c.opt = OptimizerKind::kSgd;
      c.dtype = StateDType::kF32;
      c.scaling = rounding == Rounding::kNearest ? Scaling::kDelayed : Scaling::kCurrent;
      c.block = BlockShape::k1x16;
      c.rounding = rounding;
      c.residual = ef;
      c.kind = UpdateKind::kGradient;
      c.rows = 389 + 2 * id;  // n % 512 != 0
      c.cols = 2064;
      c.layout = layout;
      c.update_dtypes = updates.empty() ? std::vector<DType>{dt} : updates;
      c.out_dtypes = std::move(outs);
      c.hyper = SweepHyper(kSweepOptimizers[0], 3);  // weight decay 0
      c.hyper.weight_decay = wd;
      c.seed = 0xA24BAED4963EE407ull * static_cast<uint64_t>(id);
      cases.push_back(c);
    };
    for (const Lean& l : leans) {
      add(l.dt, l.ef, l.out ? std::vector<DType>{l.dt} : std::vector<DType>{}, {}, 0.0f,
          ScaleLayout::kPlain);
      // A generic item after each lean one, differing in one choice.
      switch (id % 4) {
        case 0: add(l.dt, l.ef, {l.dt}, {}, 0.01f, ScaleLayout::kPlain); break;
        case 1: add(l.dt, l.ef, {}, {DType::kBF16, DType::kF32}, 0.0f, ScaleLayout::kPlain); break;
        case 2: add(l.dt, l.ef, {l.dt}, {}, 0.0f, ScaleLayout::kSwizzled); break;
        default: add(DType::kBF16, l.ef, {DType::kF32}, {}, 0.0f, ScaleLayout::kPlain); break;
      }
    }
    std::vector<StepState> host, shape;
    std::vector<std::unique_ptr<DeviceState>> dev;
    for (size_t i = 0; i < cases.size(); ++i) {
      host.push_back(MakeState(cpu(), cases[i], 1300 + static_cast<uint32_t>(id + i)));
      dev.push_back(std::make_unique<DeviceState>(gpu(), host.back(), Updates{}));
    }
    shape = host;
    auto rng = Rng(9300 + id);
    StepCarriedOver(cpu(), gpu(), cases, host, shape, dev, rng, 2);
  }
}

// Refusals of every kind are reported as the CPU reports them and write nothing.
TEST_F(CudaTest, StepRefusalsMatchCpu) {
  struct Bad {
    const char* what;
    StepCase c;
    std::function<void(StepState*, Updates*)> spoil;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto set = [](Updates* u, const StepCase& c, size_t k, size_t i, float x) {
    if (c.update_dtypes[k] == DType::kF32) {
      std::memcpy((*u)[k].data() + 4 * i, &x, 4);
    } else {
      const uint16_t b = static_cast<uint16_t>(step_testing::Bits(x) >> 16);
      std::memcpy((*u)[k].data() + 2 * i, &b, 2);
    }
  };
  std::vector<Bad> bad;
  {
    StepCase c;
    c.rows = 217;
    c.cols = 256;
    c.update_dtypes = {DType::kBF16, DType::kF32, DType::kF32};
    c.residual = true;
    bad.push_back({"nan in rank 2", c, [=](StepState*, Updates* u) {
                     set(u, c, 2, 40000, nan);
                     set(u, c, 2, 50000, -nan);
                   }});
    bad.push_back({"rank sum overflow", c, [=](StepState*, Updates* u) {
                     set(u, c, 1, 12345, 3e38f);
                     set(u, c, 2, 12345, 3e38f);
                   }});
  }
  {
    StepCase c;
    c.rows = 48;
    c.cols = 144;
    c.block = BlockShape::k16x16;
    c.momentum = true;
    c.hyper.momentum = 0.9f;
    c.hyper.t = 2;
    c.hyper.lr = 0.1f;
    bad.push_back({"moment1 overflow", c, [=](StepState* s, Updates* u) {
                     s->m_f32[0][1000] = 3e38f;
                     set(u, c, 0, 1000, 1e38f);
                   }});
    c.hyper.lr = 1e30f;
    bad.push_back(
        {"weight overflow", c, [=](StepState*, Updates* u) { set(u, c, 0, 4321, 1e10f); }});
  }
  {
    StepCase c;
    c.rows = 7;
    c.cols = 48;
    c.opt = OptimizerKind::kAdamW;
    c.amsgrad = true;
    c.dtype = StateDType::kNvfp4;
    bad.push_back(
        {"moment2 overflow", c, [=](StepState*, Updates* u) { set(u, c, 0, 77, 2e21f); }});
    c.scaling = Scaling::kDelayed;
    bad.push_back({"delayed moment1 bound", c,
                   [=](StepState* s, Updates*) { s->stats[kStatMaxMoment1] = 3e38f; }});
    bad.push_back({"delayed recorded amax NaN", c,
                   [=](StepState* s, Updates*) { s->stats[kStatNextAmax] = nan; }});
  }
  {
    StepCase c;
    c.rows = 32;
    c.cols = 64;
    c.kind = UpdateKind::kDelta;
    c.residual = true;
    bad.push_back({"residual range", c, [=](StepState*, Updates* u) { set(u, c, 0, 9, 1e38f); }});
    c.residual = false;
    bad.push_back(
        {"dequantized range", c, [=](StepState*, Updates* u) { set(u, c, 0, 9, 2e38f); }});
    c.scaling = Scaling::kDelayed;
    bad.push_back(
        {"delayed update bound", c, [=](StepState*, Updates* u) { set(u, c, 0, 9, 2e38f); }});
  }
  {
    // One rank under delayed scaling (the one-rank check kernel): the first of several, in
    // different warps, of an item whose last warp-unit is partial.
    StepCase c;
    c.rows = 301;
    c.cols = 272;
    c.scaling = Scaling::kDelayed;
    c.residual = true;
    const float inf = std::numeric_limits<float>::infinity();
    for (DType d : {DType::kBF16, DType::kF32}) {
      c.update_dtypes = {d};
      bad.push_back({d == DType::kF32 ? "one f32 rank, delayed" : "one bf16 rank, delayed", c,
                     [=](StepState*, Updates* u) {
                       set(u, c, 0, 70001, nan);
                       set(u, c, 0, 33339, -nan);
                       set(u, c, 0, 33333, -inf);
                       set(u, c, 0, 81871, inf);
                     }});
    }
  }
  int id = 0;
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    StepCase c = b.c;
    auto rng = Rng(9000 + ++id);
    StepState host = MakeState(cpu(), c, 300 + id);
    Updates u = RandomUpdates(c, Dist::kNormal, 0.5f, rng);
    b.spoil(&host, &u);
    StepState shape = host;
    const StepState before = host;
    DeviceState dev(gpu(), host, u);
    const StepState dev_before = dev.Download(host);
    StepReport want, got;
    ASSERT_TRUE(RunBatch(cpu(), {MakeItem(c, &host, u)}, &want).ok());
    ASSERT_TRUE(RunBatch(gpu(), {dev.Item(c, &shape, u)}, &got).ok());
    EXPECT_FALSE(want.ok);
    EXPECT_NE(want.items[0].outcome, StepOutcome::kOk);
    EXPECT_TRUE(SameReport(got, want));
    EXPECT_TRUE(SameState(host, before));
    EXPECT_TRUE(SameState(dev.Download(host), dev_before));
  }
}

// fp4qd's step behind device-side ready waits (RunStepOnDeviceSignals): queuing it returns at
// once (nothing on that path waits for the device), the step does not run before the word holds
// its value (its done word stays 0, an older value keeps it waiting), then matches the CPU bit
// for bit; cancelled (the token written, then the ready word) it refuses every item and writes
// nothing, and the done word still comes. Through StepCheck and StepApply, and through
// StepCheckAndApply (what fp4qd calls for a step on one device).
TEST_F(CudaTest, StepBehindDeviceWaitsRunsWhenReadyOrCancelled) {
  if (!gpu().DeviceSignals()) {
    GTEST_SKIP() << "no device-side signals: no stream memory operations, or a launch behind a "
                    "device-side wait blocks here (CUDA_LAUNCH_BLOCKING=1, a sanitizer or "
                    "profiler)";
  }
  StepCase c;
  c.rows = 217;
  c.cols = 256;
  c.momentum = true;
  c.hyper.momentum = 0.9f;
  c.residual = true;
  c.update_dtypes = {DType::kBF16};
  c.out_dtypes = {DType::kBF16};
  auto rng = Rng(8100);
  for (const bool combined : {false, true}) {
    for (const bool cancel : {false, true}) {
      SCOPED_TRACE(absl::StrCat(combined ? "StepCheckAndApply, " : "StepCheck + StepApply, ",
                                cancel ? "cancelled" : "applied"));
      StepState host = MakeState(cpu(), c, 8101);
      const StepState before = host;
      const Updates u = RandomUpdates(c, Dist::kNormal, 0.5f, rng);
      DeviceState dev(gpu(), host, u);
      StepState shape = host;
      const std::vector<StepItem> items = {dev.Item(c, &shape, u)};
      DeviceBuffer words(gpu(), 64);  // the ready word at 0, done at 16, cancellation at 32
      const std::vector<uint8_t> zero(64, 0);
      words.Upload(zero.data(), zero.size());
      auto* w = static_cast<uint8_t*>(words.get());
      uint32_t* ready = reinterpret_cast<uint32_t*>(w);
      uint32_t* done = reinterpret_cast<uint32_t*>(w + 16);
      uint32_t* cancel_word = reinterpret_cast<uint32_t*>(w + 32);
      const size_t bytes = StepWorkspaceBytes(items);
      DeviceBuffer ws(gpu(), bytes);
      absl::StatusOr<Stream> s = gpu().CreateStream();
      ASSERT_TRUE(s.ok()) << s.status();
      auto done_now = [&] {
        absl::StatusOr<uint32_t> v = gpu().ReadValue32Now(done);
        EXPECT_TRUE(v.ok()) << v.status();
        return v.ok() ? *v : 0xFFFFFFFFu;
      };
      // The host side, as fp4qd's: another thread watches and writes the words once the step is
      // queued (or after 2 s, should queuing block until the word is written).
      absl::Notification queued_note;
      uint32_t held = 0xFFFFFFFFu, held_older = 0xFFFFFFFFu;  // not read yet
      std::thread watcher([&] {
        queued_note.WaitForNotificationWithTimeout(absl::Seconds(2));
        absl::SleepFor(absl::Milliseconds(30));
        held = done_now();  // still held by the wait
        EXPECT_TRUE(gpu().WriteValue32Now(ready, 4).ok());  // an older value: still held
        absl::SleepFor(absl::Milliseconds(30));
        held_older = done_now();
        if (cancel) EXPECT_TRUE(gpu().WriteValue32Now(cancel_word, 77).ok());
        EXPECT_TRUE(gpu().WriteValue32Now(ready, 5).ok());
      });
      const StepCancel token{cancel_word, 77};
      const absl::Time start = absl::Now();
      const absl::Status queued = [&]() -> absl::Status {
        FP4Q_RETURN_IF_ERROR(gpu().WaitValue32(ready, 5, *s));
        if (combined) {
          absl::StatusOr<ValidatedStep> step = ValidatedStep::Check(items);
          if (!step.ok()) return step.status();
          FP4Q_RETURN_IF_ERROR(gpu().StepCheckAndApply(*step, ws.get(), bytes, *s, token));
        } else {
          FP4Q_RETURN_IF_ERROR(gpu().StepCheck(items, ws.get(), bytes, *s, token));
          FP4Q_RETURN_IF_ERROR(gpu().StepApply(items, ws.get(), *s));
        }
        return gpu().WriteValue32(done, 9, *s);
      }();
      const absl::Duration took = absl::Now() - start;
      queued_note.Notify();
      StepReport report;
      const absl::Status r =
          queued.ok() ? gpu().StepReadReport(items, ws.get(), &report, *s) : queued;
      watcher.join();
      gpu().DestroyStream(*s);
      ASSERT_TRUE(r.ok()) << r;
      EXPECT_LT(took, absl::Milliseconds(250))
          << "queuing the step behind an unwritten wait held the thread " << took;
      EXPECT_EQ(held, 0u);
      EXPECT_EQ(held_older, 0u);
      EXPECT_EQ(done_now(), 9u);
      EXPECT_EQ(report.ok, !cancel);
      EXPECT_EQ(report.cancelled, cancel);
      StepState got = dev.Download(host);
      StepState want = before;
      if (cancel) {
        for (auto& o : got.outs) {
          EXPECT_EQ(o, std::vector<uint8_t>(o.size(), cuda_testing::kDevicePoison));
        }
        got.outs = want.outs;
      } else {
        step_testing::ReferenceStep(cpu(), c, u, &want);
      }
      EXPECT_TRUE(SameState(got, want));
    }
  }
}

}  // namespace
}  // namespace fp4q::kernels
