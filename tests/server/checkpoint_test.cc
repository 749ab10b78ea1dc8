#include "server/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/crc32c.h"
#include "testing/status_matchers.h"
#include "testing/files.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::ReadAll;
using ::fp4q::testing::WriteAll;

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir() {
  char tmpl[] = "/tmp/fp4q_ckpt_test_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d == nullptr ? std::string() : std::string(d);
}

CheckpointRecord WeightRecord() {
  CheckpointRecord r;
  r.kind = 1;
  r.has_step = true;
  r.block = 2;
  r.rounding = 2;
  r.error_feedback = true;
  r.dtype = 2;
  r.seed = 0x0123456789ABCDEFull;
  r.rows = 16;
  r.cols = 32;
  r.last_step = 41;
  r.global_amax = 3.5f;
  r.s_enc = 768.0f;
  r.name = "layer0/w";
  r.device = "cpu";
  for (int i = 0; i < 256; ++i) r.codes.push_back(static_cast<char>(i));
  r.scales.assign(32, '\x5a');
  r.residual.assign(16 * 32 * 4, '\x01');
  return r;
}

CheckpointRecord ResidualRecord() {
  CheckpointRecord r;
  r.kind = 2;
  r.has_step = true;
  r.rows = 2;
  r.cols = 16;
  r.last_step = -7;
  r.name = "ef:grad";
  r.device = "GPU-1234";
  r.residual.assign(2 * 16 * 4, '\x7f');
  return r;
}

TEST(Crc32cTest, CheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(Crc32c("1234", 4), "56789", 5), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
}

// The dispatched CRC (SSE4.2's instruction on x86-64 CPUs that have it) equals the table
// version on every length 0..300 and every start offset 0..7, and over a long buffer in pieces.
TEST(Crc32cTest, FastPathMatchesTheTables) {
  std::mt19937 rng(7);
  std::string bytes(300 + 8 + (1 << 20), '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; n <= 300; ++n) {
      ASSERT_EQ(Crc32c(bytes.data() + start, n), Crc32cExtendPortable(0, bytes.data() + start, n))
          << "start " << start << ", " << n << " bytes";
    }
  }
  const uint32_t whole = Crc32c(bytes.data(), bytes.size());
  EXPECT_EQ(whole, Crc32cExtendPortable(0, bytes.data(), bytes.size()));
  uint32_t pieces = 0;
  for (size_t at = 0; at < bytes.size(); at += 4099) {
    pieces = Crc32cExtend(pieces, bytes.data() + at, std::min<size_t>(4099, bytes.size() - at));
  }
  EXPECT_EQ(pieces, whole);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/" + kCheckpointFileName;
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + kCheckpointTempSuffix).c_str());
    ::rmdir(dir_.c_str());
  }
  void WriteTwo() {
    auto w = CheckpointWriter::Begin(dir_, 99);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Add(WeightRecord()).ok());
    ASSERT_TRUE((*w)->Add(ResidualRecord()).ok());
    auto stats = (*w)->Commit();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->file_name, "fp4q-state.ckpt");
    EXPECT_EQ(stats->records, 2u);
    struct stat st;
    ASSERT_EQ(::stat(path_.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), stats->bytes);
    EXPECT_NE(::access((path_ + kCheckpointTempSuffix).c_str(), F_OK), 0) << "temp file left";
  }
  std::string dir_, path_;
};

