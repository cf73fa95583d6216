// ctest-labels: concurrent
// HostStream and HostEvent waits run their WaitHook (the Python bindings'
// Ctrl-C check) every kWatchSlice, also without a timeout, never while holding
// a lock the hook's own calls need; what it throws ends the wait and leaves the
// stream and event as they were.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "support/stream_gate.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/runtime/event.h"
#include "tensorxfer/runtime/stream.h"

namespace tensorxfer::runtime {
namespace {

using namespace std::chrono_literals;
using Gate = tensorxfer::testing::StreamGate;
using Clock = std::chrono::steady_clock;

struct Interrupted {};  // stands for KeyboardInterrupt

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

TEST(HostEventWaitHookTest, AHookEndsAWaitWithoutTimeoutAndTheEventStaysUsable) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.enqueue(gate.task());
  stream.record(event);
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_THROW(event.wait(std::nullopt,
                          [&] {
                            // Takes the event's and the stream's locks: the wait must not hold them.
                            EXPECT_FALSE(event.query());
                            (void)stream.enqueued_sequence();
                            if (++calls == 3) throw Interrupted{};
                          }),
               Interrupted);
  EXPECT_EQ(calls, 3);
  EXPECT_LT(elapsed_ms(start), 2000.0);
  EXPECT_FALSE(event.query());
  gate.open();
  event.wait(10s, [] {});
  EXPECT_TRUE(event.query());
}

TEST(HostEventWaitHookTest, TheHookRunsEverySliceAndOnceBeforeATimeout) {
  HostStream stream;
  Gate gate;
  HostEvent event;
  stream.enqueue(gate.task());
  stream.record(event);
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_THROW(event.wait(200ms, [&] { ++calls; }), Timeout);
  EXPECT_GE(elapsed_ms(start), 199.0);
  EXPECT_GE(calls, 5);  // 200 ms in slices of at most 20 ms, the last one included
  calls = 0;
  EXPECT_FALSE(event.wait_for(0s, [&] { ++calls; }));
  EXPECT_EQ(calls, 1);  // a zero timeout checks once, and the hook gets its look
  gate.open();
}

TEST(HostStreamWaitHookTest, AHookEndsASynchronizeAndTheTaskErrorStaysPending) {
  HostStream stream;
  Gate gate;
  stream.enqueue(gate.task());
  stream.enqueue([] { throw std::runtime_error("task failed"); });
  int calls = 0;
  EXPECT_THROW(stream.synchronize(std::nullopt,
                                  [&] {
                                    EXPECT_FALSE(stream.query());
                                    if (++calls == 3) throw Interrupted{};
                                  }),
               Interrupted);
  EXPECT_EQ(calls, 3);
  gate.open();
  try {
    stream.synchronize(10s, [] {});
    FAIL() << "expected the task's error";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(std::string(error.what()), "task failed");
  }
  stream.synchronize(std::nullopt, [] {});  // reported once
}

TEST(HostStreamWaitHookTest, AHookEndsACloseThatMayBeCalledAgain) {
  HostStream stream;
  Gate gate;
  bool ran_after_gate = false;
  stream.enqueue(gate.task());
  stream.enqueue([&] { ran_after_gate = true; });
  int calls = 0;
  EXPECT_THROW(stream.close(10.0 * 1s,
                            [&] {
                              if (++calls == 2) throw Interrupted{};
                            }),
               Interrupted);
  EXPECT_TRUE(stream.closed());
  EXPECT_THROW(stream.enqueue([] {}), InvalidArgument);
  gate.open();
  stream.close(10.0 * 1s);  // drains what was queued, joins the worker
  EXPECT_TRUE(ran_after_gate);
}

}  // namespace
}  // namespace tensorxfer::runtime
