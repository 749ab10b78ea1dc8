// The checkpoint file in a hostile state directory:
// symlinks, hard links, stale temporaries, FIFOs and directories planted at the
// temporary or final path never make the writer or the reader touch another
// file; and ValidateCheckpointRecord's table (item 6): each impossible field of
// a record with a valid CRC is DATA_LOSS naming the record and field.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "testing/status_matchers.h"
#include "testing/files.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::ReadAll;
using ::fp4q::testing::WriteAll;

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

bool IsSymlink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}
bool IsRegular(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A valid NVFP4 weight record [16, 32] with error feedback, and a residual
// record [2, 16].
CheckpointRecord Weight() {
  CheckpointRecord r;
  r.kind = 1;
  r.has_step = true;
  r.block = 1;
  r.rounding = 2;
  r.error_feedback = true;
  r.dtype = 1;
  r.seed = 7;
  r.rows = 16;
  r.cols = 32;
  r.last_step = 41;
  r.global_amax = 3.5f;
  r.s_enc = 768.0f;
  r.name = "layer0/w";
  r.device = "cpu";
  for (int i = 0; i < 16 * 32 / 2; ++i) r.codes.push_back(static_cast<char>(i));
  r.scales.assign(16 * 32 / 16, '\x38');
  std::vector<float> res(16 * 32, 0.25f);
  r.residual.assign(reinterpret_cast<const char*>(res.data()), res.size() * sizeof(float));
  return r;
}

CheckpointRecord Residual() {
  CheckpointRecord r;
  r.kind = 2;
  r.has_step = true;
  r.rows = 2;
  r.cols = 16;
  r.last_step = 3;
  r.name = "ef:grad";
  r.device = "GPU-1234";
  std::vector<float> res(2 * 16, -1.5f);
  r.residual.assign(reinterpret_cast<const char*>(res.data()), res.size() * sizeof(float));
  return r;
}

void SetF32(std::string* bytes, size_t i, float v) {
  std::memcpy(bytes->data() + i * sizeof(float), &v, sizeof(float));
}

class CheckpointSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fp4q_ckpt_safety_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/state";
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
    path_ = dir_ + "/" + kCheckpointFileName;
    tmp_ = path_ + kCheckpointTempSuffix;
    victim_ = root_ + "/victim";
    WriteAll(victim_, kVictim);
  }
  void TearDown() override {
    for (const std::string& p : {path_, tmp_, victim_}) ::unlink(p.c_str());
    ::rmdir(tmp_.c_str());
    ::rmdir(dir_.c_str());
    ::rmdir(root_.c_str());
  }
  absl::Status WriteCheckpoint(const std::vector<CheckpointRecord>& records) {
    auto w = CheckpointWriter::Begin(dir_, 1);
    if (!w.ok()) return w.status();
    for (const CheckpointRecord& r : records) {
      if (absl::Status s = (*w)->Add(r); !s.ok()) return s;
    }
    return (*w)->Commit().status();
  }
  std::vector<std::string> ReadNames() {
    std::vector<std::string> names;
    absl::Status s = ReadCheckpoint(path_, [&](CheckpointRecord r) {
      names.push_back(r.name);
      return absl::OkStatus();
    });
    EXPECT_THAT(s, IsOk());
    return names;
  }

  static constexpr char kVictim[] = "the victim's own bytes\n";
  std::string root_, dir_, path_, tmp_, victim_;
};

TEST_F(CheckpointSafetyTest, TempNameIsFileNamePlusSuffix) {
  // checkpoint.cc spells the temporary's name out; it must be the header's two
  // constants.
  EXPECT_EQ(std::string(kCheckpointFileName) + kCheckpointTempSuffix, "fp4q-state.ckpt.tmp");
}

