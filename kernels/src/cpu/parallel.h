// Independent pieces of one CPU backend call run on the host's cores. Only which thread runs a
// piece changes: each piece is computed by the same code as on one thread, so results do not
// depend on the thread count.
#ifndef FP4Q_KERNELS_CPU_PARALLEL_H_
#define FP4Q_KERNELS_CPU_PARALLEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace fp4q::kernels::cpu {

// Work below this many elements in all runs on the calling thread (starting threads would cost
// more than they save).
inline constexpr int64_t kParallelMinElements = int64_t{1} << 20;

// The threads a call may use: FP4Q_CPU_THREADS when set to a positive integer, else the host's
// hardware threads (at least 1).
int CpuThreads();

// Calls piece(i) once for every i in [0, sizes.size()), the largest sizes (element counts)
// first, on up to CpuThreads() threads, the calling one among them; returns when all are done.
void ForEachPiece(const std::vector<int64_t>& sizes, const std::function<void(size_t)>& piece);

}  // namespace fp4q::kernels::cpu

#endif  // FP4Q_KERNELS_CPU_PARALLEL_H_
