// The optimizer step's state mirrored on the GPU backend (DeviceState: a StepState and its
// updates in device buffers, outputs poisoned) and the report comparison, for the CUDA step
// tests (cuda_step_test.cc, cuda_step_one_pass_test.cc).
#ifndef FP4Q_TESTS_KERNELS_CUDA_CUDA_STEP_UTIL_H_
#define FP4Q_TESTS_KERNELS_CUDA_CUDA_STEP_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/step.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/step_test_util.h"

namespace fp4q::kernels::cuda_testing {

using step_testing::MakeItem;
using step_testing::StepCase;
using step_testing::StepState;
using step_testing::Updates;

// ---------------------------------------------------------------- device mirror of a state

inline std::unique_ptr<DeviceBuffer> Up(Backend& gpu, const void* p, size_t bytes) {
  if (bytes == 0) return nullptr;
  auto b = std::make_unique<DeviceBuffer>(gpu, bytes);
  b->Upload(p, bytes);
  return b;
}

template <typename T>
inline std::unique_ptr<DeviceBuffer> Up(Backend& gpu, const std::vector<T>& v) {
  return Up(gpu, v.data(), v.size() * sizeof(T));
}

template <typename T>
inline void Down(const std::unique_ptr<DeviceBuffer>& b, std::vector<T>* v) {
  if (b == nullptr) return;
  *v = b->DownloadAs<T>();
}

struct DeviceQ {
  std::unique_ptr<DeviceBuffer> codes, scales, global;
};

inline DeviceQ UpQ(Backend& gpu, const step_testing::QBytes& q) {
  return DeviceQ{Up(gpu, q.codes), Up(gpu, q.scales), Up(gpu, q.global)};
}

inline void DownQ(const DeviceQ& d, step_testing::QBytes* q) {
  Down(d.codes, &q->codes);
  Down(d.scales, &q->scales);
  Down(d.global, &q->global);
}

// A StepState and its updates on the device; outputs poisoned there (kDevicePoison).
struct DeviceState {
  DeviceQ weight;
  std::unique_ptr<DeviceBuffer> residual, stats;
  std::unique_ptr<DeviceBuffer> m_dense[3];
  DeviceQ m_q[3];
  std::vector<std::unique_ptr<DeviceBuffer>> outs, updates;

  DeviceState(Backend& gpu, const StepState& st, const Updates& u) {
    weight = UpQ(gpu, st.weight);
    residual = Up(gpu, st.residual);
    stats = Up(gpu, st.stats);
    for (int j = 0; j < 3; ++j) {
      if (!st.m_f32[j].empty()) m_dense[j] = Up(gpu, st.m_f32[j]);
      if (!st.m_bf16[j].empty()) m_dense[j] = Up(gpu, st.m_bf16[j]);
      if (!st.m_q[j].codes.empty()) m_q[j] = UpQ(gpu, st.m_q[j]);
    }
    for (const auto& o : st.outs) outs.push_back(std::make_unique<DeviceBuffer>(gpu, o.size()));
    for (const auto& x : u) updates.push_back(Up(gpu, x));
  }

  // The item: the host item's shape and options with every pointer on the device.
  StepItem Item(const StepCase& c, StepState* host, const Updates& u) const {
    StepItem item = MakeItem(c, host, u);
    item.weight.codes = static_cast<uint8_t*>(weight.codes->get());
    item.weight.scales = static_cast<uint8_t*>(weight.scales->get());
    item.weight.global = static_cast<float*>(weight.global->get());
    item.residual = residual ? static_cast<float*>(residual->get()) : nullptr;
    item.stats = static_cast<float*>(stats->get());
    MomentTensor* m[3] = {&item.state.moment1, &item.state.moment2, &item.state.max_moment2};
    for (int j = 0; j < 3; ++j) {
      if (m_dense[j]) m[j]->dense = m_dense[j]->get();
      if (m_q[j].codes) {
        m[j]->quantized.codes = static_cast<uint8_t*>(m_q[j].codes->get());
        m[j]->quantized.scales = static_cast<uint8_t*>(m_q[j].scales->get());
        m[j]->quantized.global = static_cast<float*>(m_q[j].global->get());
      }
    }
    for (size_t k = 0; k < item.updates.size(); ++k) item.updates[k].data = updates[k]->get();
    for (size_t k = 0; k < item.dequantized_out.size(); ++k) {
      item.dequantized_out[k].data = outs[k]->get();
    }
    return item;
  }

  // The device bytes in the layout of `shape`.
  StepState Download(const StepState& shape) const {
    StepState st = shape;
    DownQ(weight, &st.weight);
    Down(residual, &st.residual);
    Down(stats, &st.stats);
    for (int j = 0; j < 3; ++j) {
      if (!st.m_f32[j].empty()) Down(m_dense[j], &st.m_f32[j]);
      if (!st.m_bf16[j].empty()) Down(m_dense[j], &st.m_bf16[j]);
      if (!st.m_q[j].codes.empty()) DownQ(m_q[j], &st.m_q[j]);
    }
    for (size_t k = 0; k < outs.size(); ++k) st.outs[k] = outs[k]->Download();
    return st;
  }
};

inline bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}
inline bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 8) == 0;
}

inline ::testing::AssertionResult SameReport(const StepReport& g, const StepReport& c) {
  if (g.ok != c.ok) return ::testing::AssertionFailure() << "ok " << g.ok << " vs " << c.ok;
  if (g.items.size() != c.items.size()) return ::testing::AssertionFailure() << "item count";
  for (size_t i = 0; i < g.items.size(); ++i) {
    const StepItemReport& a = g.items[i];
    const StepItemReport& b = c.items[i];
    if (a.outcome != b.outcome || a.quantity != b.quantity || a.rank != b.rank ||
        a.index != b.index || !SameFloat(a.value, b.value) || !SameFloat(a.amax, b.amax) ||
        !SameDouble(a.bound, b.bound)) {
      return ::testing::AssertionFailure()
             << "items[" << i << "]: gpu {outcome " << static_cast<int>(a.outcome) << ", quantity "
             << static_cast<int>(a.quantity) << ", rank " << a.rank << ", index " << a.index
             << ", value " << a.value << ", amax " << a.amax << ", bound " << a.bound
             << "} cpu {outcome " << static_cast<int>(b.outcome) << ", quantity "
             << static_cast<int>(b.quantity) << ", rank " << b.rank << ", index " << b.index
             << ", value " << b.value << ", amax " << b.amax << ", bound " << b.bound << "}";
    }
  }
  if (g.fingerprints != c.fingerprints) return ::testing::AssertionFailure() << "fingerprints";
  return ::testing::AssertionSuccess();
}

}  // namespace fp4q::kernels::cuda_testing

#endif  // FP4Q_TESTS_KERNELS_CUDA_CUDA_STEP_UTIL_H_
