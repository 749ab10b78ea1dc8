// The fp4q CLI's commands. Each takes the words after its name and the client options the
// global flags produced, prints its own --help, and returns the process exit code (args.h).
#ifndef FP4Q_CLIENT_CLI_COMMANDS_H_
#define FP4Q_CLIENT_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "fp4q/client/client.h"

namespace fp4q::client::cli {

struct CommandContext {
  std::vector<std::string> args;  // after the command name
  ClientOptions client;           // from the global options
};

struct Command {
  const char* name;
  const char* summary;  // one line for `fp4q --help`
  int (*run)(const CommandContext& context);
};

// health, info, list, checkpoint, quantize, dequantize, bench.
const std::vector<Command>& Commands();

// Prints "fp4q <command>: <message>" and a hint to --help on stderr; returns kExitUsage.
int UsageFailure(const std::string& command, const std::string& message);
// Prints "fp4q <command>: <CODE>: <message>" on stderr; returns kExitError.
int Failure(const std::string& command, const absl::Status& status);

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_COMMANDS_H_
