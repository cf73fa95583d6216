// tensorxfer._core.LocalGroup: the group layer. The Python class
// tensorxfer.runtime.LocalGroup wraps it (argument types, handles, torch and
// MPI rendezvous); other bindings take the C++ object out of it with
// py::cast<group::LocalGroup&>(native). Blocking calls release the GIL.
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/local_group.h"
#include "tensorxfer/sync/futex.h"

namespace tensorxfer::bindings {
namespace {

using group::LocalGroup;

// A real test that a futex sleeper in one process is woken from another (the
// group's waits depend on it): a fork()ed child sleeps on a word in MAP_SHARED
// memory; the parent's FUTEX_WAKE must find it. Returns (works, detail).
std::pair<bool, std::string> probe_futex_across_processes() {
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return {false, std::string("mmap(MAP_SHARED) failed: ") + std::strerror(errno)};
  auto* word = static_cast<sync::SharedWord32*>(page);
  word->store(0, std::memory_order_relaxed);
  const pid_t child = ::fork();
  if (child < 0) {
    ::munmap(page, 4096);
    return {false, std::string("fork failed: ") + std::strerror(errno)};
  }
  if (child == 0) {
    // Only system calls in the child (the parent may have had other threads).
    int code = 1;
    try {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      // acquire: pairs with the parent's release store of 1.
      while (word->load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until) {
        (void)sync::futex_wait(*word, 0, std::chrono::milliseconds(100));
      }
      code = word->load(std::memory_order_acquire) == 1 ? 0 : 1;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int woken = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (woken == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    woken = sync::futex_wake(*word, 1);  // 1 only when the child sleeps on this word
  }
  word->store(1, std::memory_order_release);
  (void)sync::futex_wake_all(*word);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  ::munmap(page, 4096);
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (woken == 1 && child_ok) return {true, "a forked child sleeping on a shared futex was woken by its parent"};
  if (woken == 0) return {false, "FUTEX_WAKE never found the forked child sleeping on the shared word"};
  return {false, "the forked child did not see the wake (exit status " + std::to_string(status) + ")"};
}

}  // namespace

void bind_group(py::module_& module) {
  module.def(
      "probe_futex_across_processes",
      [] {
        py::gil_scoped_release release;
        return probe_futex_across_processes();
      },
      "(works, detail): whether a futex wake reaches a sleeper in another process (forks a child).");
  py::class_<LocalGroup>(module, "LocalGroup",
                         "Native LocalGroup (see tensorxfer.runtime.LocalGroup, which wraps it).")
      .def_static(
          "join",
          [](const std::string& name, int rank, int world_size, const PyTimeout& timeout) {
            const auto limit = wait_timeout(timeout, "LocalGroup.join");
            const sync::WaitHook hook = python_signal_check();
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
          [](LocalGroup& self, const PyTimeout& timeout) {
            const auto limit = wait_timeout(timeout, "LocalGroup.barrier");
            const sync::WaitHook hook = python_signal_check();
            py::gil_scoped_release release;
            self.barrier(limit, hook);
          },
          py::arg("timeout") = py::none())
      .def(
          "all_gather_bytes",
          [](LocalGroup& self, const py::bytes& data, const PyTimeout& timeout, uint64_t max_nbytes) {
            const auto limit = wait_timeout(timeout, "LocalGroup.all_gather_bytes");
            const sync::WaitHook hook = python_signal_check();
            // bytes are immutable and `data` keeps them alive: readable without the GIL.
            const std::string_view mine(PyBytes_AS_STRING(data.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(data.ptr())));
            std::vector<std::string> gathered;
            {
              py::gil_scoped_release release;
              gathered = self.all_gather_bytes(mine, limit, hook, max_nbytes);
            }
            py::list result;
            for (const std::string& bytes : gathered) result.append(py::bytes(bytes));
            return result;
          },
          py::arg("data"), py::arg("timeout") = py::none(),
          py::arg("max_nbytes") = LocalGroup::kDefaultMaxGatherBytes,
          "Every rank's bytes in rank order; a contribution above max_nbytes is refused on every rank.")
      .def_property_readonly_static("default_max_gather_nbytes",
                                    [](py::object) { return LocalGroup::kDefaultMaxGatherBytes; })
      .def("abandon", &LocalGroup::abandon,
           "Marks this rank as having given up its collectives: peers' waits end with PeerLostError.")
      .def("rank_alive", &LocalGroup::rank_alive, py::arg("rank"))
      .def("check_peers", &LocalGroup::check_peers)
      .def(
          "close",
          [](LocalGroup& self) {
            // A wait on another thread may need the GIL (its hook) to notice the close.
            py::gil_scoped_release release;
            self.close();
          },
          "Leaves the group; a wait on another thread ends with ClosedError first.");
}

}  // namespace tensorxfer::bindings
