// Shared declarations of the binding files. Each bind_<layer>.cc registers
// one layer of the core on the module tensorxfer._core.
#pragma once

#include <pybind11/pybind11.h>

#include "tensorxfer/common/tensor_view.h"

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

void bind_common(py::module_& module);
void bind_memory(py::module_& module);
void bind_runtime(py::module_& module);
void bind_copy(py::module_& module);
void bind_ipc(py::module_& module);
void bind_collectives(py::module_& module);

}  // namespace tensorxfer::bindings
