// tensorxfer._core.CopyEngine, PackLayout and pack_rows; span copies
// (pack_spans / unpack_spans / copy_spans) for the copy services.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/pack.h"
#include "tensorxfer/copy/span_pack.h"

namespace tensorxfer::bindings {
namespace {

using copy::CopyEngine;
using copy::PackLayout;

PyTensorView view_argument(const py::handle& object, const std::string& argument) {
  if (py::isinstance<PyTensorView>(object)) return object.cast<PyTensorView>();
  return make_view(object, argument);
}

using FieldTuple = std::tuple<std::string, std::string, std::vector<int64_t>>;

PackLayout make_layout(const std::vector<FieldTuple>& fields, int64_t rows) {
  std::vector<copy::PackFieldSpec> specs;
  for (const auto& [name, dtype, row_shape] : fields) {
    specs.push_back({name, dtype_from_name(dtype), row_shape});
  }
  return PackLayout(std::move(specs), rows);
}

// ---- span copies (copy services) --------------------------------------------

using AddressArray = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

// Flags of describe_spans (python/tensorxfer/resharding/copy_services/_tensors.py reads them).
constexpr uint64_t kSpanContiguous = 1;
constexpr uint64_t kSpanHost = 2;
constexpr uint64_t kSpanReadOnly = 4;
constexpr uint64_t kSpanUnknown = 8;

std::vector<std::size_t> span_sizes(const AddressArray& nbytes, std::size_t count, const char* argument) {
  TENSORXFER_CHECK(InvalidArgument, nbytes.ndim() == 1 && static_cast<std::size_t>(nbytes.size()) == count,
                   argument, ": expected ", count, " sizes (one per address), got ", nbytes.size());
  const uint64_t* data = nbytes.data();
  return std::vector<std::size_t>(data, data + count);
}

template <typename Pointer>
std::vector<Pointer> span_addresses(const AddressArray& addresses, const char* argument) {
  TENSORXFER_CHECK(InvalidArgument, addresses.ndim() == 1, argument, ": expected a 1-D array of addresses, got ",
                   addresses.ndim(), " dimensions");
  std::vector<Pointer> result(static_cast<std::size_t>(addresses.size()));
  const uint64_t* data = addresses.data();
  for (std::size_t i = 0; i < result.size(); ++i) {
    result[i] = reinterpret_cast<Pointer>(static_cast<std::uintptr_t>(data[i]));
  }
  return result;
}

void bind_span_copies(py::module_& module) {
  module.def(
      "pack_spans",
      [](const py::handle& dst, const AddressArray& addresses, const AddressArray& nbytes, CopyEngine* engine) {
        const PyTensorView out = view_argument(dst, "dst");
        require_contiguous_host(out.view, "dst");
        require_writable(out.view, "dst");
        const auto sources = span_addresses<const void*>(addresses, "addresses");
        const auto sizes = span_sizes(nbytes, sources.size(), "nbytes");
        py::gil_scoped_release release;
        copy::pack_spans(out.view.data, out.view.nbytes(), sources, sizes, engine);
      },
      py::arg("dst"), py::arg("addresses"), py::arg("nbytes"), py::arg("engine") = nullptr,
      "Copies the host spans (addresses[i], nbytes[i]) back to back into dst (GIL released). The "
      "caller keeps every span's memory alive. Private to tensorxfer.resharding.copy_services.");
  module.def(
      "unpack_spans",
      [](const py::handle& src, const AddressArray& addresses, const AddressArray& nbytes, CopyEngine* engine) {
        const PyTensorView in = view_argument(src, "src");
        require_contiguous_host(in.view, "src");
        const auto destinations = span_addresses<void*>(addresses, "addresses");
        const auto sizes = span_sizes(nbytes, destinations.size(), "nbytes");
        py::gil_scoped_release release;
        copy::unpack_spans(in.view.data, in.view.nbytes(), destinations, sizes, engine);
      },
      py::arg("src"), py::arg("addresses"), py::arg("nbytes"), py::arg("engine") = nullptr,
      "Copies src's bytes, back to back, into the host spans (addresses[i], nbytes[i]) (GIL "
      "released); the inverse of pack_spans. Private to the copy services.");
  module.def(
      "describe_spans",
      [](const py::list& objects) {
        const auto count = static_cast<py::ssize_t>(objects.size());
        py::array_t<uint64_t> result({count, py::ssize_t{3}});
        auto rows = result.mutable_unchecked<2>();
        for (py::ssize_t i = 0; i < count; ++i) {
          PyObject* object = PyList_GET_ITEM(objects.ptr(), i);
          Py_buffer buffer;
          if (PyObject_CheckBuffer(object) && PyObject_GetBuffer(object, &buffer, PyBUF_RECORDS_RO) == 0) {
            rows(i, 0) = static_cast<uint64_t>(reinterpret_cast<std::uintptr_t>(buffer.buf));
            rows(i, 1) = static_cast<uint64_t>(buffer.len);
            rows(i, 2) = (PyBuffer_IsContiguous(&buffer, 'C') ? kSpanContiguous : 0) | kSpanHost |
                         (buffer.readonly ? kSpanReadOnly : 0);
            PyBuffer_Release(&buffer);
            continue;
          }
          PyErr_Clear();
          const py::handle tensor(object);
          if (!py::hasattr(tensor, "data_ptr")) {
            rows(i, 0) = rows(i, 1) = 0;
            rows(i, 2) = kSpanUnknown;
            continue;
          }
          rows(i, 0) = tensor.attr("data_ptr")().cast<uint64_t>();
          rows(i, 1) = tensor.attr("nbytes").cast<uint64_t>();
          rows(i, 2) = (tensor.attr("is_contiguous")().cast<bool>() ? kSpanContiguous : 0) |
                       (tensor.attr("is_cpu").cast<bool>() ? kSpanHost : 0);
        }
        return result;
      },
      py::arg("objects"),
      "(n, 3) uint64 array: (address, nbytes, flags) of each buffer-protocol object or torch "
      "tensor; flags: 1 C-contiguous, 2 host memory, 4 read-only, 8 neither kind (address and "
      "size 0). Private to the copy services.");
  module.def(
      "copy_spans",
      [](const AddressArray& spans, CopyEngine* engine) {
        TENSORXFER_CHECK(InvalidArgument, spans.ndim() == 2 && spans.shape(1) == 3,
                         "spans: expected a uint64 array of shape (n, 3) = (src address, dst address, nbytes), "
                         "got ", spans.ndim(), " dimensions", spans.ndim() == 2 ? " of width " : "",
                         spans.ndim() == 2 ? std::to_string(spans.shape(1)) : std::string());
        const auto count = static_cast<std::size_t>(spans.shape(0));
        const uint64_t* rows = spans.data();
        std::vector<copy::Span> native(count);
        for (std::size_t i = 0; i < count; ++i) {
          native[i] = {reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(rows[3 * i])),
                       reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(rows[3 * i + 1])),
                       static_cast<std::size_t>(rows[3 * i + 2])};
        }
        py::gil_scoped_release release;
        copy::copy_spans(native.data(), native.size(), engine);
      },
      py::arg("spans"), py::arg("engine") = nullptr,
      "Copies spans[i, 2] bytes from address spans[i, 0] to address spans[i, 1] for every row of the "
      "(n, 3) uint64 array (GIL released; work split across `engine`'s threads when large). The "
      "caller keeps every span's memory alive. Private to the copy services and the pipeline executor.");
}

}  // namespace

