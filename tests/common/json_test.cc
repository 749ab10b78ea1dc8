#include "fp4q/common/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::common {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;

TEST(JsonTest, ParsesNestedDocument) {
  auto v = ParseJson(
      R"( {"a": [1, -2, 3.5e2, true, false, null], "b": {"c": "x\"y\\z\n\u00e9\ud83d\ude00"}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  ASSERT_EQ(v->members().size(), 2u);
  EXPECT_EQ(v->members()[0].first, "a");  // document order kept
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 6u);
  EXPECT_EQ(*a->items()[0].AsInt64(), 1);
  EXPECT_EQ(*a->items()[1].AsInt64(), -2);
  EXPECT_EQ(*a->items()[2].AsDouble(), 350.0);
  EXPECT_TRUE(a->items()[3].is_bool() && a->items()[3].bool_value());
  EXPECT_TRUE(a->items()[4].is_bool() && !a->items()[4].bool_value());
  EXPECT_TRUE(a->items()[5].is_null());
  const JsonValue* c = v->Find("b")->Find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->text(), "x\"y\\z\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, IntegersAreExact) {
  auto big = ParseJson("18446744073709551615");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(*big->AsUint64(), 18446744073709551615ull);
  EXPECT_THAT(big->AsInt64(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("18446744073709551615 is out of the int64")));
  auto over = ParseJson("18446744073709551616");
  ASSERT_TRUE(over.ok());
  EXPECT_THAT(over->AsUint64(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of the 64-bit range")));
  auto min = ParseJson("-9223372036854775808");
  ASSERT_TRUE(min.ok());
  EXPECT_EQ(*min->AsInt64(), INT64_MIN);
  EXPECT_THAT(ParseJson("-3")->AsUint64(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-3 is negative")));
  EXPECT_THAT(ParseJson("2.5")->AsInt64(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2.5 is not an integer")));
  EXPECT_THAT(ParseJson("1e3")->AsInt64(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1e3 is not an integer")));
  EXPECT_THAT(ParseJson("\"7\"")->AsInt64(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got string")));
  EXPECT_THAT(ParseJson("1e999")->AsDouble(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of the double range")));
}

struct BadCase {
  const char* text;
  const char* message;
};

class JsonMalformedTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(JsonMalformedTest, Rejected) {
  EXPECT_THAT(ParseJson(GetParam().text),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, JsonMalformedTest,
    ::testing::Values(
        BadCase{"", "offset 0: unexpected end of input"},
        BadCase{"{", "offset 1: expected a string key"},
        BadCase{"{\"a\" 1}", "offset 5: expected ':'"},
        BadCase{"{\"a\":1,}", "offset 7: expected a string key"},
        BadCase{"[1 2]", "offset 3: expected ',' or ']'"},
        BadCase{"[1,", "unexpected end of input"},
        BadCase{"{\"a\":1} x", "offset 8: unexpected data after the JSON value"},
        BadCase{"{\"a\":1,\"a\":2}", "offset 7: duplicate key \"a\""},
        BadCase{"01", "leading zeros"}, BadCase{"-", "expected a digit"},
        BadCase{"1.", "expected a digit after '.'"},
        BadCase{"1e+", "expected a digit in the exponent"},
        BadCase{"tru", "unexpected character 't'"}, BadCase{"\"abc", "unterminated string"},
        BadCase{"\"a\tb\"", "control character in a string"},
        BadCase{"\"\\x\"", "unknown escape '\\x'"}, BadCase{"\"\\u12g4\"", "bad hex digit"},
        BadCase{"\"\\ud800\"", "high surrogate without a low surrogate"},
        BadCase{"\"\\udc00\"", "lone low surrogate"}, BadCase{"\"\xff\"", "invalid UTF-8"},
        BadCase{"\"\xc0\xaf\"", "invalid UTF-8"},        // overlong '/'
        BadCase{"\"\xed\xa0\x80\"", "invalid UTF-8"}));  // encoded surrogate

TEST(JsonTest, DepthLimit) {
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(ok).ok());
  std::string deep(kMaxJsonDepth + 1, '[');
  deep += std::string(kMaxJsonDepth + 1, ']');
  EXPECT_THAT(ParseJson(deep),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nesting deeper than 64")));
}

TEST(JsonTest, QuoteRoundTrips) {
  const std::string raw = std::string("a\"b\\c\n\x01\t") + "\xC3\xA9";
  const std::string quoted = JsonQuote(raw);
  EXPECT_EQ(quoted, "\"a\\\"b\\\\c\\n\\u0001\\t\xC3\xA9\"");
  auto back = ParseJson(quoted);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->text(), raw);
}

}  // namespace
}  // namespace fp4q::common
