// ctest-labels: concurrent
// SlotRing waits run their WaitHook (the Python bindings' Ctrl-C check) while
// they wait, also without a timeout; what the hook throws ends the wait with
// nothing taken from the ring, which stays usable.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>

#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using namespace std::chrono_literals;
using sync::SpinPolicy;
using Clock = std::chrono::steady_clock;

struct Interrupted {};  // stands for KeyboardInterrupt

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

TEST(SlotRingWaitHookTest, AHookEndsAnAcquireReadyWithoutTimeoutAndTheRingStaysUsable) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::fixed(0us));
  auto producer = SlotRing::attach(consumer->name());
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_THROW((void)consumer->acquire_ready(SlotRing::kNoTimeout,
                                             [&] {
                                               if (++calls == 3) throw Interrupted{};
                                             }),
               Interrupted);
  // Every kWatchSlice (20 ms): the third call comes after ~40 ms, not never.
  EXPECT_EQ(calls, 3);
  EXPECT_LT(elapsed_ms(start), 2000.0);

  const uint32_t slot = producer->acquire_free(1s);
  producer->publish(slot, 7);
  const ReadySlot ready = consumer->acquire_ready(1s, [] {});
  EXPECT_EQ(ready.slot, slot);
  EXPECT_EQ(ready.tick_id, 7u);
  consumer->release(ready.slot);
}

TEST(SlotRingWaitHookTest, AHookThatThrowsAfterAPublishLeavesTheSlotToTheNextWait) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::fixed(0us));
  auto producer = SlotRing::attach(consumer->name());
  // The slot becomes ready inside the hook, which then throws: the interrupted
  // wait must not have taken it.
  EXPECT_THROW((void)consumer->acquire_ready(SlotRing::kNoTimeout,
                                             [&] {
                                               producer->publish(producer->acquire_free(1s), 11);
                                               throw Interrupted{};
                                             }),
               Interrupted);
  const std::optional<ReadySlot> ready = consumer->try_acquire_ready();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->tick_id, 11u);
  consumer->release(ready->slot);
  EXPECT_FALSE(consumer->try_acquire_ready().has_value());
}

TEST(SlotRingWaitHookTest, AHookEndsAnAcquireFreeOnAFullRingWithNothingTaken) {
  auto consumer = SlotRing::create(1, 64, SpinPolicy::fixed(0us));
  auto producer = SlotRing::attach(consumer->name());
  const uint32_t held = producer->acquire_free(1s);
  producer->publish(held, 1);
  int calls = 0;
  EXPECT_THROW((void)producer->acquire_free(SlotRing::kNoTimeout,
                                            [&] {
                                              if (++calls == 2) throw Interrupted{};
                                            }),
               Interrupted);
  EXPECT_EQ(calls, 2);
  // The slot frees up inside the hook, which throws: the slot stays free.
  const ReadySlot ready = consumer->acquire_ready(1s);
  EXPECT_THROW((void)producer->acquire_free(SlotRing::kNoTimeout,
                                            [&] {
                                              consumer->release(ready.slot);
                                              throw Interrupted{};
                                            }),
               Interrupted);
  const std::optional<uint32_t> again = producer->try_acquire_free();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, held);
  producer->publish(*again, 2);
  EXPECT_EQ(consumer->acquire_ready(1s).tick_id, 2u);
}

TEST(SlotRingWaitHookTest, TheHookRunsEverySliceAndOnceBeforeATimeout) {
  for (const SpinPolicy& spin : {SpinPolicy::fixed(0us), SpinPolicy::standard(), SpinPolicy::fixed(1000000us)}) {
    auto consumer = SlotRing::create(2, 64, spin);
    int calls = 0;
    const auto start = Clock::now();
    EXPECT_THROW((void)consumer->acquire_ready(200ms, [&] { ++calls; }), Timeout);
    EXPECT_GE(elapsed_ms(start), 199.0);
    // 200 ms in slices of at most 20 ms (sleeping or spinning), plus one before the timeout.
    EXPECT_GE(calls, 5) << "spin " << spin.budget().count() << " ns";
    calls = 0;
    EXPECT_THROW((void)consumer->acquire_ready(0ns, [&] { ++calls; }), Timeout);
    EXPECT_EQ(calls, 1);  // try once: the hook still gets its look before the timeout
  }
}

}  // namespace
}  // namespace tensorxfer::ipc