void bind_copy(py::module_& module) {

  py::class_<CopyEngine>(module, "CopyEngine",
                         "Worker threads that split large host copies and row packing with the "
                         "calling thread. Pass one to HostStream / pack_rows; no global engine.")
      .def(py::init([](std::size_t num_threads, int64_t idle_spin_us) {
             TENSORXFER_CHECK(InvalidArgument, idle_spin_us >= 0, "idle_spin_us must be >= 0, got ", idle_spin_us);
             copy::CopyEngineOptions options;
             options.num_threads = num_threads;
             options.idle_spin = std::chrono::microseconds(idle_spin_us);
             return std::make_unique<CopyEngine>(options);
           }),
           py::arg("num_threads") = 0, py::kw_only(),
           py::arg("idle_spin_us") = copy::CopyEngineOptions{}.idle_spin.count(),
           "Starts `num_threads` workers (0 = one fewer than the usable CPUs, at least 1: the caller "
           "works too). While calls come back to back (each within `idle_spin_us` of the end of the "
           "one before), a worker polls that long for the next before sleeping; 0 = workers always "
           "sleep between calls.")
      .def_property_readonly("num_threads", &CopyEngine::num_threads, "Worker threads owned.")
      .def_property_readonly(
          "idle_spin_us", [](const CopyEngine& engine) { return engine.idle_spin().count(); },
          "How long a worker polls for the next call while calls come back to back (microseconds).")
      .def_property_readonly("max_parallelism", &CopyEngine::max_parallelism,
                             "Threads (workers + caller) that share one copy at most.")
      .def_property_readonly("parallel_threshold", &CopyEngine::parallel_threshold,
                             "Copies below this many bytes run on the calling thread alone.")
      .def(
          "copy",
          [](CopyEngine& engine, const py::handle& dst, const py::handle& src) {
            const PyTensorView out = view_argument(dst, "dst");
            const PyTensorView in = view_argument(src, "src");
            copy::require_copyable(out.view, in.view);
            py::gil_scoped_release release;
            if (out.view.data != in.view.data) engine.copy(out.view.data, in.view.data, in.view.nbytes());
          },
          py::arg("dst"), py::arg("src"),
          "Copies src's bytes into dst and returns when done (GIL released). Both contiguous "
          "host tensors of equal byte size, dst writable; ValueError otherwise.");

  py::class_<PackLayout>(module, "PackLayout",
                         "Native packed-row layout; use tensorxfer.ipc.PackLayout instead.")
      .def(py::init(&make_layout), py::arg("fields"), py::arg("rows"),
           "fields: [(name, dtype name, row shape)], in packing order.")
      .def_property_readonly("rows", &PackLayout::rows)
      .def_property_readonly("nbytes", &PackLayout::nbytes)
      .def_property_readonly(
          "fields",
          [](const PackLayout& layout) {
            py::list result;
            for (const auto& field : layout.fields()) {
              result.append(py::make_tuple(field.name, dtype_name(field.dtype),
                                           py::tuple(py::cast(field.row_shape)), field.offset,
                                           field.row_nbytes));
            }
            return result;
          },
          "[(name, dtype name, row shape, byte offset, row bytes)] in packing order.");

  module.def(
      "pack_rows",
      [](const py::handle& dst, const PackLayout& layout, const py::list& sources,
         const py::handle& indices, CopyEngine* engine) {
        const PyTensorView out = view_argument(dst, "dst");
        const PyTensorView index_view = view_argument(indices, "indices");
        std::vector<PyTensorView> owners;  // keep every view's owner alive for the call
        std::vector<copy::PackSource> native;
        owners.reserve(sources.size());
        for (const auto& item : sources) {
          auto pair = item.cast<py::tuple>();
          const auto name = pair[0].cast<std::string>();
          owners.push_back(view_argument(pair[1], "sources['" + name + "']"));
          native.push_back({name, owners.back().view});
        }
        py::gil_scoped_release release;
        copy::pack_rows(out.view, layout, native, index_view.view, engine);
      },
      py::arg("dst"), py::arg("layout"), py::arg("sources"), py::arg("indices"),
      py::arg("engine") = nullptr,
      "Gathers sources[f][indices] into dst at each field's offset (GIL released). "
      "sources: [(field name, tensor)]. Use tensorxfer.ipc.pack_rows instead.");
  bind_span_copies(module);  // after CopyEngine, which its signatures name
}

}  // namespace tensorxfer::bindings
