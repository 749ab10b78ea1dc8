#include "e2e_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "fp4q/kernels/backend.h"
#include "gtest/gtest.h"

#ifndef FP4QD_PATH
#error "FP4QD_PATH must name the fp4qd binary"
#endif

namespace fp4q::server::testing {

TempDir::TempDir() {
  char tmpl[] = "/tmp/fp4q_e2e_XXXXXX";
  const char* d = mkdtemp(tmpl);
  path_ = d == nullptr ? "/tmp" : d;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
}

namespace {

bool HasFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (const auto& f : flags) {
    if (absl::StartsWith(f, "--" + name + "=") || f == "--" + name) return true;
  }
  return false;
}

// The fp4qd under test: $FP4QD_BINARY (e.g. on another machine), else the one built here.
std::string BinaryPath() {
  const char* env = std::getenv("FP4QD_BINARY");
  return env != nullptr && *env != '\0' ? env : FP4QD_PATH;
}

pid_t Spawn(const std::vector<std::string>& flags, int stdout_fd, const std::string& log_path) {
  std::vector<std::string> args = {BinaryPath()};
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child.
  const int err = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (err >= 0) dup2(err, 2);
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

int WaitPid(pid_t pid, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(std::vector<std::string> flags,
                                                                    absl::Duration timeout) {
  if (!HasFlag(flags, "listen")) flags.push_back("--listen=127.0.0.1:0");
  if (!HasFlag(flags, "metrics_listen")) flags.push_back("--metrics_listen=127.0.0.1:0");
  const bool want_metrics = [&] {
    for (const auto& f : flags) {
      if (f == "--metrics_listen=") return false;
    }
    return true;
  }();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  char tmpl[] = "/tmp/fp4qd_log_XXXXXX";
  const int log_fd = mkstemp(tmpl);
  if (log_fd >= 0) ::close(log_fd);
  p->log_path_ = tmpl;
  p->pid_ = Spawn(flags, fds[1], p->log_path_);
  ::close(fds[1]);
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  while (p->address_.empty() || (want_metrics && p->metrics_address_.empty())) {
    const int left = static_cast<int>(absl::ToInt64Milliseconds(end - absl::Now()));
    pollfd pfd{fds[0], POLLIN, 0};
    if (left <= 0 || poll(&pfd, 1, left) <= 0) {
      ::close(fds[0]);
      return absl::DeadlineExceededError(
          absl::StrCat("fp4qd printed no addresses; stdout: ", out, "; stderr: ", p->Log()));
    }
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof(buf));
    if (n <= 0) {
      ::close(fds[0]);
      const int code = p->Wait(absl::Seconds(5));
      return absl::UnavailableError(
          absl::StrCat("fp4qd exited (", code, "); stdout: ", out, "; stderr: ", p->Log()));
    }
    out.append(buf, static_cast<size_t>(n));
    // Only complete lines count (a line may arrive in pieces).
    const std::string complete = out.substr(0, out.rfind('\n') + 1);
    for (absl::string_view line : absl::StrSplit(complete, '\n')) {
      if (absl::ConsumePrefix(&line, "fp4qd: listening on ")) p->address_ = std::string(line);
      if (absl::ConsumePrefix(&line, "fp4qd: metrics on ")) p->metrics_address_ = std::string(line);
    }
  }
  ::close(fds[0]);
  return p;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (!log_path_.empty()) std::remove(log_path_.c_str());
}

void ServerProcess::Signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int ServerProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const int code = WaitPid(pid_, timeout);
  pid_ = -1;
  return code;
}

std::string ServerProcess::Log() const { return ReadFile(log_path_); }

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel() const { return MakeChannel(address_); }
std::unique_ptr<v1::Fp4q::Stub> ServerProcess::Stub() const { return v1::Fp4q::NewStub(Channel()); }
std::unique_ptr<grpc::health::v1::Health::Stub> ServerProcess::Health() const {
  return grpc::health::v1::Health::NewStub(Channel());
}

int RunServerToExit(const std::vector<std::string>& flags, std::string* log,
                    absl::Duration timeout) {
  char tmpl[] = "/tmp/fp4qd_log_XXXXXX";
  const int log_fd = mkstemp(tmpl);
  if (log_fd >= 0) ::close(log_fd);
  std::vector<std::string> all = flags;
  if (!HasFlag(all, "listen")) all.push_back("--listen=127.0.0.1:0");
  if (!HasFlag(all, "metrics_listen")) all.push_back("--metrics_listen=");
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = Spawn(all, devnull, tmpl);
  if (devnull >= 0) ::close(devnull);
  const int code = WaitPid(pid, timeout);
  if (log != nullptr) *log = ReadFile(tmpl);
  std::remove(tmpl);
  return code;
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError("address: " + address);
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return absl::UnavailableError("connect " + address);
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return absl::UnavailableError("write");
  }
  std::string resp;
  char buf[16384];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t split = resp.find("\r\n\r\n");
  if (split == std::string::npos || !absl::StartsWith(resp, "HTTP/1.")) {
    return absl::DataLossError("not an HTTP response: " + resp.substr(0, 200));
  }
  if (!absl::StrContains(resp.substr(0, resp.find("\r\n")), " 200 ")) {
    return absl::UnavailableError("HTTP status: " + resp.substr(0, resp.find("\r\n")));
  }
  return resp.substr(split + 4);
}

