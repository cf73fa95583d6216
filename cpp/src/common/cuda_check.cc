// Compiled only with TENSORXFER_WITH_CUDA.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/common/cuda_check.h"

#include <cerrno>

#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer {

std::string describe_cuda_error(cudaError_t error) {
  return std::string(TENSORXFER_CUDA_CALL(cudaGetErrorString(error))) + " (" +
         TENSORXFER_CUDA_CALL(cudaGetErrorName(error)) + ")";
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
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
      throw Unsupported(message);
    default:
      throw Error(message);
  }
}

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
