// tensorxfer._core: the resharding schedule (tensorxfer/resharding/). The
// Python types live in tensorxfer.resharding.schedule; metadata crosses as
// int64 arrays of shape (n, 4) so 10,000 tasks cost one conversion, not 10,000.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bindings.h"
#include "views_pieces.h"
#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/process_memory.h"
#include "tensorxfer/copy/span_pack.h"
#include "tensorxfer/group/local_group.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/ipc_double_buffers.h"
#include "tensorxfer/resharding/pipeline_executor.h"
#include "tensorxfer/resharding/persistent_plan.h"
#include "tensorxfer/resharding/pipeline_plan.h"
#include "tensorxfer/resharding/task_matcher.h"
#include "tensorxfer/sync/peer_liveness.h"

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

// A batch from its Python form (src, dest, batch_index, iteration, total_nbytes, segments (n, 4)).
resharding::ScheduledBatch batch_from(const py::handle& item) {
  const auto fields = item.cast<py::tuple>();
  TENSORXFER_CHECK(InvalidArgument, fields.size() == 6, "a batch is (src, dest, batch_index, iteration, ",
                   "total_nbytes, segments), got ", fields.size(), " fields");
  resharding::ScheduledBatch batch;
  batch.src_rank = fields[0].cast<int32_t>();
  batch.dest_rank = fields[1].cast<int32_t>();
  batch.batch_index = fields[2].cast<uint32_t>();
  batch.iteration = fields[3].cast<uint32_t>();
  batch.total_nbytes = fields[4].cast<uint64_t>();
  const auto rows = fields[5].cast<U64Array>();
  TENSORXFER_CHECK(InvalidArgument, rows.ndim() == 2 && rows.shape(1) == 4,
                   "batch segments must have shape (n, 4) of (task_id, task_offset, nbytes, slot_offset)");
  const auto table = rows.unchecked<2>();
  for (py::ssize_t i = 0; i < rows.shape(0); ++i) {
    batch.segments.push_back(resharding::TaskSegment{table(i, 0), table(i, 1), table(i, 2), table(i, 3)});
  }
  return batch;
}

// task id -> (address, nbytes); the caller keeps the memory alive while the executor may use it.
resharding::TaskMemoryMap memory_map(const U64Array& ids, const U64Array& addresses, const U64Array& nbytes,
                                     const char* side) {
  TENSORXFER_CHECK(InvalidArgument, ids.ndim() == 1 && addresses.ndim() == 1 && nbytes.ndim() == 1 &&
                       ids.shape(0) == addresses.shape(0) && ids.shape(0) == nbytes.shape(0),
                   side, ": task ids, addresses and sizes must be 1-d arrays of one length");
  resharding::TaskMemoryMap map;
  map.reserve(static_cast<std::size_t>(ids.shape(0)));
  const auto id = ids.unchecked<1>();
  const auto address = addresses.unchecked<1>();
  const auto size = nbytes.unchecked<1>();
  for (py::ssize_t i = 0; i < ids.shape(0); ++i) {
    TENSORXFER_CHECK(InvalidArgument, address(i) != 0 || size(i) == 0, side, " task ", id(i), " has a null address");
    const bool fresh = map.emplace(id(i), resharding::TaskMemory{reinterpret_cast<std::byte*>(address(i)), size(i)})
                           .second;
    TENSORXFER_CHECK(InvalidArgument, fresh, side, " task ", id(i), " appears twice");
  }
  return map;
}

// Task id -> pieces of the op each (task id, op index) row names.
std::unordered_map<uint64_t, resharding::Pieces> pieces_by_task(const U64Array& rows,
                                                                const std::vector<resharding::Pieces>& views,
                                                                const char* side) {
  TENSORXFER_CHECK(InvalidArgument, rows.ndim() == 2 && rows.shape(1) == 2, side,
                   ": tasks must be (n, 2) rows of (task id, op index)");
  const auto table = rows.unchecked<2>();
  std::unordered_map<uint64_t, resharding::Pieces> map;
  for (py::ssize_t i = 0; i < rows.shape(0); ++i) {
    TENSORXFER_CHECK(InvalidArgument, table(i, 1) < views.size(), side, " task ", table(i, 0), ": op index ",
                     table(i, 1), " of ", views.size());
    TENSORXFER_CHECK(InvalidArgument, map.emplace(table(i, 0), views[table(i, 1)]).second, side, " task ",
                     table(i, 0), " appears twice");
  }
  return map;
}

