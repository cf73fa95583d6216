#include "tensorxfer/resharding/pipeline_executor.h"

#include <array>
#include <vector>
#include <exception>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/span_pack.h"

namespace tensorxfer::resharding {
namespace {

int slot_of(uint32_t iteration) noexcept { return static_cast<int>(iteration % 2); }

// How a run unpacks: a run that receives kStreamingSpanBytes or more writes its
// destinations with streaming stores, batch by batch, as one copy of that size
// would; the slots themselves are packed with cached stores, since their reader
// copies them out at once. (Two processes moving 302 MB each way through 4 MiB
// slots on 2 cores: 31.5 ms with streaming unpacks, 38.9 ms with cached ones.)
copy::SpanStores stores_for_receives(const std::vector<IterationSchedule>& schedules) {
  uint64_t received = 0;
  for (const IterationSchedule& schedule : schedules) {
    if (schedule.receive) received += schedule.receive->total_nbytes;
  }
  return received >= copy::kStreamingSpanBytes ? copy::SpanStores::kStreaming : copy::SpanStores::kBySize;
}

}  // namespace

PipelineExecutor::PipelineExecutor(copy::CopyEngine& engine, DoubleBuffers& buffers, int my_pe)
    : engine_(engine), buffers_(buffers), my_pe_(my_pe) {
  TENSORXFER_CHECK(InvalidArgument, my_pe >= 0, "my_pe must be >= 0, got ", my_pe);
}

PipelineExecutor::~PipelineExecutor() = default;

void PipelineExecutor::check_open(const char* operation) const {
  TENSORXFER_CHECK(Closed, buffers_.is_open(), "PipelineExecutor.", operation,
                   ": DoubleBufferManager is closed");
}

PlanBounds PipelineExecutor::bounds() const {
  return PlanBounds{my_pe_, buffers_.world_size(), buffers_.slot_nbytes()};
}

void PipelineExecutor::check_plan(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                                  const TaskMemoryMap& receives) const {
  check_open("check_plan");
  check_pipeline_plan(schedules, sends, receives, bounds());
}

void PipelineExecutor::copy_segments(const ScheduledBatch& batch, std::byte* slot, const TaskMemoryMap& memory,
                                     bool into_slot, copy::SpanStores stores) {
  std::vector<copy::Span> spans;
  spans.reserve(batch.segments.size());
  for (const TaskSegment& segment : batch.segments) {
    std::byte* task = memory.at(segment.task_id).data + segment.task_offset;
    std::byte* packed = slot + segment.slot_offset;
    spans.push_back(into_slot ? copy::Span{task, packed, segment.nbytes} : copy::Span{packed, task, segment.nbytes});
  }
  copy::copy_spans(spans, &engine_, stores);
}

void PipelineExecutor::launch_pack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& sends) {
  check_open("launch_pack");
  check_pipeline_batch(batch, sends, /*sending=*/true, bounds());
  std::byte* slot = buffers_.send_slot(slot_of(iteration));
  pack_stream_.enqueue([this, batch, slot, &sends] {
    copy_segments(batch, slot, sends, /*into_slot=*/true, copy::SpanStores::kBySize);
  });
}

