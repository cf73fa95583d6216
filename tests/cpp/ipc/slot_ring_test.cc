// ctest-labels: concurrent shm-sweep
#include "tensorxfer/ipc/slot_ring.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::ipc {
namespace {

using tensorxfer::testing::fork_child;
using tensorxfer::testing::shm_name_exists;
using tensorxfer::testing::wait_exit_code;

using namespace std::chrono_literals;
using sync::SpinPolicy;

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}


// A pipe for one-way notes between a parent and a forked child.
using Pipe = testing::NotePipe;

TEST(SlotRingTest, CreateValidatesItsArguments) {
  EXPECT_THROW(SlotRing::create(0, 64), InvalidArgument);
  EXPECT_THROW(SlotRing::create(kMaxRingDepth + 1, 64), InvalidArgument);
  EXPECT_THROW(SlotRing::create(4, 0), InvalidArgument);
  EXPECT_THROW(SlotRing::create(4, kMaxSlotBytes + 1), InvalidArgument);
  EXPECT_THROW(SlotRing::create(4, 64, SpinPolicy::standard(), 0), InvalidArgument);
  EXPECT_THROW(SlotRing::create(4, 64, SpinPolicy::standard(), kMaxRingProducers + 1), InvalidArgument);
  try {
    (void)SlotRing::create(0, 64);
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("depth must be in [1, 1024], got 0"), std::string::npos) << error.what();
  }
}

TEST(SlotRingTest, OneHandoffCarriesBytesAndTick) {
  auto consumer = SlotRing::create(4, 100);
  EXPECT_TRUE(consumer->is_consumer());
  EXPECT_EQ(consumer->depth(), 4u);
  EXPECT_EQ(consumer->slot_nbytes(), 100u);
  auto producer = SlotRing::attach(consumer->name());
  EXPECT_FALSE(producer->is_consumer());
  EXPECT_EQ(producer->slot_nbytes(), 100u);
  EXPECT_EQ(consumer->live_producers(), 1u);

  const uint32_t slot = producer->acquire_free(1s);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(producer->slot_data(slot)) % 4096, 0u);
  std::memset(producer->slot_data(slot), 0xAB, 100);
  producer->publish(slot, 7);
  const ReadySlot ready = consumer->acquire_ready(1s);
  EXPECT_EQ(ready.slot, slot);
  EXPECT_EQ(ready.tick_id, 7u);
  EXPECT_GT(ready.publish_ns, 0u);
  EXPECT_EQ(static_cast<unsigned char>(consumer->slot_data(slot)[99]), 0xAB);
  consumer->release(slot);
  EXPECT_FALSE(consumer->try_acquire_ready().has_value());
}

TEST(SlotRingTest, MisuseIsRefusedWithClearErrors) {
  auto consumer = SlotRing::create(2, 64);
  auto producer = SlotRing::attach(consumer->name());
  auto other = SlotRing::attach(consumer->name());
  EXPECT_THROW(producer->publish(5, 1), InvalidArgument);      // out of range
  EXPECT_THROW(producer->publish(0, 1), InvalidArgument);      // never acquired
  EXPECT_THROW(producer->slot_data(2), InvalidArgument);
  const uint32_t slot = producer->acquire_free(1s);
  EXPECT_THROW(other->publish(slot, 1), InvalidArgument);      // held by another producer
  producer->publish(slot, 1);
  try {
    producer->publish(slot, 1);  // twice
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("not held by this producer"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("READY"), std::string::npos) << error.what();
  }
  EXPECT_THROW(producer->acquire_ready(10ms), InvalidArgument);  // producers do not consume
  EXPECT_THROW(producer->release(slot), InvalidArgument);
  EXPECT_THROW(consumer->release(slot), InvalidArgument);        // READY, not taken yet
  const ReadySlot ready = consumer->acquire_ready(1s);
  consumer->release(ready.slot);
  EXPECT_THROW(consumer->release(ready.slot), InvalidArgument);  // twice
  EXPECT_THROW(consumer->release(9), InvalidArgument);
  EXPECT_THROW(consumer->acquire_ready(-1ms), InvalidArgument);
}