// The finding: a symlink at the temporary path made fp4qd overwrite its
// target.
TEST_F(CheckpointSafetyTest, SymlinkAtTheTemporaryPathIsRemovedNotWrittenThrough) {
  ASSERT_EQ(::symlink(victim_.c_str(), tmp_.c_str()), 0);
  ASSERT_THAT(WriteCheckpoint({Weight()}), IsOk());
  EXPECT_EQ(ReadAll(victim_), kVictim) << "the checkpoint was written through the symlink";
  EXPECT_TRUE(IsRegular(path_));
  EXPECT_FALSE(Exists(tmp_));
  EXPECT_EQ(ReadNames(), std::vector<std::string>{"layer0/w"});
}

// A dangling symlink at the temporary path: creating through it would create
// its target.
TEST_F(CheckpointSafetyTest, DanglingSymlinkAtTheTemporaryPathCreatesNothingElsewhere) {
  const std::string target = root_ + "/created-through-link";
  ASSERT_EQ(::symlink(target.c_str(), tmp_.c_str()), 0);
  ASSERT_THAT(WriteCheckpoint({Weight()}), IsOk());
  EXPECT_FALSE(Exists(target)) << "a file was created through the dangling symlink";
  ::unlink(target.c_str());
  EXPECT_TRUE(IsRegular(path_));
}

// A hard link at the temporary path shares the victim's inode: writing to it in
// place (O_TRUNC without O_EXCL) would change the victim.
TEST_F(CheckpointSafetyTest, HardLinkAtTheTemporaryPathLeavesTheVictimAlone) {
  ASSERT_EQ(::link(victim_.c_str(), tmp_.c_str()), 0);
  ASSERT_THAT(WriteCheckpoint({Weight()}), IsOk());
  EXPECT_EQ(ReadAll(victim_), kVictim);
  EXPECT_EQ(ReadNames(), std::vector<std::string>{"layer0/w"});
}

// rename(2) replaces a symlink at the final path; the victim it pointed to is
// untouched.
TEST_F(CheckpointSafetyTest, SymlinkAtTheFinalPathIsReplacedNotWrittenThrough) {
  ASSERT_EQ(::symlink(victim_.c_str(), path_.c_str()), 0);
  ASSERT_THAT(WriteCheckpoint({Weight(), Residual()}), IsOk());
  EXPECT_EQ(ReadAll(victim_), kVictim);
  EXPECT_FALSE(IsSymlink(path_));
  EXPECT_TRUE(IsRegular(path_));
  EXPECT_EQ(ReadNames(), (std::vector<std::string>{"layer0/w", "ef:grad"}));
}

// The reader does not follow a symlink at the checkpoint's path (a restore
// would load whatever it points to): FAILED_PRECONDITION naming the path,
// nothing passed on.
TEST_F(CheckpointSafetyTest, ReaderRefusesASymlinkedCheckpoint) {
  // The victim is a real checkpoint elsewhere: following the link would load
  // it.
  const std::string elsewhere = root_ + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  {
    auto w = CheckpointWriter::Begin(elsewhere, 1);
    ASSERT_THAT(w, IsOk());
    ASSERT_THAT((*w)->Add(Weight()), IsOk());
    ASSERT_THAT((*w)->Commit(), IsOk());
  }
  const std::string other = elsewhere + "/" + kCheckpointFileName;
  ASSERT_EQ(::symlink(other.c_str(), path_.c_str()), 0);
  int records = 0;
  EXPECT_THAT(
      ReadCheckpoint(path_,
                     [&](CheckpointRecord) {
                       ++records;
                       return absl::OkStatus();
                     }),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path_ + " is a symbolic link")));
  EXPECT_EQ(records, 0);
  ::unlink(other.c_str());
  ::rmdir(elsewhere.c_str());
}

// A FIFO at the checkpoint's path: a plain open(O_RDONLY) blocks until a writer
// appears, so a restore would hang forever. Refused at once instead.
TEST_F(CheckpointSafetyTest, ReaderRefusesAFifoWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  EXPECT_THAT(ReadCheckpoint(path_, [](CheckpointRecord) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(path_ + " is a FIFO, not a regular file")));
}

