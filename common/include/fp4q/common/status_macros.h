// Status propagation macros. Debian's Abseil (20220623) predates absl's own, so we keep two
// small ones. Both work in functions returning absl::Status or absl::StatusOr<T>.
#ifndef FP4Q_COMMON_STATUS_MACROS_H_
#define FP4Q_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FP4Q_CONCAT_INNER_(a, b) a##b
#define FP4Q_CONCAT_(a, b) FP4Q_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define FP4Q_RETURN_IF_ERROR(expr)                               \
  do {                                                           \
    ::absl::Status fp4q_status_ = (expr);                        \
    if (!fp4q_status_.ok()) return fp4q_status_;                 \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status if not OK.
#define FP4Q_ASSIGN_OR_RETURN(lhs, rexpr) \
  FP4Q_ASSIGN_OR_RETURN_IMPL_(FP4Q_CONCAT_(fp4q_statusor_, __LINE__), lhs, rexpr)

#define FP4Q_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // FP4Q_COMMON_STATUS_MACROS_H_
