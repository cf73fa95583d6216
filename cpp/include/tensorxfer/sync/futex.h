// Cross-process waits on 32-bit words in shared memory: spin, sleep in the
// kernel (FUTEX_WAIT, not FUTEX_PRIVATE: the word is shared between
// processes), always with a deadline. How long to spin, and when, is a
// SpinPolicy (spin_policy.h): fixed, or adaptive (the default), which learns
// when arrivals come and sleeps until shortly before the next one is due.
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
#include <optional>
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

// While alive, timed sleeps of the calling thread end within microseconds of
// their deadline instead of up to the default 50 us timer slack later
// (prctl PR_SET_TIMERSLACK); the previous slack is restored on destruction.
class PreciseTimerScope {
 public:
  PreciseTimerScope() noexcept;
  ~PreciseTimerScope();
  PreciseTimerScope(const PreciseTimerScope&) = delete;
  PreciseTimerScope& operator=(const PreciseTimerScope&) = delete;

 private:
  long previous_slack_ns_;  // <= 0: unknown, nothing to restore
};

// Lives in shared memory. Notifiers change the waited-for state first, then
// call notify_all(); waiters call await(). No lost wake-ups: see futex.cc.
struct EventCount {
  SharedWord32 epoch;     // bumped by every notify; the futex word
  SharedWord32 sleepers;  // waiters between prepare and cancel; lets notify skip the syscall

  // Makes every current waiter re-check its condition.
  void notify_all() noexcept;

  // Waits until ready() returns true (kReady) or `deadline` passes (kTimedOut),
  // following spin.plan() (see spin_policy.h) and telling `spin` how it went.
  // ready(): bool, cheap, may change shared state (e.g. claim a slot) when it
  // returns true. watch(): called at least every kWatchSlice while sleeping or
  // spinning and once more before timing out; it may throw (e.g. PeerLost, or a
  // WaitHook's exception) to end the wait. It runs only after ready() returned
  // false, so a throwing watch leaves nothing claimed.
  // arrival_stamp(): called once after ready() returned true; when the
  // notifier made the change, if it is known (std::optional<WaitTime>, e.g. a
  // publish timestamp), which makes the adaptive policy's predictions exact.
  template <typename Ready, typename Watch, typename ArrivalStamp>
  WaitStatus await(Ready&& ready, WaitTime deadline, SpinPolicy& spin, Watch&& watch, ArrivalStamp&& arrival_stamp);
  template <typename Ready, typename Watch>
  WaitStatus await(Ready&& ready, WaitTime deadline, SpinPolicy& spin, Watch&& watch) {
    return await(std::forward<Ready>(ready), deadline, spin, std::forward<Watch>(watch),
                 [] { return std::optional<WaitTime>{}; });
  }

 private:
  enum class SleepEnd { kReady, kReachedEnd };
  struct SleepResult {
    SleepEnd end;
    bool woken_by_notify;  // the last futex wait was ended by a wake (not by its timeout)
  };

  uint32_t prepare_wait() noexcept;
  void cancel_wait() noexcept;
  // Spins until ready() or `until`, watching every kWatchSlice; `now` is kept current.
  template <typename Ready, typename Watch>
  static bool spin_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch, WaitTime& now);
  // Sleeps (notify wakes) until ready() or `until`, watching every kWatchSlice.
  template <typename Ready, typename Watch>
  SleepResult sleep_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch, WaitTime& now);
};
static_assert(std::is_trivially_copyable_v<EventCount> && sizeof(EventCount) == 8);

template <typename Ready, typename Watch>
bool EventCount::spin_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch, WaitTime& now) {
  for (uint32_t round = 1; now < until; ++round) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    // When cores are oversubscribed the peer we wait for may need this CPU:
    // offer it now and then (sched_yield returns at once if nobody is waiting).
    if (round % 8 == 0) yield_processor();
    if (ready()) return true;
    now = WaitClock::now();
    // Only fixed spin budgets (up to SpinPolicy::kFixedMax) spin this long.
    if (now - last_watch >= kWatchSlice) {
      watch();
      last_watch = now;
    }
  }
  return false;
}

template <typename Ready, typename Watch>
EventCount::SleepResult EventCount::sleep_until(Ready& ready, WaitTime until, Watch& watch, WaitTime& last_watch,
                                                WaitTime& now) {
  bool woken = false;
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
      return {SleepEnd::kReady, woken};
    }
    now = WaitClock::now();
    if (now >= until) {
      cancel_wait();
      return {SleepEnd::kReachedEnd, woken};
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
    woken = end != FutexWaitEnd::kTimedOut;
    now = WaitClock::now();
    // After a signal the watch runs at once: its hook may have a Ctrl-C to report.
    if (end == FutexWaitEnd::kInterrupted || now - last_watch >= kWatchSlice) {
      watch();
      last_watch = now;
    }
  }
}

template <typename Ready, typename Watch, typename ArrivalStamp>
WaitStatus EventCount::await(Ready&& ready, WaitTime deadline, SpinPolicy& spin, Watch&& watch,
                             ArrivalStamp&& arrival_stamp) {
  if (ready()) {
    if (spin.is_adaptive()) spin.record_immediate(WaitClock::now(), arrival_stamp());
    return WaitStatus::kReady;
  }
  const WaitTime start = WaitClock::now();
  const WaitPlan plan = spin.plan(start);
  using Phase = WaitPredictor::Phase;
  auto arrived = [&](Phase phase, bool after_notify) {
    spin.record_arrival(start, WaitClock::now(), arrival_stamp(), after_notify, phase);
    return WaitStatus::kReady;
  };
  WaitTime now = start;
  WaitTime last_watch = start;
  if (spin_until(ready, std::min(start + plan.spin, deadline), watch, last_watch, now)) {
    return arrived(Phase::kSpin, false);
  }
  if (plan.kind == WaitPlan::Kind::kPredicted) {
    if (plan.wake_at > now && now < deadline) {
      const WaitTime until = std::min(plan.wake_at, deadline);
      SleepResult slept{};
      {
        PreciseTimerScope precise;
        slept = sleep_until(ready, until, watch, last_watch, now);
      }
      if (slept.end == SleepEnd::kReady) return arrived(Phase::kDoze, slept.woken_by_notify);
      if (!slept.woken_by_notify && until == plan.wake_at) spin.record_timed_wake(plan.wake_at, now);
    }
    if (spin_until(ready, std::min(plan.window_end, deadline), watch, last_watch, now)) {
      return arrived(Phase::kWindow, false);
    }
  }
  const SleepResult slept = sleep_until(ready, deadline, watch, last_watch, now);
  if (slept.end == SleepEnd::kReady) return arrived(Phase::kSleep, slept.woken_by_notify);
  watch();  // a dead peer is reported as such, not as a timeout
  if (ready()) return arrived(Phase::kSleep, false);
  spin.record_timeout();
  return WaitStatus::kTimedOut;
}

}  // namespace tensorxfer::sync
