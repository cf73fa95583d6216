// The host side of cuda_span_copy.h: argument checks, the device guard, and
// the launch of cuda_span_copy_kernels.cu. Builds with CUDA only.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/resharding/cuda_span_copy.h"

#include <cuda_runtime_api.h>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_device_guard.h"
#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

#ifdef TENSORXFER_WITH_CUDA_KERNELS
#include "cuda_span_copy_kernels.h"
#endif

namespace tensorxfer::resharding {

void copy_spans_async(const DeviceSpan* table, std::size_t count, int cuda_device, void* stream) {
  if (count == 0) return;
  TENSORXFER_CHECK(InvalidArgument, table != nullptr, "copy_spans_async: the span table's address is null");
#ifndef TENSORXFER_WITH_CUDA_KERNELS
  (void)cuda_device;
  (void)stream;
  throw Unsupported(
      "the CUDA pipeline executor: this build of tensorxfer has no CUDA kernels (no CUDA compiler, nvcc, when it "
      "was built, or the fake CUDA runtime)");
#else
  CudaDeviceGuard guard(cuda_device);
  check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_copy_spans(table, count, static_cast<cudaStream_t>(stream))),
             "the span copy kernel");
#endif
}

void put_async(void* destination, const void* source, std::size_t nbytes, int cuda_device, void* stream) {
  if (nbytes == 0) return;
  TENSORXFER_CHECK(InvalidArgument, destination != nullptr && source != nullptr,
                   "put_async: a null address (destination ", destination, ", source ", source, ")");
  CudaDeviceGuard guard(cuda_device);
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpyAsync(destination, source, nbytes, cudaMemcpyDeviceToDevice,
                                                  static_cast<cudaStream_t>(stream))),
             "cudaMemcpyAsync(put into the peer's receive slot)");
}

}  // namespace tensorxfer::resharding

#endif  // TENSORXFER_WITH_CUDA
