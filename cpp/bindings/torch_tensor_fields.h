// How the copy services read a torch tensor's address, size, layout and device
// without linking torch: through its Python methods and attributes, called
// from C (bind_submit_queue.cc).
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "bindings.h"

namespace tensorxfer::bindings {

// Flags of a description row, as _core.describe_spans writes them (_tensors.py reads them).
inline constexpr uint64_t kContiguous = 1, kHost = 2;

// One field of an object: a method called without arguments, or an attribute.
// Resolved for a type, it calls that type's C descriptor directly (no lookup
// per object; a method shadowed by an instance attribute is not looked for);
// otherwise it looks the name up on each object.
class Field {
 public:
  Field(const char* name, bool method) : name_(PyUnicode_InternFromString(name)), method_(method) {}
  Field(const Field& field, PyTypeObject* type) : name_(field.name_), method_(field.method_) {
    // A C method or attribute read from the class is its descriptor itself.
    PyObject* found = type == nullptr ? nullptr : PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name_);
    if (found == nullptr) {
      PyErr_Clear();  // looked up by name on each object, which raises what it raises
    } else if (Py_IS_TYPE(found, method_ ? &PyMethodDescr_Type : &PyGetSetDescr_Type)) {
      descriptor_ = found;
    } else {
      Py_DECREF(found);
    }
  }
  Field(const Field&) = delete;
  Field& operator=(const Field&) = delete;
  ~Field() { Py_XDECREF(descriptor_); }

  // Whether `type` (a subclass of the resolved type) reads this field with the same descriptor.
  bool same_on(PyTypeObject* type) const {
    if (descriptor_ == nullptr) return false;
    PyObject* found = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), name_);
    if (found == nullptr) PyErr_Clear();
    Py_XDECREF(found);
    return found == descriptor_;
  }

  // A new reference, or nullptr with a Python error set.
  PyObject* get(PyObject* object) const {
    PyObject* args[] = {object};
    if (descriptor_ != nullptr) {
      return method_ ? PyObject_Vectorcall(descriptor_, args, 1, nullptr)
                     : Py_TYPE(descriptor_)->tp_descr_get(descriptor_, object,
                                                          reinterpret_cast<PyObject*>(Py_TYPE(object)));
    }
    return method_ ? PyObject_VectorcallMethod(name_, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr)
                   : PyObject_GetAttr(object, name_);
  }

 private:
  PyObject* name_;  // interned: lives as the interpreter does
  bool method_;
  PyObject* descriptor_ = nullptr;
};

// A torch tensor's (data_ptr(), nbytes, is_contiguous(), is_cpu) through the CPython API.
class TorchTensorFields {
 public:
  TorchTensorFields()
      : data_ptr_("data_ptr", true), nbytes_("nbytes", false), is_contiguous_("is_contiguous", true),
        is_cpu_("is_cpu", false) {}
  // For objects of exactly `type` (torch.Tensor): its descriptors, called directly.
  TorchTensorFields(const TorchTensorFields& names, PyTypeObject* type)
      : data_ptr_(names.data_ptr_, type), nbytes_(names.nbytes_, type), is_contiguous_(names.is_contiguous_, type),
        is_cpu_(names.is_cpu_, type) {}

  // Whether objects of `type` (a subclass) read every field with this reader's descriptors
  // (torch.nn.Parameter does; a subclass that overrides one does not).
  bool read_alike(PyTypeObject* type) const {
    return data_ptr_.same_on(type) && nbytes_.same_on(type) && is_contiguous_.same_on(type) && is_cpu_.same_on(type);
  }

  // is_cpu, or nullopt with a Python error set.
  std::optional<bool> on_host(PyObject* tensor) const { return as_bool(is_cpu_.get(tensor)); }

  // (data_ptr(), nbytes, flags) with `host` already read; nullopt with a Python error set.
  std::optional<std::array<uint64_t, 3>> read(PyObject* tensor, bool host) const {
    const auto address = as_u64(data_ptr_.get(tensor));
    if (!address) return std::nullopt;
    const auto nbytes = as_u64(nbytes_.get(tensor));
    if (!nbytes) return std::nullopt;
    const auto contiguous = as_bool(is_contiguous_.get(tensor));
    if (!contiguous) return std::nullopt;
    return std::array<uint64_t, 3>{*address, *nbytes, (*contiguous ? kContiguous : 0) | (host ? kHost : 0)};
  }

  // All of it (the host flag included); throws error_already_set.
  std::array<uint64_t, 3> read(PyObject* tensor) const {
    auto row = read(tensor, false);
    const auto host = row ? on_host(tensor) : std::nullopt;
    if (!host) throw py::error_already_set();
    (*row)[2] |= *host ? kHost : 0;
    return *row;
  }

 private:
  // These take a new reference (or nullptr with an error set) and drop it.
  static std::optional<uint64_t> as_u64(PyObject* value) {
    if (value == nullptr) return std::nullopt;
    const unsigned long long result = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (result == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return std::nullopt;
    return result;
  }
  static std::optional<bool> as_bool(PyObject* value) {
    if (value == nullptr) return std::nullopt;
    const int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (result < 0) return std::nullopt;
    return result == 1;
  }

  Field data_ptr_, nbytes_, is_contiguous_, is_cpu_;
};

// By name, for any object with those attributes.
inline const TorchTensorFields& torch_fields() {
  static const TorchTensorFields* const fields = new TorchTensorFields();  // lives as the interpreter does
  return *fields;
}

}  // namespace tensorxfer::bindings
