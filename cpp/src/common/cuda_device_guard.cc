// Compiled only with TENSORXFER_WITH_CUDA.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/common/cuda_device_guard.h"

#include <cuda_runtime_api.h>

#include <string>

#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_runtime_calls.h"

namespace tensorxfer {
namespace {

// cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active), from the driver
// through the runtime (the core never links libcuda).
using PrimaryContextState = int (*)(int, unsigned int*, int*);

PrimaryContextState primary_context_state() noexcept {
  static const PrimaryContextState function = []() -> PrimaryContextState {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t error = TENSORXFER_CUDA_CALL(
        cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &pointer, 12000, cudaEnableDefault, &found));
#else
    const cudaError_t error =
        TENSORXFER_CUDA_CALL(cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &pointer, cudaEnableDefault, &found));
#endif
    if (error != cudaSuccess) (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    if (error != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<PrimaryContextState>(pointer);
  }();
  return function;
}

}  // namespace

bool cuda_primary_context_active(int device) noexcept {
  const PrimaryContextState query = primary_context_state();
  if (query == nullptr) return true;
  unsigned int flags = 0;
  int active = 0;
  return query(device, &flags, &active) != 0 || active != 0;
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  check_cuda(TENSORXFER_CUDA_CALL(cudaGetDevice(&previous_)), "cudaGetDevice");
  if (device == previous_) return;
  // Decided before cudaSetDevice(device), which creates device's context, not previous_'s.
  const bool previous_in_use = cuda_primary_context_active(previous_);
  check_cuda(TENSORXFER_CUDA_CALL(cudaSetDevice(device)), "cudaSetDevice(" + std::to_string(device) + ")");
  restore_ = previous_in_use;
}

CudaDeviceGuard::CudaDeviceGuard(int device, std::nothrow_t) noexcept {
  if (TENSORXFER_CUDA_CALL(cudaGetDevice(&previous_)) != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    return;
  }
  if (device == previous_) return;
  const bool previous_in_use = cuda_primary_context_active(previous_);
  if (TENSORXFER_CUDA_CALL(cudaSetDevice(device)) != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    return;
  }
  restore_ = previous_in_use;
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (restore_ && TENSORXFER_CUDA_CALL(cudaSetDevice(previous_)) != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
  }
}

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
