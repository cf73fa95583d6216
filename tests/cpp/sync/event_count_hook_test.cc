// ctest-labels: concurrent
// EventCount::await runs its watch (and so a WaitHook such as the Python
// Ctrl-C check) during long spins and at once after a signal, not only every
// kWatchSlice of sleep.
#include <pthread.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorxfer/sync/futex.h"

namespace tensorxfer::sync {
namespace {

using namespace std::chrono_literals;
using Clock = WaitClock;

struct Interrupted {};  // what a hook throws in these tests (a Python hook throws error_already_set)

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

// Installs a do-nothing SIGUSR1 handler without SA_RESTART (as Python installs
// its SIGINT handler), so blocking system calls return EINTR; restores on exit.
class SignalHandlerScope {
 public:
  SignalHandlerScope() {
    struct sigaction action {};
    action.sa_handler = [](int) {};
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    EXPECT_EQ(::sigaction(SIGUSR1, &action, &previous_), 0);
  }
  ~SignalHandlerScope() { ::sigaction(SIGUSR1, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

TEST(EventCountHookTest, AWatchRunsDuringALongFixedSpin) {
  EventCount event{};
  SpinPolicy spin = SpinPolicy::fixed(SpinPolicy::kFixedMax);  // 1 s of spinning before any sleep
  const auto start = Clock::now();
  EXPECT_THROW(event.await([] { return false; }, Clock::now() + 10s, spin, [] { throw Interrupted{}; }),
               Interrupted);
  // The first watch is due kWatchSlice (20 ms) into the spin, not after it.
  EXPECT_LT(elapsed_ms(start), 500.0);
  EXPECT_EQ(event.sleepers.load(std::memory_order_relaxed), 0u);
}

TEST(EventCountHookTest, FutexSleepReportsASignalAsInterrupted) {
  SignalHandlerScope handler;
  SharedWord32 word{};
  std::atomic<bool> done{false};
  FutexWaitEnd end = FutexWaitEnd::kWoken;
  std::thread sleeper([&] {
    end = futex_sleep(word, 0, 10s);
    done = true;
  });
  const pthread_t target = sleeper.native_handle();
  const auto start = Clock::now();
  // A signal sent before the thread sleeps only runs the handler: repeat until it returns.
  while (!done && elapsed_ms(start) < 5000) {
    ::pthread_kill(target, SIGUSR1);
    std::this_thread::sleep_for(5ms);
  }
  sleeper.join();
  EXPECT_EQ(end, FutexWaitEnd::kInterrupted);
  EXPECT_LT(elapsed_ms(start), 5000.0);
  EXPECT_EQ(futex_sleep(word, 0, 1ms), FutexWaitEnd::kTimedOut);
  EXPECT_EQ(futex_sleep(word, 1, 1s), FutexWaitEnd::kWoken);  // the word does not hold 1: at once
}

TEST(EventCountHookTest, ASignalRunsTheWatchWithoutWaitingForTheSlice) {
  SignalHandlerScope handler;
  EventCount event{};
  SpinPolicy spin = SpinPolicy::fixed(0us);
  std::mutex mutex;
  std::vector<Clock::time_point> watches;
  std::atomic<bool> stop{false};
  std::thread waiter([&] {
    (void)event.await([&] { return stop.load(); }, Clock::now() + 20s, spin, [&] {
      std::lock_guard<std::mutex> lock(mutex);
      watches.push_back(Clock::now());
    });
  });
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return watches.size();
  };
  // After each watch, signal the waiter: it watches again at once, well before
  // the next kWatchSlice is due. Scheduling delays only lengthen the gaps, so
  // require one short gap among several tries.
  double shortest_gap_ms = 1e9;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const std::size_t before = count();
    const auto wait_start = Clock::now();
    while (count() == before && elapsed_ms(wait_start) < 2000) std::this_thread::sleep_for(100us);
    const std::size_t seen = count();
    ::pthread_kill(waiter.native_handle(), SIGUSR1);
    while (count() == seen && elapsed_ms(wait_start) < 4000) std::this_thread::sleep_for(100us);
    std::lock_guard<std::mutex> lock(mutex);
    if (seen > 0 && watches.size() > seen) {
      const double gap = std::chrono::duration<double, std::milli>(watches[seen] - watches[seen - 1]).count();
      shortest_gap_ms = std::min(shortest_gap_ms, gap);
    }
  }
  stop = true;
  event.notify_all();
  waiter.join();
  const double half_slice_ms = std::chrono::duration<double, std::milli>(kWatchSlice).count() / 2;
  EXPECT_LT(shortest_gap_ms, half_slice_ms);
}

}  // namespace
}  // namespace tensorxfer::sync
