// The CUDA backend's device half: identity, memory and copies, streams, argument errors, CUDA IPC
// (with a second process exporting a real handle) and poisoning by a sticky error (in a child
// process, since it ruins the context). Numerics are in cuda_quantize_test.cc, cuda_ops_test.cc
// and cuda_matmul_test.cc.
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

extern char** environ;

namespace fp4q::kernels {
namespace {

using cuda_testing::CudaTest;
using cuda_testing::DeviceBuffer;
using ::testing::HasSubstr;

#define EXPECT_STATUS(expr, want_code, substr)                          \
  do {                                                                  \
    const absl::Status s_ = (expr);                                     \
    EXPECT_EQ(s_.code(), (want_code)) << s_;                            \
    EXPECT_THAT(std::string(s_.message()), HasSubstr(substr)) << s_;    \
  } while (0)

TEST_F(CudaTest, InfoNamesTheGpu) {
  const DeviceInfo info = gpu().Info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_EQ(info.ordinal, 0);
  EXPECT_TRUE(std::regex_match(
      info.uuid, std::regex("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")))
      << info.uuid;
  EXPECT_GE(info.cc_major, 8);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, size_t{1} << 30);
  EXPECT_TRUE(gpu().Healthy().ok());
}

TEST_F(CudaTest, CopiesRoundTripOnDefaultAndCallerStreams) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (Stream s : {Stream{nullptr}, static_cast<Stream>(stream)}) {
    std::vector<uint8_t> src(100003);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    auto a = gpu().Allocate(src.size());
    auto b = gpu().Allocate(src.size() + 1);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(gpu().CopyFromHost(*a, src.data(), src.size(), s).ok());
    ASSERT_TRUE(gpu().Memset(*b, 0x11, src.size() + 1, s).ok());
    // Unaligned destination.
    ASSERT_TRUE(gpu().CopyDeviceToDevice(static_cast<uint8_t*>(*b) + 1, *a, src.size(), s).ok());
    std::vector<uint8_t> back(src.size() + 1, 0);
    ASSERT_TRUE(gpu().CopyToHost(back.data(), *b, back.size(), s).ok());
    ASSERT_TRUE(gpu().Synchronize(s).ok());
    EXPECT_EQ(back[0], 0x11);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin() + 1));
    gpu().Free(*a);
    gpu().Free(*b);
  }
  cudaStreamDestroy(stream);
}

TEST_F(CudaTest, BadArgumentsAreRejectedWithTheField) {
  std::vector<uint8_t> host(16);
  EXPECT_STATUS(gpu().CopyFromHost(nullptr, host.data(), 16, nullptr),
                absl::StatusCode::kInvalidArgument, "dst: null");
  EXPECT_STATUS(gpu().CopyToHost(host.data(), nullptr, 16, nullptr),
                absl::StatusCode::kInvalidArgument, "src: null");
  EXPECT_STATUS(gpu().Memset(nullptr, 0, 4, nullptr), absl::StatusCode::kInvalidArgument,
                "dst: null");
  // Far more than any GPU has.
  auto huge = gpu().Allocate(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("cudaMalloc"));
  EXPECT_TRUE(gpu().Healthy().ok());

  // Validation is shared with the CPU backend and runs before any byte is touched.
  DeviceBuffer x(gpu(), 40 * 4);
  cuda_testing::QuantPair q(gpu(), Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 48);
  EXPECT_STATUS(gpu().Quantize(ConstTensor{x.get(), DType::kF32, 1, 40}, QuantizeOptions{},
                               nullptr, &q.dev, nullptr, nullptr),
                absl::StatusCode::kInvalidArgument, "x.cols: 40");
  for (uint8_t b : q.d_codes->Download()) ASSERT_EQ(b, cuda_testing::kDevicePoison);
}

TEST_F(CudaTest, IpcRejectsBadHandles) {
  EXPECT_STATUS(gpu().OpenIpcHandle("abc").status(), absl::StatusCode::kInvalidArgument,
                "ipc_handle: 3 bytes");
  EXPECT_STATUS(gpu().OpenIpcHandle(std::string(64, '\x7f')).status(),
                absl::StatusCode::kInvalidArgument, "ipc_handle: cannot be opened");
  int local = 0;
  EXPECT_STATUS(gpu().CloseIpcHandle(&local), absl::StatusCode::kNotFound,
                "not an open IPC mapping");
  EXPECT_TRUE(gpu().Healthy().ok()) << "a bad handle must not poison the backend";
  auto p = gpu().Allocate(64);
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) gpu().Free(*p);
}

// ---- child processes: the same binary, one test selected, a role in the environment.

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;  // the child's stdout
  int in_fd = -1;       // the child's stdin (write end)
};

