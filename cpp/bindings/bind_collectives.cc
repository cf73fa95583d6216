// tensorxfer._core: IpcMemory and Communicator (tensorxfer/collectives/).
// tensorxfer.runtime.ipc_memory / .collectives wrap these; the group exchange
// (all_gather of handles, barrier) happens in Python through the group object.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "tensorxfer/collectives/communicator.h"
#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::bindings {
namespace {

using collectives::Algorithm;
using collectives::Communicator;
using collectives::IpcMemory;
using collectives::MemoryDevice;

MemoryDevice device_argument(const std::string& device) {
  if (device == "cpu") return MemoryDevice::kHost;
  if (device == "cuda") return MemoryDevice::kCuda;
  throw InvalidArgument("IpcMemory: device must be 'cpu' or 'cuda', got '" + device + "'");
}

std::vector<std::uintptr_t> addresses(const std::vector<void*>& pointers) {
  std::vector<std::uintptr_t> out;
  out.reserve(pointers.size());
  for (void* pointer : pointers) out.push_back(reinterpret_cast<std::uintptr_t>(pointer));
  return out;
}

// Rank `rank`'s bytes [offset, offset + nbytes) as a uint8 numpy array that keeps `owner` alive.
py::array_t<uint8_t> region_array(std::byte* base, std::size_t nbytes, const py::object& owner) {
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(nbytes)}, {static_cast<py::ssize_t>(1)},
                              reinterpret_cast<uint8_t*>(base), owner);
}

void require_rank(int rank, int world, const char* operation) {
  TENSORXFER_CHECK(InvalidArgument, rank >= 0 && rank < world, operation, ": rank must be in [0, ", world,
                   "), got ", rank);
}

// A Communicator plus the Python callable (the group's check_peers) run, with
// the GIL, every wait slice after the Ctrl-C check.
class PyCommunicator {
 public:
  PyCommunicator(IpcMemory& memory, std::size_t max_bytes, std::size_t buffer_bytes, py::object peer_check,
                 std::optional<double> spin_us)
      : peer_check_(std::move(peer_check)) {
    const auto spin = spin_us ? std::chrono::nanoseconds(static_cast<int64_t>(*spin_us * 1000.0))
                              : std::chrono::nanoseconds(-1);
    native_ = std::make_unique<Communicator>(std::move(memory), max_bytes, buffer_bytes, std::function<void()>{},
                                             spin);
  }

  // Call with the GIL held (it looks at the calling thread). The hook fits
  // std::function's inline storage: no allocation per call.
  sync::WaitHook hook() const {
    const bool signals = python_signals_arrive_here();
    if (peer_check_.is_none()) return signals ? sync::WaitHook(&check_python_signals) : sync::WaitHook{};
    const PyCommunicator* self = this;  // outlives the call: the caller holds the Python object
    return [signals, self] {
      if (signals) check_python_signals();
      py::gil_scoped_acquire gil;
      self->peer_check_();
    };
  }

  Communicator& native() {
    TENSORXFER_CHECK(Closed, native_ != nullptr, "Communicator is closed");
    return *native_;
  }

 private:
  py::object peer_check_;
  std::unique_ptr<Communicator> native_;
};

// Runs `body` (a collective) with the GIL released.
template <typename Body>
void without_gil(Body&& body) {
  py::gil_scoped_release release;
  body();
}

}  // namespace

