// A transfer plan resolved once into plain copy lists, run many times (the
// refit every training step does): the CUDA-graph contract, where every task's
// memory stays where it was when the plan was built.
//
// Building turns each task's memory (a strided view: address, element size,
// shape, strides) into its contiguous pieces, and the schedule's segments into
// (source, destination, bytes) spans:
//   local   same-rank pairs: user source -> user destination (one copy);
//   direct  reads from a peer's memory this process maps (a shared send
//           buffer): peer source -> user destination (one copy);
//   pack    iteration i: user source -> the peer's receive slot i%2;
//   unpack  iteration i: this rank's receive slot i%2 -> user destination.
// A run (PipelineExecutor::execute_steps) is then copy_spans calls and the
// group's barriers: no lookups, no staging, no allocation that grows with tasks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tensorxfer/copy/span_pack.h"
#include "tensorxfer/resharding/double_buffers.h"
#include "tensorxfer/resharding/pipeline_plan.h"

namespace tensorxfer::resharding {

// One contiguous run of a task's bytes, in the task's (row-major) byte order.
struct Piece {
  std::byte* data = nullptr;
  uint64_t nbytes = 0;
};
using Pieces = std::vector<Piece>;

// The contiguous runs of a strided view, in row-major order of its elements:
// `strides` in bytes (any sign, 0 allowed: a broadcast element is read again),
// trailing dimensions that are contiguous merged into one run. An empty shape is
// one element. Throws InvalidArgument for mismatched shape/strides lengths, a
// negative size or an overflowing byte count.
Pieces strided_pieces(std::byte* data, uint64_t itemsize, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides);

// Total bytes of `pieces` (overflow-checked).
uint64_t pieces_nbytes(const Pieces& pieces);

// Appends the spans that copy the byte stream [src_offset, src_offset + nbytes)
// of `src` onto [dst_offset, ...) of `dst`, cut where either side's pieces end.
// Throws InvalidArgument if either range runs past its pieces.
void append_stream_copy(std::vector<copy::Span>& out, const Pieces& src, uint64_t src_offset, const Pieces& dst,
                        uint64_t dst_offset, uint64_t nbytes);

struct PersistentSteps {
  std::vector<copy::Span> local;
  std::vector<copy::Span> direct;
  std::vector<std::vector<copy::Span>> pack;    // one list per iteration
  std::vector<std::vector<copy::Span>> unpack;  // one list per iteration
  // Whether any rank of the group reads directly (then every run starts with a
  // barrier: a sender's buffer holds this run's data only once it entered the run).
  bool any_direct = false;
  // Whether any rank moves bytes between processes (then every rank takes part
  // in the barriers, with the same count: pack.size() + 1 + any_direct).
  bool any_remote = false;
  uint64_t bytes = 0;  // bytes this rank writes into its destinations per run
};

// The pack and unpack spans of this rank's part of a schedule: `sends` /
// `receives` give each task's pieces by schedule task id; slots are `buffers`'.
// Checks the schedule against the memory first (check_pipeline_plan, with each
// task's memory as one region of its total size).
void add_pipeline_steps(PersistentSteps& steps, const std::vector<IterationSchedule>& schedules,
                        const std::unordered_map<uint64_t, Pieces>& sends,
                        const std::unordered_map<uint64_t, Pieces>& receives, DoubleBuffers& buffers, int my_pe);

}  // namespace tensorxfer::resharding
