// tensorxfer._core: the copy services' native submit path
// (python/tensorxfer/resharding/copy_services/_queue.py).
//
// A resharding step submits tens of thousands of ops from a Python loop, so one
// submit must cost little more than the call. SubmitSide is one direction of a
// SubmitQueue, written against the CPython API (no pybind11 dispatch per call):
// its submit() is a METH_FASTCALL method that checks the common case (a torch
// tensor or numpy array, an int rank in range, an int task id or None) and appends
// the op to the queue's three columns (Python lists: task ids, tensors, ranks).
// Anything else goes to the queue's Python submit (`fallback`), which raises what
// the base class documents or appends through append().
//
// The description of each tensor (what run() needs of it: address, byte size,
// contiguous, on the host) is a fourth column, kept in step with the other three:
// the columns are private to the side, and every change (submit, append, and the
// send_ops / recv_ops edits set / insert / remove) writes the rows of exactly the
// ops it touches, so no description outlives its op. A torch tensor's row is read
// by take(), when run() starts (torch's own C methods, resolved once per queue): a
// tensor resized, re-pointed or moved between its submit and run() is used as it
// is then, so no transfer touches memory the tensor has let go. A numpy array
// submitted is described at submit (it cannot be resized while the columns hold it).
// Anything else (and an array that enters by an edit) is left undescribed: run()
// describes it (and raises what that raises).
#include <pybind11/numpy.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
#include <vector>

#include "bindings.h"
#include "torch_tensor_fields.h"

