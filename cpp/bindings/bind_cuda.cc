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

#ifdef TENSORXFER_FAKE_CUDA
#include <cuda_runtime_api.h>
#include <pybind11/stl.h>

#include "fake_cuda.h"
#endif

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
  module.def(
      "cuda_host_register",
      [](std::uintptr_t pointer, std::size_t nbytes, int device) {
        py::gil_scoped_release released;
        return runtime::register_host_memory(as_pointer(pointer), nbytes, device);
      },
      py::arg("pointer"), py::arg("nbytes"), py::arg("device"),
      "Pins host memory in place for GPU `device`: True when registered (undo with cuda_host_unregister), "
      "False when the whole range was already pinned. Raises with the CUDA error cleared.");
  module.def(
      "cuda_host_unregister",
      [](std::uintptr_t pointer, int device) {
        py::gil_scoped_release released;
        runtime::unregister_host_memory(as_pointer(pointer), device);
      },
      py::arg("pointer"), py::arg("device"), "cudaHostUnregister with GPU `device` current (GIL released).");
}
#endif

#ifdef TENSORXFER_FAKE_CUDA
// _core.fake_cuda: the control API of the fake CUDA runtime this test build links (tests/cuda_fake).
void bind_fake_cuda(py::module_& module) {
  py::module_ fake = module.def_submodule("fake_cuda", "Control of the fake CUDA runtime (test builds only).");
  fake.def("reset", &tx_fake_cuda_reset);
  fake.def("set_device_count", &tx_fake_cuda_set_device_count, py::arg("count"));
  fake.def("set_driver_version", &tx_fake_cuda_set_driver_version, py::arg("version"));
  fake.def(
      "set_concurrent_managed_access", [](bool enabled) { tx_fake_cuda_set_concurrent_managed_access(enabled); },
      py::arg("enabled"));
  fake.def(
      "fail", [](const std::string& function, int error, int skip, int times) {
        tx_fake_cuda_fail(function.c_str(), error, skip, times);
      },
      py::arg("function"), py::arg("error"), py::arg("skip") = 0, py::arg("times") = 1);
  fake.def("gil_violations", &tx_fake_cuda_gil_violations);
  fake.def("peek_last_error", [] { return static_cast<int>(cudaPeekAtLastError()); },
           "The calling thread's last CUDA error, not reset (0: none).");
  fake.def("freed_while_imported", &tx_fake_cuda_freed_while_imported);
  fake.def("open_imports", &tx_fake_cuda_open_imports);
  fake.def("live_allocations", &tx_fake_cuda_live_allocations);
  fake.def("registered_ranges", &tx_fake_cuda_registered_ranges);
  fake.def("context_created", [](int device) { return tx_fake_cuda_context_created(device) != 0; },
           py::arg("device"));
  fake.def("calls", [] {
    py::list out;
    for (const cuda_fake::Call& call : cuda_fake::calls()) {
      py::dict entry;
      entry["sequence"] = call.sequence;
      entry["function"] = call.function;
      entry["arguments"] = call.arguments;
      entry["result"] = call.result;
      entry["thread"] = call.thread;
      entry["device"] = call.device;
      entry["blocking"] = call.blocking;
      entry["gil_held"] = call.gil_held < 0 ? py::object(py::none()) : py::object(py::bool_(call.gil_held == 1));
      out.append(entry);
    }
    return out;
  });
  fake.def("managed_requests", [] {
    py::list out;
    for (const cuda_fake::ManagedRequest& request : cuda_fake::managed_requests()) {
      out.append(py::make_tuple(request.kind, request.pointer, request.bytes, request.location_type,
                                request.location_id));
    }
    return out;
  });
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
#ifdef TENSORXFER_FAKE_CUDA
  bind_fake_cuda(module);
#endif
}

}  // namespace tensorxfer::bindings
