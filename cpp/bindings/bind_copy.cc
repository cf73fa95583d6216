// tensorxfer._core.CopyEngine, PackLayout and pack_rows.
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/pack.h"

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

}  // namespace

void bind_copy(py::module_& module) {
  py::class_<CopyEngine>(module, "CopyEngine",
                         "Worker threads that split large host copies and row packing with the "
                         "calling thread. Pass one to HostStream / pack_rows; no global engine.")
      .def(py::init([](std::size_t num_threads) {
             copy::CopyEngineOptions options;
             options.num_threads = num_threads;
             return std::make_unique<CopyEngine>(options);
           }),
           py::arg("num_threads") = 0,
           "Starts `num_threads` workers (0 = one per hardware thread).")
      .def_property_readonly("num_threads", &CopyEngine::num_threads, "Worker threads owned.")
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
}

}  // namespace tensorxfer::bindings
