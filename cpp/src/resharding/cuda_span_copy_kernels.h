// The span copy kernel, as cuda_span_copy.cc launches it; compiled by nvcc
// (cuda_span_copy_kernels.cu) in builds with the CUDA kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "tensorxfer/resharding/cuda_span_copy.h"

namespace tensorxfer::resharding::cuda_kernels {

cudaError_t launch_copy_spans(const DeviceSpan* table, std::size_t count, cudaStream_t stream);

}  // namespace tensorxfer::resharding::cuda_kernels
