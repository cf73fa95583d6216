// Memory layer: host advice and NUMA placement, the host pool, CUDA managed
// memory, and the plain C allocator entry points torch's
// CUDAPluggableAllocator loads from this extension library.
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <pybind11/stl.h>

#include "bindings.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"
#include "tensorxfer/memory/host_pool.h"
#include "tensorxfer/memory/managed.h"
#include "tensorxfer/memory/numa.h"

#ifdef TENSORXFER_WITH_CUDA
#include <cuda_runtime_api.h>
using TensorxferStream = cudaStream_t;
#else
using TensorxferStream = void*;
#endif

namespace {

// The last allocator failure on this thread (the C entry points cannot throw).
thread_local std::string uvm_last_error;

}  // namespace

// Entry points with the signatures torch.cuda.memory.CUDAPluggableAllocator
// expects (alloc: void*(size_t, int, cudaStream_t); free: void(void*, size_t,
// int, cudaStream_t)). Exported from the extension library despite pybind11's
// -fvisibility=hidden. They never throw: a failed malloc returns nullptr and
// tensorxfer_uvm_last_error() says why.
extern "C" {

__attribute__((visibility("default"))) void* tensorxfer_uvm_malloc(std::size_t size, int device,
                                                                    TensorxferStream stream) {
  (void)stream;  // cudaMallocManaged memory is not stream-ordered
  try {
    void* pointer = tensorxfer::memory::managed::allocate(size, device);
    uvm_last_error.clear();
    return pointer;
  } catch (const std::exception& error) {
    try {
      uvm_last_error = error.what();
    } catch (...) {
    }
    return nullptr;
  }
}

__attribute__((visibility("default"))) void tensorxfer_uvm_free(void* pointer, std::size_t size, int device,
                                                                TensorxferStream stream) {
  (void)size;
  (void)device;
  (void)stream;
  std::string error = tensorxfer::memory::managed::release(pointer);
  if (!error.empty()) uvm_last_error = std::move(error);
}

// The reason of this thread's last failed tensorxfer_uvm_malloc / _free ("" if none).
__attribute__((visibility("default"))) const char* tensorxfer_uvm_last_error() {
  return uvm_last_error.c_str();
}

}  // extern "C"

