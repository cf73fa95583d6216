// The one mapping from CUDA runtime errors onto the tensorxfer error hierarchy
// (builds with TENSORXFER_WITH_CUDA only).
#pragma once

#ifdef TENSORXFER_WITH_CUDA

#include <cuda_runtime_api.h>

#include <string>

namespace tensorxfer {

// "message (cudaErrorName)" of a CUDA error; counted as runtime calls. For the
// errors that mean the driver cannot run this runtime (is_driver_mismatch), the
// text also names both versions (cuda_versions_text).
std::string describe_cuda_error(cudaError_t error);

// True for the errors a driver too old (or otherwise unfit) for the runtime this
// build links gives on every call: insufficient driver (35), system not ready
// (802), system driver mismatch (803), forward compatibility unsupported (804).
bool is_driver_mismatch(cudaError_t error) noexcept;

// "the driver supports CUDA 12.2 (cudaDriverGetVersion: 12020), tensorxfer's runtime
// is CUDA 13.0 (CUDART_VERSION 13000)". Never throws for a version query failure.
std::string cuda_versions_text();

// Does nothing for cudaSuccess. Otherwise clears the runtime's last error and
// throws "<call> failed: <message> (<name>)" as: InvalidArgument (invalid value,
// device, pointer, handle or copy direction), SystemError ENOMEM (allocation),
// Unsupported (no device, driver mismatch with both versions named, not
// supported, stub library, ...), else Error.
void check_cuda(cudaError_t error, const std::string& call);

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
