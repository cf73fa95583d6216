// tensorxfer._core.CudaCopySubmitter (only in builds with CUDA), whether it was
// compiled (cuda_copy_compiled), and the count of CUDA runtime calls made
// (cuda_runtime_calls, for tests proving that host paths never touch CUDA).
//
// Streams cross as the integers torch gives (torch.cuda.Stream.cuda_stream) and
// buffers as addresses (Tensor.data_ptr()): the Python caller validated them and
// keeps their owners alive until the copy's event has completed.
#include <cstdint>

#include "bindings.h"
#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/runtime/cuda_copy.h"

namespace tensorxfer::bindings {
namespace {

#ifdef TENSORXFER_WITH_CUDA
void* as_pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

void bind_cuda_copy_submitter(py::module_& module) {
  using runtime::CudaCopySubmitter;
  py::class_<CudaCopySubmitter>(module, "CudaCopySubmitter",
                                "Native cudaMemcpyAsync host-to-device submitter for one GPU.")
      .def(py::init([](int device) { return CudaCopySubmitter::create(device); }), py::arg("device"))
      .def_property_readonly("device", &CudaCopySubmitter::device)
      .def(
          "order_after",
          [](CudaCopySubmitter& self, std::uintptr_t stream, std::uintptr_t waited_stream) {
            py::gil_scoped_release released;
            self.order_after(as_pointer(stream), as_pointer(waited_stream));
          },
          py::arg("stream"), py::arg("waited_stream"),
          "Makes `stream` wait on the device for the work queued on `waited_stream` so far.")
      .def(
          "copy_host_to_device",
          [](CudaCopySubmitter& self, std::uintptr_t dst, std::uintptr_t src, std::size_t nbytes,
             std::uintptr_t stream) {
            py::gil_scoped_release released;
            self.copy_host_to_device(as_pointer(dst), as_pointer(src), nbytes, as_pointer(stream));
          },
          py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream"),
          "Queues cudaMemcpyAsync(dst, src, nbytes, HostToDevice) on `stream` (GIL released).");
}
#endif

}  // namespace

void bind_cuda(py::module_& module) {
  module.attr("cuda_copy_compiled") = runtime::kCudaCopyCompiled;
  module.def("cuda_runtime_calls", &cuda_runtime_calls,
             "CUDA runtime calls tensorxfer made in this process so far (inherited across fork).");
#ifdef TENSORXFER_WITH_CUDA
  bind_cuda_copy_submitter(module);
#endif
}

}  // namespace tensorxfer::bindings
