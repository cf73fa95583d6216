#include "tensorxfer/resharding/persistent_plan.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

// Where byte `offset` of a task falls: the piece's index and the offset in it.
// `starts[i]` is piece i's first byte in the task.
std::pair<std::size_t, uint64_t> locate(const std::vector<uint64_t>& starts, uint64_t offset) {
  const auto after = std::upper_bound(starts.begin(), starts.end(), offset);
  const auto index = static_cast<std::size_t>(after - starts.begin()) - 1;
  return {index, offset - starts[index]};
}

std::vector<uint64_t> piece_starts(const Pieces& pieces) {
  std::vector<uint64_t> starts(pieces.size());
  uint64_t offset = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    starts[i] = offset;
    offset = checked_add(offset, pieces[i].nbytes, "a task's bytes");
  }
  return starts;
}

}  // namespace

Pieces strided_pieces(std::byte* data, uint64_t itemsize, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) {
  TENSORXFER_CHECK(InvalidArgument, shape.size() == strides.size(), "a strided view needs one stride per dimension, got ",
                   shape.size(), " sizes and ", strides.size(), " strides");
  uint64_t count = 1;
  for (const int64_t size : shape) {
    TENSORXFER_CHECK(InvalidArgument, size >= 0, "a strided view's sizes must be >= 0, got ", size);
    count = checked_mul(count, static_cast<uint64_t>(size), "a strided view's elements");
  }
  checked_mul(count, itemsize, "a strided view's bytes");
  Pieces pieces;
  if (count == 0 || itemsize == 0) return pieces;
  // Merge trailing dimensions while they are contiguous: a run of `run` bytes.
  std::size_t inner = shape.size();
  uint64_t run = itemsize;
  while (inner > 0) {
    const std::size_t dim = inner - 1;
    if (shape[dim] == 1) {
      --inner;
      continue;
    }
    if (strides[dim] != static_cast<int64_t>(run)) break;
    run *= static_cast<uint64_t>(shape[dim]);
    --inner;
  }
  // Iterate the outer dimensions [0, inner) in row-major order.
  std::vector<int64_t> index(inner, 0);
  const uint64_t runs = count * itemsize / run;
  pieces.reserve(static_cast<std::size_t>(runs));
  int64_t offset = 0;
  for (uint64_t r = 0; r < runs; ++r) {
    std::byte* start = data + offset;
    if (!pieces.empty() && pieces.back().data + pieces.back().nbytes == start) {
      pieces.back().nbytes += run;  // adjacent runs (e.g. a dimension of stride run * size)
    } else {
      pieces.push_back(Piece{start, run});
    }
    for (std::size_t dim = inner; dim-- > 0;) {
      offset += strides[dim];
      if (++index[dim] < shape[dim]) break;
      offset -= strides[dim] * shape[dim];
      index[dim] = 0;
    }
  }
  return pieces;
}

uint64_t pieces_nbytes(const Pieces& pieces) {
  uint64_t total = 0;
  for (const Piece& piece : pieces) total = checked_add(total, piece.nbytes, "a task's bytes");
  return total;
}

void append_stream_copy(std::vector<copy::Span>& out, const Pieces& src, uint64_t src_offset, const Pieces& dst,
                        uint64_t dst_offset, uint64_t nbytes) {
  if (nbytes == 0) return;
  const uint64_t src_total = pieces_nbytes(src), dst_total = pieces_nbytes(dst);
  TENSORXFER_CHECK(InvalidArgument, src_offset <= src_total && nbytes <= src_total - src_offset, "a copy of ", nbytes,
                   " bytes at offset ", src_offset, " runs past its source's ", src_total, " bytes");
  TENSORXFER_CHECK(InvalidArgument, dst_offset <= dst_total && nbytes <= dst_total - dst_offset, "a copy of ", nbytes,
                   " bytes at offset ", dst_offset, " runs past its destination's ", dst_total, " bytes");
  const auto src_starts = piece_starts(src), dst_starts = piece_starts(dst);
  auto [si, s_in] = locate(src_starts, src_offset);
  auto [di, d_in] = locate(dst_starts, dst_offset);
  while (nbytes > 0) {
    // Skip empty pieces (and land on the next piece at a piece's end).
    while (s_in == src[si].nbytes) ++si, s_in = 0;
    while (d_in == dst[di].nbytes) ++di, d_in = 0;
    const uint64_t step = std::min({nbytes, src[si].nbytes - s_in, dst[di].nbytes - d_in});
    copy::Span span{src[si].data + s_in, dst[di].data + d_in, static_cast<std::size_t>(step)};
    if (!out.empty() && out.back().src + out.back().nbytes == span.src &&
        out.back().dst + out.back().nbytes == span.dst) {
      out.back().nbytes += span.nbytes;  // both sides continue: one span
    } else {
      out.push_back(span);
    }
    s_in += step;
    d_in += step;
    nbytes -= step;
  }
}

void add_pipeline_steps(PersistentSteps& steps, const std::vector<IterationSchedule>& schedules,
                        const std::unordered_map<uint64_t, Pieces>& sends,
                        const std::unordered_map<uint64_t, Pieces>& receives, DoubleBuffers& buffers, int my_pe) {
  // The schedule's own checks, with each task as one region of its size (no byte is touched).
  auto as_regions = [](const std::unordered_map<uint64_t, Pieces>& tasks) {
    TaskMemoryMap map;
    for (const auto& [id, pieces] : tasks) map.emplace(id, TaskMemory{nullptr, pieces_nbytes(pieces)});
    return map;
  };
  check_pipeline_plan(schedules, as_regions(sends), as_regions(receives),
                      PlanBounds{my_pe, buffers.world_size(), buffers.slot_nbytes()});
  const std::size_t count = schedules.size();
  steps.pack.assign(count, {});
  steps.unpack.assign(count, {});
  for (std::size_t i = 0; i < count; ++i) {
    const int slot = static_cast<int>(i % 2);
    if (const auto& batch = schedules[i].send) {
      const Pieces slot_piece{Piece{buffers.peer_receive_slot(batch->dest_rank, slot), batch->total_nbytes}};
      for (const TaskSegment& segment : batch->segments) {
        append_stream_copy(steps.pack[i], sends.at(segment.task_id), segment.task_offset, slot_piece,
                           segment.slot_offset, segment.nbytes);
      }
    }
    if (const auto& batch = schedules[i].receive) {
      const Pieces slot_piece{Piece{buffers.receive_slot(slot), batch->total_nbytes}};
      for (const TaskSegment& segment : batch->segments) {
        append_stream_copy(steps.unpack[i], slot_piece, segment.slot_offset, receives.at(segment.task_id),
                           segment.task_offset, segment.nbytes);
        steps.bytes += segment.nbytes;
      }
    }
  }
}

}  // namespace tensorxfer::resharding
