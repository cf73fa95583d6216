// Condition-variable waits of the host runtime (streams, events) with a
// deadline and a WaitHook, run like the cross-process waits in sync/futex.h:
// at least every kWatchSlice and once more before the wait reports expiry.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "tensorxfer/runtime/event.h"
#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::runtime::detail {

using WaitClock = std::chrono::steady_clock;

// Longest single condition-variable sleep without a hook (keeps clock
// arithmetic far from overflow; the wait simply goes on after it).
inline constexpr std::chrono::hours kLongestSleep{1};

// The time `timeout` from now; nullopt for no timeout, or one so long that no
// clock reading reaches it. Negative timeouts count as zero.
inline std::optional<WaitClock::time_point> deadline_after(std::optional<Seconds> timeout) {
  if (!timeout) return std::nullopt;
  const WaitClock::time_point now = WaitClock::now();
  const Seconds left = std::max(*timeout, Seconds(0));
  if (left >= std::chrono::duration_cast<Seconds>(WaitClock::time_point::max() - now)) return std::nullopt;
  return now + std::chrono::duration_cast<WaitClock::duration>(left);
}

// Called with `lock` held on the mutex guarding what done() reads. Waits on
// `changed` until done() (-> true) or `deadline` passes (-> false; nullopt:
// never). With a hook, sleeps are cut into kWatchSlice slices and the hook runs
// between them with `lock` released, and once more before returning false. An
// exception from the hook ends the wait (`lock` is then not held).
template <typename Done>
bool wait_watching(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                   std::optional<WaitClock::time_point> deadline, const sync::WaitHook& hook, Done&& done) {
  bool watched = false;  // the hook ran after the last check
  for (;;) {
    if (done()) return true;
    const WaitClock::time_point now = WaitClock::now();
    if (deadline && now >= *deadline) {
      if (!hook || watched) return false;
      // A zero timeout never slept: the hook still gets its look (as in EventCount::await).
      lock.unlock();
      hook();
      lock.lock();
      watched = true;
      continue;
    }
    WaitClock::duration slice = hook ? WaitClock::duration(sync::kWatchSlice) : WaitClock::duration(kLongestSleep);
    if (deadline) slice = std::min(slice, *deadline - now);
    if (changed.wait_for(lock, slice, done)) return true;
    if (hook) {
      // Released: the hook may take the GIL, and a Python thread holding the
      // GIL may be about to take this mutex (e.g. event.query()).
      lock.unlock();
      hook();
      lock.lock();
      watched = true;
    }
  }
}

}  // namespace tensorxfer::runtime::detail
