// The CUDA backend's kernel launchers: plain parameter structs and functions returning
// cudaError_t. This header is the seam between the .cc side (absl::Status, validation, staging)
// and the .cu side (kernels), so nvcc never compiles Abseil: it includes only the CUDA runtime.
//
// Every launcher checks cudaGetLastError() after each of its launches and returns the first
// error. Pointers are device pointers and must be 16-byte aligned (the caller stages misaligned
// buffers, see staging.h); sizes are already validated by the Backend entry points.
#ifndef FP4Q_KERNELS_SRC_CUDA_LAUNCH_H_
#define FP4Q_KERNELS_SRC_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernel_choice.h"
#include "cuda/kernel_codes.h"
#include "cuda/philox_head.h"

namespace fp4q::kernels::cuda {

// One quantized output (row-wise: [rows, cols]; column-wise: [cols, rows] of x^T).
struct QOut {
  uint8_t* codes = nullptr;   // null: not requested
  uint8_t* scales = nullptr;
  bool swizzled = false;
  float* global = nullptr;    // kGlobalFloats floats
  // What the kernel writes into global (block 0, thread 0): [0] = amax when write_amax,
  // [1] = S_enc (NVFP4) or 1.0f (MXFP4) always. MXFP4 computes [0] with atomicMax (zeroed first).
  bool write_amax = false;
  // Global amax used for NVFP4 scaling: `amax_value` when amax_ptr is null, else *amax_ptr.
  const float* amax_ptr = nullptr;
  float amax_value = 0.0f;
};

// Philox4x32-10's round keys for a seed (NUMERICS 4): round i uses lo32(seed) + i * 0x9E3779B9
// and hi32(seed) + i * 0xBB67AE85. The host computes them once per launch, so the kernels read
// each round's key as a constant operand instead of adding it per call.
struct PhiloxKeys {
  uint32_t k0[10];
  uint32_t k1[10];
  __host__ __device__ uint32_t K0(int i) const { return k0[i]; }
  __host__ __device__ uint32_t K1(int i) const { return k1[i]; }
};

// The same round keys computed from the seed where it is a device value (the step kernels'
// items): two adds per round.
struct SeedKeys {
  uint64_t seed;
  __host__ __device__ uint32_t K0(int i) const {
    return static_cast<uint32_t>(seed) + static_cast<uint32_t>(i) * 0x9E3779B9u;
  }
  __host__ __device__ uint32_t K1(int i) const {
    return static_cast<uint32_t>(seed >> 32) + static_cast<uint32_t>(i) * 0xBB67AE85u;
  }
};

inline PhiloxKeys PhiloxKeySchedule(uint64_t seed) {
  const SeedKeys from{seed};
  PhiloxKeys k{};
  for (int i = 0; i < 10; ++i) {
    k.k0[i] = from.K0(i);
    k.k1[i] = from.K1(i);
  }
  return k;
}

// Options shared by every quantizing kernel.
struct QuantOptions {
  int fmt = kFmtNv1x16;
  bool sr = false;
  PhiloxKeys sr_keys{};  // PhiloxKeySchedule(the request's seed)
  uint64_t step = 0;
  bool rht = false;
  uint32_t rht_signs = 0;  // bit i set: s_i = -1 (already resolved from the mode/seed)
  int scale_sel = kSelMapTo6;
  float emax = 256.0f;     // four-over-six
  int mx_rule = kMxRceil;
};

// Row-wise quantization of a dense source, with the optional error-feedback residual and QDQ
// output. One thread per 32 elements of a row (16x16: a warp per 16 rows x 64 columns).
struct RowParams {
  QuantOptions q;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* x = nullptr;
  int x_dtype = kBF16;
  float* residual = nullptr;  // v = RN(x + r); r <- RN(v - DQ(q)) unless amax_only
  // Outputs.
  QOut out;                // codes may be null (QDQ)
  void* dq = nullptr;      // DQ values (QDQ)
  int dq_dtype = kF32;
  // Amax-only pass: compute v (and its transform), reduce max |v| into *amax_out (atomicMax on a
  // zeroed float), write nothing else.
  float* amax_out = nullptr;
  // Guarded amax-only pass (a FiniteGuard, error feedback only): also the first non-finite
  // row-major index of x and of v (unsigned atomicMin into words set to 0xFF bytes first).
  uint64_t* first_bad_x = nullptr;
  uint64_t* first_bad_v = nullptr;
  // Gate of a writing pass: when non-null the kernel returns at once unless *gate == 0 (the
  // outcome word of the FiniteGuard the guard kernel wrote).
  const int32_t* gate = nullptr;
  KernelTuning tuning;  // the backend's (kernel_choice.h)
};

// What kernel_choice.h decides a row pass's kernel from.
inline RowPass RowPassOf(const RowParams& p) {
  RowPass r;
  r.fmt = p.q.fmt;
  r.scale_sel = p.q.scale_sel;
  r.rht = p.q.rht;
  r.residual = p.residual != nullptr;
  r.amax_only = p.amax_out != nullptr;
  r.guarded = p.first_bad_x != nullptr;
  r.x_dtype = p.x_dtype;
  r.rows = p.rows;
  r.cols = p.cols;
  return r;
}

// Row-wise and/or column-wise quantization from one read of x (quantize_tile.cu: lane tiles where
// LaneTilesCover, else shared tiles of 64 rows x 128 columns). No residual.
struct TileParams {
  QuantOptions q;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* x = nullptr;
  int x_dtype = kBF16;
  QOut row;  // codes null: no row-wise output
  QOut col;  // codes null: no column-wise output
  // Amax-only pass (RHT with both outputs): max |RHT_rows(x)| into *row_amax_out and
  // max |RHT_cols(x)| into *col_amax_out (either may be null).
  bool amax_only = false;
  float* row_amax_out = nullptr;
  float* col_amax_out = nullptr;
  KernelTuning tuning;  // the backend's (kernel_choice.h: LaneTilesCover)
};

// What kernel_choice.h decides a two-output pass's kernel from.
inline RowPass TilePassOf(const TileParams& p) {
  RowPass r;
  r.fmt = p.q.fmt;
  r.scale_sel = p.q.scale_sel;
  r.rht = p.q.rht;
  r.amax_only = p.amax_only;
  r.x_dtype = p.x_dtype;
  r.rows = p.rows;
  r.cols = p.cols;
  return r;
}

struct DequantParams {
  int64_t rows = 0;
  int64_t cols = 0;
  bool mx = false;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  bool swizzled = false;
  const float* global = nullptr;  // S_enc at global[1] (NVFP4); unused for MXFP4
  void* out = nullptr;
  int out_dtype = kF32;
  // For the GEMM: write e2m1 * sf exactly as bf16, without S_dec (out_dtype must be kBF16).
  bool raw = false;
};

struct RhtParams {
  const void* in = nullptr;
  void* out = nullptr;
  int dtype = kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  uint32_t signs = 0;
  bool inverse = false;
};

// An NVFP4/MXFP4 GEMM operand for the direct (small-M, mid-M and wgmma) kernels.
struct GemmOperand {
  int64_t rows = 0;
  int64_t cols = 0;  // K
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  bool swizzled = false;
  const float* global = nullptr;
};

struct SmallMParams {
  bool mx = false;
  GemmOperand a;  // [M, K]: M <= kSmallMMax (small-M), kMidMMax (mid-M) or kWgmmaMax (wgmma)
  GemmOperand b;  // [N, K]
  void* c = nullptr;
  int c_dtype = kF32;
  // SmallMWorkspaceBytes / MidMWorkspaceBytes / WgmmaWorkspaceBytes(M, N, K) bytes: A in
  // fragment (or core-matrix) order, split tickets, partial sums (small-M: partial sums only).
  void* workspace = nullptr;
  // Launch the main kernel with programmatic dependent launch (compute capability >= 9.0).
  bool pdl = false;
  // The small-M kernel's split tickets: SmallMTickets(M, N, K) ints, zero before the launch and
  // zero again after it (the kernel puts them back), owned by the caller for its stream.
  int* zeroed_tickets = nullptr;
};

// max |x| into *amax (zeroed by the launcher); with `first_bad` also the first non-finite index
// of x into *first_bad (set to ~0 = "none" by the launcher; read as int64 it is -1).
cudaError_t LaunchAmax(const void* x, int dtype, int64_t n, float* amax, uint64_t* first_bad,
                       cudaStream_t s);
// A row pass on the kernel ChooseRowKernel(RowPassOf(p), p.tuning) names.
cudaError_t LaunchQuantizeRows(const RowParams& p, cudaStream_t s);
// The lane kernels (quantize_lanes.cu, quantize_lane_pairs.cu) for a pass the choice gives
// them; cudaErrorInvalidValue for one it gives kRows.
cudaError_t LaunchQuantizeLanes(const RowParams& p, RowKernel k, cudaStream_t s);
// A pass with FusedAmaxFits(RowPassOf(p), p.tuning) and its global amax computed: one
// cooperative launch computes the amax into *amax (zeroed by the launch itself) and quantizes
// with it, instead of a memset, a reduction and the quantize launch; under CtaAmaxFits an
// ordinary launch does it, each CTA reducing the whole tensor itself (no grid barrier).
cudaError_t LaunchQuantizeFusedAmax(const RowParams& p, float* amax, cudaStream_t s);
cudaError_t LaunchQuantizeTile(const TileParams& p, cudaStream_t s);
cudaError_t LaunchDequantize(const DequantParams& p, cudaStream_t s);
cudaError_t LaunchRht(const RhtParams& p, cudaStream_t s);

// A kernel that does nothing (the backend's probe of whether launches block behind a wait).
cudaError_t LaunchNoOp(cudaStream_t s);
// A kernel of elementwise.cu, which names its CUDA module (step_launch.h's *Module()).
const void* ElementwiseModule();
// A kernel of each other file of kernels, naming its CUDA module: the backend loads every kernel
// of the library at start-up (stream_signals.cc), since a kernel's first launch (lazy loading)
// waits for the device, and so for any device-side wait a step has queued on another stream.
const void* MatmulMidMModule();     // matmul_mid_m.cu
const void* MatmulSmallMModule();   // matmul_small_m.cu
const void* MatmulWgmmaModule();    // matmul_wgmma.cu
const void* QuantizeLanePairsModule();  // quantize_lane_pairs.cu
const void* QuantizeLanesModule();      // quantize_lanes.cu
const void* QuantizeRowsModule();   // quantize_rows.cu
const void* QuantizeTileModule();   // quantize_tile.cu

// alpha[0] = RN(S_dec_a * S_dec_b) (1.0f factors for MXFP4), for the cuBLASLt GEMM paths.
cudaError_t LaunchGemmAlpha(const float* global_a, const float* global_b, bool mx, float* alpha,
                            cudaStream_t s);
// Rewrites plain [rows, scale_cols] scales into the swizzled layout (padding zeroed).
cudaError_t LaunchSwizzleScales(const uint8_t* plain, int64_t rows, int64_t scale_cols,
                                uint8_t* swizzled, cudaStream_t s);

// Zeroes the padding bytes (rows >= `rows` or columns >= `scale_cols`) of a swizzled scale
// buffer, leaving the real scales alone. With `gate`: only when *gate == gate_pass.
cudaError_t LaunchZeroSwizzlePadding(uint8_t* swizzled, int64_t rows, int64_t scale_cols,
                                     cudaStream_t s, const int32_t* gate = nullptr,
                                     int32_t gate_pass = 0);

// FiniteGuard (fp4q/kernels/step.h) byte for byte.
struct GuardPod {
  int32_t outcome;
  int32_t quantity;
  int64_t index;
  float value;
  float amax;
  double bound;
};

// The decision of a guarded error-feedback quantization (one thread), after its amax-only pass:
// x finite, v = RN(x + r) finite, the largest dequantized value below 2^127 (and below the
// largest bf16 for a bf16 output). Writes *guard; always writes the amax to use to *amax_out;
// when the check passes, zeroes *zero_on_pass (MXFP4's recorded amax, an atomicMax target).
struct GuardParams {
  const void* x = nullptr;
  int x_dtype = kF32;
  const float* residual = nullptr;
  const uint64_t* first_bad_x = nullptr;
  const uint64_t* first_bad_v = nullptr;
  const float* amax_in = nullptr;  // max |v| of the amax pass
  bool has_amax = false;           // the caller's amax instead
  float amax_value = 0.0f;
  int fmt = kFmtNv1x16;
  int scale_sel = kSelMapTo6;
  float emax = 256.0f;
  int mx_rule = kMxRceil;
  bool bf16_out = false;
  GuardPod* guard = nullptr;
  float* amax_out = nullptr;
  float* zero_on_pass = nullptr;
};
cudaError_t LaunchFiniteGuard(const GuardParams& p, cudaStream_t s);

// The largest M the small-M kernel takes (two n8 MMA tiles). K must be a multiple of 16 (32 for
// MXFP4); pointers 16-byte aligned.
inline constexpr int64_t kSmallMMax = 16;
// Its workspace holds the f32 partial sums of a split K, and it needs SmallMTickets zeroed
// tickets (both 0 when K is not split).
size_t SmallMWorkspaceBytes(int64_t m, int64_t n, int64_t k);
int64_t SmallMTickets(int64_t m, int64_t n, int64_t k);
cudaError_t LaunchSmallMMatmul(const SmallMParams& p, cudaStream_t s);

// The mid-M kernel (matmul_mid_m.cu) takes kSmallMMax < M <= kMidMMax, the same K and alignment
// rules, on GPUs other than Hopper; above kMidMMax (there) and above kWgmmaPathMax (on Hopper) the
// backend dequantizes both operands and calls cuBLASLt's bf16 GEMM.
// The bound is where the H200 measured the kernel faster than that path (N = K = 8192: 2.1x at
// M = 32, 1.4x at 64, 0.97x at 128; bench/results/h200-gemm/).
inline constexpr int64_t kMidMMax = 64;
size_t MidMWorkspaceBytes(int64_t m, int64_t n, int64_t k);
cudaError_t LaunchMidMMatmul(const SmallMParams& p, cudaStream_t s);

// The wgmma kernel (matmul_wgmma.cu, sm_90a only: the backend launches it on compute
// capability 9.0) takes kSmallMMax < M <= kWgmmaMax, the same K and alignment rules. The backend uses it
// for kSmallMMax < M <= kWgmmaPathMax there: the H200 measured it faster than dequantize +
// cuBLASLt up to M = 256 (N = K = 8192: 1.37x at 256) and 2% slower at 512
// (bench/results/h200-gemm/wgmma/).
inline constexpr int64_t kWgmmaMax = 512;
inline constexpr int64_t kWgmmaPathMax = 256;
size_t WgmmaWorkspaceBytes(int64_t m, int64_t n, int64_t k);
cudaError_t LaunchWgmmaMatmul(const SmallMParams& p, cudaStream_t s);

// Multiprocessors of the current device (cached per device).
int SmCount();
// Whether the optimizer step's kernels are launched as programmatic dependent launches on the
// current device (compute capability 9.0 or later, unless FP4Q_STEP_PDL=0 in the environment,
// the A/B switch): step_device.cuh StepLaunch.
bool StepPdl();
// Whether a step's item table rides in its init kernel's launch when it fits (cuda_step.cc
// QueueTable), unless FP4Q_STEP_INLINE_TABLE=0 in the environment (the A/B switch: the table
// then goes by a host-to-device copy).
bool InlineTables();

// Host helpers shared with the .cc side (defined in device_numerics, usable on the host).
uint32_t RhtSignMask(int mode /*kRhtDefaultSigns or kRhtSeeded*/, uint64_t rht_seed);

}  // namespace fp4q::kernels::cuda

#endif  // FP4Q_KERNELS_SRC_CUDA_LAUNCH_H_
