// Child processes for the client tests: running the fp4q CLI to completion, and keeping an
// fp4qd server alive for a test suite (it binds port 0 and prints its address). And temporary
// directories.
#ifndef FP4Q_TESTS_CLIENT_SUBPROCESS_H_
#define FP4Q_TESTS_CLIENT_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fp4q::client::testing {

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal (then `signal` is set)
  int signal = 0;
  std::string out;
  std::string err;
};

// Runs argv[0] (a path) with argv, `env` added to the environment ("K=V"), stdin from
// /dev/null; kills it after `timeout` (then DEADLINE_EXCEEDED).
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              const std::vector<std::string>& env = {},
                              absl::Duration timeout = absl::Seconds(120));

// A running fp4qd. Start waits for "fp4qd: listening on HOST:PORT" on its stdout (and, when
// metrics are on, "fp4qd: metrics on HOST:PORT"); stderr goes to a log file kept for failure
// messages. The destructor sends SIGTERM and waits (SIGKILL after 20 s).
class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& flags,
      absl::Duration timeout = absl::Seconds(60));
  ~ServerProcess();

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // The server's stderr so far (its structured logs).
  std::string Log() const;
  // SIGTERM and wait; returns the exit code (or -signal).
  int Stop();

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_;
  std::string log_path_;
};

}  // namespace fp4q::client::testing

#endif  // FP4Q_TESTS_CLIENT_SUBPROCESS_H_
