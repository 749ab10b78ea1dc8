// Validation of engine requests and their translation to kernels types. Every function answers
// INVALID_ARGUMENT naming the request field (as the proto spells it) and the offending value.
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
// "DTYPE_F32", or "unknown value 9".
std::string WireDTypeName(int dtype);

// 'name', quoted for messages.
std::string Quote(absl::string_view name);

// A non-null, 16-byte aligned placeholder that lets the kernels' validators check a request's
// shapes before its buffers exist; never read or written.
const uint8_t* ShapeProbe();
inline float* ShapeProbeFloat() {
  return reinterpret_cast<float*>(const_cast<uint8_t*>(ShapeProbe()));
}

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

// A dense F32/BF16 dtype number -> kernels::DType. `allow_unspecified` maps 0 to `dflt`.
absl::StatusOr<kernels::DType> DenseDType(int dtype, const FieldPath& field,
                                          bool allow_unspecified = false,
                                          kernels::DType dflt = kernels::DType::kF32);
int ToWireDType(kernels::DType dtype);

// A dense 2-D tensor's header: dtype F32/BF16, shape [rows, cols] with both >= 1, byte size
// without overflow, data present, and inline bytes of exactly the right size.
struct DenseShape {
  kernels::DType dtype = kernels::DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t bytes = 0;
};
absl::StatusOr<DenseShape> CheckDenseTensor(const TensorIn& t, const FieldPath& field);

// A [rows, cols] shape (rank 2, dims >= 1).
absl::Status CheckShape2D(const std::vector<int64_t>& shape, const FieldPath& field);

// QuantOptions -> kernels::QuantizeOptions (defaults filled in), then the kernels' own option
// validation with field names mapped ("options.<field>").
absl::StatusOr<kernels::QuantizeOptions> ToQuantizeOptions(const QuantOptionsIn& in,
                                                           absl::string_view field = "options");

// Format / block / layout of a quantized operand (0 = defaults as in QuantOptions).
absl::StatusOr<kernels::Format> ToFormat(int v, absl::string_view field);
absl::StatusOr<kernels::BlockShape> ToBlock(int v, kernels::Format format, absl::string_view field);
absl::StatusOr<kernels::ScaleLayout> ToLayout(int v, absl::string_view field);
int ToWireFormat(kernels::Format f);
int ToWireBlock(kernels::BlockShape b);
int ToWireLayout(kernels::ScaleLayout l);

// A kernels validation status re-labelled with request field names: the message's leading
// field `from` (e.g. "x") becomes `to` (e.g. "input"), and "from.rows" / "from.cols" become
// "to.shape[0]" / "to.shape[1]"; so do the paths below `from` that the message quotes later
// ("does not match a.cols 32": `from`. or `from`[ after a non-path byte). Non-INVALID_ARGUMENT
// statuses pass through unchanged. A stored weight's operand (`to` ending in ".weight_name") has
// no shape in the request: its dimensions read "to (the weight's rows)" / "(... columns)".
absl::Status RenameField(const absl::Status& status, absl::string_view from, absl::string_view to);


}  // namespace fp4q::server

#endif  // FP4Q_SERVER_REQUEST_CHECKS_H_
