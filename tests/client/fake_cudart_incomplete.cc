// A "libcudart" lacking most of the calls CudaIpc needs, to test Load's missing-symbol error.
extern "C" {
const char* cudaGetErrorName(int) { return "cudaErrorUnknown"; }
const char* cudaGetErrorString(int) { return "fake"; }
}
