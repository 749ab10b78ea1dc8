// Sessions and CUDA IPC exports: against the fake service, with the fake CUDA runtime
// (fake_cudart.cc) standing in where no GPU exists, and against the real runtime where one
// does (skipped, with CUDA's reason, otherwise).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "fake_server.h"
#include "fp4q/client/client.h"
#include "fp4q/client/cuda_ipc.h"
#include "fp4q/client/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "real_cuda.h"
#include "subprocess.h"
#include "testing/status_matchers.h"

namespace fp4q::client {
namespace {

using ::fp4q::client::testing::FakeServer;
using ::fp4q::client::testing::Hex;
using ::fp4q::client::testing::TestRuntime;
using ::fp4q::client::testing::Unhex;
using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Hooks of the fake runtime, reached through the same dlopen handle CudaIpc gets.
struct FakeCuda {
  void* lib = nullptr;
  unsigned (*add)(void*, size_t, int) = nullptr;
  void (*remove)(void*) = nullptr;
  void (*set_error)(int) = nullptr;
  int (*current_device)() = nullptr;
  int (*set_device)(int) = nullptr;
  void (*expected_handle)(void*, char*) = nullptr;

  FakeCuda() {
    lib = dlopen(FP4Q_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    add = reinterpret_cast<decltype(add)>(dlsym(lib, "fake_cuda_add_allocation"));
    remove = reinterpret_cast<decltype(remove)>(dlsym(lib, "fake_cuda_remove_allocation"));
    set_error = reinterpret_cast<decltype(set_error)>(dlsym(lib, "fake_cuda_set_error"));
    current_device =
        reinterpret_cast<decltype(current_device)>(dlsym(lib, "fake_cuda_current_device"));
    set_device = reinterpret_cast<decltype(set_device)>(dlsym(lib, "cudaSetDevice"));
    expected_handle =
        reinterpret_cast<decltype(expected_handle)>(dlsym(lib, "fake_cuda_expected_handle"));
  }
  ~FakeCuda() {
    if (lib != nullptr) dlclose(lib);
  }
  std::string Handle(void* base) {
    char h[64];
    expected_handle(base, h);
    return std::string(h, 64);
  }
};

TEST(CudaIpc, FormatsUuidsAsNvidiaSmi) {
  const unsigned char b[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                               0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
  EXPECT_EQ(FormatGpuUuid(b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

TEST(CudaIpc, MissingRuntimeIsFailedPreconditionNamingEveryCandidate) {
  EXPECT_THAT(CudaIpc::Load({"/nonexistent/libcudart.so.13", "libfp4q-no-such-cudart.so"}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("CUDA runtime not found"),
                             HasSubstr("/nonexistent/libcudart.so.13: "),
                             HasSubstr("libfp4q-no-such-cudart.so: "))));
}

TEST(CudaIpc, RuntimeLackingCallsIsFailedPrecondition) {
  EXPECT_THAT(CudaIpc::Load({FP4Q_FAKE_CUDART_INCOMPLETE}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("lacks cudaGetDevice, cudaSetDevice, cudaFree, "
                                 "cudaPointerGetAttributes, cudaIpcGetMemHandle")));
}

TEST(CudaIpc, ExportFindsBaseOffsetHandleAndUuidAndRestoresTheDevice) {
  FakeCuda fake;
  ASSERT_NE(fake.add, nullptr) << dlerror();
  absl::StatusOr<std::unique_ptr<CudaIpc>> ipc = CudaIpc::Load({FP4Q_FAKE_CUDART});
  ASSERT_THAT(ipc, IsOk());
  std::vector<char> memory(1 << 16);
  fake.add(memory.data(), memory.size(), 2);
  ASSERT_EQ(fake.set_device(1), 0);

  absl::StatusOr<CudaIpcExport> e = (*ipc)->Export(memory.data() + 4096 + 12);
  ASSERT_THAT(e, IsOk());
  EXPECT_EQ(e->base, reinterpret_cast<uintptr_t>(memory.data()));
  EXPECT_EQ(e->offset, 4108u);
  EXPECT_EQ(e->allocation_bytes, memory.size());
  EXPECT_EQ(e->device, 2);
  EXPECT_EQ(e->device_uuid, "GPU-20212223-2425-2627-2829-2a2b2c2d2e2f");
  EXPECT_EQ(e->handle, fake.Handle(memory.data()));
  EXPECT_EQ(fake.current_device(), 1);  // restored

  int on_stack = 0;
  EXPECT_THAT((*ipc)->Export(&on_stack),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not CUDA memory (unregistered host memory)")));
  EXPECT_THAT((*ipc)->Export(nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "device pointer is null"));
  fake.set_error(100);
  EXPECT_THAT((*ipc)->Export(memory.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "CUDA unavailable: cudaPointerGetAttributes: cudaErrorNoDevice (no "
                       "CUDA-capable device is detected)"));
  fake.set_error(0);
  fake.remove(memory.data());
}

// The real runtime: on a machine with a GPU, export a cudaMalloc'd pointer and have another
// process open the handle and read the bytes at the exported offset; without one, the test is
// skipped with CUDA's own reason.
TEST(CudaIpc, RealRuntimeExportsADeviceAllocation) {
  absl::StatusOr<std::unique_ptr<CudaIpc>> ipc = CudaIpc::Load();
  if (!ipc.ok()) GTEST_SKIP() << "no CUDA runtime: " << ipc.status();
  absl::StatusOr<std::unique_ptr<CudaRuntime>> runtime = TestRuntime(**ipc);
  ASSERT_THAT(runtime, IsOk());
  const CudaRuntime& cuda = **runtime;
  void* dev = nullptr;
  const int err = cuda.Malloc(&dev, 1 << 20);
  if (err != 0) {
    int probe = 0;
    const absl::Status why = (*ipc)->Export(&probe).status();
    GTEST_SKIP() << "no usable CUDA device (cudaMalloc error " << err << "; " << why << ")";
  }
  std::string pattern(64, '\0');
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>(i * 7 + 3);
  ASSERT_EQ(cuda.Memcpy(static_cast<char*>(dev) + 4096, pattern.data(), pattern.size(),
                        CudaMemcpyKind::kHostToDevice),
            0);
  absl::StatusOr<CudaIpcExport> a = (*ipc)->Export(static_cast<char*>(dev) + 4096);
  absl::StatusOr<CudaIpcExport> b = (*ipc)->Export(dev);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->offset, 4096u);
  EXPECT_EQ(a->base, reinterpret_cast<uintptr_t>(dev));
  EXPECT_GE(a->allocation_bytes, 1u << 20);
  EXPECT_EQ(a->handle.size(), kCudaIpcHandleBytes);
  EXPECT_EQ(a->handle, b->handle);  // one allocation, one handle: what the session cache keys
  EXPECT_THAT(a->device_uuid, StartsWith("GPU-"));
  EXPECT_EQ(a->device_uuid.size(), 40u);
  std::printf("exported %s offset %llu of %llu bytes on %s\n", Hex(a->handle).substr(0, 16).c_str(),
              static_cast<unsigned long long>(a->offset),
              static_cast<unsigned long long>(a->allocation_bytes), a->device_uuid.c_str());

  // Another process opens the handle and reads the bytes at the offset.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  absl::StatusOr<testing::RunResult> child = testing::Run(
      {self, "--gtest_filter=CudaIpcChild.OpensTheExportedHandle"},
      {"FP4Q_IPC_HANDLE_HEX=" + Hex(a->handle), "FP4Q_IPC_OFFSET=" + std::to_string(a->offset),
       "FP4Q_IPC_BYTES=64"});
  cuda.Free(dev);
  ASSERT_THAT(child, IsOk());
  EXPECT_EQ(child->exit_code, 0) << child->out << child->err;
  EXPECT_THAT(child->out, HasSubstr("IPC_READ " + Hex(pattern) + "\n")) << child->err;
}

// Runs only as the child of RealRuntimeExportsADeviceAllocation.
TEST(CudaIpcChild, OpensTheExportedHandle) {
  const char* hex = std::getenv("FP4Q_IPC_HANDLE_HEX");
  if (hex == nullptr) GTEST_SKIP() << "runs only as the child of RealRuntimeExportsADeviceAllocation";
  const size_t offset = std::stoul(std::getenv("FP4Q_IPC_OFFSET"));
  const size_t bytes = std::stoul(std::getenv("FP4Q_IPC_BYTES"));
  absl::StatusOr<std::unique_ptr<CudaIpc>> ipc = CudaIpc::Load();
  ASSERT_THAT(ipc, IsOk());
  absl::StatusOr<std::unique_ptr<CudaRuntime>> runtime = TestRuntime(**ipc);
  ASSERT_THAT(runtime, IsOk());
  const CudaRuntime& cuda = **runtime;
  CudaIpcMemHandle handle;
  const std::string raw = Unhex(hex);
  ASSERT_EQ(raw.size(), sizeof(handle.reserved));
  std::memcpy(handle.reserved, raw.data(), raw.size());
  void* base = nullptr;
  ASSERT_EQ(cuda.IpcOpenMemHandle(&base, handle, 1), 0);
  std::string got(bytes, '\0');
  ASSERT_EQ(cuda.Memcpy(got.data(), static_cast<char*>(base) + offset, bytes,
                        CudaMemcpyKind::kDeviceToHost),
            0);
  ASSERT_EQ(cuda.IpcCloseMemHandle(base), 0);
  std::printf("IPC_READ %s\n", Hex(got).c_str());
}

// ---- Sessions.

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClientOptions options;
    options.address = server_.address();
    client_ = Client::Connect(options).value();
    session_options_.client_name = "session-test";
    session_options_.cuda_runtime_candidates = {FP4Q_FAKE_CUDART};
  }
  FakeServer server_;
  std::unique_ptr<Client> client_;
  SessionOptions session_options_;
};

TEST_F(SessionTest, KeepAliveThreadRenewsAndDestructorCloses) {
  session_options_.keep_alive_interval = absl::Milliseconds(20);
  std::string id;
  {
    absl::StatusOr<std::unique_ptr<Session>> s = Session::Open(*client_, session_options_);
    ASSERT_THAT(s, IsOk());
    id = (*s)->id();
    EXPECT_EQ(id, "0123456789abcdef0123456789abcdef");
    EXPECT_EQ((*s)->lease_seconds(), 30u);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (server_.service().calls("KeepAlive") < 3 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_GE(server_.service().calls("KeepAlive"), 3);
    EXPECT_EQ(server_.service().last_metadata("KeepAlive").session, id);
    EXPECT_THAT((*s)->keep_alive_status(), IsOk());
    EXPECT_EQ(server_.service().calls("CloseSession"), 0);
    EXPECT_EQ((*s)->call_options().session_id, id);
  }
  EXPECT_EQ(server_.service().calls("CloseSession"), 1);
  EXPECT_EQ(server_.service().last_metadata("CloseSession").session, id);
}

TEST_F(SessionTest, ExplicitCloseIsIdempotentAndEndsUse) {
  session_options_.keep_alive_interval = absl::InfiniteDuration();
  auto s = Session::Open(*client_, session_options_).value();
  EXPECT_EQ(s->KeepAlive().value_or(0), 30u);
  EXPECT_THAT(s->Close(), IsOk());
  EXPECT_THAT(s->Close(), IsOk());
  EXPECT_THAT(s->KeepAlive(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("session 0123456789abcdef0123456789abcdef "
                                                 "is closed")));
  int x = 0;
  EXPECT_THAT(s->RegionFor(&x, 4), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            HasSubstr("is closed")));
  s.reset();
  EXPECT_EQ(server_.service().calls("CloseSession"), 1);
  EXPECT_EQ(server_.service().calls("KeepAlive"), 1);
}

TEST_F(SessionTest, RegionsAreRegisteredOncePerAllocationAndRefreshedWhenReplaced) {
  FakeCuda fake;
  ASSERT_NE(fake.add, nullptr) << dlerror();
  session_options_.keep_alive_interval = absl::InfiniteDuration();
  auto s = Session::Open(*client_, session_options_).value();
  std::vector<char> memory(1 << 20);
  char* base = memory.data();
  fake.add(base, memory.size(), 1);

  absl::StatusOr<v1::RegionSlice> a = s->RegionFor(base + 256, 1024);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->region_id(), "region-1");
  EXPECT_EQ(a->offset(), 256u);
  absl::StatusOr<v1::RegionSlice> b = s->RegionFor(base + 65536, 4096);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->region_id(), "region-1");
  EXPECT_EQ(b->offset(), 65536u);
  std::vector<v1::RegisterCudaRegionRequest> regs = server_.service().registrations();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0].ipc_handle(), fake.Handle(base));
  EXPECT_EQ(regs[0].size(), memory.size());
  EXPECT_EQ(regs[0].device_uuid(), "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f");
  EXPECT_EQ(server_.service().last_metadata("RegisterCudaRegion").session, s->id());
  EXPECT_EQ(s->registered_allocations(), 1u);

  // Past the allocation's end (the sum would wrap if computed carelessly).
  EXPECT_THAT(s->RegionFor(base + memory.size() - 16, 17),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bytes = 17 at offset 1048560 overruns the allocation of "
                                 "1048576 bytes")));
  EXPECT_THAT(s->RegionFor(base + 8, UINT64_MAX),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overruns")));

  // Freed and reallocated at the same base: a new handle, so a new registration.
  fake.remove(base);
  fake.add(base, memory.size(), 1);
  absl::StatusOr<v1::RegionSlice> c = s->RegionFor(base, 8);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->region_id(), "region-2");
  EXPECT_EQ(server_.service().registrations().size(), 2u);
  EXPECT_THAT(server_.service().unregistrations(), ::testing::ElementsAre("region-1"));
  EXPECT_EQ(s->registered_allocations(), 1u);

  // Release before free.
  EXPECT_THAT(s->ReleaseAllocation(base + 100), IsOk());
  EXPECT_THAT(server_.service().unregistrations(),
              ::testing::ElementsAre("region-1", "region-2"));
  EXPECT_EQ(s->registered_allocations(), 0u);
  EXPECT_THAT(s->ReleaseAllocation(base + 100),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no registered allocation")));

  int host = 0;
  EXPECT_THAT(s->RegionFor(&host, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not CUDA memory")));
  fake.remove(base);
}

TEST_F(SessionTest, RegionForWithoutCudaIsFailedPrecondition) {
  session_options_.keep_alive_interval = absl::InfiniteDuration();
  session_options_.cuda_runtime_candidates = {"libfp4q-no-such-cudart.so"};
  auto s = Session::Open(*client_, session_options_).value();
  int x = 0;
  EXPECT_THAT(s->RegionFor(&x, 4), StatusIs(absl::StatusCode::kFailedPrecondition,
                                            HasSubstr("CUDA runtime not found")));
  EXPECT_TRUE(server_.service().registrations().empty());
}

}  // namespace
}  // namespace fp4q::client
