// fp4q: the command-line client of fp4qd.
//   fp4q [GLOBAL OPTIONS] COMMAND [ARGS]; `fp4q --help`, `fp4q COMMAND --help`.
// Exit codes: 0 success, 1 RPC or I/O error (message printed), 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "args.h"
#include "commands.h"

namespace fp4q::client::cli {
namespace {

constexpr char kUsageHead[] =
    "Usage: fp4q [GLOBAL OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "Command-line client of fp4qd, the NVFP4 training-numerics server.\n"
    "\n"
    "Global options:\n"
    "  --server ADDR             server address, host:port or unix:PATH\n"
    "                            (default $FP4Q_SERVER, else 127.0.0.1:50051)\n"
    "  --timeout SECONDS         deadline of each RPC (default 300)\n"
    "  --max-message-bytes N     gRPC send/receive limit (default 536870912)\n"
    "  --tls                     use TLS (system roots unless --tls-ca)\n"
    "  --tls-ca FILE             PEM CA bundle (implies --tls)\n"
    "  --tls-cert FILE           PEM client certificate for mutual TLS (with --tls-key)\n"
    "  --tls-key FILE            PEM client private key (with --tls-cert)\n"
    "  --tls-server-name NAME    expected server name in its certificate\n"
    "  --token-file FILE         bearer token sent as \"authorization: Bearer ...\"\n"
    "                            (default: $FP4Q_TOKEN when set)\n"
    "  -h, --help                this help; COMMAND --help for a command's\n"
    "\n"
    "Commands:\n";

constexpr char kUsageTail[] =
    "\n"
    "Exit codes: 0 success, 1 RPC or I/O error (message printed), 2 bad usage.\n";

void PrintUsage() {
  std::fputs(kUsageHead, stdout);
  for (const Command& c : Commands()) std::printf("  %-12s %s\n", c.name, c.summary);
  std::fputs(kUsageTail, stdout);
}

bool ReadWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return !in.bad();
}

// Fills `options` from the global flags and the environment; "" on success, else the usage
// error.
std::string GlobalOptions(const ParsedArgs& args, ClientOptions* options) {
  const char* env_server = std::getenv("FP4Q_SERVER");
  options->address = GetString(args, "server",
                               env_server != nullptr && *env_server != '\0'
                                   ? env_server
                                   : "127.0.0.1:50051");
  absl::StatusOr<double> timeout = GetDouble(args, "timeout", 300.0);
  if (!timeout.ok()) return std::string(timeout.status().message());
  if (!(*timeout > 0.0) || *timeout > 1e9) {
    return absl::StrCat("option '--timeout' must be a positive number of seconds, got ",
                        GetString(args, "timeout", ""));
  }
  options->deadline = absl::Seconds(*timeout);
  absl::StatusOr<uint64_t> max_message =
      GetUint64(args, "max-message-bytes", static_cast<uint64_t>(options->max_message_bytes));
  if (!max_message.ok()) return std::string(max_message.status().message());
  if (*max_message < 1 || *max_message > 2147483647u) {
    return absl::StrCat("option '--max-message-bytes' must be in [1, 2147483647], got ",
                        *max_message);
  }
  options->max_message_bytes = static_cast<int64_t>(*max_message);

  const bool tls = args.flags.count("tls") != 0 || args.values.count("tls-ca") != 0 ||
                   args.values.count("tls-cert") != 0 || args.values.count("tls-key") != 0 ||
                   args.values.count("tls-server-name") != 0;
  if (tls) {
    TlsOptions t;
    struct {
      const char* flag;
      std::string* field;
    } files[] = {{"tls-ca", &t.root_certs_pem},
                 {"tls-cert", &t.client_cert_pem},
                 {"tls-key", &t.client_key_pem}};
    for (const auto& f : files) {
      const std::string path = GetString(args, f.flag, "");
      if (path.empty()) continue;
      if (!ReadWholeFile(path, f.field) || f.field->empty()) {
        return absl::StrCat("option '--", f.flag, "': cannot read '", path, "'");
      }
    }
    if (t.client_cert_pem.empty() != t.client_key_pem.empty()) {
      return "options '--tls-cert' and '--tls-key' go together";
    }
    t.target_name_override = GetString(args, "tls-server-name", "");
    options->tls = t;
  }
  const std::string token_file = GetString(args, "token-file", "");
  if (!token_file.empty()) {
    std::string token;
    if (!ReadWholeFile(token_file, &token)) {
      return absl::StrCat("option '--token-file': cannot read '", token_file, "'");
    }
    options->bearer_token = std::string(absl::StripAsciiWhitespace(token));
    if (options->bearer_token.empty()) {
      return absl::StrCat("option '--token-file': '", token_file, "' holds no token");
    }
  } else if (const char* env_token = std::getenv("FP4Q_TOKEN");
             env_token != nullptr && *env_token != '\0') {
    options->bearer_token = env_token;
  }
  return "";
}

int Main(int argc, char** argv) {
  std::vector<std::string> words(argv, argv + argc);
  ArgSpec spec;
  spec.valued = {"server",  "timeout",  "max-message-bytes", "tls-ca",
                 "tls-cert", "tls-key", "tls-server-name",   "token-file"};
  spec.boolean = {"tls"};
  spec.stop_at_positional = true;
  absl::StatusOr<ParsedArgs> args = ParseArgs(words, 1, spec);
  if (!args.ok()) return UsageFailure("", std::string(args.status().message()));
  if (args->help) {
    PrintUsage();
    return kExitOk;
  }
  if (args->positional.empty()) return UsageFailure("", "missing COMMAND");
  CommandContext context;
  const std::string error = GlobalOptions(*args, &context.client);
  if (!error.empty()) return UsageFailure("", error);
  const std::string name = args->positional[0];
  context.args.assign(args->positional.begin() + 1, args->positional.end());
  for (const Command& c : Commands()) {
    if (name == c.name) return c.run(context);
  }
  return UsageFailure("", absl::StrCat("unknown command '", name, "'"));
}

}  // namespace
}  // namespace fp4q::client::cli

int main(int argc, char** argv) { return fp4q::client::cli::Main(argc, argv); }
