#include "server/logging.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fp4q/common/json.h"

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
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", LevelName(level),
                    "\",\"msg\":", common::JsonQuote(msg));
    for (const auto& [key, value] : fields) {
      absl::StrAppend(&line, ",", common::JsonQuote(key), ":", common::JsonQuote(value));
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
