// The checkpoint file: all named state, written atomically.
//
// File: <state_dir>/fp4q-state.ckpt. Written as fp4q-state.ckpt.tmp, fsync'd, renamed over the
// old file, then the directory is fsync'd: a crash (kill -9, power loss) leaves either the old
// or the new complete file, never a torn one.
//
// Symlinks in the state directory are never followed (the directory itself may be reached
// through one; its entries may not):
// - The temporary is created with O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode 0600, relative
//   to a descriptor of the directory opened once per checkpoint. A temporary that already
//   exists (a crash mid-checkpoint leaves one; so could a planted symlink) is unlinked first:
//   unlinking removes the entry itself, never what a symlink points to, and the state-directory
//   lock (state_dir.h) means no live writer owns it. Refusing instead would stop every
//   checkpoint after one crash. If the entry cannot be removed (a directory) or reappears
//   before the exclusive create, the checkpoint fails and nothing is written.
// - rename(2) replaces the directory entry at the final path, so a symlink planted there is
//   replaced, not written through; afterwards the final path must be the very inode written
//   (else the checkpoint fails: the temporary was swapped during the write).
// - The reader opens the file with O_NOFOLLOW | O_NONBLOCK and accepts only a regular file
//   (FAILED_PRECONDITION otherwise: a symlink or FIFO there is not a checkpoint fp4qd wrote).
//
// Format (all integers little-endian):
//   body    := header record* end
//   header  := "FP4QCKP1" u32 version(=2; 1 is still read) u32 reserved(=0) u64 server_epoch
//              u64 created_unix_micros                                       (32 bytes)
//   record  := u8 kind(1 weight, 2 residual) u8 has_step u8 block u8 rounding
//              u8 error_feedback u8 dtype u16 reserved(=0) u64 seed i64 rows i64 cols
//              i64 last_step f32 global_amax f32 s_enc u32 name_len u32 device_len
//              u64 codes_len u64 scales_len u64 residual_len u64 ext_len    (88 bytes;
//              version 1: 80, no ext_len)
//              name device codes scales residual ext
//              (block/rounding/dtype are the fp4q.v1 enum numbers; for residual records the
//              weight fields are 0 and codes/scales empty; the name is "namespace|name" outside
//              the default namespace)
//   ext     := (weights; empty for residuals and in version 1)
//              u8 scaling(1 current, 2 delayed) u8 optimizer(1 SGD, 2 AdamW) u8 momentum
//              u8 amsgrad u8 state_dtype(1 F32, 2 BF16, 3 NVFP4) u8[3] reserved(=0)
//              i64 optimizer_steps u64 last_hyper_hash u32 fingerprints u32 moments
//              f32 stats[8] u64 fingerprint[fingerprints] (u64 len, bytes)[moments]
//              (a moment's bytes: F32/BF16 values, or NVFP4 codes, scales, f32 amax, f32 s_enc)
//   end     := u8 0xFF u32 record_count u64 body_bytes_before_end            (13 bytes)
//   trailer := u32 crc32c(body) "FP4QEND1"                                   (12 bytes)
// The CRC-32C covers everything before the trailer. A reader checks, in order: size, trailer
// magic (else "truncated"), CRC (else "corrupt"), header magic and version, then every record's
// lengths against the bytes that remain and the end record's count and offset. Any failure is
// DATA_LOSS and nothing is returned. The meaning of each record (finite scales, known enums,
// sizes matching the shape, ...) is checked by ValidateCheckpointRecord, which the engine's
// Restore applies to every record before loading it (and which makes the whole restore fail,
// loading nothing).
#ifndef FP4Q_SERVER_CHECKPOINT_H_
#define FP4Q_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::server {

inline constexpr char kCheckpointFileName[] = "fp4q-state.ckpt";
inline constexpr char kCheckpointTempSuffix[] = ".tmp";

// The record's enum numbers (the fp4q.v1 numbers of the day the format was fixed; the file
// keeps them whatever the proto or the kernels do later).
inline constexpr uint8_t kRecordBlock1x16 = 1;   // BLOCK_SHAPE_1X16
inline constexpr uint8_t kRecordBlock16x16 = 2;  // BLOCK_SHAPE_16X16
inline constexpr uint8_t kRecordNearest = 1;     // ROUNDING_NEAREST
inline constexpr uint8_t kRecordStochastic = 2;  // ROUNDING_STOCHASTIC
inline constexpr uint8_t kRecordF32 = 1;         // DTYPE_F32
inline constexpr uint8_t kRecordBF16 = 2;        // DTYPE_BF16

