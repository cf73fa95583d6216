// ctest-labels: concurrent shm-sweep
// Producers and consumer in different PID namespaces (containers sharing
// /dev/shm but not PIDs) see each other alive, and a killed one is still lost.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using tensorxfer::testing::fork_in_new_pid_namespace;
using tensorxfer::testing::NotePipe;
using tensorxfer::testing::shm_name_exists;
using tensorxfer::testing::wait_exit_code;

using namespace std::chrono_literals;

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

TEST(SlotRingNamespaceTest, AProducerInAnotherPidNamespaceKeepsItsSlotUntilKilled) {
  auto consumer = SlotRing::create(2, 64);
  const std::string name = consumer->name();
  NotePipe pipe;
  auto child = fork_in_new_pid_namespace([&] {
    auto ring = SlotRing::attach(name);
    const uint32_t held = ring->acquire_free(1s);  // WRITING while we look
    ring->publish(ring->acquire_free(1s), 1);
    pipe.send(std::to_string(::getpid()) + " " + std::to_string(held));
    ::pause();
    return 0;
  });
  if (!child.skip_reason.empty()) GTEST_SKIP() << "needs a new PID namespace: " << child.skip_reason;
  const std::string note = pipe.receive();
  ASSERT_EQ(note.rfind("1 ", 0), 0u) << "the producer should be pid 1 of its namespace, got '" << note << "'";
  const ReadySlot first = consumer->acquire_ready(1s);
  EXPECT_EQ(first.tick_id, 1u);
  consumer->release(first.slot);
  // Alive to us: its WRITING slot is not reaped and the wait is not PeerLost.
  EXPECT_THROW(consumer->acquire_ready(100ms), Timeout);
  EXPECT_EQ(consumer->live_producers(), 1u);
  {
    auto local = SlotRing::attach(name);
    EXPECT_TRUE(local->try_acquire_free().has_value());
    EXPECT_FALSE(local->try_acquire_free().has_value()) << "the foreign producer's slot was reclaimed";
  }
  EXPECT_EQ(child.kill_and_wait(), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(consumer->acquire_ready(5s), PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_EQ(consumer->live_producers(), 0u);
}

TEST(SlotRingNamespaceTest, AConsumerInAnotherPidNamespaceKeepsItsRingUntilKilled) {
  NotePipe pipe;
  auto child = fork_in_new_pid_namespace([&] {
    auto ring = SlotRing::create(1, 64);
    pipe.send(ring->name());
    ::pause();
    return 0;
  });
  if (!child.skip_reason.empty()) GTEST_SKIP() << "needs a new PID namespace: " << child.skip_reason;
  const std::string name = pipe.receive();
  ASSERT_EQ(name.rfind("/tensorxfer-1-", 0), 0u) << name;
  auto producer = SlotRing::attach(name);
  (void)producer->acquire_free(1s);  // the only slot
  EXPECT_THROW((void)producer->acquire_free(100ms), Timeout);  // waits for a live consumer
  (void)memory::sweep_stale_segments();
  EXPECT_TRUE(shm_name_exists(name)) << "a live consumer's ring was removed";
  EXPECT_EQ(child.kill_and_wait(), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((void)producer->acquire_free(5s), PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_FALSE(shm_name_exists(name));
}

}  // namespace
}  // namespace tensorxfer::ipc
