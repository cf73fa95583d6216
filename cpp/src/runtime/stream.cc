#include "tensorxfer/runtime/stream.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/process_id.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/sync/cpu_relax.h"
#include "watched_wait.h"

namespace tensorxfer::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// A caller about to sleep first polls this long: a task that is about to
// finish is then seen without a wake-up, which takes tens of microseconds on a
// virtual machine.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(20);
// Stream-side event waits check for close() this often.
constexpr Seconds kCancelPollInterval{0.02};

std::string seconds_text(Seconds value) {
  std::ostringstream out;
  out << value.count() << " s";
  return out.str();
}

struct Entry {
  uint64_t sequence = 0;
  HostStream::Task work;                       // empty for event records
  std::shared_ptr<detail::EventState> event;   // set for records
  uint64_t event_generation = 0;
};

}  // namespace

struct HostStream::State {
  // Under `mutex`, with `accepting` checked: appends and numbers the entry.
  uint64_t push(Entry entry);
  void worker_loop() noexcept;
  void run_entry(Entry& entry) noexcept;
  [[nodiscard]] bool wait_until_completed(uint64_t sequence, std::optional<Seconds> timeout,
                                          const sync::WaitHook& hook);

  std::mutex mutex;
  std::condition_variable work_available;
  std::condition_variable work_completed;
  std::deque<Entry> queue;
  uint64_t enqueued = 0;
  bool accepting = true;
  bool stopping = false;
  std::exception_ptr error;  // first failure not yet reported by synchronize
  // Release by the worker once a task finished, so a caller that acquires it
  // may reuse (or free) that task's buffers.
  std::atomic<uint64_t> completed{0};
  // Set by close() when the drain time is over: pending tasks are skipped and
  // stream-side event waits give up. Relaxed: only polled; data is ordered by `mutex`.
  std::atomic<bool> cancelling{false};
  std::mutex close_mutex;  // serializes close() callers
  std::thread worker;
};

uint64_t HostStream::State::push(Entry entry) {
  entry.sequence = ++enqueued;
  const uint64_t sequence = entry.sequence;
  queue.push_back(std::move(entry));
  work_available.notify_one();
  return sequence;
}

bool HostStream::State::wait_until_completed(uint64_t sequence, std::optional<Seconds> timeout,
                                             const sync::WaitHook& hook) {
  if (completed.load(std::memory_order_acquire) >= sequence) return true;
  const auto deadline = detail::deadline_after(timeout);
  const auto spin_until = Clock::now() + kSpinBeforeSleep;
  for (unsigned polls = 0;; ++polls) {
    if (completed.load(std::memory_order_acquire) >= sequence) return true;
    if ((polls & 15) == 15 && Clock::now() >= spin_until) break;
    sync::cpu_relax();
  }
  std::unique_lock<std::mutex> lock(mutex);
  return detail::wait_watching(lock, work_completed, deadline, hook, [&] {
    return completed.load(std::memory_order_relaxed) >= sequence;
  });
}

void HostStream::State::run_entry(Entry& entry) noexcept {
  std::exception_ptr poisoned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    poisoned = error;
  }
  const bool cancelled = cancelling.load(std::memory_order_relaxed);
  if (entry.event) {
    if (!poisoned && cancelled) {
      poisoned = std::make_exception_ptr(
          Timeout("HostStream.close: the stream was closed before the work recorded "
                  "before this event ran"));
    }
    entry.event->complete(entry.event_generation, poisoned);
    entry.event.reset();
    return;
  }
  if (!poisoned && !cancelled) {
    try {
      entry.work();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  }
  entry.work = nullptr;
}

void HostStream::State::worker_loop() noexcept {
  for (;;) {
    Entry entry;
    {
      std::unique_lock<std::mutex> lock(mutex);
      work_available.wait(lock, [&] { return !queue.empty() || stopping; });
      if (queue.empty()) return;
      entry = std::move(queue.front());
      queue.pop_front();
    }
    run_entry(entry);
    {
      std::lock_guard<std::mutex> lock(mutex);
      completed.store(entry.sequence, std::memory_order_release);
    }
    work_completed.notify_all();
  }
}

HostStream::HostStream(copy::CopyEngine* engine)
    : engine_(engine), owner_pid_(current_process_id()), state_(std::make_unique<State>()) {
  try {
    state_->worker = std::thread([state = state_.get()] { state->worker_loop(); });
  } catch (const std::system_error& error) {
    throw SystemError("HostStream: starting the worker thread", error.code().value());
  }
}

HostStream::~HostStream() {
  try {
    close(Seconds(kDestructorDrainSeconds));
  } catch (...) {  // close() joined the worker before reporting; nothing is left to do
  }
  if (current_process_id() != owner_pid_) {
    // The worker exists only in the parent and the condition variables list it
    // as a waiter: destroying them here would hang.
    (void)state_.release();
  }
}

