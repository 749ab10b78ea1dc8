// Validation of engine requests (their enums are kernels types already, converted at the edge,
// see proto_convert.h). Every function answers INVALID_ARGUMENT naming the request field (as the
// proto spells it) and the offending value.
#ifndef FP4Q_SERVER_REQUEST_CHECKS_H_
#define FP4Q_SERVER_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fp4q/kernels/types.h"
#include "server/requests.h"

namespace fp4q::server {

inline constexpr size_t kMaxNameBytes = 256;

// "[4, 32]".
std::string ShapeString(const std::vector<int64_t>& shape);
// The proto's name of a dense dtype, for messages: "DTYPE_F32", "DTYPE_BF16".
const char* DTypeFieldName(kernels::DType dtype);

// 'name', quoted for messages.
std::string Quote(absl::string_view name);

// A state tensor name: 1..256 bytes of [A-Za-z0-9._:/-].
absl::Status CheckName(absl::string_view name, const FieldPath& field);

// A job namespace: 0..64 bytes of the name characters (empty: the default namespace).
inline constexpr size_t kMaxNamespaceBytes = 64;
absl::Status CheckNamespace(absl::string_view ns, const FieldPath& field);
// The store's key of `name` in namespace `ns`: "ns|name" ('|' is in neither), or `name` alone in
// the default namespace.
inline constexpr char kNamespaceSeparator = '|';
std::string QualifiedName(absl::string_view ns, absl::string_view name);
// The parts of a store key.
absl::string_view NamespaceOf(absl::string_view key);
absl::string_view LocalName(absl::string_view key);

// A dense 2-D tensor's header: shape [rows, cols] with both >= 1, byte size without overflow,
// data present, and inline bytes of exactly the right size (its dtype is F32 or BF16: the edge
// refuses others).
struct DenseShape {
  kernels::DType dtype = kernels::DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t bytes = 0;
};
absl::StatusOr<DenseShape> CheckDenseTensor(const TensorIn& t, const FieldPath& field);

// A [rows, cols] shape (rank 2, dims >= 1).
absl::Status CheckShape2D(const std::vector<int64_t>& shape, const FieldPath& field);

// A request's quantization options (fp4q.v1.QuantOptions, converted at the edge): the kernels'
// option rules with messages below `field`, and error feedback (residual_key) row-wise only,
// without RHT.
absl::Status CheckQuantOptions(const QuantOptionsIn& in, absl::string_view field = "options");
// The first of those rules alone: with a residual_key, outputs must be OUTPUTS_ROWWISE.
absl::Status CheckErrorFeedbackOutputs(const QuantOptionsIn& in,
                                       absl::string_view field = "options");

// The sizes of a quantized output [rows, cols] in `o`'s format, block and scale layout (its
// buffers unset); an overflow of the byte counts is refused naming `field`.
absl::StatusOr<kernels::QuantizedTensor> QuantizedOutput(const kernels::QuantizeOptions& o,
                                                         int64_t rows, int64_t cols,
                                                         absl::string_view field);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_REQUEST_CHECKS_H_
