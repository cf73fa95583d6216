#include "bindings.h"

namespace tensorxfer::bindings {

void bind_runtime(py::module_& module) {}

}  // namespace tensorxfer::bindings
