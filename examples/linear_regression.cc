// Example 1: linear regression with its weight stored on the server in NVFP4
// and updated in place (CreateWeight, then UpdateWeight with the client's
// gradient), in five variants.
#include "fp4q/examples/example_main.h"

int main(int argc, char** argv) {
  fp4q::examples::ExampleSpec spec;
  spec.example = "linear";
  spec.summary =
      "Example 1: linear regression y = W* x (256 -> 64), the weight held by "
      "fp4qd as a 4-bit\n"
      "NVFP4 tensor and updated with UpdateWeight; the client computes each "
      "gradient from the\n"
      "dequantized weight the update returns.";
  spec.path = fp4q::examples::UpdatePath::kStoredWeight;
  spec.defaults = {500, 0.02};
  spec.make_problem = fp4q::examples::MakeLinearProblem;
  return fp4q::examples::ExampleMain(argc, argv, spec);
}
