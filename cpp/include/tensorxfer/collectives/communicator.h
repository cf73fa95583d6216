// Communicator: collectives among the ranks of one host over an IpcMemory.
//
// Data region of every rank (offsets from remote_data[rank]):
//   [0, stage)            staging window 0
//   [stage, 2 * stage)    staging window 1
//   [2 * stage, + buffer) the zero-copy buffer (buffer(rank)): a tensor that
//                         already lives here (same offset on every rank) is
//                         reduced in place, without the copy in.
// stage = stage_nbytes_for(max_bytes, world_size). Larger messages are cut into chunks
// of at most `stage` bytes; chunk k uses window (barrier sequence % 2).
//
// Protocol of every chunk (signal_layout.h names the words):
//   copy my input into my window -> start barrier (barrier_in, carries the
//   operation descriptor; a mismatch between ranks is an error on all ranks)
//   -> read peers' windows -> [two-shot: middle barrier (barrier_out) between
//   reduce-scatter and all-gather].
// Two-shot all_reduce: rank r reduces slice r from its tensor and from slice r
// of every peer's window, and writes the result over slice r of rank
// (r + 1) % world's window (the copy it has just read), where the others
// gather it after the middle barrier.
// No end barrier is needed for the staging windows: window w is written again
// (by its rank's copy in, or by the previous rank's result) only two start
// barriers later, after every rank has arrived at the start barrier in
// between, so nobody reads it any more (double-buffered window). A two-shot
// all-reduce of a tensor in the zero-copy buffer larger than one chunk runs in
// place there, with an end barrier, because the caller writes the buffer again
// as soon as the call returns (smaller ones and one-shot are copied through a
// window instead).
//
// Results are bitwise identical on every rank: each element is reduced from
// the ranks' values in rank order (reduce.h), whatever the algorithm or chunking.
//
// What a user may write: only buffer(rank) (the zero-copy buffer) and memory
// outside the IpcMemory. A tensor overlapping any rank's staging windows is
// refused (InvalidArgument); the signal words are not data at all.
//
// Thread-safety: one operation in flight per communicator: a call made while
// another thread runs one raises InvalidArgument at once ("one operation at a
// time"); close() from another thread ends the running operation with Closed
// within one watch slice. Every operation takes a timeout (kNoTimeout: wait
// forever, still watching peers and the hook). After a timeout, a lost peer
// or a mismatch, the communicator is unusable (ranks are out of step).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/collectives/signal_barrier.h"
#include "tensorxfer/common/tensor_view.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::collectives {

enum class Algorithm { kAuto, kOneShot, kTwoShot };
// "auto", "one_shot", "two_shot"; throws InvalidArgument listing the choices.
Algorithm parse_algorithm(const std::string& name);
const char* algorithm_name(Algorithm algorithm) noexcept;

// What "auto" picks for `nbytes` among `world_size` ranks (measured on the
// 2-core build VM: see communicator.cc).
Algorithm choose_algorithm(std::size_t nbytes, int world_size) noexcept;

class Communicator {
 public:
  static constexpr std::chrono::nanoseconds kNoTimeout = std::chrono::nanoseconds::max();
  static constexpr std::size_t kMinStageBytes = 4096;
  // The widest element a collective handles (float64, int64).
  static constexpr std::size_t kMaxElementBytes = 8;

  // One staging window's bytes: max_bytes rounded up to 4 KiB, at least
  // kMinStageBytes and one widest element per rank (reduce_scatter's chunk).
  static std::size_t stage_nbytes_for(std::size_t max_bytes, int world_size);
  // The data bytes an IpcMemory of `world_size` ranks needs for these sizes.
  static std::size_t required_data_nbytes(std::size_t max_bytes, std::size_t buffer_bytes, int world_size);

