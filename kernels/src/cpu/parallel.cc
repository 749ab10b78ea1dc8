// See parallel.h.
#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <numeric>
#include <system_error>
#include <thread>

namespace fp4q::kernels::cpu {

int CpuThreads() {
  static const int threads = [] {
    if (const char* env = std::getenv("FP4Q_CPU_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v > 0 && v <= 4096) return static_cast<int>(v);
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }();
  return threads;
}

void ForEachPiece(const std::vector<int64_t>& sizes, const std::function<void(size_t)>& piece) {
  const size_t n = sizes.size();
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const size_t threads =
      total < kParallelMinElements ? 1 : std::min(n, static_cast<size_t>(CpuThreads()));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) piece(i);
    return;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t k = next.fetch_add(1); k < n; k = next.fetch_add(1)) piece(order[k]);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had (a process or cgroup limit): fewer do the pieces
    }
  }
  work();
  for (std::thread& h : helpers) h.join();
}

}  // namespace fp4q::kernels::cpu
