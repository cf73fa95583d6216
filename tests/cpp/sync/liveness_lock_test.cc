// ctest-labels: concurrent
#include "tensorxfer/sync/liveness_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"
#include "tensorxfer/sync/peer_liveness.h"

namespace tensorxfer::sync {
namespace {

using tensorxfer::testing::fork_child;
using tensorxfer::testing::fork_in_new_pid_namespace;
using tensorxfer::testing::wait_exit_code;

// An unlinked shared-memory file: only descriptors reach it.
FileDescriptor anonymous_shared_file() {
  const std::string name = "/tensorxfer-livenesstest-" + std::to_string(::getpid());
  FileDescriptor fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  ::shm_unlink(name.c_str());
  return fd;
}

// Polls `condition` for up to `limit`; true as soon as it holds.
template <typename Condition>
bool becomes_true(Condition condition, std::chrono::milliseconds limit = std::chrono::milliseconds(2000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// One-way notes from a forked child.
struct Pipe {
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void send(long value) const { (void)!::write(fds[1], &value, sizeof(value)); }
  long receive() const {
    long value = 0;
    return ::read(fds[0], &value, sizeof(value)) == static_cast<ssize_t>(sizeof(value)) ? value : -1;
  }
  int fds[2];
};

TEST(LivenessLockTest, HeldUntilReleasedAndExclusiveWithinOneProcess) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  EXPECT_FALSE(liveness_held(file.get(), 3));
  std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 3);
  ASSERT_TRUE(lock.has_value());
  EXPECT_TRUE(lock->held());
  EXPECT_EQ(lock->participant(), 3u);
  // Visible to the holder's own process (classic POSIX locks would not be).
  EXPECT_TRUE(liveness_held(file.get(), 3));
  EXPECT_FALSE(liveness_held(file.get(), 2));
  EXPECT_FALSE(liveness_held(file.get(), 4));
  // A second holder of the same participant is refused, even in this process.
  EXPECT_FALSE(LivenessLock::try_hold(file.get(), 3).has_value());
  std::optional<LivenessLock> other = LivenessLock::try_hold(file.get(), 4);
  ASSERT_TRUE(other.has_value());
  lock->release();
  lock->release();
  EXPECT_FALSE(lock->held());
  EXPECT_FALSE(liveness_held(file.get(), 3));
  EXPECT_TRUE(liveness_held(file.get(), 4));
  EXPECT_TRUE(LivenessLock::try_hold(file.get(), 3).has_value());  // free again (and released at once)
  EXPECT_FALSE(liveness_held(file.get(), 3));
}

TEST(LivenessLockTest, ClosingAnotherDescriptorOfTheFileKeepsTheLock) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 0);
  ASSERT_TRUE(lock.has_value());
  {
    // With classic POSIX locks this close would drop every lock the process holds on the file.
    FileDescriptor another(::open(("/proc/self/fd/" + std::to_string(file.get())).c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(another.valid());
    EXPECT_TRUE(liveness_held(another.get(), 0));
  }
  EXPECT_TRUE(liveness_held(file.get(), 0));
}

TEST(LivenessLockTest, MovedLockStaysHeldOnce) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 1);
  ASSERT_TRUE(lock.has_value());
  LivenessLock moved = std::move(*lock);
  EXPECT_FALSE(lock->held());  // NOLINT: moved-from is valid and empty
  EXPECT_TRUE(moved.held());
  lock.reset();
  EXPECT_TRUE(liveness_held(file.get(), 1));
  moved = LivenessLock();
  EXPECT_FALSE(liveness_held(file.get(), 1));
}

TEST(LivenessLockTest, ObserverErrorsAreNotReportedAsDead) {
  EXPECT_THROW((void)liveness_held(-1, 0), SystemError);
  EXPECT_THROW((void)LivenessLock::try_hold(-1, 0), SystemError);
}

TEST(LivenessLockTest, AForkedChildDoesNotKeepItsParentsLock) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 0);
  ASSERT_TRUE(lock.has_value());
  Pipe ready;
  const pid_t child = fork_child([&] {
    // The child has no share in the lock, and its copy of the object is inert.
    const bool inherited = lock->held();
    ready.send(inherited ? 1 : 0);
    ::pause();
    return 0;
  });
  EXPECT_EQ(ready.receive(), 0);
  lock->release();
  // The child still lives (paused); if it shared the open file description the lock would stay.
  const bool held_by_child = liveness_held(file.get(), 0);
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit_code(child), 128 + SIGKILL);
  EXPECT_FALSE(held_by_child);
}

TEST(LivenessLockTest, AKilledHolderIsSeenGone) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  Pipe ready;
  const pid_t child = fork_child([&] {
    std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 7);
    ready.send(lock ? 1 : 0);
    ::pause();
    return 0;
  });
  ASSERT_EQ(ready.receive(), 1);
  EXPECT_TRUE(liveness_held(file.get(), 7));
  EXPECT_FALSE(LivenessLock::try_hold(file.get(), 7).has_value());
  ::kill(child, SIGKILL);
  // Released by the kernel as the process exits, before anyone reaps it.
  EXPECT_TRUE(becomes_true([&] { return !liveness_held(file.get(), 7); }));
  EXPECT_EQ(wait_exit_code(child), 128 + SIGKILL);
  EXPECT_TRUE(LivenessLock::try_hold(file.get(), 7).has_value());
}

// Processes that share the file but not a PID namespace (containers of one pod).
TEST(LivenessLockTest, AHolderInAnotherPidNamespaceIsAliveUntilKilled) {
  FileDescriptor file = anonymous_shared_file();
  ASSERT_TRUE(file.valid());
  Pipe ready;
  auto child = fork_in_new_pid_namespace([&] {
    std::optional<LivenessLock> lock = LivenessLock::try_hold(file.get(), 2);
    const ProcessIdentity self = current_process_identity();
    ready.send(lock ? self.pid : -1);
    ready.send(static_cast<long>(self.start_ticks));
    ::pause();
    return 0;
  });
  if (!child.skip_reason.empty()) GTEST_SKIP() << "needs a new PID namespace: " << child.skip_reason;
  const long pid_inside = ready.receive();
  const long start_ticks = ready.receive();
  ASSERT_EQ(pid_inside, 1) << "the holder sees itself as pid 1 of its namespace";
  // Its pid means nothing here (pid 1 is our init): the old check calls it dead...
  EXPECT_FALSE(is_alive(ProcessIdentity{1, 0, static_cast<uint64_t>(start_ticks)}));
  // ...the lock does not.
  EXPECT_TRUE(liveness_held(file.get(), 2));
  EXPECT_FALSE(LivenessLock::try_hold(file.get(), 2).has_value());
  EXPECT_EQ(child.kill_and_wait(), 128 + SIGKILL);
  EXPECT_FALSE(liveness_held(file.get(), 2));
}

}  // namespace
}  // namespace tensorxfer::sync