absl::StatusOr<double> MetricValue(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos || line.substr(0, name_end) != name) continue;
    std::map<std::string, std::string> got;
    absl::string_view rest = line.substr(name_end);
    if (rest[0] == '{') {
      const size_t close = rest.find('}');
      if (close == absl::string_view::npos) continue;
      for (absl::string_view kv :
           absl::StrSplit(rest.substr(1, close - 1), ',', absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        if (eq == absl::string_view::npos) continue;
        absl::string_view v = kv.substr(eq + 1);
        absl::ConsumePrefix(&v, "\"");
        absl::ConsumeSuffix(&v, "\"");
        got[std::string(kv.substr(0, eq))] = std::string(v);
      }
      rest = rest.substr(close + 1);
    }
    if (got != labels) continue;
    double value = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(rest), &value)) {
      return absl::DataLossError("bad value: " + std::string(line));
    }
    return value;
  }
  return absl::NotFoundError("no sample " + name);
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> CheckHealth(
    grpc::health::v1::Health::Stub& stub, const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = Context();
  grpc::Status s = stub.Check(ctx.get(), req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp.status();
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& session, absl::Duration deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!session.empty()) ctx->AddMetadata("fp4q-session", session);
  return ctx;
}

std::string OpenSession(v1::Fp4q::Stub& stub, const std::string& name) {
  v1::OpenSessionRequest r;
  r.set_client_name(name);
  v1::OpenSessionReply rep;
  auto ctx = Context();
  grpc::Status s = stub.OpenSession(ctx.get(), r, &rep);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return rep.session_id();
}

std::string RandomF32(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::string out(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(gen);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

std::string RandomBF16(int64_t n, uint32_t seed, float scale) {
  const std::string f = RandomF32(n, seed, scale);
  std::string out(static_cast<size_t>(n) * 2, '\0');
  for (int64_t i = 0; i < n; ++i) std::memcpy(out.data() + 2 * i, f.data() + 4 * i + 2, 2);
  return out;
}

v1::Tensor InlineTensor(const std::string& bytes, int64_t rows, int64_t cols, v1::DType dtype) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(rows);
  t.add_shape(cols);
  t.set_inline_data(bytes);
  return t;
}

v1::Tensor RegionTensor(const std::string& region, uint64_t offset, int64_t rows, int64_t cols,
                        v1::DType dtype) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(rows);
  t.add_shape(cols);
  t.mutable_region()->set_region_id(region);
  t.mutable_region()->set_offset(offset);
  return t;
}

kernels::QuantizedTensor HostQuantized::View(const kernels::QuantizeOptions& o, int64_t rows,
                                             int64_t cols) {
  kernels::QuantizedTensor q;
  q.format = o.format;
  q.block = o.block;
  q.scale_layout = o.scale_layout;
  q.rows = rows;
  q.cols = cols;
  codes.assign(*kernels::CodeBytes(rows, cols, "x"), '\0');
  scales.assign(*kernels::ScaleBytes(rows, cols, o.format, o.scale_layout, "x"), '\0');
  q.codes = reinterpret_cast<uint8_t*>(codes.data());
  q.codes_capacity = codes.size();
  q.scales = reinterpret_cast<uint8_t*>(scales.data());
  q.scales_capacity = scales.size();
  q.global = global;
  return q;
}

