// Command-line parsing for the fp4q CLI: "--name value", "--name=value", boolean "--name",
// positional arguments, and "--" ending the options. Every mistake is an INVALID_ARGUMENT status
// that the caller reports as a usage error (exit 2).
#ifndef FP4Q_CLIENT_CLI_ARGS_H_
#define FP4Q_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fp4q::client::cli {

// Exit codes (docs/DESIGN.md "CLI").
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // RPC or I/O error; the message is printed
inline constexpr int kExitUsage = 2;

struct ParsedArgs {
  std::map<std::string, std::string> values;  // options given a value
  std::map<std::string, std::vector<std::string>> lists;  // repeatable options, in order
  std::set<std::string> flags;                // boolean options given
  std::vector<std::string> positional;
  bool help = false;                          // -h / --help
};

// The options a command accepts: `valued` take a value, `boolean` do not.
struct ArgSpec {
  std::set<std::string> valued;
  std::set<std::string> boolean;
  // Options that take a value and may be given any number of times (ParsedArgs::lists).
  std::set<std::string> repeated;
  // Stop at the first positional argument and leave it and everything after in `positional`
  // unparsed (for the global options before a command).
  bool stop_at_positional = false;
};

// Parses args[begin..]. INVALID_ARGUMENT for an unknown option, a missing value, a value given
// to a boolean option, or a non-repeatable option given twice.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args, size_t begin,
                                     const ArgSpec& spec);

// Typed accessors; `fallback` when the option is absent. INVALID_ARGUMENT (a usage error)
// naming the option for a malformed value.
absl::StatusOr<uint64_t> GetUint64(const ParsedArgs& args, const std::string& name,
                                   uint64_t fallback);
absl::StatusOr<double> GetDouble(const ParsedArgs& args, const std::string& name,
                                 double fallback);
std::string GetString(const ParsedArgs& args, const std::string& name,
                      const std::string& fallback);
// One of `choices` (the message lists them).
absl::StatusOr<std::string> GetChoice(const ParsedArgs& args, const std::string& name,
                                      const std::vector<std::string>& choices,
                                      const std::string& fallback);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_ARGS_H_
