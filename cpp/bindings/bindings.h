// Shared declarations of the binding files. Each bind_<layer>.cc registers
// one layer of the core on the module tensorxfer._core.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/typing.h>

#include <chrono>
#include <string>

#include "tensorxfer/common/tensor_view.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::bindings {

namespace py = pybind11;

// A core TensorView plus the Python object(s) that keep its memory alive.
// Exposed as tensorxfer._core.TensorView; binding functions that take tensors
// take `const PyTensorView&` and read `.view`; Python code builds these with
// tensorxfer._tensor.as_view (which calls _core.make_view).
struct PyTensorView {
  TensorView view;
  py::object owner;
};

// Turns a buffer-protocol or DLPack object into a view; `argument` names it in
// errors. Throws TypeMismatch for objects that are neither.
PyTensorView make_view(const py::handle& object, const std::string& argument);

// ---- waits (waits.cc) ----------------------------------------------------------
// Every binding that blocks releases the GIL and passes python_signal_check()
// as the wait's hook, and reads its `timeout` argument with wait_timeout().

// Call with the GIL held, before releasing it for a wait. Returns the hook for
// that wait: every kWatchSlice (sync/futex.h) it takes the GIL, runs
// PyErr_CheckSignals() and, if a handler raised (KeyboardInterrupt on Ctrl-C),
// throws py::error_already_set, which ends the wait with nothing claimed and
// reaches Python as that exception. Python runs signal handlers only in the
// main thread, so on any other thread the hook is empty (never takes the GIL).
sync::WaitHook python_signal_check();
// Its two halves, for a binding that composes its own hook (without a heap
// allocation per call): whether the calling thread (GIL held) is Python's main
// thread, and the check itself (takes the GIL; throws py::error_already_set).
bool python_signals_arrive_here();
void check_python_signals();

// The package-wide meaning of a wait's `timeout` (Python seconds):
//   None                  -> no deadline: kNoDeadline (the wait still watches
//                            peers and Ctrl-C);
//   a real number x >= 0  -> x seconds (0: try once; +inf or > ~292 years:
//                            kNoDeadline);
//   anything else         -> TypeMismatch (TypeError), NaN or x < 0 ->
//                            InvalidArgument (ValueError), both naming
//                            `operation`'s `timeout` and what it got.
inline constexpr std::chrono::nanoseconds kNoDeadline = std::chrono::nanoseconds::max();
// The parameter type of a binding's `timeout`: accepts any object (wait_timeout
// checks it) and reads `float | None` in the type stub.
using PyTimeout = py::typing::Optional<py::float_>;
std::chrono::nanoseconds wait_timeout(const py::handle& timeout, const std::string& operation);

void bind_waits(py::module_& module);  // tensorxfer._core.check_timeout (the same rules for Python waits)
void bind_common(py::module_& module);
void bind_memory(py::module_& module);
void bind_runtime(py::module_& module);
void bind_copy(py::module_& module);
void bind_ipc(py::module_& module);
void bind_group(py::module_& module);
void bind_collectives(py::module_& module);
void bind_reduce(py::module_& module);  // the reduction kernels alone (tests)
void bind_cuda(py::module_& module);
void bind_cuda_all_reduce(py::module_& module);  // tensorxfer._core.CudaAllReduce (builds with CUDA)
void bind_cuda_pipeline(py::module_& module);  // tensorxfer._core.cuda_copy_spans / cuda_put (builds with CUDA)
void bind_resharding(py::module_& module);

}  // namespace tensorxfer::bindings
