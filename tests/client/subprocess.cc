#include "subprocess.h"

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace fp4q::client::testing {
namespace {

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::vector<std::string> Environment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& kv : extra) {
    const std::string key = kv.substr(0, kv.find('=') + 1);
    for (auto it = env.begin(); it != env.end();) {
      it = absl::StartsWith(*it, key) ? env.erase(it) : it + 1;
    }
    env.push_back(kv);
  }
  return env;
}

int Decode(int status, int* signal_out) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status) && signal_out != nullptr) *signal_out = WTERMSIG(status);
  return -1;
}

}  // namespace

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string t = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fp4q-client-test-XXXXXX");
  if (mkdtemp(t.data()) != nullptr) path_ = t;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  nftw(
      path_.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              const std::vector<std::string>& env, absl::Duration timeout) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = Environment(env);
  std::vector<char*> cargs = CStrings(args);
  std::vector<char*> cenv = CStrings(envs);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execve(cargs[0], cargs.data(), cenv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  RunResult result;
  const absl::Time deadline = absl::Now() + timeout;
  struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool timed_out = false;
  while (open_fds > 0) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      timed_out = true;
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[65536];
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(argv[0], " ran past ",
                                                    absl::FormatDuration(timeout),
                                                    "; stderr: ", result.err));
  }
  result.exit_code = Decode(status, &result.signal);
  return result;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& binary, const std::vector<std::string>& flags, absl::Duration timeout) {
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  const char* tmp = std::getenv("TMPDIR");
  std::string log_template = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fp4qd-log-XXXXXX");
  const int log_fd = mkstemp(log_template.data());
  if (log_fd < 0) return absl::InternalError(absl::StrCat("mkstemp: ", std::strerror(errno)));
  p->log_path_ = log_template;
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> args = {binary};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> cargs = CStrings(args);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(log_fd, 2);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(log_fd);
  p->pid_ = pid;
  p->stdout_fd_ = out_pipe[0];

  // Read stdout until the listening line.
  const absl::Time deadline = absl::Now() + timeout;
  std::string seen;
  const std::string kPrefix = "fp4qd: listening on ";
  while (p->address_.empty()) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          binary, " printed no \"", kPrefix, "\" line within ", absl::FormatDuration(timeout),
          "; stdout: ", seen, "; log: ", p->Log()));
    }
    struct pollfd fd = {p->stdout_fd_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(std::min<int64_t>(ms, 500))) <= 0) continue;
    char buf[4096];
    const ssize_t got = read(p->stdout_fd_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int status = 0;
      waitpid(pid, &status, 0);
      p->pid_ = -1;
      return absl::InternalError(absl::StrCat(binary, " exited (status ", status,
                                              ") before listening; stdout: ", seen,
                                              "; log: ", p->Log()));
    }
    seen.append(buf, static_cast<size_t>(got));
    size_t pos = seen.find(kPrefix);
    if (pos != std::string::npos) {
      const size_t end = seen.find('\n', pos);
      if (end != std::string::npos) {
        p->address_ = std::string(absl::StripAsciiWhitespace(
            seen.substr(pos + kPrefix.size(), end - pos - kPrefix.size())));
      }
    }
  }
  return p;
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int ServerProcess::Stop() {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  pid_ = -1;
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
  int sig = 0;
  const int code = Decode(status, &sig);
  return code >= 0 ? code : -sig;
}

ServerProcess::~ServerProcess() {
  Stop();
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

}  // namespace fp4q::client::testing
