// ctest-labels: concurrent
// current_process_id(): getpid() without a system call per ask, and the
// child's own id after fork() (the cached one is forgotten there).
#include "tensorxfer/common/process_id.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "support/process.h"

namespace {

using tensorxfer::current_process_id;
using tensorxfer::testing::fork_child;
using tensorxfer::testing::wait_exit_code;

TEST(ProcessIdTest, IsGetpidAndTheSameOnEveryThread) {
  EXPECT_EQ(current_process_id(), ::getpid());
  pid_t seen_by_thread = 0;
  std::thread([&] { seen_by_thread = current_process_id(); }).join();
  EXPECT_EQ(seen_by_thread, ::getpid());
}

TEST(ProcessIdTest, AForkedChildSeesItsOwnIdNotTheCachedParents) {
  const pid_t parent = current_process_id();  // cached in the parent before the fork
  ASSERT_EQ(parent, ::getpid());
  const pid_t child = fork_child([&] {
    if (current_process_id() == parent) return 1;     // the parent's cached id leaked
    if (current_process_id() != ::getpid()) return 2;
    // A grandchild forked from the child, after the child cached its own id.
    const pid_t grandchild = fork_child([] { return current_process_id() == ::getpid() ? 0 : 3; });
    return wait_exit_code(grandchild);
  });
  EXPECT_EQ(wait_exit_code(child), 0);
  EXPECT_EQ(current_process_id(), parent);
}

}  // namespace
