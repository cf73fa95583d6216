#include "tensorxfer/resharding/pipeline_plan.h"

#include <algorithm>
#include <set>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {

void check_pipeline_batch(const ScheduledBatch& batch, const TaskMemoryMap& memory, bool sending,
                          const PlanBounds& bounds) {
  const int world = bounds.world_size;
  const int my_pe = bounds.my_pe;
  const char* side = sending ? "send" : "receive";
  const int32_t own = sending ? batch.src_rank : batch.dest_rank;
  const int32_t peer = sending ? batch.dest_rank : batch.src_rank;
  const char* own_field = sending ? "src_pe" : "dest_pe";
  const char* peer_field = sending ? "dest_pe" : "src_pe";
  TENSORXFER_CHECK(InvalidArgument, own == my_pe, side, " batch of iteration ", batch.iteration, ": ", own_field,
                   " is ", own, ", this is rank ", my_pe);
  TENSORXFER_CHECK(InvalidArgument, peer >= 0 && peer < world && peer != my_pe, side, " batch of iteration ",
                   batch.iteration, ": ", peer_field, " must be another rank of the group (0..", world - 1,
                   ", not ", my_pe, "), got ", peer);
  TENSORXFER_CHECK(InvalidArgument, batch.total_nbytes <= bounds.slot_nbytes, side, " batch ", batch.batch_index,
                   " of iteration ", batch.iteration, ": total_size ", batch.total_nbytes,
                   " exceeds the slot's ", bounds.slot_nbytes, " bytes");
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // (slot_offset, end) of every segment
  extents.reserve(batch.segments.size());
  for (const TaskSegment& segment : batch.segments) {
    const auto found = memory.find(segment.task_id);
    TENSORXFER_CHECK(InvalidArgument, found != memory.end(), side, " batch of iteration ", batch.iteration,
                     " carries task_id=", segment.task_id, " that rank ", my_pe, " has no ", side, " for");
    const uint64_t task_nbytes = found->second.nbytes;
    TENSORXFER_CHECK(InvalidArgument,
                     segment.task_offset <= task_nbytes && segment.nbytes <= task_nbytes - segment.task_offset,
                     side, " batch of iteration ", batch.iteration, ", task_id=", segment.task_id,
                     ": task_offset ", segment.task_offset, " + size ", segment.nbytes, " exceeds the task's ",
                     task_nbytes, " bytes");
    TENSORXFER_CHECK(InvalidArgument,
                     segment.slot_offset <= batch.total_nbytes &&
                         segment.nbytes <= batch.total_nbytes - segment.slot_offset,
                     side, " batch of iteration ", batch.iteration, ", task_id=", segment.task_id,
                     ": slot_offset ", segment.slot_offset, " + size ", segment.nbytes,
                     " exceeds the batch's total_size ", batch.total_nbytes);
    if (segment.nbytes != 0) extents.emplace_back(segment.slot_offset, segment.slot_offset + segment.nbytes);
  }
  std::sort(extents.begin(), extents.end());
  for (std::size_t i = 1; i < extents.size(); ++i) {
    TENSORXFER_CHECK(InvalidArgument, extents[i - 1].second <= extents[i].first, side, " batch of iteration ",
                     batch.iteration, ": segments overlap in the slot (slot_offset ", extents[i].first,
                     " lies inside the segment at slot_offset ", extents[i - 1].first, ")");
  }
}

void check_pipeline_plan(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                         const TaskMemoryMap& receives, const PlanBounds& bounds) {
  TENSORXFER_CHECK(InvalidArgument, schedules.size() <= UINT32_MAX, "a plan holds at most ", UINT32_MAX,
                   " iterations, got ", schedules.size());
  std::set<std::pair<int32_t, uint32_t>> sent, received;  // (peer, batch_index) so far
  for (std::size_t i = 0; i < schedules.size(); ++i) {
    const IterationSchedule& step = schedules[i];
    for (const bool sending : {true, false}) {
      const std::optional<ScheduledBatch>& entry = sending ? step.send : step.receive;
      if (!entry) continue;
      const ScheduledBatch* batch = &*entry;
      const char* side = sending ? "send" : "receive";
      TENSORXFER_CHECK(InvalidArgument, batch->iteration == i, side, " batch in position ", i,
                       " of the plan: iteration is ", batch->iteration, ", expected ", i);
      check_pipeline_batch(*batch, sending ? sends : receives, sending, bounds);
      const int32_t peer = sending ? batch->dest_rank : batch->src_rank;
      const bool fresh = (sending ? sent : received).emplace(peer, batch->batch_index).second;
      TENSORXFER_CHECK(InvalidArgument, fresh, side, " batch of iteration ", i, ": batch_index ", batch->batch_index,
                       " appears twice among the batches ", sending ? "to" : "from", " rank ", peer);
    }
  }
}

}  // namespace tensorxfer::resharding
