// FieldPath: the path of a request field ("items[3].update.region") as messages spell it, kept
// as a chain of parts and written out only when a message needs it. Validation on the success
// path then builds no strings: a trainer's step validates every item's fields several times, and
// spelling each path with StrCat cost more host time than the step's kernel launches.
//
// A FieldPath refers to its parent and to the text of its parts without owning them, like
// absl::string_view: it must not outlive either. Pass paths down as `const FieldPath&`, extend
// them with Member/Index into locals or arguments, and keep `str()` where the path must outlive
// the call. A temporary std::string cannot make one (that would dangle).
#ifndef FP4Q_COMMON_FIELD_PATH_H_
#define FP4Q_COMMON_FIELD_PATH_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fp4q {

class FieldPath {
 public:
  // A root ("x", "items", "rank 2's items[0].update"); "" renders nothing, so that a child
  // Member spells its name alone ("update", not ".update").
  FieldPath(const char* root) : text_(root) {}             // NOLINT(google-explicit-constructor)
  FieldPath(absl::string_view root) : text_(root) {}       // NOLINT(google-explicit-constructor)
  FieldPath(const std::string& root) : text_(root) {}      // NOLINT(google-explicit-constructor)
  FieldPath(std::string&&) = delete;                       // it would dangle

  // "<this>.<name>" (or "<name>" under an empty root).
  FieldPath Member(absl::string_view name) const& { return FieldPath(this, name, kMember); }
  // "<this>[<index>]".
  FieldPath Index(int64_t index) const& { return FieldPath(this, index); }
  // "<this><text>", joined as it is ("rank 2's " then "items").
  FieldPath Then(absl::string_view text) const& { return FieldPath(this, text, kRoot); }
  // The same path naming its two dimensions "<path><rows>" and "<path><cols>" (default
  // ".rows" / ".cols"): Shaped() for a request tensor whose shape is a list ("input.shape[0]"),
  // Dims(" (the weight's rows)", " (the weight's columns)") for an argument with no shape of
  // its own in the request.
  FieldPath Dims(absl::string_view rows, absl::string_view cols) const& {
    FieldPath d(this, "", kRoot);
    d.rows_ = rows;
    d.cols_ = cols;
    return d;
  }
  FieldPath Shaped() const& { return Dims(".shape[0]", ".shape[1]"); }
  std::string Rows() const { return str().append(rows_.data(), rows_.size()); }
  std::string Cols() const { return str().append(cols_.data(), cols_.size()); }
  // Extending a temporary would leave the result pointing at it: name the parent first.
  FieldPath Member(absl::string_view) const&& = delete;
  FieldPath Index(int64_t) const&& = delete;
  FieldPath Then(absl::string_view) const&& = delete;
  FieldPath Dims(absl::string_view, absl::string_view) const&& = delete;
  FieldPath Shaped() const&& = delete;

  std::string str() const {
    std::string out(SpellTo(nullptr, 0), '\0');
    SpellTo(out.data(), out.size());
    return out;
  }
  // Writes the path as str() spells it into out[0, cap) (cut at cap) and returns its whole
  // length: a caller that keeps the path in a buffer of its own spells it without allocating.
  size_t SpellTo(char* out, size_t cap) const {
    size_t n = 0;
    Spell(out, cap, &n);
    return n;
  }

 private:
  enum Kind { kRoot, kMember, kIndex };
  FieldPath(const FieldPath* parent, absl::string_view name, Kind kind)
      : parent_(parent), text_(name), kind_(kind) {}
  FieldPath(const FieldPath* parent, int64_t index)
      : parent_(parent), index_(index), kind_(kIndex) {}

  // The one spelling of a path: into out[0, cap), counting every character in *n.
  static void Put(char* out, size_t cap, size_t* n, absl::string_view s) {
    for (char c : s) {
      if (*n < cap) out[*n] = c;
      ++*n;
    }
  }
  void Spell(char* out, size_t cap, size_t* n) const {
    if (parent_ != nullptr) parent_->Spell(out, cap, n);
    switch (kind_) {
      case kRoot:
        Put(out, cap, n, text_);
        return;
      case kMember:
        if (*n > 0) Put(out, cap, n, ".");
        Put(out, cap, n, text_);
        return;
      case kIndex:
        Put(out, cap, n, "[");
        Put(out, cap, n, absl::AlphaNum(index_).Piece());
        Put(out, cap, n, "]");
        return;
    }
  }

  const FieldPath* parent_ = nullptr;
  absl::string_view text_;
  absl::string_view rows_ = ".rows";
  absl::string_view cols_ = ".cols";
  int64_t index_ = 0;
  Kind kind_ = kRoot;
};

}  // namespace fp4q

#endif  // FP4Q_COMMON_FIELD_PATH_H_
