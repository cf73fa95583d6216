// ctest-labels: concurrent
#include "tensorxfer/sync/futex.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {
namespace {

using namespace std::chrono_literals;
using Clock = WaitClock;

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

// Zeroed memory shared with fork()ed children.
struct SharedPage {
  SharedPage() {
    memory = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::runtime_error("mmap");
  }
  ~SharedPage() { ::munmap(memory, 4096); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(memory);
  }
  void* memory;
};

TEST(FutexTest, WaitReturnsAtOnceWhenTheWordDiffers) {
  SharedWord32 word{5};
  const auto start = Clock::now();
  EXPECT_TRUE(futex_wait(word, 4, 1s));
  EXPECT_LT(elapsed_ms(start), 100.0);
}

TEST(FutexTest, WaitTimesOutAccurately) {
  SharedWord32 word{0};
  for (const auto timeout : {1ms, 10ms, 30ms}) {
    const auto start = Clock::now();
    EXPECT_FALSE(futex_wait(word, 0, timeout));
    const double waited = elapsed_ms(start);
    const double wanted = std::chrono::duration<double, std::milli>(timeout).count();
    EXPECT_GE(waited, wanted * 0.99);
    EXPECT_LT(waited, wanted + 50.0);  // generous: a loaded 2-core CI machine
  }
  EXPECT_FALSE(futex_wait(word, 0, 0ns));
}

TEST(FutexTest, WakeEndsASleepingWaiter) {
  SharedWord32 word{0};
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    while (word.load(std::memory_order_acquire) == 0) (void)futex_wait(word, 0, 5s);
    woke = true;
  });
  std::this_thread::sleep_for(20ms);
  const auto start = Clock::now();
  word.store(1, std::memory_order_release);
  (void)futex_wake_all(word);
  waiter.join();
  EXPECT_TRUE(woke);
  EXPECT_LT(elapsed_ms(start), 1000.0);
}