// A stale temporary left by a crash mid-checkpoint is replaced (refusing would
// stop every later checkpoint); its bytes never reach the new file.
TEST_F(CheckpointSafetyTest, StaleTemporaryFromACrashIsReplaced) {
  WriteAll(tmp_, std::string(100000, 'z'));
  ASSERT_THAT(WriteCheckpoint({Residual()}), IsOk());
  EXPECT_FALSE(Exists(tmp_));
  EXPECT_EQ(ReadNames(), std::vector<std::string>{"ef:grad"});
  EXPECT_EQ(ReadAll(path_).find("zzzz"), std::string::npos);
}

// Something at the temporary path that cannot be unlinked (a directory): the
// checkpoint fails naming it, and the previous checkpoint stays as it was.
TEST_F(CheckpointSafetyTest, UnremovableTemporaryFailsTheCheckpointAndKeepsTheOldOne) {
  ASSERT_THAT(WriteCheckpoint({Weight()}), IsOk());
  const std::string before = ReadAll(path_);
  ASSERT_EQ(::mkdir(tmp_.c_str(), 0700), 0);
  EXPECT_THAT(CheckpointWriter::Begin(dir_, 2),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot remove the stale temporary fp4q-state.ckpt.tmp: Is a "
                                 "directory")));
  EXPECT_EQ(ReadAll(path_), before);
  struct stat st;
  ASSERT_EQ(::lstat(tmp_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << "the writer removed or replaced the directory";
}

// The temporary is private while it is written: mode 0600, whatever the umask.
TEST_F(CheckpointSafetyTest, TemporaryIsCreatedMode0600) {
  const mode_t old_umask = ::umask(0);
  auto w = CheckpointWriter::Begin(dir_, 1);
  ::umask(old_umask);
  ASSERT_THAT(w, IsOk());
  struct stat st;
  ASSERT_EQ(::lstat(tmp_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_THAT((*w)->Commit(), IsOk());
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// A writer that fails to create its temporary must not unlink what another
// party put there.
TEST_F(CheckpointSafetyTest, FailedBeginRemovesNothing) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0500),
            0);  // read-only directory: no create, no unlink
  if (::access(dir_.c_str(), W_OK) == 0) {
    ::chmod(dir_.c_str(), 0700);
    GTEST_SKIP() << "running as root: a 0500 directory is still writable";
  }
  EXPECT_THAT(CheckpointWriter::Begin(dir_, 1),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot create fp4q-state.ckpt.tmp: Permission denied")));
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
}

// ---------------------------------------------------------------- meaning
// (item 6)

struct Mutation {
  std::string name;
  std::function<CheckpointRecord()> make;
  std::string message;  // substring of the DATA_LOSS message
};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<Mutation> Mutations() {
  auto w = [](std::function<void(CheckpointRecord&)> f) {
    return [f] {
      CheckpointRecord r = Weight();
      f(r);
      return r;
    };
  };
  auto res = [](std::function<void(CheckpointRecord&)> f) {
    return [f] {
      CheckpointRecord r = Residual();
      f(r);
      return r;
    };
  };
  const std::string wp = "record 1 (weight 'layer0/w'): ";
  const std::string rp = "record 1 (residual 'ef:grad'): ";
  return {
      // The three.
      {"s_enc NaN", w([](auto& r) { r.s_enc = kNaN; }), wp + "s_enc: nan is not finite and > 0"},
      {"s_enc 0", w([](auto& r) { r.s_enc = 0; }), wp + "s_enc: 0 is not finite and > 0"},
      {"s_enc negative", w([](auto& r) { r.s_enc = -2; }), wp + "s_enc: -2 is not finite and > 0"},
      {"s_enc Inf", w([](auto& r) { r.s_enc = kInf; }), wp + "s_enc: inf is not finite and > 0"},
      {"residual NaN (weight)", w([](auto& r) { SetF32(&r.residual, 37, kNaN); }),
       wp + "residual: element 37 of 512 is nan"},
      {"residual -Inf (residual)", res([](auto& r) { SetF32(&r.residual, 31, -kInf); }),
       rp + "residual: element 31 of 32 is -inf"},
      {"last_step negative", w([](auto& r) { r.last_step = -1; }),
       wp + "last_step: -1 is negative"},
      {"last_step negative (residual)", res([](auto& r) { r.last_step = -7; }),
       rp + "last_step: -7 is negative"},
      // The global record.
      {"global_amax NaN", w([](auto& r) { r.global_amax = kNaN; }),
       wp + "global_amax: nan is not finite and >= 0"},
      {"global_amax negative", w([](auto& r) { r.global_amax = -1; }),
       wp + "global_amax: -1 is not finite and >= 0"},
      {"global_amax Inf", w([](auto& r) { r.global_amax = kInf; }),
       wp + "global_amax: inf is not finite and >= 0"},
      // Scales: E4M3 NaN codes.
      {"scale 0x7F", w([](auto& r) { r.scales[5] = '\x7f'; }),
       wp + "scales: byte 5 is 0x7f, an E4M3 NaN"},
      {"scale 0xFF", w([](auto& r) { r.scales[31] = '\xff'; }),
       wp + "scales: byte 31 is 0xff, an E4M3 NaN"},
      // Shapes and lengths.
      {"rows 0", w([](auto& r) { r.rows = 0; }), wp + "rows: 0 < 1"},
      {"cols negative", res([](auto& r) { r.cols = -16; }), rp + "cols: -16 < 1"},
      {"cols not a multiple of 16", w([](auto& r) { r.cols = 40; }),
       wp + "cols: 40 is not a multiple of 16 (NVFP4)"},
      {"rows not a multiple of 16 with 16x16", w([](auto& r) {
         r.block = 2;
         r.rows = 8;
       }),
       wp + "rows: 8 is not a multiple of 16 (16x16 blocks)"},
      {"codes short", w([](auto& r) { r.codes.pop_back(); }),
       wp + "codes_len: 255 bytes; [16, 32] needs 256"},
      {"scales long", w([](auto& r) { r.scales.push_back('\x38'); }),
       wp + "scales_len: 33 bytes; [16, 32] needs 32"},
      {"residual long", w([](auto& r) { r.residual.append(4, '\0'); }),
       wp + "residual_len: 2052 bytes; an f32 residual of its shape needs 2048"},
      {"residual without error feedback", w([](auto& r) { r.error_feedback = false; }),
       wp + "residual_len: 2048 bytes without error feedback (must be 0)"},
      {"residual record too short", res([](auto& r) { r.residual.resize(64); }),
       rp + "residual_len: 64 bytes; an f32 residual of its shape needs 128"},
      {"shape overflows", res([](auto& r) { r.rows = r.cols = int64_t{1} << 40; }),
       rp + "residual_len: f32 bytes of [1099511627776, 1099511627776] exceed "
            "the limit"},
      // Enums.
      {"block 3", w([](auto& r) { r.block = 3; }),
       wp + "block: 3 is not BLOCK_SHAPE_1X16 (1) or BLOCK_SHAPE_16X16 (2)"},
      {"block 0", w([](auto& r) { r.block = 0; }), wp + "block: 0 is not BLOCK_SHAPE_1X16"},
      {"rounding 9", w([](auto& r) { r.rounding = 9; }),
       wp + "rounding: 9 is not ROUNDING_NEAREST (1) or ROUNDING_STOCHASTIC "
            "(2)"},
      {"dtype U8", w([](auto& r) { r.dtype = 3; }),
       wp + "dtype: 3 is not DTYPE_F32 (1) or DTYPE_BF16 (2)"},
      {"unknown kind", w([](auto& r) { r.kind = 3; }),
       "record 1 (kind 3 'layer0/w'): kind: 3 is not a record kind (1 weight, "
       "2 residual)"},
      // Names and devices.
      {"name with a space", w([](auto& r) { r.name = "bad name"; }),
       "record 1 (weight 'bad name'): name: byte 3 (0x20) is not allowed"},
      {"name too long", res([](auto& r) { r.name = std::string(300, 'a'); }),
       "aaaa...'): name: 300 bytes, at most 256"},
      {"name with a newline", res([](auto& r) { r.name = "a\nb"; }),
       "record 1 (residual 'a\\nb'): name: byte 1 (0x0a) is not allowed"},
      {"device empty", w([](auto& r) { r.device.clear(); }),
       wp + "device: 0 bytes; a device label has 1..256"},
      {"device with a control byte", w([](auto& r) { r.device = "GPU\x01"; }),
       wp + "device: byte 3 (0x01) is not printable ASCII"},
      // A residual record carries no weight fields.
      {"residual with s_enc", res([](auto& r) { r.s_enc = 1; }),
       rp + "s_enc: 1 in a residual record (must be 0)"},
      {"residual with codes", res([](auto& r) { r.codes = "ab"; }),
       rp + "codes_len: 2 in a residual record (must be 0)"},
      {"residual with a block", res([](auto& r) { r.block = 1; }),
       rp + "block: 1 in a residual record (must be 0)"},
      {"residual with error feedback", res([](auto& r) { r.error_feedback = true; }),
       rp + "error_feedback: 1 in a residual record (must be 0)"},
  };
}

TEST(ValidateCheckpointRecordTest, ValidRecordsPass) {
  EXPECT_THAT(ValidateCheckpointRecord(Weight(), 0), IsOk());
  EXPECT_THAT(ValidateCheckpointRecord(Residual(), 1), IsOk());
  CheckpointRecord plain = Weight();  // no error feedback, 16x16, bf16, amax 0
  plain.error_feedback = false;
  plain.residual.clear();
  plain.block = 2;
  plain.dtype = 2;
  plain.global_amax = 0;
  plain.last_step = 0;
  plain.has_step = false;
  EXPECT_THAT(ValidateCheckpointRecord(plain, 2), IsOk());
}

TEST(ValidateCheckpointRecordTest, EachImpossibleFieldIsDataLossNamingRecordAndField) {
  const std::vector<Mutation> cases = Mutations();
  EXPECT_GE(cases.size(), 35u);
  for (const Mutation& m : cases) {
    EXPECT_THAT(
        ValidateCheckpointRecord(m.make(), 1),
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(StartsWith("checkpoint is corrupt: record 1 ("), HasSubstr(m.message))))
        << m.name;
  }
}

// The impossible records have valid CRCs: ReadCheckpoint passes them on; the
// meaning check is what refuses them.
TEST_F(CheckpointSafetyTest, ImpossibleRecordsPassTheChecksum) {
  for (const Mutation& m : Mutations()) {
    if (m.name == "unknown kind") continue;  // refused by the reader's structure pass (below)
    ASSERT_THAT(WriteCheckpoint({Weight(), m.make()}), IsOk()) << m.name;
    uint32_t index = 0;
    absl::Status s = ReadCheckpoint(
        path_, [&](CheckpointRecord r) { return ValidateCheckpointRecord(r, index++); });
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(m.message))) << m.name;
    EXPECT_EQ(index, 2u) << m.name << ": both records reached the sink";
  }
  CheckpointRecord unknown = Residual();
  unknown.kind = 3;
  ASSERT_THAT(WriteCheckpoint({Weight(), unknown}), IsOk());
  EXPECT_THAT(ReadCheckpoint(path_, [](CheckpointRecord) { return absl::OkStatus(); }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("record 1 has kind 3")));
}

}  // namespace
}  // namespace fp4q::server
