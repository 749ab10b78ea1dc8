#include "fp4q/examples/example_main.h"

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

#include "fp4q/client/client.h"
#include "fp4q/examples/cuda_runtime.h"
#include "fp4q/examples/report.h"
#include "fp4q/examples/transport.h"

namespace fp4q::examples {

int ExampleMain(int argc, char** argv, const ExampleSpec& spec) {
  const std::string program = argc > 0 ? argv[0] : spec.example;
  const std::vector<std::string> args(argv, argv + argc);
  absl::StatusOr<ExampleOptions> options =
      ParseExampleOptions(args, spec.defaults);
  if (!options.ok()) {
    std::cerr << program << ": " << options.status().message() << "\n(see "
              << program << " --help)\n";
    return kExitUsage;
  }
  if (options->help) {
    std::cout << ExampleUsage(program, spec.summary, spec.defaults);
    return kExitOk;
  }
  auto fail = [&](const absl::Status& s) {
    std::cerr << program << ": " << s.ToString() << "\n";
    return kExitError;
  };

  client::ClientOptions co;
  co.address = options->server;
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      client::Client::Connect(co);
  if (!client.ok()) return fail(client.status());

  std::unique_ptr<Problem> problem = spec.make_problem(options->seed);
  std::unique_ptr<Transport> transport;
  if (options->transport == TransportKind::kCudaIpc) {
    absl::StatusOr<std::unique_ptr<CudaRuntime>> cuda = CudaRuntime::Load();
    if (!cuda.ok()) {
      std::cerr << program
                << ": skipped: --transport cuda_ipc needs a CUDA device: "
                << cuda.status().message() << "\n";
      return kExitSkipped;
    }
    int64_t max_elements = 0;
    for (const TensorSpec& t : problem->tensors())
      max_elements = std::max(max_elements, t.size());
    absl::StatusOr<std::unique_ptr<Transport>> ipc =
        MakeCudaIpcTransport(**client, std::move(*cuda), max_elements);
    if (!ipc.ok()) return fail(ipc.status());
    transport = std::move(*ipc);
  } else {
    transport = MakeInlineTransport(**client);
  }

  ExperimentConfig config;
  config.example = spec.example;
  config.path = spec.path;
  config.steps = options->steps;
  config.lr = options->lr;
  config.seed = options->seed;
  std::cerr << program << ": " << problem->Describe() << ", " << config.steps
            << " steps, server " << options->server << "\n";
  absl::StatusOr<ExperimentResult> result =
      RunExperiment(**client, *transport, *problem, config, &std::cerr);
  if (!result.ok()) return fail(result.status());

  PrintTable(*result, std::cout);
  if (!options->csv_path.empty()) {
    absl::Status s = WriteCsv(*result, options->csv_path);
    if (!s.ok()) return fail(s);
  }
  if (!options->json_path.empty()) {
    absl::Status s = WriteJson(*result, options->json_path);
    if (!s.ok()) return fail(s);
  }
  return kExitOk;
}

}  // namespace fp4q::examples
