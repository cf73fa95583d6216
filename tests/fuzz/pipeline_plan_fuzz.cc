// The pipeline executors' plan check, fed with one rank's part of a schedule
// as it arrives (from the all-gathered schedule, or from Python): batches with
// any ranks, iterations, batch indices, sizes and segment offsets.
//
// Contract (pipeline_plan.h): check_pipeline_plan throws InvalidArgument, or
// accepts a plan whose every segment lies inside its task's memory and inside
// its batch, which fits the slot, without overlapping another segment. The
// target then runs the accepted plan's copies on real memory of exactly those
// sizes, so AddressSanitizer sees any byte a wrongly accepted plan would touch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fuzz_support.h"
#include "tensorxfer/resharding/pipeline_plan.h"

namespace {

using tensorxfer::InvalidArgument;
using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::resharding;

constexpr uint64_t kMaxRealBytes = 1 << 16;  // tasks and slots up to this are backed by real memory

uint64_t take_small_or_any(FuzzInput& input, uint8_t tag, uint64_t small_range) {
  return (tag & 0x80) != 0 ? input.take<uint64_t>() : input.take<uint16_t>() % small_range;
}

ScheduledBatch take_batch(FuzzInput& input, int my_pe, bool sending, uint32_t position) {
  ScheduledBatch batch;
  const uint8_t tag = input.take<uint8_t>();
  const int32_t peer = (tag & 0x40) != 0 ? input.take<int32_t>() : static_cast<int32_t>(tag & 3);
  const int32_t own = (tag & 0x20) != 0 ? static_cast<int32_t>(tag & 3) : my_pe;
  batch.src_rank = sending ? own : peer;
  batch.dest_rank = sending ? peer : own;
  batch.batch_index = (tag & 0x10) != 0 ? input.take<uint32_t>() : input.take<uint8_t>() % 4;
  batch.iteration = (tag & 0x08) != 0 ? input.take<uint32_t>() : position;
  batch.total_nbytes = take_small_or_any(input, input.take<uint8_t>(), 8192);
  const std::size_t count = input.take_in<std::size_t>(0, 6);
  for (std::size_t i = 0; i < count; ++i) {
    TaskSegment segment;
    const uint8_t field_tags = input.take<uint8_t>();
    segment.task_id = input.take<uint8_t>() % 8;
    segment.task_offset = take_small_or_any(input, field_tags, 8192);
    segment.nbytes = take_small_or_any(input, static_cast<uint8_t>(field_tags << 1), 8192);
    segment.slot_offset = take_small_or_any(input, static_cast<uint8_t>(field_tags << 2), 8192);
    batch.segments.push_back(segment);
  }
  return batch;
}

// Real memory for each task and for the slot, so the copies of an accepted plan are checked by ASan.
struct Backing {
  std::map<uint64_t, std::unique_ptr<std::byte[]>> tasks;
  std::unique_ptr<std::byte[]> slot;
};

void run_copies(const std::vector<IterationSchedule>& plan, const TaskMemoryMap& sends, const TaskMemoryMap& receives,
                const PlanBounds& bounds) {
  // Only plans whose memory is small enough to allocate: the check itself ran on all of them.
  for (const auto* map : {&sends, &receives}) {
    for (const auto& [id, memory] : *map) {
      if (memory.nbytes > kMaxRealBytes) return;
    }
  }
  if (bounds.slot_nbytes > kMaxRealBytes) return;
  Backing backing;
  auto allocate = [](uint64_t nbytes) { return std::unique_ptr<std::byte[]>(new std::byte[nbytes == 0 ? 1 : nbytes]); };
  std::map<uint64_t, std::byte*> send_memory, receive_memory;
  for (const auto& [id, memory] : sends) send_memory[id] = (backing.tasks[id * 2] = allocate(memory.nbytes)).get();
  for (const auto& [id, memory] : receives) receive_memory[id] = (backing.tasks[id * 2 + 1] = allocate(memory.nbytes)).get();
  // The slot holds exactly slot_nbytes: a batch accepted past it would overflow here.
  backing.slot.reset(new std::byte[bounds.slot_nbytes == 0 ? 1 : bounds.slot_nbytes]);
  for (const IterationSchedule& step : plan) {
    if (step.send) {
      for (const TaskSegment& segment : step.send->segments) {
        if (segment.nbytes == 0) continue;
        std::memcpy(backing.slot.get() + segment.slot_offset, send_memory.at(segment.task_id) + segment.task_offset,
                    segment.nbytes);
      }
    }
    if (step.receive) {
      for (const TaskSegment& segment : step.receive->segments) {
        if (segment.nbytes == 0) continue;
        std::memcpy(receive_memory.at(segment.task_id) + segment.task_offset, backing.slot.get() + segment.slot_offset,
                    segment.nbytes);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  PlanBounds bounds;
  bounds.world_size = input.take_in<int>(-1, 4);
  bounds.my_pe = input.take_in<int>(-1, 3);
  bounds.slot_nbytes = take_small_or_any(input, input.take<uint8_t>(), 16384);

  TaskMemoryMap sends, receives;
  const std::size_t tasks = input.take_in<std::size_t>(0, 8);
  for (std::size_t i = 0; i < tasks; ++i) {
    const uint8_t tag = input.take<uint8_t>();
    const uint64_t id = tag % 8;
    const TaskMemory memory{nullptr, take_small_or_any(input, tag, 16384)};
    ((tag & 0x40) != 0 ? sends : receives)[id] = memory;
  }
  const std::size_t iterations = input.take_in<std::size_t>(0, 6);
  std::vector<IterationSchedule> plan(iterations);
  for (std::size_t i = 0; i < iterations; ++i) {
    const uint8_t which = input.take<uint8_t>();
    if ((which & 1) != 0) plan[i].send = take_batch(input, bounds.my_pe, true, static_cast<uint32_t>(i));
    if ((which & 2) != 0) plan[i].receive = take_batch(input, bounds.my_pe, false, static_cast<uint32_t>(i));
  }

  if (!tensorxfer::fuzz::accepted<InvalidArgument>("check_pipeline_plan",
                                                   [&] { check_pipeline_plan(plan, sends, receives, bounds); })) {
    return 0;
  }
  // Accepted: every contract point, checked independently.
  for (std::size_t i = 0; i < plan.size(); ++i) {
    for (const bool sending : {true, false}) {
      const auto& entry = sending ? plan[i].send : plan[i].receive;
      if (!entry) continue;
      const ScheduledBatch& batch = *entry;
      const int32_t own = sending ? batch.src_rank : batch.dest_rank;
      const int32_t peer = sending ? batch.dest_rank : batch.src_rank;
      TENSORXFER_FUZZ_EXPECT(own == bounds.my_pe && peer >= 0 && peer < bounds.world_size && peer != own,
                             "ranks ", batch.src_rank, " -> ", batch.dest_rank, " accepted on rank ", bounds.my_pe);
      TENSORXFER_FUZZ_EXPECT(batch.iteration == i && batch.total_nbytes <= bounds.slot_nbytes, "batch placement");
      std::vector<std::pair<uint64_t, uint64_t>> extents;
      for (const TaskSegment& segment : batch.segments) {
        const TaskMemoryMap& memory = sending ? sends : receives;
        const auto found = memory.find(segment.task_id);
        TENSORXFER_FUZZ_EXPECT(found != memory.end(), "segment of a task this rank does not hold");
        TENSORXFER_FUZZ_EXPECT(segment.task_offset <= found->second.nbytes &&
                                   segment.nbytes <= found->second.nbytes - segment.task_offset,
                               "segment inside its task");
        TENSORXFER_FUZZ_EXPECT(segment.slot_offset <= batch.total_nbytes &&
                                   segment.nbytes <= batch.total_nbytes - segment.slot_offset,
                               "segment inside its batch");
        if (segment.nbytes != 0) extents.emplace_back(segment.slot_offset, segment.slot_offset + segment.nbytes);
      }
      std::sort(extents.begin(), extents.end());
      for (std::size_t k = 1; k < extents.size(); ++k) {
        TENSORXFER_FUZZ_EXPECT(extents[k - 1].second <= extents[k].first, "segments overlap in the slot");
      }
    }
  }
  run_copies(plan, sends, receives, bounds);
  return 0;
}
