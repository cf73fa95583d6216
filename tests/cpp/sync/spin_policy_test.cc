// ctest-labels: concurrent
// The one wait policy: spin milliseconds while the waiting processes fit the
// CPUs, yield briefly then sleep when they outnumber them; fixed budgets validated.
#include "tensorxfer/sync/spin_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {
namespace {

using namespace std::chrono_literals;

TEST(SpinPolicyTest, FixedBudgetsAreValidated) {
  EXPECT_EQ(SpinPolicy::fixed(0us).budget(), 0ns);
  EXPECT_EQ(SpinPolicy::fixed(SpinPolicy::kFixedMax).budget(), SpinPolicy::kFixedMax);
  EXPECT_THROW(SpinPolicy::fixed(SpinPolicy::kFixedMax + 1us), InvalidArgument);
  EXPECT_THROW(SpinPolicy::fixed(-1us), InvalidArgument);
  EXPECT_EQ(SpinPolicy::fixed(250us).fixed_budget(), 250us);
}

TEST(SpinPolicyTest, StandardSpinsMillisecondsWhileTheWaitersFitTheCpus) {
  const int cpus = usable_cpus();
  ASSERT_GE(cpus, 1);
  EXPECT_GE(SpinPolicy::kStandardSpin, 1ms);  // milliseconds, not microseconds
  EXPECT_EQ(SpinPolicy::standard(cpus).budget(), SpinPolicy::kStandardSpin);
  EXPECT_EQ(SpinPolicy::standard(1).budget(), SpinPolicy::kStandardSpin);
  EXPECT_FALSE(SpinPolicy::standard(cpus).fixed_budget().has_value());
  EXPECT_THROW(SpinPolicy::standard(0), InvalidArgument);
}

TEST(SpinPolicyTest, OnlyTheStandardPolicyPausesBeforeItYields) {
  EXPECT_EQ(SpinPolicy::standard(1).pause_only(), SpinPolicy::kPauseOnly);
  EXPECT_EQ(SpinPolicy::fixed(20us).pause_only(), 0ns);  // short fixed spins yield from the start
}

TEST(SpinPolicyTest, StandardYieldsBrieflyThenSleepsWhenTheWaitersOutnumberTheCpus) {
  EXPECT_LE(SpinPolicy::kOversubscribedSpin, 100us);  // microseconds: then the futex
  EXPECT_EQ(SpinPolicy::standard(usable_cpus() + 1).budget(), SpinPolicy::kOversubscribedSpin);
  EXPECT_EQ(SpinPolicy::standard(4 * usable_cpus()).budget(), SpinPolicy::kOversubscribedSpin);
  EXPECT_EQ(SpinPolicy::standard(usable_cpus() + 1).pause_only(), 0ns);  // yields from the start
}

TEST(SpinPolicyTest, CopiesAndAssignmentsCarryTheBudget) {
  SpinPolicy policy = SpinPolicy::fixed(7us);
  const SpinPolicy copy(policy);
  EXPECT_EQ(copy.budget(), 7us);
  policy = SpinPolicy::standard(usable_cpus() + 1);
  EXPECT_EQ(policy.budget(), SpinPolicy::kOversubscribedSpin);
  EXPECT_EQ(policy.pause_only(), 0ns);
  EXPECT_FALSE(policy.fixed_budget().has_value());
}

TEST(SpinPolicyTest, AssignmentMayRaceWithReaders) {
  SpinPolicy shared = SpinPolicy::fixed(1us);
  std::vector<std::thread> readers;
  std::atomic<bool> stop{false};
  for (int i = 0; i < 2; ++i) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        const auto budget = shared.budget();
        ASSERT_TRUE(budget == 1us || budget == 2us);
      }
    });
  }
  for (int i = 0; i < 10000; ++i) shared = SpinPolicy::fixed(i % 2 ? 1us : 2us);
  stop = true;
  for (auto& reader : readers) reader.join();
}

}  // namespace
}  // namespace tensorxfer::sync
