// Output of the examples: the table, the expected-shape checks, the loss curves
// as CSV and the results as JSON.
//
// - CSV: header "step,fp32,rtn,sr,rtn_ef,sr_ef", then one row per step
// 0..steps; losses
//   printed with 9 significant digits.
// - JSON: one object (see WriteJson); doubles printed with 17 significant
// digits so that two
//   runs can be compared bit for bit; a fraction that does not apply (fp32
//   moved) is null.
// - Files are written to PATH.tmp and renamed over PATH; errors are the path
// and strerror as
//   an INTERNAL / NOT_FOUND / PERMISSION_DENIED status (from errno).
#ifndef FP4Q_EXAMPLES_REPORT_H_
#define FP4Q_EXAMPLES_REPORT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fp4q/examples/experiment.h"

namespace fp4q::examples {

// The shape the published experiment has (docs/TRAINING.md), as checks on one
// result, in this order. Asserted by the CI test on the short demo: RTN final
// >= 0.9 x RTN start; SR, RTN+EF and SR+EF final <= 0.5 x RTN final; EF
// (RTN+EF, error feedback with round-to-nearest) final <= 1.1 x SR final; fp32
// final below every other final. Reported only: SR+EF final <= 1.1 x SR final.
struct ShapeCheck {
  std::string text;  // e.g. "SR final <= 0.5 x RTN final"
  double lhs = 0;    // the two sides compared
  double rhs = 0;
  bool passed = false;
  bool asserted = true;  // part of what CI asserts
};
std::vector<ShapeCheck> ExpectedShapeChecks(const ExperimentResult& result);

void PrintTable(const ExperimentResult& result, std::ostream& out);

std::string CsvText(const ExperimentResult& result);
std::string JsonText(const ExperimentResult& result);

absl::Status WriteCsv(const ExperimentResult& result, const std::string& path);
absl::Status WriteJson(const ExperimentResult& result, const std::string& path);

}  // namespace fp4q::examples

#endif  // FP4Q_EXAMPLES_REPORT_H_