struct CheckpointRecord {
  uint8_t kind = 0;  // 1 weight, 2 residual
  bool has_step = false;
  uint8_t block = 0;     // fp4q.v1.BlockShape
  uint8_t rounding = 0;  // fp4q.v1.Rounding
  bool error_feedback = false;
  uint8_t dtype = 0;  // fp4q.v1.DType
  uint64_t seed = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t last_step = 0;
  float global_amax = 0.0f;
  float s_enc = 0.0f;
  std::string name;
  std::string device;
  std::string codes;
  std::string scales;
  std::string residual;
  // Weights (version 2): scaling, optimizer state, the last step's fingerprints, statistics.
  uint8_t scaling = 1;         // fp4q.v1.Scaling
  uint8_t optimizer = 1;       // fp4q.v1.OptimizerKind
  bool momentum = false;
  bool amsgrad = false;
  uint8_t state_dtype = 1;     // fp4q.v1.StateDType
  int64_t optimizer_steps = 0;
  uint64_t last_hyper_hash = 0;
  std::vector<uint64_t> fingerprints;
  float stats[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<std::string> moments;
};

struct CheckpointStats {
  std::string file_name;  // kCheckpointFileName
  uint64_t bytes = 0;
  uint32_t records = 0;
};

// Streams records into the temp file; Commit makes it the checkpoint. Destroying an uncommitted
// writer removes the temp file. Not thread-safe.
class CheckpointWriter {
 public:
  // Creates <dir>/fp4q-state.ckpt.tmp (see the symlink rules above). UNAVAILABLE when the
  // directory cannot be opened, a stale temporary cannot be removed, the temporary reappears
  // before it is created (another writer), or a write fails; the message names the file.
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Begin(const std::string& dir,
                                                                 uint64_t server_epoch);
  ~CheckpointWriter();
  absl::Status Add(const CheckpointRecord& record);
  absl::StatusOr<CheckpointStats> Commit();

 private:
  CheckpointWriter() = default;
  absl::Status Write(const void* data, size_t n);
  std::string dir_;
  int dir_fd_ = -1;       // the state directory, opened once; every name is relative to it
  bool created_ = false;  // the temporary is ours (so the destructor may unlink it)
  std::FILE* file_ = nullptr;
  uint32_t crc_ = 0;
  uint64_t body_bytes_ = 0;
  uint32_t records_ = 0;
  bool committed_ = false;
};

// Reads and verifies `path`, then calls `sink` for every record in file order. NOT_FOUND when
// the file does not exist; DATA_LOSS (message says truncated or corrupt, and where) when any
// check fails, before any record is passed on; `sink`'s first error is returned as is.
absl::Status ReadCheckpoint(const std::string& path,
                            const std::function<absl::Status(CheckpointRecord)>& sink);

// The meaning of record number `index` (0-based, file order): what a CRC cannot vouch for.
// OK, or DATA_LOSS "checkpoint is corrupt: record 3 (weight 'layer0/w'): s_enc: nan is not
// finite and > 0", naming the record and its field as the layout above spells it, checked
// against the table of record kinds and field rules in checkpoint_records.cc (one row per kind,
// one rule per field: a new record kind or field adds rows there). Rules:
//   every kind  kind known; name as request names (1..256 of A-Z a-z 0-9 . _ - / :), after a
//               namespace and '|' outside the default namespace; device
//               1..256 printable ASCII bytes; rows, cols >= 1; last_step >= 0; residual_len as
//               the kind requires, and every residual value finite
//   weight      block 1x16/16x16, rounding RTN/SR, dtype F32/BF16 (fp4q.v1 numbers); cols a
//               multiple of 16 (rows too for 16x16); global_amax finite >= 0; s_enc finite > 0;
//               codes_len rows*cols/2, scales_len rows*cols/16, residual_len rows*cols*4 with
//               error feedback else 0; no scale byte is an E4M3 NaN (0x7F, 0xFF); scaling,
//               optimizer, state_dtype known (amsgrad only with AdamW, momentum only with SGD);
//               optimizer_steps >= 0; stats finite >= 0; as many moments as the optimizer
//               keeps, each of its dtype's size for the shape, values finite (NVFP4: no NaN
//               scale, record a finite amax >= 0 and S_enc > 0)
//   residual    the weight fields 0 (block, rounding, dtype, error_feedback, seed, global_amax,
//               s_enc); codes and scales empty; residual_len rows*cols*4
absl::Status ValidateCheckpointRecord(const CheckpointRecord& record, uint32_t index);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_CHECKPOINT_H_
