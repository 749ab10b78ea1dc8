#include "server/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fp4q::server {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  const std::string message =
      absl::StrCat("--state_dir: ", what, " ", path, ": ", std::strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// The holder's pid as it wrote it ("1234\n"), or "unknown". A holder writes its
// pid right after taking the lock; wait a little for a holder caught in
// between.
std::string HolderPid(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char buf[32];
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n > 0) {
      absl::string_view text(buf, static_cast<size_t>(n));
      text = text.substr(0, text.find('\n'));
      int64_t pid = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid) && pid > 0) {
        return absl::StrCat(pid);
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return "unknown";
}

}  // namespace

StateDirLock::~StateDirLock() {
  // Empty the file first, so that nobody reads this pid once the lock is free
  // (after a crash the next holder overwrites it instead).
  if (::ftruncate(fd_, 0) != 0) {
    // Nothing to do: the lock is released by close either way.
  }
  ::close(fd_);
}

absl::StatusOr<std::unique_ptr<StateDirLock>> LockStateDir(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kStateDirLockFileName);
  // O_NONBLOCK: a FIFO planted at the path cannot hang the open.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--state_dir: ", path, " is a symbolic link; fp4qd does not follow one (remove it)"));
    }
    return Errno("cannot open the lock file", path, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("cannot stat the lock file", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("--state_dir: ", path, " is not a regular file (remove it)"));
  }
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string pid = HolderPid(fd);
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir ", dir, " is in use by another fp4qd (pid ", pid, ", per ", path,
          "); two servers on one state directory overwrite each "
          "other's checkpoints. Stop it "
          "or give this server another --state_dir"));
    }
    ::close(fd);
    return Errno("cannot lock", path, err);
  }
  // Ours. The pid over whatever a crashed holder left, then cut to its length:
  // a reader sees the old pid or the new one, never an empty file.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()) ||
      ::ftruncate(fd, static_cast<off_t>(pid.size())) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("cannot write the pid into", path, err);
  }
  return std::unique_ptr<StateDirLock>(new StateDirLock(path, fd));
}

bool IsStateDirLocked(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace fp4q::server
