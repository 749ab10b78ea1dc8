// safetensors reader and writer; see safetensors.h for the contract.
#include "fp4q/common/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fp4q/common/json.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::common {
namespace {

struct DTypeEntry {
  StDType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {StDType::kBool, "BOOL", 1},      {StDType::kU8, "U8", 1},          {StDType::kI8, "I8", 1},
    {StDType::kF8E4M3, "F8_E4M3", 1}, {StDType::kF8E5M2, "F8_E5M2", 1}, {StDType::kI16, "I16", 2},
    {StDType::kU16, "U16", 2},        {StDType::kF16, "F16", 2},        {StDType::kBF16, "BF16", 2},
    {StDType::kI32, "I32", 4},        {StDType::kU32, "U32", 4},        {StDType::kF32, "F32", 4},
    {StDType::kI64, "I64", 8},        {StDType::kU64, "U64", 8},        {StDType::kF64, "F64", 8},
};

const DTypeEntry& Entry(StDType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable for valid enum values
}

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

absl::Status TensorError(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor ", Quoted(name), ": ", what));
}

// Product of dims times elem_size, or nullopt-like false on overflow.
bool ByteSize(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* out) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    const uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<uint64_t>::max() / u) return false;
    n *= u;
  }
  *out = n;
  return true;
}

absl::StatusOr<StTensorInfo> ParseTensorEntry(const std::string& name, const JsonValue& v,
                                              uint64_t data_size) {
  if (name.empty()) {
    return absl::InvalidArgumentError("safetensors: empty tensor name in the header");
  }
  if (!v.is_object()) {
    return TensorError(name,
                       absl::StrCat("entry is a ", JsonTypeName(v.type()), ", expected an object"));
  }
  for (const JsonValue::Member& m : v.members()) {
    if (m.first != "dtype" && m.first != "shape" && m.first != "data_offsets") {
      return TensorError(name, absl::StrCat("unknown key ", Quoted(m.first)));
    }
  }
  StTensorInfo info;
  info.name = name;

  const JsonValue* dtype = v.Find("dtype");
  if (dtype == nullptr) return TensorError(name, "missing \"dtype\"");
  if (!dtype->is_string()) return TensorError(name, "\"dtype\" is not a string");
  auto parsed = ParseStDType(dtype->text());
  if (!parsed.ok()) return TensorError(name, parsed.status().message());
  info.dtype = *parsed;

  const JsonValue* shape = v.Find("shape");
  if (shape == nullptr) return TensorError(name, "missing \"shape\"");
  if (!shape->is_array()) return TensorError(name, "\"shape\" is not an array");
  for (size_t i = 0; i < shape->items().size(); ++i) {
    auto d = shape->items()[i].AsInt64();
    if (!d.ok()) {
      return TensorError(name, absl::StrCat("shape[", i, "]: ", d.status().message()));
    }
    if (*d < 0) return TensorError(name, absl::StrCat("shape[", i, "]: ", *d, " is negative"));
    info.shape.push_back(*d);
  }

  const JsonValue* offsets = v.Find("data_offsets");
  if (offsets == nullptr) return TensorError(name, "missing \"data_offsets\"");
  if (!offsets->is_array() || offsets->items().size() != 2) {
    return TensorError(name, "\"data_offsets\" is not an array of two integers");
  }
  for (int i = 0; i < 2; ++i) {
    auto o = offsets->items()[i].AsUint64();
    if (!o.ok()) {
      return TensorError(name, absl::StrCat("data_offsets[", i, "]: ", o.status().message()));
    }
    (i == 0 ? info.begin : info.end) = *o;
  }
  if (info.begin > info.end) {
    return TensorError(
        name, absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] are reversed"));
  }
  if (info.end > data_size) {
    return TensorError(name,
                       absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                                    "] end beyond the data section of ", data_size, " bytes"));
  }
  uint64_t bytes = 0;
  if (!ByteSize(info.shape, StDTypeSize(info.dtype), &bytes)) {
    return TensorError(name, absl::StrCat("shape [", absl::StrJoin(info.shape, ", "),
                                          "] overflows the byte size"));
  }
  if (bytes != info.end - info.begin) {
    return TensorError(
        name, absl::StrCat("shape [", absl::StrJoin(info.shape, ", "), "] of ",
                           StDTypeName(info.dtype), " needs ", bytes, " bytes but data_offsets [",
                           info.begin, ", ", info.end, "] hold ", info.end - info.begin));
  }
  return info;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const JsonValue& v) {
  if (!v.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: __metadata__ is a ",
                                                   JsonTypeName(v.type()), ", expected an object"));
  }
  std::map<std::string, std::string> out;
  for (const JsonValue::Member& m : v.members()) {
    if (!m.second.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: __metadata__ value of ", Quoted(m.first), " is a ",
                       JsonTypeName(m.second.type()), ", expected a string"));
    }
    out[m.first] = m.second.text();
  }
  return out;
}

