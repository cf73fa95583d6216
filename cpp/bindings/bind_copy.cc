#include "bindings.h"

namespace tensorxfer::bindings {

void bind_copy(py::module_& module) {}

}  // namespace tensorxfer::bindings
