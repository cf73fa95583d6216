// A multi-threaded memcpy: an object owning a few worker threads that split
// large copies (and any index range, for packing) with the calling thread.
// There is no global engine: create one and pass it to whoever copies.
//
// After fork() the child has none of the workers: there every call runs on
// the calling thread, and the destructor leaves the (absent) threads alone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::copy {

// Throws InvalidArgument (naming dst / src) unless both are contiguous host
// views of the same byte size, dst is writable and the two do not partially
// overlap (dst == src is allowed: copying is then a no-op).
void require_copyable(const TensorView& dst, const TensorView& src);

// Threads (workers + caller) one job uses by default, however many cores the
// machine has: a copy is bound by memory bandwidth long before this, and
// every collector process owns an engine.
inline constexpr std::size_t kMaxDefaultParallelism = 8;

struct CopyEngineOptions {
  // Worker threads to start; 0 = max_parallelism - 1 (the caller is the last).
  std::size_t num_threads = 0;
  // Threads (workers + caller) that work on one job at most; 0 = the usable
  // CPUs (cpu_features.h), at least 2 and at most kMaxDefaultParallelism. More runnable
  // copy threads than cores only adds preemption in the middle of a chunk,
  // which delays the whole job.
  std::size_t max_parallelism = 0;
  // copy() below this many bytes is a plain memcpy on the calling thread.
  // Measured with bench/cpp/copy_bench.cc on 2 cores: splitting 256 KiB breaks
  // even, 512 KiB takes 12 us instead of 18 (spinning workers; a sleeping
  // worker adds ~8 us), 1 MiB 22 us instead of 60.
  std::size_t parallel_threshold = std::size_t{512} << 10;
  // A parallel copy is handed out in chunks of this many bytes.
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // Copies of at least this many bytes use streaming (non-temporal) stores:
  // far larger than the caches, they would only evict what others use, and
  // streaming skips reading each destination line before overwriting it.
  std::size_t streaming_threshold = std::size_t{8} << 20;
  // How long the caller polls for the workers to finish their last ranges
  // before sleeping on a condition variable (only while its job is in flight).
  std::chrono::microseconds spin{200};
  // While jobs come back to back (each posted within this long of the end of
  // the one before), a worker that finishes one polls this long for the next
  // before it sleeps, so the next call finds it awake. Once a poll runs out,
  // or jobs come further apart, workers sleep between jobs and use no CPU.
  // Measured on 2 vCPUs (pack_rows of 4096 x 4 KiB rows in a loop): a woken
  // worker left the caller alone for part of each call, 0.95-1.05x torch's
  // index_select; polling 30 or 100 us gave 1.21-1.41x. 0 = always sleep.
  std::chrono::microseconds idle_spin{50};
};

class CopyEngine {
 public:
  // fn(begin, end) processes the items [begin, end).
  using RangeFunction = std::function<void(std::size_t begin, std::size_t end)>;

  // Starts the workers. Throws SystemError if a thread cannot be started.
  explicit CopyEngine(const CopyEngineOptions& options = {});
  explicit CopyEngine(std::size_t num_threads);
  // Waits for the running job (if any) and joins every worker.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  std::size_t num_threads() const noexcept { return num_threads_; }
  // Workers + caller that share one job.
  std::size_t max_parallelism() const noexcept { return max_parallelism_; }
  std::size_t parallel_threshold() const noexcept { return options_.parallel_threshold; }
  std::chrono::microseconds idle_spin() const noexcept { return options_.idle_spin; }

  // Copies `nbytes` from `src` to `dst`; the ranges must not overlap. Blocks
  // until done. Copies of `parallel_threshold` bytes or more are split in
  // chunks across the workers and the caller, large ones stream past the caches.
  // Thread-safe: concurrent callers take turns.
  void copy(void* dst, const void* src, std::size_t nbytes);

  // Calls fn over [0, count) in ranges of `grain` items (the last may be
  // shorter), on the workers and the calling thread; returns when every range
  // has run. If fn throws, no new ranges start and the first exception is
  // rethrown here once the running ranges finish. fn may call back into this
  // engine: nested calls run on the calling thread. Thread-safe.
  void parallel_for(std::size_t count, std::size_t grain, const RangeFunction& fn);

 private:
  struct State;  // threads and synchronization; leaked (never destroyed) in a forked child

  bool in_forked_child() const noexcept;

  CopyEngineOptions options_;
  pid_t owner_pid_;
  std::size_t max_parallelism_ = 2;
  std::size_t num_threads_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace tensorxfer::copy
