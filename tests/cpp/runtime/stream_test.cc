// ctest-labels: concurrent
#include "tensorxfer/runtime/stream.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "support/stream_gate.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::runtime {
namespace {

using namespace std::chrono_literals;

using Gate = tensorxfer::testing::StreamGate;

TEST(HostStreamTest, RunsTasksInEnqueueOrder) {
  HostStream stream;
  std::vector<int> order;  // touched by the worker only until synchronize returns
  uint64_t last = 0;
  for (int i = 0; i < 1000; ++i) last = stream.enqueue([&order, i] { order.push_back(i); });
  EXPECT_EQ(last, 1000u);
  stream.synchronize(10s);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(stream.completed_sequence(), 1000u);
  EXPECT_TRUE(stream.query());
}

TEST(HostStreamTest, EnqueueReturnsAtOnceAndQueryDoesNotBlock) {
  HostStream stream;
  Gate gate;
  std::atomic<bool> second_ran{false};
  stream.enqueue(gate.task());
  stream.enqueue([&] { second_ran = true; });
  EXPECT_FALSE(stream.query());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(second_ran.load());
  EXPECT_EQ(stream.completed_sequence(), 0u);
  gate.open();
  stream.synchronize(10s);
  EXPECT_TRUE(second_ran.load());
  EXPECT_TRUE(stream.query());
}

TEST(HostStreamTest, CopiesWithAndWithoutEngine) {
  copy::CopyEngine engine(2);
  for (copy::CopyEngine* chosen : {static_cast<copy::CopyEngine*>(nullptr), &engine}) {
    HostStream stream(chosen);
    for (std::size_t nbytes : {std::size_t{0}, std::size_t{5}, std::size_t{3} << 20}) {
      std::vector<uint8_t> src(nbytes), dst(nbytes, 0);
      for (std::size_t i = 0; i < nbytes; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
      stream.enqueue_copy(TensorView::bytes(dst.data(), nbytes), TensorView::bytes(src.data(), nbytes));
      stream.synchronize(10s);
      EXPECT_TRUE(dst == src) << nbytes;
    }
  }
}

TEST(HostStreamTest, CopyArgumentsAreCheckedAtEnqueue) {
  HostStream stream;
  std::vector<uint8_t> a(64), b(32);
  EXPECT_THROW(stream.enqueue_copy(TensorView::bytes(a.data(), 64), TensorView::bytes(b.data(), 32)),
               InvalidArgument);
  TensorView readonly = TensorView::bytes(a.data(), 32);
  readonly.readonly = true;
  EXPECT_THROW(stream.enqueue_copy(readonly, TensorView::bytes(b.data(), 32)), InvalidArgument);
  EXPECT_EQ(stream.enqueued_sequence(), 0u);  // nothing was queued
}

TEST(HostStreamTest, SynchronizeTimesOut) {
  HostStream stream;
  Gate gate;
  stream.enqueue(gate.task());
  stream.enqueue([] {});
  const auto start = std::chrono::steady_clock::now();
  try {
    stream.synchronize(50ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& error) {
    EXPECT_NE(std::string(error.what()).find("2 task(s) still pending"), std::string::npos) << error.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 45ms);
  EXPECT_FALSE(stream.wait_until_completed(1, 10ms));
  gate.open();
  EXPECT_TRUE(stream.wait_until_completed(2, 10s));
  stream.synchronize(10s);
}

TEST(HostStreamTest, FailedTaskPoisonsUntilSynchronizeReportsIt) {
  HostStream stream;
  std::atomic<bool> behind_ran{false};
  HostEvent event;
  stream.enqueue([] { throw InvalidArgument("task 1 failed: bad slot 7"); });
  stream.enqueue([&] { behind_ran = true; });
  stream.record(event);
  // The event completes, carrying the error.
  try {
    event.wait(10s);
    FAIL() << "expected the task's error from the event";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "task 1 failed: bad slot 7");
  }
  try {
    stream.synchronize(10s);
    FAIL() << "expected the task's error";
  } catch (const InvalidArgument& error) {  // original type and message
    EXPECT_STREQ(error.what(), "task 1 failed: bad slot 7");
  }
  EXPECT_FALSE(behind_ran.load());
  // Reported once; the stream runs new work again.
  std::atomic<bool> later_ran{false};
  stream.enqueue([&] { later_ran = true; });
  stream.synchronize(10s);
  EXPECT_TRUE(later_ran.load());
}

TEST(HostStreamTest, NonTensorxferExceptionsKeepTheirType) {
  HostStream stream;
  stream.enqueue([] { throw std::out_of_range("index 9 of 4"); });
  EXPECT_THROW(stream.synchronize(10s), std::out_of_range);
}

TEST(HostStreamTest, WaitsForAnotherStreamsEvent) {
  HostStream producer, consumer;
  Gate gate;
  HostEvent ready;
  std::atomic<int> step{0};
  producer.enqueue(gate.task());
  producer.enqueue([&] { step = 1; });
  producer.record(ready);
  consumer.wait_event(ready);
  std::atomic<int> seen_by_consumer{-1};
  consumer.enqueue([&] { seen_by_consumer = step.load(); });
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(seen_by_consumer.load(), -1);
  EXPECT_FALSE(consumer.query());
  gate.open();
  consumer.synchronize(10s);
  EXPECT_EQ(seen_by_consumer.load(), 1);
}

TEST(HostStreamTest, WaitOnNeverRecordedEventIsANoOp) {
  HostStream stream;
  HostEvent never;
  stream.wait_event(never);
  std::atomic<bool> ran{false};
  stream.enqueue([&] { ran = true; });
  stream.synchronize(10s);
  EXPECT_TRUE(ran.load());
}

TEST(HostStreamTest, WaitingOnAFailedEventPoisonsTheWaiter) {
  HostStream failing, waiting;
  HostEvent event;
  failing.enqueue([] { throw std::runtime_error("upstream copy failed"); });
  failing.record(event);
  waiting.wait_event(event);
  std::atomic<bool> ran{false};
  waiting.enqueue([&] { ran = true; });
  try {
    waiting.synchronize(10s);
    FAIL() << "expected the upstream error";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "upstream copy failed");
  }
  EXPECT_FALSE(ran.load());
  EXPECT_THROW(failing.synchronize(10s), std::runtime_error);
}

TEST(HostStreamTest, ConcurrentProducersKeepTheirOwnOrder) {
  HostStream stream;
  constexpr int kProducers = 4, kTasks = 500;
  std::vector<std::vector<int>> seen(kProducers);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kTasks; ++i) stream.enqueue([&seen, p, i] { seen[p].push_back(i); });
    });
  }
  for (auto& producer : producers) producer.join();
  stream.synchronize(10s);
  for (int p = 0; p < kProducers; ++p) {
    ASSERT_EQ(seen[p].size(), static_cast<std::size_t>(kTasks));
    for (int i = 0; i < kTasks; ++i) ASSERT_EQ(seen[p][i], i);
  }
  EXPECT_EQ(stream.completed_sequence(), static_cast<uint64_t>(kProducers * kTasks));
}

