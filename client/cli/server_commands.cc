// fp4q health | info | list | checkpoint.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "args.h"
#include "commands.h"
#include "fp4q/client/tensors.h"
#include "progress.h"

namespace fp4q::client::cli {
namespace {

// Parses a command that takes no arguments beyond --help. Returns -1 to go on, else an exit
// code.
int ParseNoArgs(const std::string& name, const char* usage, const CommandContext& context) {
  absl::StatusOr<ParsedArgs> args = ParseArgs(context.args, 0, ArgSpec{});
  if (!args.ok()) return UsageFailure(name, std::string(args.status().message()));
  if (args->help) {
    std::fputs(usage, stdout);
    return kExitOk;
  }
  if (!args->positional.empty()) {
    return UsageFailure(name, absl::StrCat("unexpected argument '", args->positional[0], "'"));
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const CommandContext& context) {
  return Client::Connect(context.client);
}

constexpr char kHealthUsage[] =
    "Usage: fp4q [--server ADDR] health\n"
    "\n"
    "Checks the server's grpc.health.v1 services \"liveness\" and \"readiness\" and prints\n"
    "each status. Exit code 0 when both are SERVING, 1 otherwise (or on an RPC error).\n";

int RunHealth(const CommandContext& context) {
  if (int rc = ParseNoArgs("health", kHealthUsage, context); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(context);
  if (!client.ok()) return UsageFailure("health", std::string(client.status().message()));
  std::vector<std::string> bad;
  for (const char* service : {kLivenessService, kReadinessService}) {
    absl::StatusOr<ServingStatus> status = (*client)->CheckHealth(service);
    if (!status.ok()) return Failure("health", status.status());
    std::printf("%-10s %s\n", service, ServingStatusName(*status));
    if (*status != ServingStatus::kServing) {
      bad.push_back(absl::StrCat(service, " is ", ServingStatusName(*status)));
    }
  }
  std::fflush(stdout);
  if (!bad.empty()) {
    std::fprintf(stderr, "fp4q health: not healthy: %s\n", absl::StrJoin(bad, ", ").c_str());
    return kExitError;
  }
  return kExitOk;
}

constexpr char kInfoUsage[] =
    "Usage: fp4q [--server ADDR] info\n"
    "\n"
    "Prints the server's version, backend, GPUs (UUID, name, compute capability, memory),\n"
    "supported modes, limits and epoch (ServerInfo).\n";

int RunInfo(const CommandContext& context) {
  if (int rc = ParseNoArgs("info", kInfoUsage, context); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(context);
  if (!client.ok()) return UsageFailure("info", std::string(client.status().message()));
  absl::StatusOr<v1::ServerInfoReply> info = (*client)->ServerInfo();
  if (!info.ok()) return Failure("info", info.status());
  const v1::Limits& l = info->limits();
  std::printf("server           %s\n", context.client.address.c_str());
  std::printf("version          %s\n", info->version().c_str());
  std::printf("backend          %s\n", info->backend().c_str());
  std::printf("server epoch     %llu\n", static_cast<unsigned long long>(info->server_epoch()));
  std::printf("supported modes  %s\n",
              info->supported_modes().empty()
                  ? "(none)"
                  : absl::StrJoin(info->supported_modes(), ", ").c_str());
  std::printf("limits\n");
  std::printf("  max message        %s (%llu bytes)\n", HumanBytes(l.max_message_bytes()).c_str(),
              static_cast<unsigned long long>(l.max_message_bytes()));
  std::printf("  state budget       %s (%llu bytes)\n", HumanBytes(l.state_budget_bytes()).c_str(),
              static_cast<unsigned long long>(l.state_budget_bytes()));
  std::printf("  max queue depth    %u\n", l.max_queue_depth());
  std::printf("  max open handles   %u\n", l.max_open_handles());
  std::printf("  session lease      %u s\n", l.session_lease_seconds());
  if (info->gpus().empty()) {
    std::printf("gpus             (none)\n");
  } else {
    std::printf("gpus             %d\n", info->gpus_size());
    for (const v1::GpuInfo& g : info->gpus()) {
      std::printf("  %s  %s  cc %d.%d  memory %s  state %s\n", g.uuid().c_str(),
                  g.name().c_str(), g.cc_major(), g.cc_minor(),
                  HumanBytes(g.total_memory()).c_str(), HumanBytes(g.state_bytes()).c_str());
    }
  }
  return kExitOk;
}

constexpr char kListUsage[] =
    "Usage: fp4q [--server ADDR] list\n"
    "\n"
    "Lists the server's named state (ListTensors): name, kind, shape, stored dtype, bytes,\n"
    "device and last step, one tensor per line.\n";

std::string KindName(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_KIND_WEIGHT: return "weight";
    case v1::TENSOR_KIND_RESIDUAL: return "residual";
    default: return "?";
  }
}

int RunList(const CommandContext& context) {
  if (int rc = ParseNoArgs("list", kListUsage, context); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(context);
  if (!client.ok()) return UsageFailure("list", std::string(client.status().message()));
  absl::StatusOr<v1::ListTensorsReply> list = (*client)->ListTensors();
  if (!list.ok()) return Failure("list", list.status());
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NAME", "KIND", "SHAPE", "DTYPE", "BYTES", "DEVICE", "LAST_STEP"});
  for (const v1::TensorListing& t : list->tensors()) {
    rows.push_back({t.name(), KindName(t.kind()),
                    ShapeString(std::vector<int64_t>(t.shape().begin(), t.shape().end())),
                    DTypeName(t.dtype()), absl::StrCat(t.bytes()),
                    t.device_uuid().empty() ? "-" : t.device_uuid(),
                    absl::StrCat(t.last_step())});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      const bool last = i + 1 == r.size();
      line += last ? r[i] : absl::StrFormat("%-*s  ", static_cast<int>(width[i]), r[i]);
    }
    std::printf("%s\n", line.c_str());
  }
  if (list->tensors().empty()) std::printf("(no tensors)\n");
  return kExitOk;
}

constexpr char kCheckpointUsage[] =
    "Usage: fp4q [--server ADDR] checkpoint\n"
    "\n"
    "Asks the server to write all its state to its state directory now (Checkpoint) and\n"
    "prints the file, its size and the number of tensors.\n";

int RunCheckpoint(const CommandContext& context) {
  if (int rc = ParseNoArgs("checkpoint", kCheckpointUsage, context); rc >= 0) return rc;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(context);
  if (!client.ok()) return UsageFailure("checkpoint", std::string(client.status().message()));
  absl::StatusOr<v1::CheckpointReply> reply = (*client)->Checkpoint();
  if (!reply.ok()) return Failure("checkpoint", reply.status());
  std::printf("checkpoint %s: %llu bytes, %u tensors\n", reply->path().c_str(),
              static_cast<unsigned long long>(reply->bytes()), reply->tensors());
  return kExitOk;
}

}  // namespace

int RunQuantize(const CommandContext& context);    // file_commands.cc
int RunDequantize(const CommandContext& context);  // file_commands.cc
int RunBench(const CommandContext& context);       // bench_command.cc
int RunBenchIpc(const CommandContext& context);    // bench_ipc_command.cc
int RunBenchStep(const CommandContext& context);   // bench_step_command.cc

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"health", "liveness and readiness of the server", RunHealth},
      {"info", "server version, backend, GPUs, modes and limits", RunInfo},
      {"list", "the server's named tensors (weights, residuals)", RunList},
      {"checkpoint", "write the server's state to its state directory now", RunCheckpoint},
      {"quantize", "quantize a safetensors file to NVFP4 (T, T_scale, T_scale_2)", RunQuantize},
      {"dequantize", "dequantize a file written by `fp4q quantize`", RunDequantize},
      {"bench", "load generator: concurrent clients, mixed RPCs, latency percentiles", RunBench},
      {"bench-ipc", "latency of a big Quantize by CUDA IPC (needs a GPU here)", RunBenchIpc},
      {"bench-step", "the trainer's step of a whole model by CUDA IPC (needs a GPU here)",
       RunBenchStep},
  };
  return commands;
}

int UsageFailure(const std::string& command, const std::string& message) {
  const std::string who = command.empty() ? "fp4q" : absl::StrCat("fp4q ", command);
  std::fprintf(stderr, "%s: %s\nTry '%s --help'.\n", who.c_str(), message.c_str(), who.c_str());
  return kExitUsage;
}

int Failure(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "fp4q %s: %s: %s\n", command.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return kExitError;
}

}  // namespace fp4q::client::cli
