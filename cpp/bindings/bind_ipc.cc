// tensorxfer._core: SharedSegment (raw shared memory for SharedArray) and
// SlotRing. The Python classes in tensorxfer.ipc wrap these; argument checks
// that need Python types (dtype, shape, handles) live there.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"
#include "tensorxfer/memory/shm_segment.h"

namespace tensorxfer::bindings {
namespace {

using ipc::SlotRing;
using memory::ShmSegment;

// A uint8 numpy array over `nbytes` at `data`; `owner` (the Python object of
// the core class that owns the mapping) stays alive as long as the array does.
py::array_t<uint8_t> byte_array(std::byte* data, std::size_t nbytes, const py::object& owner) {
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(nbytes)}, {static_cast<py::ssize_t>(1)},
                              reinterpret_cast<uint8_t*>(data), owner);
}

sync::SpinPolicy spin_from_us(const std::optional<double>& spin_us) {
  if (!spin_us) return sync::SpinPolicy::standard();
  TENSORXFER_CHECK(InvalidArgument, !std::isnan(*spin_us) && *spin_us >= 0.0, "spin_us must be None (standard) ",
                   "or a number of microseconds >= 0, got ", *spin_us);
  TENSORXFER_CHECK(InvalidArgument, *spin_us <= static_cast<double>(sync::SpinPolicy::kFixedMax.count()),
                   "spin_us must be at most ", sync::SpinPolicy::kFixedMax.count(), ", got ", *spin_us);
  return sync::SpinPolicy::fixed(std::chrono::microseconds(static_cast<int64_t>(std::llround(*spin_us))));
}

std::optional<double> spin_to_us(const sync::SpinPolicy& spin) {
  const auto fixed = spin.fixed_budget();
  if (!fixed) return std::nullopt;
  return static_cast<double>(fixed->count());
}

uint32_t kind_from_text(const std::string& kind) {
  TENSORXFER_CHECK(InvalidArgument, kind.size() == 4, "kind must be 4 characters, got '", kind, "'");
  char text[5] = {kind[0], kind[1], kind[2], kind[3], 0};
  return memory::make_kind_tag(text);
}

// The ring's wait policy: "standard" (spin milliseconds while the processes fit
// the CPUs, else yield briefly and sleep) or "fixed", and the spin budget it uses now.
py::dict wait_stats(const SlotRing& ring) {
  py::dict stats;
  stats["policy"] = ring.spin_policy().fixed_budget() ? "fixed" : "standard";
  stats["spin_us"] = std::chrono::duration<double, std::micro>(ring.spin_policy().budget()).count();
  return stats;
}

py::tuple ready_tuple(const ipc::ReadySlot& ready) { return py::make_tuple(ready.slot, ready.tick_id); }

// The int arguments of the calls on a hand-off's critical path. A plain int in
// range is taken here; anything else (a numpy integer, a bool, a float, an int
// out of range) goes to tensorxfer.ipc.slot_ring._check_int, which converts it
// or raises the TypeError / ValueError every tensorxfer check raises.
std::optional<uint64_t> plain_int_below(py::handle value, uint64_t high) {
  if (!PyLong_CheckExact(value.ptr())) return std::nullopt;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (number == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow != 0 || number < 0 || static_cast<unsigned long long>(number) >= high) return std::nullopt;
  return static_cast<uint64_t>(number);
}

uint64_t checked_in_python(py::handle value, const char* name, const py::object& high) {
  return py::module_::import("tensorxfer.ipc.slot_ring").attr("_check_int")(value, name, 0, high).cast<uint64_t>();
}

uint32_t slot_argument(const SlotRing& ring, py::handle slot) {
  if (const auto plain = plain_int_below(slot, ring.depth())) return static_cast<uint32_t>(*plain);
  return static_cast<uint32_t>(checked_in_python(slot, "slot", py::int_(ring.depth())));
}

// tick_id: any of the 2**64 values (those past 2**63 take the Python check).
uint64_t tick_argument(py::handle tick_id) {
  if (const auto plain = plain_int_below(tick_id, UINT64_MAX)) return *plain;
  return checked_in_python(tick_id, "tick_id", py::module_::import("tensorxfer.ipc.slot_ring").attr("_MAX_TICK_ID"));
}

}  // namespace