TEST(HostStreamTest, DestructorRunsPendingWorkAndJoins) {
  std::atomic<int> ran{0};
  {
    HostStream stream;
    for (int i = 0; i < 100; ++i) stream.enqueue([&] { ran++; });
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(HostStreamTest, CloseDrainsThenRefusesWork) {
  HostStream stream;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) stream.enqueue([&] { ran++; });
  stream.close(10s);
  EXPECT_EQ(ran.load(), 10);
  EXPECT_TRUE(stream.closed());
  EXPECT_THROW(stream.enqueue([] {}), InvalidArgument);
  HostEvent event;
  EXPECT_THROW(stream.record(event), InvalidArgument);
  EXPECT_TRUE(event.query());  // a refused record leaves the event untouched
  stream.close(10s);           // idempotent
  stream.synchronize(1s);      // nothing pending
}

TEST(HostStreamTest, CloseIsBoundedAndCancelsWhatIsLeft) {
  HostStream stream;
  Gate gate;
  std::atomic<bool> behind_ran{false};
  HostEvent event;
  stream.enqueue(gate.task());
  stream.enqueue([&] { behind_ran = true; });
  stream.record(event);
  while (!gate.entered()) std::this_thread::sleep_for(1ms);
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    gate.open();
  });
  try {
    stream.close(30ms);
    FAIL() << "expected Timeout";
  } catch (const Timeout& error) {
    EXPECT_NE(std::string(error.what()).find("cancelled"), std::string::npos) << error.what();
  }
  opener.join();
  EXPECT_FALSE(behind_ran.load());
  EXPECT_THROW(event.wait(1s), Timeout);  // the record completed with a "closed" error
  EXPECT_EQ(stream.completed_sequence(), 3u);
}

TEST(HostStreamTest, CloseInterruptsAStreamSideEventWait) {
  HostStream blocked, waiting;
  Gate gate;
  HostEvent event;
  blocked.enqueue(gate.task());
  blocked.record(event);
  waiting.wait_event(event);
  EXPECT_THROW(waiting.close(20ms), Timeout);
  EXPECT_TRUE(waiting.closed());
  gate.open();
  blocked.synchronize(10s);
}

#if !defined(__SANITIZE_THREAD__)
TEST(HostStreamTest, ForkedChildRefusesWorkAndDoesNotHang) {
  auto stream = std::make_unique<HostStream>();
  stream->enqueue([] {});
  stream->synchronize(10s);  // the worker is asleep in its condition variable now
  const pid_t child = testing::fork_child([&] {
    bool refused = false;
    try {
      stream->enqueue([] {});
    } catch (const InvalidArgument& error) {
      refused = std::string(error.what()).find("forked child") != std::string::npos;
    }
    stream.reset();  // must neither join nor destroy the parent's waiters
    return refused ? 0 : 1;
  });
  ASSERT_GE(child, 0);
  EXPECT_EQ(testing::wait_exit_code(child), 0);
}
#endif

}  // namespace
}  // namespace tensorxfer::runtime