void bind_collectives(py::module_& module) {
  py::class_<IpcMemory>(module, "IpcMemory",
                        "Per-rank data regions and barrier words mapped by every rank (tensorxfer/collectives/ipc_memory.h).")
      .def_static(
          "create_local",
          [](int rank, int world_size, std::size_t nbytes, const std::string& device, int cuda_device) {
            const MemoryDevice memory_device = device_argument(device);
            py::gil_scoped_release released;  // cuda: cudaMalloc, cudaMemcpy, cudaDeviceSynchronize
            return IpcMemory::create_local(rank, world_size, nbytes, memory_device, cuda_device);
          },
          py::arg("rank"), py::arg("world_size"), py::arg("nbytes"), py::arg("device") = "cpu",
          py::arg("cuda_device") = -1,
          "Step 1: this rank's region (zeroed).")
      .def_property_readonly("local_handle", [](const IpcMemory& memory) { return py::bytes(memory.local_handle()); },
                             "What peers pass to map_peers (bytes).")
      .def(
          "map_peers",
          [](IpcMemory& memory, const std::vector<py::bytes>& handles) {
            std::vector<std::string> native;
            for (const auto& handle : handles) native.push_back(std::string(handle));
            py::gil_scoped_release released;  // cuda: cudaIpcOpenMemHandle, cudaMemcpy
            memory.map_peers(native);
          },
          py::arg("handles"), "Step 2: map every rank's region; handles in rank order.")
      .def("release_handles", &IpcMemory::release_handles, "Step 3, after a group barrier: unlink this rank's name.")
      .def_readonly("num_workers", &IpcMemory::num_workers)
      .def_readonly("worker_id", &IpcMemory::worker_id)
      .def_property_readonly("remote_data", [](const IpcMemory& memory) { return addresses(memory.remote_data); })
      .def_property_readonly("barrier_in", [](const IpcMemory& memory) { return addresses(memory.barrier_in); })
      .def_property_readonly("barrier_out", [](const IpcMemory& memory) { return addresses(memory.barrier_out); })
      .def_readonly("barrier_flag", &IpcMemory::barrier_flag)
      .def_property_readonly("nbytes", &IpcMemory::data_nbytes)
      .def_property_readonly("device", [](const IpcMemory& memory) {
        return memory.device() == MemoryDevice::kHost ? "cpu" : "cuda";
      })
      .def_property_readonly("closed", &IpcMemory::is_closed)
      .def_property_readonly("mapped", &IpcMemory::is_mapped)
      .def(
          "region",
          [](py::object self, int rank) {
            auto& memory = self.cast<IpcMemory&>();
            TENSORXFER_CHECK(Closed, !memory.is_closed(), "IpcMemory.region: IpcMemory is closed");
            TENSORXFER_CHECK(InvalidArgument, memory.is_mapped(), "IpcMemory.region: not mapped yet (map_peers)");
            TENSORXFER_CHECK(InvalidArgument, memory.device() == MemoryDevice::kHost,
                             "IpcMemory.region: a cuda region is not host memory; use remote_data addresses");
            require_rank(rank, memory.num_workers, "IpcMemory.region");
            return region_array(memory.data(rank), memory.data_nbytes(), self);
          },
          py::arg("rank"), "Rank `rank`'s data region as a uint8 numpy array (keeps the mapping alive).")
      .def("check_peers_alive", &IpcMemory::check_peers_alive)
      .def("close_peer_mappings", &IpcMemory::close_peer_mappings, py::call_guard<py::gil_scoped_release>())
      .def("close", &IpcMemory::close, py::call_guard<py::gil_scoped_release>());  // cuda: cudaFree

  module.def("communicator_required_nbytes", &Communicator::required_data_nbytes, py::arg("max_bytes"),
             py::arg("buffer_bytes"), py::arg("world_size"));
  module.def(
      "choose_all_reduce_algorithm",
      [](std::size_t nbytes, int world_size) {
        return collectives::algorithm_name(collectives::choose_algorithm(nbytes, world_size));
      },
      py::arg("nbytes"), py::arg("world_size"));

  py::class_<PyCommunicator>(module, "Communicator", "Collectives over an IpcMemory (tensorxfer/collectives/communicator.h).")
      .def(py::init<IpcMemory&, std::size_t, std::size_t, py::object, std::optional<double>>(), py::arg("memory"),
           py::arg("max_bytes"), py::arg("buffer_bytes"), py::arg("peer_check") = py::none(),
           py::arg("spin_us") = py::none(), "Takes over `memory` (which is left closed).")
      .def(
          "all_reduce",
          [](PyCommunicator& self, const py::handle& tensor, const std::string& op, const std::string& algorithm,
             const py::handle& timeout) {
            const PyTensorView view = make_view(tensor, "tensor");
            const auto reduce_op = collectives::parse_reduce_op(op);
            const auto chosen = collectives::parse_algorithm(algorithm);
            const auto wait = wait_timeout(timeout, "Communicator.all_reduce");
            Communicator& native = self.native();
            const sync::WaitHook hook = self.hook();
            without_gil([&] { native.all_reduce(view.view, reduce_op, chosen, wait, hook); });
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("algorithm") = "auto", py::arg("timeout") = py::none())
      .def(
          "all_gather",
          [](PyCommunicator& self, const py::handle& output, const py::handle& input, const py::handle& timeout) {
            const PyTensorView out = make_view(output, "output");
            const PyTensorView in = make_view(input, "input");
            const auto wait = wait_timeout(timeout, "Communicator.all_gather");
            Communicator& native = self.native();
            const sync::WaitHook hook = self.hook();
            without_gil([&] { native.all_gather(out.view, in.view, wait, hook); });
          },
          py::arg("output"), py::arg("input"), py::arg("timeout") = py::none())
      .def(
          "reduce_scatter",
          [](PyCommunicator& self, const py::handle& output, const py::handle& input, const std::string& op,
             const py::handle& timeout) {
            const PyTensorView out = make_view(output, "output");
            const PyTensorView in = make_view(input, "input");
            const auto reduce_op = collectives::parse_reduce_op(op);
            const auto wait = wait_timeout(timeout, "Communicator.reduce_scatter");
            Communicator& native = self.native();
            const sync::WaitHook hook = self.hook();
            without_gil([&] { native.reduce_scatter(out.view, in.view, reduce_op, wait, hook); });
          },
          py::arg("output"), py::arg("input"), py::arg("op") = "sum", py::arg("timeout") = py::none())
      .def(
          "broadcast",
          [](PyCommunicator& self, const py::handle& tensor, int src, const py::handle& timeout) {
            const PyTensorView view = make_view(tensor, "tensor");
            const auto wait = wait_timeout(timeout, "Communicator.broadcast");
            Communicator& native = self.native();
            const sync::WaitHook hook = self.hook();
            without_gil([&] { native.broadcast(view.view, src, wait, hook); });
          },
          py::arg("tensor"), py::arg("src"), py::arg("timeout") = py::none())
      .def(
          "barrier",
          [](PyCommunicator& self, const py::handle& timeout) {
            const auto wait = wait_timeout(timeout, "Communicator.barrier");
            Communicator& native = self.native();
            const sync::WaitHook hook = self.hook();
            without_gil([&] { native.barrier(wait, hook); });
          },
          py::arg("timeout") = py::none())
      .def(
          "buffer_array",
          [](py::object self, int rank) {
            Communicator& native = self.cast<PyCommunicator&>().native();
            TENSORXFER_CHECK(Closed, !native.is_closed(), "Communicator.buffer: Communicator is closed");
            require_rank(rank, native.world_size(), "Communicator.buffer");
            return region_array(native.buffer(rank), native.buffer_nbytes(), self);
          },
          py::arg("rank"), "Rank `rank`'s zero-copy buffer as a uint8 numpy array (keeps the mapping alive).")
      .def_property_readonly(
          "memory", [](PyCommunicator& self) -> IpcMemory& { return self.native().memory(); },
          py::return_value_policy::reference_internal)
      .def_property_readonly("rank", [](PyCommunicator& self) { return self.native().rank(); })
      .def_property_readonly("world_size", [](PyCommunicator& self) { return self.native().world_size(); })
      .def_property_readonly("max_bytes", [](PyCommunicator& self) { return self.native().max_bytes(); })
      .def_property_readonly("buffer_nbytes", [](PyCommunicator& self) { return self.native().buffer_nbytes(); })
      .def_property(
          "spin_us",
          [](PyCommunicator& self) {
            return std::chrono::duration<double, std::micro>(self.native().spin_budget()).count();
          },
          [](PyCommunicator& self, std::optional<double> spin_us) {
            self.native().set_spin_budget(spin_us ? std::chrono::nanoseconds(static_cast<int64_t>(*spin_us * 1000.0))
                                                  : std::chrono::nanoseconds(-1));
          },
          "The spin budget waits use now (us); set None for the standard policy, or a fixed budget.")
      .def_property_readonly("broken", [](PyCommunicator& self) { return self.native().is_broken(); })
      .def_property_readonly("closed", [](PyCommunicator& self) { return self.native().is_closed(); })
      .def("close", [](PyCommunicator& self) {
        Communicator& native = self.native();
        py::gil_scoped_release release;  // waits for a running operation
        native.close();
      });
}

}  // namespace tensorxfer::bindings
