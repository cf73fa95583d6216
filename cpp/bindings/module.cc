#include "bindings.h"

namespace tensorxfer::bindings {

PYBIND11_MODULE(_core, module) {
  module.doc() = "tensorxfer native core (C++); use the tensorxfer package, not this module";
  module.attr("__version__") = TENSORXFER_VERSION;
  bind_common(module);
  bind_waits(module);
  bind_memory(module);
  bind_runtime(module);
  bind_copy(module);
  bind_ipc(module);
  bind_group(module);
  bind_collectives(module);
  bind_reduce(module);
  bind_cuda(module);
  bind_cuda_all_reduce(module);
  bind_cuda_pipeline(module);
  bind_resharding(module);
}

}  // namespace tensorxfer::bindings
