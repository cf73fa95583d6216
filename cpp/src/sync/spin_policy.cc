#include "tensorxfer/sync/spin_policy.h"

#include <algorithm>
#include <cstdlib>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {
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
  if (keep_ordered && kept_count == count) {
    next_leaving = count >= kHistory ? std::optional<int64_t>(samples[count % kHistory]) : std::nullopt;
  }
  samples[count % kHistory] = std::clamp(sample, nanoseconds::zero(), kMaxSample).count();
  ++count;
}

const WaitPredictor::Sorted& WaitPredictor::History::ordered(Sorted& scratch) const noexcept {
  const std::size_t n = size();
  if (!keep_ordered || count - kept_count > 1) {
    Sorted& out = keep_ordered ? kept : scratch;
    std::copy(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
    std::sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
    if (keep_ordered) kept_count = count;
    return out;
  }
  if (kept_count == count) return kept;
  // One new sample: a hole moves from where the leaving sample was (or the
  // end) to where the new one belongs; only the samples in between shift.
  const int64_t value = samples[(count - 1) % kHistory];
  int64_t* const begin = kept.data();
  int64_t* const end = begin + n;
  int64_t* hole = next_leaving ? std::lower_bound(begin, end, *next_leaving) : end - 1;
  while (hole + 1 < end && hole[1] < value) {
    hole[0] = hole[1];
    ++hole;
  }
  while (hole > begin && hole[-1] > value) {
    hole[0] = hole[-1];
    --hole;
  }
  *hole = value;
  kept_count = count;
  return kept;
}

WaitPredictor::Spread WaitPredictor::spread_of(const Sorted& ordered, std::size_t n) noexcept {
  return Spread{nanoseconds(ordered[n / 8]), nanoseconds(ordered[n / 2]), nanoseconds(ordered[n - 1 - n / 8])};
}

std::optional<WaitPredictor::Spread> WaitPredictor::History::spread() const noexcept {
  const std::size_t n = size();
  if (n < kMinSamples) return std::nullopt;
  Sorted scratch;
  return spread_of(ordered(scratch), n);
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
  Sorted scratch;
  const Sorted& ordered = wake_lateness_.ordered(scratch);
  const std::size_t n = wake_lateness_.size();
  // Nearly the latest recent wake-up (the 3rd latest of 32): waking early costs
  // a little spinning, waking late costs a notify wake-up.
  return n < kMinSamples ? nanoseconds(kInitialWakeLateness) : nanoseconds(ordered[n - 1 - n / 16]);
}

nanoseconds WaitPredictor::notify_latency() const noexcept {
  const auto spread = notify_latency_.spread();
  return spread ? spread->median : nanoseconds(kInitialNotifyLatency);
}

// ---- WaitPredictor: planning ---------------------------------------------------

std::optional<WaitPredictor::Window> WaitPredictor::choose_window(const Sorted& ordered, std::size_t n,
                                                                 nanoseconds cap) noexcept {
  const int64_t max_width = (cap - 2 * nanoseconds(kWindowMargin)).count();
  if (max_width < 0) return std::nullopt;
  const int64_t median = ordered[n / 2];
  Window window;
  window.median = nanoseconds(median);
  const std::size_t low = n / 16;
  const std::size_t high = n - 1 - n / 16;
  if (ordered[high] - ordered[low] <= max_width) {  // the central 7/8 fits
    window.earliest = nanoseconds(ordered[low]);
    window.latest = nanoseconds(ordered[high]);
    window.covered = high - low + 1;
    return window;
  }
  // The densest stretch of at most max_width; ties go to the one centred nearest the median.
  int64_t best_offset = 0;
  for (std::size_t first = 0, last = 0; first < n; ++first) {
    if (last < first) last = first;
    while (last + 1 < n && ordered[last + 1] - ordered[first] <= max_width) ++last;
    const std::size_t covered = last - first + 1;
    const int64_t offset = std::abs((ordered[first] + ordered[last]) / 2 - median);
    if (covered > window.covered || (covered == window.covered && offset < best_offset)) {
      window.earliest = nanoseconds(ordered[first]);
      window.latest = nanoseconds(ordered[last]);
      window.covered = covered;
      best_offset = offset;
    }
  }
  if (2 * window.covered < n) return std::nullopt;  // irregular: most arrivals would be missed anyway
  return window;
}

std::optional<WaitPlan> WaitPredictor::predicted_plan(WaitTime start, WaitTime base, const Window& window,
                                                      nanoseconds cap) const noexcept {
  const WaitTime window_begin = base + window.earliest - kWindowMargin;
  const WaitTime window_end = base + window.latest + kWindowMargin;
  if (window_end <= start) return std::nullopt;  // overdue: the estimate says nothing about now
  WaitTime wake_at = window_begin - wake_lateness();
  nanoseconds spinning = window_end - window_begin;
  if (wake_at <= start + kAdaptiveFloor) {  // too close to be worth a sleep: spin from the start
    wake_at = start;
    spinning = window_end - start;
  }
  if (spinning > cap) return std::nullopt;
  WaitPlan plan;
  plan.kind = WaitPlan::Kind::kPredicted;
  plan.spin = wake_at == start ? nanoseconds::zero() : nanoseconds(kAdaptiveFloor);
  plan.predicted_arrival = std::clamp(base + window.median, std::max(window_begin, start), window_end);
  plan.wake_at = wake_at;
  plan.window_end = window_end;
  return plan;
}

WaitPlan WaitPredictor::plan(WaitTime start) const noexcept {
  WaitPlan plan;
  plan.predicted_arrival = plan.wake_at = plan.window_end = start;
  Sorted wait_scratch;
  const Sorted& waits = waits_.ordered(wait_scratch);  // kept sorted: no work here
  const std::size_t wait_count = waits_.size();
  const bool waits_known = wait_count >= kMinSamples;
  const bool intervals_known = intervals_.size() >= kMinSamples;
  if (!waits_known && !intervals_known) {
    plan.spin = kAdaptiveInitial;
    return plan;
  }
  if (last_timed_out_) {
    plan.spin = kAdaptiveFloor;
    return plan;
  }
  const Spread wait_spread = waits_known ? spread_of(waits, wait_count) : Spread{};
  if (waits_known && wait_spread.high <= kAdaptiveMax) {
    plan.spin = std::clamp<nanoseconds>(2 * wait_spread.high, kAdaptiveMinSpin, kAdaptiveMax);
    return plan;
  }
  std::optional<WaitPlan> best;
  std::size_t best_covered = 0;
  nanoseconds best_width = nanoseconds::max();
  auto consider = [&](WaitTime base, const Sorted& ordered, std::size_t n) {
    const nanoseconds typical(ordered[n / 2]);
    const nanoseconds cap = std::min<nanoseconds>(typical / kWindowShareDivisor, kMaxWindow);
    const auto window = choose_window(ordered, n, cap);
    if (!window) return;
    const auto candidate = predicted_plan(start, base, *window, cap);
    const nanoseconds width = window->latest - window->earliest;
    // Compare coverage as shares: the two histories may hold different counts.
    const bool more = window->covered * kHistory / n > best_covered;
    const bool same = window->covered * kHistory / n == best_covered;
    if (candidate && (more || (same && width < best_width))) {
      best = candidate;
      best_covered = window->covered * kHistory / n;
      best_width = width;
    }
  };
  if (waits_known) consider(start, waits, wait_count);
  if (intervals_known && last_arrival_) {
    Sorted interval_scratch;
    consider(*last_arrival_, intervals_.ordered(interval_scratch), intervals_.size());
  }
  if (best) return *best;
  if (!waits_known) {
    plan.spin = kAdaptiveInitial;
  } else {
    plan.spin = wait_spread.median <= kAdaptiveMax ? nanoseconds(kAdaptiveMax) : nanoseconds(kAdaptiveFloor);
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

}  // namespace tensorxfer::sync
