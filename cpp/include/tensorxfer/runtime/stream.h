// HostStream: a worker thread running a FIFO of tasks, with CUDA-stream
// semantics on the host. Tasks run one at a time in enqueue order; enqueue
// returns at once. Events recorded on a stream complete once everything before
// them has run; a stream can wait for another stream's event.
//
// Errors: a task that throws poisons the stream. The tasks behind it are
// skipped (not run) until the error is reported; events recorded behind it
// complete with the error (HostEvent::wait rethrows it); the next
// synchronize() rethrows it with its original type and message and clears it,
// after which the stream runs new work again.
//
// The worker does not survive fork(): in a child, enqueue throws and the
// destructor leaves the parent's thread alone.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "tensorxfer/common/tensor_view.h"
#include "tensorxfer/runtime/event.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::copy {
class CopyEngine;
}

namespace tensorxfer::runtime {

class HostStream {
 public:
  using Task = std::function<void()>;

  // How long the destructor lets pending work finish before cancelling it.
  static constexpr double kDestructorDrainSeconds = 30.0;

  // Starts the worker. Copies go through `engine` (which must outlive the
  // stream) when given, else a memcpy on the worker. Throws SystemError if the
  // thread cannot be started.
  explicit HostStream(copy::CopyEngine* engine = nullptr);
  // close(kDestructorDrainSeconds), errors dropped; always joins the worker.
  ~HostStream();
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Appends `task`; returns its sequence number (1, 2, ...: every enqueue,
  // copy, record and wait_event takes the next one). InvalidArgument if closed.
  uint64_t enqueue(Task task);

  // Appends a copy of src's bytes into dst. Checked now (InvalidArgument):
  // both contiguous host views of equal byte size, dst writable, no partial
  // overlap. The views are raw: the caller keeps both buffers alive until
  // completed_sequence() reaches the returned number.
  uint64_t enqueue_copy(const TensorView& dst, const TensorView& src);

  // Records `event`: it is done once everything enqueued before has run.
  uint64_t record(HostEvent& event);

  // Work enqueued after this waits until `event`'s latest record (at the time
  // of the call) is done. No-op task if never recorded. If that record carries
  // an error, this stream is poisoned with it.
  uint64_t wait_event(const HostEvent& event);

  // Blocks until everything enqueued before the call has finished. Throws
  // Timeout after `timeout` (nullopt: no limit); then rethrows (and clears) a
  // task error, if any. Runs `hook` at least every sync::kWatchSlice while
  // waiting and once before a timeout; what it throws ends the wait (the
  // stream is unchanged, a task error stays pending).
  void synchronize(std::optional<Seconds> timeout = std::nullopt, const sync::WaitHook& hook = {});

  // True when everything enqueued so far has finished. Never blocks or throws.
  [[nodiscard]] bool query() const noexcept;

  // Every task with a sequence number <= this has finished (run, failed,
  // skipped or cancelled) and touches no memory any more.
  uint64_t completed_sequence() const noexcept;
  // Sequence number of the latest enqueued task (0: none yet).
  uint64_t enqueued_sequence() const noexcept;

  // Waits up to `timeout` (nullopt: no limit) until completed_sequence() >=
  // sequence; false on expiry. Does not report task errors. `hook` as in
  // synchronize.
  [[nodiscard]] bool wait_until_completed(uint64_t sequence, std::optional<Seconds> timeout,
                                          const sync::WaitHook& hook = {}) const;

  // Rethrows and clears the stored task error, if any.
  void raise_pending_error();

  // Stops accepting work, lets pending tasks run for up to `timeout`, cancels
  // what is left (events recorded behind complete with an error), joins the
  // worker. Idempotent. Throws Timeout if tasks had to be cancelled. `hook`
  // runs while pending tasks drain (as in synchronize); if it throws, the
  // stream accepts no more work, its worker goes on, and close() may be called again.
  void close(Seconds timeout, const sync::WaitHook& hook = {});
  bool closed() const noexcept;

 private:
  struct State;  // queue, worker and synchronization; leaked in a forked child

  copy::CopyEngine* engine_;
  pid_t owner_pid_;
  std::unique_ptr<State> state_;
};

}  // namespace tensorxfer::runtime
