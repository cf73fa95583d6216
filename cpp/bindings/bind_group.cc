// tensorxfer._core.LocalGroup: the group layer. The Python class
// tensorxfer.runtime.LocalGroup wraps it (argument types, handles, torch and
// MPI rendezvous); other bindings take the C++ object out of it with
// py::cast<group::LocalGroup&>(native). Blocking calls release the GIL.
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::bindings {
namespace {

using group::LocalGroup;

std::chrono::nanoseconds group_timeout(const std::optional<double>& seconds, const char* operation) {
  if (!seconds) return std::chrono::nanoseconds::max();
  TENSORXFER_CHECK(InvalidArgument, !std::isnan(*seconds) && *seconds >= 0.0, operation,
                   ": timeout must be None or a number of seconds >= 0, got ", *seconds);
  if (std::isinf(*seconds) || *seconds > 1e9) return std::chrono::nanoseconds::max();
  return std::chrono::nanoseconds(static_cast<int64_t>(*seconds * 1e9));
}

// The per-wait check of every group wait. Empty until the shared Ctrl-C hook
// (bindings.h) lands on main; then this is the one line to change.
sync::WaitHook group_wait_hook() { return {}; }

}  // namespace

void bind_group(py::module_& module) {
  py::class_<LocalGroup>(module, "LocalGroup",
                         "Native LocalGroup (see tensorxfer.runtime.LocalGroup, which wraps it).")
      .def_static(
          "join",
          [](const std::string& name, int rank, int world_size, std::optional<double> timeout) {
            const auto limit = group_timeout(timeout, "LocalGroup.join");
            const auto hook = group_wait_hook();
            py::gil_scoped_release release;
            return LocalGroup::join(name, rank, world_size, limit, hook);
          },
          py::arg("name"), py::arg("rank"), py::arg("world_size"), py::arg("timeout") = py::none())
      .def_property_readonly_static("mailbox_nbytes", [](py::object) { return LocalGroup::kMailboxBytes; })
      .def_property_readonly_static("max_name_nbytes", [](py::object) { return LocalGroup::kMaxNameBytes; })
      .def_property_readonly_static("max_world_size", [](py::object) { return LocalGroup::kMaxWorldSize; })
      .def_property_readonly("rank", &LocalGroup::rank)
      .def_property_readonly("world_size", &LocalGroup::world_size)
      .def_property_readonly("name", &LocalGroup::name)
      .def_property_readonly("closed", &LocalGroup::closed)
      .def(
          "barrier",
          [](LocalGroup& self, std::optional<double> timeout) {
            const auto limit = group_timeout(timeout, "LocalGroup.barrier");
            const auto hook = group_wait_hook();
            py::gil_scoped_release release;
            self.barrier(limit, hook);
          },
          py::arg("timeout") = py::none())
      .def(
          "all_gather_bytes",
          [](LocalGroup& self, const py::bytes& data, std::optional<double> timeout) {
            const auto limit = group_timeout(timeout, "LocalGroup.all_gather_bytes");
            const auto hook = group_wait_hook();
            // bytes are immutable and `data` keeps them alive: readable without the GIL.
            const std::string_view mine(PyBytes_AS_STRING(data.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(data.ptr())));
            std::vector<std::string> gathered;
            {
              py::gil_scoped_release release;
              gathered = self.all_gather_bytes(mine, limit, hook);
            }
            py::list result;
            for (const std::string& bytes : gathered) result.append(py::bytes(bytes));
            return result;
          },
          py::arg("data"), py::arg("timeout") = py::none())
      .def("rank_alive", &LocalGroup::rank_alive, py::arg("rank"))
      .def("check_peers", &LocalGroup::check_peers)
      .def("close", &LocalGroup::close);
}

}  // namespace tensorxfer::bindings