TEST(SlotRingTest, WaitsTimeOut) {
  auto consumer = SlotRing::create(2, 64);
  auto producer = SlotRing::attach(consumer->name());
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(consumer->acquire_ready(50ms), Timeout);
  EXPECT_GE(elapsed_ms(start), 49.0);
  EXPECT_LT(elapsed_ms(start), 500.0);
  (void)producer->acquire_free(1s);
  (void)producer->acquire_free(1s);
  start = std::chrono::steady_clock::now();
  try {
    (void)producer->acquire_free(30ms);
    FAIL();
  } catch (const Timeout& error) {
    EXPECT_NE(std::string(error.what()).find("no slot became free within 0.030 s"), std::string::npos) << error.what();
  }
  EXPECT_GE(elapsed_ms(start), 29.0);
  EXPECT_FALSE(producer->try_acquire_free().has_value());
  EXPECT_THROW(consumer->acquire_ready(0ns), Timeout);
}

TEST(SlotRingTest, ConsumerSeesPublishOrderNotSlotOrder) {
  auto consumer = SlotRing::create(4, 64);
  auto first = SlotRing::attach(consumer->name());
  auto second = SlotRing::attach(consumer->name());
  const uint32_t a = first->acquire_free(1s);
  const uint32_t b = second->acquire_free(1s);
  const uint32_t c = first->acquire_free(1s);
  second->publish(b, 20);
  first->publish(c, 30);
  first->publish(a, 40);
  std::vector<uint64_t> ticks;
  std::vector<uint32_t> slots;
  for (int i = 0; i < 3; ++i) {
    const ReadySlot ready = consumer->acquire_ready(1s);
    ticks.push_back(ready.tick_id);
    slots.push_back(ready.slot);
  }
  EXPECT_EQ(ticks, (std::vector<uint64_t>{20, 30, 40}));
  EXPECT_EQ(slots, (std::vector<uint32_t>{b, c, a}));
}

TEST(SlotRingTest, ConsumerMayProduceIntoItsOwnRing) {
  auto ring = SlotRing::create(2, 64);
  const uint32_t slot = ring->acquire_free(1s);
  ring->publish(slot, 5);
  EXPECT_EQ(ring->acquire_ready(1s).tick_id, 5u);
  ring->release(slot);
}

TEST(SlotRingTest, SeveralProducerThreadsNoLossNoDuplicatesPerProducerOrder) {
  constexpr int kProducers = 3;
  constexpr uint64_t kPerProducer = 2000;
  auto consumer = SlotRing::create(4, 64);
  std::vector<std::thread> producers;
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      try {
        auto ring = SlotRing::attach(consumer->name(), SpinPolicy::fixed(p == 0 ? 0us : 50us));
        for (uint64_t i = 0; i < kPerProducer; ++i) {
          const uint32_t slot = ring->acquire_free(10s);
          const uint64_t tick = static_cast<uint64_t>(p) << 32 | i;
          std::memcpy(ring->slot_data(slot), &tick, sizeof(tick));
          ring->publish(slot, tick);
        }
      } catch (const std::exception& error) {
        std::lock_guard<std::mutex> lock(errors_mutex);
        errors.push_back(error.what());
      }
    });
  }
  std::map<int, uint64_t> next_index;
  std::set<uint64_t> seen;
  for (uint64_t n = 0; n < kProducers * kPerProducer; ++n) {
    const ReadySlot ready = consumer->acquire_ready(10s);
    uint64_t payload = 0;
    std::memcpy(&payload, consumer->slot_data(ready.slot), sizeof(payload));
    ASSERT_EQ(payload, ready.tick_id);
    ASSERT_TRUE(seen.insert(ready.tick_id).second) << "duplicate tick " << ready.tick_id;
    const int p = static_cast<int>(ready.tick_id >> 32);
    ASSERT_EQ(ready.tick_id & 0xFFFFFFFF, next_index[p]++) << "producer " << p << " out of order";
    consumer->release(ready.slot);
  }
  for (auto& thread : producers) thread.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(seen.size(), kProducers * kPerProducer);
  EXPECT_EQ(consumer->skipped_sequences(), 0u);
}

