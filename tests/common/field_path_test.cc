// FieldPath spells the paths that messages name, built from parts only when asked.
#include "fp4q/common/field_path.h"

#include <string>
#include <type_traits>
#include <utility>

#include "gtest/gtest.h"

namespace fp4q {
namespace {

TEST(FieldPathTest, SpellsMembersAndIndices) {
  const FieldPath items("items");
  const FieldPath item = items.Index(3);
  const FieldPath update = item.Member("update");
  EXPECT_EQ(items.str(), "items");
  EXPECT_EQ(item.str(), "items[3]");
  EXPECT_EQ(update.str(), "items[3].update");
  EXPECT_EQ(update.Member("region").str(), "items[3].update.region");
  const FieldPath updates = update.Member("updates");
  EXPECT_EQ(updates.Index(12).str(), "items[3].update.updates[12]");
  EXPECT_EQ(items.Index(-1).str(), "items[-1]");
}

TEST(FieldPathTest, AnEmptyRootLeavesNoDot) {
  const FieldPath none("");
  EXPECT_EQ(none.str(), "");
  EXPECT_EQ(none.Member("update").str(), "update");
  const FieldPath same = none.Then("");
  EXPECT_EQ(same.Member("dequantized_out").str(), "dequantized_out");
}

TEST(FieldPathTest, ThenJoinsTextAsItIs) {
  const std::string prefix = "rank 2's ";
  const FieldPath rank(prefix);
  const FieldPath items = rank.Then("items");
  const FieldPath item = items.Index(0);
  EXPECT_EQ(item.Member("update").str(), "rank 2's items[0].update");
}

TEST(FieldPathTest, SpellsIntoABufferAsStrDoesAndCutsAtItsEnd) {
  const std::string prefix = "rank 2's ";
  const FieldPath rank(prefix);
  const FieldPath items = rank.Then("items");
  const FieldPath item = items.Index(12);
  const FieldPath out = item.Member("dequantized_out");
  const FieldPath region = out.Member("region");
  const FieldPath none("");
  const FieldPath update = none.Member("update");
  for (const FieldPath* p : {&region, &update, &item, &none}) {
    char buf[64];
    const size_t n = p->SpellTo(buf, sizeof(buf));
    EXPECT_EQ(std::string(buf, n), p->str());
  }
  char small[8] = "xxxxxxx";
  EXPECT_EQ(region.SpellTo(small, 5), region.str().size());  // the whole length
  EXPECT_EQ(std::string(small, 7), "rank xx");               // nothing past the cut
}

TEST(FieldPathTest, RootsFromEveryStringKind) {
  const std::string s = "out";
  const absl::string_view v = "x";
  EXPECT_EQ(FieldPath(s).str(), "out");
  EXPECT_EQ(FieldPath(v).str(), "x");
  const FieldPath options("options");
  EXPECT_EQ(options.Member("block").str(), "options.block");
}

// A path extended from a temporary would point at it once the statement ends: refused at
// compile time, as is a root from a temporary string.
template <typename T, typename = void>
struct CanExtend : std::false_type {};
template <typename T>
struct CanExtend<T, std::void_t<decltype(std::declval<T>().Member("x"))>> : std::true_type {};
static_assert(CanExtend<const FieldPath&>::value);
static_assert(!CanExtend<FieldPath&&>::value);
static_assert(std::is_constructible_v<FieldPath, const std::string&>);
static_assert(!std::is_constructible_v<FieldPath, std::string&&>);

}  // namespace
}  // namespace fp4q
