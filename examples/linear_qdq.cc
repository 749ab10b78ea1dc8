// Example 3: the linear regression of example 1 with a client-held weight,
// quantized through Qdq each step; error feedback keeps its residual on the
// server under a residual key: W = ErrorFeedback.qdq(name, W - lr * grad,
// step).
#include "fp4q/examples/example_main.h"

int main(int argc, char** argv) {
  fp4q::examples::ExampleSpec spec;
  spec.example = "linear_qdq";
  spec.summary =
      "Example 3: the linear regression of example 1 with the weight held by "
      "the client:\n"
      "W <- Qdq(W - lr * g, step), error feedback through a server-held "
      "residual key. Same\n"
      "arithmetic as example 1, so the same seed gives the same numbers.";
  spec.path = fp4q::examples::UpdatePath::kQdq;
  spec.defaults = {500, 0.02};
  spec.make_problem = fp4q::examples::MakeLinearProblem;
  return fp4q::examples::ExampleMain(argc, argv, spec);
}
