// The reduction kernels on their own (tests compare every half-precision kernel
// set this CPU runs against the portable one, bit for bit).
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::bindings {
namespace {

using collectives::HalfKernels;

HalfKernels parse_half_kernels(const std::string& name) {
  for (HalfKernels kernels : {HalfKernels::kAuto, HalfKernels::kPortable, HalfKernels::kAvx2, HalfKernels::kAvx512}) {
    if (name == collectives::half_kernels_name(kernels)) return kernels;
  }
  throw InvalidArgument("kernels must be one of 'auto', 'portable', 'avx2', 'avx512', got '" + name + "'");
}

}  // namespace

void bind_reduce(py::module_& module) {
  module.def(
      "half_kernel_sets",
      [] {
        std::vector<std::string> names;
        for (HalfKernels kernels : {HalfKernels::kPortable, HalfKernels::kAvx2, HalfKernels::kAvx512}) {
          if (collectives::half_kernels_supported(kernels)) names.emplace_back(collectives::half_kernels_name(kernels));
        }
        return names;
      },
      "Names of the half-precision kernel sets this CPU runs, narrowest first.");
  module.def("best_half_kernels", [] { return std::string(collectives::half_kernels_name(collectives::best_half_kernels())); },
             "The kernel set the collectives use on this CPU.");
  module.def(
      "reduce_elements",
      [](const std::string& dtype, const std::string& op, const std::vector<py::object>& sources, py::object out,
         int divisor, const std::string& kernels) {
        const HalfKernels chosen = parse_half_kernels(kernels);
        if (!collectives::half_kernels_supported(chosen)) {
          throw Unsupported("reduce_elements: this CPU cannot run the '" + kernels + "' kernels");
        }
        const PyTensorView destination = make_view(out, "out");
        require_contiguous_host(destination.view, "out");
        TENSORXFER_CHECK(InvalidArgument, !destination.view.readonly, "reduce_elements: out is read-only");
        DLDataType type = destination.view.dtype;
        if (dtype == "bfloat16") type = DLDataType{kDLBfloat, 16, 1};
        else if (dtype == "float16") type = DLDataType{kDLFloat, 16, 1};
        TENSORXFER_CHECK(InvalidArgument, !sources.empty(), "reduce_elements: sources is empty");
        const collectives::ElementType element = collectives::element_type_of(type, "out");
        const std::size_t size = collectives::element_size(element);
        TENSORXFER_CHECK(InvalidArgument, destination.view.nbytes() % size == 0, "reduce_elements: out has ",
                         destination.view.nbytes(), " bytes, not a multiple of ", size);
        std::vector<PyTensorView> views;
        std::vector<const void*> pointers;
        for (const py::object& source : sources) {
          views.push_back(make_view(source, "sources"));
          require_contiguous_host(views.back().view, "sources");
          TENSORXFER_CHECK(InvalidArgument, views.back().view.nbytes() == destination.view.nbytes(),
                           "reduce_elements: a source has ", views.back().view.nbytes(), " bytes, out has ",
                           destination.view.nbytes());
          pointers.push_back(views.back().view.data);
        }
        collectives::reduce_elements(element, collectives::parse_reduce_op(op), pointers.data(),
                                     static_cast<int>(pointers.size()), divisor, destination.view.data, nullptr,
                                     destination.view.nbytes() / size, chosen);
      },
      py::arg("dtype"), py::arg("op"), py::arg("sources"), py::arg("out"), py::arg("divisor"),
      py::arg("kernels") = "auto",
      "out = op(sources...) elementwise, in source order, as the collectives reduce (dtype 'bfloat16' or "
      "'float16' reads uint16 buffers as that type; otherwise out's dtype).");
}

}  // namespace tensorxfer::bindings
