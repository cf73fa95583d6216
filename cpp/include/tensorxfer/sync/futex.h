// Cross-process waits on 32-bit words in shared memory: spin, sleep in the
// kernel (FUTEX_WAIT, not FUTEX_PRIVATE: the word is shared between
// processes), always with a deadline. How long to spin first is a SpinPolicy
// (spin_policy.h): milliseconds while the waiting processes fit the CPUs,
// none when they outnumber them.
//
// EventCount is the building block: waiters check a condition, and if it does
// not hold, sleep until a notifier bumps the epoch. Sleeps are cut into slices
// (at most kWatchSlice), and long spins are checked as often, so the caller's
// watch callback can look for dead peers (turning a wait on a lost peer into an
// error instead of a hang) and run its WaitHook (wait_hook.h: Ctrl-C).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensorxfer/sync/cpu_relax.h"
#include "tensorxfer/sync/shared_word.h"
#include "tensorxfer/sync/spin_policy.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::sync {

enum class WaitStatus { kReady, kTimedOut };

// The longest a waiter sleeps or spins before running its watch callback (peer
// liveness, the WaitHook). Ctrl-C therefore ends a wait within about this long.
inline constexpr std::chrono::milliseconds kWatchSlice{20};

// How a futex sleep ended.
enum class FutexWaitEnd {
  kWoken,        // woken, or the word no longer held `expected` (possibly spurious)
  kInterrupted,  // a signal handler ran (EINTR): e.g. Ctrl-C, worth checking for at once
  kTimedOut,
};

// Sleeps while `word` holds `expected`, for at most `timeout`; the caller
// re-checks its condition whatever the result. Throws SystemError on any other
// futex failure.
FutexWaitEnd futex_sleep(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout);

// futex_sleep, reporting only whether the timeout passed (false) or not (true;
// EINTR counts as a wake).
bool futex_wait(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout);

// Wakes up to `count` waiters sleeping on `word`; returns how many were woken.
int futex_wake(SharedWord32& word, int count) noexcept;
int futex_wake_all(SharedWord32& word) noexcept;

// Gives the CPU to another runnable thread, if any (sched_yield).
void yield_processor() noexcept;

// Lives in shared memory. Notifiers change the waited-for state first, then
// call notify_all(); waiters call await(). No lost wake-ups: see futex.cc.
struct EventCount {
  SharedWord32 epoch;     // bumped by every notify; the futex word
  SharedWord32 sleepers;  // waiters between prepare and cancel; lets notify skip the syscall

  // Makes every current waiter re-check its condition.
  void notify_all() noexcept;

  // Waits until ready() returns true (kReady) or `deadline` passes (kTimedOut):
  // spins for spin.budget() (pause; after spin.pause_only() also yielding the
  // CPU now and then), then sleeps until notified. ready(): bool, cheap, may change
  // shared state (e.g. claim a slot) when it returns true. watch(): called at
  // least every kWatchSlice while sleeping or spinning and once more before
  // timing out; it may throw (e.g. PeerLost, or a WaitHook's exception) to end
  // the wait. It runs only after ready() returned false, so a throwing watch
  // leaves nothing claimed.
  template <typename Ready, typename Watch>
  WaitStatus await(Ready&& ready, WaitTime deadline, const SpinPolicy& spin, Watch&& watch);

 private:
  uint32_t prepare_wait() noexcept;
  void cancel_wait() noexcept;
  // Spins until ready() or `until`, yielding now and then after `pause_only`,
  // watching every kWatchSlice; `now` is kept current.
  template <typename Ready, typename Watch>
  static bool spin_until(Ready& ready, WaitTime until, std::chrono::nanoseconds pause_only, Watch& watch,
                         WaitTime& last_watch, WaitTime& now);
  // Sleeps (notify wakes) until ready() (true) or `until` (false), watching every kWatchSlice.
  template <typename Ready, typename Watch>
  bool sleep_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch, WaitTime& now);
};
static_assert(std::is_trivially_copyable_v<EventCount> && sizeof(EventCount) == 8);

template <typename Ready, typename Watch>
bool EventCount::spin_until(Ready& ready, WaitTime until, std::chrono::nanoseconds pause_only, Watch& watch,
                            WaitTime& last_watch, WaitTime& now) {
  const WaitTime yield_from = now + pause_only;
  for (uint32_t round = 1; now < until; ++round) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    // The peer we wait for may need this CPU: offer it now and then
    // (sched_yield returns at once if nobody else is runnable).
    if (round % 8 == 0 && now >= yield_from) yield_processor();
    if (ready()) return true;
    now = WaitClock::now();
    if (now - last_watch >= kWatchSlice) {
      watch();
      last_watch = now;
    }
  }
  return false;
}

template <typename Ready, typename Watch>
bool EventCount::sleep_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch, WaitTime& now) {
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
      return true;
    }
    now = WaitClock::now();
    if (now >= until) {
      cancel_wait();
      return false;
    }
    const auto slice = std::min<WaitClock::duration>(until - now, kWatchSlice);
    FutexWaitEnd end = FutexWaitEnd::kTimedOut;
    try {
      end = futex_sleep(epoch, key, slice);
    } catch (...) {
      cancel_wait();
      throw;
    }
    cancel_wait();
    now = WaitClock::now();
    // After a signal the watch runs at once: its hook may have a Ctrl-C to report.
    if (end == FutexWaitEnd::kInterrupted || now - last_watch >= kWatchSlice) {
      watch();
      last_watch = now;
    }
  }
}

template <typename Ready, typename Watch>
WaitStatus EventCount::await(Ready&& ready, WaitTime deadline, const SpinPolicy& spin, Watch&& watch) {
  if (ready()) return WaitStatus::kReady;
  const WaitTime start = WaitClock::now();
  WaitTime now = start;
  WaitTime last_watch = start;
  if (spin_until(ready, std::min(start + spin.budget(), deadline), spin.pause_only(), watch, last_watch, now)) {
    return WaitStatus::kReady;
  }
  if (sleep_until(ready, deadline, watch, last_watch, now)) return WaitStatus::kReady;
  watch();  // a dead peer is reported as such, not as a timeout
  return ready() ? WaitStatus::kReady : WaitStatus::kTimedOut;
}

}  // namespace tensorxfer::sync