void bind_ipc(py::module_& module) {
  py::class_<ShmSegment>(module, "SharedSegment",
                         "A POSIX shared-memory segment with a validated header (tensorxfer/memory/shm_segment.h).")
      .def_static(
          "create",
          [](std::size_t nbytes, const std::string& kind) { return ShmSegment::create(nbytes, kind_from_text(kind)); },
          py::arg("nbytes"), py::arg("kind"), "Create a segment of `nbytes` zeroed payload bytes.")
      .def_static(
          "attach",
          [](const std::string& name, const std::string& kind) { return ShmSegment::attach(name, kind_from_text(kind)); },
          py::arg("name"), py::arg("kind"), "Map an existing segment, validating its header and kind.")
      .def_property_readonly("name", &ShmSegment::name)
      .def_property_readonly("nbytes", &ShmSegment::payload_nbytes)
      .def_property_readonly("is_creator", &ShmSegment::is_creator)
      .def_property_readonly("detached", &ShmSegment::is_detached)
      .def_property_readonly("attach_count", &ShmSegment::attach_count)
      .def_property_readonly("owner_pid", [](const ShmSegment& segment) { return segment.owner().pid; })
      .def_property_readonly("owner_alive", &ShmSegment::owner_alive)
      .def(
          "array",
          [](py::object self) {
            auto& segment = self.cast<ShmSegment&>();
            return byte_array(segment.payload(), segment.payload_nbytes(), self);
          },
          "The payload as a uint8 numpy array; keeps the mapping alive.")
      .def("detach", &ShmSegment::detach, "Drop this attachment (unlinks by the segment rules); memory stays mapped.");

  module.def("sweep_stale_segments", &memory::sweep_stale_segments,
             "Remove /dev/shm/tensorxfer-* segments whose creator has exited; returns how many.");

  py::class_<SlotRing>(module, "SlotRing", "A ring of shared slots (tensorxfer/ipc/slot_ring.h).")
      .def_static(
          "create",
          [](uint32_t depth, std::size_t slot_nbytes, std::optional<double> spin_us, uint32_t max_producers) {
            return SlotRing::create(depth, slot_nbytes, spin_from_us(spin_us), max_producers);
          },
          py::arg("depth"), py::arg("slot_nbytes"), py::arg("spin_us") = py::none(),
          py::arg("max_producers") = ipc::kDefaultRingProducers)
      .def_static(
          "attach",
          [](const std::string& name, std::optional<double> spin_us) {
            return SlotRing::attach(name, spin_from_us(spin_us));
          },
          py::arg("name"), py::arg("spin_us") = py::none())
      .def(
          "acquire_free",
          [](SlotRing& ring, const PyTimeout& timeout) {
            const auto wait = wait_timeout(timeout, "SlotRing.acquire_free");
            const sync::WaitHook hook = python_signal_check();
            py::gil_scoped_release release;
            return ring.acquire_free(wait, hook);
          },
          py::arg("timeout") = py::none())
      .def("try_acquire_free", &SlotRing::try_acquire_free)
      .def(
          "publish",
          [](SlotRing& ring, py::handle slot, py::handle tick_id) {
            const uint32_t checked_slot = slot_argument(ring, slot);  // checked first, as documented
            ring.publish(checked_slot, tick_argument(tick_id));
          },
          py::arg("slot"), py::arg("tick_id"), "slot in [0, depth), tick_id in [0, 2**64)")
      .def("abandon", &SlotRing::abandon, py::arg("slot"), "Hand a slot from acquire_free back unpublished.")
      .def(
          "acquire_ready",
          [](SlotRing& ring, const PyTimeout& timeout) {
            const auto wait = wait_timeout(timeout, "SlotRing.acquire_ready");
            const sync::WaitHook hook = python_signal_check();
            ipc::ReadySlot ready;
            {
              py::gil_scoped_release release;
              ready = ring.acquire_ready(wait, hook);
            }
            return ready_tuple(ready);
          },
          py::arg("timeout") = py::none(), "-> (slot, tick_id); its publish time: last_publish_ns")
      .def(
          "try_acquire_ready",
          [](SlotRing& ring) -> py::object {
            const auto ready = ring.try_acquire_ready();
            if (!ready) return py::none();
            return ready_tuple(*ready);
          },
          "-> (slot, tick_id) or None")
      .def("report_peer_lost", &SlotRing::report_peer_lost, py::arg("message"),
           "Consumer: the next acquire_ready raises PeerLostError(message) once, taking nothing.")
      .def_property_readonly("last_publish_ns", &SlotRing::last_publish_ns)
      .def(
          "release", [](SlotRing& ring, py::handle slot) { ring.release(slot_argument(ring, slot)); },
          py::arg("slot"))
      .def(
          "slot_array",
          [](py::object self, uint32_t slot) {
            auto& ring = self.cast<SlotRing&>();
            return byte_array(ring.slot_data(slot), ring.slot_nbytes(), self);
          },
          py::arg("slot"), "The slot's bytes as a uint8 numpy array; keeps the mapping alive.")
      .def_property_readonly("name", &SlotRing::name)
      .def_property_readonly("depth", &SlotRing::depth)
      .def_property_readonly("slot_nbytes", &SlotRing::slot_nbytes)
      .def_property_readonly("max_producers", &SlotRing::max_producers)
      .def_property_readonly("is_consumer", &SlotRing::is_consumer)
      .def_property_readonly("closed", &SlotRing::is_closed)
      .def_property_readonly("live_producers", &SlotRing::live_producers)
      .def_property_readonly("skipped_sequences", &SlotRing::skipped_sequences)
      .def_property(
          "spin_us", [](const SlotRing& ring) { return spin_to_us(ring.spin_policy()); },
          [](SlotRing& ring, std::optional<double> spin_us) { ring.set_spin_policy(spin_from_us(spin_us)); })
      .def_property_readonly("current_spin_us",
                             [](const SlotRing& ring) {
                               return std::chrono::duration<double, std::micro>(ring.spin_policy().budget()).count();
                             })
      .def_property_readonly("wait_stats", &wait_stats)
      .def("close", &SlotRing::close);
}

}  // namespace tensorxfer::bindings
