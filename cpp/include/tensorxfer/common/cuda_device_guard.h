// The one guard that makes a GPU current for a scope (builds with TENSORXFER_WITH_CUDA only).
#pragma once

#ifdef TENSORXFER_WITH_CUDA

#include <new>

namespace tensorxfer {

// Makes GPU `device` current on the calling thread for the scope. On exit the
// previous device is made current again only when that device already has a
// primary context: cudaGetDevice reports 0 on a thread that never chose a
// device, and setting 0 back would create a context (hundreds of MiB) on GPU 0
// for work that ran on GPU N. Where the driver cannot say (no
// cuDevicePrimaryCtxGetState entry point), the previous device is restored.
// Throws like check_cuda when `device` cannot be made current.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  // For release paths: when `device` cannot be made current, the error is cleared
  // and the scope runs on the current device (nothing is restored).
  CudaDeviceGuard(int device, std::nothrow_t) noexcept;
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  ~CudaDeviceGuard();

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Whether GPU `device`'s primary context exists (true when the driver cannot say). Never throws.
bool cuda_primary_context_active(int device) noexcept;

}  // namespace tensorxfer

#endif  // TENSORXFER_WITH_CUDA
