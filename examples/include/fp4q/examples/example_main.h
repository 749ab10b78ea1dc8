// The main() of every example program: options, connection, transport, the
// experiment, the table and the files. Exit codes: options.h.
#ifndef FP4Q_EXAMPLES_EXAMPLE_MAIN_H_
#define FP4Q_EXAMPLES_EXAMPLE_MAIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fp4q/examples/experiment.h"
#include "fp4q/examples/options.h"
#include "fp4q/examples/problems.h"

namespace fp4q::examples {

struct ExampleSpec {
  std::string example;  // "linear", "mlp", "linear_qdq"
  std::string summary;  // first paragraph of --help
  UpdatePath path = UpdatePath::kStoredWeight;
  ExampleDefaults defaults;
  std::function<std::unique_ptr<Problem>(uint64_t seed)> make_problem;
};

int ExampleMain(int argc, char** argv, const ExampleSpec& spec);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_EXAMPLE_MAIN_H_
