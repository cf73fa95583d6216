#include "bindings.h"

namespace tensorxfer::bindings {

void bind_memory(py::module_& module) {}

}  // namespace tensorxfer::bindings
