// Example 2: a two-layer MLP with both weights stored on the server in NVFP4,
// in five variants.
#include "fp4q/examples/example_main.h"

int main(int argc, char** argv) {
  fp4q::examples::ExampleSpec spec;
  spec.example = "mlp";
  spec.summary =
      "Example 2: a two-layer MLP y = W2 softsign(W1 x) (128 -> 64 -> 16) on a "
      "teacher/student\n"
      "task; both weights held by fp4qd as 4-bit NVFP4 tensors and updated "
      "with UpdateWeight.";
  spec.path = fp4q::examples::UpdatePath::kStoredWeight;
  spec.defaults = {500, 0.1};
  spec.make_problem = fp4q::examples::MakeMlpProblem;
  return fp4q::examples::ExampleMain(argc, argv, spec);
}
