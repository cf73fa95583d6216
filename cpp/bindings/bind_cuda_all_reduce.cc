// tensorxfer._core.CudaAllReduce (builds with CUDA only): the CUDA all-reduce
// over an IpcMemory(device="cuda"), driven by tensorxfer.runtime.CudaCommunicator.
//
// Addresses cross as integers (IpcMemory's remote_data / barrier_in / barrier_out,
// Tensor.data_ptr(), torch.cuda.Stream.cuda_stream); the Python caller checked the
// tensor and keeps the IpcMemory alive for as long as this object.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"

#ifdef TENSORXFER_WITH_CUDA
#include "tensorxfer/collectives/cuda_all_reduce.h"
#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/common/error.h"
#endif

namespace tensorxfer::bindings {

#ifdef TENSORXFER_WITH_CUDA
namespace {

using collectives::CudaAllReduce;
using collectives::CudaAllReduceAlgorithm;
using collectives::ElementType;

std::vector<void*> as_pointers(const std::vector<std::uintptr_t>& addresses) {
  std::vector<void*> pointers;
  pointers.reserve(addresses.size());
  for (std::uintptr_t address : addresses) pointers.push_back(reinterpret_cast<void*>(address));
  return pointers;
}

ElementType element_type_named(const std::string& name) {
  if (name == "float32") return ElementType::kFloat32;
  if (name == "float64") return ElementType::kFloat64;
  if (name == "bfloat16") return ElementType::kBFloat16;
  if (name == "float16") return ElementType::kFloat16;
  if (name == "int32") return ElementType::kInt32;
  if (name == "int64") return ElementType::kInt64;
  throw TypeMismatch("CudaAllReduce.all_reduce: dtype must be one of float32, float64, bfloat16, float16, int32, "
                     "int64, got " + name);
}

CudaAllReduceAlgorithm algorithm_named(const std::string& name) {
  if (name == "auto") return CudaAllReduceAlgorithm::kAuto;
  if (name == "one_shot") return CudaAllReduceAlgorithm::kOneShot;
  if (name == "two_shot") return CudaAllReduceAlgorithm::kTwoShot;
  throw InvalidArgument("CudaAllReduce.all_reduce: algorithm must be one of 'auto', 'one_shot', 'two_shot', got '" +
                        name + "'");
}

}  // namespace

void bind_cuda_all_reduce(py::module_& module) {
  py::class_<CudaAllReduce> cls(module, "CudaAllReduce",
                                "All-reduce of CUDA tensors over every rank's mapped IpcMemory(device='cuda').");
  cls.def(py::init([](int rank, int world_size, int cuda_device, const std::vector<std::uintptr_t>& data,
                       const std::vector<std::uintptr_t>& barrier_in, const std::vector<std::uintptr_t>& barrier_out,
                       std::size_t data_nbytes, double timeout) {
             if (!(timeout > 0) || timeout > 1e6) {
               throw InvalidArgument("CudaAllReduce: timeout must be in (0, 1e6] seconds, got " +
                                     std::to_string(timeout));
             }
             collectives::CudaAllReducePeers peers;
             peers.rank = rank;
             peers.world_size = world_size;
             peers.cuda_device = cuda_device;
             peers.data = as_pointers(data);
             peers.barrier_in = as_pointers(barrier_in);
             peers.barrier_out = as_pointers(barrier_out);
             peers.data_nbytes = data_nbytes;
             py::gil_scoped_release released;
             return CudaAllReduce::create(peers, static_cast<uint64_t>(timeout * 1e9));
           }),
           py::kw_only(), py::arg("rank"), py::arg("world_size"), py::arg("cuda_device"), py::arg("data"),
           py::arg("barrier_in"), py::arg("barrier_out"), py::arg("data_nbytes"), py::arg("timeout"))
      .def(
          "all_reduce",
          [](CudaAllReduce& self, std::uintptr_t tensor, std::size_t count, const std::string& dtype,
             const std::string& op, const std::string& algorithm, std::uintptr_t stream) {
            const auto type = static_cast<uint32_t>(element_type_named(dtype));
            const auto reduce_op = static_cast<uint32_t>(collectives::parse_reduce_op(op));
            const CudaAllReduceAlgorithm chosen = algorithm_named(algorithm);
            py::gil_scoped_release released;
            self.all_reduce(reinterpret_cast<void*>(tensor), count, type, reduce_op, chosen,
                            reinterpret_cast<void*>(stream));
          },
          py::arg("tensor"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("algorithm"),
          py::arg("stream"), "Queues the in-place all-reduce of `count` elements at `tensor` on `stream`.")
      .def_property_readonly("status", &CudaAllReduce::status,
                             "The failure the GPU recorded (kind << 32 | peer rank), 0 for none.")
      .def("throw_if_failed", &CudaAllReduce::throw_if_failed,
           "Raises TimeoutError or ValueError naming the peer when the GPU recorded a failure.");
  cls.attr("one_shot_max_bytes") = py::int_(CudaAllReduce::kOneShotMaxBytes);
}
#else
void bind_cuda_all_reduce(py::module_&) {}
#endif

}  // namespace tensorxfer::bindings
