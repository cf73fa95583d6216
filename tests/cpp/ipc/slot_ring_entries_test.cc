// ctest-labels: concurrent
// Producer entries are reused (a pool that re-attaches every epoch never runs
// out), a producer killed while attaching frees its entry, and abandon().
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using tensorxfer::testing::fork_child;
using tensorxfer::testing::NotePipe;
using tensorxfer::testing::wait_exit_code;
using tensorxfer::testing::wait_until_stopped;

using namespace std::chrono_literals;
using sync::SpinPolicy;

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

TEST(SlotRingEntriesTest, TenThousandAttachCloseCyclesReuseTwoEntries) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::fixed(0us), 2);
  for (uint64_t epoch = 0; epoch < 10000; ++epoch) {
    auto producer = SlotRing::attach(consumer->name(), SpinPolicy::fixed(0us));
    const uint32_t slot = producer->acquire_free(1s);
    producer->publish(slot, epoch);
    producer->close();
    const ReadySlot ready = consumer->acquire_ready(1s);
    ASSERT_EQ(ready.tick_id, epoch);
    consumer->release(ready.slot);
  }
  EXPECT_EQ(consumer->live_producers(), 0u);
  // Two at once still fit; a third live one does not.
  auto first = SlotRing::attach(consumer->name());
  auto second = SlotRing::attach(consumer->name());
  EXPECT_THROW(SlotRing::attach(consumer->name()), InvalidArgument);
  second->close();
  EXPECT_NO_THROW(SlotRing::attach(consumer->name()));
}

TEST(SlotRingEntriesTest, AKilledProducersEntryAndSlotServeTheNextOne) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::standard(), 1);
  const std::string name = consumer->name();
  NotePipe pipe;
  const pid_t child = fork_child([&] {
    auto ring = SlotRing::attach(name);
    pipe.send(std::to_string(ring->acquire_free(1s)));  // held in WRITING when killed
    ::pause();
    return 0;
  });
  const std::string held = pipe.receive();
  ASSERT_FALSE(held.empty());
  EXPECT_THROW(SlotRing::attach(name), InvalidArgument);  // its only entry is in use
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  // Nobody reaped it yet: the new producer takes the entry and the slot back itself.
  auto producer = SlotRing::attach(name);
  std::set<uint32_t> slots{producer->acquire_free(1s), producer->acquire_free(1s)};
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_EQ(consumer->live_producers(), 1u);
  for (const uint32_t slot : slots) producer->publish(slot, slot);
  EXPECT_EQ(consumer->acquire_ready(1s).tick_id + consumer->acquire_ready(1s).tick_id, 1u);
}

TEST(SlotRingEntriesTest, AProducerKilledWhileAttachingDoesNotStayAttaching) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::standard(), 1);
  const std::string name = consumer->name();
  const pid_t child = fork_child([&] {
    ::setenv("TENSORXFER_FAILPOINT", "slot_ring.attach.claimed", 1);
    auto ring = SlotRing::attach(name);  // stops itself after claiming its entry
    return 0;
  });
  ASSERT_TRUE(wait_until_stopped(child)) << "the failpoint did not stop the child";
  // Claimed but not active, and alive (stopped): it counts, and its entry is taken.
  EXPECT_EQ(consumer->live_producers(), 1u);
  EXPECT_THROW(SlotRing::attach(name), InvalidArgument);
  EXPECT_THROW(consumer->acquire_ready(60ms), Timeout);
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  EXPECT_EQ(consumer->live_producers(), 0u);
  // It died without closing and nothing is ready: the consumer's wait is hopeless.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(consumer->acquire_ready(5s), PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  // And its entry is free for the next producer.
  auto producer = SlotRing::attach(name);
  producer->publish(producer->acquire_free(1s), 5);
  EXPECT_EQ(consumer->acquire_ready(1s).tick_id, 5u);
}

TEST(SlotRingEntriesTest, AbandonHandsTheSlotBackUnpublished) {
  auto consumer = SlotRing::create(1, 64);
  auto producer = SlotRing::attach(consumer->name());
  auto other = SlotRing::attach(consumer->name());
  const uint32_t slot = producer->acquire_free(1s);
  EXPECT_THROW(other->abandon(slot), InvalidArgument);     // not its slot
  EXPECT_THROW(consumer->abandon(slot), InvalidArgument);  // nor the consumer's
  EXPECT_THROW(producer->abandon(1), InvalidArgument);     // out of range
  // A producer waiting for the only slot gets it as soon as it is abandoned.
  std::thread waiter([&] {
    const uint32_t got = other->acquire_free(2s);
    other->publish(got, 9);
  });
  std::this_thread::sleep_for(30ms);
  producer->abandon(slot);
  waiter.join();
  try {
    producer->abandon(slot);  // twice
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("not held by this producer"), std::string::npos) << error.what();
  }
  // The consumer sees only what was published.
  const ReadySlot ready = consumer->acquire_ready(1s);
  EXPECT_EQ(ready.tick_id, 9u);
  EXPECT_FALSE(consumer->try_acquire_ready().has_value());
  EXPECT_THROW(other->abandon(ready.slot), InvalidArgument);  // published: no longer held
  consumer->release(ready.slot);
  // An abandoned slot costs no publish sequence: the next one follows at once.
  const uint32_t again = producer->acquire_free(1s);
  producer->abandon(again);
  producer->publish(producer->acquire_free(1s), 10);
  EXPECT_EQ(consumer->acquire_ready(1s).tick_id, 10u);
  EXPECT_EQ(consumer->skipped_sequences(), 0u);
}

}  // namespace
}  // namespace tensorxfer::ipc
