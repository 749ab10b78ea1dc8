// Zero-copy through CUDA IPC, two processes: this test allocates GPU memory, registers it with
// a CUDA fp4qd through a Session (RegionFor), and has the server quantize / QDQ in place; the
// results must be bit-identical to the inline path on the same server, over gRPC and over the
// fast socket. Skipped, with CUDA's reason, where no GPU is usable.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fp4q/client/client.h"
#include "fp4q/client/cuda_ipc.h"
#include "fp4q/client/fast_socket.h"
#include "fp4q/client/session.h"
#include "fp4q/client/tensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "live_support.h"
#include "real_cuda.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::ConnectTo;
using ::fp4q::client::testing::TestRuntime;
using ::fp4q::client::testing::ServerProcess;
using ::fp4q::client::testing::StartFp4qd;
using ::fp4q::testing::IsOk;

TEST(LiveCudaIpc, QuantizeAndQdqInPlaceAreBitIdenticalToInline) {
  absl::StatusOr<std::unique_ptr<CudaIpc>> ipc = CudaIpc::Load();
  if (!ipc.ok()) GTEST_SKIP() << "no CUDA runtime: " << ipc.status();
  absl::StatusOr<std::unique_ptr<CudaRuntime>> runtime = TestRuntime(**ipc);
  ASSERT_THAT(runtime, IsOk());
  const CudaRuntime& cuda = **runtime;
  constexpr size_t kBytes = 4 << 20;
  void* dev = nullptr;
  if (const int err = cuda.Malloc(&dev, kBytes); err != 0) {
    int probe = 0;
    GTEST_SKIP() << "no usable CUDA device (cudaMalloc error " << err << "; "
                 << (*ipc)->Export(&probe).status() << ")";
  }
  char* base = static_cast<char*>(dev);

  const std::string fast_path = "/tmp/fp4q-live-cuda-" + std::to_string(::getpid()) + ".fast";
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = StartFp4qd(
      {"--backend=cuda", "--allow_cuda_ipc", "--cuda_ipc_over_tcp", "--fast_socket=" + fast_path});
  ASSERT_THAT(server, IsOk());
  auto client = ConnectTo((*server)->address());
  absl::StatusOr<v1::ServerInfoReply> info = client->ServerInfo();
  ASSERT_THAT(info, IsOk());
  ASSERT_EQ(info->backend(), "cuda");
  ASSERT_GE(info->gpus_size(), 1);

  const int64_t rows = 256, cols = 512;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(static_cast<float>(i) * 0.37f) * std::exp(std::cos(static_cast<float>(i)));
  }
  x[777] = 300.0f;  // an outlier
  const size_t x_bytes = x.size() * 4, codes_bytes = x.size() / 2, scales_bytes = x.size() / 16;
  const size_t x_off = 0, codes_off = 1 << 20, scales_off = 2 << 20, qdq_off = 3 << 20;
  ASSERT_EQ(cuda.Memcpy(base + x_off, x.data(), x_bytes, CudaMemcpyKind::kHostToDevice), 0);
  const std::vector<char> poison(1 << 20, '\xAB');
  for (size_t off : {codes_off, scales_off, qdq_off}) {
    ASSERT_EQ(cuda.Memcpy(base + off, poison.data(), poison.size(), CudaMemcpyKind::kHostToDevice), 0);
  }

  SessionOptions options;
  options.client_name = "client_cuda_live_test";
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Open(*client, options);
  ASSERT_THAT(session, IsOk());
  Session& s = **session;
  absl::StatusOr<v1::RegionSlice> x_slice = s.RegionFor(base + x_off, x_bytes);
  absl::StatusOr<v1::RegionSlice> codes_slice = s.RegionFor(base + codes_off, codes_bytes);
  absl::StatusOr<v1::RegionSlice> scales_slice = s.RegionFor(base + scales_off, scales_bytes);
  absl::StatusOr<v1::RegionSlice> qdq_slice = s.RegionFor(base + qdq_off, x_bytes);
  ASSERT_THAT(x_slice, IsOk());
  ASSERT_THAT(codes_slice, IsOk());
  ASSERT_THAT(scales_slice, IsOk());
  ASSERT_THAT(qdq_slice, IsOk());
  EXPECT_EQ(s.registered_allocations(), 1u);
  EXPECT_EQ(codes_slice->region_id(), x_slice->region_id());
  EXPECT_EQ(codes_slice->offset(), codes_off);

  // In place: input from the region, codes and scales written into it.
  v1::QuantizeRequest by_region;
  *by_region.mutable_input() = RegionTensor(v1::DTYPE_F32, {rows, cols}, *x_slice).value();
  *by_region.mutable_rowwise_codes() = RegionTarget(*codes_slice);
  *by_region.mutable_rowwise_scales() = RegionTarget(*scales_slice);
  absl::StatusOr<v1::QuantizeReply> q_region = client->Quantize(by_region, s.call_options());
  ASSERT_THAT(q_region, IsOk());
  EXPECT_TRUE(q_region->rowwise().codes().empty());
  EXPECT_EQ(q_region->rowwise().codes_region().offset(), codes_off);

  v1::QuantizeRequest inline_request;
  *inline_request.mutable_input() = InlineTensorF32(x, {rows, cols}).value();
  absl::StatusOr<v1::QuantizeReply> q_inline = client->Quantize(inline_request);
  ASSERT_THAT(q_inline, IsOk());

  std::string codes(codes_bytes, '\0'), scales(scales_bytes, '\0');
  ASSERT_EQ(cuda.Memcpy(codes.data(), base + codes_off, codes_bytes, CudaMemcpyKind::kDeviceToHost), 0);
  ASSERT_EQ(cuda.Memcpy(scales.data(), base + scales_off, scales_bytes, CudaMemcpyKind::kDeviceToHost),
            0);
  EXPECT_EQ(codes, q_inline->rowwise().codes());
  EXPECT_EQ(scales, q_inline->rowwise().scales());
  EXPECT_EQ(q_region->rowwise().s_enc(), q_inline->rowwise().s_enc());
  EXPECT_EQ(q_region->rowwise().global_amax(), q_inline->rowwise().global_amax());
  EXPECT_EQ(q_inline->rowwise().global_amax(), 300.0f);

  // QDQ into the region vs inline.
  v1::QdqRequest qdq_region;
  *qdq_region.mutable_input() = by_region.input();
  *qdq_region.mutable_out() = RegionTarget(*qdq_slice);
  ASSERT_THAT(client->Qdq(qdq_region, s.call_options()), IsOk());
  v1::QdqRequest qdq_inline;
  *qdq_inline.mutable_input() = inline_request.input();
  absl::StatusOr<v1::QdqReply> qdq = client->Qdq(qdq_inline);
  ASSERT_THAT(qdq, IsOk());
  std::string dq(x_bytes, '\0');
  ASSERT_EQ(cuda.Memcpy(dq.data(), base + qdq_off, x_bytes, CudaMemcpyKind::kDeviceToHost), 0);
  EXPECT_EQ(dq, qdq->output().inline_data());

  // The same in-place calls over the fast socket (outputs poisoned again first).
  for (size_t off : {codes_off, scales_off, qdq_off}) {
    ASSERT_EQ(cuda.Memcpy(base + off, poison.data(), poison.size(), CudaMemcpyKind::kHostToDevice), 0);
  }
  FastSocketOptions fo;
  fo.path = fast_path;
  absl::StatusOr<std::unique_ptr<FastSocket>> fast = FastSocket::Connect(fo, s.id());
  ASSERT_THAT(fast, IsOk());
  absl::StatusOr<v1::QuantizeReply> q_fast = (*fast)->Quantize(by_region);
  ASSERT_THAT(q_fast, IsOk());
  EXPECT_EQ(q_fast->rowwise().codes_region().offset(), codes_off);
  EXPECT_EQ(q_fast->rowwise().s_enc(), q_inline->rowwise().s_enc());
  EXPECT_EQ(q_fast->header().backend(), "cuda");
  EXPECT_GT(q_fast->header().kernel_micros(), 0.0);
  ASSERT_THAT((*fast)->Qdq(qdq_region), IsOk());
  std::string fast_codes(codes_bytes, '\0'), fast_scales(scales_bytes, '\0'), fast_dq(x_bytes, '\0');
  ASSERT_EQ(cuda.Memcpy(fast_codes.data(), base + codes_off, codes_bytes, CudaMemcpyKind::kDeviceToHost),
            0);
  ASSERT_EQ(
      cuda.Memcpy(fast_scales.data(), base + scales_off, scales_bytes, CudaMemcpyKind::kDeviceToHost), 0);
  ASSERT_EQ(cuda.Memcpy(fast_dq.data(), base + qdq_off, x_bytes, CudaMemcpyKind::kDeviceToHost), 0);
  EXPECT_EQ(fast_codes, q_inline->rowwise().codes());
  EXPECT_EQ(fast_scales, q_inline->rowwise().scales());
  EXPECT_EQ(fast_dq, qdq->output().inline_data());
  fast->reset();

  EXPECT_THAT(s.ReleaseAllocation(base), IsOk());
  EXPECT_EQ(s.Close().value_or(99), 0u);  // nothing left to release
  cuda.Free(dev);
  EXPECT_EQ((*server)->Stop(), 0) << (*server)->Log();
}

}  // namespace
}  // namespace fp4q::client
