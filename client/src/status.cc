// grpc::Status -> absl::Status: the one place the two meet (STYLE.md "Errors").
#include <grpcpp/support/status.h>

#include "fp4q/client/client.h"

namespace fp4q::client {
namespace {

// The two enums number the canonical codes identically; spelled out so that a mismatch would
// be a compile-visible edit rather than a silent cast.
absl::StatusCode ToAbslCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return absl::StatusCode::kOk;
    case grpc::StatusCode::CANCELLED: return absl::StatusCode::kCancelled;
    case grpc::StatusCode::UNKNOWN: return absl::StatusCode::kUnknown;
    case grpc::StatusCode::INVALID_ARGUMENT: return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND: return absl::StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS: return absl::StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED: return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION: return absl::StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED: return absl::StatusCode::kAborted;
    case grpc::StatusCode::OUT_OF_RANGE: return absl::StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED: return absl::StatusCode::kUnimplemented;
    case grpc::StatusCode::INTERNAL: return absl::StatusCode::kInternal;
    case grpc::StatusCode::UNAVAILABLE: return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DATA_LOSS: return absl::StatusCode::kDataLoss;
    case grpc::StatusCode::UNAUTHENTICATED: return absl::StatusCode::kUnauthenticated;
    default: return absl::StatusCode::kUnknown;
  }
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const absl::StatusCode code = ToAbslCode(status.error_code());
  if (code == absl::StatusCode::kUnknown &&
      status.error_code() != grpc::StatusCode::UNKNOWN) {
    return absl::UnknownError("gRPC status code " +
                              std::to_string(static_cast<int>(status.error_code())) + ": " +
                              status.error_message());
  }
  return absl::Status(code, status.error_message());
}

}  // namespace fp4q::client