// The tensors must tile the data section exactly: sorted by offset, each begins where the
// previous one ended, and the last ends at the end of the section.
absl::Status CheckCoverage(const std::vector<StTensorInfo>& tensors, uint64_t data_size) {
  std::vector<const StTensorInfo*> sorted;
  for (const StTensorInfo& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const StTensorInfo* a, const StTensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  const StTensorInfo* previous = nullptr;
  for (const StTensorInfo* t : sorted) {
    if (t->begin < expected) {
      return TensorError(t->name,
                         absl::StrCat("data_offsets [", t->begin, ", ", t->end, "] overlap tensor ",
                                      Quoted(previous->name), " ending at ", expected));
    }
    if (t->begin > expected) {
      return TensorError(t->name,
                         absl::StrCat("data_offsets [", t->begin, ", ", t->end,
                                      "] leave a gap: the previous tensor ends at ", expected));
    }
    expected = t->end;
    previous = t;
  }
  if (expected != data_size) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: the tensors cover ", expected,
                                                   " bytes of a data section of ", data_size,
                                                   " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* StDTypeName(StDType dtype) { return Entry(dtype).name; }
size_t StDTypeSize(StDType dtype) { return Entry(dtype).size; }

absl::StatusOr<StDType> ParseStDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", Quoted(name)));
}

uint64_t StTensorInfo::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes) {
  const uint64_t size = bytes.size();
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: file of ", size, " bytes is shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: header length ", n,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: header length ", n,
                                                   " exceeds the ", size - 8,
                                                   " bytes after the length field"));
  }
  auto json = ParseJson(absl::string_view(bytes).substr(8, n));
  if (!json.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: header: ", json.status().message()));
  }
  if (!json->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors: header is a ", JsonTypeName(json->type()), ", expected an object"));
  }
  SafetensorsFile file;
  file.data_start_ = 8 + n;
  const uint64_t data_size = size - 8 - n;
  for (const JsonValue::Member& m : json->members()) {
    if (m.first == "__metadata__") {
      FP4Q_ASSIGN_OR_RETURN(file.metadata_, ParseMetadata(m.second));
      continue;
    }
    FP4Q_ASSIGN_OR_RETURN(StTensorInfo info, ParseTensorEntry(m.first, m.second, data_size));
    file.tensors_.push_back(std::move(info));
  }
  FP4Q_RETURN_IF_ERROR(CheckCoverage(file.tensors_, data_size));
  file.bytes_ = std::move(bytes);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg =
        absl::StrCat("safetensors: cannot open ", Quoted(path), ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(absl::StrCat("safetensors: error reading ", Quoted(path)));
  }
  auto file = FromBytes(std::move(buffer).str());
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat(path, ": ", file.status().message()));
  }
  return file;
}

absl::StatusOr<const StTensorInfo*> SafetensorsFile::Find(absl::string_view name) const {
  for (const StTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return absl::NotFoundError(absl::StrCat("safetensors: tensor ", Quoted(name), " not found"));
}

absl::string_view SafetensorsFile::Data(const StTensorInfo& info) const {
  return absl::string_view(bytes_).substr(data_start_ + info.begin, info.num_bytes());
}

absl::StatusOr<const StTensorInfo*> SafetensorsFile::CheckTyped(absl::string_view name,
                                                                StDType dtype,
                                                                size_t elem_size) const {
  FP4Q_ASSIGN_OR_RETURN(const StTensorInfo* info, Find(name));
  if (info->dtype != dtype) {
    return TensorError(name, absl::StrCat("dtype is ", StDTypeName(info->dtype), ", expected ",
                                          StDTypeName(dtype)));
  }
  if (elem_size != StDTypeSize(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: element size ", elem_size,
                                                   " does not match ", StDTypeName(dtype)));
  }
  return info;
}

absl::StatusOr<std::string> SafetensorsFile::Metadata(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) {
    return absl::NotFoundError(
        absl::StrCat("safetensors: metadata key ", Quoted(key), " not found"));
  }
  return it->second;
}

absl::Status SafetensorsWriter::Add(const std::string& name, StDType dtype,
                                    const std::vector<int64_t>& shape, absl::string_view bytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: invalid tensor name ", Quoted(name)));
  }
  for (const Entry& e : entries_) {
    if (e.name == name) return TensorError(name, "added twice");
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return TensorError(name, absl::StrCat("shape[", i, "]: ", shape[i], " is negative"));
    }
  }
  uint64_t need = 0;
  if (!ByteSize(shape, StDTypeSize(dtype), &need)) {
    return TensorError(name, "shape overflows the byte size");
  }
  if (need != bytes.size()) {
    return TensorError(
        name, absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] of ", StDTypeName(dtype),
                           " needs ", need, " bytes, got ", bytes.size()));
  }
  entries_.push_back(Entry{name, dtype, shape, std::string(bytes)});
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::string SafetensorsWriter::Serialize() const {
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const size_t sa = StDTypeSize(a->dtype), sb = StDTypeSize(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata_) {
      if (!first) header += ",";
      first = false;
      absl::StrAppend(&header, JsonQuote(k), ":", JsonQuote(v));
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const Entry* e : order) {
    if (!header.empty() && header.back() != '{') header += ",";
    absl::StrAppend(&header, JsonQuote(e->name), ":{\"dtype\":", JsonQuote(StDTypeName(e->dtype)),
                    ",\"shape\":[", absl::StrJoin(e->shape, ","), "],\"data_offsets\":[", offset,
                    ",", offset + e->bytes.size(), "]}");
    offset += e->bytes.size();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + header.size() + offset);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out += header;
  for (const Entry* e : order) out += e->bytes;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const std::string bytes = Serialize();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::InternalError(
          absl::StrCat("safetensors: cannot create ", Quoted(tmp), ": ", std::strerror(errno)));
    }
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      return absl::InternalError(
          absl::StrCat("safetensors: error writing ", Quoted(tmp), ": ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("safetensors: cannot rename ", Quoted(tmp), " to ",
                                            Quoted(path), ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace fp4q::common