  // Takes a mapped host IpcMemory of at least required_data_nbytes(...).
  // `peer_check` (optional, may throw PeerLost) runs with the segment-owner
  // liveness check every wait slice. spin_budget < 0: the package's one wait
  // policy, sync::SpinPolicy::standard(world size); >= 0: SpinPolicy::fixed. Throws InvalidArgument / Unsupported (CUDA memory).
  Communicator(IpcMemory memory, std::size_t max_bytes, std::size_t buffer_bytes,
               std::function<void()> peer_check = {},
               std::chrono::nanoseconds spin_budget = std::chrono::nanoseconds(-1));
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // In place: `tensor` (host, contiguous, writable, float32/float64/bfloat16/
  // float16/int32/int64) becomes the reduction over ranks.
  void all_reduce(const TensorView& tensor, ReduceOp op, Algorithm algorithm, std::chrono::nanoseconds timeout,
                  const sync::WaitHook& hook = {});
  // output (world_size * input bytes, same dtype) = inputs of ranks 0, 1, ... concatenated.
  void all_gather(const TensorView& output, const TensorView& input, std::chrono::nanoseconds timeout,
                  const sync::WaitHook& hook = {});
  // output (input bytes / world_size, same dtype) = rank `rank`'s block of the reduction of inputs.
  void reduce_scatter(const TensorView& output, const TensorView& input, ReduceOp op,
                      std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});
  // Every rank's `tensor` becomes rank `root`'s.
  void broadcast(const TensorView& tensor, int root, std::chrono::nanoseconds timeout,
                 const sync::WaitHook& hook = {});
  void barrier(std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});

  int rank() const noexcept { return memory_.worker_id; }
  int world_size() const noexcept { return memory_.num_workers; }
  std::size_t max_bytes() const noexcept { return stage_nbytes_; }
  std::size_t buffer_nbytes() const noexcept { return buffer_nbytes_; }
  // Rank `rank`'s zero-copy buffer in this process.
  std::byte* buffer(int rank) const noexcept;
  IpcMemory& memory() noexcept { return memory_; }
  const IpcMemory& memory() const noexcept { return memory_; }
  std::chrono::nanoseconds spin_budget() const noexcept { return barrier_.spin_budget(); }
  // How later waits spend their time (< 0: the standard policy, as at
  // construction). Thread-safe; a running operation may see either setting.
  void set_spin_budget(std::chrono::nanoseconds spin_budget);
  // Operations completed (tests: monotonic, equal on every rank).
  uint64_t barrier_sequence() const noexcept { return sequence_; }
  bool is_broken() const noexcept { return !broken_reason_.empty(); }
  bool is_closed() const noexcept { return memory_.is_closed(); }

  // Closes the memory (IpcMemory::close: buffers stay mapped until destruction).
  // Idempotent; never throws. A running operation ends with Closed (within a
  // watch slice) before the memory goes. In a fork()ed child it takes no lock.
  void close() noexcept;

 private:
  struct Call;  // one operation: deadline, watch, names for messages (communicator.cc)
  friend struct Call;

  std::byte* window(int rank, uint64_t sequence) const noexcept;
  // A start barrier for `descriptor` (after this rank filled its window);
  // checks that every rank's descriptor matches; returns its sequence number.
  uint64_t start_barrier(Call& call, const OpDescriptor& descriptor);
  void out_barrier(Call& call, const char* stage);
  void check_usable(const char* operation) const;
  // Throws InvalidArgument if `view` overlaps a rank's staging windows.
  void require_outside_windows(const TensorView& view, const char* argument) const;
  // A peer that gave up over a lost rank, then peer liveness, then
  // peer_check_. Throws PeerLost; `lost` names the lost rank when known.
  void check_peers(int& lost);
  // Every wait slice of a wait for `lines` at `epoch`: Closed once close()
  // began; check_peers, except that a peer lost after every rank arrived does
  // not fail the wait; a real loss is recorded for the peers.
  void watch_peers(BarrierLines lines, uint64_t epoch);
  // Tells the peers (lost_rank in this rank's WakeLine) which rank was lost; first one wins.
  void record_lost_rank(int lost) noexcept;
  // Runs `check` then `body` under the operation lock after check_usable; a
  // failure in `body` leaves the ranks out of step, so it marks the
  // communicator unusable (one in `check` does not: nothing moved).
  template <typename Check, typename Body>
  void run_operation(const char* operation, Check&& check, Body&& body);

  void all_reduce_staged(Call& call, std::byte* data, std::size_t count, ElementType type, ReduceOp op,
                         Algorithm algorithm, const OpDescriptor& descriptor);
  // Two-shot in place in the zero-copy buffer (no copy in; an end barrier).
  void all_reduce_in_buffer(Call& call, std::size_t offset, std::size_t count, ElementType type, ReduceOp op,
                            const OpDescriptor& descriptor);

  IpcMemory memory_;
  std::size_t stage_nbytes_;
  pid_t owner_pid_;  // the process that made it (close() in a fork()ed child)
  std::size_t buffer_nbytes_;
  std::function<void()> peer_check_;
  SignalBarrier barrier_;
  uint64_t sequence_ = 0;  // start barriers so far (window parity, descriptor slot)
  std::string broken_reason_;
  std::vector<const void*> sources_;     // per-rank pointers, reused
  std::mutex mutex_;                     // one operation in flight
  std::mutex close_mutex_;               // one close() at a time
  std::atomic<bool> closing_{false};     // close() has begun: running waits end
};

}  // namespace tensorxfer::collectives
