#include "tensorxfer/copy/copy_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "copy_kernels.h"
#include "tensorxfer/common/cpu_features.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/process_id.h"
#include "tensorxfer/sync/cpu_relax.h"

namespace tensorxfer::copy {
namespace {

using Clock = std::chrono::steady_clock;

// The engine state whose job this thread is running (workers: always their
// own), so a nested call runs inline instead of waiting for its own job.
thread_local const void* tls_running_engine = nullptr;

class RunningEngineScope {
 public:
  explicit RunningEngineScope(const void* engine) noexcept : previous_(tls_running_engine) {
    tls_running_engine = engine;
  }
  ~RunningEngineScope() { tls_running_engine = previous_; }
  RunningEngineScope(const RunningEngineScope&) = delete;
  RunningEngineScope& operator=(const RunningEngineScope&) = delete;

 private:
  const void* previous_;
};

struct Job {
  const CopyEngine::RangeFunction* fn = nullptr;
  std::size_t count = 0;
  std::size_t grain = 1;
  std::size_t max_participants = 1;
  std::size_t joined = 1;  // the caller; guarded by State::mutex
  Clock::time_point posted;  // when the caller published the job
  // Next item to hand out; relaxed: ranges only need to be handed out once,
  // the data they write is published through `active_workers`.
  std::atomic<std::size_t> next{0};
  // Workers inside the job. Incremented under State::mutex, decremented with
  // release when a worker is done so the caller's acquire load sees its writes.
  std::atomic<std::size_t> active_workers{0};
  // Set once a range threw; relaxed: it only stops handing out more ranges,
  // the exception itself is passed under error_mutex.
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
};

void run_ranges(Job& job) noexcept {
  while (!job.failed.load(std::memory_order_relaxed)) {
    const std::size_t begin = job.next.fetch_add(job.grain, std::memory_order_relaxed);
    if (begin >= job.count) break;
    const std::size_t end = std::min(job.count, begin + job.grain);
    try {
      (*job.fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
  // Streaming stores are weakly ordered: drain them before reporting done.
  detail::streaming_fence();
}

}  // namespace

struct CopyEngine::State {
  // Sleeps until `generation` differs from `seen`, then updates `seen`.
  void wait_for_new_generation(uint64_t& seen);
  // Polls `generation` for up to `how_long`; true (and `seen` updated) if it
  // changed in that time.
  bool poll_for_new_generation(uint64_t& seen, std::chrono::microseconds how_long) const noexcept;
  // Under `mutex`: enters the current job if it has room.
  [[nodiscard]] Job* try_join();
  void leave(Job& job) noexcept;
  void worker_loop(std::chrono::microseconds idle_spin);
  void stop_and_join() noexcept;

  std::vector<std::thread> workers;
  std::mutex submit_mutex;  // one job at a time
  std::mutex mutex;         // guards job, stopping, sleepers
  std::condition_variable wake_workers;
  std::condition_variable job_finished;
  Job* job = nullptr;
  bool stopping = false;
  std::size_t sleepers = 0;
  // Bumped (under `mutex`) for each new job and at shutdown. Read under
  // `mutex` by the workers; atomic so the relaxed reads in the wait predicate
  // need no further reasoning.
  std::atomic<uint64_t> generation{0};
};

void CopyEngine::State::wait_for_new_generation(uint64_t& seen) {
  std::unique_lock<std::mutex> lock(mutex);
  ++sleepers;
  wake_workers.wait(lock, [&] { return generation.load(std::memory_order_relaxed) != seen; });
  --sleepers;
  seen = generation.load(std::memory_order_relaxed);
}

bool CopyEngine::State::poll_for_new_generation(uint64_t& seen,
                                                 std::chrono::microseconds how_long) const noexcept {
  const auto until = Clock::now() + how_long;
  for (unsigned polls = 0;; ++polls) {
    const uint64_t now = generation.load(std::memory_order_relaxed);
    if (now != seen) {
      seen = now;
      return true;
    }
    if ((polls & 63) == 63 && Clock::now() > until) return false;
    sync::cpu_relax();
  }
}

Job* CopyEngine::State::try_join() {
  if (job == nullptr || job->joined >= job->max_participants) return nullptr;
  ++job->joined;
  job->active_workers.fetch_add(1, std::memory_order_relaxed);
  return job;
}

void CopyEngine::State::leave(Job& finished) noexcept {
  if (finished.active_workers.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mutex);
    job_finished.notify_all();
  }
}

void CopyEngine::State::worker_loop(std::chrono::microseconds idle_spin) {
  RunningEngineScope scope(this);
  uint64_t seen = 0;
  // Whether the last job came within idle_spin of the end of the one before.
  bool back_to_back = false;
  Clock::time_point last_finished;
  for (;;) {
    // Idle workers sleep: several engines (one per collector process) polling
    // between jobs would take CPU from whoever shares the machine. Only a
    // worker whose jobs come back to back polls, and only for idle_spin.
    const bool polled = back_to_back && idle_spin.count() > 0 && poll_for_new_generation(seen, idle_spin);
    if (!polled) wait_for_new_generation(seen);
    Job* joined = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) return;
      joined = try_join();
    }
    if (joined == nullptr) {  // the job is full or over: sleep until the next one
      back_to_back = false;
      continue;
    }
    back_to_back = joined->posted - last_finished < idle_spin;  // read before leave() may end the job
    run_ranges(*joined);
    leave(*joined);
    last_finished = Clock::now();
  }
}

void CopyEngine::State::stop_and_join() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
    generation.fetch_add(1, std::memory_order_release);
  }
  wake_workers.notify_all();
  for (auto& worker : workers) worker.join();
}

