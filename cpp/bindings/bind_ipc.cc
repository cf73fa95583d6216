#include "bindings.h"

namespace tensorxfer::bindings {

void bind_ipc(py::module_& module) {}

}  // namespace tensorxfer::bindings
