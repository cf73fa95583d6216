// How a cross-process wait (EventCount::await in futex.h) spends its time
// until the awaited condition holds: spinning notices a change within a
// microsecond but burns a CPU; sleeping in the kernel is free, but on a
// virtual machine a sleeper takes tens of microseconds to wake.
//
// One policy: spin (pause, then pause and yield) for a budget, then sleep on
// the futex until notified or the deadline. The standard budget is
// kStandardSpin (milliseconds: a peer that answers within it is caught by a
// spinning waiter) while the processes waiting on each other fit the CPUs this
// process may run on. When they outnumber them it spins only
// kOversubscribedSpin, yielding the CPU from the start (the peer being waited
// for is usually runnable on this CPU, and sched_yield hands it over without
// a futex round trip), then sleeps, so a waiter never holds a CPU its peer
// needs for long. Every wait keeps its deadline, its liveness watch and its
// Ctrl-C hook whatever the budget.
//
// Oversubscribed, measured (Communicator.all_reduce, 4 ranks on an AMD EPYC with
// 2 vCPUs, back to back, float32, medians of 7 interleaved loops): sleeping at
// once 27.0 / 55.4 / 245 / 4577 us at 1 KiB / 64 KiB / 1 MiB / 16 MiB, yielding
// 20 us first 9.0 / 27.4 / 199 / 3965 us. With 2 ranks the budgets tie.
//
// Measured before choosing it (python/tensorxfer/benchmarks/handoff.py, 64 B
// every 0.5 ms to a waiting consumer in another process, AMD EPYC 2 vCPUs,
// interleaved rounds, p50 median [min-max] over rounds): the adaptive predictor
// this replaced 6.9 [2.2-9.9] and 9.6 [2.1-9.8] us, spin 1 ms 8.8 [2.4-9.2] and
// 3.7 [3.2-10.0] us, sleep at once 4.9 [4.8-8.0] and 6.2 [6.0-11.5] us: the
// predictor never beat a plain budget by the 1.5x its complexity needed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace tensorxfer::sync {

using WaitClock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: shared by every process
using WaitTime = WaitClock::time_point;

// The CPUs this process may run on (sched_getaffinity, at least 1;
// TENSORXFER_CPU_COUNT overrides it: cpu_features.h).
int usable_cpus() noexcept;

// Thread-safe: assignment may race with waits that read the budget.
class SpinPolicy {
 public:
  static constexpr std::chrono::microseconds kStandardSpin{2000};
  static constexpr std::chrono::microseconds kFixedMax{1000000};
  static constexpr std::chrono::microseconds kPauseOnly{50};
  static constexpr std::chrono::microseconds kOversubscribedSpin{20};

  // Spin for `budget`, then sleep (0: sleep at once). Throws InvalidArgument
  // unless 0 <= budget <= kFixedMax.
  static SpinPolicy fixed(std::chrono::microseconds budget);
  // kStandardSpin (pausing kPauseOnly before it also yields) when `waiters`
  // processes waiting on each other fit usable_cpus(), else kOversubscribedSpin
  // (yielding from the start).
  static SpinPolicy standard(int waiters = 2);

  SpinPolicy(const SpinPolicy& other) noexcept;
  SpinPolicy& operator=(const SpinPolicy& other) noexcept;

  // The fixed budget, or nullopt for the standard policy.
  std::optional<std::chrono::microseconds> fixed_budget() const noexcept;
  // How long a wait spins before it first sleeps.
  std::chrono::nanoseconds budget() const noexcept {
    return std::chrono::nanoseconds(budget_ns_.load(std::memory_order_relaxed));
  }
  // How long the spin only pauses before it also yields the CPU now and then:
  // kPauseOnly for the standard policy while the processes fit the CPUs (a peer
  // that answers at once is caught without a system call); none when they
  // outnumber them and for fixed budgets, which yield from the start.
  std::chrono::nanoseconds pause_only() const noexcept {
    return std::chrono::nanoseconds(pause_only_ns_.load(std::memory_order_relaxed));
  }

 private:
  SpinPolicy(bool standard, std::chrono::nanoseconds budget, std::chrono::nanoseconds pause_only) noexcept;

  // relaxed: settings read at the start of a wait; no other memory is published through them.
  std::atomic<bool> standard_;
  std::atomic<int64_t> budget_ns_;
  std::atomic<int64_t> pause_only_ns_;
};

}  // namespace tensorxfer::sync
