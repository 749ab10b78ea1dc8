// Measurement helpers of fp4q_bench; see bench_util.h.
#include "bench_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fp4q::bench {

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "fp4q_bench: %s: %s (%s)\n", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
  std::exit(1);
}

void CheckBlas(cublasStatus_t e, const char* what) {
  if (e == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "fp4q_bench: %s: %s\n", what, cublasLtGetStatusString(e));
  std::exit(1);
}

Timing TimeEvents(cudaStream_t s, int warmup, int iters, const std::function<void(int)>& fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  Check(cudaStreamSynchronize(s), "warm-up");
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) Check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    Check(cudaEventRecord(ev[2 * i], s), "cudaEventRecord");
    fn(warmup + i);
    Check(cudaEventRecord(ev[2 * i + 1], s), "cudaEventRecord");
  }
  Check(cudaStreamSynchronize(s), "timed runs");
  std::vector<double> us(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    us[i] = ms * 1000.0;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  Timing t;
  t.iters = iters;
  t.median_us = us[iters / 2];
  t.min_us = us.front();
  t.max_us = us.back();
  return t;
}

double WallPerCallUs(cudaStream_t s, int calls, const std::function<void(int)>& fn,
                     double* enqueue_us) {
  for (int i = 0; i < 50; ++i) fn(i);
  Check(cudaStreamSynchronize(s), "warm-up");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn(i);
  const auto queued = std::chrono::steady_clock::now();
  Check(cudaStreamSynchronize(s), "calls");
  const auto t1 = std::chrono::steady_clock::now();
  if (enqueue_us != nullptr) {
    *enqueue_us = std::chrono::duration<double, std::micro>(queued - t0).count() / calls;
  }
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

DevMem::DevMem(size_t bytes) : bytes_(bytes) { Check(cudaMalloc(&p_, bytes), "cudaMalloc"); }
DevMem::~DevMem() { cudaFree(p_); }

namespace {

// splitmix64-driven Box-Muller: fast enough for a few hundred million values.
struct Gen {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Normal() {
    const uint64_t r = Next();
    const double u1 = ((r >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = (Next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

}  // namespace

namespace {

// Runs fn(begin, end) over [0, n) in chunks of kChunk elements on the machine's threads. The
// values depend on the chunk, never on the thread, so a (size, seed) gives the same data on
// every machine. (Box-Muller takes about 40 ns a value: one thread took 5.4 s for GPT-2's
// 124M parameters, three arrays a weight and the step rows build each model's seven times.)
constexpr size_t kChunk = size_t{1} << 20;
template <typename Fn>
void ForEachChunk(size_t n, Fn fn) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const size_t threads = std::min<size_t>(
      chunks, std::max<size_t>(1, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) {
      fn(c, c * kChunk, std::min(n, (c + 1) * kChunk));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace

std::vector<float> RandomF32(size_t n, uint64_t seed, float sigma) {
  std::vector<float> v(n);
  ForEachChunk(n, [&](size_t chunk, size_t begin, size_t end) {
    Gen g{seed * 0x2545F4914F6CDD1Dull + 1 + chunk * 0xD1B54A32D192ED03ull};
    for (size_t i = begin; i < end; ++i) {
      float x = g.Normal() * sigma;
      if ((g.s & 1023) == 7) x *= 50.0f;  // occasional outliers
      v[i] = x;
    }
  });
  return v;
}

std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed, float sigma) {
  const std::vector<float> f = RandomF32(n, seed, sigma);
  std::vector<uint16_t> out(n);
  ForEachChunk(n, [&](size_t, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      uint32_t u;
      std::memcpy(&u, &f[i], 4);
      u += 0x7FFFu + ((u >> 16) & 1u);
      out[i] = static_cast<uint16_t>(u >> 16);
    }
  });
  return out;
}

// ---------------------------------------------------------------- cuBLAS baseline

CublasBf16Gemm::CublasBf16Gemm(int64_t m, int64_t n, int64_t k) {
  CheckBlas(cublasLtCreate(&h_), "cublasLtCreate");
  CheckBlas(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  CheckBlas(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "ta");
  CheckBlas(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)),
            "tb");
  // Row-major C = A B^T as column-major C^T = B^T' A' (see kernels/src/cuda/blas_lt.cc).
  CheckBlas(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, k, n, k), "la");
  CheckBlas(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, k, m, k), "lb");
  CheckBlas(cublasLtMatrixLayoutCreate(&lc_, CUDA_R_16BF, n, m, n), "lc");
  cublasLtMatmulPreference_t pref;
  CheckBlas(cublasLtMatmulPreferenceCreate(&pref), "pref");
  CheckBlas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes_, sizeof(ws_bytes_)),
            "pref ws");
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  CheckBlas(cublasLtMatmulAlgoGetHeuristic(h_, op_, la_, lb_, lc_, lc_, pref, 1, &res, &found),
            "heuristic");
  if (found == 0) {
    std::fprintf(stderr, "fp4q_bench: cuBLASLt has no bf16 algorithm\n");
    std::exit(1);
  }
  algo_ = res.algo;
  cublasLtMatmulPreferenceDestroy(pref);
  Check(cudaMalloc(&ws_, ws_bytes_), "workspace");
}

CublasBf16Gemm::~CublasBf16Gemm() {
  cudaFree(ws_);
  cublasLtMatrixLayoutDestroy(lc_);
  cublasLtMatrixLayoutDestroy(lb_);
  cublasLtMatrixLayoutDestroy(la_);
  cublasLtMatmulDescDestroy(op_);
  cublasLtDestroy(h_);
}

void CublasBf16Gemm::Run(const void* a, const void* b, void* c, cudaStream_t s) {
  const float alpha = 1.0f, beta = 0.0f;
  CheckBlas(cublasLtMatmul(h_, op_, &alpha, b, la_, a, lb_, &beta, c, lc_, c, lc_, &algo_, ws_,
                           ws_bytes_, s),
            "cublasLtMatmul");
}

// ---------------------------------------------------------------- records

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool Met(const Row& r, double copy_gbps) {
  const double gbps = r.bytes > 0 ? r.bytes / r.us / 1e3 : 0;
  if (r.target_kind == "copy_fraction") return gbps >= r.target_value * copy_gbps;
  if (r.target_kind == "max_us") return r.us <= r.target_value;
  if (r.target_kind == "speedup_vs_cublas") return r.baseline_us / r.us >= r.target_value;
  if (r.target_kind == "throughput_vs_cublas") return r.baseline_us / r.us >= r.target_value;
  return false;
}

bool WriteJson(const std::string& path, const std::string& header_json, double copy_gbps,
               const std::vector<Row>& rows) {
  std::string j = "{\n" + header_json + ",\n  \"copy_gbps\": " + absl::StrFormat("%.1f", copy_gbps) +
                  ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double gbps = r.bytes > 0 ? r.bytes / r.us / 1e3 : 0;
    j += absl::StrCat(
        "    {\"name\": ", Json(r.name), ", \"shape\": ", Json(r.shape),
        ", \"us\": ", absl::StrFormat("%.2f", r.us), ", \"bytes\": ", absl::StrFormat("%.0f", r.bytes),
        ", \"gbps\": ", absl::StrFormat("%.1f", gbps),
        ", \"tflops\": ", absl::StrFormat("%.2f", r.flops > 0 ? r.flops / r.us / 1e6 : 0),
        ", \"ratio_vs_copy\": ", absl::StrFormat("%.3f", gbps > 0 ? gbps / copy_gbps : 0),
        ", \"cublas_us\": ", absl::StrFormat("%.2f", r.baseline_us),
        ", \"ratio_vs_cublas\": ",
        absl::StrFormat("%.3f", r.baseline_us > 0 ? r.baseline_us / r.us : 0),
        ", \"target\": ", Json(r.target), ", \"met\": ",
        r.target_kind.empty() ? "null" : (Met(r, copy_gbps) ? "true" : "false"),
        ", \"note\": ", Json(r.note), "}", i + 1 < rows.size() ? ",\n" : "\n");
  }
  j += "  ]\n}\n";
  std::ofstream f(path);
  f << j;
  return static_cast<bool>(f);
}

std::string MarkdownTable(double copy_gbps, const std::vector<Row>& rows) {
  std::string t = absl::StrFormat(
      "| operation | shape | us | GB/s | vs copy | TFLOP/s | vs cuBLAS | target | met |\n"
      "|---|---|---|---|---|---|---|---|---|\n| device copy (ceiling) | 2 GiB | | %.0f | 1.00 | | | | |\n",
      copy_gbps);
  for (const Row& r : rows) {
    const double gbps = r.bytes > 0 ? r.bytes / r.us / 1e3 : 0;
    t += absl::StrFormat(
        "| %s | %s | %.2f | %s | %s | %s | %s | %s | %s |\n", r.name, r.shape, r.us,
        gbps > 0 ? absl::StrFormat("%.0f", gbps) : "",
        gbps > 0 ? absl::StrFormat("%.2f", gbps / copy_gbps) : "",
        r.flops > 0 ? absl::StrFormat("%.1f", r.flops / r.us / 1e6) : "",
        r.baseline_us > 0 ? absl::StrFormat("%.2fx (%.1f us)", r.baseline_us / r.us, r.baseline_us)
                          : "",
        r.target, r.target_kind.empty() ? "" : (Met(r, copy_gbps) ? "yes" : "**no**"));
  }
  return t;
}

}  // namespace fp4q::bench
