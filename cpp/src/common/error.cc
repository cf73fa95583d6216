#include "tensorxfer/common/error.h"

#include <cstring>

namespace tensorxfer {

SystemError::SystemError(const std::string& what_failed, int error_number)
    : Error(what_failed + ": " + std::strerror(error_number) + " (errno " +
            std::to_string(error_number) + ")"),
      error_number_(error_number) {}

void throw_system_error(const std::string& what_failed) {
  throw SystemError(what_failed, errno);
}

}  // namespace tensorxfer
