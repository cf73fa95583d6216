#include "tensorxfer/sync/peer_liveness.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace tensorxfer::sync {
namespace {

TEST(ProcessLivenessTest, CurrentProcessIsAliveWithAStartTime) {
  const ProcessIdentity self = current_process_identity();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_ticks, 0u);
  EXPECT_TRUE(is_alive(self));
  EXPECT_EQ(identity_of(::getpid()), self);
}

TEST(ProcessLivenessTest, AReusedPidIsNotTheSameProcess) {
  ProcessIdentity impostor = current_process_identity();
  impostor.start_ticks += 1;  // same pid, different start time
  EXPECT_FALSE(is_alive(impostor));
  EXPECT_FALSE(is_alive(ProcessIdentity{}));
  EXPECT_FALSE(is_alive(ProcessIdentity{-5, 0, 1}));
}

TEST(ProcessLivenessTest, AKilledChildIsDeadBeforeAndAfterItIsReaped) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    char byte = 1;
    (void)!::write(ready[1], &byte, 1);
    ::pause();
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  const ProcessIdentity identity = identity_of(child);
  EXPECT_EQ(identity.pid, child);
  EXPECT_TRUE(is_alive(identity));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Not yet reaped: a zombie, which counts as exited.
  for (int i = 0; i < 200 && is_alive(identity); ++i) ::usleep(1000);
  EXPECT_FALSE(is_alive(identity));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(is_alive(identity));
  EXPECT_EQ(identity_of(child).pid, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(ProcessLivenessTest, DescribeNamesPidAndStart) {
  const ProcessIdentity identity{42, 0, 7};
  EXPECT_EQ(identity.describe(), "pid 42 (start 7)");
}

}  // namespace
}  // namespace tensorxfer::sync