// A persistent plan's copy lists (resharding/persistent_plan.h) and the Python
// objects whose memory they point into.
struct PyPersistentSteps {
  resharding::PersistentSteps steps;
  py::object keep_alive;
};

// This rank's part of a schedule, ready to execute.
struct PipelinePlan {
  std::vector<resharding::IterationSchedule> iterations;
  std::size_t batches = 0;
};

std::unique_ptr<PyPersistentSteps> make_persistent_steps(const std::optional<PipelinePlan>& plan, const U64Array& send_meta,
                                               const I64Array& send_dims, const U64Array& recv_meta,
                                               const I64Array& recv_dims, const U64Array& pipe_sends,
                                               const U64Array& pipe_recvs, const U64Array& local_pairs,
                                               const U64Array& direct, bool any_direct, bool any_remote,
                                               py::object keep_alive,
                                               resharding::DoubleBuffers* buffers, int my_pe) {
  auto result = std::make_unique<PyPersistentSteps>();
  result->keep_alive = std::move(keep_alive);
  const auto sends = views_pieces(send_meta, send_dims, "sends");
  const auto receives = views_pieces(recv_meta, recv_dims, "receives");
  TENSORXFER_CHECK(InvalidArgument, local_pairs.ndim() == 2 && local_pairs.shape(1) == 2,
                   "local_pairs must be (n, 2) rows of (send index, receive index)");
  TENSORXFER_CHECK(InvalidArgument, direct.ndim() == 2 && direct.shape(1) == 3,
                   "direct must be (n, 3) rows of (source address, receive index, nbytes)");
  auto& steps = result->steps;
  steps.any_direct = any_direct;
  steps.any_remote = any_remote;
  const auto pairs = local_pairs.unchecked<2>();
  for (py::ssize_t i = 0; i < local_pairs.shape(0); ++i) {
    TENSORXFER_CHECK(InvalidArgument, pairs(i, 0) < sends.size() && pairs(i, 1) < receives.size(), "local pair ", i,
                     " names op ", pairs(i, 0), " -> ", pairs(i, 1), " of ", sends.size(), " sends and ",
                     receives.size(), " receives");
    const auto& src = sends[pairs(i, 0)];
    const auto& dst = receives[pairs(i, 1)];
    const uint64_t nbytes = resharding::pieces_nbytes(src);
    TENSORXFER_CHECK_EQ(InvalidArgument, "a local pair's byte sizes", nbytes, resharding::pieces_nbytes(dst));
    resharding::append_stream_copy(steps.local, src, 0, dst, 0, nbytes);
    steps.bytes += nbytes;
  }
  const auto reads = direct.unchecked<2>();
  for (py::ssize_t i = 0; i < direct.shape(0); ++i) {
    TENSORXFER_CHECK(InvalidArgument, reads(i, 1) < receives.size(), "direct read ", i, " names receive ",
                     reads(i, 1), " of ", receives.size());
    const resharding::Pieces source{
        resharding::Piece{reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(reads(i, 0))), reads(i, 2)}};
    resharding::append_stream_copy(steps.direct, source, 0, receives[reads(i, 1)], 0, reads(i, 2));
    steps.bytes += reads(i, 2);
  }
  if (plan) {
    TENSORXFER_CHECK(InvalidArgument, buffers != nullptr, "a persistent plan with a pipeline needs an executor");
    resharding::add_pipeline_steps(steps, plan->iterations, pieces_by_task(pipe_sends, sends, "pipeline sends"),
                                   pieces_by_task(pipe_recvs, receives, "pipeline receives"), *buffers, my_pe);
  }
  return result;
}


