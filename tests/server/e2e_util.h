// End-to-end test helpers: the real fp4qd as a child process, a tiny HTTP GET for /metrics, the
// Prometheus text format, gRPC stubs, and fp4q.v1 tensors built from host data.
#ifndef FP4Q_TESTS_SERVER_E2E_UTIL_H_
#define FP4Q_TESTS_SERVER_E2E_UTIL_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fp4q/kernels/types.h"
#include "fp4q/v1/fp4q.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace fp4q::server::testing {

namespace v1 = ::fp4q::v1;

// A temporary directory, removed (with its files) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// fp4qd as a child process ($FP4QD_BINARY, else the build's FP4QD_PATH). Start() passes --listen
// 127.0.0.1:0 and
// --metrics_listen 127.0.0.1:0 unless `flags` set them, waits for the address lines on stdout,
// and keeps stderr in a file. The destructor kills the process if it still runs.
class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      std::vector<std::string> flags, absl::Duration timeout = absl::Seconds(30));
  ~ServerProcess();

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Waits for the exit; the exit code, 128 + signal when killed, or -1 on timeout (then
  // SIGKILL).
  int Wait(absl::Duration timeout = absl::Seconds(30));
  bool running() const { return pid_ > 0; }
  std::string Log() const;  // stderr so far

  std::shared_ptr<grpc::Channel> Channel() const;
  std::unique_ptr<v1::Fp4q::Stub> Stub() const;
  std::unique_ptr<grpc::health::v1::Health::Stub> Health() const;

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  std::string address_;
  std::string metrics_address_;
  std::string log_path_;
};

// Runs fp4qd to completion (for startup failures); returns the exit code, stderr in *log.
int RunServerToExit(const std::vector<std::string>& flags, std::string* log,
                    absl::Duration timeout = absl::Seconds(30));

// A channel to `target` with unlimited message sizes.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target);

// HTTP/1.0 GET of http://address/path; the body, or an error.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// The value of the sample `name{labels}` in Prometheus text; labels match regardless of order.
// NOT_FOUND when absent.
absl::StatusOr<double> MetricValue(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels = {});

// Health check of `service` ("" overall); the status enum or the RPC error.
absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    grpc::health::v1::Health::Stub& stub, const std::string& service);

// Calls with a client context carrying `session` as "fp4q-session" metadata when non-empty.
std::unique_ptr<grpc::ClientContext> Context(const std::string& session = "",
                                             absl::Duration deadline = absl::Seconds(60));
// OpenSession with `name` as client_name; the session id ("" and a gtest failure if refused).
std::string OpenSession(v1::Fp4q::Stub& stub, const std::string& name);

// ---- Tensors.
std::string RandomF32(int64_t n, uint32_t seed, float scale = 1.0f);
// bf16 by truncation of RandomF32's values (any bf16 bits will do as input).
std::string RandomBF16(int64_t n, uint32_t seed, float scale = 1.0f);
v1::Tensor InlineTensor(const std::string& bytes, int64_t rows, int64_t cols,
                        v1::DType dtype = v1::DTYPE_F32);
v1::Tensor RegionTensor(const std::string& region, uint64_t offset, int64_t rows, int64_t cols,
                        v1::DType dtype = v1::DTYPE_F32);

// The CPU backend's results for host inputs (the oracle of the bit-for-bit checks).
struct HostQuantized {
  std::string codes, scales;
  float global[2] = {0, 0};
  kernels::QuantizedTensor View(const kernels::QuantizeOptions& o, int64_t rows, int64_t cols);
};
struct RefQuantize {
  absl::Status status;
  HostQuantized rowwise, columnwise;
};
RefQuantize CpuQuantize(const std::string& x, kernels::DType dtype, int64_t rows, int64_t cols,
                        const kernels::QuantizeOptions& o);
absl::StatusOr<std::string> CpuQdq(const std::string& x, kernels::DType dtype, int64_t rows,
                                   int64_t cols, const kernels::QuantizeOptions& o,
                                   kernels::DType out_dtype);
absl::StatusOr<std::string> CpuDequantize(const HostQuantized& q, const kernels::QuantizeOptions& o,
                                          int64_t rows, int64_t cols, kernels::DType out_dtype);
absl::StatusOr<std::string> CpuMatmul(const HostQuantized& a, int64_t m, const HostQuantized& b,
                                      int64_t n, int64_t k, const kernels::QuantizeOptions& o,
                                      kernels::DType out_dtype);
// The same with each operand's own format, block and layout.
absl::StatusOr<std::string> CpuMatmul(const HostQuantized& a, const kernels::QuantizeOptions& oa,
                                      int64_t m, const HostQuantized& b,
                                      const kernels::QuantizeOptions& ob, int64_t n, int64_t k,
                                      kernels::DType out_dtype);

// A reply's QuantizedTensor as an operand of a request.
v1::QuantizedTensor AsOperand(const v1::QuantizedTensor& q);

}  // namespace fp4q::server::testing

#endif  // FP4Q_TESTS_SERVER_E2E_UTIL_H_