namespace tensorxfer::bindings {
namespace {

constexpr uint64_t kUndescribed = 8;  // a row run() describes (the flags of _core.describe_spans)
// A torch tensor's row, read when take() hands it to run(): a tensor's memory is what it is
// when run() starts (a tensor resized, re-pointed or moved between submit and run() is read
// as it is then, so no transfer touches memory the tensor has let go). Never leaves take().
constexpr uint64_t kReadAtTake = 16;

struct SubmitSide {
  PyObject_HEAD
  PyObject* ids;          // list: task ids (int or None)
  PyObject* tensors;      // list: the submitted objects
  PyObject* ranks;        // list: peers (int)
  PyObject* tensor_type;  // the type submit() and append() describe natively (torch.Tensor)
  PyObject* tensor_subtype;  // a subclass of it found to read alike (torch.nn.Parameter), or nullptr
  PyObject* array_type;   // the array type submit() describes through the buffer protocol (numpy.ndarray)
  PyObject* fallback;     // fallback(tensor, rank, task_id=None): the checked Python submit
  long long low, high;    // submit() takes ranks in [low, high); anything else goes to fallback
  int host_only;          // submit() takes tensors on the host only
  int writable;           // a receive side: submit() takes writable arrays only
  std::vector<uint64_t>* rows;  // the description column: (address, nbytes, flags) per op
  TorchTensorFields* fields;    // resolved for tensor_type
};

PyObject* new_list() { return PyList_New(0); }

bool reset_columns(SubmitSide* self) {
  PyObject* ids = new_list();
  PyObject* tensors = new_list();
  PyObject* ranks = new_list();
  if (ids == nullptr || tensors == nullptr || ranks == nullptr) {
    Py_XDECREF(ids);
    Py_XDECREF(tensors);
    Py_XDECREF(ranks);
    return false;
  }
  Py_XSETREF(self->ids, ids);
  Py_XSETREF(self->tensors, tensors);
  Py_XSETREF(self->ranks, ranks);
  self->rows->clear();
  return true;
}

// Appends one op: the columns, and its description row (kUndescribed where this
// side cannot describe it natively; run() describes those).
PyObject* append_op(SubmitSide* self, PyObject* task_id, PyObject* tensor, PyObject* rank,
                    const std::array<uint64_t, 3>& row) {
  const Py_ssize_t before = PyList_GET_SIZE(self->ids);
  if (PyList_Append(self->ids, task_id) < 0 || PyList_Append(self->tensors, tensor) < 0 ||
      PyList_Append(self->ranks, rank) < 0) {
    // Keep the columns of one length (only a failed allocation gets here).
    PyList_SetSlice(self->ids, before, PY_SSIZE_T_MAX, nullptr);
    PyList_SetSlice(self->tensors, before, PY_SSIZE_T_MAX, nullptr);
    PyList_SetSlice(self->ranks, before, PY_SSIZE_T_MAX, nullptr);
    return nullptr;
  }
  self->rows->insert(self->rows->end(), row.begin(), row.end());
  Py_RETURN_NONE;
}

// Whether `object` is a tensor this side describes natively: of tensor_type, or of a subclass
// whose fields are tensor_type's (the last such subclass is remembered).
bool native_tensor(SubmitSide* self, PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  if (type == reinterpret_cast<PyTypeObject*>(self->tensor_type) ||
      reinterpret_cast<PyObject*>(type) == self->tensor_subtype) {
    return true;
  }
  if (!PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(self->tensor_type)) ||
      !self->fields->read_alike(type)) {
    return false;
  }
  Py_INCREF(type);
  Py_XSETREF(self->tensor_subtype, reinterpret_cast<PyObject*>(type));
  return true;
}

bool small_int_in(PyObject* value, long long low, long long high) {
  if (!PyLong_CheckExact(value)) return false;
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
  return overflow == 0 && number >= low && number < high;
}

bool task_id_ok(PyObject* task_id) {
  if (task_id == Py_None) return true;
  if (!PyLong_CheckExact(task_id)) return false;
  int overflow = 0;
  PyLong_AsLongLongAndOverflow(task_id, &overflow);
  return overflow == 0 && !PyErr_Occurred();
}

// A tensor of tensor_type submit() takes (its row read at take()); nullopt for one the
// fallback must check.
std::optional<std::array<uint64_t, 3>> submitted_tensor(SubmitSide* self, PyObject* tensor) {
  const auto host = self->fields->on_host(tensor);
  if (!host) PyErr_Clear();
  if (!host || (!*host && self->host_only)) return std::nullopt;
  return std::array<uint64_t, 3>{0, 0, kReadAtTake};
}

// Reads the rows of the torch tensors submit() and append() deferred to now. A tensor that
// cannot be read here (e.g. a sparse tensor) is left to run(), which describes it and
// raises there, as before.
void read_deferred_rows(SubmitSide* self) {
  std::vector<uint64_t>& rows = *self->rows;
  for (std::size_t row = 0; row < rows.size() / 3; ++row) {
    if (rows[3 * row + 2] != kReadAtTake) continue;
    PyObject* tensor = PyList_GET_ITEM(self->tensors, static_cast<Py_ssize_t>(row));
    const auto described = self->fields->read(tensor, false);
    const auto host = described ? self->fields->on_host(tensor) : std::nullopt;
    if (!described || !host) {
      PyErr_Clear();
      rows[3 * row] = rows[3 * row + 1] = 0;
      rows[3 * row + 2] = kUndescribed;
      continue;
    }
    rows[3 * row] = (*described)[0];
    rows[3 * row + 1] = (*described)[1];
    rows[3 * row + 2] = (*described)[2] | (*host ? kHost : 0);
  }
}

// An array of array_type submit() takes, described as _core.describe_spans does; nullopt for
// one the fallback must check or refuse (an array of objects, a read-only receive, a format
// the buffer protocol refuses).
std::optional<std::array<uint64_t, 3>> submitted_array(SubmitSide* self, PyObject* array) {
  Py_buffer buffer;
  if (PyObject_GetBuffer(array, &buffer, self->writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return std::nullopt;
  }
  const bool objects = buffer.format != nullptr && std::strchr(buffer.format, 'O') != nullptr;
  const std::array<uint64_t, 3> row{static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(buffer.buf)),
                                    static_cast<uint64_t>(buffer.len),
                                    (PyBuffer_IsContiguous(&buffer, 'C') ? kContiguous : 0) | kHost};
  PyBuffer_Release(&buffer);
  if (objects) return std::nullopt;
  return row;
}

// The row of an op entering the columns other than by submit (append, set, insert: not
// checked): one take() reads for an object of tensor_type, else a kUndescribed row (run()
// describes it and raises what it raises there, agreed among the ranks).
std::array<uint64_t, 3> describe_or_defer(SubmitSide* self, PyObject* tensor) {
  return {0, 0, native_tensor(self, tensor) ? kReadAtTake : kUndescribed};
}

// submit(tensor, rank, task_id=None)
PyObject* side_submit(SubmitSide* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames == nullptr && (nargs == 2 || nargs == 3)) {
    PyObject* tensor = args[0];
    PyObject* rank = args[1];
    PyObject* task_id = nargs == 3 ? args[2] : Py_None;
    if (small_int_in(rank, self->low, self->high) && task_id_ok(task_id)) {
      std::optional<std::array<uint64_t, 3>> row;
      if (Py_TYPE(tensor) == reinterpret_cast<PyTypeObject*>(self->array_type)) {
        row = submitted_array(self, tensor);
      } else if (native_tensor(self, tensor)) {
        row = submitted_tensor(self, tensor);
      }
      if (row) return append_op(self, task_id, tensor, rank, *row);
    }
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

// append(task_id, tensor, rank): an op already checked (or, from send_ops.append, not checked).
PyObject* side_append(SubmitSide* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "append(task_id, tensor, rank) takes 3 arguments, got %zd", nargs);
    return nullptr;
  }
  return append_op(self, args[0], args[1], args[2], describe_or_defer(self, args[1]));
}

