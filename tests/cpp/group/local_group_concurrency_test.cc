// ctest-labels: concurrent
// LocalGroup under misuse from threads and peers (issue 13): close() while
// another thread waits, a second collective from another thread, a rank that
// gives up, a peer announcing more bytes than the caller allows.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "group/group_test_util.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::group {
namespace {

using namespace std::chrono_literals;
using testing::run_ranks;
using testing::unique_group_name;

std::array<std::unique_ptr<LocalGroup>, 2> two_ranks(const std::string& label) {
  const std::string name = unique_group_name(label);
  std::array<std::unique_ptr<LocalGroup>, 2> groups;
  run_ranks(2, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 2, 10s); });
  return groups;
}

TEST(LocalGroupConcurrencyTest, CloseWhileAnotherThreadWaitsEndsTheWaitWithClosed) {
  auto groups = two_ranks("close-while-waiting");
  std::atomic<bool> closed_error{false};
  std::thread waiter([&] {
    try {
      groups[0]->barrier(std::chrono::nanoseconds::max());
    } catch (const Closed&) {
      closed_error = true;
    }
  });
  std::this_thread::sleep_for(50ms);  // the waiter is asleep in the barrier (rank 1 never comes)
  const auto start = std::chrono::steady_clock::now();
  groups[0]->close();  // before the fix: the waiter's segment was unmapped under it (SIGSEGV)
  waiter.join();
  EXPECT_TRUE(closed_error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_THROW(groups[0]->barrier(1s), Closed);
}

TEST(LocalGroupConcurrencyTest, ASecondCollectiveFromAnotherThreadIsRefusedAtOnce) {
  auto groups = two_ranks("second-call");
  std::thread waiter([&] { EXPECT_THROW(groups[0]->barrier(3s), PeerLost); });
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  try {
    groups[0]->all_gather_bytes("x", 10s);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("one operation at a time"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  groups[1]->close();  // ends the first wait
  waiter.join();
}

TEST(LocalGroupConcurrencyTest, ARankThatGivesUpEndsItsPeersWaitsWithoutADeadline) {
  auto groups = two_ranks("gave-up");
  std::thread peer([&] {
    try {
      groups[1]->barrier(std::chrono::nanoseconds::max());
      ADD_FAILURE() << "expected PeerLost";
    } catch (const PeerLost& error) {
      EXPECT_NE(std::string(error.what()).find("gave up"), std::string::npos) << error.what();
    }
  });
  std::this_thread::sleep_for(30ms);
  groups[0]->abandon();  // e.g. rank 0's allocation failed during a collective construction
  peer.join();
  EXPECT_FALSE(groups[1]->rank_alive(0));
}

TEST(LocalGroupConcurrencyTest, AContributionAboveMaxNbytesIsRefusedOnEveryRankAndTheGroupStaysUsable) {
  auto groups = two_ranks("max-nbytes");
  std::array<std::string, 2> errors;
  run_ranks(2, [&](int rank) {
    try {
      groups[rank]->all_gather_bytes(rank == 1 ? std::string(5000, 'x') : "small", 10s, {}, 4096);
    } catch (const InvalidArgument& error) {
      errors[rank] = error.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("rank 1 contributes 5000 bytes, more than max_nbytes 4096"), std::string::npos) << error;
  }
  std::array<std::vector<std::string>, 2> gathered;
  run_ranks(2, [&](int rank) { gathered[rank] = groups[rank]->all_gather_bytes(std::to_string(rank), 10s); });
  EXPECT_EQ(gathered[0], (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(gathered[1], gathered[0]);
}

}  // namespace
}  // namespace tensorxfer::group