void PipelineExecutor::launch_unpack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& receives) {
  check_open("launch_unpack");
  check_pipeline_batch(batch, receives, /*sending=*/false, bounds());
  std::byte* slot = buffers_.receive_slot(slot_of(iteration));
  unpack_stream_.enqueue([this, batch, slot, &receives] {
    copy_segments(batch, slot, receives, /*into_slot=*/false, copy::SpanStores::kBySize);
  });
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

int PipelineExecutor::barrier_with_tag(const std::array<uint64_t, kTagWords>& tag,
                                       std::array<uint64_t, kTagWords>& seen) {
  const int parity = static_cast<int>(entered_++ % 2);
  sync::SharedWord64* own = buffers_.operation_tag(my_pe_, parity);
  // Relaxed: the barrier publishes them (everything written before entering is visible after).
  for (std::size_t word = 0; word < kTagWords; ++word) own[word].store(tag[word], std::memory_order_relaxed);
  buffers_.barrier();
  for (int pe = 0; pe < buffers_.world_size(); ++pe) {
    const sync::SharedWord64* theirs = buffers_.operation_tag(pe, parity);
    for (std::size_t word = 0; word < kTagWords; ++word) seen[word] = theirs[word].load(std::memory_order_relaxed);
    if (seen != tag) return pe;
  }
  return -1;
}

void PipelineExecutor::tagged_barrier(uint64_t operation, uint64_t barrier, uint64_t barriers) {
  std::array<uint64_t, kTagWords> seen{};
  const int pe = barrier_with_tag({operation, barrier, barriers}, seen);
  TENSORXFER_CHECK(Error, pe < 0, "PipelineExecutor: ranks out of step: rank ", my_pe_, " left barrier ", barrier,
                   " of ", barriers, " of operation ", operation, ", which rank ", pe, " entered as barrier ",
                   seen[1], " of ", seen[2], " of operation ", seen[0]);
}

void PipelineExecutor::persistent_barrier(uint64_t plan_id, uint64_t version, uint64_t run, uint64_t barrier) {
  std::array<uint64_t, kTagWords> seen{};
  const uint64_t position = run << 32 | barrier;
  const int pe = barrier_with_tag({plan_id, version, position}, seen);
  if (pe < 0) return;
  TENSORXFER_CHECK(Error, seen[0] == plan_id, "PersistentPlan: rank ", my_pe_, " runs plan ", plan_id,
                   " but rank ", pe, " runs plan ", seen[0],
                   " (built apart, on another group, or another operation of the group)");
  TENSORXFER_CHECK(Error, seen[1] == version, "PersistentPlan: rank ", my_pe_, " runs version ", version,
                   " but rank ", pe, " runs version ", seen[1], " of the same plan");
  throw Error(detail::concat("PersistentPlan: ranks out of step: rank ", my_pe_, " is at run ", run, " barrier ",
                             barrier, ", rank ", pe, " at run ", seen[2] >> 32, " barrier ",
                             seen[2] & 0xffffffffu));
}

void PipelineExecutor::execute_steps(const PersistentSteps& steps, uint64_t plan_id, uint64_t version,
                                     uint64_t run) {
  check_open("execute_steps");
  uint64_t barrier = 0;
  if (steps.any_direct) persistent_barrier(plan_id, version, run, barrier++);
  copy::copy_spans(steps.local, &engine_);
  copy::copy_spans(steps.direct, &engine_);
  if (!steps.any_remote) return;
  const std::size_t count = steps.pack.size();
  TENSORXFER_CHECK(InvalidArgument, steps.unpack.size() == count, "PersistentSteps: ", count,
                   " pack lists but ", steps.unpack.size(), " unpack lists");
  // One thread copies, on the engine: the pack of i and the unpack of i-1 are
  // both memory bound, and the engine spreads each over its threads.
  for (std::size_t i = 0; i < count; ++i) {
    copy::copy_spans(steps.pack[i], &engine_);
    if (i >= 1) copy::copy_spans(steps.unpack[i - 1], &engine_);
    persistent_barrier(plan_id, version, run, barrier++);
  }
  if (count > 0) copy::copy_spans(steps.unpack[count - 1], &engine_);
  persistent_barrier(plan_id, version, run, barrier++);
}

void PipelineExecutor::execute_pipeline(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                                        const TaskMemoryMap& receives, uint64_t operation) {
  check_open("execute_pipeline");
  check_plan(schedules, sends, receives);
  const auto count = static_cast<uint32_t>(schedules.size());
  const copy::SpanStores unpack_stores = stores_for_receives(schedules);
  for (uint32_t i = 0; i < count; ++i) {
    if (const auto& batch = schedules[i].send) {
      copy_segments(*batch, buffers_.peer_receive_slot(batch->dest_rank, slot_of(i)), sends, /*into_slot=*/true,
                    copy::SpanStores::kBySize);
    }
    if (i >= 1 && schedules[i - 1].receive) {
      copy_segments(*schedules[i - 1].receive, buffers_.receive_slot(slot_of(i - 1)), receives, /*into_slot=*/false,
                    unpack_stores);
    }
    tagged_barrier(operation, i, count + 1);
  }
  if (count > 0 && schedules[count - 1].receive) {
    copy_segments(*schedules[count - 1].receive, buffers_.receive_slot(slot_of(count - 1)), receives,
                  /*into_slot=*/false, unpack_stores);
  }
  tagged_barrier(operation, count, count + 1);
}

}  // namespace tensorxfer::resharding
