// How a cross-process wait (EventCount::await in futex.h) spends its time
// until the awaited condition holds: spinning notices a change within a
// microsecond but burns a CPU; sleeping in the kernel is free, but on a
// virtual machine a sleeper takes ~50 us to wake (bench/cpp/futex_bench.cc).
//
// A wait follows a WaitPlan:
//   1. spin for `spin`;
//   2. kPredicted plans only: sleep until `wake_at` (a notify still wakes the
//      waiter at once; the timer runs with 1 ns slack), then spin until
//      `window_end`;
//   3. sleep until notified or until the deadline.
// Every sleep is cut into kWatchSlice slices; the deadline always wins.
//
// WaitPredictor is the pure decision logic (no clock reads, not thread-safe),
// so tests can feed it recorded waits and check the plans it makes. SpinPolicy
// is what a ring holds: fixed(d) or adaptive(), thread-safe.
//
// Measured on the 2-core VM this was built on (load average ~0.5-1), a 64-byte
// batch published every 0.5 ms to a consumer in another process that is
// already waiting (p50 / p99 latency, consumer CPU in % of a core):
//                         C++ slot_ring_bench       Python bench_replay.py --cases handoff
//   adaptive (default)    1.2 / 60-90 us,  9-11%    12.2 / 96 us,  13%   (87-95% of waits end in the window)
//   fixed(1 ms)           1.0 / 2 us,      91%       9.0 / 20 us, 100%
//   fixed(0)              19-24 / 80-170 us, 2%     31 / 115 us,   4%
//   multiprocessing.Queue                           126 / 372 us,  11%
// The Python default stays ~3 us above a full spin: after its sleep the core
// runs the interpreter slower (cold), which spinning longer before the
// arrival did not change. Short waits (round trips) are unchanged: adaptive
// round trips are within ~0.1-0.3 us of fixed(20-200 us); a plan plus a record
// cost ~70 ns (futex_bench BM_AdaptivePlanAndRecord; ~0.6 us before a long wait).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace tensorxfer::sync {

using WaitClock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: shared by every process
using WaitTime = WaitClock::time_point;

struct WaitPlan {
  enum class Kind {
    kSpinThenSleep,  // spin for `spin`, then sleep (fixed budgets, short waits, irregular arrivals)
    kPredicted,      // spin for `spin`, sleep until `wake_at`, spin until `window_end`, then sleep
  };
  Kind kind = Kind::kSpinThenSleep;
  std::chrono::nanoseconds spin{0};
  // kPredicted only; otherwise all equal to the wait's start.
  WaitTime predicted_arrival{};
  WaitTime wake_at{};     // == start: no sleep before the window
  WaitTime window_end{};
};

// Learns from finished waits when the next awaited event comes and plans the
// next wait. Two estimates of the next arrival; the narrower one wins:
//   * by wait length: start + the typical recent wait (a peer answering the
//     waiter, or a waiter that always starts equally early);
//   * by period: the last arrival + the typical recent interval between
//     arrivals (a peer publishing on its own clock while the waiter does
//     varying work in between).
// "Typical" is robust: over the last kHistory samples, the central 7/8 (the
// 3rd lowest to the 3rd highest of 32) bound the predicted window, so two
// stray samples on either side (a paused peer, a preempted waiter) change
// nothing. When that window is wider than the CPU
// cap below, the densest stretch of recent samples that fits the cap is used
// instead, if it holds at least half of them.
//
// Arrival times: a notifier's timestamp when the caller has one (SlotRing:
// the publish time); else the time the waiter saw the change, minus the
// typical notify wake-up latency when it saw it only after being woken (so
// a waiter that keeps sleeping through arrivals does not keep predicting
// them a wake-up latency late).
//
// Plans, first match wins:
//   * fewer than kMinSamples waits or intervals seen: spin kAdaptiveInitial;
//   * the previous wait timed out: spin kAdaptiveFloor (nothing is expected);
//   * short waits (87.5th percentile <= kAdaptiveMax): spin twice that,
//     clamped to [kAdaptiveMinSpin, kAdaptiveMax];
//   * long, regular waits: kPredicted: spin kAdaptiveFloor, sleep until the
//     predicted window (widened by kWindowMargin each side) minus the learned
//     lateness of a timed wake-up, spin through the window, then sleep. The
//     window is at most a quarter of the typical wait (interval) and at most
//     kMaxWindow, so the CPU spent spinning stays bounded; of the two
//     estimates, the one whose window holds more recent samples wins (then
//     the narrower);
//   * otherwise (irregular): spin kAdaptiveMax when the median wait is short,
//     else kAdaptiveFloor (sleep at once, in effect).
class WaitPredictor {
 public:
  static constexpr std::chrono::microseconds kAdaptiveInitial{50};
  static constexpr std::chrono::microseconds kAdaptiveMax{200};
  static constexpr std::chrono::microseconds kAdaptiveMinSpin{20};
  static constexpr std::chrono::microseconds kAdaptiveFloor{2};
  static constexpr std::chrono::microseconds kWindowMargin{10};
  static constexpr std::chrono::microseconds kMaxWindow{1000};
  static constexpr int kWindowShareDivisor = 4;  // window <= typical wait / 4
  // Until measured: a timed wake-up with 1 ns slack, a notify wake-up (the 2-core VM this was built on).
  static constexpr std::chrono::microseconds kInitialWakeLateness{15};
  static constexpr std::chrono::microseconds kInitialNotifyLatency{50};
  // Timestamps further than this from the time they are reported are ignored.
  static constexpr std::chrono::seconds kStampHorizon{10};
  static constexpr std::size_t kHistory = 32;
  static constexpr std::size_t kMinSamples = 8;

