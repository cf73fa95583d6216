// Compiled only with TENSORXFER_WITH_CUDA.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/common/cuda_check.h"

#include <cerrno>

#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer {

namespace {

// "13.0" for 13000.
std::string cuda_version_name(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace

bool is_driver_mismatch(cudaError_t error) noexcept {
  return error == cudaErrorInsufficientDriver || error == cudaErrorSystemNotReady ||
         error == cudaErrorSystemDriverMismatch || error == cudaErrorCompatNotSupportedOnDevice;
}

std::string cuda_versions_text() {
  int driver = 0;
  const cudaError_t error = TENSORXFER_CUDA_CALL(cudaDriverGetVersion(&driver));
  std::string text;
  if (error != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    text = "the driver version is unknown (cudaDriverGetVersion failed)";
  } else if (driver == 0) {
    text = "no CUDA driver is installed (cudaDriverGetVersion: 0)";
  } else {
    text = "the driver supports CUDA " + cuda_version_name(driver) + " (cudaDriverGetVersion: " +
           std::to_string(driver) + ")";
  }
  return text + ", tensorxfer's runtime is CUDA " + cuda_version_name(CUDART_VERSION) + " (CUDART_VERSION " +
         std::to_string(CUDART_VERSION) + ")";
}

std::string describe_cuda_error(cudaError_t error) {
  std::string text = std::string(TENSORXFER_CUDA_CALL(cudaGetErrorString(error))) + " (" +
                     TENSORXFER_CUDA_CALL(cudaGetErrorName(error)) + ")";
  if (is_driver_mismatch(error)) text += ": " + cuda_versions_text();
  return text;
}

void check_cuda(cudaError_t error, const std::string& call) {
  if (error == cudaSuccess) return;
  (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
  const std::string message = call + " failed: " + describe_cuda_error(error);
  switch (error) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection:
      throw InvalidArgument(message);
    case cudaErrorMemoryAllocation:
      throw SystemError(message, ENOMEM);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorSystemNotReady:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
      throw Unsupported(message);
    default:
      throw Error(message);
  }
}

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
