// The CUDA module loader (cuda_module.h) against fake modules built by this directory.
#include "fp4q/kernels/cuda_module.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace fp4q::kernels {
namespace {

using ::fp4q::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

class CudaModuleTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("FP4Q_CUDA_MODULE"); }
  void TearDown() override { unsetenv("FP4Q_CUDA_MODULE"); }
};

TEST_F(CudaModuleTest, LoadsAModuleAndCreatesBackends) {
  auto module = CudaModule::Load(FAKE_MODULE_OK);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_EQ((*module)->path(), FAKE_MODULE_OK);
  EXPECT_EQ((*module)->DeviceCount().value(), 2);
  auto backend = (*module)->CreateBackend(0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->Info().backend, "cpu");  // the fake hands out CPU backends
  EXPECT_THAT(
      (*module)->CreateBackend(1),
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("cannot create a backend on device 1: fake: device 1 is unusable")));
  EXPECT_THAT((*module)->CreateBackend(2), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("ordinal: 2 is not in [0, 2)")));
  EXPECT_THAT((*module)->CreateBackend(-1), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("ordinal: -1 is not in [0, 2)")));
  backend->reset();  // backends go before their module
}

TEST_F(CudaModuleTest, NoDriverIsUnavailable) {
  auto module = CudaModule::Load(FAKE_MODULE_NODRIVER);
  ASSERT_TRUE(module.ok()) << module.status();
  EXPECT_THAT((*module)->DeviceCount(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("fake: CUDA driver version is insufficient")));
  EXPECT_THAT((*module)->CreateBackend(0),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no usable CUDA devices")));
}

TEST_F(CudaModuleTest, AbiMismatchAndMissingSymbols) {
  EXPECT_THAT(CudaModule::Load(FAKE_MODULE_BADABI),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("has ABI version 99, this build needs ",
                                              FP4Q_CUDA_ABI_VERSION))));
  EXPECT_THAT(
      CudaModule::Load(FAKE_MODULE_NOSYMS),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("lacks the fp4q_cuda_* C ABI")));
}

TEST_F(CudaModuleTest, MissingOrBrokenFiles) {
  EXPECT_THAT(CudaModule::Load("/nonexistent/libfp4q_cuda.so"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/libfp4q_cuda.so")));
  const std::string junk = ::testing::TempDir() + "/fp4q_junk_" + std::to_string(getpid()) + ".so";
  std::ofstream(junk) << "not an ELF file";
  EXPECT_THAT(CudaModule::Load(junk),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot be loaded")));
  std::remove(junk.c_str());
}

// The library reads no environment: $FP4Q_CUDA_MODULE is the programs' (fp4qd passes it as the
// path), so a set variable changes nothing here.
TEST_F(CudaModuleTest, TheLoaderReadsNoEnvironment) {
  setenv("FP4Q_CUDA_MODULE", FAKE_MODULE_NODRIVER, 1);
  auto module = CudaModule::Load();
  if (module.ok()) EXPECT_NE((*module)->path(), FAKE_MODULE_NODRIVER);
  EXPECT_THAT(module.status().message(), Not(HasSubstr(FAKE_MODULE_NODRIVER)));
  // A given path that does not exist is reported, not silently skipped.
  EXPECT_THAT(CudaModule::Load("/nonexistent/fake.so"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("tried: /nonexistent/fake.so")));
}

TEST_F(CudaModuleTest, DefaultSearchLooksBesideTheExecutable) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  ASSERT_GT(n, 0);
  std::string dir(buf, n);
  dir = dir.substr(0, dir.rfind('/'));
  const std::string beside = dir + "/libfp4q_cuda.so";
  auto module = CudaModule::Load();
  if (access(beside.c_str(), F_OK) == 0) {
    // A real module was built next to the test (CUDA toolkit present).
    ASSERT_TRUE(module.ok() || module.status().code() == absl::StatusCode::kFailedPrecondition)
        << module.status();
    if (module.ok()) EXPECT_EQ((*module)->path(), beside);
  } else {
    EXPECT_THAT(module, StatusIs(absl::StatusCode::kNotFound,
                                 HasSubstr("tried: " + beside + ", " + dir +
                                           "/../lib/libfp4q_cuda.so, libfp4q_cuda.so (")));
  }
}

}  // namespace
}  // namespace fp4q::kernels