Py_ssize_t side_length(SubmitSide* self) { return PyList_GET_SIZE(self->ids); }

// `argument` as a position in [0, length()) (or [0, length()] where `end_allowed`); nullopt
// with TypeError / IndexError set otherwise.
std::optional<Py_ssize_t> position_of(SubmitSide* self, PyObject* argument, bool end_allowed) {
  const Py_ssize_t position = PyLong_AsSsize_t(argument);
  if (position == -1 && PyErr_Occurred()) return std::nullopt;
  const Py_ssize_t length = side_length(self);
  if (position >= 0 && (position < length || (end_allowed && position == length))) return position;
  PyErr_Format(PyExc_IndexError, "SubmitSide: position %zd out of range for %zd ops", position, length);
  return std::nullopt;
}

// The position of an edit `name`(position, task_id, tensor, rank), its arguments checked.
std::optional<Py_ssize_t> edit_position(SubmitSide* self, const char* name, PyObject* const* args, Py_ssize_t nargs,
                                        bool end_allowed) {
  if (nargs != 4) {
    PyErr_Format(PyExc_TypeError, "%s(position, task_id, tensor, rank) takes 4 arguments, got %zd", name, nargs);
    return std::nullopt;
  }
  return position_of(self, args[0], end_allowed);
}

// op(position) -> (task_id, tensor, rank)
PyObject* side_op(SubmitSide* self, PyObject* argument) {
  const auto at = position_of(self, argument, false);
  if (!at) return nullptr;
  const Py_ssize_t position = *at;
  return PyTuple_Pack(3, PyList_GET_ITEM(self->ids, position), PyList_GET_ITEM(self->tensors, position),
                      PyList_GET_ITEM(self->ranks, position));
}

// set(position, task_id, tensor, rank): replaces one op, its row described or deferred anew.
PyObject* side_set(SubmitSide* self, PyObject* const* args, Py_ssize_t nargs) {
  const auto at = edit_position(self, "set", args, nargs, false);
  if (!at) return nullptr;
  const Py_ssize_t position = *at;
  const auto row = describe_or_defer(self, args[2]);
  PyObject* const values[] = {args[1], args[2], args[3]};
  PyObject* const columns[] = {self->ids, self->tensors, self->ranks};
  std::copy(row.begin(), row.end(), self->rows->begin() + 3 * position);
  for (int column = 0; column < 3; ++column) {
    Py_INCREF(values[column]);
    PyList_SetItem(columns[column], position, values[column]);  // steals; cannot fail in range
  }
  Py_RETURN_NONE;
}

