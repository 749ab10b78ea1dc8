// Several GPUs behind one fp4qd. This process (the client) allocates memory on
// two GPUs with the CUDA runtime and exports it by CUDA IPC; a CUDA fp4qd child
// (--backend=cuda --allow_cuda_ipc) serves every visible GPU. Checked:
//   - ServerInfo lists every GPU, with distinct UUIDs that this process sees
//   too;
//   - Quantize / QDQ / Matmul on memory of GPU 0 and of GPU 1 run on that GPU
//   (reply header) and
//     equal the CPU backend (quantized bytes and QDQ bit for bit; Matmul within
//     its stated tolerance, and bit-identical between the two GPUs for the same
//     operands);
//   - a weight created on GPU 1 stays there and its updates equal a CPU
//   fp4qd's;
//   - a request mixing the GPUs is INVALID_ARGUMENT naming both fields and
//   devices, as is a
//     region registered with the wrong device_uuid;
//   - both GPUs serve concurrently: the per-device counters of /metrics both
//   grow.
// Skips, saying why, when fewer than two GPUs are usable. Needs libfp4q_cuda.so
// beside fp4qd (or $FP4Q_CUDA_MODULE); $FP4QD_BINARY overrides which fp4qd
// runs.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "e2e_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fp4q::server::testing {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

std::string Uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%"
      "02x",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

const char* CodeName(const grpc::Status& s) {
  return s.ok()                                                 ? "OK"
         : s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? "INVALID_ARGUMENT"
                                                                : "other error:";
}

