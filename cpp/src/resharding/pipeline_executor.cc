#include "tensorxfer/resharding/pipeline_executor.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::resharding {
namespace {

// Segments are spread over the engine in ranges of about this many bytes.
constexpr uint64_t kBytesPerRange = uint64_t{256} << 10;

int slot_of(uint32_t iteration) noexcept { return static_cast<int>(iteration % 2); }

}  // namespace

PipelineExecutor::PipelineExecutor(copy::CopyEngine& engine, DoubleBuffers& buffers, int my_pe)
    : engine_(engine), buffers_(buffers), my_pe_(my_pe) {
  TENSORXFER_CHECK(InvalidArgument, my_pe >= 0, "my_pe must be >= 0, got ", my_pe);
}

PipelineExecutor::~PipelineExecutor() = default;

void PipelineExecutor::check_batch(const ScheduledBatch& batch, const TaskMemoryMap& memory, const char* side) const {
  TENSORXFER_CHECK(InvalidArgument, batch.total_nbytes <= buffers_.slot_nbytes(), side, " batch ", batch.batch_index,
                   " of iteration ", batch.iteration, " needs ", batch.total_nbytes, " bytes, the slot holds ",
                   buffers_.slot_nbytes());
  for (const TaskSegment& segment : batch.segments) {
    const auto found = memory.find(segment.task_id);
    TENSORXFER_CHECK(InvalidArgument, found != memory.end(), side, " batch of iteration ", batch.iteration,
                     " carries task_id=", segment.task_id, " that rank ", my_pe_, " has no ", side, " for");
    const uint64_t task_nbytes = found->second.nbytes;
    TENSORXFER_CHECK(InvalidArgument,
                     segment.task_offset <= task_nbytes && segment.nbytes <= task_nbytes - segment.task_offset &&
                         segment.slot_offset <= batch.total_nbytes &&
                         segment.nbytes <= batch.total_nbytes - segment.slot_offset,
                     "task_id=", segment.task_id, ": segment [", segment.task_offset, ", +", segment.nbytes,
                     ") at slot offset ", segment.slot_offset, " does not fit the task's ", task_nbytes,
                     " bytes or the batch's ", batch.total_nbytes);
  }
}

void PipelineExecutor::copy_segments(const ScheduledBatch& batch, std::byte* slot, const TaskMemoryMap& memory,
                                     bool into_slot) {
  const auto& segments = batch.segments;
  auto copy_one = [&](const TaskSegment& segment) {
    std::byte* task = memory.at(segment.task_id).data + segment.task_offset;
    std::byte* packed = slot + segment.slot_offset;
    if (into_slot) {
      std::memcpy(packed, task, segment.nbytes);
    } else {
      std::memcpy(task, packed, segment.nbytes);
    }
  };
  if (segments.size() == 1) {
    const TaskSegment& segment = segments.front();
    std::byte* task = memory.at(segment.task_id).data + segment.task_offset;
    std::byte* packed = slot + segment.slot_offset;
    into_slot ? engine_.copy(packed, task, segment.nbytes) : engine_.copy(task, packed, segment.nbytes);
    return;
  }
  const uint64_t average = segments.empty() ? 1 : std::max<uint64_t>(1, batch.total_nbytes / segments.size());
  const std::size_t grain = static_cast<std::size_t>(std::max<uint64_t>(1, kBytesPerRange / average));
  engine_.parallel_for(segments.size(), grain, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) copy_one(segments[i]);
  });
}

void PipelineExecutor::launch_pack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& sends) {
  check_batch(batch, sends, "send");
  std::byte* slot = buffers_.send_slot(slot_of(iteration));
  pack_stream_.enqueue([this, batch, slot, &sends] { copy_segments(batch, slot, sends, /*into_slot=*/true); });
}

void PipelineExecutor::launch_unpack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& receives) {
  check_batch(batch, receives, "receive");
  std::byte* slot = buffers_.receive_slot(slot_of(iteration));
  unpack_stream_.enqueue(
      [this, batch, slot, &receives] { copy_segments(batch, slot, receives, /*into_slot=*/false); });
}

void PipelineExecutor::synchronize_streams() {
  std::exception_ptr first;
  for (runtime::HostStream* stream : {&pack_stream_, &unpack_stream_}) {
    try {
      stream->synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void PipelineExecutor::execute_pipeline(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                                        const TaskMemoryMap& receives) {
  for (const IterationSchedule& step : schedules) {
    if (step.send) {
      TENSORXFER_CHECK(InvalidArgument, step.send->src_rank == my_pe_, "send batch of iteration ",
                       step.send->iteration, " starts at rank ", step.send->src_rank, ", this is rank ", my_pe_);
      check_batch(*step.send, sends, "send");
    }
    if (step.receive) {
      TENSORXFER_CHECK(InvalidArgument, step.receive->dest_rank == my_pe_, "receive batch of iteration ",
                       step.receive->iteration, " ends at rank ", step.receive->dest_rank, ", this is rank ", my_pe_);
      check_batch(*step.receive, receives, "receive");
    }
  }
  const auto count = static_cast<uint32_t>(schedules.size());
  try {
    if (count > 0 && schedules[0].send) launch_pack(0, *schedules[0].send, sends);
    synchronize_streams();
    for (uint32_t i = 0; i < count; ++i) {
      if (i + 1 < count && schedules[i + 1].send) launch_pack(i + 1, *schedules[i + 1].send, sends);
      if (i >= 1 && schedules[i - 1].receive) launch_unpack(i - 1, *schedules[i - 1].receive, receives);
      if (const auto& batch = schedules[i].send) {
        engine_.copy(buffers_.peer_receive_slot(batch->dest_rank, slot_of(i)), buffers_.send_slot(slot_of(i)),
                     batch->total_nbytes);
      }
      synchronize_streams();
      buffers_.barrier();
    }
    if (count > 0 && schedules[count - 1].receive) {
      launch_unpack(count - 1, *schedules[count - 1].receive, receives);
      synchronize_streams();
    }
    buffers_.barrier();
  } catch (...) {
    // Nothing may touch the caller's memory once this returns: drain first.
    try {
      synchronize_streams();
    } catch (...) {
    }
    throw;
  }
}

}  // namespace tensorxfer::resharding
