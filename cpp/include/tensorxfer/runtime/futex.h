// Cross-process waits on 32-bit words in shared memory: spin briefly, then
// sleep in the kernel (FUTEX_WAIT, not FUTEX_PRIVATE: the word is shared
// between processes), always with a deadline.
//
// EventCount is the building block: waiters check a condition, and if it does
// not hold, sleep until a notifier bumps the epoch. Sleeps are cut into slices
// (at most kWatchSlice) so the caller's watch callback can look for dead peers
// and turn a wait on a lost peer into an error instead of a hang.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "tensorxfer/runtime/shared_word.h"

namespace tensorxfer::runtime {

using WaitClock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: shared by every process

enum class WaitStatus { kReady, kTimedOut };

// The longest a waiter sleeps before running its watch callback (peer liveness).
inline constexpr std::chrono::milliseconds kWatchSlice{20};

// Sleeps while `word` holds `expected`, for at most `timeout`. Returns true when
// woken or when the word no longer holds `expected` (possibly spuriously: the
// caller re-checks its condition), false when the timeout passed. EINTR counts
// as a wake. Throws SystemError on any other futex failure.
bool futex_wait(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout);

// Wakes up to `count` waiters sleeping on `word`; returns how many were woken.
int futex_wake(SharedWord32& word, int count) noexcept;
int futex_wake_all(SharedWord32& word) noexcept;

// Pause instruction for spin loops.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Gives the CPU to another runnable thread, if any (sched_yield).
void yield_processor() noexcept;

// How long a waiter spins before it sleeps. Process-local (one per ring handle).
//  * fixed(d): always spin for d (d == 0: never spin, sleep at once).
//  * adaptive(): while recent waits are short (their running average is at
//    most kAdaptiveMax), spin four times that average, at least
//    kAdaptiveMinSpin and at most kAdaptiveMax, so most waits end while
//    spinning (the average is pulled down by the fast ones, hence the factor).
//    When waits are typically longer, spinning would only burn a CPU the
//    peer may need: the budget drops to kAdaptiveFloor. Starts at
//    kAdaptiveInitial. Measured on the 2-core VM this was built on: a futex
//    wake costs ~4-10 us, a spinning hand-off ~1-2 us (bench/cpp/futex_bench.cc).
// Thread-safe: assignment, record_wait and budget may race; the average then loses an update.
class SpinPolicy {
 public:
  static constexpr std::chrono::microseconds kAdaptiveInitial{50};
  static constexpr std::chrono::microseconds kAdaptiveMax{200};
  static constexpr std::chrono::microseconds kAdaptiveMinSpin{20};
  static constexpr std::chrono::microseconds kAdaptiveFloor{2};
  static constexpr std::chrono::microseconds kFixedMax{1000000};

  // Throws InvalidArgument unless 0 <= budget <= kFixedMax.
  static SpinPolicy fixed(std::chrono::microseconds budget);
  static SpinPolicy adaptive();

  SpinPolicy(const SpinPolicy& other) noexcept;
  SpinPolicy& operator=(const SpinPolicy& other) noexcept;

  bool is_adaptive() const noexcept { return adaptive_.load(std::memory_order_relaxed); }
  // The fixed budget, or nullopt when adaptive.
  std::optional<std::chrono::microseconds> fixed_budget() const noexcept;
  // The budget the next wait spins for.
  std::chrono::nanoseconds budget() const noexcept;
  // Feeds the adaptive average with how long a wait took until its condition held.
  void record_wait(std::chrono::nanoseconds waited) noexcept;

 private:
  SpinPolicy(bool adaptive, std::chrono::nanoseconds fixed) noexcept;

  // All relaxed: settings and a statistic that may change while another thread
  // waits; no other memory is published through them.
  std::atomic<bool> adaptive_;
  std::atomic<int64_t> fixed_ns_;
  std::atomic<int64_t> average_wait_ns_;  // running average of recent waits
};

// Lives in shared memory. Notifiers change the waited-for state first, then
// call notify_all(); waiters call await(). No lost wake-ups: see futex.cc.
struct EventCount {
  SharedWord32 epoch;     // bumped by every notify; the futex word
  SharedWord32 sleepers;  // waiters between prepare and cancel; lets notify skip the syscall

  // Makes every current waiter re-check its condition.
  void notify_all() noexcept;

  // Waits until ready() returns true (kReady) or `deadline` passes (kTimedOut).
  // ready(): bool, cheap, may change shared state (e.g. claim a slot) when it
  // returns true. watch(): called at least every kWatchSlice while sleeping and
  // once more before timing out; it may throw (e.g. PeerLost) to end the wait.
  template <typename Ready, typename Watch>
  WaitStatus await(Ready&& ready, WaitClock::time_point deadline, SpinPolicy& spin, Watch&& watch);

 private:
  uint32_t prepare_wait() noexcept;
  void cancel_wait() noexcept;
};
static_assert(std::is_trivially_copyable_v<EventCount> && sizeof(EventCount) == 8);

template <typename Ready, typename Watch>
WaitStatus EventCount::await(Ready&& ready, WaitClock::time_point deadline, SpinPolicy& spin,
                             Watch&& watch) {
  if (ready()) return WaitStatus::kReady;
  const auto start = WaitClock::now();
  const auto spin_end = start + spin.budget();
  auto now = start;
  for (uint32_t round = 1; now < spin_end && now < deadline; ++round) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    // When cores are oversubscribed the peer we wait for may need this CPU:
    // offer it now and then (sched_yield returns at once if nobody is waiting).
    if (round % 8 == 0) yield_processor();
    if (ready()) {
      spin.record_wait(WaitClock::now() - start);
      return WaitStatus::kReady;
    }
    now = WaitClock::now();
  }
  auto last_watch = now;
  for (;;) {
    const uint32_t key = prepare_wait();
    bool is_ready = false;
    try {
      is_ready = ready();
    } catch (...) {
      cancel_wait();
      throw;
    }
    if (is_ready) {
      cancel_wait();
      spin.record_wait(WaitClock::now() - start);
      return WaitStatus::kReady;
    }
    now = WaitClock::now();
    if (now >= deadline) {
      cancel_wait();
      watch();  // a dead peer is reported as such, not as a timeout
      if (ready()) return WaitStatus::kReady;
      spin.record_wait(now - start);
      return WaitStatus::kTimedOut;
    }
    const auto slice = std::min<WaitClock::duration>(deadline - now, kWatchSlice);
    try {
      (void)futex_wait(epoch, key, slice);
    } catch (...) {
      cancel_wait();
      throw;
    }
    cancel_wait();
    now = WaitClock::now();
    if (now - last_watch >= kWatchSlice) {
      watch();
      last_watch = now;
    }
  }
}

}  // namespace tensorxfer::runtime
