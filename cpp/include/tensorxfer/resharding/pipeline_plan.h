// One rank's part of a transfer schedule, as the pipeline executors run it (the
// host one, pipeline_executor.h, and the CUDA one, driven from Python), and the
// checks both make before anything moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "tensorxfer/resharding/transfer_task.h"

namespace tensorxfer::resharding {

// Where each task's bytes start on this rank (a send's source, a receive's
// destination), with the task's byte size for checking the schedule against.
struct TaskMemory {
  std::byte* data = nullptr;
  uint64_t nbytes = 0;
};
using TaskMemoryMap = std::unordered_map<uint64_t, TaskMemory>;

// What this rank does in one iteration: at most one batch out, one batch in.
struct IterationSchedule {
  std::optional<ScheduledBatch> send;
  std::optional<ScheduledBatch> receive;
};

// What a plan is checked against: this rank, the group's size and the slots'.
struct PlanBounds {
  int my_pe = 0;
  int world_size = 0;
  uint64_t slot_nbytes = 0;
};

// Throws InvalidArgument naming the field unless: a send starts at this rank
// and a receive ends here, the peer is another rank of the group, `iteration`
// is the entry's index, no two batches of one peer share a `batch_index`, the
// batch fits the slot, and every segment lies inside its task's memory and the
// batch, without overlapping another segment in the slot.
void check_pipeline_plan(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                         const TaskMemoryMap& receives, const PlanBounds& bounds);

// The same checks for one batch; `sending` picks the side (and the map to check against).
void check_pipeline_batch(const ScheduledBatch& batch, const TaskMemoryMap& memory, bool sending,
                          const PlanBounds& bounds);

}  // namespace tensorxfer::resharding
