// SignalBarrier: arrival and waiting on an IpcMemory's barrier words
// (signal_layout.h says who writes and who reads each word).
//
// arrive(): release-store the epoch into this rank's line of every rank's
// array (barrier_in also carries the operation's descriptor), then wake the
// ranks that sleep. wait(): until every line of this rank's array holds the
// epoch or later: spin for the budget (offering the CPU now and then, so a rank
// waited for on an oversubscribed core gets to run), then futex-sleep on this
// rank's wake word in slices, running `watch` (peer liveness, Ctrl-C) every
// slice, until the deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/collectives/signal_layout.h"
#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/spin_policy.h"

namespace tensorxfer::collectives {

enum class BarrierLines { kIn, kOut };

class SignalBarrier {
 public:
  // `memory` must be mapped and outlive the barrier. Not thread-safe: one
  // operation at a time (the Communicator serialises its callers).
  SignalBarrier(IpcMemory& memory, const sync::SpinPolicy& spin);

  // `descriptor` (kIn only) goes into slot `sequence % 2` of this rank's lines.
  void arrive(BarrierLines lines, uint64_t epoch, const OpDescriptor* descriptor, uint64_t sequence) noexcept;

  // kReady once every rank arrived at `epoch`; kTimedOut at `deadline`. `watch`
  // runs every kWatchSlice while asleep and before a timeout; it may throw.
  sync::WaitStatus wait(BarrierLines lines, uint64_t epoch, sync::WaitTime deadline,
                        const std::function<void()>& watch);

  // True once every rank arrived at `epoch` in `lines` (acquire: their writes
  // before arriving are visible).
  bool arrived(BarrierLines lines, uint64_t epoch) const noexcept;

  // The ranks whose flag in this rank's `lines` is still below `epoch` (for messages).
  std::vector<int> missing(BarrierLines lines, uint64_t epoch) const noexcept;

  // After wait(kIn, ...): rank `rank`'s descriptor for barrier `sequence`.
  const OpDescriptor& descriptor_of(int rank, uint64_t sequence) const noexcept;

  std::chrono::nanoseconds spin_budget() const noexcept;
  // Thread-safe (SpinPolicy's assignment): later waits use `spin`.
  void set_spin_policy(const sync::SpinPolicy& spin) noexcept { spin_ = spin; }

 private:
  FlagLine* own_lines(BarrierLines lines) const noexcept;

  IpcMemory& memory_;
  sync::SpinPolicy spin_;
};

}  // namespace tensorxfer::collectives
