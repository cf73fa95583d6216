// tensorxfer._core: the resharding schedule (tensorxfer/resharding/). The
// Python types live in tensorxfer.resharding.schedule; metadata crosses as
// int64 arrays of shape (n, 4) so 10,000 tasks cost one conversion, not 10,000.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/resharding/communication_scheduler.h"

namespace tensorxfer::bindings {
namespace {

using resharding::TaskEndpoint;

// Rows of (task_id, nbytes, src_rank, dest_rank).
std::vector<TaskEndpoint> endpoints_from(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& rows,
                                         const char* argument) {
  TENSORXFER_CHECK(InvalidArgument, rows.ndim() == 2 && rows.shape(1) == 4, argument,
                   " must have shape (n, 4) of (task_id, nbytes, src_rank, dest_rank), got ndim=", rows.ndim());
  const auto table = rows.unchecked<2>();
  std::vector<TaskEndpoint> endpoints(static_cast<std::size_t>(rows.shape(0)));
  for (py::ssize_t i = 0; i < rows.shape(0); ++i) {
    const int64_t task_id = table(i, 0), nbytes = table(i, 1), src = table(i, 2), dest = table(i, 3);
    TENSORXFER_CHECK(InvalidArgument, task_id >= 0 && nbytes >= 0, argument, " row ", i,
                     ": task_id and nbytes must be >= 0, got task_id=", task_id, " nbytes=", nbytes);
    TENSORXFER_CHECK(InvalidArgument, src >= 0 && src <= INT32_MAX && dest >= 0 && dest <= INT32_MAX, argument, " row ",
                     i, ": ranks must be >= 0, got ", src, " -> ", dest);
    endpoints[static_cast<std::size_t>(i)] = TaskEndpoint{static_cast<uint64_t>(task_id), static_cast<uint64_t>(nbytes),
                                                          static_cast<int32_t>(src), static_cast<int32_t>(dest)};
  }
  return endpoints;
}

// (task_id, task_offset, nbytes, slot_offset) rows of one batch.
py::array_t<uint64_t> segment_rows(const resharding::ScheduledBatch& batch) {
  py::array_t<uint64_t> rows({static_cast<py::ssize_t>(batch.segments.size()), py::ssize_t{4}});
  auto table = rows.mutable_unchecked<2>();
  for (std::size_t i = 0; i < batch.segments.size(); ++i) {
    const auto& segment = batch.segments[i];
    const auto row = static_cast<py::ssize_t>(i);
    table(row, 0) = segment.task_id;
    table(row, 1) = segment.task_offset;
    table(row, 2) = segment.nbytes;
    table(row, 3) = segment.slot_offset;
  }
  return rows;
}

}  // namespace

void bind_resharding(py::module_& module) {
  module.def(
      "build_transfer_schedule",
      [](const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& sends,
         const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& receives, int world_size,
         uint64_t slot_nbytes, uint32_t max_tasks_per_batch) {
        const auto send_endpoints = endpoints_from(sends, "sends");
        const auto receive_endpoints = endpoints_from(receives, "receives");
        resharding::Schedule schedule;
        {
          py::gil_scoped_release release;
          schedule = resharding::build_schedule(send_endpoints, receive_endpoints, world_size,
                                                resharding::BatchLimits{slot_nbytes, max_tasks_per_batch});
        }
        py::list batches;
        for (const auto& batch : schedule.batches) {
          batches.append(py::make_tuple(batch.src_rank, batch.dest_rank, batch.batch_index, batch.iteration,
                                        batch.total_nbytes, segment_rows(batch)));
        }
        return py::make_tuple(schedule.num_iterations, batches);
      },
      py::arg("sends"), py::arg("receives"), py::arg("world_size"), py::arg("slot_nbytes"),
      py::arg("max_tasks_per_batch"),
      "Schedule from all-gathered (task_id, nbytes, src_rank, dest_rank) rows: (num_iterations, "
      "[(src, dest, batch_index, iteration, total_nbytes, segments (n, 4) uint64), ...]).");
}

}  // namespace tensorxfer::bindings
