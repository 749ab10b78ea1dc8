// What blocks the calling host thread when it is queued on a stream behind a device-side wait
// (cuStreamWaitValue32 on a mapped host word that a helper thread writes 1.5 s later)? fp4qd
// queues a step behind such a wait while the worker's backward pass runs, so any call on that
// path that blocks until the word is written stalls its device worker. One case per run:
//   ./probe_blocking_check CASE      (a time near 1500 ms means the call blocked)
// lazy / lazy2: a kernel's first launch (lazy loading) / its second; loaded: after every kernel
// of the module was loaded (cuModuleEnumerateFunctions + cuFuncLoad, as the CUDA backend does);
// gfunc / fattr: after cudaGetFuncBySymbol / cudaFuncGetAttributes alone; attr: the dynamic
// shared memory attribute and an occupancy query, then a launch; halloc, malloc, free, fhost:
// cudaHostAlloc, cudaMalloc, cudaFree, cudaFreeHost; memset, cpypin, cpypage: a memset, a copy
// from pinned and from pageable memory on the waiting stream; event: an event recorded and
// queried; write: cuStreamWriteValue32; olazy / oload: a kernel on another stream, lazy or loaded.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
namespace {
__global__ void A() {}
}  // namespace
template <int N>
__global__ void K(int* p) {
  if (p) p[0] = N;
}
__global__ void B(int* p) {
  extern __shared__ int s[];
  if (p) p[0] = s[0];
}
__global__ void C(int* p) {
  if (p) p[1] = 2;
}
typedef std::chrono::steady_clock clk;
#define T(x) (!strcmp(t, x))
int load(const void* a) {
  cudaFunction_t f;
  CUmodule m;
  unsigned n;
  int r = cudaGetFuncBySymbol(&f, a);
  r |= cuFuncGetModule(&m, (CUfunction)f);
  r |= cuModuleGetFunctionCount(&n, m);
  std::vector<CUfunction> v(n);
  r |= cuModuleEnumerateFunctions(v.data(), n, m);
  for (auto x : v) r |= cuFuncLoad(x);
  printf("loaded %u r=%d\n", n, r);
  return r;
}
int main(int c, char** v) {
  const char* t = v[1];
  cudaSetDevice(0);
  cudaFree(0);
  cudaStream_t s, s2;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  volatile unsigned* w;
  cudaHostAlloc((void**)&w, 16, cudaHostAllocMapped);
  *w = 0;
  void* d;
  cudaMalloc(&d, 1 << 20);
  void* pin;
  cudaHostAlloc(&pin, 1 << 20, 0);
  void* pg = malloc(1 << 20);
  if (T("loaded") || T("attr") || T("oload")) load((const void*)A);
  if (T("lazy2")) K<2><<<1, 32>>>((int*)d);
  if (T("gfunc")) {
    cudaFunction_t f;
    cudaGetFuncBySymbol(&f, (const void*)K<1>);
  }
  if (T("fattr")) {
    cudaFuncAttributes a;
    cudaFuncGetAttributes(&a, K<1>);
  }
  cudaDeviceSynchronize();
  std::thread h([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    *w = 1;
  });
  CUdeviceptr dw;
  cudaHostGetDevicePointer((void**)&dw, (void*)w, 0);
  int r = cuStreamWaitValue32(s, dw, 1, CU_STREAM_WAIT_VALUE_GEQ);
  auto t0 = clk::now();
  int e = 0;
  if (T("lazy") || T("lazy2") || T("loaded") || T("gfunc") || T("fattr")) {
    K<1><<<1, 32, 0, s>>>((int*)d);
    e = cudaGetLastError();
  } else if (T("attr")) {
    e = cudaFuncSetAttribute(B, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
    int n;
    e |= cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, B, 256, 100000);
    B<<<1, 256, 100000, s>>>((int*)d);
    e |= cudaGetLastError();
  } else if (T("halloc")) {
    void* q;
    e = cudaHostAlloc(&q, 1 << 16, cudaHostAllocPortable);
  } else if (T("malloc")) {
    void* q;
    e = cudaMalloc(&q, 1 << 24);
  } else if (T("free")) {
    e = cudaFree(d);
  } else if (T("fhost")) {
    e = cudaFreeHost(pin);
  } else if (T("memset")) {
    e = cudaMemsetAsync(d, 0, 4096, s);
  } else if (T("cpypin")) {
    e = cudaMemcpyAsync(d, pin, 65536, cudaMemcpyHostToDevice, s);
  } else if (T("cpypage")) {
    e = cudaMemcpyAsync(d, pg, 65536, cudaMemcpyHostToDevice, s);
  } else if (T("event")) {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    e |= cudaEventRecord(ev, s);
    e |= (cudaEventQuery(ev) != cudaErrorNotReady);
  } else if (T("write")) {
    e = cuStreamWriteValue32(s, (CUdeviceptr)d, 5, 0);
  } else if (T("olazy") || T("oload")) {
    C<<<1, 1, 0, s2>>>((int*)d);
    e = cudaGetLastError();
  }
  double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
  h.join();
  int sy = cudaDeviceSynchronize();
  printf("%-12s wait=%d err=%d took %9.3f ms sync=%d\n", t, r, e, ms, sy);
}