// Relative Frobenius error of f32 `got` against f32 `want`.
double RelError(const std::string& got, const std::string& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i + 4 <= got.size(); i += 4) {
    float g, w;
    std::memcpy(&g, got.data() + i, 4);
    std::memcpy(&w, want.data() + i, 4);
    num += (double{g} - w) * (double{g} - w);
    den += double{w} * w;
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

// Matmul's stated tolerance against the CPU reference (cuda_matmul.cc), f32
// output.
constexpr double kMatmulTolerance = 1e-5;

class MultiGpuIpcTest : public ::testing::Test {
 protected:
  static constexpr size_t kRegionBytes = size_t{64} << 20;
  struct Gpu {
    std::string uuid;
    int ordinal = -1;  // in this process
    void* base = nullptr;
    std::string handle;
    std::string region;
  };

  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      GTEST_SKIP() << "no usable CUDA device (" << cudaGetErrorString(e)
                   << "): the multi-GPU test needs at least 2 GPUs";
    }
    if (count < 2) {
      GTEST_SKIP() << count << " CUDA device visible: the multi-GPU test needs at least 2 "
                   << "(check CUDA_VISIBLE_DEVICES)";
    }
    seed_ = std::random_device{}();
    RecordProperty("seed", std::to_string(seed_));
    auto p = ServerProcess::Start({"--backend=cuda", "--allow_cuda_ipc", "--cuda_ipc_over_tcp"});
    ASSERT_TRUE(p.ok()) << p.status();
    server_ = std::move(*p);
    stub_ = server_->Stub();
    auto ctx = Context();
    grpc::Status s = stub_->ServerInfo(ctx.get(), v1::ServerInfoRequest(), &info_);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(info_.backend(), "cuda") << server_->Log();
    ASSERT_EQ(info_.gpus_size(), count) << "fp4qd serves every visible GPU";
    std::set<std::string> uuids;
    for (const auto& g : info_.gpus()) uuids.insert(g.uuid());
    ASSERT_EQ(static_cast<int>(uuids.size()), count) << "GPU UUIDs are distinct";
    EXPECT_THAT(info_.supported_modes(), ::testing::Contains("cuda_ipc"));

    session_ = OpenSession();
    for (int i = 0; i < 2; ++i) {
      Gpu& g = gpus_[i];
      g.uuid = info_.gpus(i).uuid();
      for (int o = 0; o < count; ++o) {  // ordinals may differ between processes; UUIDs do not
        cudaDeviceProp prop;
        CUDA_OK(cudaGetDeviceProperties(&prop, o));
        if (Uuid(prop.uuid) == g.uuid) g.ordinal = o;
      }
      ASSERT_GE(g.ordinal, 0) << "server GPU " << g.uuid << " is not visible here";
      CUDA_OK(cudaSetDevice(g.ordinal));
      CUDA_OK(cudaMalloc(&g.base, kRegionBytes));
      CUDA_OK(cudaMemset(g.base, 0xEE, kRegionBytes));
      cudaIpcMemHandle_t h;
      CUDA_OK(cudaIpcGetMemHandle(&h, g.base));
      g.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
      grpc::Status rs;
      g.region = Register(g.handle, g.uuid, &rs);
      ASSERT_TRUE(rs.ok()) << rs.error_message();
    }
    ASSERT_NE(gpus_[0].ordinal, gpus_[1].ordinal);
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {  // fp4qd's side of a failure, for the device log
      const std::string log = server_->Log();
      std::printf("---- fp4qd log (last 6000 bytes) ----\n%s\n----\n",
                  log.substr(log.size() > 6000 ? log.size() - 6000 : 0).c_str());
    }
    for (Gpu& g : gpus_) {
      if (g.base != nullptr) {
        cudaSetDevice(g.ordinal);
        cudaFree(g.base);
      }
    }
  }

  std::string OpenSession() {
    v1::OpenSessionReply rep;
    auto ctx = Context();
    grpc::Status s = stub_->OpenSession(ctx.get(), v1::OpenSessionRequest(), &rep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return rep.session_id();
  }
  std::string Register(const std::string& handle, const std::string& uuid, grpc::Status* status,
                       uint64_t size = kRegionBytes) {
    v1::RegisterCudaRegionRequest req;
    req.set_ipc_handle(handle);
    req.set_size(size);
    req.set_device_uuid(uuid);
    v1::RegisterCudaRegionReply rep;
    auto ctx = Context(session_);
    *status = stub_->RegisterCudaRegion(ctx.get(), req, &rep);
    return rep.region_id();
  }
  void Put(int gpu, uint64_t offset, const std::string& bytes) {
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(gpus_[gpu].base) + offset, bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::string Get(int gpu, uint64_t offset, size_t n) {
    std::string out(n, '\0');
    EXPECT_EQ(cudaMemcpy(out.data(), static_cast<char*>(gpus_[gpu].base) + offset, n,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }
  void Poison(int gpu) {
    ASSERT_EQ(cudaSetDevice(gpus_[gpu].ordinal), cudaSuccess);
    ASSERT_EQ(cudaMemset(gpus_[gpu].base, 0xEE, kRegionBytes), cudaSuccess);
  }
  v1::OutputTarget Target(int gpu, uint64_t offset) {
    v1::OutputTarget t;
    t.mutable_region()->set_region_id(gpus_[gpu].region);
    t.mutable_region()->set_offset(offset);
    return t;
  }
  std::string Metrics() {
    auto text = HttpGet(server_->metrics_address(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.value_or("");
  }
  // A counter; 0 while its series does not exist yet.
  static double Counter(const std::string& text, const std::string& name,
                        const std::map<std::string, std::string>& labels) {
    return MetricValue(text, name, labels).value_or(0);
  }

  // Quantizes x [m, k] and w [n, k] (f32, already in GPU `gpu`'s region at 0
  // and 8 MiB) into the region, checks the bytes against the CPU backend, QDQs
  // x, and multiplies them; returns the Matmul output (f32 [m, n]).
  std::string OpsOnGpu(int gpu, const std::string& x, int64_t m, const std::string& w, int64_t n,
                       int64_t k) {
    const std::string& uuid = gpus_[gpu].uuid;
    kernels::QuantizeOptions both;
    both.columnwise = true;
    const RefQuantize cx = CpuQuantize(x, kernels::DType::kF32, m, k, both);
    const RefQuantize cw = CpuQuantize(w, kernels::DType::kF32, n, k, kernels::QuantizeOptions());
    EXPECT_TRUE(cx.status.ok() && cw.status.ok());

    auto quantize = [&](uint64_t in_at, int64_t rows, uint64_t out_at, bool columnwise) {
      v1::QuantizeRequest r;
      *r.mutable_input() = RegionTensor(gpus_[gpu].region, in_at, rows, k);
      r.mutable_options()->set_outputs(columnwise ? v1::OUTPUTS_BOTH : v1::OUTPUTS_ROWWISE);
      *r.mutable_rowwise_codes() = Target(gpu, out_at);
      *r.mutable_rowwise_scales() = Target(gpu, out_at + (2 << 20));
      if (columnwise) {
        *r.mutable_columnwise_codes() = Target(gpu, out_at + (4 << 20));
        *r.mutable_columnwise_scales() = Target(gpu, out_at + (6 << 20));
      }
      v1::QuantizeReply rep;
      auto ctx = Context(session_);
      grpc::Status s = stub_->Quantize(ctx.get(), r, &rep);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(rep.header().device_uuid(), uuid) << "the work ran where the memory lives";
      return rep;
    };
    const v1::QuantizeReply qx = quantize(0, m, 16 << 20, true);
    const v1::QuantizeReply qw = quantize(8 << 20, n, 24 << 20, false);
    EXPECT_TRUE(Get(gpu, 16 << 20, cx.rowwise.codes.size()) == cx.rowwise.codes);
    EXPECT_TRUE(Get(gpu, 18 << 20, cx.rowwise.scales.size()) == cx.rowwise.scales);
    EXPECT_TRUE(Get(gpu, 20 << 20, cx.columnwise.codes.size()) == cx.columnwise.codes);
    EXPECT_TRUE(Get(gpu, 22 << 20, cx.columnwise.scales.size()) == cx.columnwise.scales);
    EXPECT_TRUE(Get(gpu, 24 << 20, cw.rowwise.codes.size()) == cw.rowwise.codes);
    EXPECT_TRUE(Get(gpu, 26 << 20, cw.rowwise.scales.size()) == cw.rowwise.scales);
    EXPECT_EQ(static_cast<uint8_t>(Get(gpu, (16 << 20) + cx.rowwise.codes.size(), 1)[0]), 0xEE)
        << "wrote past the codes";

    v1::QdqRequest q;
    *q.mutable_input() = RegionTensor(gpus_[gpu].region, 0, m, k);
    *q.mutable_out() = Target(gpu, 32 << 20);
    v1::QdqReply qr;
    auto qctx = Context(session_);
    grpc::Status s = stub_->Qdq(qctx.get(), q, &qr);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(qr.header().device_uuid(), uuid);
    absl::StatusOr<std::string> cq =
        CpuQdq(x, kernels::DType::kF32, m, k, kernels::QuantizeOptions(), kernels::DType::kF32);
    EXPECT_TRUE(cq.ok());
    EXPECT_TRUE(Get(gpu, 32 << 20, x.size()) == cq.value_or("")) << "QDQ differs from the CPU";

    v1::MatmulRequest mm;
    *mm.mutable_a()->mutable_tensor() = qx.rowwise();  // names the codes/scales in the region
    *mm.mutable_b()->mutable_tensor() = qw.rowwise();
    *mm.mutable_out() = Target(gpu, 40 << 20);
    v1::MatmulReply mr;
    auto mctx = Context(session_);
    s = stub_->Matmul(mctx.get(), mm, &mr);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(mr.header().device_uuid(), uuid);
    const std::string got = Get(gpu, 40 << 20, static_cast<size_t>(m * n * 4));
    absl::StatusOr<std::string> cm = CpuMatmul(cx.rowwise, m, cw.rowwise, n, k,
                                               kernels::QuantizeOptions(), kernels::DType::kF32);
    EXPECT_TRUE(cm.ok());
    EXPECT_LT(RelError(got, cm.value_or("")), kMatmulTolerance) << "Matmul on " << uuid;
    return got;
  }

  uint32_t seed_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Fp4q::Stub> stub_;
  v1::ServerInfoReply info_;
  std::string session_;
  Gpu gpus_[2];
};

TEST_F(MultiGpuIpcTest, EachGpuMatchesTheCpuBackend) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  const int64_t m = 256, n = 384, k = 1024;
  // Fresh data per GPU (a mix-up between the devices cannot pass), then the
  // same data on both.
  for (int round = 0; round < 2; ++round) {
    std::string out[2];
    for (int gpu = 0; gpu < 2; ++gpu) {
      SCOPED_TRACE(absl::StrCat("GPU ", gpu, " ", gpus_[gpu].uuid, round ? " shared data" : ""));
      const uint32_t s = round == 0 ? seed_ + 2 * gpu : seed_ + 7;
      const std::string x = RandomF32(m * k, s, 3.0f);
      const std::string w = RandomF32(n * k, s + 1, 0.05f);
      Poison(gpu);
      Put(gpu, 0, x);
      Put(gpu, 8 << 20, w);
      out[gpu] = OpsOnGpu(gpu, x, m, w, n, k);
    }
    if (round == 1) {
      EXPECT_TRUE(out[0] == out[1]) << "the same Matmul differs between the two GPUs";
    }
  }
}

TEST_F(MultiGpuIpcTest, WeightOnGpu1StaysThereAndMatchesTheCpuServer) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  auto cpu_server = ServerProcess::Start({"--backend=cpu"});
  ASSERT_TRUE(cpu_server.ok()) << cpu_server.status();
  auto cpu = (*cpu_server)->Stub();
  const int64_t rows = 128, cols = 256, n = rows * cols;
  const std::string w0 = RandomF32(n, seed_ + 20, 0.5f);
  const std::string uuid1 = gpus_[1].uuid;

  v1::CreateWeightRequest cw;
  cw.set_name("mgpu/w");
  *cw.mutable_initial() = InlineTensor(w0, rows, cols);
  cw.mutable_options()->set_error_feedback(true);
  v1::CreateWeightRequest gpu_cw = cw;
  gpu_cw.set_device_uuid(uuid1);
  v1::CreateWeightReply gr, cr;
  auto c1 = Context();
  grpc::Status s = stub_->CreateWeight(c1.get(), gpu_cw, &gr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(gr.weight().device_uuid(), uuid1);
  EXPECT_EQ(gr.header().device_uuid(), uuid1);
  auto c2 = Context();
  ASSERT_TRUE(cpu->CreateWeight(c2.get(), cw, &cr).ok());

  Poison(1);
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::string g = RandomF32(n, seed_ + 30 + step, 0.2f);
    Put(1, 0, g);
    v1::UpdateWeightRequest u;
    u.set_name("mgpu/w");
    u.set_step(step);
    u.set_lr(0.25f);
    *u.mutable_update() = RegionTensor(gpus_[1].region, 0, rows, cols);
    *u.mutable_dequantized_out() = Target(1, 8 << 20);
    v1::UpdateWeightReply ur, cur;
    auto c3 = Context(session_);
    s = stub_->UpdateWeight(c3.get(), u, &ur);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(ur.applied());
    EXPECT_EQ(ur.header().device_uuid(), uuid1);
    *u.mutable_update() = InlineTensor(g, rows, cols);
    u.clear_dequantized_out();
    u.set_return_dequantized(true);
    auto c4 = Context();
    ASSERT_TRUE(cpu->UpdateWeight(c4.get(), u, &cur).ok());
    EXPECT_TRUE(Get(1, 8 << 20, n * 4) == cur.dequantized().inline_data())
        << "DQ(W) after the update differs from the CPU server's";
  }
  // The whole state (codes, scales, residual) equals the CPU server's.
  v1::GetWeightRequest get;
  get.set_name("mgpu/w");
  get.set_quantized(true);
  get.set_residual(true);
  v1::GetWeightReply gg, cg;
  auto c5 = Context();
  ASSERT_TRUE(stub_->GetWeight(c5.get(), get, &gg).ok());
  auto c6 = Context();
  ASSERT_TRUE(cpu->GetWeight(c6.get(), get, &cg).ok());
  EXPECT_EQ(gg.header().device_uuid(), uuid1);
  EXPECT_TRUE(gg.quantized().codes() == cg.quantized().codes());
  EXPECT_TRUE(gg.quantized().scales() == cg.quantized().scales());
  EXPECT_TRUE(gg.residual().inline_data() == cg.residual().inline_data());

  // Matmul of a region operand on GPU 1 with the stored weight runs on GPU 1.
  const int64_t m = 32;
  const std::string a = RandomF32(m * cols, seed_ + 40, 1.0f);
  v1::QuantizeRequest qa;
  *qa.mutable_input() = InlineTensor(a, m, cols);
  v1::QuantizeReply qar;
  auto c7 = Context();
  ASSERT_TRUE(cpu->Quantize(c7.get(), qa, &qar).ok());
  Put(1, 16 << 20, qar.rowwise().codes());
  Put(1, 18 << 20, qar.rowwise().scales());
  v1::MatmulRequest mm;
  v1::QuantizedTensor* t = mm.mutable_a()->mutable_tensor();
  *t = qar.rowwise();
  t->mutable_codes_region()->set_region_id(gpus_[1].region);
  t->mutable_codes_region()->set_offset(16 << 20);
  t->mutable_scales_region()->set_region_id(gpus_[1].region);
  t->mutable_scales_region()->set_offset(18 << 20);
  mm.mutable_b()->set_weight_name("mgpu/w");
  v1::MatmulReply gm, cm;
  auto c8 = Context(session_);
  s = stub_->Matmul(c8.get(), mm, &gm);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(gm.header().device_uuid(), uuid1);
  v1::MatmulRequest cmm;
  *cmm.mutable_a()->mutable_tensor() = qar.rowwise();
  cmm.mutable_b()->set_weight_name("mgpu/w");
  auto c9 = Context();
  ASSERT_TRUE(cpu->Matmul(c9.get(), cmm, &cm).ok());
  EXPECT_LT(RelError(gm.output().inline_data(), cm.output().inline_data()), kMatmulTolerance);

  // Placement is reported: ListTensors, ServerInfo and /metrics all say GPU 1.
  v1::ListTensorsReply lt;
  auto c10 = Context();
  ASSERT_TRUE(stub_->ListTensors(c10.get(), v1::ListTensorsRequest(), &lt).ok());
  ASSERT_GE(lt.tensors_size(), 1);
  for (const auto& l : lt.tensors()) EXPECT_EQ(l.device_uuid(), uuid1) << l.name();
  v1::ServerInfoReply info;
  auto c11 = Context();
  ASSERT_TRUE(stub_->ServerInfo(c11.get(), v1::ServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.gpus(0).state_bytes(), 0u);
  EXPECT_EQ(info.gpus(1).state_bytes(), gr.weight().bytes());
  const std::string text = Metrics();
  EXPECT_EQ(Counter(text, "fp4q_state_bytes", {{"device", uuid1}}),
            static_cast<double>(gr.weight().bytes()));
  EXPECT_EQ(Counter(text, "fp4q_state_bytes", {{"device", gpus_[0].uuid}}), 0);
  EXPECT_EQ(Counter(text, "fp4q_state_tensors", {{"device", uuid1}, {"kind", "weight"}}), 1);
}

TEST_F(MultiGpuIpcTest, RequestsMixingTheGpusNameTheFields) {
  const std::string& u0 = gpus_[0].uuid;
  const std::string& u1 = gpus_[1].uuid;
  v1::CreateWeightRequest cw;
  cw.set_name("mgpu/placed");
  *cw.mutable_initial() = InlineTensor(RandomF32(16 * 64, seed_ + 50), 16, 64);
  cw.set_device_uuid(u1);
  v1::CreateWeightReply cwr;
  auto c1 = Context();
  ASSERT_TRUE(stub_->CreateWeight(c1.get(), cw, &cwr).ok());
  Put(0, 0, RandomF32(16 * 64, seed_ + 51));

  // The weight is on GPU 1, the update in GPU 0's memory.
  v1::UpdateWeightRequest u;
  u.set_name("mgpu/placed");
  u.set_step(1);
  u.set_lr(0.1f);
  *u.mutable_update() = RegionTensor(gpus_[0].region, 0, 16, 64);
  v1::UpdateWeightReply ur;
  auto c2 = Context(session_);
  grpc::Status s = stub_->UpdateWeight(c2.get(), u, &ur);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr(absl::StrCat("name: on device ", u1)),
                                       HasSubstr(absl::StrCat("update.region is on device ", u0))));

  // A new weight asked on GPU 1 with its initial value in GPU 0's memory.
  cw.set_name("mgpu/other");
  *cw.mutable_initial() = RegionTensor(gpus_[0].region, 0, 16, 64);
  auto c3 = Context(session_);
  s = stub_->CreateWeight(c3.get(), cw, &cwr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr(absl::StrCat("device_uuid: on device ", u1)),
                    HasSubstr(absl::StrCat("initial.region is on device ", u0))));

  // Input on GPU 0, an output target on GPU 1.
  v1::QuantizeRequest q;
  *q.mutable_input() = RegionTensor(gpus_[0].region, 0, 16, 64);
  *q.mutable_rowwise_codes() = Target(1, 1 << 20);
  v1::QuantizeReply qr;
  auto c4 = Context(session_);
  s = stub_->Quantize(c4.get(), q, &qr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr(absl::StrCat("rowwise_codes.region: on device ", u1)),
                    HasSubstr(absl::StrCat("input.region is on device ", u0))));

  // GPU 0 memory registered as GPU 1's.
  //  - The region's allocation, which the server already has open on GPU 0: refused, naming
  //    the GPU it lives on (RegionManager keeps one GPU per allocation).
  //  - A fresh allocation nobody registered before (size within it, so the size check does not
  //    decide): on the H200 x2 (commit 079f60f) CUDA opened it on GPU 1 through peer access and
  //    cudaPointerGetAttributes named GPU 1, so the server cannot tell; the outcome is printed
  //    and, when refused, the message must name the fields. docs/RELIABILITY.md says so.
  void* fresh = nullptr;
  constexpr uint64_t kFreshBytes = 1 << 20;
  CUDA_OK(cudaSetDevice(gpus_[0].ordinal));
  CUDA_OK(cudaMalloc(&fresh, kFreshBytes));
  cudaIpcMemHandle_t fh;
  CUDA_OK(cudaIpcGetMemHandle(&fh, fresh));
  int peer = 0;  // can GPU 1 map GPU 0's memory at all?
  CUDA_OK(cudaDeviceCanAccessPeer(&peer, gpus_[1].ordinal, gpus_[0].ordinal));
  RecordProperty("gpu1_can_access_gpu0", peer);
  {
    SCOPED_TRACE("already open on GPU 0");
    grpc::Status rs;
    Register(gpus_[0].handle, u1, &rs);
    std::printf("[ multigpu ] GPU 0 memory (open) registered as GPU 1's: %s %s\n", CodeName(rs),
                rs.error_message().c_str());
    EXPECT_EQ(rs.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << "a GPU 0 allocation was accepted as GPU 1's: " << rs.error_message();
    EXPECT_THAT(rs.error_message(),
                HasSubstr(absl::StrCat("ipc_handle: already registered on ", u0,
                                       "; the allocation lives there, not on ", u1)));
    EXPECT_THAT(rs.error_message(), HasSubstr(absl::StrCat("device_uuid: '", u1, "'")));
  }
  {
    SCOPED_TRACE("fresh allocation");
    grpc::Status rs;
    const std::string id = Register(std::string(reinterpret_cast<const char*>(&fh), sizeof(fh)),
                                    u1, &rs, kFreshBytes);
    std::printf("[ multigpu ] GPU 0 memory (fresh) registered as GPU 1's: %s %s\n", CodeName(rs),
                rs.error_message().c_str());
    RecordProperty("fresh_gpu0_allocation_accepted_as_gpu1", rs.ok() ? 1 : 0);
    if (rs.ok()) {
      v1::UnregisterCudaRegionRequest ur;
      ur.set_region_id(id);
      v1::UnregisterCudaRegionReply urr;
      auto uc = Context(session_);
      EXPECT_TRUE(stub_->UnregisterCudaRegion(uc.get(), ur, &urr).ok());
    } else {
      EXPECT_EQ(rs.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << rs.error_message();
      EXPECT_THAT(rs.error_message(), HasSubstr("ipc_handle"));
      EXPECT_THAT(rs.error_message(), HasSubstr(absl::StrCat("device_uuid: '", u1, "'")));
    }
  }
  cudaFree(fresh);

  // None of it hurt: both GPUs still serve, and the weight never moved.
  for (int gpu = 0; gpu < 2; ++gpu) {
    v1::QdqRequest r;
    *r.mutable_input() = RegionTensor(gpus_[gpu].region, 0, 16, 64);
    *r.mutable_out() = Target(gpu, 2 << 20);
    v1::QdqReply rep;
    auto c = Context(session_);
    s = stub_->Qdq(c.get(), r, &rep);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.header().device_uuid(), gpus_[gpu].uuid);
  }
  v1::GetWeightRequest g;
  g.set_name("mgpu/placed");
  v1::GetWeightReply gr;
  auto c5 = Context();
  ASSERT_TRUE(stub_->GetWeight(c5.get(), g, &gr).ok());
  EXPECT_EQ(gr.weight().device_uuid(), u1);
  EXPECT_EQ(gr.weight().last_step(), 0) << "the refused update changed the weight";
}

TEST_F(MultiGpuIpcTest, BothGpusServeConcurrently) {
  SCOPED_TRACE(absl::StrCat("seed ", seed_));
  const int64_t rows = 1024, cols = 4096;
  constexpr int kRequests = 200;
  std::string want[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    const std::string x = RandomF32(rows * cols, seed_ + 60 + gpu, 2.0f);
    Poison(gpu);
    Put(gpu, 0, x);
    want[gpu] = CpuQdq(x, kernels::DType::kF32, rows, cols, kernels::QuantizeOptions(),
                       kernels::DType::kF32)
                    .value_or("");
  }
  const std::string before = Metrics();
  std::atomic<int> ready{0};
  int ok[2] = {0, 0}, elsewhere[2] = {0, 0};
  std::string first_error[2];
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int gpu = 0; gpu < 2; ++gpu) {
    threads.emplace_back([&, gpu] {
      auto stub = v1::Fp4q::NewStub(MakeChannel(server_->address()));
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      for (int i = 0; i < kRequests; ++i) {
        v1::QdqRequest r;
        *r.mutable_input() = RegionTensor(gpus_[gpu].region, 0, rows, cols);
        *r.mutable_out() = Target(gpu, 32 << 20);
        v1::QdqReply rep;
        auto c = Context(session_);
        grpc::Status s = stub->Qdq(c.get(), r, &rep);
        if (s.ok()) {
          ++ok[gpu];
          if (rep.header().device_uuid() != gpus_[gpu].uuid) ++elsewhere[gpu];
        } else if (first_error[gpu].empty()) {
          first_error[gpu] = s.error_message();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string after = Metrics();
  double busy_sum = 0;
  for (int gpu = 0; gpu < 2; ++gpu) {
    const std::string& uuid = gpus_[gpu].uuid;
    SCOPED_TRACE(absl::StrCat("GPU ", gpu, " ", uuid));
    EXPECT_EQ(ok[gpu], kRequests) << first_error[gpu];
    EXPECT_EQ(elsewhere[gpu], 0) << "requests on this GPU's memory ran elsewhere";
    EXPECT_TRUE(Get(gpu, 32 << 20, want[gpu].size()) == want[gpu]) << "QDQ under load";
    const double kernels = Counter(after, "fp4q_device_kernels_total", {{"device", uuid}}) -
                           Counter(before, "fp4q_device_kernels_total", {{"device", uuid}});
    const double busy = Counter(after, "fp4q_device_kernel_seconds_total", {{"device", uuid}}) -
                        Counter(before, "fp4q_device_kernel_seconds_total", {{"device", uuid}});
    EXPECT_GE(kernels, kRequests) << "per-device kernel counter of /metrics";
    EXPECT_GT(busy, 0);
    busy_sum += busy;
    // Every per-device family carries this GPU's label.
    for (const char* family : {"fp4q_queue_capacity", "fp4q_queue_depth", "fp4q_state_bytes"}) {
      EXPECT_TRUE(MetricValue(after, family, {{"device", uuid}}).ok()) << family;
    }
    RecordProperty(absl::StrCat("gpu", gpu, "_kernel_ops"), std::to_string(kernels));
    RecordProperty(absl::StrCat("gpu", gpu, "_busy_s"), absl::StrFormat("%.4f", busy));
  }
  // Informational: above 1, the two GPUs' kernels overlapped in time.
  std::printf(
      "[ multigpu ] %d + %d QDQ of %lldx%lld f32 in %.3f s; kernel busy %.3f s "
      "total "
      "(busy/wall %.2f)\n",
      ok[0], ok[1], static_cast<long long>(rows), static_cast<long long>(cols), wall, busy_sum,
      busy_sum / wall);
  RecordProperty("wall_s", absl::StrFormat("%.3f", wall));
  RecordProperty("busy_over_wall", absl::StrFormat("%.3f", busy_sum / wall));
}

}  // namespace
}  // namespace fp4q::server::testing
