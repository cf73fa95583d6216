// Error translation, build information and tensor views.
#include <Python.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/cpu_features.h"
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
  } catch (const Closed& error) {
    set_package_error("ClosedError", error.what());
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

// A buffer export held for as long as native code may use the memory: while
// it is held the exporter keeps the memory where it is (a bytearray refuses to
// resize with BufferError, an mmap refuses to close), and it holds a reference
// to the exporter itself. Released (with the GIL) when the capsule owning it dies.
void release_buffer_export(void* pointer) {
  auto* buffer = static_cast<Py_buffer*>(pointer);
  PyBuffer_Release(buffer);
  delete buffer;
}

PyTensorView view_from_buffer(const py::handle& object, const std::string& argument) {
  auto buffer = std::make_unique<Py_buffer>();
  bool readonly = false;
  if (PyObject_GetBuffer(object.ptr(), buffer.get(), PyBUF_RECORDS) != 0) {
    PyErr_Clear();
    if (PyObject_GetBuffer(object.ptr(), buffer.get(), PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    readonly = true;
  }
  Py_buffer* exported = buffer.get();
  // From here the capsule owns the export: any throw below releases it.
  py::capsule holder(buffer.release(), &release_buffer_export);
  PyTensorView result;
  TensorView& view = result.view;
  view.data = exported->buf;
  view.readonly = readonly || exported->readonly;
  view.dtype = dtype_from_buffer_format(exported->format ? exported->format : "B", exported->itemsize, argument);
  for (int i = 0; i < exported->ndim; ++i) {
    view.shape.push_back(exported->shape[i]);
    if (exported->strides[i] % exported->itemsize != 0) {
      throw InvalidArgument(argument + ": stride " + std::to_string(exported->strides[i]) +
                            " bytes is not a multiple of the item size " +
                            std::to_string(exported->itemsize));
    }
    view.strides.push_back(exported->strides[i] / exported->itemsize);
  }
  require_valid_sizes(view, argument);
  result.owner = std::move(holder);
  return result;
}

// tensorxfer/common/dlpack.h always declares the DLPack 1.0 exchange types
// (the system header when it is that new, the project's own declaration otherwise).
using VersionedManagedTensor = DLManagedTensorVersioned;
constexpr uint64_t kDlpackReadOnlyFlag = DLPACK_FLAG_BITMASK_READ_ONLY;

constexpr uint32_t kDlpackMajorVersion = 1;

template <typename Managed>
void delete_managed_tensor(void* pointer) {
  auto* managed = static_cast<Managed*>(pointer);
  if (managed->deleter != nullptr) managed->deleter(managed);
}

// Asks for the versioned protocol (DLPack >= 1.0: read-only flag); a producer
// that does not know `max_version` gets the legacy call.
py::object dlpack_capsule(const py::handle& object) {
  try {
    return object.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(kDlpackMajorVersion, 0));
  } catch (py::error_already_set& error) {
    if (!error.matches(PyExc_TypeError)) throw;
  }
  return object.attr("__dlpack__")();
}

PyTensorView view_from_dlpack(const py::handle& object, const std::string& argument) {
  py::object capsule = dlpack_capsule(object);
  const DLTensor* tensor = nullptr;
  bool readonly = false;
  py::capsule holder;
  // The consumer owns a consumed tensor: `holder` calls the producer's deleter
  // once the view is gone, and the producer's capsule is renamed "used_..." so
  // it does not call it too.
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    auto* managed = static_cast<VersionedManagedTensor*>(
        PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    if (managed->version.major != kDlpackMajorVersion) {
      // Not consumed: the producer's capsule frees it.
      throw TypeMismatch(argument + ": DLPack version " + std::to_string(managed->version.major) + "." +
                         std::to_string(managed->version.minor) + " is not supported (expected " +
                         std::to_string(kDlpackMajorVersion) + ".x)");
    }
    holder = py::capsule(managed, &delete_managed_tensor<VersionedManagedTensor>);
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor_versioned") != 0) throw py::error_already_set();
    tensor = &managed->dl_tensor;
    readonly = (managed->flags & kDlpackReadOnlyFlag) != 0;
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    holder = py::capsule(managed, &delete_managed_tensor<DLManagedTensor>);
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    tensor = &managed->dl_tensor;
  } else {
    throw TypeMismatch(argument + ": __dlpack__ returned " +
                       std::string(py::str(py::type::of(capsule).attr("__name__"))) +
                       ", expected a capsule named 'dltensor_versioned' or 'dltensor'");
  }
  PyTensorView result;
  TensorView& view = result.view;
  view.data = static_cast<char*>(tensor->data) + tensor->byte_offset;
  view.readonly = readonly;
  view.dtype = tensor->dtype;
  view.device = tensor->device;
  TENSORXFER_CHECK(InvalidArgument, tensor->ndim >= 0, argument, ": DLPack ndim ", tensor->ndim, " < 0");
  view.shape.assign(tensor->shape, tensor->shape + tensor->ndim);
  if (tensor->strides != nullptr) {
    view.strides.assign(tensor->strides, tensor->strides + tensor->ndim);
  } else {
    // Compact row-major: each stride is the product of the extents after it.
    view.strides.assign(tensor->ndim, 1);
    for (int i = tensor->ndim - 1; i > 0; --i) {
      TENSORXFER_CHECK(InvalidArgument,
                       !__builtin_mul_overflow(view.strides[i], std::max<int64_t>(1, view.shape[i]),
                                               &view.strides[i - 1]),
                       argument, ": DLPack shape ", view.shape.size(), "-d extents overflow int64 strides");
    }
  }
  require_valid_sizes(view, argument);
  // Keeps the producer object alive too (some producers tie the memory to it).
  result.owner = py::make_tuple(py::reinterpret_borrow<py::object>(object), std::move(holder));
  return result;
}

// torch.Tensor fast path: a plain CPU tensor (exactly torch.Tensor, no grad, no
// lazy negation, a dtype below) is read from its attributes, without the DLPack
// capsule round trip (~2 us per call). Anything else takes the DLPack path, which
// also gives the errors. The tensor itself is the owner of its memory.
struct TorchTypes {
  PyObject* tensor_type;
  std::vector<std::pair<PyObject*, DLDataType>> dtypes;
  // Interned attribute names.
  PyObject* requires_grad;
  PyObject* is_cpu;
  PyObject* dtype;
  PyObject* is_neg;
  PyObject* data_ptr;
  PyObject* shape;
  PyObject* stride;
};

// Filled once torch is imported (looked up in sys.modules, never imported here);
// the references are kept for the life of the process.
const TorchTypes* torch_types() {
  static const TorchTypes* cached = nullptr;
  if (cached != nullptr) return cached;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
  if (torch == nullptr || !py::hasattr(torch, "Tensor") || !py::hasattr(torch, "bfloat16")) return nullptr;
  auto* types = new TorchTypes;
  py::handle module(torch);
  types->tensor_type = py::object(module.attr("Tensor")).release().ptr();
  const std::pair<const char*, DLDataType> names[] = {
      {"float32", {kDLFloat, 32, 1}}, {"float64", {kDLFloat, 64, 1}}, {"float16", {kDLFloat, 16, 1}},
      {"bfloat16", {kDLBfloat, 16, 1}}, {"int8", {kDLInt, 8, 1}},   {"int16", {kDLInt, 16, 1}},
      {"int32", {kDLInt, 32, 1}},       {"int64", {kDLInt, 64, 1}}, {"uint8", {kDLUInt, 8, 1}},
      {"bool", {kDtypeCodeBool, 8, 1}}};
  for (const auto& [name, dtype] : names) {
    types->dtypes.emplace_back(py::object(module.attr(name)).release().ptr(), dtype);
  }
  types->requires_grad = PyUnicode_InternFromString("requires_grad");
  types->is_cpu = PyUnicode_InternFromString("is_cpu");
  types->dtype = PyUnicode_InternFromString("dtype");
  types->is_neg = PyUnicode_InternFromString("is_neg");
  types->data_ptr = PyUnicode_InternFromString("data_ptr");
  types->shape = PyUnicode_InternFromString("shape");
  types->stride = PyUnicode_InternFromString("stride");
  cached = types;
  return cached;
}

// `object.name` (call: `object.name()`) is True; Python errors propagate.
bool attribute_is_true(PyObject* object, PyObject* name, bool call) {
  py::object value = py::reinterpret_steal<py::object>(call ? PyObject_CallMethodNoArgs(object, name)
                                                            : PyObject_GetAttr(object, name));
  if (!value) throw py::error_already_set();
  return value.ptr() == Py_True;
}

std::vector<int64_t> int_tuple(PyObject* object, PyObject* name, bool call) {
  py::object value = py::reinterpret_steal<py::object>(call ? PyObject_CallMethodNoArgs(object, name)
                                                            : PyObject_GetAttr(object, name));
  if (!value || !PyTuple_Check(value.ptr())) throw py::error_already_set();
  const Py_ssize_t size = PyTuple_GET_SIZE(value.ptr());
  std::vector<int64_t> items(static_cast<std::size_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    items[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(value.ptr(), i));
    if (items[i] == -1 && PyErr_Occurred()) throw py::error_already_set();
  }
  return items;
}

bool view_from_torch(const py::handle& handle, const std::string& argument, PyTensorView& result) {
  const TorchTypes* torch = torch_types();
  PyObject* object = handle.ptr();
  if (torch == nullptr || Py_TYPE(object) != reinterpret_cast<PyTypeObject*>(torch->tensor_type)) return false;
  if (attribute_is_true(object, torch->requires_grad, false) || !attribute_is_true(object, torch->is_cpu, false)) {
    return false;
  }
  const py::object dtype = py::reinterpret_steal<py::object>(PyObject_GetAttr(object, torch->dtype));
  if (!dtype) throw py::error_already_set();
  const auto match = std::find_if(torch->dtypes.begin(), torch->dtypes.end(),
                                  [&](const auto& entry) { return entry.first == dtype.ptr(); });
  if (match == torch->dtypes.end() || attribute_is_true(object, torch->is_neg, true)) return false;
  const py::object data = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(object, torch->data_ptr));
  if (!data) throw py::error_already_set();
  TensorView& view = result.view;
  view.data = PyLong_AsVoidPtr(data.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  view.dtype = match->second;
  view.device = DLDevice{kDLCPU, 0};
  view.shape = int_tuple(object, torch->shape, false);
  view.strides = int_tuple(object, torch->stride, true);
  require_valid_sizes(view, argument);
  result.owner = py::reinterpret_borrow<py::object>(handle);
  return true;
}

// numpy.ndarray fast path: an exact ndarray of a plain little-endian bool,
// integer, float or complex dtype is read from its fields (pybind11's mirror of
// numpy's structs), without a buffer export (its format string and Py_buffer
// cost ~0.3 us per call). Anything else takes the buffer path, which also gives
// the errors. The array is the owner: it keeps its memory (or its base) alive.
// A buffer export would not pin it more: numpy lets resize(refcheck=False) move
// an exported array too.
bool view_from_numpy(const py::handle& handle, PyTensorView& result) {
  static PyTypeObject* ndarray_type = nullptr;  // guarded by the GIL; kept for the process
  PyObject* object = handle.ptr();
  if (ndarray_type == nullptr) {
    // Only once numpy is imported (never import it here).
    if (PyDict_GetItemString(PyImport_GetModuleDict(), "numpy") == nullptr) return false;
    ndarray_type = py::detail::npy_api::get().PyArray_Type_;
  }
  if (Py_TYPE(object) != ndarray_type) return false;
  const auto* array = py::detail::array_proxy(object);
  const auto descr = py::reinterpret_borrow<py::dtype>(array->descr);
  const char kind = descr.kind();
  const char byteorder = descr.byteorder();
  const auto itemsize = static_cast<int64_t>(descr.itemsize());
  const auto bits = static_cast<uint8_t>(itemsize * 8);
  const bool native_order = byteorder == '=' || byteorder == '<' || byteorder == '|';
  DLDataType dtype{};
  bool plain = false;
  switch (kind) {
    case 'b': dtype = {kDtypeCodeBool, 8, 1}; plain = itemsize == 1; break;
    case 'i': dtype = {kDLInt, bits, 1}; plain = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8; break;
    case 'u': dtype = {kDLUInt, bits, 1}; plain = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8; break;
    case 'f': dtype = {kDLFloat, bits, 1}; plain = itemsize == 2 || itemsize == 4 || itemsize == 8; break;
    case 'c': dtype = {kDLComplex, bits, 1}; plain = itemsize == 8 || itemsize == 16; break;
    default: break;
  }
  if (!plain || !native_order) return false;
  TensorView& view = result.view;
  const int ndim = array->nd;
  view.shape.resize(static_cast<std::size_t>(ndim));
  view.strides.resize(static_cast<std::size_t>(ndim));
  // A contiguous array's strides along extents of 0 or 1 are arbitrary in numpy
  // (relaxed strides); its buffer export gives the compact ones, C order first,
  // then Fortran order (numpy's _buffer_info_new), so do we.
  constexpr int kCContiguous = 0x0001;  // NPY_ARRAY_C_CONTIGUOUS
  constexpr int kFContiguous = 0x0002;  // NPY_ARRAY_F_CONTIGUOUS
  const bool c_compact = (array->flags & kCContiguous) != 0;
  const bool f_compact = !c_compact && (array->flags & kFContiguous) != 0;
  for (int i = 0; i < ndim; ++i) {
    view.shape[i] = array->dimensions[i];
    if (!c_compact && !f_compact) {
      if (array->strides[i] % itemsize != 0) return false;  // the buffer path names it
      view.strides[i] = array->strides[i] / itemsize;
    }
  }
  // As numpy computes them (0 after an empty extent).
  int64_t compact_stride = 1;
  if (c_compact) {
    for (int i = ndim - 1; i >= 0; --i) {
      view.strides[i] = compact_stride;
      compact_stride *= view.shape[i];
    }
  } else if (f_compact) {
    for (int i = 0; i < ndim; ++i) {
      view.strides[i] = compact_stride;
      compact_stride *= view.shape[i];
    }
  }
  constexpr int kWriteable = 0x0400;  // NPY_ARRAY_WRITEABLE
  view.data = array->data;
  view.readonly = (array->flags & kWriteable) == 0;
  view.dtype = dtype;
  view.device = DLDevice{kDLCPU, 0};
  return true;
}

}  // namespace

PyTensorView make_view(const py::handle& object, const std::string& argument) {
  if (PyTensorView fast; view_from_numpy(object, fast)) {
    require_valid_sizes(fast.view, argument);
    fast.owner = py::reinterpret_borrow<py::object>(object);
    return fast;
  }
  if (PyTensorView fast; view_from_torch(object, argument, fast)) return fast;
  // After the fast paths: the type lookup costs more than their type checks.
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
  module.attr("build_info") = build;

  module.def(
      "cpu_features",
      [] {
        const CpuFeatures& cpu = cpu_features();
        py::dict features;
        features["vendor"] = cpu.vendor;
        features["family"] = cpu.family;
        features["model"] = cpu.model;
        features["avx2"] = cpu.avx2;
        features["avx512"] = cpu.avx512;
        features["vector_set"] = vector_set_name(cpu.vector_set);
        features["vector_set_forced"] = cpu.vector_set_forced;
        features["last_level_cache_bytes"] = cpu.last_level_cache_bytes;
        features["cache_forced"] = cpu.cache_forced;
        features["usable_cpus"] = cpu.usable_cpus;
        features["cpus_forced"] = cpu.cpus_forced;
        features["override_error"] = cpu.override_error;
        return features;
      },
      "What the CPU offers the paths that branch on it, as read once by this process: vendor, "
      "family, model, avx2 and avx512 (what the CPU has), vector_set (the widest set the kernels "
      "use), last_level_cache_bytes, usable_cpus, which of them a TENSORXFER_CPU_* variable forced, "
      "and override_error (an invalid variable, else '').");

  py::class_<PyTensorView>(module, "TensorView",
                           "A view of a tensor's memory that keeps its owner alive (and holds the "
                           "buffer export of buffer-protocol objects, so they cannot be resized).")
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