namespace tensorxfer::bindings {
namespace {

namespace managed = memory::managed;

// The Python handle of a pool: closing it (or dropping it) stops caching and
// frees the cache; blocks still alive keep their memory until they go.
struct PyHostPool {
  std::shared_ptr<memory::HostPool> pool;
  PyHostPool(const PyHostPool&) = delete;
  PyHostPool& operator=(const PyHostPool&) = delete;
  explicit PyHostPool(std::shared_ptr<memory::HostPool> created) : pool(std::move(created)) {}
  ~PyHostPool() {
    if (pool) pool->close();
  }
};

memory::PopulateMethod populate_method_from_name(const std::string& name) {
  if (name == "auto") return memory::PopulateMethod::kAuto;
  if (name == "madvise_populate") return memory::PopulateMethod::kMadvisePopulate;
  if (name == "touch") return memory::PopulateMethod::kTouch;
  throw InvalidArgument("populate method must be 'auto', 'madvise_populate' or 'touch', got '" + name + "'");
}

py::dict stats_dict(const memory::HostPoolStats& stats) {
  py::dict result;
  result["live_blocks"] = stats.live_blocks;
  result["live_bytes"] = stats.live_bytes;
  result["cached_blocks"] = stats.cached_blocks;
  result["cached_bytes"] = stats.cached_bytes;
  result["mapped_blocks"] = stats.mapped_blocks;
  result["reused_blocks"] = stats.reused_blocks;
  result["hugetlb_blocks"] = stats.hugetlb_blocks;
  result["transparent_blocks"] = stats.transparent_blocks;
  result["locked_blocks"] = stats.locked_blocks;
  result["lock_failures"] = stats.lock_failures;
  result["last_lock_error"] = stats.last_lock_error;
  result["last_huge_pages_note"] = stats.last_huge_pages_note;
  result["closed"] = stats.closed;
  return result;
}

void bind_host_advice(py::module_& module) {
  module.def("page_size", &memory::page_size, "The system page size in bytes.");
  module.def("huge_page_size", &memory::huge_page_size, "The default huge page size in bytes.");
  module.def(
      "populate_host_pages",
      [](const PyTensorView& tensor, const std::string& argument, const std::string& method) {
        const memory::PopulateMethod chosen = populate_method_from_name(method);
        memory::PopulateResult result;
        {
          py::gil_scoped_release released;
          result = memory::populate_pages(tensor.view, argument.c_str(), chosen);
        }
        py::dict out;
        out["method"] = memory::populate_method_name(result.method);
        out["bytes"] = result.bytes;
        out["pages"] = result.pages;
        out["will_need_hinted"] = result.will_need_hinted;
        return out;
      },
      py::arg("view"), py::arg("argument"), py::arg("method") = "auto",
      "Prefault every page the view covers (MADV_POPULATE_*, else touching) and hint MADV_WILLNEED.");
  module.def(
      "resident_page_count",
      [](const PyTensorView& tensor, const std::string& argument) {
        return memory::resident_page_count(tensor.view, argument.c_str());
      },
      py::arg("view"), py::arg("argument"), "Pages of the view resident in RAM now (mincore).");
}

void bind_numa(py::module_& module) {
  module.def("numa_supported", &memory::numa_supported);
  module.def("numa_unsupported_reason", &memory::numa_unsupported_reason);
  module.def("numa_nodes_with_memory", &memory::numa_nodes_with_memory);
  module.def("current_numa_node", &memory::current_numa_node);
  module.def(
      "numa_online_nodes",
      [](const std::string& root) {
        py::list out;
        for (const memory::NumaNode& node : memory::numa_online_nodes(root)) {
          py::dict entry;
          entry["id"] = node.id;
          entry["cpus"] = node.cpus;
          entry["memory_bytes"] = node.memory_bytes;
          out.append(entry);
        }
        return out;
      },
      py::arg("root") = "/sys/devices/system/node",
      "The online NUMA nodes in sysfs: [{'id', 'cpus', 'memory_bytes'}] (empty without the directory).");
  module.def(
      "probe_numa_system_calls",
      [] {
        py::list out;
        for (const memory::NumaSystemCallProbe& probe : memory::probe_numa_system_calls()) {
          py::dict entry;
          entry["name"] = probe.name;
          entry["permitted"] = probe.permitted;
          entry["errno"] = probe.error_number;
          entry["detail"] = probe.detail;
          out.append(entry);
        }
        return out;
      },
      "Tries get_mempolicy, set_mempolicy, mbind and move_pages now: [{'name', 'permitted', 'errno', 'detail'}].");
  module.def(
      "bind_to_numa_node",
      [](const PyTensorView& tensor, const std::string& argument, int node) {
        py::gil_scoped_release released;
        memory::bind_to_numa_node(tensor.view, argument.c_str(), node);
      },
      py::arg("view"), py::arg("argument"), py::arg("node"));
  module.def(
      "prefer_local_numa_node",
      [](const PyTensorView& tensor, const std::string& argument) {
        return memory::prefer_local_numa_node(tensor.view, argument.c_str());
      },
      py::arg("view"), py::arg("argument"));
  module.def(
      "numa_nodes_of",
      [](const PyTensorView& tensor, const std::string& argument) {
        return memory::numa_nodes_of(tensor.view, argument.c_str());
      },
      py::arg("view"), py::arg("argument"));
  module.def(
      "numa_policy_of",
      [](const PyTensorView& tensor, const std::string& argument) {
        const memory::NumaPolicy policy = memory::numa_policy_of(tensor.view, argument.c_str());
        py::dict out;
        out["mode"] = policy.mode;
        out["nodes"] = policy.nodes;
        return out;
      },
      py::arg("view"), py::arg("argument"));
}

void bind_host_pool(py::module_& module) {
  py::class_<memory::HostBlock>(module, "HostBlock", py::buffer_protocol(),
                                "Page-aligned host memory on loan from a HostPool (a writable uint8 buffer).")
      .def_buffer([](memory::HostBlock& block) {
        return py::buffer_info(block.data(), 1, py::format_descriptor<unsigned char>::format(), 1,
                               {static_cast<py::ssize_t>(block.size())}, {py::ssize_t{1}}, false);
      })
      .def_property_readonly("nbytes", &memory::HostBlock::size)
      .def_property_readonly("data_ptr",
                             [](const memory::HostBlock& b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
      .def_property_readonly("mapped_bytes", [](const memory::HostBlock& b) { return b.region().mapped_bytes(); })
      .def_property_readonly("huge_pages",
                             [](const memory::HostBlock& b) { return memory::huge_pages_name(b.region().huge_pages()); })
      .def_property_readonly("huge_pages_note", [](const memory::HostBlock& b) { return b.region().huge_pages_note(); })
      .def_property_readonly("locked", [](const memory::HostBlock& b) { return b.region().locked(); })
      .def_property_readonly("lock_error", [](const memory::HostBlock& b) { return b.region().lock_error(); })
      .def_property_readonly("reused", &memory::HostBlock::reused)
      .def("__repr__", [](const memory::HostBlock& b) {
        return "HostBlock(nbytes=" + std::to_string(b.size()) + ", mapped_bytes=" +
               std::to_string(b.region().mapped_bytes()) + ", huge_pages=" +
               memory::huge_pages_name(b.region().huge_pages()) + ", locked=" +
               (b.region().locked() ? "True" : "False") + ")";
      });

  py::class_<PyHostPool>(module, "HostPool", "Native pool of page-aligned host blocks.")
      .def(py::init([](bool huge_pages, bool lock_pages, int numa_node, std::size_t max_cached_bytes) {
             memory::HostPoolOptions options;
             options.region.huge_pages = huge_pages;
             options.region.lock_pages = lock_pages;
             options.region.numa_node = numa_node;
             options.max_cached_bytes = max_cached_bytes;
             return std::make_unique<PyHostPool>(memory::HostPool::create(options));
           }),
           py::kw_only(), py::arg("huge_pages") = false, py::arg("lock_pages") = false,
           py::arg("numa_node") = -1, py::arg("max_cached_bytes") = std::size_t{256} << 20)
      .def(
          "allocate",
          [](PyHostPool& self, std::size_t nbytes) {
            std::shared_ptr<memory::HostPool> pool = self.pool;
            py::gil_scoped_release released;
            return std::make_unique<memory::HostBlock>(pool->allocate(nbytes));
          },
          py::arg("nbytes"))
      .def("stats", [](const PyHostPool& self) { return stats_dict(self.pool->stats()); })
      .def("release_cached", [](PyHostPool& self) { self.pool->release_cached(); })
      .def("close", [](PyHostPool& self) { self.pool->close(); })
      .def_property_readonly("closed", [](const PyHostPool& self) { return self.pool->stats().closed; })
      .def_property_readonly("huge_pages", [](const PyHostPool& self) { return self.pool->options().region.huge_pages; })
      .def_property_readonly("lock_pages", [](const PyHostPool& self) { return self.pool->options().region.lock_pages; })
      .def_property_readonly("numa_node", [](const PyHostPool& self) { return self.pool->options().region.numa_node; })
      .def_property_readonly("max_cached_bytes",
                             [](const PyHostPool& self) { return self.pool->options().max_cached_bytes; });
}

void bind_managed(py::module_& module) {
  module.def("cuda_status", [] {
    const managed::CudaStatus status = managed::cuda_status();
    py::dict out;
    out["compiled"] = status.compiled;
    out["runtime_version"] = status.runtime_version;
    out["device_count"] = status.device_count;
    out["reason"] = status.reason;
    return out;
  });
  module.def("cuda_concurrent_managed_access", &managed::concurrent_managed_access, py::arg("device"));
  module.def(
      "cuda_is_managed_pointer",
      [](std::uintptr_t pointer) { return managed::is_managed_pointer(reinterpret_cast<const void*>(pointer)); },
      py::arg("pointer"));
  module.def(
      "managed_prefetch",
      [](const PyTensorView& tensor, const std::string& argument, int device, std::uintptr_t stream) {
        require_contiguous(tensor.view, argument.c_str());
        py::gil_scoped_release released;
        managed::prefetch(tensor.view.data, tensor.view.nbytes(), device, reinterpret_cast<void*>(stream));
      },
      py::arg("view"), py::arg("argument"), py::arg("device"), py::arg("stream") = 0);
  module.def(
      "managed_advise_preferred_location",
      [](const PyTensorView& tensor, const std::string& argument, int device) {
        require_contiguous(tensor.view, argument.c_str());
        py::gil_scoped_release released;  // cudaMemAdvise blocks
        managed::advise_preferred_location(tensor.view.data, tensor.view.nbytes(), device);
      },
      py::arg("view"), py::arg("argument"), py::arg("device"));
  module.def(
      "managed_advise_accessed_by",
      [](const PyTensorView& tensor, const std::string& argument, int device) {
        require_contiguous(tensor.view, argument.c_str());
        py::gil_scoped_release released;  // cudaMemAdvise blocks
        managed::advise_accessed_by(tensor.view.data, tensor.view.nbytes(), device);
      },
      py::arg("view"), py::arg("argument"), py::arg("device"));
  module.attr("uvm_malloc_symbol") = "tensorxfer_uvm_malloc";
  module.attr("uvm_free_symbol") = "tensorxfer_uvm_free";
  module.attr("uvm_last_error_symbol") = "tensorxfer_uvm_last_error";
}

}  // namespace

void bind_memory(py::module_& module) {
  bind_host_advice(module);
  bind_numa(module);
  bind_host_pool(module);
  bind_managed(module);
}

}  // namespace tensorxfer::bindings
