#include "server/logging.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fp4q::server {
namespace {

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

}  // namespace

std::string JsonEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
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
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

Logger::Logger(LogFormat format, std::FILE* out) : format_(format), out_(out) {}

Logger* Logger::Null() {
  static Logger* null = new Logger(LogFormat::kText, nullptr);
  return null;
}

void Logger::Log(LogLevel level, absl::string_view msg, std::initializer_list<LogField> fields) {
  if (out_ == nullptr) return;
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
  std::string line;
  if (format_ == LogFormat::kJson) {
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", LevelName(level), "\",\"msg\":\"",
                    JsonEscape(msg), "\"");
    for (const auto& [key, value] : fields) {
      absl::StrAppend(&line, ",\"", JsonEscape(key), "\":\"", JsonEscape(value), "\"");
    }
    line += "}\n";
  } else {
    absl::StrAppend(&line, ts, " ", LevelName(level), " ", msg);
    for (const auto& [key, value] : fields) absl::StrAppend(&line, " ", key, "=", value);
    line += "\n";
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace fp4q::server
