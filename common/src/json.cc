// Recursive-descent JSON parser; see json.h for the contract.
#include "fp4q/common/json.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "fp4q/common/status_macros.h"

namespace fp4q::common {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::Number(std::string text) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.text_ = std::move(text);
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.text_ = std::move(s);
  return v;
}

JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue v;
  v.type_ = Type::kArray;
  v.items_ = std::move(items);
  return v;
}

JsonValue JsonValue::Object(std::vector<Member> members) {
  JsonValue v;
  v.type_ = Type::kObject;
  v.members_ = std::move(members);
  return v;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const Member& m : members_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

const char* JsonTypeName(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::kNull:
      return "null";
    case JsonValue::Type::kBool:
      return "bool";
    case JsonValue::Type::kNumber:
      return "number";
    case JsonValue::Type::kString:
      return "string";
    case JsonValue::Type::kArray:
      return "array";
    case JsonValue::Type::kObject:
      return "object";
  }
  return "unknown";
}

absl::StatusOr<uint64_t> JsonValue::AsUint64() const {
  if (type_ != Type::kNumber) {
    return absl::InvalidArgumentError(absl::StrCat("expected a number, got ", JsonTypeName(type_)));
  }
  if (text_.find_first_of(".eE") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(text_, " is not an integer"));
  }
  if (text_[0] == '-') {
    if (text_ == "-0") return 0;
    return absl::InvalidArgumentError(absl::StrCat(text_, " is negative"));
  }
  uint64_t value = 0;
  for (char c : text_) {
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      return absl::InvalidArgumentError(absl::StrCat(text_, " is out of the 64-bit range"));
    }
    value = value * 10 + digit;
  }
  return value;
}

absl::StatusOr<int64_t> JsonValue::AsInt64() const {
  if (type_ == Type::kNumber && !text_.empty() && text_[0] == '-') {
    JsonValue magnitude = Number(text_.substr(1));
    FP4Q_ASSIGN_OR_RETURN(uint64_t m, magnitude.AsUint64());
    const uint64_t limit = uint64_t{1} << 63;
    if (m > limit) {
      return absl::InvalidArgumentError(absl::StrCat(text_, " is out of the int64 range"));
    }
    return m == limit ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(m);
  }
  FP4Q_ASSIGN_OR_RETURN(uint64_t u, AsUint64());
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(text_, " is out of the int64 range"));
  }
  return static_cast<int64_t>(u);
}

absl::StatusOr<double> JsonValue::AsDouble() const {
  if (type_ != Type::kNumber) {
    return absl::InvalidArgumentError(absl::StrCat("expected a number, got ", JsonTypeName(type_)));
  }
  double d = 0;
  if (!absl::SimpleAtod(text_, &d) || std::isinf(d)) {
    return absl::InvalidArgumentError(absl::StrCat(text_, " is out of the double range"));
  }
  return d;
}

namespace {

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<JsonValue> Document() {
    SkipSpace();
    FP4Q_ASSIGN_OR_RETURN(JsonValue v, Value(0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("unexpected data after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("json: offset ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::StatusOr<JsonValue> Value(int depth) {
    if (pos_ >= s_.size()) return Error("unexpected end of input, expected a value");
    const char c = s_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= kMaxJsonDepth) {
        return Error(absl::StrCat("nesting deeper than ", kMaxJsonDepth));
      }
      return c == '{' ? ObjectValue(depth + 1) : ArrayValue(depth + 1);
    }
    if (c == '"') {
      FP4Q_ASSIGN_OR_RETURN(std::string str, StringLiteral());
      return JsonValue::String(std::move(str));
    }
    if (c == '-' || (c >= '0' && c <= '9')) return NumberValue();
    if (Consume("true")) return JsonValue::Bool(true);
    if (Consume("false")) return JsonValue::Bool(false);
    if (Consume("null")) return JsonValue::Null();
    return Error(absl::StrCat("unexpected character '", absl::CEscape(s_.substr(pos_, 1)),
                              "', expected a value"));
  }

  absl::StatusOr<JsonValue> ObjectValue(int depth) {
    ++pos_;  // '{'
    std::vector<JsonValue::Member> members;
    std::set<std::string> keys;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return JsonValue::Object(std::move(members));
    }
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string key");
      const size_t key_pos = pos_;
      FP4Q_ASSIGN_OR_RETURN(std::string key, StringLiteral());
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        return Error(absl::StrCat("duplicate key \"", absl::CEscape(key), "\""));
      }
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':' after the key");
      ++pos_;
      SkipSpace();
      FP4Q_ASSIGN_OR_RETURN(JsonValue v, Value(depth));
      members.emplace_back(std::move(key), std::move(v));
      SkipSpace();
      if (pos_ >= s_.size()) return Error("unexpected end of input in an object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        return JsonValue::Object(std::move(members));
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::StatusOr<JsonValue> ArrayValue(int depth) {
    ++pos_;  // '['
    std::vector<JsonValue> items;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return JsonValue::Array(std::move(items));
    }
    while (true) {
      SkipSpace();
      FP4Q_ASSIGN_OR_RETURN(JsonValue v, Value(depth));
      items.push_back(std::move(v));
      SkipSpace();
      if (pos_ >= s_.size()) return Error("unexpected end of input in an array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return JsonValue::Array(std::move(items));
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  bool Digit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

  // number = [ "-" ] ( "0" / 1-9 *DIGIT ) [ "." 1*DIGIT ] [ ( "e" / "E" ) [ "+" / "-" ] 1*DIGIT ]
  absl::StatusOr<JsonValue> NumberValue() {
    const size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (!Digit()) return Error("expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
      if (Digit()) return Error("leading zeros are not allowed");
    } else {
      while (Digit()) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!Digit()) return Error("expected a digit after '.'");
      while (Digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!Digit()) return Error("expected a digit in the exponent");
      while (Digit()) ++pos_;
    }
    return JsonValue::Number(std::string(s_.substr(start, pos_ - start)));
  }

  absl::StatusOr<uint32_t> Hex4() {
    if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return Error("bad hex digit in \\u escape");
      }
      v = v * 16 + d;
    }
    pos_ += 4;
    return v;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Length of the valid UTF-8 sequence starting at pos_ (a byte >= 0x80), or 0.
  size_t Utf8SequenceLength() const {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(s_[pos_ + i]); };
    const unsigned char b0 = byte(0);
    size_t n;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 2;
      cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 3;
      cp = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 4;
      cp = b0 & 0x07;
    } else {
      return 0;
    }
    if (pos_ + n > s_.size()) return 0;
    for (size_t i = 1; i < n; ++i) {
      if ((byte(i) & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (byte(i) & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return 0;  // overlong, out of range or a surrogate
    }
    return n;
  }

  absl::StatusOr<std::string> StringLiteral() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) return Error("control character in a string");
      if (c >= 0x80) {
        const size_t n = Utf8SequenceLength();
        if (n == 0) return Error("invalid UTF-8 in a string");
        out.append(s_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          FP4Q_ASSIGN_OR_RETURN(uint32_t cp, Hex4());
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!Consume("\\u")) return Error("high surrogate without a low surrogate");
            FP4Q_ASSIGN_OR_RETURN(uint32_t lo, Hex4());
            if (lo < 0xDC00 || lo > 0xDFFF) {
              return Error("high surrogate without a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, &out);
          break;
        }
        default:
          --pos_;
          return Error(absl::StrCat("unknown escape '\\", absl::CEscape(s_.substr(pos_, 1)), "'"));
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).Document(); }

std::string JsonQuote(absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out += "\"";
  return out;
}

}  // namespace fp4q::common
