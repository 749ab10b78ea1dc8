// A "libcudart" lacking most of the calls CudaIpc needs, to test the missing-call error of
// CudaRuntime::Require through CudaIpc::Load.
extern "C" {
const char* cudaGetErrorName(int) { return "cudaErrorUnknown"; }
const char* cudaGetErrorString(int) { return "fake"; }
}
