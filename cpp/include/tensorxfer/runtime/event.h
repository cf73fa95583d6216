// HostEvent: a marker recorded on a HostStream, CUDA-event style. It is done
// once everything enqueued on the stream before the record has run. Within
// one process (mutex + condition variable); cross-process waits use futex.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::runtime {

using Seconds = std::chrono::duration<double>;

namespace detail {

// What an event and the streams holding its pending records share, so a stream
// may complete a record after the HostEvent object is gone. Each record gets a
// generation; the event is done when the latest recorded generation completed.
class EventState {
 public:
  // Starts a new record; returns its generation.
  uint64_t begin_record();
  // Marks `generation` done, with the error of the work before it (or null).
  // Completions of older generations than one already completed are ignored.
  void complete(uint64_t generation, std::exception_ptr error) noexcept;
  // Latest recorded generation (0: never recorded).
  uint64_t recorded() const;
  // True once `generation` (or a later one) completed.
  [[nodiscard]] bool is_complete(uint64_t generation) const;
  // Waits up to `timeout` (nullopt: no limit) for `generation`; false on
  // expiry. Once done, rethrows the error the completing record carried. Runs
  // `hook` every sync::kWatchSlice while waiting; what it throws ends the wait.
  [[nodiscard]] bool wait_for(uint64_t generation, std::optional<Seconds> timeout,
                              const sync::WaitHook& hook = {}) const;
  void reset() noexcept;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable completed_changed_;
  uint64_t recorded_ = 0;
  uint64_t completed_ = 0;
  std::exception_ptr error_;  // carried by the completion of `completed_`
};

}  // namespace detail

class HostEvent {
 public:
  HostEvent();
  // Pending records still complete (into shared state nobody reads).
  ~HostEvent() = default;
  HostEvent(const HostEvent&) = delete;
  HostEvent& operator=(const HostEvent&) = delete;

  // True if never recorded (or reset), or if the work before the latest record
  // has run, successfully or not. Never blocks, never throws.
  [[nodiscard]] bool query() const noexcept;

  // Blocks until the latest record (at the time of the call) is done; returns
  // at once if never recorded. Throws Timeout after `timeout` (nullopt: no
  // limit). If a task before the record failed, rethrows that task's error.
  // Runs `hook` at least every sync::kWatchSlice while waiting and once before
  // reporting a timeout; what it throws ends the wait (the event is unchanged).
  void wait(std::optional<Seconds> timeout = std::nullopt, const sync::WaitHook& hook = {}) const;

  // As wait(timeout, hook) but returns false on expiry instead of throwing Timeout.
  [[nodiscard]] bool wait_for(Seconds timeout, const sync::WaitHook& hook = {}) const;

  // Back to "never recorded": query() is true, wait() returns at once.
  // Records still pending on a stream no longer affect this event.
  void reset() noexcept;

  // For HostStream: the shared state that records complete.
  const std::shared_ptr<detail::EventState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::EventState> state_;
};

}  // namespace tensorxfer::runtime
