// tensorxfer._core.cuda_copy_spans / cuda_put (builds with CUDA only): the device
// steps of the CUDA pipeline executor (tensorxfer.resharding.cuda_pipeline).
//
// Addresses cross as integers (a span table's Tensor.data_ptr(), IpcMemory's
// remote_data, torch.cuda.Stream.cuda_stream); the Python caller checked every
// span against its tensors and the slots, and keeps them alive until the stream
// has run the copy.
#include <cstdint>

#include "bindings.h"

#ifdef TENSORXFER_WITH_CUDA
#include "tensorxfer/resharding/cuda_span_copy.h"
#endif

namespace tensorxfer::bindings {

#ifdef TENSORXFER_WITH_CUDA
void bind_cuda_pipeline(py::module_& module) {
  module.def(
      "cuda_copy_spans",
      [](std::uintptr_t table, std::size_t count, int cuda_device, std::uintptr_t stream) {
        py::gil_scoped_release released;
        resharding::copy_spans_async(reinterpret_cast<const resharding::DeviceSpan*>(table), count, cuda_device,
                                     reinterpret_cast<void*>(stream));
      },
      py::arg("table"), py::arg("count"), py::arg("cuda_device"), py::arg("stream"),
      "Queues the copy of `count` spans, rows (source, destination, nbytes) of uint64 at device address `table`, "
      "on `stream` (one block per span).");
  module.def(
      "cuda_put",
      [](std::uintptr_t destination, std::uintptr_t source, std::size_t nbytes, int cuda_device,
         std::uintptr_t stream) {
        py::gil_scoped_release released;
        resharding::put_async(reinterpret_cast<void*>(destination), reinterpret_cast<const void*>(source), nbytes,
                              cuda_device, reinterpret_cast<void*>(stream));
      },
      py::arg("destination"), py::arg("source"), py::arg("nbytes"), py::arg("cuda_device"), py::arg("stream"),
      "Queues cudaMemcpyAsync(destination, source, nbytes, device to device) on `stream`.");
  module.attr("cuda_span_piece_bytes") = py::int_(resharding::kDeviceSpanPieceBytes);
}
#else
void bind_cuda_pipeline(py::module_&) {}
#endif

}  // namespace tensorxfer::bindings
