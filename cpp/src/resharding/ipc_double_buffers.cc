#include "tensorxfer/resharding/ipc_double_buffers.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

// The operation tags after the slots (two of kTagWords words), one cache line.
constexpr std::size_t kTagBytes = 64;

}  // namespace

std::size_t IpcDoubleBuffers::region_nbytes(std::size_t slot_nbytes) {
  return checked_add(checked_mul(slot_nbytes, std::size_t{4}, "double-buffer region bytes"), kTagBytes,
                     "double-buffer region bytes");
}

IpcDoubleBuffers::IpcDoubleBuffers(collectives::IpcMemory& memory, group::LocalGroup& group, std::size_t slot_nbytes)
    : memory_(memory), group_(group), slot_nbytes_(slot_nbytes) {
  TENSORXFER_CHECK(InvalidArgument, slot_nbytes >= kSegmentAlignment && slot_nbytes % kSegmentAlignment == 0,
                   "slot_nbytes must be a positive multiple of ", kSegmentAlignment, ", got ", slot_nbytes);
  TENSORXFER_CHECK(InvalidArgument, memory.device() == collectives::MemoryDevice::kHost && memory.is_mapped(),
                   "double buffers need a mapped host IpcMemory");
  TENSORXFER_CHECK(InvalidArgument, memory.num_workers == group.world_size() && memory.worker_id == group.rank(),
                   "the IpcMemory (rank ", memory.worker_id, " of ", memory.num_workers, ") and the group (rank ",
                   group.rank(), " of ", group.world_size(), ") disagree");
  TENSORXFER_CHECK(InvalidArgument, memory.data_nbytes() >= region_nbytes(slot_nbytes), "the IpcMemory holds ",
                   memory.data_nbytes(), " bytes per rank, two send and two receive slots of ", slot_nbytes,
                   " bytes and the operation tags need ", region_nbytes(slot_nbytes));
  static_assert(2 * kTagWords * sizeof(sync::SharedWord64) <= kTagBytes);
}

void IpcDoubleBuffers::set_wait(std::chrono::nanoseconds timeout, sync::WaitHook hook) {
  const auto now = std::chrono::steady_clock::now();
  // A timeout beyond what the clock can add is no deadline.
  deadline_.reset();
  if (timeout < std::chrono::steady_clock::time_point::max() - now) deadline_ = now + timeout;
  hook_ = std::move(hook);
}

void IpcDoubleBuffers::barrier() {
  if (!deadline_) return group_.barrier(std::chrono::nanoseconds::max(), hook_);
  const auto left = *deadline_ - std::chrono::steady_clock::now();
  group_.barrier(std::max(std::chrono::duration_cast<std::chrono::nanoseconds>(left), std::chrono::nanoseconds{0}),
                 hook_);
}

}  // namespace tensorxfer::resharding
