#include "server/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fp4q/common/status_macros.h"
#include "server/crc32c.h"

namespace fp4q::server {
namespace {

constexpr char kMagic[8] = {'F', 'P', '4', 'Q', 'C', 'K', 'P', '1'};
constexpr char kEndMagic[8] = {'F', 'P', '4', 'Q', 'E', 'N', 'D', '1'};
constexpr uint32_t kVersion = 2;  // written; 1 is still read
constexpr size_t kHeaderBytes = 32;
constexpr size_t kRecordFixedBytes = 88;   // version 2
constexpr size_t kRecordFixedBytesV1 = 80;
constexpr size_t kEndBytes = 13;
constexpr size_t kTrailerBytes = 12;
constexpr uint8_t kEndKind = 0xFF;
constexpr uint32_t kMaxNameLen = 4096;
// kCheckpointFileName + kCheckpointTempSuffix (checkpoint_test checks that they agree).
constexpr char kTempName[] = "fp4q-state.ckpt.tmp";

std::string ErrnoText(int err) { return std::strerror(err); }

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "a special file";
}

// Little-endian encoding into a byte string.
class Encoder {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(v, 2); }
  void U32(uint32_t v) { Raw(v, 4); }
  void U64(uint64_t v) { Raw(v, 8); }
  void I64(int64_t v) { Raw(static_cast<uint64_t>(v), 8); }
  void F32(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    U32(u);
  }
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  const std::string& str() const { return out_; }