// The executor plus the task memory its launched steps read, kept together so
// a launched pack never outlives the map it reads.
class PyPipelineExecutor {
 public:
  PyPipelineExecutor(collectives::IpcMemory& memory, group::LocalGroup& group, std::size_t slot_nbytes,
                     copy::CopyEngine& engine)
      : buffers_(memory, group, slot_nbytes), executor_(engine, buffers_, group.rank()) {}

  void set_task_memory(const U64Array& send_ids, const U64Array& send_addresses, const U64Array& send_nbytes,
                       const U64Array& recv_ids, const U64Array& recv_addresses, const U64Array& recv_nbytes) {
    auto sends = memory_map(send_ids, send_addresses, send_nbytes, "send");
    auto receives = memory_map(recv_ids, recv_addresses, recv_nbytes, "receive");
    py::gil_scoped_release release;
    executor_.synchronize_streams();  // nothing launched may still read the old maps
    sends_ = std::move(sends);
    receives_ = std::move(receives);
  }

  void execute(const PipelinePlan& plan, const PyTimeout& timeout, uint64_t operation) {
    buffers_.set_wait(wait_timeout(timeout, "PipelineExecutor.execute_pipeline"), python_signal_check());
    py::gil_scoped_release release;
    executor_.execute_pipeline(plan.iterations, sends_, receives_, operation);
  }

  void check(const PipelinePlan& plan) {
    py::gil_scoped_release release;
    executor_.check_plan(plan.iterations, sends_, receives_);
  }

  void launch(uint32_t iteration, const py::handle& batch, bool pack) {
    const auto native = batch_from(batch);
    py::gil_scoped_release release;
    if (pack) {
      executor_.launch_pack(iteration, native, sends_);
    } else {
      executor_.launch_unpack(iteration, native, receives_);
    }
  }

  void synchronize() {
    py::gil_scoped_release release;
    executor_.synchronize_streams();
  }

  std::unique_ptr<PyPersistentSteps> build_steps(const std::optional<PipelinePlan>& plan, const U64Array& send_meta,
                                                 const I64Array& send_dims, const U64Array& recv_meta,
                                                 const I64Array& recv_dims, const U64Array& pipe_sends,
                                                 const U64Array& pipe_recvs, const U64Array& local_pairs,
                                                 const U64Array& direct, bool any_direct, bool any_remote,
                                                 py::object keep_alive) {
    return make_persistent_steps(plan, send_meta, send_dims, recv_meta, recv_dims, pipe_sends, pipe_recvs,
                                 local_pairs, direct, any_direct, any_remote, std::move(keep_alive), &buffers_,
                                 executor_.my_pe());
  }

  void execute_steps(const PyPersistentSteps& steps, uint64_t plan_id, uint64_t version, uint64_t run,
                     const PyTimeout& timeout) {
    buffers_.set_wait(wait_timeout(timeout, "PersistentPlan.run"), python_signal_check());
    py::gil_scoped_release release;
    executor_.execute_steps(steps.steps, plan_id, version, run);
  }

 private:
  resharding::IpcDoubleBuffers buffers_;
  resharding::PipelineExecutor executor_;
  resharding::TaskMemoryMap sends_;
  resharding::TaskMemoryMap receives_;
};

}  // namespace

// The pieces of every tensor of one side: `meta` rows (address, itemsize, ndim), `dims`
// rows (size, stride in bytes), ndim of them per tensor in order.
std::vector<resharding::Pieces> views_pieces(const U64Array& meta, const I64Array& dims, const char* side) {
  TENSORXFER_CHECK(InvalidArgument, meta.ndim() == 2 && meta.shape(1) == 3 && dims.ndim() == 2 && dims.shape(1) == 2,
                   side, ": views must be (n, 3) rows of (address, itemsize, ndim) and (m, 2) rows of (size, stride)");
  const auto rows = meta.unchecked<2>();
  const auto sizes = dims.unchecked<2>();
  std::vector<resharding::Pieces> pieces(static_cast<std::size_t>(meta.shape(0)));
  py::ssize_t next = 0;
  for (py::ssize_t i = 0; i < meta.shape(0); ++i) {
    const auto ndim = static_cast<py::ssize_t>(rows(i, 2));
    TENSORXFER_CHECK(InvalidArgument, ndim >= 0 && ndim <= dims.shape(0) - next, side, " view ", i, ": ndim ", ndim,
                     " runs past the ", dims.shape(0), " dimension rows");
    std::vector<int64_t> shape, strides;
    for (py::ssize_t d = 0; d < ndim; ++d) {
      shape.push_back(sizes(next + d, 0));
      strides.push_back(sizes(next + d, 1));
    }
    next += ndim;
    auto* data = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(rows(i, 0)));
    pieces[static_cast<std::size_t>(i)] = resharding::strided_pieces(data, rows(i, 1), shape, strides);
  }
  return pieces;
}