Child Spawn(const std::string& test, const std::string& role) {
  int out_pipe[2], in_pipe[2];
  Child c;
  if (pipe(out_pipe) != 0 || pipe(in_pipe) != 0) return c;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  posix_spawn_file_actions_addclose(&fa, in_pipe[1]);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
  env_s.push_back("FP4Q_CUDA_TEST_ROLE=" + role);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string filter = "--gtest_filter=" + test;
  char* argv[] = {self.data(), filter.data(), nullptr};
  if (posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv, envp.data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  close(in_pipe[0]);
  c.out = fdopen(out_pipe[0], "r");
  c.in_fd = in_pipe[1];
  return c;
}

int Wait(Child& c) {
  if (c.in_fd >= 0) close(c.in_fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  if (c.out != nullptr) fclose(c.out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Role() {
  const char* r = std::getenv("FP4Q_CUDA_TEST_ROLE");
  return r != nullptr ? r : "";
}

constexpr size_t kIpcBytes = 1 << 20;

// Child role "exporter": allocates, fills a pattern, prints the handle (hex) and waits for EOF.
TEST(CudaChild, IpcExporter) {
  if (Role() != "exporter") GTEST_SKIP() << "runs as a child of CudaTest.IpcOpensAnotherProcessesMemory";
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kIpcBytes), cudaSuccess);
  std::vector<uint32_t> pattern(kIpcBytes / 4);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(i * 2654435761u);
  ASSERT_EQ(cudaMemcpy(p, pattern.data(), kIpcBytes, cudaMemcpyHostToDevice), cudaSuccess);
  cudaIpcMemHandle_t h;
  ASSERT_EQ(cudaIpcGetMemHandle(&h, p), cudaSuccess);
  const auto* b = reinterpret_cast<const unsigned char*>(&h);
  std::string hex;
  for (size_t i = 0; i < sizeof(h); ++i) hex += absl::StrFormat("%02x", b[i]);
  std::printf("HANDLE %s\n", hex.c_str());
  std::fflush(stdout);
  char buf[16];
  while (read(0, buf, sizeof buf) > 0) {
  }
  cudaFree(p);
}

TEST_F(CudaTest, IpcOpensAnotherProcessesMemory) {
  Child c = Spawn("CudaChild.IpcExporter", "exporter");
  ASSERT_GT(c.pid, 0);
  char line[512] = {0};
  std::string handle;
  while (std::fgets(line, sizeof line, c.out) != nullptr) {
    if (std::strncmp(line, "HANDLE ", 7) == 0) {
      const std::string hex(line + 7, 128);
      for (size_t i = 0; i < 64; ++i) {
        handle.push_back(static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16)));
      }
      break;
    }
  }
  ASSERT_EQ(handle.size(), 64u) << "the exporter printed no handle";
  auto base = gpu().OpenIpcHandle(handle);
  ASSERT_TRUE(base.ok()) << base.status();
  std::vector<uint32_t> got(kIpcBytes / 4, 0);
  ASSERT_TRUE(gpu().CopyToHost(got.data(), *base, kIpcBytes, nullptr).ok());
  ASSERT_TRUE(gpu().Synchronize(nullptr).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], static_cast<uint32_t>(i * 2654435761u)) << "word " << i;
  }
  EXPECT_TRUE(gpu().CloseIpcHandle(*base).ok());
  EXPECT_STATUS(gpu().CloseIpcHandle(*base), absl::StatusCode::kNotFound, "not an open");
  EXPECT_EQ(Wait(c), 0);
}

// Child role "poison": a kernel reading an invalid address poisons the backend.
TEST(CudaChild, StickyErrorPoisons) {
  if (Role() != "poison") GTEST_SKIP() << "runs as a child of CudaTest.StickyErrorPoisonsTheBackend";
  auto& env = cuda_testing::Env();
  ASSERT_TRUE(env.skip_reason.empty()) << env.skip_reason;
  Backend& gpu = *env.gpu;
  std::vector<float> global = {1.0f, 1.0f};
  DeviceBuffer g(gpu, 8);
  g.Upload(global.data(), 8);
  DeviceBuffer scales(gpu, 4096 / 16);
  DeviceBuffer out(gpu, 4096 * 4);
  // Codes at an address nothing maps (16-aligned, so it is used as is).
  ConstQuantizedTensor q{Format::kNvfp4, BlockShape::k1x16, ScaleLayout::kPlain, 1, 4096,
                         reinterpret_cast<const uint8_t*>(uintptr_t{0x10}), 2048,
                         static_cast<const uint8_t*>(scales.get()), 256,
                         static_cast<const float*>(g.get())};
  const absl::Status launch =
      gpu.Dequantize(q, MutTensor{out.get(), DType::kF32, 1, 4096, 4096 * 4}, nullptr);
  const absl::Status sync = gpu.Synchronize(nullptr);
  EXPECT_FALSE(launch.ok() && sync.ok()) << "reading address 0x10 did not fail";
  EXPECT_FALSE(gpu.Healthy().ok());
  EXPECT_THAT(std::string(gpu.Healthy().message()), HasSubstr("poisoned"));
  EXPECT_THAT(std::string(gpu.Healthy().message()), HasSubstr("cudaErrorIllegalAddress"));
  auto p = gpu.Allocate(16);
  EXPECT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("poisoned"));
  std::printf("POISON-CHECKED\n");
  std::fflush(stdout);
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST_F(CudaTest, StickyErrorPoisonsTheBackend) {
  Child c = Spawn("CudaChild.StickyErrorPoisons", "poison");
  ASSERT_GT(c.pid, 0);
  std::string output;
  char line[512];
  while (std::fgets(line, sizeof line, c.out) != nullptr) output += line;
  EXPECT_THAT(output, HasSubstr("POISON-CHECKED"));
  EXPECT_EQ(Wait(c), 0) << output;
}

}  // namespace
}  // namespace fp4q::kernels