TEST_F(CheckpointTest, RoundTripKeepsEveryField) {
  WriteTwo();
  std::vector<CheckpointRecord> got;
  ASSERT_TRUE(ReadCheckpoint(path_, [&](CheckpointRecord r) {
                got.push_back(std::move(r));
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(got.size(), 2u);
  const CheckpointRecord want = WeightRecord();
  const CheckpointRecord& w = got[0];
  EXPECT_EQ(w.kind, 1);
  EXPECT_TRUE(w.has_step);
  EXPECT_EQ(w.block, 2);
  EXPECT_EQ(w.rounding, 2);
  EXPECT_TRUE(w.error_feedback);
  EXPECT_EQ(w.dtype, 2);
  EXPECT_EQ(w.seed, want.seed);
  EXPECT_EQ(w.rows, 16);
  EXPECT_EQ(w.cols, 32);
  EXPECT_EQ(w.last_step, 41);
  EXPECT_EQ(w.global_amax, 3.5f);
  EXPECT_EQ(w.s_enc, 768.0f);
  EXPECT_EQ(w.name, "layer0/w");
  EXPECT_EQ(w.device, "cpu");
  EXPECT_EQ(w.codes, want.codes);
  EXPECT_EQ(w.scales, want.scales);
  EXPECT_EQ(w.residual, want.residual);
  EXPECT_EQ(got[1].kind, 2);
  EXPECT_EQ(got[1].last_step, -7);
  EXPECT_EQ(got[1].name, "ef:grad");
  EXPECT_EQ(got[1].device, "GPU-1234");
  EXPECT_EQ(got[1].residual, ResidualRecord().residual);
  EXPECT_TRUE(got[1].codes.empty());
  // Starts with the magic.
  EXPECT_EQ(ReadAll(path_).substr(0, 8), "FP4QCKP1");
}

TEST_F(CheckpointTest, MissingFileIsNotFound) {
  EXPECT_THAT(ReadCheckpoint(path_, [](CheckpointRecord) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no checkpoint")));
}

TEST_F(CheckpointTest, EveryTruncationIsDetectedAndNothingIsPassedOn) {
  WriteTwo();
  const std::string full = ReadAll(path_);
  // Every prefix length would take long for big files; this one is ~2.6 KB: try them all.
  for (size_t len = 0; len < full.size(); ++len) {
    WriteAll(path_, full.substr(0, len));
    int records = 0;
    absl::Status s = ReadCheckpoint(path_, [&](CheckpointRecord) {
      ++records;
      return absl::OkStatus();
    });
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
    ASSERT_THAT(std::string(s.message()), HasSubstr("truncated")) << "length " << len;
    ASSERT_EQ(records, 0) << "length " << len;
  }
}

TEST_F(CheckpointTest, EveryFlippedByteIsDetected) {
  WriteTwo();
  const std::string full = ReadAll(path_);
  for (size_t i = 0; i < full.size(); ++i) {
    std::string bad = full;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    WriteAll(path_, bad);
    int records = 0;
    absl::Status s = ReadCheckpoint(path_, [&](CheckpointRecord) {
      ++records;
      return absl::OkStatus();
    });
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << i << ": " << s;
    ASSERT_EQ(records, 0) << "byte " << i;
  }
  // A flip in the body reads as corrupt (CRC), one in the trailer magic as truncated.
  std::string bad = full;
  bad[100] ^= 1;
  WriteAll(path_, bad);
  EXPECT_THAT(ReadCheckpoint(path_, [](CheckpointRecord) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is corrupt: CRC-32C")));
}

TEST_F(CheckpointTest, AppendedGarbageIsDetected) {
  WriteTwo();
  WriteAll(path_, ReadAll(path_) + "junk");
  EXPECT_THAT(ReadCheckpoint(path_, [](CheckpointRecord) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

TEST_F(CheckpointTest, AbandonedWriterLeavesTheOldCheckpoint) {
  WriteTwo();
  const std::string before = ReadAll(path_);
  {
    auto w = CheckpointWriter::Begin(dir_, 100);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Add(ResidualRecord()).ok());
    // destroyed without Commit (a crash mid-write leaves only the temp file)
  }
  EXPECT_EQ(ReadAll(path_), before);
  EXPECT_NE(::access((path_ + kCheckpointTempSuffix).c_str(), F_OK), 0);
}

TEST_F(CheckpointTest, SinkErrorIsReturned) {
  WriteTwo();
  EXPECT_THAT(ReadCheckpoint(
                  path_, [](CheckpointRecord) { return absl::ResourceExhaustedError("budget"); }),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
}

}  // namespace
}  // namespace fp4q::server
