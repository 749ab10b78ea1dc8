// ValidateCheckpointRecord (checkpoint.h): the meaning of one record read from a checkpoint,
// checked field by field against the rules of its kind, before the engine's Restore loads it.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "fp4q/kernels/types.h"
#include "server/checkpoint.h"
#include "server/request_checks.h"

namespace fp4q::server {

namespace {

// The record kinds: their number in the file and their name in messages. A new kind (optimizer
// state, ...) is a row here plus its rows in kFieldRules.
struct KindRow {
  uint8_t kind;
  const char* name;
};
constexpr KindRow kKinds[] = {{1, "weight"}, {2, "residual"}};

constexpr uint32_t Bit(uint8_t kind) { return kind < 32 ? 1u << kind : 0; }  // kinds < 32
constexpr uint32_t kWeight = Bit(1);
constexpr uint32_t kResidual = Bit(2);
constexpr uint32_t kEveryKind = kWeight | kResidual;

const char* KindName(uint8_t kind) {
  for (const KindRow& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return nullptr;
}

using Problem = std::optional<std::string>;  // what is wrong with the field; nullopt: fine

// One rule: the field it judges (as the layout in checkpoint.h spells it), the kinds it applies
// to, and the judgement. Rules run in table order and the first problem is the answer, so a
// rule may rely on every earlier rule of its kind (lengths after shapes, values after lengths).
struct FieldRule {
  const char* field;
  uint32_t kinds;
  Problem (*check)(const CheckpointRecord& r);
};

Problem Unless(bool ok, std::string problem) {
  if (ok) return std::nullopt;
  return problem;
}

template <typename T>
Problem MustBeZero(T v) {
  return Unless(v == T{0}, absl::StrCat(v, " in a residual record (must be 0)"));
}

Problem LengthIs(uint64_t got, absl::StatusOr<size_t> want, absl::string_view what) {
  if (!want.ok()) return std::string(absl::StripPrefix(want.status().message(), "shape: "));
  return Unless(got == *want, absl::StrCat(got, " bytes; ", what, " needs ", *want));
}

const FieldRule kFieldRules[] = {
    // ---- every kind: identity and shape.
    {"name", kEveryKind,
     [](const CheckpointRecord& r) -> Problem {
       // "namespace|name" outside the default namespace.
       absl::Status s = CheckName(LocalName(r.name), "name");
       if (!s.ok()) return std::string(absl::StripPrefix(s.message(), "name: "));
       s = CheckNamespace(NamespaceOf(r.name), "namespace");
       if (!s.ok()) return std::string(s.message());
       return std::nullopt;
     }},
    {"device", kEveryKind,
     [](const CheckpointRecord& r) -> Problem {
       if (r.device.empty() || r.device.size() > kMaxNameBytes) {
         return absl::StrCat(r.device.size(), " bytes; a device label has 1..", kMaxNameBytes);
       }
       for (size_t i = 0; i < r.device.size(); ++i) {
         const unsigned char c = r.device[i];
         if (c < 0x21 || c > 0x7E) {
           return absl::StrCat("byte ", i, " (0x", absl::Hex(c, absl::kZeroPad2),
                               ") is not printable ASCII");
         }
       }
       return std::nullopt;
     }},
    {"rows", kEveryKind,
     [](const CheckpointRecord& r) { return Unless(r.rows >= 1, absl::StrCat(r.rows, " < 1")); }},
    {"cols", kEveryKind,
     [](const CheckpointRecord& r) { return Unless(r.cols >= 1, absl::StrCat(r.cols, " < 1")); }},
    {"last_step", kEveryKind,
     [](const CheckpointRecord& r) {
       return Unless(r.last_step >= 0, absl::StrCat(r.last_step, " is negative"));
     }},
    // ---- weight: enums, then the NVFP4 shape rules, the global record, the part lengths.
    {"block", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(
           r.block == 1 || r.block == 2,
           absl::StrCat(r.block, " is not BLOCK_SHAPE_1X16 (1) or BLOCK_SHAPE_16X16 (2)"));
     }},
    {"rounding", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(
           r.rounding == 1 || r.rounding == 2,
           absl::StrCat(r.rounding, " is not ROUNDING_NEAREST (1) or ROUNDING_STOCHASTIC (2)"));
     }},
    {"dtype", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.dtype == kRecordF32 || r.dtype == kRecordBF16,
                     absl::StrCat(r.dtype, " is not DTYPE_F32 (1) or DTYPE_BF16 (2)"));
     }},
    {"cols", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.cols % 16 == 0, absl::StrCat(r.cols, " is not a multiple of 16 (NVFP4)"));
     }},
    {"rows", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.block != 2 || r.rows % 16 == 0,
                     absl::StrCat(r.rows, " is not a multiple of 16 (16x16 blocks)"));
     }},
    {"global_amax", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(std::isfinite(r.global_amax) && r.global_amax >= 0.0f,
                     absl::StrCat(r.global_amax, " is not finite and >= 0"));
     }},
    {"s_enc", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(std::isfinite(r.s_enc) && r.s_enc > 0.0f,
                     absl::StrCat(r.s_enc, " is not finite and > 0"));
     }},
    {"codes_len", kWeight,
     [](const CheckpointRecord& r) {
       return LengthIs(r.codes.size(), kernels::CodeBytes(r.rows, r.cols, "shape"),
                       absl::StrCat("[", r.rows, ", ", r.cols, "]"));
     }},
    {"scales_len", kWeight,
     [](const CheckpointRecord& r) {
       return LengthIs(r.scales.size(),
                       kernels::ScaleBytes(r.rows, r.cols, kernels::Format::kNvfp4,
                                           kernels::ScaleLayout::kPlain, "shape"),
                       absl::StrCat("[", r.rows, ", ", r.cols, "]"));
     }},
    {"residual_len", kWeight,
     [](const CheckpointRecord& r) -> Problem {
       if (!r.error_feedback) {
         return Unless(
             r.residual.empty(),
             absl::StrCat(r.residual.size(), " bytes without error feedback (must be 0)"));
       }
       return LengthIs(r.residual.size(),
                       kernels::DenseBytes(r.rows, r.cols, kernels::DType::kF32, "shape"),
                       "an f32 residual of its shape");
     }},
    {"scales", kWeight,
     [](const CheckpointRecord& r) -> Problem {
       for (size_t i = 0; i < r.scales.size(); ++i) {
         const uint8_t b = static_cast<uint8_t>(r.scales[i]);
         if ((b & 0x7F) == 0x7F) {
           return absl::StrCat("byte ", i, " is 0x", absl::Hex(b, absl::kZeroPad2),
                               ", an E4M3 NaN (the quantizer never stores one)");
         }
       }
       return std::nullopt;
     }},
    // ---- weight (version 2): scaling, optimizer state, statistics.
    {"scaling", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.scaling == 1 || r.scaling == 2,
                     absl::StrCat(r.scaling, " is not SCALING_CURRENT (1) or SCALING_DELAYED (2)"));
     }},
    {"optimizer", kWeight,
     [](const CheckpointRecord& r) -> Problem {
       if (r.optimizer != 1 && r.optimizer != 2) {
         return absl::StrCat(r.optimizer, " is not OPTIMIZER_KIND_SGD (1) or ADAMW (2)");
       }
       if (r.optimizer == 1 && r.amsgrad) return std::string("amsgrad set for SGD");
       if (r.optimizer == 2 && r.momentum) return std::string("momentum set for AdamW");
       return std::nullopt;
     }},
    {"state_dtype", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.state_dtype >= 1 && r.state_dtype <= 3,
                     absl::StrCat(r.state_dtype, " is not STATE_DTYPE_F32/BF16/NVFP4 (1-3)"));
     }},
    {"optimizer_steps", kWeight,
     [](const CheckpointRecord& r) {
       return Unless(r.optimizer_steps >= 0, absl::StrCat(r.optimizer_steps, " is negative"));
     }},
    {"stats", kWeight,
     [](const CheckpointRecord& r) -> Problem {
       for (int i = 0; i < 8; ++i) {
         if (!std::isfinite(r.stats[i]) || r.stats[i] < 0.0f) {
           return absl::StrCat("stats[", i, "] ", r.stats[i], " is not finite and >= 0");
         }
       }
       return std::nullopt;
     }},
    {"moments", kWeight,
     [](const CheckpointRecord& r) -> Problem {
       const bool adamw = r.optimizer == 2;
       const size_t want = adamw ? (r.amsgrad ? 3 : 2) : (r.momentum ? 1 : 0);
       if (r.moments.size() != want) {
         return absl::StrCat(r.moments.size(), " moments; the optimizer keeps ", want);
       }
       const uint64_t n = static_cast<uint64_t>(r.rows) * static_cast<uint64_t>(r.cols);
       for (size_t i = 0; i < r.moments.size(); ++i) {
         const std::string& m = r.moments[i];
         if (r.state_dtype == 3) {
           const uint64_t codes = n / 2, scales = n / 16;
           if (m.size() != codes + scales + 8) {
             return absl::StrCat("moment ", i, ": ", m.size(), " bytes; NVFP4 needs ",
                                 codes + scales + 8);
           }
           for (uint64_t b = codes; b < codes + scales; ++b) {
             if ((static_cast<uint8_t>(m[b]) & 0x7F) == 0x7F) {
               return absl::StrCat("moment ", i, ": scale ", b - codes, " is an E4M3 NaN");
             }
           }
           float g[2];
           std::memcpy(g, m.data() + codes + scales, 8);
           if (!std::isfinite(g[0]) || g[0] < 0.0f || !std::isfinite(g[1]) || g[1] <= 0.0f) {
             return absl::StrCat("moment ", i, ": its global record [", g[0], ", ", g[1],
                                 "] is not a finite amax >= 0 and S_enc > 0");
           }
           continue;
         }
         const uint64_t esize = r.state_dtype == 1 ? 4 : 2;
         if (m.size() != n * esize) {
           return absl::StrCat("moment ", i, ": ", m.size(), " bytes; needs ", n * esize);
         }
         for (uint64_t k = 0; k < n; ++k) {
           float v;
           if (esize == 4) {
             std::memcpy(&v, m.data() + 4 * k, 4);
           } else {
             uint32_t u = 0;
             std::memcpy(reinterpret_cast<char*>(&u) + 2, m.data() + 2 * k, 2);
             std::memcpy(&v, &u, 4);
           }
           if (!std::isfinite(v)) {
             return absl::StrCat("moment ", i, ": element ", k, " is ", v, " (never stored)");
           }
         }
       }
       return std::nullopt;
     }},
    // ---- residual: the weight fields are 0 and its parts empty.
    {"block", kResidual, [](const CheckpointRecord& r) { return MustBeZero<int>(r.block); }},
    {"rounding", kResidual, [](const CheckpointRecord& r) { return MustBeZero<int>(r.rounding); }},
    {"dtype", kResidual, [](const CheckpointRecord& r) { return MustBeZero<int>(r.dtype); }},
    {"error_feedback", kResidual,
     [](const CheckpointRecord& r) { return MustBeZero<int>(r.error_feedback ? 1 : 0); }},
    {"seed", kResidual, [](const CheckpointRecord& r) { return MustBeZero<uint64_t>(r.seed); }},
    {"global_amax", kResidual,
     [](const CheckpointRecord& r) { return MustBeZero<float>(r.global_amax); }},
    {"s_enc", kResidual, [](const CheckpointRecord& r) { return MustBeZero<float>(r.s_enc); }},
    {"codes_len", kResidual,
     [](const CheckpointRecord& r) { return MustBeZero<uint64_t>(r.codes.size()); }},
    {"scales_len", kResidual,
     [](const CheckpointRecord& r) { return MustBeZero<uint64_t>(r.scales.size()); }},
    {"residual_len", kResidual,
     [](const CheckpointRecord& r) {
       return LengthIs(r.residual.size(),
                       kernels::DenseBytes(r.rows, r.cols, kernels::DType::kF32, "shape"),
                       "an f32 residual of its shape");
     }},
    // ---- every kind: the residual's values (lengths checked above).
    {"residual", kEveryKind,
     [](const CheckpointRecord& r) -> Problem {
       const size_t n = r.residual.size() / sizeof(float);
       for (size_t i = 0; i < n; ++i) {
         float v;
         std::memcpy(&v, r.residual.data() + i * sizeof(float), sizeof(float));
         if (!std::isfinite(v)) {
           return absl::StrCat("element ", i, " of ", n, " is ", v,
                               " (stored residuals are always finite)");
         }
       }
       return std::nullopt;
     }},
};

}  // namespace

absl::Status ValidateCheckpointRecord(const CheckpointRecord& r, uint32_t index) {
  const char* kind = KindName(r.kind);
  // The record as messages name it: its number, kind and (escaped, at most 64 bytes) name.
  const std::string who = absl::StrCat(
      "checkpoint is corrupt: record ", index, " (",
      kind != nullptr ? std::string(kind) : absl::StrCat("kind ", r.kind), " '",
      absl::CHexEscape(r.name.substr(0, 64)), r.name.size() > 64 ? "...'" : "'", "): ");
  if (kind == nullptr) {
    std::string known;
    for (const KindRow& k : kKinds) {
      absl::StrAppend(&known, known.empty() ? "" : ", ", k.kind, " ", k.name);
    }
    return absl::DataLossError(
        absl::StrCat(who, "kind: ", r.kind, " is not a record kind (", known, ")"));
  }
  for (const FieldRule& rule : kFieldRules) {
    if ((rule.kinds & Bit(r.kind)) == 0) continue;
    if (Problem p = rule.check(r)) {
      return absl::DataLossError(absl::StrCat(who, rule.field, ": ", *p));
    }
  }
  return absl::OkStatus();
}

}  // namespace fp4q::server
