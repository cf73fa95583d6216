// Communicator internals shared by communicator.cc (construction, barriers,
// liveness) and communicator_collectives.cc (the collectives' chunk loops).
#pragma once

#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>

#include "tensorxfer/collectives/communicator.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::collectives {
namespace internal {

// memcpy that accepts empty tensors (whose data pointer may be null).
inline void copy_bytes(void* destination, const void* source, std::size_t nbytes) noexcept {
  if (nbytes != 0) std::memcpy(destination, source, nbytes);
}

// Descriptor kinds: collective in the low byte, then reduce op, then algorithm.
enum class Collective : uint32_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };
inline uint32_t encode_kind(Collective collective, uint32_t op = 0, uint32_t algorithm = 0) {
  return static_cast<uint32_t>(collective) | op << 8 | algorithm << 16;
}
inline uint32_t encode_dtype(DLDataType dtype) {
  return static_cast<uint32_t>(dtype.code) << 16 | static_cast<uint32_t>(dtype.bits) << 8 | dtype.lanes;
}
inline void require_tensor(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  require_writable(view, argument);
}

}  // namespace internal

// One operation: deadline, the watch of its waits, names for messages.
struct Communicator::Call {
  Call(Communicator& owner, const char* operation, std::chrono::nanoseconds timeout, const sync::WaitHook& hook)
      : owner(owner), operation(operation), timeout(timeout), hook(hook) {
    TENSORXFER_CHECK(InvalidArgument, timeout.count() >= 0, operation, ": timeout must be >= 0, got ",
                     timeout.count(), " ns");
    if (timeout == std::chrono::nanoseconds::max()) {  // no deadline: no clock read per call
      deadline = sync::WaitTime::max();
      return;
    }
    const auto now = sync::WaitClock::now();
    deadline = timeout >= std::chrono::duration_cast<std::chrono::nanoseconds>(sync::WaitTime::max() - now)
                   ? sync::WaitTime::max()
                   : now + std::chrono::duration_cast<sync::WaitClock::duration>(timeout);
  }

  // Waits for `lines` at `epoch`; a timeout names the missing ranks.
  void wait(BarrierLines lines, uint64_t epoch, const char* stage);

  Communicator& owner;
  const char* operation;
  std::chrono::nanoseconds timeout;
  const sync::WaitHook& hook;
  sync::WaitTime deadline;
};

template <typename Check, typename Body>
void Communicator::run_operation(const char* operation, Check&& check, Body&& body) {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  TENSORXFER_CHECK(InvalidArgument, lock.owns_lock(), operation, ": one operation at a time: another thread is ",
                   "running a collective on this Communicator (or closing it)");
  check_usable(operation);
  check();  // refuses before anything moves: the communicator stays usable
  try {
    body();
  } catch (const std::exception& error) {
    if (broken_reason_.empty()) broken_reason_ = error.what();
    throw;
  }
}

}  // namespace tensorxfer::collectives
