// GoogleTest matchers for absl::Status / absl::StatusOr (Debian's Abseil ships none):
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x.cols: 40")));
//   EXPECT_THAT(status_or, IsOk());
#ifndef FP4Q_TESTS_TESTING_STATUS_MATCHERS_H_
#define FP4Q_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace fp4q::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Matches a Status (or StatusOr) with code `code` whose message matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = ::fp4q::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  if (s.code() != code) return false;
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::fp4q::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace fp4q::testing

#define FP4Q_ASSERT_OK(expr)                                           \
  do {                                                                 \
    const ::absl::Status fp4q_s_ = ::fp4q::testing::GetStatus((expr)); \
    ASSERT_TRUE(fp4q_s_.ok()) << #expr << ": " << fp4q_s_;             \
  } while (0)
#define FP4Q_EXPECT_OK(expr)                                           \
  do {                                                                 \
    const ::absl::Status fp4q_s_ = ::fp4q::testing::GetStatus((expr)); \
    EXPECT_TRUE(fp4q_s_.ok()) << #expr << ": " << fp4q_s_;             \
  } while (0)

#endif  // FP4Q_TESTS_TESTING_STATUS_MATCHERS_H_
