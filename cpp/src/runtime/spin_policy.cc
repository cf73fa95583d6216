#include "tensorxfer/runtime/spin_policy.h"

#include <algorithm>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::runtime {
namespace {

using std::chrono::nanoseconds;

// Longest sample kept: longer waits are all "long" to the plans, and clipping
// keeps every sum of samples and times far from overflow.
constexpr nanoseconds kMaxSample = std::chrono::seconds(60);
constexpr nanoseconds kMaxLatencySample = std::chrono::milliseconds(1);

bool stamp_plausible(WaitTime stamp, WaitTime reference) noexcept {
  return stamp <= reference && reference - stamp <= WaitPredictor::kStampHorizon;
}

}  // namespace

// ---- WaitPredictor::History ----------------------------------------------------

void WaitPredictor::History::add(nanoseconds sample) noexcept {
  samples[count % kHistory] = std::clamp(sample, nanoseconds::zero(), kMaxSample).count();
  ++count;
}

std::optional<WaitPredictor::Spread> WaitPredictor::History::spread() const noexcept {
  const std::size_t n = size();
  if (n < kMinSamples) return std::nullopt;
  std::array<int64_t, kHistory> sorted = samples;
  std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n));
  return Spread{nanoseconds(sorted[n / 8]), nanoseconds(sorted[n / 2]), nanoseconds(sorted[n - 1 - n / 8])};
}

// ---- WaitPredictor: learning ---------------------------------------------------

void WaitPredictor::add_arrival(WaitTime arrival) noexcept {
  if (last_arrival_ && arrival > *last_arrival_ && arrival - *last_arrival_ <= kStampHorizon) {
    intervals_.add(arrival - *last_arrival_);
  }
  last_arrival_ = arrival;
}

void WaitPredictor::record_arrival(WaitTime start, WaitTime seen, std::optional<WaitTime> stamp, bool after_notify,
                                   Phase phase) noexcept {
  switch (phase) {
    case Phase::kSpin: ++outcomes_.spin; break;
    case Phase::kDoze: ++outcomes_.doze; break;
    case Phase::kWindow: ++outcomes_.window; break;
    case Phase::kSleep: ++outcomes_.sleep; break;
  }
  WaitTime arrival = seen;
  if (stamp && stamp_plausible(*stamp, seen)) {
    arrival = *stamp;
    if (after_notify) notify_latency_.add(std::min(seen - *stamp, kMaxLatencySample));
  } else if (after_notify) {
    arrival = std::max(start, seen - notify_latency());
  }
  waits_.add(std::max(arrival - start, WaitClock::duration::zero()));
  add_arrival(arrival);
  last_timed_out_ = false;
}

void WaitPredictor::record_immediate(WaitTime now, std::optional<WaitTime> stamp) noexcept {
  ++outcomes_.immediate;
  if (stamp && stamp_plausible(*stamp, now)) {
    add_arrival(*stamp);
  } else {
    last_arrival_.reset();  // an arrival we cannot place breaks the chain of intervals
  }
  last_timed_out_ = false;
}

void WaitPredictor::record_timeout() noexcept {
  ++outcomes_.timeout;
  last_arrival_.reset();
  last_timed_out_ = true;
}

void WaitPredictor::record_timed_wake(WaitTime planned, WaitTime woke) noexcept {
  wake_lateness_.add(std::clamp<nanoseconds>(woke - planned, nanoseconds::zero(), kMaxLatencySample));
}

nanoseconds WaitPredictor::wake_lateness() const noexcept {
  const auto spread = wake_lateness_.spread();
  return spread ? spread->high : nanoseconds(kInitialWakeLateness);
}

nanoseconds WaitPredictor::notify_latency() const noexcept {
  const auto spread = notify_latency_.spread();
  return spread ? spread->median : nanoseconds(kInitialNotifyLatency);
}

// ---- WaitPredictor: planning ---------------------------------------------------

std::optional<WaitPlan> WaitPredictor::predicted_plan(WaitTime start, WaitTime earliest, WaitTime median,
                                                      WaitTime latest, nanoseconds typical) const noexcept {
  const WaitTime window_begin = earliest - kWindowMargin;
  const WaitTime window_end = latest + kWindowMargin;
  if (window_end <= start) return std::nullopt;  // overdue: the estimate says nothing about now
  WaitTime wake_at = window_begin - wake_lateness();
  nanoseconds spinning = window_end - window_begin;
  if (wake_at <= start + kAdaptiveFloor) {  // too close to be worth a sleep: spin from the start
    wake_at = start;
    spinning = window_end - start;
  }
  const nanoseconds cap = std::min<nanoseconds>(typical / kWindowShareDivisor, kMaxWindow);
  if (spinning > cap) return std::nullopt;
  WaitPlan plan;
  plan.kind = WaitPlan::Kind::kPredicted;
  plan.spin = wake_at == start ? nanoseconds::zero() : nanoseconds(kAdaptiveFloor);
  plan.predicted_arrival = std::max(median, start);
  plan.wake_at = wake_at;
  plan.window_end = window_end;
  return plan;
}

