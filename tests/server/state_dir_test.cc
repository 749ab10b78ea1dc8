// The state directory's lock (server/state_dir.h): one holder
// at a time, in one process or across processes; the refusal names the holder's
// pid; the kernel releases the lock when the holder ends, kill -9 included. Its
// own test binary: the tests fork, and a process without other threads forks
// safely.
#include "server/state_dir.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/files.h"

namespace fp4q::server {
namespace {

using ::fp4q::testing::ReadAll;

using ::fp4q::testing::IsOk;
using ::fp4q::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A child process that takes the lock of `dir`, reports "locked <pid>" or the
// error's message on a pipe, then waits until the parent closes its end of a
// second pipe (or kills it).
class LockingChild {
 public:
  explicit LockingChild(const std::string& dir) {
    int report[2], hold[2];
    if (::pipe(report) != 0 || ::pipe(hold) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(report[0]);
      ::close(hold[1]);
      absl::StatusOr<std::unique_ptr<StateDirLock>> lock = LockStateDir(dir);
      const std::string msg =
          lock.ok() ? absl::StrCat("locked ", ::getpid()) : std::string(lock.status().message());
      (void)!::write(report[1], msg.data(), msg.size());
      ::close(report[1]);
      char c;
      (void)!::read(hold[0], &c, 1);  // returns when the parent closes hold[1]
      ::_exit(lock.ok() ? 0 : 1);     // no destructors: the kernel releases the lock
    }
    ::close(report[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char buf[1024];
    ssize_t n;
    while ((n = ::read(report[0], buf, sizeof(buf))) > 0)
      report_.append(buf, static_cast<size_t>(n));
    ::close(report[0]);
  }
  ~LockingChild() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (hold_ >= 0) ::close(hold_);
  }
  pid_t pid() const { return pid_; }
  const std::string& report() const { return report_; }
  // Lets the child exit on its own; its exit status.
  int Release() {
    ::close(hold_);
    hold_ = -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  void Kill9() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  std::string report_;
};

class StateDirLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fp4q_state_dir_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    lock_path_ = dir_ + "/" + kStateDirLockFileName;
  }
  void TearDown() override {
    ::unlink(lock_path_.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_, lock_path_;
};

TEST_F(StateDirLockTest, SecondLockInOneProcessIsRefusedNamingThePid) {
  auto first = LockStateDir(dir_);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)->path(), lock_path_);
  EXPECT_EQ(ReadAll(lock_path_), absl::StrCat(::getpid(), "\n"));
  auto second = LockStateDir(dir_);
  EXPECT_THAT(second,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--state_dir " + dir_ +
                                       " is in use by another "
                                       "fp4qd (pid " +
                                       std::to_string(::getpid()) + ", per " + lock_path_ + ")"),
                             HasSubstr("overwrite each other's checkpoints"))));
  EXPECT_TRUE(IsStateDirLocked(second.status()));
  // The refused attempt changed nothing: the holder's pid is still there.
  EXPECT_EQ(ReadAll(lock_path_), absl::StrCat(::getpid(), "\n"));
}

TEST_F(StateDirLockTest, DestroyingTheHolderReleasesTheLock) {
  {
    auto first = LockStateDir(dir_);
    ASSERT_THAT(first, IsOk());
  }
  EXPECT_EQ(ReadAll(lock_path_), "") << "a released lock file still names a holder";
  auto again = LockStateDir(dir_);
  EXPECT_THAT(again, IsOk());
}

TEST_F(StateDirLockTest, AnotherProcessIsRefusedNamingOurPid) {
  auto ours = LockStateDir(dir_);
  ASSERT_THAT(ours, IsOk());
  LockingChild child(dir_);
  ASSERT_GT(child.pid(), 0);
  EXPECT_THAT(child.report(),
              HasSubstr(absl::StrCat("is in use by another fp4qd (pid ", ::getpid(), ",")));
  EXPECT_NE(WEXITSTATUS(child.Release()), 0);
}

TEST_F(StateDirLockTest, WeAreRefusedWhileAnotherProcessHoldsItThenItsExitReleasesIt) {
  LockingChild child(dir_);
  ASSERT_GT(child.pid(), 0);
  ASSERT_EQ(child.report(), absl::StrCat("locked ", child.pid()));
  const std::string child_pid = std::to_string(child.pid());
  EXPECT_THAT(LockStateDir(dir_),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("is in use by another fp4qd (pid " + child_pid + ",")));
  EXPECT_EQ(WEXITSTATUS(child.Release()),
            0);  // _exit: no destructor ran, the kernel released
  auto ours = LockStateDir(dir_);
  ASSERT_THAT(ours, IsOk());
  EXPECT_EQ(ReadAll(lock_path_), absl::StrCat(::getpid(), "\n"));
}

TEST_F(StateDirLockTest, KillNineReleasesTheLockAndTheStalePidIsOverwritten) {
  LockingChild child(dir_);
  ASSERT_EQ(child.report(), absl::StrCat("locked ", child.pid()));
  const std::string stale = absl::StrCat(child.pid(), "\n");
  EXPECT_EQ(ReadAll(lock_path_), stale);
  child.Kill9();
  EXPECT_EQ(ReadAll(lock_path_), stale) << "kill -9 runs no cleanup: the file keeps the pid";
  auto ours = LockStateDir(dir_);
  ASSERT_THAT(ours, IsOk()) << "a dead holder's lock must not need manual cleanup";
  EXPECT_EQ(ReadAll(lock_path_), absl::StrCat(::getpid(), "\n"));
}

TEST_F(StateDirLockTest, LongerStalePidIsCutToOurs) {
  {
    std::ofstream out(lock_path_);
    out << "123456789012\n";
  }
  auto ours = LockStateDir(dir_);
  ASSERT_THAT(ours, IsOk());
  EXPECT_EQ(ReadAll(lock_path_), absl::StrCat(::getpid(), "\n"));
}

TEST_F(StateDirLockTest, SymlinkAtTheLockPathIsRefusedAndItsTargetUntouched) {
  const std::string victim = dir_ + "-victim";
  {
    std::ofstream out(victim);
    out << "victim\n";
  }
  ASSERT_EQ(::symlink(victim.c_str(), lock_path_.c_str()), 0);
  EXPECT_THAT(LockStateDir(dir_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(lock_path_ + " is a symbolic link; fp4qd does not follow one")));
  EXPECT_EQ(ReadAll(victim), "victim\n");
  ::unlink(victim.c_str());
}

TEST_F(StateDirLockTest, DirectoryAtTheLockPathIsRefused) {
  ASSERT_EQ(::mkdir(lock_path_.c_str(), 0700), 0);
  absl::StatusOr<std::unique_ptr<StateDirLock>> lock = LockStateDir(dir_);
  ::rmdir(lock_path_.c_str());
  EXPECT_THAT(lock,
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot open the lock file " + lock_path_ + ": Is a directory")));
  EXPECT_FALSE(IsStateDirLocked(lock.status()));
}

TEST_F(StateDirLockTest, MissingDirectoryIsAnErrorNotALock) {
  EXPECT_THAT(LockStateDir(dir_ + "/missing"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("No such file or directory")));
}

TEST_F(StateDirLockTest, LockFileIsMode0600) {
  const mode_t old = ::umask(0);
  auto lock = LockStateDir(dir_);
  ::umask(old);
  ASSERT_THAT(lock, IsOk());
  struct stat st;
  ASSERT_EQ(::stat(lock_path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
}  // namespace fp4q::server
