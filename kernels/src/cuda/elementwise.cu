// Memory-bound helpers: global amax (NUMERICS 2 G1, optionally with the first non-finite
// index), dequantization (NUMERICS 2 "Dequantize", 8), the standalone RHT (NUMERICS 6), the
// decision of a FiniteGuard (one thread), and the small GEMM helpers (alpha, scale swizzling).
//
// Budgets: amax reads 2 bytes per bf16 element (one max each); dequantize reads 0.5625 bytes and
// writes 2 or 4 per element (3 instructions each); RHT reads and writes the tensor once
// (a 16-point butterfly, 4 adds per element).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cfloat>
#include <cstdlib>

#include "device_numerics.cuh"
#include "launch.h"
#include "quantize_unit.cuh"

namespace fp4q::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned BlocksFor(int64_t work, int64_t per_block, int64_t cap) {
  int64_t b = (work + per_block - 1) / per_block;
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}

// ---------------------------------------------------------------- amax

// A non-finite element's index into *first (kTrack), the smallest of the thread's.
FP4Q_D void NoteNonFinite(float v, uint64_t i, uint64_t* first) {
  if (!(fabsf(v) <= FLT_MAX) && i < *first) *first = i;
}

template <typename T, bool kTrack>
FP4Q_D void AmaxChunk(const uint4& w, uint64_t chunk, float* m, uint64_t* first) {
  constexpr int kPer = 16 / sizeof(T);
  const uint32_t a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (sizeof(T) == 4) {
      const float f = __uint_as_float(a[j]);
      *m = fmaxf(*m, fabsf(f));
      if (kTrack) NoteNonFinite(f, chunk * kPer + j, first);
    } else {
      const float lo = Bf16Lo(a[j]), hi = Bf16Hi(a[j]);
      *m = fmaxf(*m, fmaxf(fabsf(lo), fabsf(hi)));
      if (kTrack) {
        NoteNonFinite(lo, chunk * kPer + 2 * j, first);
        NoteNonFinite(hi, chunk * kPer + 2 * j + 1, first);
      }
    }
  }
}

// kTrack: also the first non-finite index (Backend::Amax's first_nonfinite).
template <typename T, bool kTrack>
__global__ void __launch_bounds__(kThreads)
    AmaxKernel(const T* x, int64_t n, float* out, uint64_t* first_out) {
  constexpr int kPer = 16 / sizeof(T);  // elements per 16-byte chunk
  const int64_t chunks = n / kPer;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.0f;
  uint64_t first = ~uint64_t{0};
  const uint4* q = reinterpret_cast<const uint4*>(x);
  int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + 3 * stride < chunks; i += 4 * stride) {
    uint4 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = q[i + k * stride];
#pragma unroll
    for (int k = 0; k < 4; ++k) AmaxChunk<T, kTrack>(w[k], i + k * stride, &m, &first);
  }
  for (; i < chunks; i += stride) AmaxChunk<T, kTrack>(q[i], i, &m, &first);
  // Tail elements (n not a multiple of a chunk).
  const int64_t t = chunks * kPer + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t < n) {
    float f;
    if constexpr (sizeof(T) == 4) {
      f = x[t];
    } else {
      f = __bfloat162float(x[t]);
    }
    m = fmaxf(m, fabsf(f));
    if (kTrack) NoteNonFinite(f, static_cast<uint64_t>(t), &first);
  }
  __shared__ float part[kThreads / 32];
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  if (kTrack) {
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, first, d);
      first = o < first ? o : first;
    }
    if ((threadIdx.x & 31) == 0 && first != ~uint64_t{0}) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_out),
                static_cast<unsigned long long>(first));
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.0f;
    m = WarpMax(m);
    if (threadIdx.x == 0 && m > 0.0f) AtomicMaxNonNegative(out, m);
  }
}

// ---------------------------------------------------------------- dequantize

// One thread per 16 elements of a row.
__global__ void __launch_bounds__(kThreads) DequantizeKernel(const DequantParams p) {
  const int64_t groups_per_row = p.cols >> 4;
  const int64_t gidx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (gidx >= p.rows * groups_per_row) return;
  const int64_t row = gidx / groups_per_row;
  const int64_t c0 = (gidx - row * groups_per_row) * 16;
  const uint2 w = *reinterpret_cast<const uint2*>(p.codes + ((row * p.cols + c0) >> 1));
  float sf;
  float s_dec = 1.0f;
  if (p.mx) {
    sf = E8M0Value(p.scales[ScaleOffset(row, c0 >> 5, p.cols >> 5, p.swizzled)]);
  } else {
    sf = E4M3Value(p.scales[ScaleOffset(row, c0 >> 4, p.cols >> 4, p.swizzled)]);
    if (!p.raw) s_dec = __frcp_rn(p.global[1]);
  }
  float v[32];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const uint32_t code = ((e < 8 ? w.x : w.y) >> (4 * (e & 7))) & 0xFu;
    const float prod = __fmul_rn(E2M1Value(code), sf);
    v[e] = (p.mx || p.raw) ? prod : __fmul_rn(prod, s_dec);
  }
  const size_t es = p.out_dtype == kF32 ? 4 : 2;
  StoreElems(static_cast<char*>(p.out) + (row * p.cols + c0) * es, p.out_dtype, 16, v);
}

