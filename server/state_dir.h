// The state directory's exclusive lock: one fp4qd per --state_dir.
//
// Two servers on one directory overwrite each other's checkpoints (the last
// writer wins and the other's state is lost without a word). fp4qd therefore
// locks the directory at startup, before it restores anything, and holds the
// lock until the process ends.
//
// Contract
// - The lock is flock(LOCK_EX | LOCK_NB) on <dir>/fp4q-state.lock, a regular
// file created mode
//   0600 with O_NOFOLLOW | O_CLOEXEC (a symlink there is refused). The holder
//   writes its pid into it ("1234\n").
// - The kernel releases the lock when the holder's descriptor closes: on the
// object's
//   destruction, on exit, on kill -9. There is no stale lock to clean up after
//   a crash; the file stays (removing it would let a waiting opener and a new
//   creator both "hold" it).
// - The lock belongs to an open file description: a second LockStateDir on the
// same directory
//   fails in the same process as in another one. A child made by fork without
//   exec shares the description and so the lock; exec closes it (O_CLOEXEC).
// - On NFS, flock is emulated with a whole-file POSIX lock (Linux >= 2.6.12):
// still exclusive
//   between hosts and processes, but not between two descriptors of one
//   process.
// Thread-safe (the object is immutable).
#ifndef FP4Q_SERVER_STATE_DIR_H_
#define FP4Q_SERVER_STATE_DIR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fp4q::server {

inline constexpr char kStateDirLockFileName[] = "fp4q-state.lock";

// fp4qd's exit code when --state_dir is locked by another process
// (docs/DESIGN.md exit codes: 0 clean, 1 failure, 2 poisoned device, 3 corrupt
// checkpoint, 4 state directory in use).
inline constexpr int kExitStateDirLocked = 4;

class StateDirLock {
 public:
  ~StateDirLock();  // releases the lock (closes the descriptor); the file stays
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

  const std::string& path() const { return path_; }  // <dir>/fp4q-state.lock

 private:
  friend absl::StatusOr<std::unique_ptr<StateDirLock>> LockStateDir(const std::string& dir);
  StateDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
};

// Takes the lock of `dir` (an existing directory) and writes this process's pid
// into it.
// - FAILED_PRECONDITION exactly when another open description holds the lock:
// "--state_dir
//   DIR is in use by another fp4qd (pid 1234, per DIR/fp4q-state.lock); ..."
//   (pid "unknown" when the holder has not written it yet). fp4qd then exits
//   with kExitStateDirLocked.
// - INVALID_ARGUMENT when the lock path is a symlink or not a regular file;
// PERMISSION_DENIED
//   or UNAVAILABLE (errno's text) when it cannot be opened, locked or written.
//   fp4qd exits 1.
// The returned object holds the lock until it is destroyed or the process ends.
absl::StatusOr<std::unique_ptr<StateDirLock>> LockStateDir(const std::string& dir);

// True when `status` (from LockStateDir) means "another process holds the lock"
// (FAILED_PRECONDITION).
bool IsStateDirLocked(const absl::Status& status);

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_STATE_DIR_H_
