#include "tensorxfer/resharding/communication_scheduler.h"

#include <algorithm>
#include <tuple>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/resharding/task_matcher.h"
#include "tensorxfer/resharding/workload_packer.h"

namespace tensorxfer::resharding {
namespace {

// Which iterations a rank already sends (or receives) in, and the first one it does not: every
// iteration before first_free() is busy, so a search for a free one starts there (without it, one
// pair's n batches cost n^2 / 2 steps to place).
class BusyIterations {
 public:
  bool busy(uint32_t iteration) const noexcept { return iteration < busy_.size() && busy_[iteration]; }
  uint32_t first_free() const noexcept { return first_free_; }
  void mark(uint32_t iteration) {
    if (iteration >= busy_.size()) busy_.resize(iteration + 1, false);
    busy_[iteration] = true;
    while (busy(first_free_)) ++first_free_;
  }

 private:
  std::vector<bool> busy_;
  uint32_t first_free_ = 0;
};

}  // namespace

Schedule schedule_batches(std::vector<ScheduledBatch> batches, int world_size) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1, "world_size must be >= 1, got ", world_size);
  for (const ScheduledBatch& batch : batches) {
    const bool in_range = batch.src_rank >= 0 && batch.src_rank < world_size && batch.dest_rank >= 0 &&
                          batch.dest_rank < world_size;
    TENSORXFER_CHECK(InvalidArgument, in_range && batch.src_rank != batch.dest_rank, "batch ", batch.batch_index,
                     " goes rank ", batch.src_rank, " -> ", batch.dest_rank,
                     ", expected two different ranks in [0, ", world_size, ")");
  }
  std::sort(batches.begin(), batches.end(), [](const ScheduledBatch& a, const ScheduledBatch& b) {
    if (a.total_nbytes != b.total_nbytes) return a.total_nbytes > b.total_nbytes;
    return std::tie(a.src_rank, a.dest_rank, a.batch_index) < std::tie(b.src_rank, b.dest_rank, b.batch_index);
  });
  std::vector<BusyIterations> sending(static_cast<std::size_t>(world_size));
  std::vector<BusyIterations> receiving(static_cast<std::size_t>(world_size));
  Schedule schedule;
  for (ScheduledBatch& batch : batches) {
    BusyIterations& source = sending[static_cast<std::size_t>(batch.src_rank)];
    BusyIterations& destination = receiving[static_cast<std::size_t>(batch.dest_rank)];
    // The earliest iteration free for both (the same one a scan from 0 finds).
    uint32_t iteration = std::max(source.first_free(), destination.first_free());
    while (source.busy(iteration) || destination.busy(iteration)) ++iteration;
    source.mark(iteration);
    destination.mark(iteration);
    batch.iteration = iteration;
    schedule.num_iterations = std::max(schedule.num_iterations, iteration + 1);
  }
  std::sort(batches.begin(), batches.end(), [](const ScheduledBatch& a, const ScheduledBatch& b) {
    return std::tie(a.iteration, a.src_rank) < std::tie(b.iteration, b.src_rank);
  });
  schedule.batches = std::move(batches);
  return schedule;
}

Schedule schedule_matched_tasks(const std::vector<MatchedTask>& tasks, int world_size, const BatchLimits& limits) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1, "world_size must be >= 1, got ", world_size);
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const MatchedTask& task = tasks[i];
    TENSORXFER_CHECK(InvalidArgument, i == 0 || tasks[i - 1].task_id < task.task_id, "matched task_id=", task.task_id,
                     " follows task_id=", i == 0 ? 0 : tasks[i - 1].task_id, ", expected strictly increasing ids");
    const bool in_range = task.src_rank >= 0 && task.src_rank < world_size && task.dest_rank >= 0 &&
                          task.dest_rank < world_size;
    TENSORXFER_CHECK(InvalidArgument, in_range, "task_id=", task.task_id, " goes rank ", task.src_rank, " -> ",
                     task.dest_rank, ", expected ranks in [0, ", world_size, ")");
  }
  return schedule_batches(pack_segments(segment_tasks(tasks, limits), limits), world_size);
}

Schedule build_schedule(const std::vector<TaskEndpoint>& sends, const std::vector<TaskEndpoint>& receives,
                        int world_size, const BatchLimits& limits) {
  return schedule_matched_tasks(match_tasks(sends, receives, world_size), world_size, limits);
}

}  // namespace tensorxfer::resharding
