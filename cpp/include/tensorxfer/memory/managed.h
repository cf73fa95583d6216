// CUDA managed (unified) memory: allocation with cudaMallocManaged, prefetch
// and placement advice, and the checks that say whether they can work here.
// Compiled against the CUDA runtime when the build has TENSORXFER_WITH_CUDA;
// otherwise every call that needs CUDA throws Unsupported saying so.
//
// Device ids follow CUDA: -1 (cudaCpuDeviceId) is the CPU, >= 0 a GPU ordinal.
// CUDA failures become Unsupported (no driver, no device) or InvalidArgument
// (bad pointer, bad device) carrying cudaGetErrorString's text.
// `stream` is a cudaStream_t passed as void* so this header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <string>

namespace tensorxfer::memory::managed {

inline constexpr int kCpuDeviceId = -1;

// What the CUDA runtime reports on this machine. Never throws.
struct CudaStatus {
  bool compiled = false;  // this build links the CUDA runtime
  int runtime_version = 0;  // CUDART_VERSION the build was compiled against (0 without CUDA)
  int device_count = 0;     // 0 when the runtime reports an error
  std::string reason;       // why device_count is 0 ("" otherwise)
};
CudaStatus cuda_status() noexcept;

// Throws Unsupported (with cuda_status().reason) unless GPU `device` exists.
void require_gpu(int device, const char* operation);

// Whether `device` can access managed memory concurrently with the CPU
// (cudaDevAttrConcurrentManagedAccess). Throws Unsupported without that device.
bool concurrent_managed_access(int device);

// Whether `pointer` is managed memory (cudaPointerGetAttributes type Managed).
// False for host or unregistered pointers and when CUDA is unavailable. Never throws.
bool is_managed_pointer(const void* pointer) noexcept;

// cudaMallocManaged(bytes, cudaMemAttachGlobal) with `device` current (when >= 0).
// Returns nullptr for bytes == 0. Throws Unsupported / SystemError(ENOMEM).
void* allocate(std::size_t bytes, int device);
// cudaFree; a nullptr is ignored. Returns the CUDA error text ("" on success).
std::string release(void* pointer) noexcept;

// cudaMemPrefetchAsync of [pointer, pointer + bytes) to `device` (-1: CPU) on
// `stream`. The pointer must be managed (InvalidArgument otherwise); bytes == 0
// is a no-op. A GPU `device` without concurrent managed access is Unsupported.
// Uses the cudaMemLocation form on CUDA 13+, the device-id form before.
void prefetch(const void* pointer, std::size_t bytes, int device, void* stream);

// cudaMemAdviseSetPreferredLocation for `device` (-1: CPU).
void advise_preferred_location(const void* pointer, std::size_t bytes, int device);

// cudaMemAdviseSetAccessedBy for GPU `device`; `device` must be >= 0
// (InvalidArgument otherwise, as the CPU always maps managed memory).
void advise_accessed_by(const void* pointer, std::size_t bytes, int device);

}  // namespace tensorxfer::memory::managed
