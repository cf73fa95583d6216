// ctest-labels: concurrent shm-sweep
// LocalGroup across real processes: a SIGKILLed rank is reported to every
// survivor within its timeout, a dead job's segment is replaced, another
// user's segment is refused, and /dev/shm is left clean.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "group/group_test_util.h"
#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::group {
namespace {

using namespace std::chrono_literals;
using testing::fork_child;
using testing::group_path;
using testing::run_ranks;
using testing::unique_group_name;
using testing::wait_exit_code;

bool path_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool wait_for_path(const std::string& path, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!path_exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(LocalGroupProcessTest, EverySurvivorOfAKilledRankGetsPeerLostNamingItWithinTheTimeout) {
  const std::string name = unique_group_name("sigkill");
  const pid_t victim = fork_child([&] {
    auto group = LocalGroup::join(name, 2, 3, 10s);
    ::pause();  // until SIGKILL
    return 0;
  });
  const pid_t survivor = fork_child([&] {
    auto group = LocalGroup::join(name, 1, 3, 10s);
    const auto start = std::chrono::steady_clock::now();
    try {
      group->barrier(10s);
    } catch (const PeerLost& error) {
      const bool named = contains(error.what(), "rank 2 (pid " + std::to_string(victim) + ") exited");
      const bool quick = std::chrono::steady_clock::now() - start < 5s;
      return named && quick ? 0 : 3;
    }
    return 2;
  });
  auto group = LocalGroup::join(name, 0, 3, 10s);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    group->barrier(10s);
    FAIL() << "expected PeerLost";
  } catch (const PeerLost& error) {
    EXPECT_TRUE(contains(error.what(), "rank 2 (pid " + std::to_string(victim) + ") exited")) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(group->rank_alive(2));
  EXPECT_EQ(wait_exit_code(victim), 128 + SIGKILL);
  EXPECT_EQ(wait_exit_code(survivor), 0);
  EXPECT_THROW(group->check_peers(), PeerLost);
  group->close();
  EXPECT_FALSE(path_exists(group_path(name))) << "the last live member must unlink";
}

TEST(LocalGroupProcessTest, AMemberInAnotherPidNamespaceIsAliveUntilItExits) {
  // As in two containers of one pod: the peer's pid means nothing here (it
  // calls itself pid 1, which is some other live process in our namespace).
  const std::string name = unique_group_name("pidns");
  const auto child = testing::fork_in_new_pid_namespace([&] {
    auto group = LocalGroup::join(name, 1, 2, 10s);
    group->barrier(10s);
    ::_exit(group->rank_alive(0) ? 0 : 4);  // no close(): the kernel drops its liveness lock
    return 0;
  });
  if (!child.skip_reason.empty()) GTEST_SKIP() << child.skip_reason;
  auto group = LocalGroup::join(name, 0, 2, 10s);
  EXPECT_TRUE(group->rank_alive(1));
  group->barrier(10s);
  const auto start = std::chrono::steady_clock::now();
  try {
    group->barrier(10s);
    FAIL() << "expected PeerLost";
  } catch (const PeerLost& error) {
    EXPECT_TRUE(contains(error.what(), "rank 1 (pid 1) exited")) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(wait_exit_code(child.outer), 0);
  group->close();
  EXPECT_FALSE(path_exists(group_path(name)));
}

TEST(LocalGroupProcessTest, ADeadJobsSegmentIsReplacedEvenWithAnotherWorldSize) {
  const std::string name = unique_group_name("stale");
  const pid_t dead = fork_child([&] {
    auto group = LocalGroup::join(name, 0, 2, 30s);  // waits for a rank 1 that never comes
    return 0;
  });
  ASSERT_TRUE(wait_for_path(group_path(name), 5s));
  ASSERT_EQ(::kill(dead, SIGKILL), 0);
  ASSERT_EQ(wait_exit_code(dead), 128 + SIGKILL);
  ASSERT_TRUE(path_exists(group_path(name))) << "the killed job leaves its segment behind";
  run_ranks(3, [&](int rank) {
    auto group = LocalGroup::join(name, rank, 3, 10s);
    EXPECT_EQ(group->world_size(), 3);
    const auto gathered = group->all_gather_bytes(std::to_string(rank), 10s);
    EXPECT_EQ(gathered, (std::vector<std::string>{"0", "1", "2"}));
  });
  EXPECT_FALSE(path_exists(group_path(name)));
}

TEST(LocalGroupProcessTest, CreatingAnyGroupSweepsGroupsWhoseMembersAllDied) {
  const std::string dead_name = unique_group_name("all-dead");
  const pid_t dead = fork_child([&] {
    auto group = LocalGroup::join(dead_name, 0, 2, 30s);
    return 0;
  });
  ASSERT_TRUE(wait_for_path(group_path(dead_name), 5s));
  const std::string live_name = unique_group_name("still-live");
  std::thread live_member([&] { EXPECT_THROW(LocalGroup::join(live_name, 0, 2, 500ms), Timeout); });
  ASSERT_TRUE(wait_for_path(group_path(live_name), 5s));
  ASSERT_EQ(::kill(dead, SIGKILL), 0);
  ASSERT_EQ(wait_exit_code(dead), 128 + SIGKILL);
  auto unrelated = LocalGroup::join(unique_group_name("sweeper"), 0, 1, 1s);
  EXPECT_FALSE(path_exists(group_path(dead_name))) << "a group with no live member is swept";
  EXPECT_TRUE(path_exists(group_path(live_name))) << "a group with a live member is kept";
  live_member.join();
}

TEST(LocalGroupProcessTest, ALiveGroupIsNotReplacedWhileAnExitedMembersPeersStillHoldIt) {
  // Rank 1 dies; rank 0 (alive, not yet closed) still holds the segment. A new
  // job's join waits for it rather than stealing it, and succeeds once rank 0 closes.
  const std::string name = unique_group_name("draining");
  const pid_t dead = fork_child([&] {
    auto group = LocalGroup::join(name, 1, 2, 10s);
    ::pause();
    return 0;
  });
  auto old_rank0 = LocalGroup::join(name, 0, 2, 10s);
  ASSERT_EQ(::kill(dead, SIGKILL), 0);
  ASSERT_EQ(wait_exit_code(dead), 128 + SIGKILL);
  EXPECT_THROW(LocalGroup::join(name, 1, 2, 100ms), Timeout);
  std::thread closer([&] {
    std::this_thread::sleep_for(100ms);
    old_rank0->close();
  });
  run_ranks(2, [&](int rank) { LocalGroup::join(name, rank, 2, 10s)->barrier(10s); });
  closer.join();
  EXPECT_FALSE(path_exists(group_path(name)));
}

TEST(LocalGroupProcessTest, AForkedChildsCloseLeavesTheParentsMembershipAlone) {
  const std::string name = unique_group_name("fork-close");
  std::array<std::unique_ptr<LocalGroup>, 2> groups;
  run_ranks(2, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 2, 10s); });
  const pid_t child = fork_child([&] {
    groups[0]->close();
    groups[1].reset();
    return 0;
  });
  ASSERT_EQ(wait_exit_code(child), 0);
  EXPECT_TRUE(groups[1]->rank_alive(0));
  EXPECT_NO_THROW(groups[1]->check_peers());
  run_ranks(2, [&](int rank) { groups[rank]->barrier(10s); });
  EXPECT_TRUE(path_exists(group_path(name)));
}

TEST(LocalGroupProcessTest, AnotherUsersSegmentIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a segment to another user";
  const std::string name = unique_group_name("other-user");
  std::thread waiting([&] { EXPECT_THROW(LocalGroup::join(name, 0, 2, 1s), Timeout); });
  ASSERT_TRUE(wait_for_path(group_path(name), 5s));
  ASSERT_EQ(::chown(group_path(name).c_str(), 65534, 65534), 0);
  try {
    LocalGroup::join(name, 1, 2, 1s);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_TRUE(contains(error.what(), "belongs to uid 65534")) << error.what();
  }
  waiting.join();
  ::unlink(group_path(name).c_str());  // the waiting rank could not tell it was stolen
}

}  // namespace
}  // namespace tensorxfer::group
