// ctest-labels: concurrent
// report_peer_lost(): a relay feeding the ring on behalf of producers it watches
// itself (remote producers) makes the consumer's next acquire_ready throw PeerLost
// naming the producer, once, taking nothing; the ring goes on afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using namespace std::chrono_literals;

std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const PeerLost& error) {
    return error.what();
  }
  return "(no PeerLost)";
}

TEST(SlotRingReportedLoss, NextAcquireReadyThrowsOnceAndTakesNothing) {
  auto consumer = SlotRing::create(2, 64);
  auto producer = SlotRing::attach(consumer->name());
  const uint32_t slot = producer->acquire_free(1s);
  producer->publish(slot, 7);
  consumer->report_peer_lost("remote producer 'a' lost");
  consumer->report_peer_lost("remote producer 'b' lost");
  EXPECT_NE(message_of([&] { (void)consumer->acquire_ready(1s); }).find("'a'"), std::string::npos);
  EXPECT_NE(message_of([&] { (void)consumer->try_acquire_ready(); }).find("'b'"), std::string::npos);
  const ReadySlot ready = consumer->acquire_ready(1s);  // the published slot is still there, once
  EXPECT_EQ(ready.slot, slot);
  EXPECT_EQ(ready.tick_id, 7u);
  consumer->release(ready.slot);
  EXPECT_THROW((void)consumer->acquire_ready(0ns), Timeout);
}

TEST(SlotRingReportedLoss, WakesAWaitingConsumerAtOnce) {
  auto consumer = SlotRing::create(2, 64, sync::SpinPolicy::fixed(0us));
  std::thread reporter([&] {
    std::this_thread::sleep_for(50ms);
    consumer->report_peer_lost("remote producer 'c' lost");
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string message = message_of([&] { (void)consumer->acquire_ready(10s); });
  reporter.join();
  EXPECT_NE(message.find("'c'"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SlotRingReportedLoss, OnlyTheConsumerReports) {
  auto consumer = SlotRing::create(2, 64);
  auto producer = SlotRing::attach(consumer->name());
  EXPECT_THROW(producer->report_peer_lost("x"), InvalidArgument);
}

}  // namespace
}  // namespace tensorxfer::ipc
