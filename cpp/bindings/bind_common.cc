// Error translation, build information and tensor views.
#include <Python.h>

#include <cstring>

#include <pybind11/stl.h>

#include "bindings.h"
#include "tensorxfer/common/dlpack.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::bindings {
namespace {

// Raises the Python exception `name` defined in tensorxfer.errors.
void set_package_error(const char* name, const char* message) {
  py::object type = py::module_::import("tensorxfer.errors").attr(name);
  PyErr_SetString(type.ptr(), message);
}

void translate_exception(std::exception_ptr pending) {
  try {
    if (pending) std::rethrow_exception(pending);
  } catch (const CorruptSegment& error) {
    set_package_error("CorruptSegmentError", error.what());
  } catch (const InvalidArgument& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
  } catch (const TypeMismatch& error) {
    PyErr_SetString(PyExc_TypeError, error.what());
  } catch (const Timeout& error) {
    PyErr_SetString(PyExc_TimeoutError, error.what());
  } catch (const PeerLost& error) {
    set_package_error("PeerLostError", error.what());
  } catch (const SystemError& error) {
    py::tuple args = py::make_tuple(error.error_number(), error.what());
    PyErr_SetObject(PyExc_OSError, args.ptr());
  } catch (const Unsupported& error) {
    set_package_error("UnsupportedError", error.what());
  } catch (const Error& error) {
    set_package_error("TensorxferError", error.what());
  }
}

// numpy / PEP 3118 format characters, with the item size deciding C integer widths.
DLDataType dtype_from_buffer_format(const std::string& format, py::ssize_t itemsize,
                                    const std::string& argument) {
  std::string code = format;
  if (!code.empty() && std::strchr("@=<>!", code[0]) != nullptr) {
    if (code[0] == '>' || code[0] == '!') {
      throw TypeMismatch(argument + ": big-endian buffers are not supported (format '" + format + "')");
    }
    code = code.substr(1);
  }
  const auto bits = static_cast<uint8_t>(itemsize * 8);
  if (code == "?") return {kDtypeCodeBool, 8, 1};
  if (code == "e" || code == "f" || code == "d") return {kDLFloat, bits, 1};
  if (code == "Zf" || code == "Zd") return {kDLComplex, bits, 1};
  if (code.size() == 1 && std::strchr("bhilq", code[0]) != nullptr) return {kDLInt, bits, 1};
  if (code.size() == 1 && std::strchr("BHILQc", code[0]) != nullptr) return {kDLUInt, bits, 1};
  throw TypeMismatch(argument + ": unsupported buffer format '" + format + "' (itemsize " +
                     std::to_string(itemsize) + ")");
}

PyTensorView view_from_buffer(const py::handle& object, const std::string& argument) {
  Py_buffer buffer;
  bool readonly = false;
  if (PyObject_GetBuffer(object.ptr(), &buffer, PyBUF_RECORDS) != 0) {
    PyErr_Clear();
    if (PyObject_GetBuffer(object.ptr(), &buffer, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    readonly = true;
  }
  PyTensorView result;
  try {
    TensorView& view = result.view;
    view.data = buffer.buf;
    view.readonly = readonly || buffer.readonly;
    view.dtype = dtype_from_buffer_format(buffer.format ? buffer.format : "B", buffer.itemsize, argument);
    for (int i = 0; i < buffer.ndim; ++i) {
      view.shape.push_back(buffer.shape[i]);
      if (buffer.strides[i] % buffer.itemsize != 0) {
        throw InvalidArgument(argument + ": stride " + std::to_string(buffer.strides[i]) +
                              " bytes is not a multiple of the item size " +
                              std::to_string(buffer.itemsize));
      }
      view.strides.push_back(buffer.strides[i] / buffer.itemsize);
    }
  } catch (...) {
    PyBuffer_Release(&buffer);
    throw;
  }
  PyBuffer_Release(&buffer);
  result.owner = py::reinterpret_borrow<py::object>(object);
  return result;
}

PyTensorView view_from_dlpack(const py::handle& object, const std::string& argument) {
  py::object capsule = object.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& tensor = managed->dl_tensor;
  PyTensorView result;
  TensorView& view = result.view;
  view.data = static_cast<char*>(tensor.data) + tensor.byte_offset;
  view.dtype = tensor.dtype;
  view.device = tensor.device;
  view.shape.assign(tensor.shape, tensor.shape + tensor.ndim);
  if (tensor.strides != nullptr) {
    view.strides.assign(tensor.strides, tensor.strides + tensor.ndim);
  } else {
    view.strides.assign(tensor.ndim, 1);
    for (int i = tensor.ndim - 1; i > 0; --i) view.strides[i - 1] = view.strides[i] * tensor.shape[i];
  }
  // The capsule's destructor calls the producer's deleter once the view is gone.
  result.owner = py::make_tuple(py::reinterpret_borrow<py::object>(object), capsule);
  return result;
}

}  // namespace

PyTensorView make_view(const py::handle& object, const std::string& argument) {
  if (py::isinstance<PyTensorView>(object)) return object.cast<PyTensorView>();
  if (PyObject_CheckBuffer(object.ptr())) return view_from_buffer(object, argument);
  if (py::hasattr(object, "__dlpack__")) return view_from_dlpack(object, argument);
  throw TypeMismatch(argument + ": expected a numpy array, torch tensor, or an object with "
                     "__dlpack__ or the buffer protocol, got " +
                     std::string(py::str(py::type::of(object).attr("__name__"))));
}

void bind_common(py::module_& module) {
  py::register_exception_translator(&translate_exception);

  py::dict build;
  build["version"] = TENSORXFER_VERSION;
#ifdef TENSORXFER_WITH_CUDA
  build["cuda"] = true;
#else
  build["cuda"] = false;
#endif
#ifdef TENSORXFER_WITH_NUMA
  build["numa"] = true;
#else
  build["numa"] = false;
#endif
  module.attr("build_info") = build;

  py::class_<PyTensorView>(module, "TensorView",
                           "A non-owning view of a tensor's memory that keeps its owner alive.")
      .def_property_readonly("data_ptr", [](const PyTensorView& v) {
        return reinterpret_cast<std::uintptr_t>(v.view.data);
      })
      .def_property_readonly("nbytes", [](const PyTensorView& v) { return v.view.nbytes(); })
      .def_property_readonly("dtype", [](const PyTensorView& v) { return dtype_name(v.view.dtype); })
      .def_property_readonly("shape", [](const PyTensorView& v) { return py::tuple(py::cast(v.view.shape)); })
      .def_property_readonly("strides", [](const PyTensorView& v) { return py::tuple(py::cast(v.view.strides)); })
      .def_property_readonly("device", [](const PyTensorView& v) { return device_name(v.view.device); })
      .def_property_readonly("readonly", [](const PyTensorView& v) { return v.view.readonly; })
      .def_property_readonly("is_contiguous", [](const PyTensorView& v) { return v.view.is_contiguous(); })
      .def_property_readonly("is_host", [](const PyTensorView& v) { return v.view.is_host(); })
      .def_readonly("owner", &PyTensorView::owner)
      .def("describe", [](const PyTensorView& v) { return v.view.describe(); })
      .def("__repr__", [](const PyTensorView& v) { return "TensorView(" + v.view.describe() + ")"; });

  module.def("make_view", &make_view, py::arg("obj"), py::arg("argument"),
             "View a buffer-protocol or DLPack object; `argument` names it in errors.");
  module.def(
      "require_contiguous_host",
      [](const PyTensorView& v, const std::string& argument) {
        require_contiguous_host(v.view, argument.c_str());
      },
      py::arg("view"), py::arg("argument"));
}

}  // namespace tensorxfer::bindings