WaitPlan WaitPredictor::plan(WaitTime start) const noexcept {
  WaitPlan plan;
  plan.predicted_arrival = plan.wake_at = plan.window_end = start;
  const auto waits = waits_.spread();
  const auto intervals = intervals_.spread();
  if (!waits && !intervals) {
    plan.spin = kAdaptiveInitial;
    return plan;
  }
  if (last_timed_out_) {
    plan.spin = kAdaptiveFloor;
    return plan;
  }
  if (waits && waits->high <= kAdaptiveMax) {
    plan.spin = std::clamp<nanoseconds>(2 * waits->high, kAdaptiveMinSpin, kAdaptiveMax);
    return plan;
  }
  std::optional<WaitPlan> best;
  nanoseconds best_width = nanoseconds::max();
  auto consider = [&](WaitTime base, const Spread& spread) {
    const auto candidate = predicted_plan(start, base + spread.low, base + spread.median, base + spread.high,
                                          spread.median);
    if (candidate && spread.high - spread.low < best_width) {
      best = candidate;
      best_width = spread.high - spread.low;
    }
  };
  if (waits) consider(start, *waits);
  if (intervals && last_arrival_) consider(*last_arrival_, *intervals);
  if (best) return *best;
  if (!waits) {
    plan.spin = kAdaptiveInitial;
  } else {
    plan.spin = waits->median <= kAdaptiveMax ? nanoseconds(kAdaptiveMax) : nanoseconds(kAdaptiveFloor);
  }
  return plan;
}

// ---- SpinPolicy ------------------------------------------------------------------

SpinPolicy::SpinPolicy(bool adaptive, nanoseconds fixed) noexcept : adaptive_(adaptive), fixed_ns_(fixed.count()) {}

SpinPolicy SpinPolicy::fixed(std::chrono::microseconds budget) {
  TENSORXFER_CHECK(InvalidArgument, budget.count() >= 0 && budget <= kFixedMax,
                   "spin budget must be between 0 and ", kFixedMax.count(), " us, got ", budget.count(), " us");
  return SpinPolicy(false, budget);
}

SpinPolicy SpinPolicy::adaptive() { return SpinPolicy(true, nanoseconds::zero()); }

SpinPolicy::SpinPolicy(const SpinPolicy& other) noexcept
    : adaptive_(other.adaptive_.load(std::memory_order_relaxed)),
      fixed_ns_(other.fixed_ns_.load(std::memory_order_relaxed)),
      predictor_(other.predictor()) {}

SpinPolicy& SpinPolicy::operator=(const SpinPolicy& other) noexcept {
  if (this == &other) return *this;
  const WaitPredictor learned = other.predictor();
  adaptive_.store(other.adaptive_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  fixed_ns_.store(other.fixed_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  predictor_ = learned;
  return *this;
}

std::optional<std::chrono::microseconds> SpinPolicy::fixed_budget() const noexcept {
  if (is_adaptive()) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::microseconds>(nanoseconds(fixed_ns_.load(std::memory_order_relaxed)));
}

std::chrono::nanoseconds SpinPolicy::budget() const noexcept { return plan(WaitClock::now()).spin; }

WaitPlan SpinPolicy::plan(WaitTime start) const noexcept {
  if (!is_adaptive()) {
    WaitPlan plan;
    plan.spin = nanoseconds(fixed_ns_.load(std::memory_order_relaxed));
    plan.predicted_arrival = plan.wake_at = plan.window_end = start;
    return plan;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return predictor_.plan(start);
}

void SpinPolicy::record_arrival(WaitTime start, WaitTime seen, std::optional<WaitTime> stamp, bool after_notify,
                                WaitPredictor::Phase phase) noexcept {
  if (!is_adaptive()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  predictor_.record_arrival(start, seen, stamp, after_notify, phase);
}

void SpinPolicy::record_immediate(WaitTime now, std::optional<WaitTime> stamp) noexcept {
  if (!is_adaptive()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  predictor_.record_immediate(now, stamp);
}

void SpinPolicy::record_timeout() noexcept {
  if (!is_adaptive()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  predictor_.record_timeout();
}

void SpinPolicy::record_timed_wake(WaitTime planned, WaitTime woke) noexcept {
  if (!is_adaptive()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  predictor_.record_timed_wake(planned, woke);
}

WaitPredictor SpinPolicy::predictor() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return predictor_;
}

}  // namespace tensorxfer::runtime
