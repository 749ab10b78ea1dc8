// What the engine reports about itself (implemented by the Prometheus metrics in metrics.h; the
// engine knows nothing of Prometheus). Every method may be called from any thread; the default
// implementations do nothing. Labels never carry tensor names or region ids.
#ifndef FP4Q_SERVER_OBSERVER_H_
#define FP4Q_SERVER_OBSERVER_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace fp4q::server {

// What became of a step that asked for one pass: it ran in one ("one_pass"), or in two because
// of an item one pass does not take ("items"), a retried item ("retry"), weights on several
// devices ("devices"), no room in the state budget for a weight's second copy ("budget"), or
// no device memory for it ("memory").
inline constexpr const char* kOnePassOutcomes[] = {"one_pass", "items",  "retry",
                                                   "devices",  "budget", "memory"};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;

  // A kernel op ("amax", "quantize", "dequantize", "qdq", "matmul", "update_weight") ran on
  // `device` (GPU UUID or "cpu") for `seconds` (including the stream synchronization that ends
  // it).
  virtual void KernelDuration(absl::string_view /*device*/, absl::string_view /*op*/,
                              double /*seconds*/) {}
  // Per-device executor queue (device = GPU UUID or "cpu").
  virtual void QueueDepth(absl::string_view /*device*/, int64_t /*depth*/) {}
  virtual void QueueCapacity(absl::string_view /*device*/, int64_t /*capacity*/) {}
  virtual void QueueRejected(absl::string_view /*device*/) {}
  // A request waited `seconds` in the device's executor queue before its work started.
  virtual void QueueWait(absl::string_view /*device*/, double /*seconds*/) {}
  // A busy-polling worker of the device picked up a request without a thread wake-up.
  virtual void SpinPickup(absl::string_view /*device*/) {}
  // Sessions and CUDA IPC.
  virtual void Sessions(int64_t /*open*/) {}
  virtual void CudaRegions(int64_t /*registered*/) {}
  virtual void CudaOpenHandles(int64_t /*open*/) {}
  virtual void CudaHandleOpened() {}
  // State: tensors per device and kind ("weight", "residual"), bytes per device, the budget.
  virtual void StateTensors(absl::string_view /*device*/, absl::string_view /*kind*/,
                            int64_t /*count*/) {}
  virtual void StateBytes(absl::string_view /*device*/, int64_t /*bytes*/) {}
  virtual void StateBudget(uint64_t /*bytes*/) {}
  // A duplicate UpdateWeight step answered applied=false.
  virtual void UpdateNotApplied() {}
  // A step (one device's part of it) that asked for one pass (StepRequest.one_pass): `outcome`
  // is one of kOnePassOutcomes.
  virtual void StepOnePass(absl::string_view /*outcome*/) {}
  // Quantization quality of a sampled request.
  virtual void Quality(double /*sqnr_db*/, double /*clipped_ratio*/, double /*underflow_ratio*/) {}
  // A checkpoint attempt finished.
  virtual void CheckpointFinished(bool /*ok*/, double /*seconds*/, absl::Time /*when*/) {}
};

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_OBSERVER_H_