uint64_t HostStream::enqueue(Task task) {
  TENSORXFER_CHECK(InvalidArgument, static_cast<bool>(task), "HostStream.enqueue: empty task");
  Entry entry;
  entry.work = std::move(task);
  std::lock_guard<std::mutex> lock(state_->mutex);
  TENSORXFER_CHECK(Closed, state_->accepting, "HostStream.enqueue: HostStream is closed");
  TENSORXFER_CHECK(InvalidArgument, current_process_id() == owner_pid_, "HostStream: created in process ",
                   owner_pid_, ", its worker thread does not exist in this forked child ",
                   ::getpid(), "; create a new stream here");
  return state_->push(std::move(entry));
}

uint64_t HostStream::enqueue_copy(const TensorView& dst, const TensorView& src) {
  copy::require_copyable(dst, src);
  void* out = dst.data;
  const void* in = src.data;
  const std::size_t nbytes = src.nbytes();
  copy::CopyEngine* engine = engine_;
  return enqueue([engine, out, in, nbytes] {
    if (out == in || nbytes == 0) return;
    if (engine != nullptr) {
      engine->copy(out, in, nbytes);
    } else {
      std::memcpy(out, in, nbytes);
    }
  });
}

uint64_t HostStream::record(HostEvent& event) {
  Entry entry;
  entry.event = event.state();
  std::lock_guard<std::mutex> lock(state_->mutex);
  TENSORXFER_CHECK(Closed, state_->accepting, "HostStream.record: HostStream is closed");
  TENSORXFER_CHECK(InvalidArgument, current_process_id() == owner_pid_, "HostStream: created in process ",
                   owner_pid_, ", its worker thread does not exist in this forked child ",
                   ::getpid(), "; create a new stream here");
  // Under the stream's mutex so generations follow this stream's order.
  entry.event_generation = entry.event->begin_record();
  return state_->push(std::move(entry));
}

uint64_t HostStream::wait_event(const HostEvent& event) {
  std::shared_ptr<detail::EventState> target = event.state();
  const uint64_t generation = target->recorded();
  if (generation == 0) return enqueue([] {});
  State* state = state_.get();
  return enqueue([state, target = std::move(target), generation] {
    // Rethrows the event's error, which poisons this stream with it.
    while (!target->wait_for(generation, kCancelPollInterval)) {
      if (state->cancelling.load(std::memory_order_relaxed)) {
        throw Timeout("HostStream.wait_event: the stream was closed while waiting for an event");
      }
    }
  });
}

void HostStream::synchronize(std::optional<Seconds> timeout, const sync::WaitHook& hook) {
  const uint64_t target = enqueued_sequence();
  if (!wait_until_completed(target, timeout, hook)) {
    const uint64_t pending = target - completed_sequence();
    throw Timeout("HostStream.synchronize: " + std::to_string(pending) + " task(s) still pending after " +
                  seconds_text(*timeout));
  }
  raise_pending_error();
}

bool HostStream::query() const noexcept { return completed_sequence() >= enqueued_sequence(); }

uint64_t HostStream::completed_sequence() const noexcept {
  return state_->completed.load(std::memory_order_acquire);
}

uint64_t HostStream::enqueued_sequence() const noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->enqueued;
}

bool HostStream::wait_until_completed(uint64_t sequence, std::optional<Seconds> timeout,
                                      const sync::WaitHook& hook) const {
  return state_->wait_until_completed(sequence, timeout, hook);
}

void HostStream::raise_pending_error() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    error = std::exchange(state_->error, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void HostStream::close(Seconds timeout, const sync::WaitHook& hook) {
  State& state = *state_;
  std::lock_guard<std::mutex> closing(state.close_mutex);
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.stopping) return;
    state.accepting = false;
    target = state.enqueued;
    if (current_process_id() != owner_pid_) {
      // Forked child: the worker runs only in the parent; never join it here
      // (the destructor leaks the state holding its handle).
      state.stopping = true;
      return;
    }
  }
  const bool drained = state.wait_until_completed(target, timeout, hook);
  uint64_t cancelled = 0;
  if (!drained) {
    state.cancelling.store(true, std::memory_order_relaxed);
    cancelled = target - completed_sequence();
  }
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.stopping = true;
  }
  state.work_available.notify_all();
  state.worker.join();
  if (!drained) {
    throw Timeout("HostStream.close: " + std::to_string(cancelled) +
                  " task(s) were still pending after " + seconds_text(timeout) +
                  "; the ones not yet started were cancelled");
  }
}

bool HostStream::closed() const noexcept {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->accepting;
}

}  // namespace tensorxfer::runtime