// ---------------------------------------------------------------- RHT

// One thread per group of 16 consecutive elements of a row.
template <typename T>
__global__ void __launch_bounds__(kThreads) RhtKernel(const RhtParams p) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (g >= (p.rows * p.cols) >> 4) return;
  float v[32];
  LoadElems<T>(reinterpret_cast<const T*>(p.in) + g * 16, 16, v);
  if (!p.inverse) {
    ApplySigns16(v, p.signs);
    Butterfly16(v);
  } else {
    Butterfly16(v);
    ApplySigns16(v, p.signs);
  }
  const bool bf16 = sizeof(T) == 2;
  StoreElems(static_cast<char*>(p.out) + g * 16 * sizeof(T), bf16 ? kBF16 : kF32, 16, v);
}

// ---------------------------------------------------------------- GEMM helpers

__global__ void NoOpKernel() {}

__global__ void GemmAlphaKernel(const float* ga, const float* gb, bool mx, float* alpha) {
  alpha[0] = mx ? 1.0f : __fmul_rn(__frcp_rn(ga[1]), __frcp_rn(gb[1]));
}

__global__ void __launch_bounds__(kThreads)
    SwizzleScalesKernel(const uint8_t* plain, int64_t rows, int64_t sc, uint8_t* out) {
  const int64_t rp = (rows + 127) / 128 * 128;
  const int64_t cp = (sc + 3) / 4 * 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rp * cp) return;
  const int64_t r = i / cp;
  const int64_t c = i - r * cp;
  out[SwizzleOffset(r, c, cp / 4)] = (r < rows && c < sc) ? plain[r * sc + c] : 0;
}

__global__ void __launch_bounds__(kThreads)
    ZeroPaddingKernel(uint8_t* out, int64_t rows, int64_t sc, const int32_t* gate,
                      int32_t gate_pass) {
  if (gate != nullptr && *gate != gate_pass) return;
  const int64_t rp = (rows + 127) / 128 * 128;
  const int64_t cp = (sc + 3) / 4 * 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rp * cp) return;
  const int64_t r = i / cp;
  const int64_t c = i - r * cp;
  if (r >= rows || c >= sc) out[SwizzleOffset(r, c, cp / 4)] = 0;
}

// ---------------------------------------------------------------- FiniteGuard

// Outcome codes of step.h (StepOutcome, StepQuantity).
constexpr int32_t kGuardOk = 0, kGuardNonFiniteUpdate = 1, kGuardNonFiniteResult = 2,
                  kGuardOutOfRange = 3;
constexpr int32_t kQuantityUpdateSum = 1, kQuantityWeight = 2, kQuantityDequantized = 6;

FP4Q_D float ElementOf(const void* x, int dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(x)[i];
  return Bf16Lo(static_cast<const uint16_t*>(x)[i]);
}

__global__ void FiniteGuardKernel(const GuardParams p) {
  GuardPod g{kGuardOk, 0, -1, 0.0f, 0.0f, 0.0};
  const uint64_t bx = *p.first_bad_x;
  const uint64_t bv = *p.first_bad_v;
  float amax = 0.0f;
  if (bx != ~uint64_t{0}) {
    g.outcome = kGuardNonFiniteUpdate;
    g.quantity = kQuantityUpdateSum;
    g.index = static_cast<int64_t>(bx);
    g.value = ElementOf(p.x, p.x_dtype, g.index);
  } else if (bv != ~uint64_t{0}) {
    g.outcome = kGuardNonFiniteResult;
    g.quantity = kQuantityWeight;
    g.index = static_cast<int64_t>(bv);
    g.value = __fadd_rn(ElementOf(p.x, p.x_dtype, g.index), p.residual[g.index]);
  } else {
    amax = p.has_amax ? p.amax_value : *p.amax_in;
    g.amax = amax;
    double dmax;
    if (p.fmt == kFmtMx) {
      dmax = __dmul_rn(6.0, static_cast<double>(E8M0Value(MxScaleByte(amax, p.mx_rule))));
    } else {
      const float emax6 = p.scale_sel == kSelMapTo6 ? 2688.0f : __fmul_rn(p.emax, 6.0f);
      dmax = __dmul_rn(2688.0, static_cast<double>(__frcp_rn(SEncOf(amax, emax6))));
    }
    if (!(dmax < 1.7014118346046923e38) || (p.bf16_out && !(dmax < 3.3895313892515355e38))) {
      g.outcome = kGuardOutOfRange;
      g.quantity = kQuantityDequantized;
      g.bound = dmax;
    }
  }
  *p.guard = g;
  *p.amax_out = amax;
  if (g.outcome == kGuardOk && p.zero_on_pass != nullptr) *p.zero_on_pass = 0.0f;
}

}  // namespace

