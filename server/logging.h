// Structured logs on stderr: one JSON object per line ({"ts":..., "level":..., "msg":...,
// fields...}) or, with the text format, "ts LEVEL msg key=value ...". Thread-safe.
//
// Logs are for operators: they may contain server paths; replies to clients never do.
#ifndef FP4Q_SERVER_LOGGING_H_
#define FP4Q_SERVER_LOGGING_H_

#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace fp4q::server {

enum class LogFormat { kJson, kText };
enum class LogLevel { kInfo, kWarning, kError };

using LogField = std::pair<absl::string_view, std::string>;

class Logger {
 public:
  // Writes to `out` (not owned; stderr by default).
  explicit Logger(LogFormat format = LogFormat::kJson, std::FILE* out = stderr);

  void Log(LogLevel level, absl::string_view msg, std::initializer_list<LogField> fields = {});
  void Info(absl::string_view msg, std::initializer_list<LogField> fields = {}) {
    Log(LogLevel::kInfo, msg, fields);
  }
  void Warning(absl::string_view msg, std::initializer_list<LogField> fields = {}) {
    Log(LogLevel::kWarning, msg, fields);
  }
  void Error(absl::string_view msg, std::initializer_list<LogField> fields = {}) {
    Log(LogLevel::kError, msg, fields);
  }

  // A logger that discards everything (tests).
  static Logger* Null();

 private:
  LogFormat format_;
  std::FILE* out_;
  std::mutex mu_;
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_LOGGING_H_
