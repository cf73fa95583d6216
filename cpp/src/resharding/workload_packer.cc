#include "tensorxfer/resharding/workload_packer.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

// The most segments one schedule may hold: 2^22, 16 TiB of tasks in the default 4 MiB slots (the
// smallest slot, 64 bytes, gives 256 MiB). Sizes come from what every rank declared; one that lies
// (2^60 bytes) would otherwise have the builder allocate and sort segments without end.
constexpr uint64_t kMaxScheduleSegments = uint64_t{1} << 22;

void check_limits(const BatchLimits& limits) {
  TENSORXFER_CHECK(InvalidArgument, limits.slot_nbytes >= kSegmentAlignment && limits.slot_nbytes % kSegmentAlignment == 0,
                   "slot_nbytes must be a positive multiple of ", kSegmentAlignment, ", got ", limits.slot_nbytes);
  TENSORXFER_CHECK(InvalidArgument, limits.max_tasks_per_batch >= 1, "max_tasks_per_batch must be >= 1, got ",
                   limits.max_tasks_per_batch);
}

// Never overflows: nbytes <= slot_nbytes, itself a multiple of the alignment.
uint64_t aligned(uint64_t nbytes) noexcept {
  return (nbytes + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment;
}

struct PendingBatch {
  std::vector<TaskSegment> segments;
  uint64_t used = 0;
};

// Best-fit decreasing packing of one pair's segments.
std::vector<PendingBatch> pack_pair(std::vector<TaskSegment> segments, const BatchLimits& limits) {
  // Largest first, compared unsigned: a segment may hold up to slot_nbytes, which may pass 2^63.
  std::sort(segments.begin(), segments.end(), [](const TaskSegment& a, const TaskSegment& b) {
    const uint64_t a_need = aligned(a.nbytes), b_need = aligned(b.nbytes);
    if (a_need != b_need) return a_need > b_need;
    return std::tie(a.task_id, a.task_offset) < std::tie(b.task_id, b.task_offset);
  });
  std::vector<PendingBatch> batches;
  // Room left -> batch index, for the batches that can still take a segment.
  // Equal keys keep insertion order, so the earliest such batch wins a tie.
  std::multimap<uint64_t, std::size_t> open_by_room;
  for (const TaskSegment& segment : segments) {
    const uint64_t need = aligned(segment.nbytes);
    auto fit = open_by_room.lower_bound(need);
    std::size_t target;
    if (fit == open_by_room.end()) {
      target = batches.size();
      batches.emplace_back();
    } else {
      target = fit->second;
      open_by_room.erase(fit);
    }
    PendingBatch& batch = batches[target];
    batch.segments.push_back(segment);
    batch.used += need;
    const uint64_t room = limits.slot_nbytes - batch.used;
    if (room >= kSegmentAlignment && batch.segments.size() < limits.max_tasks_per_batch) {
      open_by_room.emplace(room, target);
    }
  }
  return batches;
}

}  // namespace

std::vector<std::pair<MatchedTask, TaskSegment>> segment_tasks(const std::vector<MatchedTask>& tasks,
                                                               const BatchLimits& limits) {
  check_limits(limits);
  // Count first, before anything is allocated for them (and without an offset that could wrap).
  uint64_t count = 0;
  const MatchedTask* largest = nullptr;
  for (const MatchedTask& task : tasks) {
    if (task.src_rank == task.dest_rank) continue;
    count += task.nbytes / limits.slot_nbytes + (task.nbytes % limits.slot_nbytes != 0 ? 1 : 0);
    if (largest == nullptr || task.nbytes > largest->nbytes) largest = &task;
    TENSORXFER_CHECK(InvalidArgument, count <= kMaxScheduleSegments, "the tasks need more than ",
                     kMaxScheduleSegments, " segments of slot_nbytes ", limits.slot_nbytes,
                     ", the most one schedule holds (the largest task so far, task_id=", largest->task_id, ", has ",
                     largest->nbytes, " bytes): a rank declared a wrong size, or the slots are too small");
  }
  std::vector<std::pair<MatchedTask, TaskSegment>> segments;
  segments.reserve(static_cast<std::size_t>(count));
  for (const MatchedTask& task : tasks) {
    if (task.src_rank == task.dest_rank) continue;
    const uint64_t pieces = task.nbytes / limits.slot_nbytes + (task.nbytes % limits.slot_nbytes != 0 ? 1 : 0);
    for (uint64_t k = 0; k < pieces; ++k) {
      const uint64_t offset = k * limits.slot_nbytes;  // < task.nbytes: no overflow
      const uint64_t nbytes = std::min(limits.slot_nbytes, task.nbytes - offset);
      segments.emplace_back(task, TaskSegment{task.task_id, offset, nbytes, 0});
    }
  }
  return segments;
}

std::vector<ScheduledBatch> pack_segments(const std::vector<std::pair<MatchedTask, TaskSegment>>& segments,
                                          const BatchLimits& limits) {
  check_limits(limits);
  std::map<std::pair<int32_t, int32_t>, std::vector<TaskSegment>> by_pair;
  for (const auto& [task, segment] : segments) {
    TENSORXFER_CHECK(InvalidArgument, segment.nbytes >= 1 && segment.nbytes <= limits.slot_nbytes, "segment of task_id=",
                     segment.task_id, " holds ", segment.nbytes, " bytes, expected 1..", limits.slot_nbytes);
    by_pair[{task.src_rank, task.dest_rank}].push_back(segment);
  }
  std::vector<ScheduledBatch> out;
  for (auto& [pair, pair_segments] : by_pair) {
    uint32_t batch_index = 0;
    for (PendingBatch& pending : pack_pair(std::move(pair_segments), limits)) {
      std::sort(pending.segments.begin(), pending.segments.end(), [](const TaskSegment& a, const TaskSegment& b) {
        return std::tie(a.task_id, a.task_offset) < std::tie(b.task_id, b.task_offset);
      });
      ScheduledBatch batch;
      batch.src_rank = pair.first;
      batch.dest_rank = pair.second;
      batch.batch_index = batch_index++;
      uint64_t offset = 0;
      for (TaskSegment& segment : pending.segments) {
        segment.slot_offset = offset;
        batch.total_nbytes = offset + segment.nbytes;
        offset += aligned(segment.nbytes);
      }
      batch.segments = std::move(pending.segments);
      out.push_back(std::move(batch));
    }
  }
  return out;
}

}  // namespace tensorxfer::resharding
