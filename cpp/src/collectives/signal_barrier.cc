#include "tensorxfer/collectives/signal_barrier.h"

#include <atomic>

namespace tensorxfer::collectives {

SignalBarrier::SignalBarrier(IpcMemory& memory, const sync::SpinPolicy& spin) : memory_(memory), spin_(spin) {}

std::chrono::nanoseconds SignalBarrier::spin_budget() const noexcept { return spin_.budget(); }

FlagLine* SignalBarrier::own_lines(BarrierLines lines) const noexcept {
  const int me = memory_.worker_id;
  return lines == BarrierLines::kIn ? memory_.in_lines(me) : memory_.out_lines(me);
}

void SignalBarrier::arrive(BarrierLines lines, uint64_t epoch, const OpDescriptor* descriptor,
                           uint64_t sequence) noexcept {
  const int me = memory_.worker_id;
  const int world = memory_.num_workers;
  // Own line first, then the others starting after this rank, so that ranks do
  // not all write rank 0's lines at the same moment.
  for (int step = 0; step < world; ++step) {
    const int rank = (me + step) % world;
    FlagLine& line = (lines == BarrierLines::kIn ? memory_.in_lines(rank) : memory_.out_lines(rank))[me];
    if (descriptor != nullptr) line.descriptor[sequence % 2] = *descriptor;
    // release: the descriptor above and every write this rank made to its data
    // region before arriving are visible to the owner once it reads the epoch.
    line.epoch.store(epoch, std::memory_order_release);
  }
  // seq_cst fence: orders the flag stores before the reads of `sleepers`
  // below; a waiter increments `sleepers` (seq_cst) before it re-checks the
  // flags, so either it sees our flag or we see it asleep and wake it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int step = 1; step < world; ++step) {
    sync::EventCount& wake = memory_.wake((me + step) % world);
    // seq_cst: pairs with the waiter's increment in EventCount::prepare_wait.
    if (wake.sleepers.load(std::memory_order_seq_cst) != 0) wake.notify_all();
  }
}

sync::WaitStatus SignalBarrier::wait(BarrierLines lines, uint64_t epoch, sync::WaitTime deadline,
                                     const std::function<void()>& watch) {
  FlagLine* own = own_lines(lines);
  const int world = memory_.num_workers;
  int next = 0;  // ranks before `next` are known to have arrived
  auto ready = [&] {
    // acquire: pairs with the writer's release in arrive(); its data and
    // descriptor writes before arriving are visible after this load.
    while (next < world && own[next].epoch.load(std::memory_order_acquire) >= epoch) ++next;
    return next == world;
  };
  return memory_.wake(memory_.worker_id).await(ready, deadline, spin_, [&] {
    if (watch) watch();
  });
}

bool SignalBarrier::arrived(BarrierLines lines, uint64_t epoch) const noexcept {
  const FlagLine* own = own_lines(lines);
  for (int rank = 0; rank < memory_.num_workers; ++rank) {
    // acquire: pairs with the writer's release in arrive().
    if (own[rank].epoch.load(std::memory_order_acquire) < epoch) return false;
  }
  return true;
}

std::vector<int> SignalBarrier::missing(BarrierLines lines, uint64_t epoch) const noexcept {
  std::vector<int> ranks;
  const FlagLine* own = own_lines(lines);
  for (int rank = 0; rank < memory_.num_workers; ++rank) {
    // relaxed: diagnostics only.
    if (own[rank].epoch.load(std::memory_order_relaxed) < epoch) ranks.push_back(rank);
  }
  return ranks;
}

const OpDescriptor& SignalBarrier::descriptor_of(int rank, uint64_t sequence) const noexcept {
  return memory_.in_lines(memory_.worker_id)[rank].descriptor[sequence % 2];
}

}  // namespace tensorxfer::collectives
