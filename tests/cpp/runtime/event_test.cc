// ctest-labels: concurrent
#include "tensorxfer/runtime/event.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/stream_gate.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/runtime/stream.h"

namespace tensorxfer::runtime {
namespace {

using namespace std::chrono_literals;

using Gate = tensorxfer::testing::StreamGate;

TEST(HostEventTest, NeverRecordedIsDone) {
  HostEvent event;
  EXPECT_TRUE(event.query());
  event.wait(0s);
  event.wait();
  EXPECT_TRUE(event.wait_for(0s));
}

TEST(HostEventTest, DoneOnlyAfterEverythingBeforeTheRecord) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  std::atomic<bool> before_ran{false};
  stream.enqueue(gate.task());
  stream.enqueue([&] { before_ran = true; });
  stream.record(event);
  EXPECT_FALSE(event.query());
  try {
    event.wait(30ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& error) {
    EXPECT_NE(std::string(error.what()).find("not done after"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(event.wait_for(1ms));
  gate.open();
  event.wait(10s);
  EXPECT_TRUE(before_ran.load());
  EXPECT_TRUE(event.query());
}

TEST(HostEventTest, WorkAfterTheRecordDoesNotDelayIt) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.record(event);
  stream.enqueue(gate.task());
  event.wait(10s);
  EXPECT_TRUE(event.query());
  EXPECT_FALSE(stream.query());
  gate.open();
  stream.synchronize(10s);
}

TEST(HostEventTest, WaitFollowsTheLatestRecord) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.record(event);
  event.wait(10s);
  stream.enqueue(gate.task());
  stream.record(event);
  EXPECT_FALSE(event.query());
  EXPECT_THROW(event.wait(20ms), Timeout);
  gate.open();
  event.wait(10s);
  EXPECT_TRUE(event.query());
}

TEST(HostEventTest, ResetForgetsAPendingRecord) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.enqueue(gate.task());
  stream.record(event);
  EXPECT_FALSE(event.query());
  event.reset();
  EXPECT_TRUE(event.query());
  event.wait(0s);
  gate.open();
  stream.synchronize(10s);
  EXPECT_TRUE(event.query());
}

TEST(HostEventTest, ResetClearsACarriedError) {
  HostStream stream;
  HostEvent event;
  stream.enqueue([] { throw InvalidArgument("copy failed"); });
  stream.record(event);
  EXPECT_THROW(event.wait(10s), InvalidArgument);
  event.reset();
  event.wait(0s);
  EXPECT_THROW(stream.synchronize(10s), InvalidArgument);
}

TEST(HostEventTest, ManyWaitersWakeTogether) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.enqueue(gate.task());
  stream.record(event);
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 6; ++i) {
    waiters.emplace_back([&] {
      event.wait(10s);
      woke++;
    });
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(woke.load(), 0);
  gate.open();
  for (auto& waiter : waiters) waiter.join();
  EXPECT_EQ(woke.load(), 6);
}

TEST(HostEventTest, EventMayDieBeforeItsRecordCompletes) {
  HostStream stream;
  Gate gate;
  stream.enqueue(gate.task());
  {
    auto event = std::make_unique<HostEvent>();
    stream.record(*event);
  }
  gate.open();
  stream.synchronize(10s);  // the record completed into state nobody reads
}

TEST(HostEventTest, RecordedOnTwoStreamsFollowsTheLatest) {
  HostStream first, second;
  Gate gate;
  HostEvent event;
  first.record(event);
  second.enqueue(gate.task());
  second.record(event);
  first.synchronize(10s);
  EXPECT_FALSE(event.query());  // the older record finishing does not count
  gate.open();
  event.wait(10s);
}

}  // namespace
}  // namespace tensorxfer::runtime