TEST(SlotRingTest, ForkedProducersDeliverEverything) {
  constexpr int kProducers = 2;
  constexpr uint64_t kPerProducer = 500;
  auto consumer = SlotRing::create(3, 256);
  const std::string name = consumer->name();
  std::vector<pid_t> children;
  for (int p = 0; p < kProducers; ++p) {
    children.push_back(fork_child([&, p] {
      auto ring = SlotRing::attach(name);
      for (uint64_t i = 0; i < kPerProducer; ++i) {
        const uint32_t slot = ring->acquire_free(10s);
        std::memset(ring->slot_data(slot), static_cast<int>(i & 0xFF), 256);
        ring->publish(slot, static_cast<uint64_t>(p) << 32 | i);
      }
      return 0;
    }));
  }
  std::map<int, uint64_t> next_index;
  for (uint64_t n = 0; n < kProducers * kPerProducer; ++n) {
    const ReadySlot ready = consumer->acquire_ready(10s);
    const int p = static_cast<int>(ready.tick_id >> 32);
    const uint64_t i = ready.tick_id & 0xFFFFFFFF;
    ASSERT_EQ(i, next_index[p]++);
    ASSERT_EQ(static_cast<unsigned char>(consumer->slot_data(ready.slot)[255]), i & 0xFF);
    consumer->release(ready.slot);
  }
  for (const pid_t child : children) EXPECT_EQ(wait_exit_code(child), 0);
  // Every producer closed cleanly: nobody died, so another may attach; the consumer waits.
  EXPECT_THROW(consumer->acquire_ready(50ms), Timeout);
}

TEST(SlotRingTest, ForkedChildCannotUseTheParentsObject) {
  auto consumer = SlotRing::create(2, 64);
  const std::string name = consumer->name();
  const pid_t child = fork_child([&] {
    try {
      (void)consumer->try_acquire_ready();
      return 1;
    } catch (const InvalidArgument&) {
    }
    consumer->close();  // not ours: must not close the parent's ring
    return 0;
  });
  ASSERT_EQ(wait_exit_code(child), 0);
  EXPECT_TRUE(shm_name_exists(name));
  auto producer = SlotRing::attach(name);  // still open
  EXPECT_NO_THROW((void)producer->acquire_free(1s));
}

TEST(SlotRingTest, SlotOfAKilledProducerIsReclaimedAndConsumerGetsPeerLost) {
  auto consumer = SlotRing::create(2, 64);
  const std::string name = consumer->name();
  Pipe pipe;
  const pid_t child = fork_child([&] {
    auto ring = SlotRing::attach(name);
    const uint32_t held = ring->acquire_free(1s);  // held in WRITING when killed
    const uint32_t published = ring->acquire_free(1s);
    ring->publish(published, 11);
    pipe.send(std::to_string(held));
    ::pause();
    return 0;
  });
  const std::string held = pipe.receive();
  ASSERT_FALSE(held.empty());
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  // What it published before dying is still delivered.
  const ReadySlot ready = consumer->acquire_ready(1s);
  EXPECT_EQ(ready.tick_id, 11u);
  consumer->release(ready.slot);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(consumer->acquire_ready(5s), PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_EQ(consumer->live_producers(), 0u);
  // The slot it held is FREE again: a new producer gets both slots.
  auto producer = SlotRing::attach(name);
  std::set<uint32_t> slots{producer->acquire_free(1s), producer->acquire_free(1s)};
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_TRUE(slots.count(static_cast<uint32_t>(std::stoul(held))));
}

TEST(SlotRingTest, ConsumerKeepsGoingWhileSomeProducerLives) {
  auto consumer = SlotRing::create(2, 64);
  const std::string name = consumer->name();
  Pipe pipe;
  const pid_t child = fork_child([&] {
    auto ring = SlotRing::attach(name);
    (void)ring->acquire_free(1s);
    pipe.send("attached");
    ::pause();
    return 0;
  });
  ASSERT_EQ(pipe.receive(), "attached");
  auto survivor = SlotRing::attach(name);
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  EXPECT_THROW(consumer->acquire_ready(100ms), Timeout);  // a live producer remains
  // Its slot was reclaimed: the survivor can take both.
  (void)survivor->acquire_free(1s);
  const uint32_t slot = survivor->acquire_free(1s);
  survivor->publish(slot, 3);
  EXPECT_EQ(consumer->acquire_ready(1s).tick_id, 3u);
}

TEST(SlotRingTest, AbandonedSequenceOfADeadProducerIsSkipped) {
  auto consumer = SlotRing::create(4, 64);
  const std::string name = consumer->name();
  Pipe pipe;
  const pid_t child = fork_child([&] {
    auto ring = SlotRing::attach(name);  // producer index 0
    pipe.send("attached");
    ::pause();
    return 0;
  });
  ASSERT_EQ(pipe.receive(), "attached");
  // Make the child look as if it died between taking sequence 0 and publishing it.
  memory::ShmSegment raw = memory::ShmSegment::attach(name, kSlotRingKind);
  RingHeader header;
  std::memcpy(&header, raw.payload(), sizeof(header));
  auto* control = reinterpret_cast<RingControl*>(raw.payload() + kRingControlOffset);
  auto* entries = reinterpret_cast<ProducerEntry*>(raw.payload() + header.producers_offset);
  entries[0].claim.store(1, std::memory_order_seq_cst);
  control->publish_counter.store(1, std::memory_order_seq_cst);

  auto producer = SlotRing::attach(name);
  const uint32_t slot = producer->acquire_free(1s);
  producer->publish(slot, 42);  // sequence 1
  // Sequence 0 is claimed by a live producer: the consumer must wait for it.
  EXPECT_THROW(consumer->acquire_ready(60ms), Timeout);
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  const ReadySlot ready = consumer->acquire_ready(2s);
  EXPECT_EQ(ready.tick_id, 42u);
  EXPECT_LT(elapsed_ms(start), 500.0);
  EXPECT_EQ(consumer->skipped_sequences(), 1u);
}

TEST(SlotRingTest, ProducerGetsPeerLostWhenTheConsumerIsKilled) {
  Pipe pipe;
  const pid_t child = fork_child([&] {
    auto ring = SlotRing::create(1, 64);
    pipe.send(ring->name());
    ::pause();
    return 0;
  });
  const std::string name = pipe.receive();
  ASSERT_FALSE(name.empty());
  auto producer = SlotRing::attach(name);
  (void)producer->acquire_free(1s);  // the only slot
  ::kill(child, SIGKILL);
  ASSERT_EQ(wait_exit_code(child), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)producer->acquire_free(5s);
    FAIL();
  } catch (const PeerLost& error) {
    EXPECT_NE(std::string(error.what()).find("the consumer"), std::string::npos) << error.what();
  }
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_FALSE(shm_name_exists(name));  // the survivor removed the dead creator's segment
}

