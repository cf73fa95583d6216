// The schedule builder fed with gathered metadata: task sizes, ranks and
// counts as peers declared them (any of which may lie), and slot limits.
//
// Contract (communication_scheduler.h, workload_packer.h): build_schedule and
// schedule_matched_tasks either throw InvalidArgument or return a schedule in
// which every cross-rank task's bytes are covered once, every batch fits its
// slot and its task count, no rank sends twice or receives twice in one
// iteration, and every rank's part passes check_pipeline_plan (the executors'
// own check) against the tasks' sizes.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "fuzz_support.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/pipeline_plan.h"

namespace {

using tensorxfer::InvalidArgument;
using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::resharding;

uint64_t take_size(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  switch (tag >> 6) {
    case 0: return tag & 0x3F;                                       // tiny
    case 1: return uint64_t{input.take<uint16_t>()} * (tag & 0x3F);  // up to a few MiB
    case 2: return input.take<uint32_t>();
    default: return input.take<uint64_t>();                          // anything a peer may claim
  }
}

int32_t take_rank(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  if (tag == 0xFF) return input.take<int32_t>();
  return static_cast<int32_t>(tag % 9) - 1;  // -1..7
}

BatchLimits take_limits(FuzzInput& input) {
  BatchLimits limits;
  const uint8_t tag = input.take<uint8_t>();
  if ((tag & 0x80) != 0) {
    limits.slot_nbytes = input.take<uint64_t>();
  } else {
    limits.slot_nbytes = kSegmentAlignment * (uint64_t{input.take<uint16_t>()} + (tag & 1));
  }
  limits.max_tasks_per_batch = (tag & 0x40) != 0 ? input.take<uint32_t>() : input.take<uint8_t>();
  return limits;
}

// Every check the contract promises, on a schedule that was accepted.
void check_schedule(const Schedule& schedule, const std::vector<MatchedTask>& tasks, int world_size,
                    const BatchLimits& limits) {
  std::map<uint64_t, const MatchedTask*> by_id;
  for (const MatchedTask& task : tasks) by_id[task.task_id] = &task;
  std::set<std::pair<int32_t, uint32_t>> sending, receiving;       // (rank, iteration)
  std::set<std::tuple<int32_t, int32_t, uint32_t>> batch_indices;  // (src, dest, batch_index)
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> covered;  // task -> (offset, end)
  for (std::size_t b = 0; b < schedule.batches.size(); ++b) {
    const ScheduledBatch& batch = schedule.batches[b];
    TENSORXFER_FUZZ_EXPECT(batch.src_rank >= 0 && batch.src_rank < world_size && batch.dest_rank >= 0 &&
                               batch.dest_rank < world_size && batch.src_rank != batch.dest_rank,
                           "batch ranks ", batch.src_rank, " -> ", batch.dest_rank);
    TENSORXFER_FUZZ_EXPECT(batch.iteration < schedule.num_iterations, "iteration in range");
    TENSORXFER_FUZZ_EXPECT(b == 0 || std::tie(schedule.batches[b - 1].iteration, schedule.batches[b - 1].src_rank) <=
                                         std::tie(batch.iteration, batch.src_rank),
                           "batches ordered by (iteration, src_rank)");
    TENSORXFER_FUZZ_EXPECT(sending.emplace(batch.src_rank, batch.iteration).second, "rank ", batch.src_rank,
                           " sends twice in iteration ", batch.iteration);
    TENSORXFER_FUZZ_EXPECT(receiving.emplace(batch.dest_rank, batch.iteration).second, "rank ", batch.dest_rank,
                           " receives twice in iteration ", batch.iteration);
    TENSORXFER_FUZZ_EXPECT(batch_indices.emplace(batch.src_rank, batch.dest_rank, batch.batch_index).second,
                           "batch_index ", batch.batch_index, " twice for one pair");
    TENSORXFER_FUZZ_EXPECT(!batch.segments.empty() && batch.segments.size() <= limits.max_tasks_per_batch,
                           "a batch carries 1..max_tasks_per_batch segments, got ", batch.segments.size());
    TENSORXFER_FUZZ_EXPECT(batch.total_nbytes <= limits.slot_nbytes, "batch fits the slot");
    uint64_t end = 0;
    for (const TaskSegment& segment : batch.segments) {
      TENSORXFER_FUZZ_EXPECT(segment.slot_offset % kSegmentAlignment == 0 && segment.slot_offset >= end,
                             "segments aligned and in slot order");
      TENSORXFER_FUZZ_EXPECT(segment.nbytes >= 1 && segment.nbytes <= batch.total_nbytes - segment.slot_offset,
                             "segment inside the batch");
      end = segment.slot_offset + segment.nbytes;
      const auto task = by_id.find(segment.task_id);
      TENSORXFER_FUZZ_EXPECT(task != by_id.end(), "segment of an unknown task_id=", segment.task_id);
      TENSORXFER_FUZZ_EXPECT(task->second->src_rank == batch.src_rank && task->second->dest_rank == batch.dest_rank,
                             "segment travels with its task's ranks");
      TENSORXFER_FUZZ_EXPECT(segment.task_offset <= task->second->nbytes &&
                                 segment.nbytes <= task->second->nbytes - segment.task_offset,
                             "segment inside its task");
      covered[segment.task_id].emplace_back(segment.task_offset, segment.task_offset + segment.nbytes);
    }
    TENSORXFER_FUZZ_EXPECT(batch.total_nbytes == end, "total_nbytes is the last segment's end");
  }
  for (const MatchedTask& task : tasks) {
    auto& pieces = covered[task.task_id];
    if (task.src_rank == task.dest_rank || task.nbytes == 0) {
      TENSORXFER_FUZZ_EXPECT(pieces.empty(), "same-rank and empty tasks are not scheduled");
      continue;
    }
    std::sort(pieces.begin(), pieces.end());
    uint64_t next = 0;
    for (const auto& [offset, end] : pieces) {
      TENSORXFER_FUZZ_EXPECT(offset == next, "task_id=", task.task_id, " bytes covered once, in order");
      next = end;
    }
    TENSORXFER_FUZZ_EXPECT(next == task.nbytes, "task_id=", task.task_id, " covered whole");
  }

  // Every rank's part is a plan the executors accept.
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<IterationSchedule> plan(schedule.num_iterations);
    TaskMemoryMap sends, receives;
    for (const MatchedTask& task : tasks) {
      if (task.src_rank == rank) sends.emplace(task.task_id, TaskMemory{nullptr, task.nbytes});
      if (task.dest_rank == rank) receives.emplace(task.task_id, TaskMemory{nullptr, task.nbytes});
    }
    for (const ScheduledBatch& batch : schedule.batches) {
      if (batch.src_rank == rank) plan[batch.iteration].send = batch;
      if (batch.dest_rank == rank) plan[batch.iteration].receive = batch;
    }
    const bool valid = tensorxfer::fuzz::accepted<InvalidArgument>(
        "check_pipeline_plan", [&] { check_pipeline_plan(plan, sends, receives, {rank, world_size, limits.slot_nbytes}); });
    TENSORXFER_FUZZ_EXPECT(valid, "rank ", rank, "'s part of an accepted schedule fails check_pipeline_plan");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  const uint8_t mode = input.take<uint8_t>();
  const int world_size = input.take_in<int>(-1, 8);
  const BatchLimits limits = take_limits(input);
  const std::size_t count = input.take_in<std::size_t>(0, 48);
  std::vector<TaskEndpoint> declared;
  uint64_t next_id = 0;
  for (std::size_t i = 0; i < count && !input.empty(); ++i) {
    TaskEndpoint task;
    // Ids mostly increasing (matched order), sometimes anything.
    const uint8_t step = input.take<uint8_t>();
    next_id = step == 0xFF ? input.take<uint64_t>() : next_id + step;
    task.task_id = next_id;
    task.nbytes = take_size(input);
    task.src_rank = take_rank(input);
    task.dest_rank = take_rank(input);
    declared.push_back(task);
  }

  // The builder refuses more than kMaxScheduleSegments segments (workload_packer.cc) before it
  // allocates any. Below that its time grows with the segments: inputs needing more than this
  // target's budget are skipped, so that a second's -timeout measures a hang, not a large plan.
  constexpr uint64_t kMaxScheduleSegments = uint64_t{1} << 22;
  constexpr uint64_t kFuzzSegmentBudget = uint64_t{1} << 14;
  if (limits.slot_nbytes >= kSegmentAlignment) {
    uint64_t segments = 0;
    for (const TaskEndpoint& task : declared) {
      if (task.src_rank == task.dest_rank) continue;
      segments += task.nbytes / limits.slot_nbytes + (task.nbytes % limits.slot_nbytes != 0 ? 1 : 0);
      if (segments > kMaxScheduleSegments) break;
    }
    if (segments > kFuzzSegmentBudget && segments <= kMaxScheduleSegments) return 0;
  }

  Schedule schedule;
  if ((mode & 1) == 0) {
    // The whole pipeline from both sides' declarations (the receivers agree here; the matcher's
    // own target covers disagreement).
    const bool built = tensorxfer::fuzz::accepted<InvalidArgument>(
        "build_schedule", [&] { schedule = build_schedule(declared, declared, world_size, limits); });
    if (!built) return 0;
    std::vector<MatchedTask> tasks = declared;
    std::sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a.task_id < b.task_id; });
    check_schedule(schedule, tasks, world_size, limits);
  } else {
    const bool built = tensorxfer::fuzz::accepted<InvalidArgument>(
        "schedule_matched_tasks", [&] { schedule = schedule_matched_tasks(declared, world_size, limits); });
    if (!built) return 0;
    check_schedule(schedule, declared, world_size, limits);
  }
  return 0;
}
