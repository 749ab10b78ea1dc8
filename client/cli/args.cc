#include "args.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fp4q::client::cli {

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args, size_t begin,
                                     const ArgSpec& spec) {
  ParsedArgs out;
  bool options_done = false;
  for (size_t i = begin; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_done || arg.size() < 2 || arg[0] != '-' || arg == "-") {
      if (spec.stop_at_positional) {
        out.positional.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
        return out;
      }
      out.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (spec.boolean.count(name) != 0) {
      if (has_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("option '--", name, "' takes no value (got '", value, "')"));
      }
      if (!out.flags.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("option '--", name, "' given twice"));
      }
      continue;
    }
    const bool repeated = spec.repeated.count(name) != 0;
    if (spec.valued.count(name) == 0 && !repeated) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '--", name, "'"));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("option '--", name, "' needs a value"));
      }
      value = args[++i];
    }
    if (repeated) {
      out.lists[name].push_back(value);
      continue;
    }
    if (!out.values.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("option '--", name, "' given twice"));
    }
  }
  return out;
}

absl::StatusOr<uint64_t> GetUint64(const ParsedArgs& args, const std::string& name,
                                   uint64_t fallback) {
  auto it = args.values.find(name);
  if (it == args.values.end()) return fallback;
  uint64_t v = 0;
  // SimpleAtoi accepts a leading '-' for unsigned types only as an error; reject '+' too.
  if (it->second.empty() || it->second[0] == '+' || it->second[0] == '-' ||
      !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option '--", name, "' wants an unsigned integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const ParsedArgs& args, const std::string& name,
                                 double fallback) {
  auto it = args.values.find(name);
  if (it == args.values.end()) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("option '--", name, "' wants a number, got '", it->second, "'"));
  }
  return v;
}

std::string GetString(const ParsedArgs& args, const std::string& name,
                      const std::string& fallback) {
  auto it = args.values.find(name);
  return it == args.values.end() ? fallback : it->second;
}

absl::StatusOr<std::string> GetChoice(const ParsedArgs& args, const std::string& name,
                                      const std::vector<std::string>& choices,
                                      const std::string& fallback) {
  auto it = args.values.find(name);
  if (it == args.values.end()) return fallback;
  for (const std::string& c : choices) {
    if (c == it->second) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("option '--", name, "' must be one of ",
                                                 absl::StrJoin(choices, ", "), "; got '",
                                                 it->second, "'"));
}

}  // namespace fp4q::client::cli
