// Names and size arithmetic of types.h.
#include "fp4q/kernels/types.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fp4q::kernels {
namespace {

using u128 = unsigned __int128;
constexpr u128 kMaxBytes = static_cast<u128>(1) << 62;

absl::Status CheckDims(int64_t rows, int64_t cols, const FieldPath& what) {
  if (rows < 1)
    return absl::InvalidArgumentError(absl::StrCat(what.str(), ".rows: ", rows, " must be >= 1"));
  if (cols < 1)
    return absl::InvalidArgumentError(absl::StrCat(what.str(), ".cols: ", cols, " must be >= 1"));
  return absl::OkStatus();
}

absl::StatusOr<size_t> CheckedBytes(u128 bytes, int64_t rows, int64_t cols, const FieldPath& what,
                                    absl::string_view kind, absl::string_view kind2 = "") {
  if (bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what.str(), ": ", kind, kind2, " of [", rows,
                                                   ", ", cols, "] exceed the limit of 2^62 bytes"));
  }
  return static_cast<size_t>(bytes);
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

const char* FormatName(Format format) {
  switch (format) {
    case Format::kNvfp4:
      return "nvfp4";
    case Format::kMxfp4:
      return "mxfp4";
  }
  return "unknown";
}

const char* BlockShapeName(BlockShape block) {
  switch (block) {
    case BlockShape::k1x16:
      return "1x16";
    case BlockShape::k16x16:
      return "16x16";
    case BlockShape::k1x32:
      return "1x32";
  }
  return "unknown";
}

int BlockElems(Format format) {
  switch (format) {
    case Format::kNvfp4:
      return 16;
    case Format::kMxfp4:
      return 32;
  }
  return 0;
}

absl::StatusOr<size_t> DenseBytes(int64_t rows, int64_t cols, DType dtype,
                                  const FieldPath& what) {
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what.str(), ".dtype: ", static_cast<int>(dtype), " is not a valid dtype"));
  }
  if (auto s = CheckDims(rows, cols, what); !s.ok()) return s;
  const u128 bytes = static_cast<u128>(rows) * static_cast<u128>(cols) * DTypeSize(dtype);
  return CheckedBytes(bytes, rows, cols, what, DTypeName(dtype), " bytes");
}

absl::StatusOr<size_t> CodeBytes(int64_t rows, int64_t cols, const FieldPath& what) {
  if (auto s = CheckDims(rows, cols, what); !s.ok()) return s;
  if (cols % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what.str(), ".cols: ", cols, " is odd"));
  }
  const u128 bytes = static_cast<u128>(rows) * static_cast<u128>(cols) / 2;
  return CheckedBytes(bytes, rows, cols, what, "code bytes");
}

absl::StatusOr<size_t> ScaleBytes(int64_t rows, int64_t cols, Format format, ScaleLayout layout,
                                  const FieldPath& what) {
  if (auto s = CheckDims(rows, cols, what); !s.ok()) return s;
  const int block = BlockElems(format);
  if (block == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what.str(), ".format: ", static_cast<int>(format), " is not a valid format"));
  }
  if (cols % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what.str(), ".cols: ", cols, " is not a multiple of the block size ", block));
  }
  u128 scale_rows = static_cast<u128>(rows);
  u128 scale_cols = static_cast<u128>(cols / block);
  switch (layout) {
    case ScaleLayout::kPlain:
      break;
    case ScaleLayout::kSwizzled:
      scale_rows = (scale_rows + 127) / 128 * 128;
      scale_cols = (scale_cols + 3) / 4 * 4;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          what.str(), ".scale_layout: ", static_cast<int>(layout), " is not a valid scale layout"));
  }
  return CheckedBytes(scale_rows * scale_cols, rows, cols, what, "scale bytes");
}

size_t SwizzledScaleOffset(int64_t r, int64_t c, int64_t scale_cols) {
  const int64_t padded_cols = (scale_cols + 3) / 4 * 4;
  const int64_t tile = (r / 128) * (padded_cols / 4) + c / 4;
  return static_cast<size_t>(tile * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4);
}

}  // namespace fp4q::kernels
