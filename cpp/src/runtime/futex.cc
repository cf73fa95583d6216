#include "tensorxfer/runtime/futex.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::runtime {
namespace {

long futex_call(const SharedWord32& word, int operation, uint32_t value, const timespec* timeout) {
  // The kernel only reads the word (FUTEX_WAIT) or uses its address as a key (FUTEX_WAKE).
  auto* address = const_cast<uint32_t*>(&word.raw);
  return ::syscall(SYS_futex, address, operation, value, timeout, nullptr, 0);
}

}  // namespace

bool futex_wait(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return false;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  if (futex_call(word, FUTEX_WAIT, expected, &relative) == 0) return true;
  switch (errno) {
    case EAGAIN:  // the word no longer held `expected`
    case EINTR:   // a signal: the caller re-checks its condition and deadline
      return true;
    case ETIMEDOUT:
      return false;
    default:
      throw_system_error("futex(FUTEX_WAIT)");
  }
}

int futex_wake(SharedWord32& word, int count) noexcept {
  const long woken = futex_call(word, FUTEX_WAKE, static_cast<uint32_t>(count), nullptr);
  return woken < 0 ? 0 : static_cast<int>(woken);
}

int futex_wake_all(SharedWord32& word) noexcept { return futex_wake(word, INT_MAX); }

void yield_processor() noexcept { ::sched_yield(); }

// ---- SpinPolicy ---------------------------------------------------------------

SpinPolicy::SpinPolicy(bool adaptive, std::chrono::nanoseconds fixed) noexcept
    : adaptive_(adaptive),
      fixed_ns_(fixed.count()),
      average_wait_ns_(std::chrono::nanoseconds(kAdaptiveInitial).count() / 4) {}

SpinPolicy SpinPolicy::fixed(std::chrono::microseconds budget) {
  TENSORXFER_CHECK(InvalidArgument, budget.count() >= 0 && budget <= kFixedMax,
                   "spin budget must be between 0 and ", kFixedMax.count(), " us, got ",
                   budget.count(), " us");
  return SpinPolicy(false, budget);
}

SpinPolicy SpinPolicy::adaptive() { return SpinPolicy(true, std::chrono::nanoseconds::zero()); }

SpinPolicy::SpinPolicy(const SpinPolicy& other) noexcept
    : adaptive_(other.adaptive_.load(std::memory_order_relaxed)),
      fixed_ns_(other.fixed_ns_.load(std::memory_order_relaxed)),
      average_wait_ns_(other.average_wait_ns_.load(std::memory_order_relaxed)) {}

SpinPolicy& SpinPolicy::operator=(const SpinPolicy& other) noexcept {
  adaptive_.store(other.adaptive_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  fixed_ns_.store(other.fixed_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  average_wait_ns_.store(other.average_wait_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return *this;
}

std::optional<std::chrono::microseconds> SpinPolicy::fixed_budget() const noexcept {
  if (is_adaptive()) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::nanoseconds(fixed_ns_.load(std::memory_order_relaxed)));
}

std::chrono::nanoseconds SpinPolicy::budget() const noexcept {
  if (!is_adaptive()) return std::chrono::nanoseconds(fixed_ns_.load(std::memory_order_relaxed));
  const int64_t average = average_wait_ns_.load(std::memory_order_relaxed);
  const int64_t cap = std::chrono::nanoseconds(kAdaptiveMax).count();
  if (average > cap) return kAdaptiveFloor;
  return std::chrono::nanoseconds(std::clamp<int64_t>(
      4 * average, std::chrono::nanoseconds(kAdaptiveMinSpin).count(), cap));
}

void SpinPolicy::record_wait(std::chrono::nanoseconds waited) noexcept {
  if (!is_adaptive()) return;
  // Clip outliers (a 1 s wait) so one of them does not disable spinning for long.
  const int64_t cap = 4 * std::chrono::nanoseconds(kAdaptiveMax).count();
  const int64_t sample = std::min<int64_t>(waited.count(), cap);
  const int64_t average = average_wait_ns_.load(std::memory_order_relaxed);
  average_wait_ns_.store(average + (sample - average) / 8, std::memory_order_relaxed);
}

// ---- EventCount ---------------------------------------------------------------
//
// No lost wake-up: the notifier does [state change] -> epoch++ -> read sleepers;
// the waiter does sleepers++ -> read epoch (key) -> check state -> FUTEX_WAIT(key).
// All four shared accesses are seq_cst, so either the waiter's state check sees
// the change, or the notifier's read of sleepers sees the waiter and wakes it
// (and FUTEX_WAIT returns at once if the epoch moved past the key).

void EventCount::notify_all() noexcept {
  epoch.fetch_add(1, std::memory_order_seq_cst);  // seq_cst: ordered before the sleepers read below
  if (sleepers.load(std::memory_order_seq_cst) != 0) {  // seq_cst: pairs with prepare_wait
    futex_wake_all(epoch);
  }
}

uint32_t EventCount::prepare_wait() noexcept {
  sleepers.fetch_add(1, std::memory_order_seq_cst);  // seq_cst: visible before the epoch read
  return epoch.load(std::memory_order_seq_cst);      // seq_cst: see notify_all
}

void EventCount::cancel_wait() noexcept {
  // relaxed: only a hint for notifiers; a stale non-zero count costs one extra syscall.
  sleepers.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tensorxfer::runtime