 private:
  void Raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

// Little-endian decoding from a byte range.
class Decoder {
 public:
  Decoder(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t U8() { return static_cast<uint8_t>(Raw(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Raw(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Raw(4)); }
  uint64_t U64() { return Raw(8); }
  int64_t I64() { return static_cast<int64_t>(Raw(8)); }
  float F32() {
    uint32_t u = U32();
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }

 private:
  uint64_t Raw(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n && pos_ < n_; ++i) v |= static_cast<uint64_t>(p_[pos_++]) << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

struct RecordHeader {
  CheckpointRecord r;  // fixed fields only
  uint32_t name_len = 0;
  uint32_t device_len = 0;
  uint64_t codes_len = 0;
  uint64_t scales_len = 0;
  uint64_t residual_len = 0;
  uint64_t ext_len = 0;
};

RecordHeader DecodeRecordHeader(const uint8_t* p, uint32_t version) {
  Decoder d(p, version >= 2 ? kRecordFixedBytes : kRecordFixedBytesV1);
  RecordHeader h;
  h.r.kind = d.U8();
  h.r.has_step = d.U8() != 0;
  h.r.block = d.U8();
  h.r.rounding = d.U8();
  h.r.error_feedback = d.U8() != 0;
  h.r.dtype = d.U8();
  d.U16();
  h.r.seed = d.U64();
  h.r.rows = d.I64();
  h.r.cols = d.I64();
  h.r.last_step = d.I64();
  h.r.global_amax = d.F32();
  h.r.s_enc = d.F32();
  h.name_len = d.U32();
  h.device_len = d.U32();
  h.codes_len = d.U64();
  h.scales_len = d.U64();
  h.residual_len = d.U64();
  if (version >= 2) h.ext_len = d.U64();
  return h;
}

absl::Status DataLoss(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", what));
}

// A read-only file with positioned reads.
class File {
 public:
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Open(const std::string& path) {
    // O_NOFOLLOW: a symlink at the checkpoint's path is refused, not read; O_NONBLOCK: a FIFO
    // there cannot hang the open (regular files ignore the flag).
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd_ < 0) {
      if (errno == ENOENT) return absl::NotFoundError("no checkpoint file");
      if (errno == ELOOP) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint: ", path,
            " is a symbolic link; fp4qd never writes one and does not follow one (remove it)"));
      }
      return absl::UnavailableError(absl::StrCat("checkpoint: open: ", ErrnoText(errno)));
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      return absl::UnavailableError(absl::StrCat("checkpoint: stat: ", ErrnoText(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: ", path, " is ", FileKind(st.st_mode), ", not a regular file fp4qd wrote"));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    return absl::OkStatus();
  }
  uint64_t size() const { return size_; }
  absl::Status ReadAt(uint64_t offset, void* dst, size_t n) const {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(absl::StrCat("checkpoint: read: ", ErrnoText(errno)));
      }
      if (got == 0) return DataLoss("is truncated (file shrank while reading)");
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A weight's version-2 extension (checkpoint.h "ext").
// A weight record's extension up to its moments; each moment follows as its length (U64) and
// bytes, written straight from the record (ExtensionBytes counts them).
std::string EncodeExtensionHead(const CheckpointRecord& r) {
  Encoder e;
  e.U8(r.scaling);
  e.U8(r.optimizer);
  e.U8(r.momentum ? 1 : 0);
  e.U8(r.amsgrad ? 1 : 0);
  e.U8(r.state_dtype);
  e.U8(0);
  e.U16(0);
  e.I64(r.optimizer_steps);
  e.U64(r.last_hyper_hash);
  e.U32(static_cast<uint32_t>(r.fingerprints.size()));
  e.U32(static_cast<uint32_t>(r.moments.size()));
  for (float v : r.stats) e.F32(v);
  for (uint64_t f : r.fingerprints) e.U64(f);
  return e.str();
}

uint64_t ExtensionBytes(const CheckpointRecord& r, const std::string& head) {
  uint64_t n = head.size();
  for (const std::string& m : r.moments) n += 8 + m.size();
  return n;
}

constexpr size_t kExtensionFixed = 8 + 8 + 8 + 4 + 4 + 8 * 4;

// DATA_LOSS unless the extension of `ext_len` bytes at `at` holds exactly its header, its
// fingerprints and its length-prefixed moments.
absl::Status CheckExtensionLayout(const File& f, uint64_t at, uint64_t ext_len, uint32_t index) {
  if (ext_len == 0) return absl::OkStatus();
  const auto bad = [index] {
    return DataLoss(absl::StrCat("is corrupt: record ", index, " has a malformed extension"));
  };
  if (ext_len < kExtensionFixed) return bad();
  uint8_t fixed[kExtensionFixed];
  FP4Q_RETURN_IF_ERROR(f.ReadAt(at, fixed, kExtensionFixed));
  Decoder d(fixed + 24, 8);
  const uint32_t fingerprints = d.U32();
  const uint32_t moments = d.U32();
  if (fingerprints > 1024 || moments > 3) return bad();
  uint64_t pos = kExtensionFixed + uint64_t{8} * fingerprints;
  if (pos > ext_len) return bad();
  for (uint32_t m = 0; m < moments; ++m) {
    if (ext_len - pos < 8) return bad();
    uint8_t len8[8];
    FP4Q_RETURN_IF_ERROR(f.ReadAt(at + pos, len8, 8));
    const uint64_t len = Decoder(len8, 8).U64();
    pos += 8;
    if (len > ext_len - pos) return bad();
    pos += len;
  }
  return pos == ext_len ? absl::OkStatus() : bad();
}

// Fills *r from `ext`; false when its lengths do not add up.
bool DecodeExtension(const std::string& ext, CheckpointRecord* r) {
  constexpr size_t kFixed = kExtensionFixed;
  if (ext.size() < kFixed) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(ext.data());
  Decoder d(p, ext.size());
  r->scaling = d.U8();
  r->optimizer = d.U8();
  r->momentum = d.U8() != 0;
  r->amsgrad = d.U8() != 0;
  r->state_dtype = d.U8();
  d.U8();
  d.U16();
  r->optimizer_steps = d.I64();
  r->last_hyper_hash = d.U64();
  const uint32_t fingerprints = d.U32();
  const uint32_t moments = d.U32();
  for (float& v : r->stats) v = d.F32();
  size_t pos = kFixed;
  if (fingerprints > 1024 || moments > 3) return false;
  if ((ext.size() - pos) / 8 < fingerprints) return false;
  r->fingerprints.resize(fingerprints);
  for (uint64_t& f : r->fingerprints) {
    f = Decoder(p + pos, 8).U64();
    pos += 8;
  }
  r->moments.resize(moments);
  for (std::string& m : r->moments) {
    if (ext.size() - pos < 8) return false;
    const uint64_t len = Decoder(p + pos, 8).U64();
    pos += 8;
    if (len > ext.size() - pos) return false;
    m.assign(ext.data() + pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
  return pos == ext.size();
}


// Walks the records of a verified body; calls `visit` with each header and its payload offset.
absl::Status WalkRecords(const File& f, uint64_t body_bytes, uint32_t version,
                         const std::function<absl::Status(const RecordHeader&, uint64_t)>& visit) {
  uint64_t pos = kHeaderBytes;
  uint32_t count = 0;
  for (;;) {
    if (body_bytes - pos < 1) return DataLoss("is corrupt: no end record");
    uint8_t kind = 0;
    FP4Q_RETURN_IF_ERROR(f.ReadAt(pos, &kind, 1));
    if (kind == kEndKind) {
      if (body_bytes - pos != kEndBytes) {
        return DataLoss(absl::StrCat("is corrupt: end record at byte ", pos, " of ", body_bytes));
      }
      uint8_t end[kEndBytes];
      FP4Q_RETURN_IF_ERROR(f.ReadAt(pos, end, kEndBytes));
      Decoder d(end + 1, kEndBytes - 1);
      const uint32_t want_count = d.U32();
      const uint64_t want_pos = d.U64();
      if (want_count != count || want_pos != pos) {
        return DataLoss(absl::StrCat("is corrupt: end record says ", want_count,
                                     " records ending at byte ", want_pos, ", found ", count,
                                     " ending at byte ", pos));
      }
      return absl::OkStatus();
    }
    const size_t fixed_bytes = version >= 2 ? kRecordFixedBytes : kRecordFixedBytesV1;
    if (body_bytes - pos < fixed_bytes) {
      return DataLoss(absl::StrCat("is corrupt: record ", count, " header past the end"));
    }
    uint8_t fixed[kRecordFixedBytes];
    FP4Q_RETURN_IF_ERROR(f.ReadAt(pos, fixed, fixed_bytes));
    RecordHeader h = DecodeRecordHeader(fixed, version);
    if (h.r.kind != 1 && h.r.kind != 2) {
      return DataLoss(absl::StrCat("is corrupt: record ", count, " has kind ", h.r.kind));
    }
    if (h.name_len == 0 || h.name_len > kMaxNameLen || h.device_len > kMaxNameLen) {
      return DataLoss(absl::StrCat("is corrupt: record ", count, " has bad name/device length"));
    }
    uint64_t left = body_bytes - pos - fixed_bytes;
    uint64_t need = 0;
    for (uint64_t part : {static_cast<uint64_t>(h.name_len), static_cast<uint64_t>(h.device_len),
                          h.codes_len, h.scales_len, h.residual_len, h.ext_len}) {
      if (part > left - need) {
        return DataLoss(absl::StrCat("is corrupt: record ", count, " is longer than the file"));
      }
      need += part;
    }
    FP4Q_RETURN_IF_ERROR(visit(h, pos + fixed_bytes));
    pos += fixed_bytes + need;
    ++count;
  }
}

}  // namespace

// ---------------------------------------------------------------- writer

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Begin(const std::string& dir,
                                                                          uint64_t server_epoch) {
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->dir_ = dir;
  w->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (w->dir_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint: cannot open the state directory: ", ErrnoText(errno)));
  }
  // A temporary left by a crash (or planted): remove the entry itself, whatever it is. unlinkat
  // never follows a symlink; a directory there fails (EISDIR) and so does the checkpoint.
  if (::unlinkat(w->dir_fd_, kTempName, 0) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("checkpoint: cannot remove the stale temporary ",
                                               kTempName, ": ", ErrnoText(errno)));
  }
  const int fd =
      ::openat(w->dir_fd_, kTempName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return absl::UnavailableError(absl::StrCat(
          "checkpoint: ", kTempName,
          " reappeared between its removal and its exclusive creation (another writer in the "
          "state directory?); nothing written"));
    }
    return absl::UnavailableError(
        absl::StrCat("checkpoint: cannot create ", kTempName, ": ", ErrnoText(err)));
  }
  w->created_ = true;
  w->file_ = ::fdopen(fd, "wb");
  if (w->file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("checkpoint: cannot create ", kTempName, ": ", ErrnoText(err)));
  }
  Encoder e;
  e.Bytes(kMagic, sizeof(kMagic));
  e.U32(kVersion);
  e.U32(0);
  e.U64(server_epoch);
  e.U64(static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())));
  FP4Q_RETURN_IF_ERROR(w->Write(e.str().data(), e.str().size()));
  return w;
}

CheckpointWriter::~CheckpointWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (created_ && !committed_) ::unlinkat(dir_fd_, kTempName, 0);
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

absl::Status CheckpointWriter::Write(const void* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (std::fwrite(data, 1, n, file_) != n) {
    return absl::UnavailableError(absl::StrCat("checkpoint: write: ", ErrnoText(errno)));
  }
  crc_ = Crc32cExtend(crc_, data, n);
  body_bytes_ += n;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Add(const CheckpointRecord& r) {
  Encoder e;
  e.U8(r.kind);
  e.U8(r.has_step ? 1 : 0);
  e.U8(r.block);
  e.U8(r.rounding);
  e.U8(r.error_feedback ? 1 : 0);
  e.U8(r.dtype);
  e.U16(0);
  e.U64(r.seed);
  e.I64(r.rows);
  e.I64(r.cols);
  e.I64(r.last_step);
  e.F32(r.global_amax);
  e.F32(r.s_enc);
  e.U32(static_cast<uint32_t>(r.name.size()));
  e.U32(static_cast<uint32_t>(r.device.size()));
  e.U64(r.codes.size());
  e.U64(r.scales.size());
  e.U64(r.residual.size());
  // The moments (up to 8 bytes a parameter) are written from the record, not copied into the
  // extension first.
  const std::string ext = r.kind == 1 ? EncodeExtensionHead(r) : std::string();
  e.U64(r.kind == 1 ? ExtensionBytes(r, ext) : 0);
  FP4Q_RETURN_IF_ERROR(Write(e.str().data(), e.str().size()));
  for (const std::string* part : {&r.name, &r.device, &r.codes, &r.scales, &r.residual, &ext}) {
    FP4Q_RETURN_IF_ERROR(Write(part->data(), part->size()));
  }
  for (size_t i = 0; r.kind == 1 && i < r.moments.size(); ++i) {
    Encoder len;
    len.U64(r.moments[i].size());
    FP4Q_RETURN_IF_ERROR(Write(len.str().data(), len.str().size()));
    FP4Q_RETURN_IF_ERROR(Write(r.moments[i].data(), r.moments[i].size()));
  }
  ++records_;
  return absl::OkStatus();
}

absl::StatusOr<CheckpointStats> CheckpointWriter::Commit() {
  Encoder end;
  const uint64_t end_pos = body_bytes_;
  end.U8(kEndKind);
  end.U32(records_);
  end.U64(end_pos);
  FP4Q_RETURN_IF_ERROR(Write(end.str().data(), end.str().size()));
  Encoder trailer;
  trailer.U32(crc_);
  trailer.Bytes(kEndMagic, sizeof(kEndMagic));
  if (std::fwrite(trailer.str().data(), 1, trailer.str().size(), file_) != trailer.str().size() ||
      std::fflush(file_) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint: write: ", ErrnoText(errno)));
  }
  if (::fsync(fileno(file_)) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint: fsync: ", ErrnoText(errno)));
  }
  struct stat written;
  if (::fstat(fileno(file_), &written) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint: stat: ", ErrnoText(errno)));
  }
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    return absl::UnavailableError(absl::StrCat("checkpoint: close: ", ErrnoText(errno)));
  }
  file_ = nullptr;
  // renameat replaces the entry at the final path (a symlink there included) without following
  // it, and moves the entry at the temporary path: check that it is still the inode written.
  if (::renameat(dir_fd_, kTempName, dir_fd_, kCheckpointFileName) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint: rename: ", ErrnoText(errno)));
  }
  committed_ = true;
  struct stat installed;
  if (::fstatat(dir_fd_, kCheckpointFileName, &installed, AT_SYMLINK_NOFOLLOW) != 0) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint: stat ", kCheckpointFileName, ": ", ErrnoText(errno)));
  }
  if (installed.st_dev != written.st_dev || installed.st_ino != written.st_ino) {
    return absl::UnavailableError(absl::StrCat(
        "checkpoint: ", kTempName, " was replaced while it was written; ", kCheckpointFileName,
        " is not the file written (the next checkpoint replaces it; restore refuses a symlink)"));
  }
  if (::fsync(dir_fd_) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint: fsync dir: ", ErrnoText(errno)));
  }
  CheckpointStats stats;
  stats.file_name = kCheckpointFileName;
  stats.bytes = body_bytes_ + kTrailerBytes;
  stats.records = records_;
  return stats;
}

// ---------------------------------------------------------------- reader

absl::Status ReadCheckpoint(const std::string& path,
                            const std::function<absl::Status(CheckpointRecord)>& sink) {
  File f;
  FP4Q_RETURN_IF_ERROR(f.Open(path));
  const uint64_t size = f.size();
  if (size < kHeaderBytes + kEndBytes + kTrailerBytes) {
    return DataLoss(absl::StrCat("is truncated: ", size, " bytes"));
  }
  const uint64_t body_bytes = size - kTrailerBytes;
  uint8_t trailer[kTrailerBytes];
  FP4Q_RETURN_IF_ERROR(f.ReadAt(body_bytes, trailer, kTrailerBytes));
  if (std::memcmp(trailer + 4, kEndMagic, sizeof(kEndMagic)) != 0) {
    return DataLoss(absl::StrCat("is truncated: no trailer at byte ", body_bytes));
  }
  const uint32_t want_crc = Decoder(trailer, 4).U32();
  // Pass 1: checksum.
  uint32_t crc = 0;
  std::vector<uint8_t> chunk(1 << 20);
  for (uint64_t pos = 0; pos < body_bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), body_bytes - pos));
    FP4Q_RETURN_IF_ERROR(f.ReadAt(pos, chunk.data(), n));
    crc = Crc32cExtend(crc, chunk.data(), n);
    pos += n;
  }
  if (crc != want_crc) {
    return DataLoss(
        absl::StrCat("is corrupt: CRC-32C ", absl::Hex(crc), " != stored ", absl::Hex(want_crc)));
  }
  uint8_t header[kHeaderBytes];
  FP4Q_RETURN_IF_ERROR(f.ReadAt(0, header, kHeaderBytes));
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("is corrupt: bad magic (not an fp4q checkpoint)");
  }
  const uint32_t version = Decoder(header + 8, 4).U32();
  if (version != 1 && version != kVersion) {
    return DataLoss(absl::StrCat("has unsupported version ", version));
  }
  // Pass 2: structure, without payloads (an extension's inner lengths are read, not its
  // moments).
  uint32_t checked = 0;
  FP4Q_RETURN_IF_ERROR(WalkRecords(
      f, body_bytes, version, [&](const RecordHeader& h, uint64_t pos) -> absl::Status {
        const uint64_t at = pos + h.name_len + h.device_len + h.codes_len + h.scales_len +
                            h.residual_len;
        FP4Q_RETURN_IF_ERROR(CheckExtensionLayout(f, at, h.ext_len, checked));
        ++checked;
        return absl::OkStatus();
      }));
  // Pass 3: records.
  uint32_t index = 0;
  return WalkRecords(f, body_bytes, version,
                     [&](const RecordHeader& h, uint64_t pos) -> absl::Status {
    CheckpointRecord r = h.r;
    std::string ext;
    for (auto [dst, len] : {std::pair<std::string*, uint64_t>{&r.name, h.name_len},
                            {&r.device, h.device_len},
                            {&r.codes, h.codes_len},
                            {&r.scales, h.scales_len},
                            {&r.residual, h.residual_len},
                            {&ext, h.ext_len}}) {
      dst->resize(static_cast<size_t>(len));
      FP4Q_RETURN_IF_ERROR(f.ReadAt(pos, dst->data(), dst->size()));
      pos += len;
    }
    if (!ext.empty() && !DecodeExtension(ext, &r)) {
      return DataLoss(absl::StrCat("is corrupt: record ", index, " has a malformed extension"));
    }
    ++index;
    return sink(std::move(r));
  });
}

}  // namespace fp4q::server
