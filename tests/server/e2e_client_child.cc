// A client process for the fault tests, to be killed (SIGKILL) in the middle of
// its work:
//   fp4q_e2e_client_child unix:PATH region|inline
// Opens a session "dying-client"; `region` also registers a 16 MiB
// shared-memory region (the fake GPU module's IPC) holding a [2048, 2048] f32
// tensor. Then prints
//   ready <session id> <shm object name or ->
// on stdout and quantizes in a loop (from the region, or 4 MiB inline) until
// killed. Exit code 2 with a message on stderr on any error.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "fp4q/v1/fp4q.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "shm_region.h"

namespace {

int Fail(const char* what, const grpc::Status& s) {
  std::fprintf(stderr, "client child: %s: %d %s\n", what, static_cast<int>(s.error_code()),
               s.error_message().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace v1 = ::fp4q::v1;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s unix:PATH region|inline\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::Fp4q::NewStub(
      grpc::CreateCustomChannel(argv[1], grpc::InsecureChannelCredentials(), args));
  v1::OpenSessionRequest open;
  open.set_client_name("dying-client");
  v1::OpenSessionReply session;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub->OpenSession(&ctx, open, &session);
    if (!s.ok()) return Fail("OpenSession", s);
  }
  constexpr int64_t kRows = 2048, kCols = 2048;
  constexpr size_t kBytes = kRows * kCols * 4;
  // Only `region` makes a shared memory object (the parent unlinks it after the kill).
  std::unique_ptr<fp4q::server::testing::ShmRegion> region_memory;
  v1::QuantizeRequest q;
  q.mutable_input()->set_dtype(v1::DTYPE_F32);
  std::string name = "-";
  if (mode == "region") {
    region_memory = std::make_unique<fp4q::server::testing::ShmRegion>(kBytes);
    fp4q::server::testing::ShmRegion& shm = *region_memory;
    if (!shm.ok()) return Fail("shm", grpc::Status(grpc::StatusCode::INTERNAL, "no shm"));
    for (size_t i = 0; i < kBytes / 4; ++i) {
      const float v = static_cast<float>(static_cast<int>(i % 97) - 48) * 0.125f;
      std::memcpy(shm.data() + 4 * i, &v, 4);
    }
    v1::RegisterCudaRegionRequest reg;
    reg.set_ipc_handle(shm.Handle());
    reg.set_size(kBytes);
    v1::RegisterCudaRegionReply region;
    grpc::ClientContext ctx;
    ctx.AddMetadata("fp4q-session", session.session_id());
    grpc::Status s = stub->RegisterCudaRegion(&ctx, reg, &region);
    if (!s.ok()) return Fail("RegisterCudaRegion", s);
    q.mutable_input()->add_shape(kRows);
    q.mutable_input()->add_shape(kCols);
    q.mutable_input()->mutable_region()->set_region_id(region.region_id());
    name = shm.name();
  } else {
    q.mutable_input()->add_shape(kRows / 2);
    q.mutable_input()->add_shape(kCols / 2);
    q.mutable_input()->set_inline_data(std::string(kBytes / 4, '\x3f'));
  }
  std::printf("ready %s %s\n", session.session_id().c_str(), name.c_str());
  std::fflush(stdout);
  while (true) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("fp4q-session", session.session_id());
    v1::QuantizeReply rep;
    grpc::Status s = stub->Quantize(&ctx, q, &rep);
    if (!s.ok()) return Fail("Quantize", s);
  }
}
