// Step 4 of the schedule: place batches into iterations so that in any one
// iteration no rank sends twice and no rank receives twice.
#pragma once

#include <cstdint>
#include <vector>

#include "tensorxfer/resharding/transfer_task.h"

namespace tensorxfer::resharding {

struct Schedule {
  std::vector<ScheduledBatch> batches;  // ordered by (iteration, src_rank)
  uint32_t num_iterations = 0;
};

// Greedy placement: batches in order of decreasing total_nbytes (ties:
// src_rank, dest_rank, batch_index) each go to the earliest iteration in which
// neither their source is already sending nor their destination already
// receiving. Deterministic. Throws InvalidArgument for a batch whose ranks
// are outside [0, world_size) or equal (same-rank moves are not scheduled).
Schedule schedule_batches(std::vector<ScheduledBatch> batches, int world_size);

// Steps 2-4 for tasks already matched (once, as match_tasks or find_task_pairs
// do): segment_tasks, pack_segments, schedule_batches. Task ids must be
// strictly increasing (match_tasks' order; so each task appears once). Throws
// InvalidArgument, naming the task, for ids out of order and for a task whose
// ranks are outside [0, world_size). Same-rank and 0-byte tasks are not scheduled.
Schedule schedule_matched_tasks(const std::vector<MatchedTask>& tasks, int world_size, const BatchLimits& limits);

// The whole pipeline: match_tasks, then schedule_matched_tasks. Every rank
// calls it with the same all-gathered input and gets the same schedule.
Schedule build_schedule(const std::vector<TaskEndpoint>& sends, const std::vector<TaskEndpoint>& receives,
                        int world_size, const BatchLimits& limits);

}  // namespace tensorxfer::resharding
