// The workspace of one optimizer step (step.h), shared by both backends and by
// StepWorkspaceBytes: where the batch flag, the per-item reports, the fingerprints and the plan
// live, and (CUDA) the item table copied from the host once and the device accumulators.
//
// A plain header (cstdint only): the CUDA .cu files include it too, so nvcc never sees Abseil.
// Every struct here is POD with a fixed layout; the .cc side checks with static_assert that
// ReportPod matches StepItemReport byte for byte.
//
//   [header | reports | fingerprints]  <- StepReadReport copies exactly this prefix
//   [plans]                            <- written by the check, read by the apply
//   [descs | updates | outs | lists]   <- CUDA: built on the host, one copy in StepCheck
//   [first-index accumulators]         <- CUDA: set to 0xFF bytes (index -1 = none)
//   [max / fingerprint accumulators]   <- CUDA: set to 0
#ifndef FP4Q_KERNELS_SRC_STEP_LAYOUT_H_
#define FP4Q_KERNELS_SRC_STEP_LAYOUT_H_

#include <cstddef>
#include <cstdint>

namespace fp4q::kernels::step_ws {

// Mirrors of step.h's enums as plain ints (same values).
enum : int32_t {
  kOk = 0,
  kNonFiniteUpdate = 1,
  kNonFiniteResult = 2,
  kOutOfRange = 3,
  kFingerprintMismatch = 4
};  // StepOutcome
enum : int32_t {
  kQNone = 0,
  kQUpdateSum = 1,
  kQWeight = 2,
  kQResidual = 3,
  kQMoment1 = 4,
  kQMoment2 = 5,
  kQDequantized = 6
};                                                         // StepQuantity
enum : int32_t { kStF32 = 1, kStBF16 = 2, kStNvfp4 = 3 };  // StateDType
// The optimizer variant of an item (one kernel per variant and state dtype).
enum : int32_t { kOptSgdPlain = 0, kOptSgdMomentum = 1, kOptAdamW = 2, kOptAdamWAmsgrad = 3 };
inline constexpr int kOptVariants = 4;
inline constexpr int kStateDTypes = 3;

// 2^127 and the largest finite bf16 (0x7F7F = 0x1.FEp127): the limits of NUMERICS 10.4 / 10.6.
inline constexpr double kTwoPow127 = 1.7014118346046923e38;
inline constexpr double kBf16Max = 3.3895313892515355e38;

// kStepStatFloats (step.h), for the kernels.
inline constexpr int kStatFloats = 8;

// Accumulators are replicated this many times (warp w adds into copy w % kAccCopies) so that the
// per-warp atomics of a large tensor do not all land on one address.
inline constexpr int kAccCopies = 16;

inline constexpr int32_t kCheckedMagic = 0x53544550;  // "STEP"

struct Header {
  int32_t ok;       // 1: every item of the batch passed the check
  int32_t checked;  // kCheckedMagic once StepCheck has queued its work
  int32_t n_items;
  int32_t n_updates;
  int32_t cancelled;  // 1: the StepCancel word held its token (ok is 0)
  int32_t one_pass_ran;  // 1: a one-pass apply ran past its cancellation gate (outputs written)
  uint32_t arrived;      // CTAs of a one-pass step's last apply launch that are done
  int32_t pad[9];
};
static_assert(sizeof(Header) == 64, "Header layout");

// StepItemReport (step.h) byte for byte.
struct ReportPod {
  int32_t outcome;
  int32_t quantity;
  int32_t rank;
  int32_t reserved;
  int64_t index;
  float value;
  float amax;
  double bound;
};
static_assert(sizeof(ReportPod) == 40, "ReportPod layout");

// What the check decided for one item, used by the apply (NUMERICS 10.2 Q, 10.5).
struct Plan {
  float amax;           // A: the weight's new global amax
  float s_enc;          // S_enc(A)
  float s_enc_old;      // the weight's S_enc before the step (its DQ)
  float gmax;           // max |g| over the item (the rank sum / mean)
  float m_amax[3];      // NVFP4 moments (moment1, moment2, max_moment2): amax of the stored values
  float m_senc_new[3];  // their S_enc(amax)
  float m_senc_old[3];  // their S_enc before the step
  int32_t pad[3];
};
static_assert(sizeof(Plan) == 64, "Plan layout");

// ---------------------------------------------------------------- CUDA: the item table

// One item as the kernels see it. Host scalars (step_scalars.h) are precomputed.
struct ItemDesc {
  uint8_t* codes;
  uint8_t* scales;
  float* global;
  float* residual;      // null without error feedback
  float* stats;         // null allowed under current scaling
  // Where the apply writes the weight's new codes, scales, global record, statistics and
  // residual: the pointers above (in place), or a one-pass step's StepNext.
  uint8_t* codes_next;
  uint8_t* scales_next;
  float* global_next;
  float* stats_next;
  float* residual_next;
  void* m_dense[3];     // F32 / BF16 moments (moment1, moment2, max_moment2); null when absent
  uint8_t* m_codes[3];  // NVFP4 moments
  uint8_t* m_scales[3];
  float* m_global[3];
  int64_t rows;
  int64_t cols;
  int64_t n;  // rows * cols
  uint64_t seed;
  uint64_t sr_step;
  int64_t t;
  int32_t first_update;  // index into the update table
  int32_t n_updates;
  int32_t first_out;  // index into the output table
  int32_t n_outs;
  int32_t opt;          // kOpt*
  int32_t state_dtype;  // kSt* (ignored for kOptSgdPlain)
  int32_t delayed;
  int32_t sr;
  int32_t tile16;    // 16x16 weight blocks
  int32_t swizzled;  // the weight's scales in the swizzled layout
  int32_t delta;     // UpdateKind kDelta
  int32_t nesterov;
  int32_t check_only;
  int32_t bf16_out;  // some dequantized output is bf16
  float lr, wd, mu, cd, b1, b2, c1, c2, eps, sbc2, alpha, lrwd, kf;
  int32_t pad[3];
};

struct UpdateDesc {
  const void* data;
  int32_t dtype;  // 1 f32, 2 bf16
  int32_t rank;
  uint64_t expect;  // check_only: the expected fingerprint
};

struct OutDesc {
  void* data;
  int32_t dtype;
  int32_t pad;
};

// A launch's items: entries [begin, end) of the list table, each with the first warp-unit (512
// elements) it owns in the launch; the entry after the last holds the total in unit_begin.
struct ListEntry {
  int32_t item;
  int32_t pad;
  int64_t unit_begin;
};

// Elements per warp-unit: 32 lanes x 16 (1x16: 32 consecutive blocks of the flattened tensor;
// 16x16 apply: 16 rows x 32 columns, two tiles side by side).
inline constexpr int64_t kUnitElems = 512;

// Accumulator slots per item.
enum : int {
  kIdxG = 0,
  kIdxM1 = 1,
  kIdxM2 = 2,
  kIdxW = 3,
  kIdxSlots = 4  // first non-finite index
};
enum : int {
  kMaxG = 0,
  kMaxV = 1,
  kMaxM1 = 2,
  kMaxS2 = 3,
  kMaxSvm = 4,  // the check
  kMaxApplyV = 5,
  kMaxApplyR = 6,
  kMaxApplyM1 = 7,
  kMaxApplyS2 = 8,
  kMaxApplySvm = 9,  // apply
  kMaxSlots = 10
};

inline constexpr size_t AlignUp(size_t x) { return (x + 63) / 64 * 64; }

struct Layout {
  int64_t n_items = 0;
  int64_t n_updates = 0;
  int64_t n_outs = 0;
  int64_t n_list_entries = 0;
  size_t reports = 0;       // ReportPod[n_items]
  size_t fingerprints = 0;  // uint64_t[n_updates]
  size_t report_end = 0;    // the prefix StepReadReport copies
  size_t plans = 0;         // Plan[n_items]
  size_t descs = 0;         // ItemDesc[n_items]
  size_t updates = 0;       // UpdateDesc[n_updates]
  size_t outs = 0;          // OutDesc[n_outs]
  size_t lists = 0;         // ListEntry[n_list_entries]
  size_t host_end = 0;      // [descs, host_end) is copied from the host
  size_t idx_acc = 0;       // uint64_t[n_items][kIdxSlots][kAccCopies], then
  size_t upd_idx_acc = 0;   // uint64_t[n_updates][kAccCopies]          (0xFF)
  size_t ff_end = 0;
  size_t max_acc = 0;  // uint32_t[n_items][kMaxSlots][kAccCopies], then
  size_t fp_acc = 0;   // uint64_t[n_updates][kAccCopies]          (0)
  size_t total = 0;
};

// Launch lists never exceed this many (check and apply variants).
inline constexpr int64_t kMaxLists = 64;

inline Layout ComputeLayout(int64_t n_items, int64_t n_updates, int64_t n_outs) {
  Layout l;
  l.n_items = n_items;
  l.n_updates = n_updates;
  l.n_outs = n_outs;
  l.n_list_entries = 2 * n_items + kMaxLists;
  const size_t ni = static_cast<size_t>(n_items);
  const size_t nu = static_cast<size_t>(n_updates);
  size_t at = sizeof(Header);
  l.reports = at;
  at = AlignUp(at + ni * sizeof(ReportPod));
  l.fingerprints = at;
  at += nu * sizeof(uint64_t);
  l.report_end = at;
  at = AlignUp(at);
  l.plans = at;
  at = AlignUp(at + ni * sizeof(Plan));
  l.descs = at;
  at = AlignUp(at + ni * sizeof(ItemDesc));
  l.updates = at;
  at = AlignUp(at + nu * sizeof(UpdateDesc));
  l.outs = at;
  at = AlignUp(at + static_cast<size_t>(n_outs) * sizeof(OutDesc));
  l.lists = at;
  at = AlignUp(at + static_cast<size_t>(l.n_list_entries) * sizeof(ListEntry));
  l.host_end = at;
  l.idx_acc = at;
  at += ni * kIdxSlots * kAccCopies * sizeof(uint64_t);
  l.upd_idx_acc = at;
  at = AlignUp(at + nu * kAccCopies * sizeof(uint64_t));
  l.ff_end = at;
  l.max_acc = at;
  at += ni * kMaxSlots * kAccCopies * sizeof(uint32_t);
  l.fp_acc = AlignUp(at);
  at = AlignUp(l.fp_acc + nu * kAccCopies * sizeof(uint64_t));
  l.total = at;
  return l;
}

}  // namespace fp4q::kernels::step_ws

#endif  // FP4Q_KERNELS_SRC_STEP_LAYOUT_H_