void bind_submit_queue(py::module_& module);     // bind_submit_queue.cc
void bind_stream_messages(py::module_& module);  // bind_stream_messages.cc

void bind_resharding(py::module_& module) {
  bind_submit_queue(module);  // the copy services' submit path and tensor descriptions
  bind_stream_messages(module);  // persistent plans' streams between hosts

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

  py::class_<PipelinePlan>(module, "PipelinePlan", "One rank's iterations of a transfer schedule (native).")
      .def_static(
          "from_iterations",
          [](const py::list& iterations) {
            PipelinePlan plan;
            for (const auto& step : iterations) {
              const auto pair = step.cast<py::tuple>();
              TENSORXFER_CHECK(InvalidArgument, pair.size() == 2, "an iteration is (send batch or None, ",
                               "receive batch or None)");
              resharding::IterationSchedule schedule;
              if (!pair[0].is_none()) schedule.send = batch_from(pair[0]);
              if (!pair[1].is_none()) schedule.receive = batch_from(pair[1]);
              plan.batches += (schedule.send ? 1 : 0) + (schedule.receive ? 1 : 0);
              plan.iterations.push_back(std::move(schedule));
            }
            return plan;
          },
          py::arg("iterations"), "From [(send batch or None, receive batch or None), ...] per iteration.")
      .def_property_readonly("num_iterations", [](const PipelinePlan& plan) { return plan.iterations.size(); })
      .def_property_readonly("num_batches", [](const PipelinePlan& plan) { return plan.batches; });

  module.def(
      "plan_pipeline",
      [](const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& tasks, int world_size,
         uint64_t slot_nbytes, uint32_t max_tasks_per_batch, int my_pe) {
        const auto endpoints = endpoints_from(tasks, "tasks");
        PipelinePlan plan;
        py::gil_scoped_release release;
        const resharding::Schedule schedule = resharding::schedule_matched_tasks(
            endpoints, world_size, resharding::BatchLimits{slot_nbytes, max_tasks_per_batch});
        plan.iterations.resize(schedule.num_iterations);
        for (const auto& batch : schedule.batches) {
          if (batch.src_rank == my_pe) plan.iterations[batch.iteration].send = batch;
          if (batch.dest_rank == my_pe) plan.iterations[batch.iteration].receive = batch;
          plan.batches += (batch.src_rank == my_pe) + (batch.dest_rank == my_pe);
        }
        return plan;
      },
      py::arg("tasks"), py::arg("world_size"), py::arg("slot_nbytes"), py::arg("max_tasks_per_batch"),
      py::arg("my_pe"),
      "Rank my_pe's plan from already matched (task_id, nbytes, src_rank, dest_rank) rows, task ids strictly "
      "increasing (they are not matched again; every rank gets the same schedule).");

  py::class_<PyPersistentSteps>(module, "PersistentSteps", "A persistent plan's copy lists (native).")
      .def_property_readonly("bytes", [](const PyPersistentSteps& self) { return self.steps.bytes; })
      .def_property_readonly("num_iterations", [](const PyPersistentSteps& self) { return self.steps.pack.size(); })
      .def_property_readonly("num_spans", [](const PyPersistentSteps& self) {
        std::size_t spans = self.steps.local.size() + self.steps.direct.size();
        for (const auto& list : self.steps.pack) spans += list.size();
        for (const auto& list : self.steps.unpack) spans += list.size();
        return spans;
      })
      .def("copy_local", [](const PyPersistentSteps& self, copy::CopyEngine& engine) {
        py::gil_scoped_release release;
        copy::copy_spans(self.steps.local, &engine);
      }, py::arg("engine"), "Only the same-rank copies (a plan of one process), GIL released.");
  module.def(
      "build_local_steps",
      [](const U64Array& send_meta, const I64Array& send_dims, const U64Array& recv_meta, const I64Array& recv_dims,
         const U64Array& local_pairs, py::object keep_alive) {
        const U64Array none(std::vector<py::ssize_t>{0, 2});
        const U64Array no_direct(std::vector<py::ssize_t>{0, 3});
        return make_persistent_steps(std::nullopt, send_meta, send_dims, recv_meta, recv_dims, none, none,
                                     local_pairs, no_direct, false, false, std::move(keep_alive), nullptr, 0);
      },
      py::arg("send_meta"), py::arg("send_dims"), py::arg("recv_meta"), py::arg("recv_dims"), py::arg("local_pairs"),
      py::arg("keep_alive"), "The copy lists of a plan of same-rank pairs only (PipelineExecutor.build_steps' form).");
  py::class_<PyPipelineExecutor>(module, "PipelineExecutor",
                                 "Double-buffered pack/send/unpack over an IpcMemory (resharding/pipeline_executor.h).")
      .def(py::init<collectives::IpcMemory&, group::LocalGroup&, std::size_t, copy::CopyEngine&>(),
           py::arg("memory"), py::arg("group"), py::arg("slot_nbytes"), py::arg("engine"), py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>(), py::keep_alive<1, 5>())
      .def("set_task_memory", &PyPipelineExecutor::set_task_memory, py::arg("send_ids"), py::arg("send_addresses"),
           py::arg("send_nbytes"), py::arg("recv_ids"), py::arg("recv_addresses"), py::arg("recv_nbytes"),
           "Where each task's bytes live on this rank; the caller keeps that memory alive until the next call.")
      .def("check", &PyPipelineExecutor::check, py::arg("plan"),
           "The checks execute makes before anything moves, alone (ValueError naming the field).")
      .def("execute", &PyPipelineExecutor::execute, py::arg("plan"), py::arg("timeout") = py::none(),
           py::arg("operation") = 0,
           "Runs the plan (collective); raises TimeoutError / PeerLostError from its barriers. Its barriers "
           "carry `operation` (the same on every rank, a new one per run): a barrier completed by ranks of "
           "different operations raises TensorxferError ('ranks out of step').")
      .def(
          "launch_pack",
          [](PyPipelineExecutor& self, uint32_t iteration, const py::handle& batch) { self.launch(iteration, batch, true); },
          py::arg("iteration"), py::arg("batch"))
      .def(
          "launch_unpack",
          [](PyPipelineExecutor& self, uint32_t iteration, const py::handle& batch) {
            self.launch(iteration, batch, false);
          },
          py::arg("iteration"), py::arg("batch"))
      .def("synchronize", &PyPipelineExecutor::synchronize, "Waits for launched packs and unpacks.")
      .def("build_steps", &PyPipelineExecutor::build_steps, py::arg("plan"), py::arg("send_meta"), py::arg("send_dims"),
           py::arg("recv_meta"), py::arg("recv_dims"), py::arg("pipe_sends"), py::arg("pipe_recvs"),
           py::arg("local_pairs"), py::arg("direct"), py::arg("any_direct"), py::arg("any_remote"),
           py::arg("keep_alive"),
           "A persistent plan's copy lists (resharding/persistent_plan.h) from this rank's views (meta rows "
           "(address, itemsize, ndim), dims rows (size, stride in bytes)), its pipeline tasks ((task id, op index) "
           "rows), same-rank pairs ((send, receive) op indices) and direct reads ((source address, receive, "
           "nbytes)); `keep_alive` is held as long as the result.")
      .def("execute_steps", &PyPipelineExecutor::execute_steps, py::arg("steps"), py::arg("plan_id"),
           py::arg("version"), py::arg("run"), py::arg("timeout") = py::none(),
           "One run of a persistent plan (collective when any rank moves bytes between processes), GIL released; "
           "TimeoutError / PeerLostError from its barriers, TensorxferError when ranks run different plans or "
           "versions.");
  module.def("pipeline_region_nbytes", &resharding::IpcDoubleBuffers::region_nbytes, py::arg("slot_nbytes"));
  module.def(
      "check_pipeline_batch",
      [](const py::handle& batch, bool sending, const U64Array& ids, const U64Array& addresses,
         const U64Array& nbytes, int my_pe, int world_size, uint64_t slot_nbytes) {
        const auto native = batch_from(batch);
        const auto memory = memory_map(ids, addresses, nbytes, sending ? "send" : "receive");
        resharding::check_pipeline_batch(native, memory, sending, resharding::PlanBounds{my_pe, world_size, slot_nbytes});
      },
      py::arg("batch"), py::arg("sending"), py::arg("ids"), py::arg("addresses"), py::arg("nbytes"), py::arg("my_pe"),
      py::arg("world_size"), py::arg("slot_nbytes"),
      "check_pipeline_plan's checks of one batch, a send's (sending) or a receive's.");
  module.def(
      "check_pipeline_plan",
      [](const PipelinePlan& plan, const U64Array& send_ids, const U64Array& send_addresses,
         const U64Array& send_nbytes, const U64Array& recv_ids, const U64Array& recv_addresses,
         const U64Array& recv_nbytes, int my_pe, int world_size, uint64_t slot_nbytes) {
        const auto sends = memory_map(send_ids, send_addresses, send_nbytes, "send");
        const auto receives = memory_map(recv_ids, recv_addresses, recv_nbytes, "receive");
        py::gil_scoped_release release;
        resharding::check_pipeline_plan(plan.iterations, sends, receives,
                                        resharding::PlanBounds{my_pe, world_size, slot_nbytes});
      },
      py::arg("plan"), py::arg("send_ids"), py::arg("send_addresses"), py::arg("send_nbytes"), py::arg("recv_ids"),
      py::arg("recv_addresses"), py::arg("recv_nbytes"), py::arg("my_pe"), py::arg("world_size"),
      py::arg("slot_nbytes"),
      "The checks PipelineExecutor.check makes, without an executor (the CUDA executor's; ValueError naming the "
      "field).");

  module.def(
      "read_process_spans",
      [](int pid, const U64Array& spans, copy::CopyEngine& engine) {
        TENSORXFER_CHECK(InvalidArgument, spans.ndim() == 2 && spans.shape(1) == 3,
                         "spans: expected a uint64 array of shape (n, 3) = (remote address, local address, nbytes)");
        const uint64_t* rows = spans.data();
        std::vector<copy::RemotePiece> pieces(static_cast<std::size_t>(spans.shape(0)));
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          pieces[i] = {rows[3 * i], reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(rows[3 * i + 1])),
                       static_cast<std::size_t>(rows[3 * i + 2])};
        }
        py::gil_scoped_release release;
        copy::read_process_pieces(engine, pid, pieces);
      },
      py::arg("pid"), py::arg("spans"), py::arg("engine"),
      "For each row (remote address, local address, nbytes) of `spans`: copies nbytes at the remote address in "
      "process `pid` to the local address (process_vm_readv, many rows per call, the calls spread over the "
      "engine's threads).");
  module.def(
      "huge_page_bytes",
      [](const U64Array& addresses, const U64Array& nbytes) {
        TENSORXFER_CHECK(InvalidArgument, addresses.ndim() == 1 && nbytes.ndim() == 1 &&
                                              addresses.shape(0) == nbytes.shape(0),
                         "huge_page_bytes: expected two uint64 arrays of one dimension and the same length, got ",
                         addresses.ndim() == 1 ? addresses.shape(0) : -1, " addresses and ",
                         nbytes.ndim() == 1 ? nbytes.shape(0) : -1, " sizes");
        py::array_t<int64_t> result(addresses.shape(0));
        int64_t* out = result.mutable_data();
        const uint64_t* address = addresses.data();
        const uint64_t* size = nbytes.data();
        const py::ssize_t count = addresses.shape(0);
        {
          py::gil_scoped_release release;
          for (py::ssize_t i = 0; i < count; ++i) {
            out[i] = copy::huge_page_bytes(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(address[i])),
                                           static_cast<std::size_t>(size[i]));
          }
        }
        return result;
      },
      py::arg("addresses"), py::arg("nbytes"),
      "For each range [addresses[i], addresses[i] + nbytes[i]) of this process: the bytes huge pages back, -1 "
      "where the kernel cannot say (PAGEMAP_SCAN, Linux 6.7). Reads no memory.");
  module.def(
      "probe_process_memory",
      [](int pid, uint64_t address, const py::bytes& expected) {
        const std::string text = expected;
        py::gil_scoped_release release;
        return copy::probe_process_memory(pid, address, reinterpret_cast<const std::byte*>(text.data()), text.size());
      },
      py::arg("pid"), py::arg("address"), py::arg("expected"),
      "True if the bytes at `address` in `pid` can be read and equal `expected` (at most 4096 bytes).");
  module.def("allow_memory_readers", &copy::allow_memory_readers,
             "Lets this user's other processes read this one's memory under Yama ptrace_scope 1.");

  // The copy services' matching step (copy_services/planning/matching.py): the
  // matcher of the schedule, returning what is wrong instead of throwing, so the
  // caller names tasks by its own keys.
  module.def(
      "find_task_pairs",
      [](const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& sends,
         const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& receives) {
        const auto send_endpoints = endpoints_from(sends, "sends");
        const auto receive_endpoints = endpoints_from(receives, "receives");
        std::vector<std::pair<std::size_t, std::size_t>> pairs;
        resharding::MatchProblem problem;
        {
          py::gil_scoped_release release;
          problem = resharding::find_task_pairs(send_endpoints, receive_endpoints, pairs);
        }
        using Kind = resharding::MatchProblem::Kind;
        static const char* const kNames[] = {"",          "duplicate_send", "duplicate_receive", "missing_receive",
                                             "missing_send", "ranks_differ",  "sizes_differ"};
        py::array_t<int64_t> rows({static_cast<py::ssize_t>(pairs.size()), py::ssize_t{2}});
        auto table = rows.mutable_unchecked<2>();
        for (std::size_t i = 0; i < pairs.size(); ++i) {
          table(static_cast<py::ssize_t>(i), 0) = static_cast<int64_t>(pairs[i].first);
          table(static_cast<py::ssize_t>(i), 1) = static_cast<int64_t>(pairs[i].second);
        }
        static_assert(static_cast<int>(Kind::kSizesDiffer) == 6, "kNames follows MatchProblem::Kind");
        return py::make_tuple(kNames[static_cast<int>(problem.kind)], problem.send_index, problem.receive_index,
                              problem.other_index, rows);
      },
      py::arg("sends"), py::arg("receives"),
      "Pairs (task_id, nbytes, src_rank, dest_rank) rows by task_id: (problem, send_index, receive_index, "
      "other_index, pairs (n, 2) of (send row, receive row) in task_id order); problem is '' when they pair up, "
      "else the first of duplicate_send, duplicate_receive, missing_receive, missing_send, ranks_differ, "
      "sizes_differ (resharding/task_matcher.h).");

  // The copy services' liveness of peers without a LocalGroup (mpi, torch): the
  // sync layer's process identities (sync/peer_liveness.h).
  module.def(
      "current_process_identity",
      [] {
        const sync::ProcessIdentity identity = sync::current_process_identity();
        return py::make_tuple(identity.pid, identity.start_ticks);
      },
      "(pid, start_ticks) of this process: an identity a reused pid does not share.");
  module.def(
      "process_is_alive",
      [](int32_t pid, uint64_t start_ticks) {
        return sync::is_alive(sync::ProcessIdentity{pid, 0, start_ticks});
      },
      py::arg("pid"), py::arg("start_ticks"),
      "True while the process of that identity exists, has not exited and is the same process "
      "(pids are only meaningful within one pid namespace).");
}

}  // namespace tensorxfer::bindings
