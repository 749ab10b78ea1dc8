// Engine::Restore of checkpoints whose CRC is valid but whose contents are
// impossible: each is DATA_LOSS naming the record and field,
// and nothing is loaded, not even the valid records before it. The files are
// crafted with CheckpointWriter (which writes any record it is given, checksum
// included) from the records of a real checkpoint.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "fp4q/kernels/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/engine.h"
#include "testing/status_matchers.h"

namespace fp4q::server {
namespace {

using ::fp4q::server::testing::Await;
using ::fp4q::server::testing::InlineF32;
using ::fp4q::server::testing::RandomF32;
using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

class EngineRestoreValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fp4q_restore_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Real state, checkpointed: a weight with error feedback, a plain weight, a
    // residual key.
    engine_ = MakeEngine();
    ASSERT_THAT(Create("a", /*ef=*/true), IsOk());
    ASSERT_THAT(Create("w", /*ef=*/true), IsOk());
    QdqRequest q;
    const std::string x = RandomF32(2 * 16, 3);  // InlineF32 views the bytes: keep them alive
    q.input = InlineF32(x, 2, 16);
    q.options.residual_key = "r";
    q.options.quant.step = 12;
    ASSERT_THAT(Await<QdqResult>([&](auto done) { engine_->Qdq({}, q, done); }), IsOk());
    ASSERT_THAT(engine_->CheckpointNow(), IsOk());
    ASSERT_THAT(ReadCheckpoint(dir_ + "/" + kCheckpointFileName,
                               [&](CheckpointRecord r) {
                                 records_.push_back(std::move(r));
                                 return absl::OkStatus();
                               }),
                IsOk());
    ASSERT_EQ(records_.size(), 3u);  // file order: a, r, w
    ASSERT_EQ(records_[0].name, "a");
    ASSERT_EQ(records_[1].name, "r");
    ASSERT_EQ(records_[2].name, "w");
  }
  void TearDown() override {
    engine_.reset();
    std::remove((dir_ + "/" + kCheckpointFileName).c_str());
    ::rmdir(dir_.c_str());
  }
  std::unique_ptr<Engine> MakeEngine() {
    return ::fp4q::server::testing::TestCpuEngine(uint64_t{1} << 30, dir_);
  }
  absl::Status Create(const std::string& name, bool ef) {
    CreateWeightRequest r;
    r.name = name;
    const std::string x = RandomF32(16 * 32, static_cast<uint32_t>(name[0]));
    r.initial = InlineF32(x, 16, 32);
    r.options.error_feedback = ef;
    r.step = 4;
    return Await<CreateWeightResult>([&](auto done) { engine_->CreateWeight({}, r, done); })
        .status();
  }
  // The checkpoint rewritten from `records`, then restored into a fresh engine.
  absl::Status RestoreFrom(const std::vector<CheckpointRecord>& records) {
    {
      auto w = CheckpointWriter::Begin(dir_, 9);
      if (!w.ok()) return w.status();
      for (const CheckpointRecord& r : records) {
        if (absl::Status s = (*w)->Add(r); !s.ok()) return s;
      }
      if (auto c = (*w)->Commit(); !c.ok()) return c.status();
    }
    engine_ = MakeEngine();
    return engine_->Restore();
  }

  std::string dir_;
  std::unique_ptr<Engine> engine_;
  std::vector<CheckpointRecord> records_;
};

void SetF32(std::string* bytes, size_t i, float v) {
  std::memcpy(bytes->data() + i * sizeof(float), &v, sizeof(float));
}

TEST_F(EngineRestoreValidationTest, TheRealCheckpointRestores) {
  ASSERT_THAT(RestoreFrom(records_), IsOk());
  EXPECT_EQ(engine_->ListTensors()->size(), 3u);
}

struct Bad {
  std::string name;
  size_t record;  // which of records_ (0 "a", 1 "r", 2 "w") is changed
  std::function<void(CheckpointRecord&)> change;
  std::string message;
};

TEST_F(EngineRestoreValidationTest, ImpossibleContentIsDataLossAndLoadsNothing) {
  const std::vector<Bad> cases = {
      // The findings: each of these was restored and served before.
      {"s_enc NaN", 2, [](auto& r) { r.s_enc = kNaN; },
       "record 2 (weight 'w'): s_enc: nan is not finite and > 0"},
      {"s_enc 0", 2, [](auto& r) { r.s_enc = 0; },
       "record 2 (weight 'w'): s_enc: 0 is not finite and > 0"},
      {"NaN residual of a weight", 2, [](auto& r) { SetF32(&r.residual, 100, kNaN); },
       "record 2 (weight 'w'): residual: element 100 of 512 is nan"},
      {"Inf in a residual key", 1, [](auto& r) { SetF32(&r.residual, 0, kInf); },
       "record 1 (residual 'r'): residual: element 0 of 32 is inf"},
      {"negative last_step", 2, [](auto& r) { r.last_step = -3; },
       "record 2 (weight 'w'): last_step: -3 is negative"},
      {"global_amax Inf", 2, [](auto& r) { r.global_amax = kInf; },
       "record 2 (weight 'w'): global_amax: inf is not finite and >= 0"},
      {"global_amax negative", 2, [](auto& r) { r.global_amax = -1; },
       "record 2 (weight 'w'): global_amax: -1 is not finite and >= 0"},
      {"NaN scale byte", 2, [](auto& r) { r.scales[7] = '\x7f'; },
       "record 2 (weight 'w'): scales: byte 7 is 0x7f, an E4M3 NaN"},
      {"residual record with weight fields", 1, [](auto& r) { r.s_enc = 2; },
       "record 1 (residual 'r'): s_enc: 2 in a residual record (must be 0)"},
      {"cols not a multiple of 16", 2,
       [](auto& r) {
         r.cols = 24;
         r.codes.resize(16 * 24 / 2);
       },
       "record 2 (weight 'w'): cols: 24 is not a multiple of 16 (NVFP4)"},
      {"codes not matching the shape", 2, [](auto& r) { r.codes.resize(10); },
       "record 2 (weight 'w'): codes_len: 10 bytes; [16, 32] needs 256"},
      {"unknown rounding", 2, [](auto& r) { r.rounding = 5; },
       "record 2 (weight 'w'): rounding: 5 is not ROUNDING_NEAREST"},
      {"bad name", 1, [](auto& r) { r.name = "r r"; },
       "record 1 (residual 'r r'): name: byte 1 (0x20) is not allowed"},
      // (An unknown kind is already refused by the reader's structure pass.)
      {"unknown kind", 1, [](auto& r) { r.kind = 7; }, "record 1 has kind 7"},
      // The first record, before anything is loaded.
      {"rows 0 in the first record", 0, [](auto& r) { r.rows = 0; },
       "record 0 (weight 'a'): rows: 0 < 1"},
  };
  for (const Bad& c : cases) {
    std::vector<CheckpointRecord> records = records_;
    c.change(records[c.record]);
    EXPECT_THAT(RestoreFrom(records), StatusIs(absl::StatusCode::kDataLoss,
                                               HasSubstr("checkpoint is corrupt: " + c.message)))
        << c.name;
    // Nothing loaded: not the good records before the bad one either.
    EXPECT_EQ(engine_->ListTensors()->size(), 0u) << c.name;
    EXPECT_EQ(engine_->store().used_bytes(), 0u) << c.name;
  }
}

}  // namespace
}  // namespace fp4q::server