// insert(position, task_id, tensor, rank): a new op before `position` (0 <= position <= length()).
PyObject* side_insert(SubmitSide* self, PyObject* const* args, Py_ssize_t nargs) {
  const auto at = edit_position(self, "insert", args, nargs, true);
  if (!at) return nullptr;
  const Py_ssize_t position = *at;
  const auto row = describe_or_defer(self, args[2]);
  try {
    self->rows->insert(self->rows->begin() + 3 * position, row.begin(), row.end());
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  PyObject* const values[] = {args[1], args[2], args[3]};
  PyObject* const columns[] = {self->ids, self->tensors, self->ranks};
  for (int column = 0; column < 3; ++column) {
    if (PyList_Insert(columns[column], position, values[column]) < 0) {  // a failed allocation only
      for (int inserted = 0; inserted < column; ++inserted) PyList_SetSlice(columns[inserted], position, position + 1, nullptr);
      self->rows->erase(self->rows->begin() + 3 * position, self->rows->begin() + 3 * position + 3);
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

// remove(position): drops one op and its row.
PyObject* side_remove(SubmitSide* self, PyObject* argument) {
  const auto at = position_of(self, argument, false);
  if (!at) return nullptr;
  const Py_ssize_t position = *at;
  for (PyObject* column : {self->ids, self->tensors, self->ranks}) {
    if (PyList_SetSlice(column, position, position + 1, nullptr) < 0) return nullptr;  // shrinking: no failure
  }
  self->rows->erase(self->rows->begin() + 3 * position, self->rows->begin() + 3 * position + 3);
  Py_RETURN_NONE;
}

// take() -> (ids, tensors, ranks, rows (n, 3) uint64): empties the side.
PyObject* side_take(SubmitSide* self, PyObject*) {
  try {
    read_deferred_rows(self);
    const auto count = static_cast<py::ssize_t>(self->rows->size() / 3);
    py::array_t<uint64_t> rows({count, py::ssize_t{3}});
    if (count) std::memcpy(rows.mutable_data(), self->rows->data(), self->rows->size() * sizeof(uint64_t));
    PyObject* taken = PyTuple_Pack(4, self->ids, self->tensors, self->ranks, rows.ptr());
    if (taken == nullptr || !reset_columns(self)) {
      Py_XDECREF(taken);
      return nullptr;
    }
    return taken;
  } catch (py::error_already_set& error) {
    error.restore();
    return nullptr;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_MemoryError, error.what());
    return nullptr;
  }
}

PyObject* side_clear(SubmitSide* self, PyObject*) {
  if (PyList_SetSlice(self->ids, 0, PY_SSIZE_T_MAX, nullptr) < 0 ||
      PyList_SetSlice(self->tensors, 0, PY_SSIZE_T_MAX, nullptr) < 0 ||
      PyList_SetSlice(self->ranks, 0, PY_SSIZE_T_MAX, nullptr) < 0) {
    return nullptr;
  }
  self->rows->clear();
  Py_RETURN_NONE;
}

// set_checks(tensor_type, array_type, low, high, host_only)
PyObject* side_set_checks(SubmitSide* self, PyObject* args) {
  PyObject* tensor_type = nullptr;
  PyObject* array_type = nullptr;
  long long low = 0, high = 0;
  int host_only = 1;
  if (!PyArg_ParseTuple(args, "O!O!LLp", &PyType_Type, &tensor_type, &PyType_Type, &array_type, &low, &high,
                        &host_only)) {
    return nullptr;
  }
  auto* fields = new (std::nothrow) TorchTensorFields(torch_fields(), reinterpret_cast<PyTypeObject*>(tensor_type));
  if (fields == nullptr) return PyErr_NoMemory();
  delete self->fields;
  self->fields = fields;
  Py_INCREF(tensor_type);
  Py_XSETREF(self->tensor_type, tensor_type);
  Py_CLEAR(self->tensor_subtype);
  Py_INCREF(array_type);
  Py_XSETREF(self->array_type, array_type);
  self->low = low;
  self->high = high;
  self->host_only = host_only;
  Py_RETURN_NONE;
}

int side_init(SubmitSide* self, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"fallback", "writable", nullptr};
  PyObject* fallback = nullptr;
  int writable = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", const_cast<char**>(keywords), &fallback, &writable)) {
    return -1;
  }
  if (!PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "SubmitSide: fallback must be callable");
    return -1;
  }
  Py_INCREF(fallback);
  Py_XSETREF(self->fallback, fallback);
  Py_INCREF(reinterpret_cast<PyObject*>(&PyBaseObject_Type));  // no type described until set_checks
  Py_XSETREF(self->tensor_type, reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  Py_INCREF(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  Py_XSETREF(self->array_type, reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  self->writable = writable;
  if (self->fields == nullptr) self->fields = new (std::nothrow) TorchTensorFields(torch_fields(), nullptr);
  self->low = self->high = 0;  // every submit takes the fallback until set_checks
  self->host_only = 1;
  if (self->rows == nullptr) self->rows = new (std::nothrow) std::vector<uint64_t>();
  if (self->rows == nullptr || self->fields == nullptr) {
    PyErr_NoMemory();
    return -1;
  }
  return reset_columns(self) ? 0 : -1;
}

int side_traverse(SubmitSide* self, visitproc visit, void* arg) {
  Py_VISIT(self->ids);
  Py_VISIT(self->tensors);
  Py_VISIT(self->ranks);
  Py_VISIT(self->tensor_type);
  Py_VISIT(self->tensor_subtype);
  Py_VISIT(self->array_type);
  Py_VISIT(self->fallback);
  return 0;
}

int side_clear_references(SubmitSide* self) {
  Py_CLEAR(self->ids);
  Py_CLEAR(self->tensors);
  Py_CLEAR(self->ranks);
  Py_CLEAR(self->tensor_type);
  Py_CLEAR(self->tensor_subtype);
  Py_CLEAR(self->array_type);
  Py_CLEAR(self->fallback);
  return 0;
}

void side_dealloc(SubmitSide* self) {
  PyObject_GC_UnTrack(self);
  side_clear_references(self);
  delete self->rows;
  self->rows = nullptr;
  delete self->fields;
  self->fields = nullptr;
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMethodDef side_methods[] = {
    {"submit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(side_submit)),
     METH_FASTCALL | METH_KEYWORDS,
     "submit($self, tensor, rank, task_id=None)\n--\n\nQueue one op (the fallback checks anything but the common case)."},
    {"append", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(side_append)), METH_FASTCALL,
     "append($self, task_id, tensor, rank, /)\n--\n\nQueue an op as it is (described where this side can)."},
    {"op", reinterpret_cast<PyCFunction>(side_op), METH_O,
     "op($self, position, /)\n--\n\n(task_id, tensor, rank) of the op at position (0 <= position < len)."},
    {"set", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(side_set)), METH_FASTCALL,
     "set($self, position, task_id, tensor, rank, /)\n--\n\nReplace the op at position (its description taken anew)."},
    {"insert", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(side_insert)), METH_FASTCALL,
     "insert($self, position, task_id, tensor, rank, /)\n--\n\nQueue an op before position (0 <= position <= len)."},
    {"remove", reinterpret_cast<PyCFunction>(side_remove), METH_O,
     "remove($self, position, /)\n--\n\nDrop the op at position and its description."},
    {"take", reinterpret_cast<PyCFunction>(side_take), METH_NOARGS,
     "take($self, /)\n--\n\n(ids, tensors, ranks, rows) of the queued ops, leaving this side empty; rows: (n, 3) uint64 of (address, "
     "nbytes, flags) as describe_spans, flag 8 where not described."},
    {"clear", reinterpret_cast<PyCFunction>(side_clear), METH_NOARGS, "clear($self, /)\n--\n\nEmpties the columns (the same lists)."},
    {"set_checks", reinterpret_cast<PyCFunction>(side_set_checks), METH_VARARGS,
     "set_checks($self, tensor_type, array_type, low, high, host_only, /)\n--\n\nWhat submit() takes without the fallback."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot side_slots[] = {
    {Py_tp_doc, const_cast<char*>("SubmitSide(fallback, writable=False)\n--\n\nOne direction of a copy service's submit queue, "
                                  "with a native submit (copy_services/_queue.py).")},
    {Py_tp_init, reinterpret_cast<void*>(side_init)},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(side_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(side_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(side_clear_references)},
    {Py_tp_methods, side_methods},
    {Py_sq_length, reinterpret_cast<void*>(side_length)},
    {0, nullptr}};

PyType_Spec side_spec = {"tensorxfer._core.SubmitSide", sizeof(SubmitSide), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, side_slots};

}  // namespace

void bind_submit_queue(py::module_& module) {
  PyObject* type = PyType_FromSpec(&side_spec);
  if (type == nullptr) throw py::error_already_set();
  module.add_object("SubmitSide", py::reinterpret_steal<py::object>(type));

  module.def(
      "describe_torch_tensors",
      [](const py::list& tensors) {
        const auto count = static_cast<py::ssize_t>(tensors.size());
        py::array_t<uint64_t> result({count, py::ssize_t{3}});
        auto rows = result.mutable_unchecked<2>();
        for (py::ssize_t i = 0; i < count; ++i) {
          const auto row = torch_fields().read(PyList_GET_ITEM(tensors.ptr(), i));
          rows(i, 0) = row[0];
          rows(i, 1) = row[1];
          rows(i, 2) = row[2];
        }
        return result;
      },
      py::arg("tensors"),
      "(n, 3) uint64 array of (data_ptr(), nbytes, flags: 1 contiguous, 2 on the host) of each torch tensor in "
      "the list (the copy services' _tensors.describe_many; any object with those attributes works).");
}

}  // namespace tensorxfer::bindings
