// The one mapping from CUDA runtime errors onto the tensorxfer error hierarchy
// (builds with TENSORXFER_WITH_CUDA only).
#pragma once

#ifdef TENSORXFER_WITH_CUDA

#include <cuda_runtime_api.h>

#include <string>

namespace tensorxfer {

// "message (cudaErrorName)" of a CUDA error; counted as runtime calls.
std::string describe_cuda_error(cudaError_t error);

// Does nothing for cudaSuccess. Otherwise clears the runtime's last error and
// throws "<call> failed: <message> (<name>)" as: InvalidArgument (invalid value,
// device, pointer, handle or copy direction), SystemError ENOMEM (allocation),
// Unsupported (no device, old driver, not supported, stub library, ...), else Error.
void check_cuda(cudaError_t error, const std::string& call);

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
