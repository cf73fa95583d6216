// What every blocking binding shares: the Ctrl-C hook and the timeout rules.
#include <Python.h>
#include <pthread.h>
#include <pythread.h>
#include <unistd.h>

#include <cmath>
#include <optional>

#include <pybind11/stl.h>

#include "bindings.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::bindings {
namespace {

// Whether the calling thread (holding the GIL) is the one Python runs signal
// handlers on. The main thread's ident is looked up once per process: a child
// forked from another thread has a different main thread, so fork() forgets it
// (an atfork handler; a getpid() per call cost a system call per wait).
bool main_thread_known = false;           // guarded by the GIL (and reset in a fork()ed child)
unsigned long main_thread_ident = 0;

bool on_python_main_thread() {
  if (!main_thread_known) {
    static const int registered = ::pthread_atfork(nullptr, nullptr, [] { main_thread_known = false; });
    (void)registered;
    py::object ident = py::module_::import("threading").attr("main_thread")().attr("ident");
    main_thread_ident = ident.is_none() ? 0 : ident.cast<unsigned long>();
    main_thread_known = true;
  }
  return PyThread_get_thread_ident() == main_thread_ident;
}

std::string describe(const py::handle& object) {
  return std::string(py::str(py::type::of(object).attr("__name__"))) + " " + std::string(py::repr(object));
}

bool is_real_number(const py::handle& object) {
  if (PyFloat_Check(object.ptr()) || PyLong_Check(object.ptr())) return true;
  static const auto* real = new py::object(py::module_::import("numbers").attr("Real"));  // never freed
  return py::isinstance(object, *real);
}

}  // namespace

bool python_signals_arrive_here() { return on_python_main_thread(); }

void check_python_signals() {
  py::gil_scoped_acquire gil;
  // A handler that raised (KeyboardInterrupt from the default SIGINT handler)
  // left the Python error set: carry it out of the wait.
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

sync::WaitHook python_signal_check() {
  if (!python_signals_arrive_here()) return {};
  return &check_python_signals;
}

std::chrono::nanoseconds wait_timeout(const py::handle& timeout, const std::string& operation) {
  if (timeout.is_none()) return kNoDeadline;
  if (PyBool_Check(timeout.ptr()) || !is_real_number(timeout)) {
    throw TypeMismatch(operation + ": timeout must be None (no deadline) or a number of seconds, got " +
                       describe(timeout));
  }
  const double seconds = PyFloat_AsDouble(timeout.ptr());
  if (seconds == -1.0 && PyErr_Occurred() != nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
    PyErr_Clear();  // an int beyond a double: only its sign matters
    const int positive = PyObject_RichCompareBool(timeout.ptr(), py::int_(0).ptr(), Py_GT);
    if (positive < 0) throw py::error_already_set();
    if (positive == 1) return kNoDeadline;
  } else if (!std::isnan(seconds) && seconds >= 0.0) {
    // Beyond what nanoseconds hold (~292 years) there is no deadline in practice.
    if (seconds >= 9.2e9) return kNoDeadline;
    return std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
  }
  throw InvalidArgument(operation + ": timeout must be None (no deadline) or a number of seconds >= 0, got " +
                        std::string(py::repr(timeout)));
}

void bind_waits(py::module_& module) {
  module.def(
      "check_timeout",
      [](const PyTimeout& timeout, const std::string& operation) -> std::optional<double> {
        const std::chrono::nanoseconds parsed = wait_timeout(timeout, operation);
        if (parsed == kNoDeadline) return std::nullopt;
        return std::chrono::duration<double>(parsed).count();
      },
      py::arg("timeout"), py::arg("operation"),
      "The package's timeout rules (see tensorxfer.errors): None (or +inf) -> None, meaning no "
      "deadline; a number of seconds >= 0 -> float seconds (0: try once). TypeError / ValueError "
      "naming `operation`'s timeout otherwise.");
}

}  // namespace tensorxfer::bindings
