// A stand-in for libfp4q_cuda.so to test the loader (cuda_module.h) without CUDA: built as
// several MODULE libraries with FAKE_ABI (the ABI version it reports) and FAKE_DEVICES (its
// device count; negative: no driver). Device 1 fails to create; others get a CPU backend.
#include <cstdio>

#include "fp4q/kernels/backend.h"
#include "fp4q/kernels/cuda_module.h"

extern "C" {

int fp4q_cuda_abi_version(void) { return FAKE_ABI; }

int fp4q_cuda_device_count(char* err, size_t err_len) {
  if (FAKE_DEVICES < 0) {
    std::snprintf(err, err_len, "fake: CUDA driver version is insufficient");
    return -1;
  }
  return FAKE_DEVICES;
}

fp4q::kernels::Backend* fp4q_cuda_create_backend(int ordinal, const fp4q_cuda_options* /*options*/,
                                                 char* err, size_t err_len) {
  if (ordinal == 1) {
    std::snprintf(err, err_len, "fake: device 1 is unusable");
    return nullptr;
  }
  return fp4q::kernels::CreateCpuBackend().release();
}

}  // extern "C"
