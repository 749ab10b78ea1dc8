// Reader and writer of the safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: "__metadata__" (optional, string -> string) and, per tensor,
//             {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//   the rest  the data section; offsets are relative to its start.
//
// Contract
// - The reader treats its input as hostile. Any violation gives INVALID_ARGUMENT naming the
//   tensor and the offending value: a file shorter than 8 bytes, a header length beyond the
//   file or kMaxSafetensorsHeaderBytes, malformed JSON, a header that is not an object, an
//   unknown dtype, a negative or non-integer dimension, offsets that are reversed, outside the
//   data section, overlapping, leaving gaps, or not covering the data section exactly (as the
//   reference implementation requires), a byte size that disagrees with the shape's product
//   (overflow-checked), unknown keys in a tensor entry, non-string metadata values, an empty
//   tensor name. Nothing is read out of bounds.
// - A SafetensorsFile owns its bytes; tensor data views stay valid while it lives. Data is not
//   necessarily aligned: copy it out (CopyTensor) before reading it as a typed array.
// - The writer pads the header with spaces to a multiple of 8 bytes, as the reference writer
//   does, and lays tensors out by decreasing element size, then by name, so each tensor starts
//   at a multiple of its element size.
// - Thread safety: const methods may be called concurrently.
#ifndef FP4Q_COMMON_SAFETENSORS_H_
#define FP4Q_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fp4q::common {

// Header size limit of the reference implementation (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

enum class StDType {
  kBool,
  kU8,
  kI8,
  kF8E4M3,  // "F8_E4M3"
  kF8E5M2,  // "F8_E5M2"
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

// The format's name ("F32", "F8_E4M3", ...) and element size in bytes.
const char* StDTypeName(StDType dtype);
size_t StDTypeSize(StDType dtype);
// Parses a name; INVALID_ARGUMENT "unknown dtype \"X\"" otherwise.
absl::StatusOr<StDType> ParseStDType(absl::string_view name);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::kU8;
  std::vector<int64_t> shape;  // empty for a scalar (one element)
  uint64_t begin = 0;          // byte offsets within the data section
  uint64_t end = 0;
  uint64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Parses a whole file held in memory (takes the bytes).
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes);
  // Reads and parses `path`; NOT_FOUND / INTERNAL (with the path and errno text) when the
  // file cannot be read, then as FromBytes.
  static absl::StatusOr<SafetensorsFile> ReadFile(const std::string& path);

  // Tensors in header order.
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor named `name`, or NOT_FOUND "tensor \"name\" not found".
  absl::StatusOr<const StTensorInfo*> Find(absl::string_view name) const;
  // The raw bytes of a tensor of this file.
  absl::string_view Data(const StTensorInfo& info) const;
  // Checks `name` has `dtype` (INVALID_ARGUMENT otherwise) and returns a copy of its bytes as
  // `T` values; sizeof(T) must equal the dtype size (INVALID_ARGUMENT otherwise).
  template <typename T>
  absl::StatusOr<std::vector<T>> CopyTensor(absl::string_view name, StDType dtype) const;
  // A metadata value, or NOT_FOUND.
  absl::StatusOr<std::string> Metadata(absl::string_view key) const;

 private:
  absl::StatusOr<const StTensorInfo*> CheckTyped(absl::string_view name, StDType dtype,
                                                 size_t elem_size) const;

  std::string bytes_;
  size_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Adds a tensor; INVALID_ARGUMENT for an empty or duplicate name (or "__metadata__"),
  // a negative dimension, or `bytes` not matching the shape's byte size.
  absl::Status Add(const std::string& name, StDType dtype, const std::vector<int64_t>& shape,
                   absl::string_view bytes);
  void SetMetadata(const std::string& key, const std::string& value);
  // The file's bytes.
  std::string Serialize() const;
  // Writes Serialize() to `path` (via `path`.tmp and a rename); INTERNAL with errno text.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// ---- Implementation of the template. ----
template <typename T>
absl::StatusOr<std::vector<T>> SafetensorsFile::CopyTensor(absl::string_view name,
                                                           StDType dtype) const {
  auto info = CheckTyped(name, dtype, sizeof(T));
  if (!info.ok()) return info.status();
  std::vector<T> out((*info)->num_bytes() / sizeof(T));
  const absl::string_view data = Data(**info);
  if (!data.empty()) std::memcpy(out.data(), data.data(), data.size());
  return out;
}

}  // namespace fp4q::common

#endif  // FP4Q_COMMON_SAFETENSORS_H_