TEST(SlotRingTest, ProducerGetsPeerLostWhenTheConsumerCloses) {
  auto consumer = SlotRing::create(1, 64);
  auto producer = SlotRing::attach(consumer->name());
  (void)producer->acquire_free(1s);
  std::thread closer([&] {
    std::this_thread::sleep_for(30ms);
    consumer->close();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW((void)producer->acquire_free(5s), PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  closer.join();
  EXPECT_FALSE(shm_name_exists(producer->name()));
  EXPECT_THROW(SlotRing::attach(producer->name()), SystemError);
}

TEST(SlotRingTest, CloseIsIdempotentAndLaterCallsFail) {
  auto consumer = SlotRing::create(2, 64);
  const std::string name = consumer->name();
  auto producer = SlotRing::attach(name);
  const uint32_t slot = producer->acquire_free(1s);
  producer->close();
  producer->close();
  EXPECT_TRUE(producer->is_closed());
  try {
    producer->publish(slot, 1);
    FAIL();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("ring is closed"), std::string::npos);
  }
  // The closed producer handed its slot back, and counts as gone.
  auto next = SlotRing::attach(name);
  (void)next->acquire_free(1s);
  (void)next->acquire_free(1s);
  consumer->close();
  EXPECT_FALSE(shm_name_exists(name));
  EXPECT_THROW(consumer->acquire_ready(1ms), InvalidArgument);
}

TEST(SlotRingTest, CloseFromAnotherThreadEndsAWait) {
  auto consumer = SlotRing::create(2, 64);
  auto producer = SlotRing::attach(consumer->name());
  std::thread closer([&] {
    std::this_thread::sleep_for(30ms);
    consumer->close();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(consumer->acquire_ready(5s), InvalidArgument);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  closer.join();
}

TEST(SlotRingTest, ProducerEntriesRunOut) {
  auto consumer = SlotRing::create(2, 64, SpinPolicy::standard(), 2);
  auto first = SlotRing::attach(consumer->name());
  auto second = SlotRing::attach(consumer->name());
  EXPECT_THROW(SlotRing::attach(consumer->name()), InvalidArgument);
}

TEST(SlotRingTest, LargeDepthAndSlotsStayAligned) {
  auto consumer = SlotRing::create(kMaxRingDepth, 1);
  auto producer = SlotRing::attach(consumer->name());
  for (uint32_t i = 0; i < kMaxRingDepth; ++i) {
    const uint32_t slot = producer->acquire_free(1s);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(producer->slot_data(slot)) % 4096, 0u);
    producer->publish(slot, i);
  }
  EXPECT_FALSE(producer->try_acquire_free().has_value());
  for (uint32_t i = 0; i < kMaxRingDepth; ++i) EXPECT_EQ(consumer->acquire_ready(1s).tick_id, i);
}

}  // namespace
}  // namespace tensorxfer::ipc