  // The plan for a wait that starts at `start`.
  WaitPlan plan(WaitTime start) const noexcept;

  // Where in its plan a wait saw its condition hold.
  enum class Phase {
    kSpin,    // the first spin
    kDoze,    // asleep before the predicted window: the arrival came early
    kWindow,  // spinning through the predicted window
    kSleep,   // asleep after the spin or the window: the arrival came late, or was not predicted
  };
  // A wait that started at `start` saw its condition hold at `seen`, in
  // `phase`; `stamp`: when the notifier made the change, if known;
  // `after_notify`: it was seen only after a notify woke the waiter.
  void record_arrival(WaitTime start, WaitTime seen, std::optional<WaitTime> stamp, bool after_notify,
                      Phase phase = Phase::kSpin) noexcept;
  // The condition already held when a wait began at `now` (nothing to time);
  // `stamp` as above keeps the period estimate going.
  void record_immediate(WaitTime now, std::optional<WaitTime> stamp) noexcept;
  // The wait reached its deadline.
  void record_timeout() noexcept;
  // A timed sleep (1 ns slack) asked to end at `planned` ended at `woke`.
  void record_timed_wake(WaitTime planned, WaitTime woke) noexcept;

  // Diagnostics: the 12.5th, 50th and 87.5th percentile of recent samples.
  using Sorted = std::array<int64_t, kHistory>;
  struct Spread {
    std::chrono::nanoseconds low{0};
    std::chrono::nanoseconds median{0};
    std::chrono::nanoseconds high{0};
  };
  std::optional<Spread> wait_spread() const noexcept { return waits_.spread(); }
  std::optional<Spread> interval_spread() const noexcept { return intervals_.spread(); }
  // How early a timed sleep is ended to be awake in time (nearly the largest recent lateness).
  std::chrono::nanoseconds wake_lateness() const noexcept;
  // The typical delay between a notify and the sleeper running (median).
  std::chrono::nanoseconds notify_latency() const noexcept;
  // How recorded waits ended (diagnostics: a good prediction ends most waits in kWindow).
  struct Outcomes {
    uint64_t immediate = 0;
    uint64_t spin = 0;
    uint64_t doze = 0;
    uint64_t window = 0;
    uint64_t sleep = 0;
    uint64_t timeout = 0;
  };
  const Outcomes& outcomes() const noexcept { return outcomes_; }

 private:
  // The last kHistory samples, the oldest overwritten first. The waits are
  // also kept in ascending order, because every plan needs their spread: a
  // new sample is moved into place when the next plan asks (O(kHistory),
  // usually a few moves, and not on the path that returns an arrival). The
  // other histories are sorted only when a long wait is planned.
  struct History {
    explicit History(bool keep_ordered) noexcept : keep_ordered(keep_ordered) {}
    void add(std::chrono::nanoseconds sample) noexcept;
    std::size_t size() const noexcept { return count < kHistory ? count : kHistory; }
    // The samples in ascending order: the kept copy (brought up to date), or `scratch` sorted.
    const Sorted& ordered(Sorted& scratch) const noexcept;
    // nullopt with fewer than kMinSamples samples.
    std::optional<Spread> spread() const noexcept;

