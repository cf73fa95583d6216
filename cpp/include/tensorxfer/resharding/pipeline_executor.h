// PipelineExecutor: runs a schedule (communication_scheduler.h) through
// double-buffered slots, the host counterpart of the NVSHMEM pipeline.
//
// For each iteration i, on every rank, on the calling thread (each copy spread
// over the engine's threads):
//   1. pack iteration i straight into the destination's receive slot i%2
//   2. unpack iteration i-1 from this rank's receive slot (i-1)%2
//   3. barrier
// After the last iteration its batch is unpacked and a final barrier ends the
// run. Each byte is copied twice (into the peer's slot, out of this rank's),
// not three times as through a send slot first. Packs use cached stores (the
// peer reads the slot back at once); a run that receives kStreamingSpanBytes
// or more unpacks with streaming stores. Why no slot is overwritten early:
// receive slot i%2 is written by a peer in step 1 of iteration i, after it
// left the barrier of iteration i-1, which every rank entered only after
// finishing the unpack of iteration i-2 from that same slot (step 2). The
// final barrier keeps the next run from writing a receive slot that is still
// being unpacked. (Packing and unpacking on two streams at once measured
// slower: 302 MB each way between 2 processes on 2 cores, 38-41 ms against
// 31-33 ms, as the streams and the engine's workers then compete for the cores.)
//
// Every barrier carries the identity of the operation it belongs to: the
// caller's `operation` (the same on every rank, different for each run), the
// barrier's index in it and how many it has. A rank writes them into its tag words before it
// enters, and after leaving reads every rank's: a barrier completed by ranks
// in different operations (a rank out of step after a failure on one side)
// throws tensorxfer::Error on every rank that sees it instead of going on
// with stale slots. Tags alternate between two word pairs, so a peer already
// tagging its next barrier cannot overwrite the one being checked.
// The send slots serve launch_pack, the stage step of the Python executor.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "tensorxfer/copy/span_pack.h"
#include "tensorxfer/resharding/double_buffers.h"
#include "tensorxfer/resharding/persistent_plan.h"
#include "tensorxfer/resharding/pipeline_plan.h"
#include "tensorxfer/resharding/transfer_task.h"
#include "tensorxfer/runtime/stream.h"

namespace tensorxfer::resharding {

class PipelineExecutor {
 public:
  // `engine` and `buffers` must outlive the executor.
  PipelineExecutor(copy::CopyEngine& engine, DoubleBuffers& buffers, int my_pe);
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  int my_pe() const noexcept { return my_pe_; }

  // Runs the pipeline over `schedules` (one entry per iteration, the same
  // number on every rank; see the file comment). Checked before anything moves (InvalidArgument
  // naming the field): a send starts at this rank and a receive ends here,
  // the peer is another rank of the group, `iteration` is the entry's index,
  // no two batches of one peer share a `batch_index`, the batch fits the
  // slot, and every segment lies inside its task's memory and the batch,
  // without overlapping another segment in the slot. Closed once the buffers
  // are released. The memory
  // in `sends` and `receives` must stay valid until the call returns. Throws
  // what DoubleBuffers::barrier throws (Timeout, PeerLost); nothing touches
  // task memory once it returns or throws.
  void execute_pipeline(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                        const TaskMemoryMap& receives, uint64_t operation);

  // The checks execute_pipeline makes before anything moves, alone (throws
  // what it would throw; moves nothing).
  void check_plan(const std::vector<IterationSchedule>& schedules, const TaskMemoryMap& sends,
                  const TaskMemoryMap& receives) const;

  // The stage steps, exposed for the Python executor's _launch_pack /
  // _launch_unpack: enqueue packing (unpacking) of `batch` into (from) the
  // slot of `iteration` on the pack (unpack) stream. The batch is copied;
  // the memory map must stay valid until synchronize_streams() returns.
  void launch_pack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& sends);
  void launch_unpack(uint32_t iteration, const ScheduledBatch& batch, const TaskMemoryMap& receives);
  // Waits for both streams; rethrows a pack/unpack error.
  void synchronize_streams();

  // One run of a persistent plan (persistent_plan.h; collective when
  // steps.any_remote, every rank with the same number of iterations): a start
  // barrier when any rank reads directly, then the local and direct copies, then
  // for each iteration i the pack of i and the unpack of i-1 followed by a
  // barrier, the last unpack, and a final barrier. Its barriers are tagged
  // (plan_id, version, run << 32 | barrier): ranks running different plans
  // (built apart, or on another group) or different versions throw
  // tensorxfer::Error on every rank that sees it, naming both. When it returns,
  // every rank's bytes of this run have landed. The memory in `steps` must stay
  // valid until it returns or throws.
  void execute_steps(const PersistentSteps& steps, uint64_t plan_id, uint64_t version, uint64_t run);

 private:
  void check_open(const char* operation) const;
  PlanBounds bounds() const;
  void copy_segments(const ScheduledBatch& batch, std::byte* slot, const TaskMemoryMap& memory, bool into_slot,
                     copy::SpanStores stores);
  // Barrier `barrier` of the `barriers` of `operation` (see the file comment).
  void tagged_barrier(uint64_t operation, uint64_t barrier, uint64_t barriers);
  // Enters the group's barrier with `tag` in this rank's tag words; returns the
  // first rank whose tag differs (-1 if none) and its tag in `seen`.
  int barrier_with_tag(const std::array<uint64_t, kTagWords>& tag, std::array<uint64_t, kTagWords>& seen);
  // A persistent run's barrier `barrier` (see execute_steps).
  void persistent_barrier(uint64_t plan_id, uint64_t version, uint64_t run, uint64_t barrier);

  copy::CopyEngine& engine_;
  DoubleBuffers& buffers_;
  int my_pe_;
  uint64_t entered_ = 0;  // tagged barriers entered: their parity picks the tag words
  runtime::HostStream pack_stream_;
  runtime::HostStream unpack_stream_;
};

}  // namespace tensorxfer::resharding
