// A small, strict JSON parser (RFC 8259) for the headers of safetensors files and the JSON
// strings their metadata carries (e.g. the golden file's `cases` list). Not a general-purpose
// library: it reads a document into an immutable tree and writes quoted strings.
//
// Contract
// - Input is hostile: every malformed document gives INVALID_ARGUMENT naming the byte offset
//   and what was expected; nesting deeper than kMaxJsonDepth is rejected, as are duplicate
//   object keys, control characters in strings, lone surrogates, leading zeros and trailing
//   garbage after the value (whitespace excepted).
// - Numbers keep their source text: AsInt64/AsUint64 convert exactly (rejecting fractions,
//   exponents and out-of-range values), AsDouble converts with correct rounding.
// - Objects keep their members in document order.
// - Thread safety: a parsed JsonValue is immutable and may be read from any thread.
#ifndef FP4Q_COMMON_JSON_H_
#define FP4Q_COMMON_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fp4q::common {

inline constexpr int kMaxJsonDepth = 64;

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;  // null
  static JsonValue Null() { return JsonValue(); }
  static JsonValue Bool(bool b);
  static JsonValue Number(std::string text);  // text must be a valid JSON number
  static JsonValue String(std::string s);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<Member> members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors; each precondition is the matching is_*() (otherwise returns an empty value).
  bool bool_value() const { return bool_; }
  // For kString the decoded string; for kNumber the number's source text.
  const std::string& text() const { return text_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<Member>& members() const { return members_; }

  // Object member by key, or nullptr (also for non-objects).
  const JsonValue* Find(absl::string_view key) const;

  // Exact integer conversions of a number; INVALID_ARGUMENT for non-numbers, fractions,
  // exponents, negative values (AsUint64) and values out of range.
  absl::StatusOr<int64_t> AsInt64() const;
  absl::StatusOr<uint64_t> AsUint64() const;
  // A number as the nearest double; INVALID_ARGUMENT for non-numbers or overflow to Inf.
  absl::StatusOr<double> AsDouble() const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::vector<Member> members_;
};

// Name of a type for error messages: "null", "bool", "number", "string", "array", "object".
const char* JsonTypeName(JsonValue::Type type);

// Parses one JSON document (surrounding whitespace allowed).
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `s` as a JSON string literal with quotes; control characters, '"' and '\\' escaped. Bytes
// >= 0x80 are copied (the caller supplies UTF-8).
std::string JsonQuote(absl::string_view s);

}  // namespace fp4q::common

#endif  // FP4Q_COMMON_JSON_H_
