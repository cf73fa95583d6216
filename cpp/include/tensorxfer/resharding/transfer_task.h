// What the resharding schedule is computed from and what it produces.
//
// Every rank all-gathers the metadata of every rank's sends and receives
// (task id, byte size, source and destination rank) and computes the same
// schedule from it, so no rank has to tell another what to do. The schedule
// moves tasks between ranks in batches: a batch is what one source rank packs
// into one send slot for one destination rank in one iteration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tensorxfer::resharding {

// A task: task_id moves nbytes from src_rank to dest_rank.
struct TransferTask {
  uint64_t task_id = 0;
  uint64_t nbytes = 0;
  int32_t src_rank = 0;
  int32_t dest_rank = 0;
};

// One side of a task as declared by the rank that holds it: a send is
// declared by src_rank, a receive by dest_rank; both name the same task_id.
using TaskEndpoint = TransferTask;
// A task both sides agree on (task_matcher.h).
using MatchedTask = TransferTask;

// A contiguous piece of a task: bytes [task_offset, task_offset + nbytes) of
// the task travel at slot_offset of the batch's slot.
struct TaskSegment {
  uint64_t task_id = 0;
  uint64_t task_offset = 0;
  uint64_t nbytes = 0;
  uint64_t slot_offset = 0;
};

// What src_rank packs for dest_rank in one iteration. batch_index numbers the
// batches of one (src_rank, dest_rank) pair from 0. total_nbytes is the packed
// extent in the slot (the last segment's end, alignment padding included).
struct ScheduledBatch {
  int32_t src_rank = 0;
  int32_t dest_rank = 0;
  uint32_t batch_index = 0;
  uint32_t iteration = 0;
  std::vector<TaskSegment> segments;
  uint64_t total_nbytes = 0;
};

// Bounds a batch must respect.
struct BatchLimits {
  uint64_t slot_nbytes = 0;           // bytes one slot holds: a multiple of kSegmentAlignment
  uint32_t max_tasks_per_batch = 0;   // segments one batch may carry, >= 1
};

// Segments start at multiples of this within a slot, so packing and unpacking
// copy whole cache lines.
inline constexpr uint64_t kSegmentAlignment = 64;

}  // namespace tensorxfer::resharding
