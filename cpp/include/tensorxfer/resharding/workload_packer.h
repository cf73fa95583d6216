// Steps 2 and 3 of the schedule: cut tasks into slot-sized segments, then pack
// the segments of each (source, destination) pair into batches.
#pragma once

#include <vector>

#include "tensorxfer/resharding/transfer_task.h"

namespace tensorxfer::resharding {

// Cuts every task with src_rank != dest_rank into segments of at most
// limits.slot_nbytes bytes (slot_offset left 0). Same-rank tasks and 0-byte
// tasks produce no segment. Throws InvalidArgument for invalid limits.
std::vector<std::pair<MatchedTask, TaskSegment>> segment_tasks(const std::vector<MatchedTask>& tasks,
                                                               const BatchLimits& limits);

// Packs segments into batches, per (src_rank, dest_rank) pair in ascending
// pair order: largest segment first (ties: task_id, then task_offset), each
// into the batch with the least room that still fits it (best fit), a new
// batch when none does. A batch holds at most limits.max_tasks_per_batch
// segments whose sizes, each rounded up to kSegmentAlignment, add up to at most
// limits.slot_nbytes. Inside a batch, segments are laid out in (task_id,
// task_offset) order at aligned slot offsets. Deterministic: the same input
// gives the same batches on every rank. iteration is left 0.
std::vector<ScheduledBatch> pack_segments(const std::vector<std::pair<MatchedTask, TaskSegment>>& segments,
                                          const BatchLimits& limits);

}  // namespace tensorxfer::resharding
