// ctest-labels: concurrent
// LocalGroup with threads as ranks: rendezvous, barrier epochs, all_gather of
// every size class, timeouts, refusals. (Processes: local_group_process_test.cc.)
#include "tensorxfer/group/local_group.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "group/group_test_util.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::group {
namespace {

using namespace std::chrono_literals;
using testing::group_path;
using testing::run_ranks;
using testing::unique_group_name;

constexpr auto kNoTimeout = std::chrono::nanoseconds::max();

bool path_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

std::string payload_of(int rank, std::size_t nbytes, int call) {
  std::string bytes(nbytes, '\0');
  for (std::size_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<char>((i * 131 + rank * 7 + call * 13) & 0xFF);
  return bytes;
}

TEST(LocalGroupTest, JoinReportsRankWorldSizeAndNameAndUnlinksAfterTheLastClose) {
  const std::string name = unique_group_name("basic");
  std::array<std::unique_ptr<LocalGroup>, 3> groups;
  run_ranks(3, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 3, 10s); });
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(groups[rank]->rank(), rank);
    EXPECT_EQ(groups[rank]->world_size(), 3);
    EXPECT_EQ(groups[rank]->name(), name);
    for (int peer = 0; peer < 3; ++peer) EXPECT_TRUE(groups[rank]->rank_alive(peer));
    EXPECT_FALSE(groups[rank]->rank_alive(3));
    EXPECT_FALSE(groups[rank]->rank_alive(-1));
    EXPECT_NO_THROW(groups[rank]->check_peers());
  }
  EXPECT_TRUE(path_exists(group_path(name)));
  groups[1]->close();
  groups[1]->close();  // idempotent
  EXPECT_TRUE(groups[1]->closed());
  EXPECT_FALSE(groups[0]->rank_alive(1));
  EXPECT_TRUE(path_exists(group_path(name))) << "two members are still live";
  groups[0].reset();
  EXPECT_TRUE(path_exists(group_path(name)));
  groups[2]->close();
  EXPECT_FALSE(path_exists(group_path(name))) << "the last member must unlink the segment";
}

TEST(LocalGroupTest, WorldSizeOneNeedsNobodyElse) {
  auto group = LocalGroup::join(unique_group_name("solo"), 0, 1, 1s);
  group->barrier(1s);
  const auto gathered = group->all_gather_bytes("abc", 1s);
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_EQ(gathered[0], "abc");
}

TEST(LocalGroupTest, NobodyLeavesABarrierBeforeEveryoneEnteredIt) {
  for (const int world_size : {2, 3, 4, 8}) {
    const std::string name = unique_group_name("barrier");
    constexpr int kBarriers = 300;
    std::vector<std::atomic<int>> entered(kBarriers);
    run_ranks(world_size, [&](int rank) {
      auto group = LocalGroup::join(name, rank, world_size, 20s);
      for (int i = 0; i < kBarriers; ++i) {
        entered[i].fetch_add(1);
        group->barrier(20s);
        ASSERT_EQ(entered[i].load(), world_size) << "barrier " << i << " rank " << rank;
      }
    });
    EXPECT_FALSE(path_exists(group_path(name)));
  }
}

TEST(LocalGroupTest, AllGatherReturnsEveryRanksBytesInRankOrderForEverySize) {
  constexpr std::size_t kM = LocalGroup::kMailboxBytes;
  const std::vector<std::size_t> sizes = {0, 1, 7, 1000, kM - 1, kM, kM + 1, 3 * kM + 17};
  for (const int world_size : {2, 3, 4}) {
    const std::string name = unique_group_name("gather");
    run_ranks(world_size, [&](int rank) {
      auto group = LocalGroup::join(name, rank, world_size, 20s);
      int call = 0;
      for (const std::size_t base : sizes) {
        // Sizes differ between ranks, so rounds end at different points per rank.
        const std::size_t mine = base == 0 ? 0 : base + static_cast<std::size_t>(rank) * 5;
        const auto gathered = group->all_gather_bytes(payload_of(rank, mine, call), 20s);
        ASSERT_EQ(gathered.size(), static_cast<std::size_t>(world_size));
        for (int peer = 0; peer < world_size; ++peer) {
          const std::size_t theirs = base == 0 ? 0 : base + static_cast<std::size_t>(peer) * 5;
          ASSERT_EQ(gathered[peer], payload_of(peer, theirs, call)) << "size " << base << " peer " << peer;
        }
        if (call % 2 == 0) group->barrier(20s);  // barriers interleaved with gathers share the epochs
        ++call;
      }
    });
  }
}

TEST(LocalGroupTest, OneRankLargerThanTheMailboxOthersEmpty) {
  const std::string name = unique_group_name("skewed");
  const std::size_t big = 5 * LocalGroup::kMailboxBytes + 3;
  run_ranks(3, [&](int rank) {
    auto group = LocalGroup::join(name, rank, 3, 20s);
    for (int call = 0; call < 3; ++call) {
      const auto gathered = group->all_gather_bytes(rank == 1 ? payload_of(1, big, call) : std::string(), 20s);
      ASSERT_EQ(gathered[0], "");
      ASSERT_EQ(gathered[1], payload_of(1, big, call));
      ASSERT_EQ(gathered[2], "");
    }
  });
}

