#include "tensorxfer/sync/futex.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {
namespace {

long futex_call(const SharedWord32& word, int operation, uint32_t value, const timespec* timeout) {
  // The kernel only reads the word (FUTEX_WAIT) or uses its address as a key (FUTEX_WAKE).
  auto* address = const_cast<uint32_t*>(&word.raw);
  return ::syscall(SYS_futex, address, operation, value, timeout, nullptr, 0);
}

}  // namespace

FutexWaitEnd futex_sleep(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return FutexWaitEnd::kTimedOut;
  timespec relative{};
  relative.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  relative.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  if (futex_call(word, FUTEX_WAIT, expected, &relative) == 0) return FutexWaitEnd::kWoken;
  switch (errno) {
    case EAGAIN:  // the word no longer held `expected`
      return FutexWaitEnd::kWoken;
    case EINTR:  // a signal handler ran: the caller re-checks its condition and deadline
      return FutexWaitEnd::kInterrupted;
    case ETIMEDOUT:
      return FutexWaitEnd::kTimedOut;
    default:
      throw_system_error("futex(FUTEX_WAIT)");
  }
}

bool futex_wait(const SharedWord32& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  return futex_sleep(word, expected, timeout) != FutexWaitEnd::kTimedOut;
}

int futex_wake(SharedWord32& word, int count) noexcept {
  const long woken = futex_call(word, FUTEX_WAKE, static_cast<uint32_t>(count), nullptr);
  return woken < 0 ? 0 : static_cast<int>(woken);
}

int futex_wake_all(SharedWord32& word) noexcept { return futex_wake(word, INT_MAX); }

void yield_processor() noexcept { ::sched_yield(); }

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

}  // namespace tensorxfer::sync
