// The checkpoint file: all named state, written atomically.
//
// File: <state_dir>/fp4q-state.ckpt. Written as fp4q-state.ckpt.tmp, fsync'd, renamed over the
// old file, then the directory is fsync'd: a crash (kill -9, power loss) leaves either the old
// or the new complete file, never a torn one.
//
// Format (all integers little-endian):
//   body    := header record* end
//   header  := "FP4QCKP1" u32 version(=1) u32 reserved(=0) u64 server_epoch
//              u64 created_unix_micros                                       (32 bytes)
//   record  := u8 kind(1 weight, 2 residual) u8 has_step u8 block u8 rounding
//              u8 error_feedback u8 dtype u16 reserved(=0) u64 seed i64 rows i64 cols
//              i64 last_step f32 global_amax f32 s_enc u32 name_len u32 device_len
//              u64 codes_len u64 scales_len u64 residual_len                (80 bytes)
//              name device codes scales residual
//              (block/rounding/dtype are the fp4q.v1 enum numbers; for residual records the
//              weight fields are 0 and codes/scales empty)
//   end     := u8 0xFF u32 record_count u64 body_bytes_before_end            (13 bytes)
//   trailer := u32 crc32c(body) "FP4QEND1"                                   (12 bytes)
// The CRC-32C covers everything before the trailer. A reader checks, in order: size, trailer
// magic (else "truncated"), CRC (else "corrupt"), header magic and version, then every record's
// lengths against the bytes that remain and the end record's count and offset. Any failure is
// DATA_LOSS and nothing is returned.
#ifndef FP4Q_SERVER_CHECKPOINT_H_
#define FP4Q_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::server {

inline constexpr char kCheckpointFileName[] = "fp4q-state.ckpt";
inline constexpr char kCheckpointTempSuffix[] = ".tmp";

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
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Begin(const std::string& dir,
                                                                 uint64_t server_epoch);
  ~CheckpointWriter();
  absl::Status Add(const CheckpointRecord& record);
  absl::StatusOr<CheckpointStats> Commit();

 private:
  CheckpointWriter() = default;
  absl::Status Write(const void* data, size_t n);
  std::string dir_;
  std::string tmp_path_;
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

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_CHECKPOINT_H_
