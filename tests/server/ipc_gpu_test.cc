// Two-process CUDA IPC test: this process (the client) allocates GPU memory with the CUDA
// runtime, exports it with cudaIpcGetMemHandle, and a CUDA-enabled fp4qd (the server, a child
// process: --backend=cuda --allow_cuda_ipc) opens it, quantizes in place, and answers. Results
// must be bit-identical to the same requests sent inline; /metrics of that server is scraped.
// Skips, saying why, where no GPU is usable. Needs libfp4q_cuda.so beside fp4qd (or
// $FP4Q_CUDA_MODULE); $FP4QD_BINARY overrides which fp4qd runs.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "e2e_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::HasSubstr;

std::string Uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

double Metric(const std::string& text, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  absl::StatusOr<double> v = MetricValue(text, name, labels);
  EXPECT_TRUE(v.ok()) << name << ": " << v.status();
  return v.value_or(-1);
}

class IpcGpuTest : public ::testing::Test {
 protected:
  static constexpr size_t kRegionBytes = size_t{64} << 20;

  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no usable CUDA device ("
                   << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")
                   << "): the CUDA IPC path runs on a GPU machine only";
    }
    auto p = ServerProcess::Start({"--backend=cuda", "--allow_cuda_ipc", "--cuda_ipc_over_tcp",
                                       "--session_lease_s=2"});
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
    stub_ = server_->Stub();
    v1::ServerInfoReply info;
    auto ctx = Context();
    ASSERT_TRUE(stub_->ServerInfo(ctx.get(), v1::ServerInfoRequest(), &info).ok());
    ASSERT_EQ(info.backend(), "cuda") << server_->Log();
    ASSERT_GE(info.gpus_size(), 1);
    uuid_ = info.gpus(0).uuid();
    EXPECT_THAT(info.supported_modes(), ::testing::Contains("cuda_ipc"));
    // The same GPU in this process, by UUID (ordinals may differ between processes).
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop;
      CUDA_OK(cudaGetDeviceProperties(&prop, i));
      if (Uuid(prop.uuid) == uuid_) ordinal_ = i;
    }
    ASSERT_GE(ordinal_, 0) << "server GPU " << uuid_ << " is not visible here";
    CUDA_OK(cudaSetDevice(ordinal_));
    CUDA_OK(cudaMalloc(&base_, kRegionBytes));
    CUDA_OK(cudaMemset(base_, 0xEE, kRegionBytes));  // poison
    cudaIpcMemHandle_t h;
    CUDA_OK(cudaIpcGetMemHandle(&h, base_));
    handle_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    session_ = OpenSession();
    region_ = Register(session_, handle_, kRegionBytes);
    ASSERT_FALSE(region_.empty());
  }
  void TearDown() override {
    if (base_ != nullptr) cudaFree(base_);
  }

  std::string OpenSession() {
    v1::OpenSessionReply rep;
    auto ctx = Context();
    grpc::Status s = stub_->OpenSession(ctx.get(), v1::OpenSessionRequest(), &rep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return rep.session_id();
  }
  std::string Register(const std::string& session, const std::string& handle, uint64_t size,
                       grpc::Status* status = nullptr) {
    v1::RegisterCudaRegionRequest req;
    req.set_ipc_handle(handle);
    req.set_size(size);
    req.set_device_uuid(uuid_);
    v1::RegisterCudaRegionReply rep;
    auto ctx = Context(session);
    grpc::Status s = stub_->RegisterCudaRegion(ctx.get(), req, &rep);
    if (status != nullptr)
      *status = s;
    else
      EXPECT_TRUE(s.ok()) << s.error_message();
    return rep.region_id();
  }
  void Put(uint64_t offset, const std::string& bytes) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(base_) + offset, bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::string Get(uint64_t offset, size_t n) {
    std::string out(n, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), static_cast<char*>(base_) + offset, n, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
  v1::OutputTarget Target(uint64_t offset) {
    v1::OutputTarget t;
    t.mutable_region()->set_region_id(region_);
    t.mutable_region()->set_offset(offset);
    return t;
  }
  std::string Metrics() {
    auto text = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.value_or("");
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Fp4q::Stub> stub_;
  std::string uuid_;
  int ordinal_ = -1;
  void* base_ = nullptr;
  std::string handle_;
  std::string session_;
  std::string region_;
};

TEST_F(IpcGpuTest, QuantizeInPlaceIsBitIdenticalToInline) {
  struct Shape {
    int64_t rows, cols;
    v1::DType dtype;
    v1::Outputs outputs;
  };
  for (const Shape& sh : {Shape{1024, 4096, v1::DTYPE_BF16, v1::OUTPUTS_ROWWISE},
                          Shape{256, 512, v1::DTYPE_F32, v1::OUTPUTS_BOTH}}) {
    SCOPED_TRACE(absl::StrCat(sh.rows, "x", sh.cols));
    const int64_t n = sh.rows * sh.cols;
    const std::string x =
        sh.dtype == v1::DTYPE_BF16 ? RandomBF16(n, 1, 3.0f) : RandomF32(n, 1, 3.0f);
    const uint64_t codes_at = 16 << 20, scales_at = 24 << 20, ccodes_at = 32 << 20,
                   cscales_at = 40 << 20;
    CUDA_OK(cudaMemset(base_, 0xEE, kRegionBytes));  // poison again for this shape
    Put(0, x);
    v1::QuantizeRequest ipc;
    *ipc.mutable_input() = RegionTensor(region_, 0, sh.rows, sh.cols, sh.dtype);
    ipc.mutable_options()->set_outputs(sh.outputs);
    *ipc.mutable_rowwise_codes() = Target(codes_at);
    *ipc.mutable_rowwise_scales() = Target(scales_at);
    if (sh.outputs == v1::OUTPUTS_BOTH) {
      *ipc.mutable_columnwise_codes() = Target(ccodes_at);
      *ipc.mutable_columnwise_scales() = Target(cscales_at);
    }
    v1::QuantizeReply by_region;
    auto ctx = Context(session_);
    grpc::Status s = stub_->Quantize(ctx.get(), ipc, &by_region);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(by_region.header().backend(), "cuda");
    EXPECT_EQ(by_region.header().device_uuid(), uuid_);
    EXPECT_TRUE(by_region.rowwise().codes().empty());
    EXPECT_EQ(by_region.rowwise().codes_region().offset(), codes_at);

    v1::QuantizeRequest inl;
    *inl.mutable_input() = InlineTensor(x, sh.rows, sh.cols, sh.dtype);
    inl.mutable_options()->set_outputs(sh.outputs);
    v1::QuantizeReply inline_rep;
    auto ictx = Context();
    s = stub_->Quantize(ictx.get(), inl, &inline_rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // The reply means the server's GPU work on our memory is complete: read it right away.
    EXPECT_TRUE(Get(codes_at, inline_rep.rowwise().codes().size()) == inline_rep.rowwise().codes());
    EXPECT_TRUE(Get(scales_at, inline_rep.rowwise().scales().size()) ==
                inline_rep.rowwise().scales());
    EXPECT_EQ(by_region.rowwise().global_amax(), inline_rep.rowwise().global_amax());
    EXPECT_EQ(by_region.rowwise().s_enc(), inline_rep.rowwise().s_enc());
    EXPECT_EQ(static_cast<uint8_t>(Get(codes_at + inline_rep.rowwise().codes().size(), 1)[0]), 0xEE)
        << "wrote past the codes";
    if (sh.outputs == v1::OUTPUTS_BOTH) {
      EXPECT_TRUE(Get(ccodes_at, inline_rep.columnwise().codes().size()) ==
                  inline_rep.columnwise().codes());
      EXPECT_TRUE(Get(cscales_at, inline_rep.columnwise().scales().size()) ==
                  inline_rep.columnwise().scales());
    }
    // And both equal the CPU backend (the backends' bit-exactness contract for quantization).
    kernels::QuantizeOptions o;
    o.columnwise = sh.outputs == v1::OUTPUTS_BOTH;
    const RefQuantize cpu =
        CpuQuantize(x, sh.dtype == v1::DTYPE_BF16 ? kernels::DType::kBF16 : kernels::DType::kF32,
                    sh.rows, sh.cols, o);
    ASSERT_TRUE(cpu.status.ok());
    EXPECT_TRUE(inline_rep.rowwise().codes() == cpu.rowwise.codes);
    EXPECT_TRUE(inline_rep.rowwise().scales() == cpu.rowwise.scales);
  }
}

TEST_F(IpcGpuTest, QdqInPlaceDequantizeAndUpdateFromRegions) {
  const int64_t rows = 128, cols = 256, n = rows * cols;
  const std::string x = RandomF32(n, 2);
  Put(0, x);
  v1::QdqRequest q;
  *q.mutable_input() = RegionTensor(region_, 0, rows, cols);
  *q.mutable_out() = Target(0);  // in place
  v1::QdqReply qr;
  auto ctx = Context(session_);
  grpc::Status s = stub_->Qdq(ctx.get(), q, &qr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::QdqRequest qi;
  *qi.mutable_input() = InlineTensor(x, rows, cols);
  v1::QdqReply qir;
  auto ictx = Context();
  ASSERT_TRUE(stub_->Qdq(ictx.get(), qi, &qir).ok());
  EXPECT_TRUE(Get(0, n * 4) == qir.output().inline_data());
  EXPECT_EQ(qr.global_amax(), qir.global_amax());

  // Dequantize from regions into a region.
  v1::QuantizeRequest quant;
  *quant.mutable_input() = InlineTensor(x, rows, cols);
  v1::QuantizeReply quant_rep;
  auto qctx = Context();
  ASSERT_TRUE(stub_->Quantize(qctx.get(), quant, &quant_rep).ok());
  Put(1 << 20, quant_rep.rowwise().codes());
  Put(2 << 20, quant_rep.rowwise().scales());
  v1::DequantizeRequest d;
  v1::QuantizedTensor* t = d.mutable_input()->mutable_tensor();
  *t = quant_rep.rowwise();
  t->mutable_codes_region()->set_region_id(region_);
  t->mutable_codes_region()->set_offset(1 << 20);
  t->mutable_scales_region()->set_region_id(region_);
  t->mutable_scales_region()->set_offset(2 << 20);
  *d.mutable_out() = Target(4 << 20);
  v1::DequantizeReply dr;
  auto dctx = Context(session_);
  s = stub_->Dequantize(dctx.get(), d, &dr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::DequantizeRequest di;
  *di.mutable_input()->mutable_tensor() = quant_rep.rowwise();
  v1::DequantizeReply dir;
  auto dictx = Context();
  ASSERT_TRUE(stub_->Dequantize(dictx.get(), di, &dir).ok());
  EXPECT_TRUE(Get(4 << 20, n * 4) == dir.output().inline_data());

  // A stored weight updated from a region, its new value written into a region.
  v1::CreateWeightRequest cw;
  cw.set_name("gpu/w");
  *cw.mutable_initial() = InlineTensor(x, rows, cols);
  cw.mutable_options()->set_error_feedback(true);
  v1::CreateWeightReply cwr;
  auto cctx = Context();
  ASSERT_TRUE(stub_->CreateWeight(cctx.get(), cw, &cwr).ok());
  EXPECT_EQ(cwr.weight().device_uuid(), uuid_);
  const std::string g = RandomF32(n, 3, 0.1f);
  Put(8 << 20, g);
  v1::UpdateWeightRequest u;
  u.set_name("gpu/w");
  u.set_step(1);
  u.set_lr(0.5f);
  *u.mutable_update() = RegionTensor(region_, 8 << 20, rows, cols);
  *u.mutable_dequantized_out() = Target(12 << 20);
  v1::UpdateWeightReply ur;
  auto uctx = Context(session_);
  s = stub_->UpdateWeight(uctx.get(), u, &ur);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(ur.applied());
  v1::GetWeightRequest gw;
  gw.set_name("gpu/w");
  gw.set_dequantized(true);
  v1::GetWeightReply gwr;
  auto gctx = Context();
  ASSERT_TRUE(stub_->GetWeight(gctx.get(), gw, &gwr).ok());
  EXPECT_TRUE(Get(12 << 20, n * 4) == gwr.dequantized().inline_data());
}

TEST_F(IpcGpuTest, BoundsSessionsHandlesAndMetrics) {
  v1::QuantizeRequest r;
  *r.mutable_input() = RegionTensor(region_, kRegionBytes - 64, 2, 16);  // 128 bytes: 64 over
  v1::QuantizeReply rep;
  auto c1 = Context(session_);
  grpc::Status s = stub_->Quantize(c1.get(), r, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("input.region.offset: 67108800 + 128 bytes is past"));
  *r.mutable_input() = RegionTensor(region_, std::numeric_limits<uint64_t>::max() - 15, 2, 16);
  auto c2 = Context(session_);
  s = stub_->Quantize(c2.get(), r, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("18446744073709551600 + 128 bytes is past"));
  // Another session's region reads exactly like an unknown one.
  const std::string other = OpenSession();
  *r.mutable_input() = RegionTensor(region_, 0, 2, 16);
  auto c3 = Context(other);
  grpc::Status foreign = stub_->Quantize(c3.get(), r, &rep);
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND);
  // The same handle registered again (by the other session) reuses the open mapping.
  const std::string again = Register(other, handle_, 4096);
  ASSERT_FALSE(again.empty());
  grpc::Status bad;
  Register(other, handle_.substr(0, 60), 4096, &bad);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("ipc_handle: 60 bytes, expected 64"));

  std::string text = Metrics();
  EXPECT_EQ(Metric(text, "fp4q_build_info", {{"backend", "cuda"}, {"version", "0.1.0"}}), 1);
  EXPECT_EQ(Metric(text, "fp4q_cuda_regions"), 2);
  EXPECT_EQ(Metric(text, "fp4q_cuda_open_handles"), 1);
  EXPECT_EQ(Metric(text, "fp4q_cuda_handle_opens_total"), 1);
  EXPECT_EQ(Metric(text, "fp4q_sessions"), 2);
  EXPECT_EQ(Metric(text, "fp4q_queue_capacity", {{"device", uuid_}}), 64);
  EXPECT_EQ(Metric(text, "fp4q_requests_total", {{"rpc", "Quantize"}, {"code", "NOT_FOUND"}}), 1);

  // Unregister (the other session's), then let both leases lapse (2 s): everything released.
  v1::UnregisterCudaRegionRequest un;
  un.set_region_id(again);
  v1::UnregisterCudaRegionReply unr;
  auto c4 = Context(other);
  ASSERT_TRUE(stub_->UnregisterCudaRegion(c4.get(), un, &unr).ok());
  text = Metrics();
  EXPECT_EQ(Metric(text, "fp4q_cuda_regions"), 1);
  EXPECT_EQ(Metric(text, "fp4q_cuda_open_handles"), 1);
  bool released = false;
  for (int i = 0; i < 100 && !released; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    text = Metrics();
    released = Metric(text, "fp4q_cuda_regions") == 0 &&
               Metric(text, "fp4q_cuda_open_handles") == 0 && Metric(text, "fp4q_sessions") == 0;
  }
  EXPECT_TRUE(released) << text;
  auto c5 = Context(session_);
  s = stub_->Quantize(c5.get(), r, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << "the lapsed session's region is gone";
  EXPECT_GE(Metric(text, "fp4q_kernel_duration_seconds_count", {{"op", "quantize"}}), 0);
}

}  // namespace
}  // namespace fp4q::server::testing
