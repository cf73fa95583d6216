#include "tensorxfer/sync/spin_policy.h"

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/cpu_features.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {

int usable_cpus() noexcept { return cpu_features().usable_cpus; }

SpinPolicy::SpinPolicy(bool standard, std::chrono::nanoseconds budget, std::chrono::nanoseconds pause_only) noexcept
    : standard_(standard), budget_ns_(budget.count()), pause_only_ns_(pause_only.count()) {}

SpinPolicy SpinPolicy::fixed(std::chrono::microseconds budget) {
  TENSORXFER_CHECK(InvalidArgument, budget.count() >= 0 && budget <= kFixedMax, "spin budget must be in [0, ",
                   kFixedMax.count(), "] us, got ", budget.count(), " us");
  return SpinPolicy(false, budget, std::chrono::nanoseconds::zero());
}

SpinPolicy SpinPolicy::standard(int waiters) {
  TENSORXFER_CHECK(InvalidArgument, waiters >= 1, "waiters must be >= 1, got ", waiters);
  const bool fits = waiters <= usable_cpus();
  if (fits) return SpinPolicy(true, kStandardSpin, kPauseOnly);
  return SpinPolicy(true, kOversubscribedSpin, std::chrono::nanoseconds::zero());
}

SpinPolicy::SpinPolicy(const SpinPolicy& other) noexcept
    : standard_(other.standard_.load(std::memory_order_relaxed)),
      budget_ns_(other.budget_ns_.load(std::memory_order_relaxed)),
      pause_only_ns_(other.pause_only_ns_.load(std::memory_order_relaxed)) {}

SpinPolicy& SpinPolicy::operator=(const SpinPolicy& other) noexcept {
  if (this != &other) {
    standard_.store(other.standard_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    budget_ns_.store(other.budget_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    pause_only_ns_.store(other.pause_only_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  return *this;
}

std::optional<std::chrono::microseconds> SpinPolicy::fixed_budget() const noexcept {
  if (standard_.load(std::memory_order_relaxed)) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::microseconds>(budget());
}

}  // namespace tensorxfer::sync