    bool keep_ordered;
    std::array<int64_t, kHistory> samples{};  // in arrival order, a ring
    std::size_t count = 0;                    // samples recorded so far
    // keep_ordered: the samples as of `kept_count`, ascending, and the sample
    // the one after that pushed out of the ring (if it did).
    mutable Sorted kept{};
    mutable std::size_t kept_count = 0;
    std::optional<int64_t> next_leaving;
  };
  static Spread spread_of(const Sorted& ordered, std::size_t n) noexcept;

  // Where recent arrivals fell, as offsets from a base time.
  struct Window {
    std::chrono::nanoseconds earliest{0};
    std::chrono::nanoseconds latest{0};
    std::chrono::nanoseconds median{0};  // of all recent samples
    std::size_t covered = 0;             // recent samples inside [earliest, latest]
  };
  // The window for the `n` recent samples in `ordered` whose spin (margins
  // included) fits `cap`, or nullopt (fewer than half of them fit).
  static std::optional<Window> choose_window(const Sorted& ordered, std::size_t n,
                                             std::chrono::nanoseconds cap) noexcept;

  // A kPredicted plan for arrivals expected in `window` after `base`, or
  // nullopt when its spinning would exceed `cap`.
  std::optional<WaitPlan> predicted_plan(WaitTime start, WaitTime base, const Window& window,
                                         std::chrono::nanoseconds cap) const noexcept;
  void add_arrival(WaitTime arrival) noexcept;

  History waits_{true};
  History intervals_{false};
  History wake_lateness_{false};
  History notify_latency_{false};
  std::optional<WaitTime> last_arrival_;  // unset when the previous wait's arrival is unknown
  bool last_timed_out_ = false;
  Outcomes outcomes_;
};

// The policy a ring (or any EventCount waiter) uses. Process-local.
//  * fixed(d): always spin for d, then sleep (d == 0: sleep at once).
//  * adaptive(): the WaitPredictor above. The default.
// Thread-safe: threads waiting with one policy share what it learns, and
// assignment may race with waits.
class SpinPolicy {
 public:
  static constexpr std::chrono::microseconds kAdaptiveInitial = WaitPredictor::kAdaptiveInitial;
  static constexpr std::chrono::microseconds kAdaptiveMax = WaitPredictor::kAdaptiveMax;
  static constexpr std::chrono::microseconds kAdaptiveMinSpin = WaitPredictor::kAdaptiveMinSpin;
  static constexpr std::chrono::microseconds kAdaptiveFloor = WaitPredictor::kAdaptiveFloor;
  static constexpr std::chrono::microseconds kFixedMax{1000000};

  // Throws InvalidArgument unless 0 <= budget <= kFixedMax.
  static SpinPolicy fixed(std::chrono::microseconds budget);
  static SpinPolicy adaptive();

  SpinPolicy(const SpinPolicy& other) noexcept;
  SpinPolicy& operator=(const SpinPolicy& other) noexcept;

  bool is_adaptive() const noexcept { return adaptive_.load(std::memory_order_relaxed); }
  // The fixed budget, or nullopt when adaptive.
  std::optional<std::chrono::microseconds> fixed_budget() const noexcept;
  // How long a wait starting now spins before it first sleeps.
  std::chrono::nanoseconds budget() const noexcept;
  // The plan for a wait starting at `start`: fixed(d) is always {kSpinThenSleep, d}.
  WaitPlan plan(WaitTime start) const noexcept;
  // Outcomes of waits, fed to the predictor (see WaitPredictor); fixed policies ignore them.
  void record_arrival(WaitTime start, WaitTime seen, std::optional<WaitTime> stamp, bool after_notify,
                      WaitPredictor::Phase phase = WaitPredictor::Phase::kSpin) noexcept;
  void record_immediate(WaitTime now, std::optional<WaitTime> stamp) noexcept;
  void record_timeout() noexcept;
  void record_timed_wake(WaitTime planned, WaitTime woke) noexcept;
  // A copy of what the policy has learned (diagnostics and tests).
  WaitPredictor predictor() const noexcept;

 private:
  SpinPolicy(bool adaptive, std::chrono::nanoseconds fixed) noexcept;

  // relaxed: settings read at the start of a wait; no other memory is published through them.
  std::atomic<bool> adaptive_;
  std::atomic<int64_t> fixed_ns_;
  mutable std::mutex mutex_;  // guards predictor_
  WaitPredictor predictor_;
};

}  // namespace tensorxfer::sync