cudaError_t LaunchFiniteGuard(const GuardParams& p, cudaStream_t s) {
  FiniteGuardKernel<<<1, 1, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchZeroSwizzlePadding(uint8_t* swizzled, int64_t rows, int64_t scale_cols,
                                     cudaStream_t s, const int32_t* gate, int32_t gate_pass) {
  if (rows % 128 == 0 && scale_cols % 4 == 0) return cudaSuccess;  // no padding
  const int64_t n = (rows + 127) / 128 * 128 * ((scale_cols + 3) / 4 * 4);
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  ZeroPaddingKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(swizzled, rows,
                                                                        scale_cols, gate,
                                                                        gate_pass);
  return cudaGetLastError();
}

cudaError_t LaunchAmax(const void* x, int dtype, int64_t n, float* amax, uint64_t* first_bad,
                       cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), s);
  if (e != cudaSuccess) return e;
  if (first_bad != nullptr) {
    e = cudaMemsetAsync(first_bad, 0xFF, sizeof(uint64_t), s);
    if (e != cudaSuccess) return e;
  }
  const int64_t per = dtype == kF32 ? 4 : 8;
  const unsigned blocks = BlocksFor(n / per, kThreads * 4, 2048);
  if (dtype == kF32) {
    const auto* xf = static_cast<const float*>(x);
    if (first_bad != nullptr) {
      AmaxKernel<float, true><<<blocks, kThreads, 0, s>>>(xf, n, amax, first_bad);
    } else {
      AmaxKernel<float, false><<<blocks, kThreads, 0, s>>>(xf, n, amax, nullptr);
    }
  } else {
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    if (first_bad != nullptr) {
      AmaxKernel<__nv_bfloat16, true><<<blocks, kThreads, 0, s>>>(xb, n, amax, first_bad);
    } else {
      AmaxKernel<__nv_bfloat16, false><<<blocks, kThreads, 0, s>>>(xb, n, amax, nullptr);
    }
  }
  return cudaGetLastError();
}

cudaError_t LaunchDequantize(const DequantParams& p, cudaStream_t s) {
  const int64_t groups = p.rows * (p.cols >> 4);
  if (groups == 0) return cudaSuccess;
  const int64_t blocks = (groups + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  DequantizeKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchRht(const RhtParams& p, cudaStream_t s) {
  const int64_t groups = (p.rows * p.cols) >> 4;
  if (groups == 0) return cudaSuccess;
  const int64_t blocks = (groups + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  if (p.dtype == kF32) {
    RhtKernel<float><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  } else {
    RhtKernel<__nv_bfloat16><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchNoOp(cudaStream_t s) {
  NoOpKernel<<<1, 1, 0, s>>>();
  return cudaGetLastError();
}

const void* ElementwiseModule() { return reinterpret_cast<const void*>(&NoOpKernel); }

cudaError_t LaunchGemmAlpha(const float* global_a, const float* global_b, bool mx, float* alpha,
                            cudaStream_t s) {
  GemmAlphaKernel<<<1, 1, 0, s>>>(global_a, global_b, mx, alpha);
  return cudaGetLastError();
}

cudaError_t LaunchSwizzleScales(const uint8_t* plain, int64_t rows, int64_t scale_cols,
                                uint8_t* swizzled, cudaStream_t s) {
  const int64_t n = (rows + 127) / 128 * 128 * ((scale_cols + 3) / 4 * 4);
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidConfiguration;
  SwizzleScalesKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(plain, rows, scale_cols,
                                                                          swizzled);
  return cudaGetLastError();
}

namespace {

// Positive attribute `attr` of the current device, kept in `cache` (64 entries, one a device);
// `fallback` when the device or its attribute cannot be asked.
int CachedDeviceAttribute(cudaDeviceAttr attr, std::atomic<int>* cache, int fallback) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return fallback;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v > 0) return v;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0) {
    cudaGetLastError();
    return fallback;
  }
  cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace

int SmCount() {
  static std::atomic<int> cache[64];
  return CachedDeviceAttribute(cudaDevAttrMultiProcessorCount, cache, 132);
}

namespace {

// Whether environment variable `name` is exactly "0" (an A/B switch turned off).
bool SwitchedOff(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '0' && v[1] == '\0';
}

}  // namespace

bool StepPdl() {
  static const bool off = SwitchedOff("FP4Q_STEP_PDL");
  static std::atomic<int> cache[64];
  return !off && CachedDeviceAttribute(cudaDevAttrComputeCapabilityMajor, cache, 0) >= 9;
}

bool InlineTables() {
  static const bool off = SwitchedOff("FP4Q_STEP_INLINE_TABLE");
  return !off;
}

uint32_t RhtSignMask(int mode, uint64_t rht_seed) {
  if (mode == kRhtSeeded) return SrBits(0, SeedKeys{rht_seed}, 0).x & 0xFFFFu;
  return kDefaultRhtSigns;
}

}  // namespace fp4q::kernels::cuda