TEST(LocalGroupTest, BarrierTimesOutNamingTheRankThatDidNotArrive) {
  const std::string name = unique_group_name("barrier-timeout");
  std::array<std::unique_ptr<LocalGroup>, 3> groups;
  run_ranks(3, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 3, 10s); });
  // Rank 1 waits longer: once rank 0 gives up, rank 1 learns it (PeerLost naming rank 0), not a timeout.
  std::thread rank1([&] {
    try {
      groups[1]->barrier(5s);
      ADD_FAILURE() << "expected PeerLost";
    } catch (const PeerLost& error) {
      EXPECT_NE(std::string(error.what()).find("rank 0 (pid"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("gave up"), std::string::npos) << error.what();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    groups[0]->barrier(100ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& error) {
    EXPECT_NE(std::string(error.what()).find("rank 2 did not arrive"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  rank1.join();
}

TEST(LocalGroupTest, JoinTimesOutNamingTheMissingRanksAndLeavesNoSegment) {
  const std::string name = unique_group_name("join-timeout");
  run_ranks(2, [&](int rank) {
    try {
      LocalGroup::join(name, rank, 4, 150ms);
      ADD_FAILURE() << "expected Timeout";
    } catch (const Timeout& error) {
      EXPECT_NE(std::string(error.what()).find("ranks 2, 3 of world_size 4 did not join"), std::string::npos)
          << error.what();
    }
  });
  EXPECT_FALSE(path_exists(group_path(name)));
}

TEST(LocalGroupTest, ALiveGroupWithAnotherWorldSizeIsRefusedNamingBothSizes) {
  const std::string name = unique_group_name("size-mismatch");
  std::thread waiting([&] { EXPECT_THROW(LocalGroup::join(name, 0, 2, 1s), Timeout); });
  std::this_thread::sleep_for(100ms);
  try {
    LocalGroup::join(name, 1, 3, 1s);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("has world_size 2"), std::string::npos) << text;
    EXPECT_NE(text.find("asked for world_size 3"), std::string::npos) << text;
  }
  waiting.join();
}

TEST(LocalGroupTest, ARankHeldByALiveProcessIsRefused) {
  const std::string name = unique_group_name("rank-taken");
  std::thread waiting([&] { EXPECT_THROW(LocalGroup::join(name, 0, 2, 1s), Timeout); });
  std::this_thread::sleep_for(100ms);
  try {
    LocalGroup::join(name, 0, 2, 1s);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("rank 0 is already taken"), std::string::npos) << error.what();
  }
  waiting.join();
}

TEST(LocalGroupTest, AClosedPeerEndsBarriersWithPeerLostNamingIt) {
  const std::string name = unique_group_name("closed-peer");
  std::array<std::unique_ptr<LocalGroup>, 3> groups;
  run_ranks(3, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 3, 10s); });
  std::thread rank2([&] {
    std::this_thread::sleep_for(50ms);
    groups[2]->close();
  });
  const auto start = std::chrono::steady_clock::now();
  std::thread rank1([&] { EXPECT_THROW(groups[1]->barrier(5s), PeerLost); });
  try {
    groups[0]->barrier(5s);
    FAIL() << "expected PeerLost";
  } catch (const PeerLost& error) {
    EXPECT_NE(std::string(error.what()).find("rank 2 (pid"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("closed the group"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  rank1.join();
  rank2.join();
}

TEST(LocalGroupTest, APeerThatArrivedAndThenClosedDoesNotFailTheBarrier) {
  for (int trial = 0; trial < 50; ++trial) {
    const std::string name = unique_group_name("arrive-close");
    run_ranks(2, [&](int rank) {
      auto group = LocalGroup::join(name, rank, 2, 10s);
      group->barrier(10s);
      if (rank == 1) group->close();  // may close before rank 0 has seen it arrive
    });
  }
}

TEST(LocalGroupTest, AThrowingHookEndsTheWait) {
  const std::string name = unique_group_name("hook");
  std::array<std::unique_ptr<LocalGroup>, 2> groups;
  run_ranks(2, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 2, 10s); });
  struct Interrupted {};
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(groups[0]->barrier(kNoTimeout,
                                  [&] {
                                    if (++calls == 3) throw Interrupted{};
                                  }),
               Interrupted);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(LocalGroupTest, ArgumentsAreCheckedAndClosedGroupsRefuseCollectives) {
  EXPECT_THROW(LocalGroup::join("", 0, 1, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join(std::string(LocalGroup::kMaxNameBytes + 1, 'x'), 0, 1, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join(std::string("a\0b", 3), 0, 1, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join("x", 1, 1, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join("x", -1, 2, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join("x", 0, 0, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join("x", 0, LocalGroup::kMaxWorldSize + 1, 1s), InvalidArgument);
  EXPECT_THROW(LocalGroup::join("x", 0, 1, -1s), InvalidArgument);
  auto group = LocalGroup::join(unique_group_name("closed"), 0, 1, 1s);
  group->close();
  EXPECT_THROW(group->barrier(1s), InvalidArgument);
  EXPECT_THROW(group->all_gather_bytes("x", 1s), InvalidArgument);
  EXPECT_THROW(group->check_peers(), InvalidArgument);
  EXPECT_FALSE(group->rank_alive(0));
}

TEST(LocalGroupTest, NamesWithAnyCharactersMapToValidDistinctSegments) {
  const std::string a = unique_group_name("a/b c");
  const std::string b = unique_group_name("a_b_c");
  EXPECT_NE(group_segment_name(a), group_segment_name(b));
  auto first = LocalGroup::join(a, 0, 1, 1s);
  auto second = LocalGroup::join(b, 0, 1, 1s);
  EXPECT_TRUE(path_exists(group_path(a)));
  EXPECT_TRUE(path_exists(group_path(b)));
}

}  // namespace
}  // namespace tensorxfer::group