RefQuantize CpuQuantize(const std::string& x, kernels::DType dtype, int64_t rows, int64_t cols,
                        const kernels::QuantizeOptions& o) {
  RefQuantize r;
  auto cpu = kernels::CreateCpuBackend();
  kernels::QuantizedTensor rw, cw;
  if (o.rowwise) rw = r.rowwise.View(o, rows, cols);
  if (o.columnwise) cw = r.columnwise.View(o, cols, rows);
  r.status = cpu->Quantize({x.data(), dtype, rows, cols}, o, nullptr, o.rowwise ? &rw : nullptr,
                           o.columnwise ? &cw : nullptr, nullptr);
  return r;
}

absl::StatusOr<std::string> CpuQdq(const std::string& x, kernels::DType dtype, int64_t rows,
                                   int64_t cols, const kernels::QuantizeOptions& o,
                                   kernels::DType out_dtype) {
  auto cpu = kernels::CreateCpuBackend();
  std::string out(static_cast<size_t>(rows * cols) * kernels::DTypeSize(out_dtype), '\0');
  absl::Status s = cpu->Qdq({x.data(), dtype, rows, cols}, o, nullptr,
                            {out.data(), out_dtype, rows, cols, out.size()}, nullptr);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> CpuDequantize(const HostQuantized& q, const kernels::QuantizeOptions& o,
                                          int64_t rows, int64_t cols, kernels::DType out_dtype) {
  auto cpu = kernels::CreateCpuBackend();
  kernels::ConstQuantizedTensor c;
  c.format = o.format;
  c.block = o.block;
  c.scale_layout = o.scale_layout;
  c.rows = rows;
  c.cols = cols;
  c.codes = reinterpret_cast<const uint8_t*>(q.codes.data());
  c.codes_capacity = q.codes.size();
  c.scales = reinterpret_cast<const uint8_t*>(q.scales.data());
  c.scales_capacity = q.scales.size();
  c.global = q.global;
  std::string out(static_cast<size_t>(rows * cols) * kernels::DTypeSize(out_dtype), '\0');
  absl::Status s = cpu->Dequantize(c, {out.data(), out_dtype, rows, cols, out.size()}, nullptr);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> CpuMatmul(const HostQuantized& a, int64_t m, const HostQuantized& b,
                                      int64_t n, int64_t k, const kernels::QuantizeOptions& o,
                                      kernels::DType out_dtype) {
  return CpuMatmul(a, o, m, b, o, n, k, out_dtype);
}

absl::StatusOr<std::string> CpuMatmul(const HostQuantized& a, const kernels::QuantizeOptions& oa,
                                      int64_t m, const HostQuantized& b,
                                      const kernels::QuantizeOptions& ob, int64_t n, int64_t k,
                                      kernels::DType out_dtype) {
  auto cpu = kernels::CreateCpuBackend();
  auto view = [&](const HostQuantized& q, const kernels::QuantizeOptions& o, int64_t rows) {
    kernels::ConstQuantizedTensor c;
    c.format = o.format;
    c.block = o.block;
    c.scale_layout = o.scale_layout;
    c.rows = rows;
    c.cols = k;
    c.codes = reinterpret_cast<const uint8_t*>(q.codes.data());
    c.codes_capacity = q.codes.size();
    c.scales = reinterpret_cast<const uint8_t*>(q.scales.data());
    c.scales_capacity = q.scales.size();
    c.global = q.global;
    return c;
  };
  std::string out(static_cast<size_t>(m * n) * kernels::DTypeSize(out_dtype), '\0');
  absl::Status s =
      cpu->Matmul(view(a, oa, m), view(b, ob, n), {out.data(), out_dtype, m, n, out.size()},
                  nullptr);
  if (!s.ok()) return s;
  return out;
}

v1::QuantizedTensor AsOperand(const v1::QuantizedTensor& q) { return q; }

}  // namespace fp4q::server::testing