void require_copyable(const TensorView& dst, const TensorView& src) {
  require_contiguous_host(dst, "dst");
  require_contiguous_host(src, "src");
  require_writable(dst, "dst");
  if (dst.nbytes() != src.nbytes()) {
    throw InvalidArgument("copy: dst and src must have the same number of bytes, got dst " +
                          std::to_string(dst.nbytes()) + " bytes (" + dst.describe() + "), src " +
                          std::to_string(src.nbytes()) + " bytes (" + src.describe() + ")");
  }
  const auto dst_begin = reinterpret_cast<std::uintptr_t>(dst.data);
  const auto src_begin = reinterpret_cast<std::uintptr_t>(src.data);
  const std::size_t nbytes = dst.nbytes();
  if (dst_begin != src_begin && dst_begin < src_begin + nbytes && src_begin < dst_begin + nbytes) {
    throw InvalidArgument("copy: dst and src overlap (dst at " + std::to_string(dst_begin) +
                          ", src at " + std::to_string(src_begin) + ", " +
                          std::to_string(nbytes) + " bytes); copy through a temporary");
  }
}

CopyEngine::CopyEngine(std::size_t num_threads) : CopyEngine(CopyEngineOptions{num_threads}) {}

CopyEngine::CopyEngine(const CopyEngineOptions& options)
    : options_(options),
      owner_pid_(current_process_id()),
      state_(std::make_unique<State>()) {
  // The CPUs this process may use (its affinity mask, not every online CPU: a
  // container limited to 2 of 64 gets 2; TENSORXFER_CPU_COUNT overrides it).
  const std::size_t default_parallelism =
      std::clamp<std::size_t>(static_cast<std::size_t>(cpu_features().usable_cpus), 2, kMaxDefaultParallelism);
  max_parallelism_ = options.max_parallelism == 0 ? default_parallelism : options.max_parallelism;
  // The caller works on every job too: by default one worker fewer than the
  // threads a job may use.
  num_threads_ = options.num_threads == 0 ? max_parallelism_ - 1 : options.num_threads;
  max_parallelism_ = std::max<std::size_t>(1, std::min(max_parallelism_, num_threads_ + 1));
  state_->workers.reserve(num_threads_);
  try {
    for (std::size_t i = 0; i < num_threads_; ++i) {
      state_->workers.emplace_back([state = state_.get(), spin = options_.idle_spin] { state->worker_loop(spin); });
    }
  } catch (const std::system_error& error) {
    const std::size_t started = state_->workers.size();
    state_->stop_and_join();
    throw SystemError("CopyEngine: starting worker thread " + std::to_string(started + 1) + " of " +
                          std::to_string(num_threads_),
                      error.code().value());
  }
}

bool CopyEngine::in_forked_child() const noexcept { return current_process_id() != owner_pid_; }

CopyEngine::~CopyEngine() {
  if (in_forked_child()) {
    // The workers exist only in the parent, and the condition variables list
    // them as waiters: joining or destroying any of it here would hang.
    (void)state_.release();
    return;
  }
  std::lock_guard<std::mutex> submit(state_->submit_mutex);
  state_->stop_and_join();
}

void CopyEngine::copy(void* dst, const void* src, std::size_t nbytes) {
  if (nbytes == 0) return;
  if (nbytes < options_.parallel_threshold || max_parallelism_ < 2 ||
      tls_running_engine == state_.get() || in_forked_child()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  const std::size_t chunk = std::max<std::size_t>(4096, options_.chunk_bytes);
  const bool streaming = nbytes >= options_.streaming_threshold;
  const std::size_t chunks = (nbytes + chunk - 1) / chunk;
  parallel_for(chunks, 1, [&](std::size_t begin, std::size_t end) {
    const std::size_t first = begin * chunk;
    const std::size_t last = std::min(nbytes, end * chunk);
    if (streaming) {
      detail::streaming_copy(out + first, in + first, last - first);
    } else {
      std::memcpy(out + first, in + first, last - first);
    }
  });
}

void CopyEngine::parallel_for(std::size_t count, std::size_t grain, const RangeFunction& fn) {
  if (count == 0) return;
  grain = std::max<std::size_t>(1, grain);
  State& state = *state_;
  if (count <= grain || max_parallelism_ < 2 || tls_running_engine == &state || in_forked_child()) {
    for (std::size_t begin = 0; begin < count; begin += grain) fn(begin, std::min(count, begin + grain));
    detail::streaming_fence();
    return;
  }
  std::lock_guard<std::mutex> submit(state.submit_mutex);
  Job job;
  job.fn = &fn;
  job.count = count;
  job.grain = grain;
  job.max_participants = std::min(max_parallelism_, (count + grain - 1) / grain);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    job.posted = Clock::now();
    state.job = &job;
    state.generation.fetch_add(1, std::memory_order_release);
    // Wake only as many sleepers as the job has places for.
    const std::size_t wanted = job.max_participants - 1;
    for (std::size_t i = 0; i < wanted && i < state.sleepers; ++i) state.wake_workers.notify_one();
  }
  {
    RunningEngineScope scope(&state);
    run_ranges(job);
  }
  // The job is in flight until the workers finish their last ranges: poll
  // briefly (they are usually microseconds from done), then sleep.
  const auto spin_until = Clock::now() + options_.spin;
  for (unsigned polls = 0; job.active_workers.load(std::memory_order_acquire) != 0; ++polls) {
    if ((polls & 63) == 63 && Clock::now() > spin_until) break;
    sync::cpu_relax();
  }
  {
    std::unique_lock<std::mutex> lock(state.mutex);
    state.job_finished.wait(lock, [&] { return job.active_workers.load(std::memory_order_acquire) == 0; });
    state.job = nullptr;
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tensorxfer::copy