TEST(FutexTest, WakeWorksAcrossProcesses) {
  SharedPage page;
  auto* word = page.as<SharedWord32>();
  const pid_t child = ::fork();
  if (child == 0) {
    ::usleep(20000);
    word->store(1, std::memory_order_release);
    (void)futex_wake_all(*word);
    ::_exit(0);
  }
  const auto start = Clock::now();
  while (word->load(std::memory_order_acquire) == 0 && elapsed_ms(start) < 5000) (void)futex_wait(*word, 0, 5s);
  EXPECT_EQ(word->load(std::memory_order_acquire), 1u);
  EXPECT_LT(elapsed_ms(start), 2000.0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(EventCountTest, ReadyConditionEndsTheWaitAfterNotify) {
  EventCount event{};
  std::atomic<bool> flag{false};
  SpinPolicy spin = SpinPolicy::fixed(0us);
  std::thread notifier([&] {
    std::this_thread::sleep_for(10ms);
    flag.store(true, std::memory_order_release);
    event.notify_all();
  });
  const auto start = Clock::now();
  const auto status = event.await([&] { return flag.load(std::memory_order_acquire); }, Clock::now() + 5s, spin,
                                  [] {});
  notifier.join();
  EXPECT_EQ(status, WaitStatus::kReady);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_EQ(event.sleepers.load(std::memory_order_relaxed), 0u);
}

TEST(EventCountTest, SpinningSeesAChangeThatIsNeverNotified) {
  EventCount event{};
  std::atomic<bool> flag{false};
  SpinPolicy spin = SpinPolicy::fixed(500ms);
  int watches = 0;
  std::thread setter([&] {
    std::this_thread::sleep_for(5ms);
    flag.store(true, std::memory_order_release);  // no notify: only a spinning waiter sees it soon
  });
  const auto start = Clock::now();
  const auto status = event.await([&] { return flag.load(std::memory_order_acquire); }, Clock::now() + 5s, spin,
                                  [&] { ++watches; });
  setter.join();
  EXPECT_EQ(status, WaitStatus::kReady);
  EXPECT_EQ(watches, 0);  // never went to sleep
  EXPECT_LT(elapsed_ms(start), 400.0);
}

TEST(EventCountTest, WithoutSpinningTheWatchRunsEverySlice) {
  EventCount event{};
  std::atomic<bool> flag{false};
  SpinPolicy spin = SpinPolicy::fixed(0us);
  int watches = 0;
  const auto status = event.await(
      [&] { return flag.load(std::memory_order_acquire); }, Clock::now() + 5s, spin, [&] {
        if (++watches == 3) flag.store(true, std::memory_order_release);  // e.g. a peer check that resolves it
      });
  EXPECT_EQ(status, WaitStatus::kReady);
  EXPECT_EQ(watches, 3);
}

TEST(EventCountTest, TimesOutNearTheDeadlineAndWatchesOnceMore) {
  EventCount event{};
  SpinPolicy spin = SpinPolicy::fixed(100us);
  int watches = 0;
  const auto start = Clock::now();
  const auto status = event.await([] { return false; }, Clock::now() + 50ms, spin, [&] { ++watches; });
  const double waited = elapsed_ms(start);
  EXPECT_EQ(status, WaitStatus::kTimedOut);
  EXPECT_GE(waited, 49.0);
  EXPECT_LT(waited, 150.0);
  EXPECT_GE(watches, 2);  // slices of <= 20 ms, plus one before giving up
  EXPECT_EQ(event.sleepers.load(std::memory_order_relaxed), 0u);
}

TEST(EventCountTest, AWatchThatThrowsEndsTheWaitCleanly) {
  EventCount event{};
  SpinPolicy spin = SpinPolicy::fixed(0us);
  const auto start = Clock::now();
  EXPECT_THROW(event.await([] { return false; }, Clock::now() + 5s, spin, [] { throw PeerLost("peer gone"); }),
               PeerLost);
  EXPECT_LT(elapsed_ms(start), 1000.0);
  EXPECT_EQ(event.sleepers.load(std::memory_order_relaxed), 0u);
}

TEST(EventCountTest, AReadyCheckThatThrowsLeavesNoSleeper) {
  EventCount event{};
  SpinPolicy spin = SpinPolicy::fixed(0us);
  int calls = 0;
  EXPECT_THROW(event.await(
                   [&] {
                     if (++calls == 2) throw CorruptSegment("bad word");
                     return false;
                   },
                   Clock::now() + 5s, spin, [] {}),
               CorruptSegment);
  EXPECT_EQ(event.sleepers.load(std::memory_order_relaxed), 0u);
}

TEST(EventCountTest, NotifyWakesAWaiterInAnotherProcess) {
  SharedPage page;
  auto* event = page.as<EventCount>();
  auto* flag = reinterpret_cast<SharedWord32*>(page.as<char>() + 64);
  const pid_t child = ::fork();
  if (child == 0) {
    ::usleep(20000);
    flag->store(1, std::memory_order_release);
    event->notify_all();
    ::_exit(0);
  }
  SpinPolicy spin = SpinPolicy::fixed(0us);
  int watches = 0;
  const auto start = Clock::now();
  const auto status = event->await([&] { return flag->load(std::memory_order_acquire) == 1; }, Clock::now() + 5s,
                                   spin, [&] { ++watches; });
  EXPECT_EQ(status, WaitStatus::kReady);
  EXPECT_LT(elapsed_ms(start), 2000.0);
  int status_code = 0;
  ASSERT_EQ(::waitpid(child, &status_code, 0), child);
}

TEST(EventCountTest, ManyWaitersManyNotifiesNoLostWakeups) {
  EventCount event{};
  std::atomic<uint32_t> counter{0};
  constexpr uint32_t kRounds = 2000;
  std::atomic<bool> failed{false};
  auto waiter = [&](uint32_t parity) {
    SpinPolicy spin = SpinPolicy::fixed(parity == 0 ? 0us : 20us);
    for (uint32_t round = 0; round < kRounds; ++round) {
      if (round % 2 != parity) continue;
      const auto status = event.await([&] { return counter.load(std::memory_order_acquire) > round; },
                                      Clock::now() + 10s, spin, [] {});
      if (status != WaitStatus::kReady) failed = true;
    }
  };
  std::thread even(waiter, 0u);
  std::thread odd(waiter, 1u);
  for (uint32_t round = 0; round < kRounds; ++round) {
    counter.store(round + 1, std::memory_order_release);
    event.notify_all();
    if (round % 64 == 0) std::this_thread::yield();
  }
  even.join();
  odd.join();
  EXPECT_FALSE(failed);
}

}  // namespace
}  // namespace tensorxfer::sync
