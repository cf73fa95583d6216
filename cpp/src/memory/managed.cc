#include "tensorxfer/memory/managed.h"

#include <cerrno>
#include <string>

#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_device_guard.h"
#include "tensorxfer/common/error.h"

#ifdef TENSORXFER_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tensorxfer::memory::managed {
namespace {

#ifdef TENSORXFER_WITH_CUDA

#if CUDART_VERSION >= 13000
cudaMemLocation location_of(int device) {
  cudaMemLocation location{};
  location.type = device == kCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  location.id = device == kCpuDeviceId ? 0 : device;
  return location;
}
#endif

#endif  // TENSORXFER_WITH_CUDA

// Throws Unsupported unless the runtime sees at least one GPU.
void require_cuda(const char* operation) {
  const CudaStatus status = cuda_status();
  if (status.device_count == 0) {
    throw Unsupported(std::string(operation) + ": CUDA managed memory is unavailable: " + status.reason);
  }
}

// Rejects ids that are never valid: below -1, or -1 where only a GPU makes sense.
void check_device_id(int device, const char* operation, bool allow_cpu) {
  if (device == kCpuDeviceId && allow_cpu) return;
  if (device < 0) {
    throw InvalidArgument(std::string(operation) + ": device must be " +
                          (allow_cpu ? "-1 (the CPU) or a GPU id >= 0" : "a GPU id >= 0") + ", got " +
                          std::to_string(device));
  }
}

// Checks that CUDA works and that a GPU `device` (when not the CPU) exists.
void require_target(int device, const char* operation) {
  require_cuda(operation);
  if (device != kCpuDeviceId) require_gpu(device, operation);
}

void require_managed(const void* pointer, const char* operation) {
  if (!is_managed_pointer(pointer)) {
    throw InvalidArgument(std::string(operation) +
                          ": the tensor is not CUDA managed memory (allocate it from "
                          "create_unified_mempool())");
  }
}

}  // namespace

CudaStatus cuda_status() noexcept {
  CudaStatus status;
#ifdef TENSORXFER_WITH_CUDA
  status.compiled = true;
  status.runtime_version = CUDART_VERSION;
  int count = 0;
  const cudaError_t error = TENSORXFER_CUDA_CALL(cudaGetDeviceCount(&count));
  if (error != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    status.reason = "cudaGetDeviceCount failed: " + describe_cuda_error(error);
  } else if (count == 0) {
    status.reason = "cudaGetDeviceCount reports no CUDA device";
  } else {
    status.device_count = count;
  }
#else
  status.reason = "this build of tensorxfer has no CUDA (rebuild with the CUDA toolkit and "
                  "-DTENSORXFER_WITH_CUDA=ON)";
#endif
  return status;
}

void require_gpu(int device, const char* operation) {
  const CudaStatus status = cuda_status();
  if (status.device_count == 0) {
    throw Unsupported(std::string(operation) + ": GPU device " + std::to_string(device) +
                      " was requested but no CUDA device is usable: " + status.reason);
  }
  if (device < 0 || device >= status.device_count) {
    throw InvalidArgument(std::string(operation) + ": device must be in [0, " +
                          std::to_string(status.device_count) + ") (the GPUs present), got " +
                          std::to_string(device));
  }
}

bool concurrent_managed_access(int device) {
  require_gpu(device, "concurrent_managed_access");
#ifdef TENSORXFER_WITH_CUDA
  int value = 0;
  check_cuda(TENSORXFER_CUDA_CALL(cudaDeviceGetAttribute(&value, cudaDevAttrConcurrentManagedAccess, device)),
             "cudaDeviceGetAttribute(cudaDevAttrConcurrentManagedAccess)");
  return value != 0;
#else
  return false;
#endif
}

bool is_managed_pointer(const void* pointer) noexcept {
#ifdef TENSORXFER_WITH_CUDA
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  const cudaError_t error = TENSORXFER_CUDA_CALL(cudaPointerGetAttributes(&attributes, pointer));
  if (error != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    return false;
  }
  return attributes.type == cudaMemoryTypeManaged;
#else
  (void)pointer;
  return false;
#endif
}

void* allocate(std::size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  check_device_id(device, "managed allocate", true);
  require_target(device, "managed allocate");
#ifdef TENSORXFER_WITH_CUDA
  void* pointer = nullptr;
  if (device >= 0) {
    CudaDeviceGuard guard(device);
    check_cuda(TENSORXFER_CUDA_CALL(cudaMallocManaged(&pointer, bytes, cudaMemAttachGlobal)),
               "cudaMallocManaged(" + std::to_string(bytes) + " bytes)");
  } else {
    check_cuda(TENSORXFER_CUDA_CALL(cudaMallocManaged(&pointer, bytes, cudaMemAttachGlobal)),
               "cudaMallocManaged(" + std::to_string(bytes) + " bytes)");
  }
  return pointer;
#else
  return nullptr;
#endif
}

std::string release(void* pointer) noexcept {
#ifdef TENSORXFER_WITH_CUDA
  if (pointer == nullptr) return "";
  const cudaError_t error = TENSORXFER_CUDA_CALL(cudaFree(pointer));
  if (error == cudaSuccess) return "";
  (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
  try {
    return "cudaFree failed: " + describe_cuda_error(error);
  } catch (...) {
    return "cudaFree failed";
  }
#else
  return pointer == nullptr ? "" : "cudaFree: this build has no CUDA";
#endif
}

void prefetch(const void* pointer, std::size_t bytes, int device, void* stream) {
  check_device_id(device, "prefetch_managed_tensor", true);
  if (bytes == 0) return;
  require_target(device, "prefetch_managed_tensor");
  require_managed(pointer, "prefetch_managed_tensor");
  // Without concurrent managed access (Windows, some Tegra and virtualised GPUs) a GPU
  // prefetch fails with "invalid device": say what is missing instead.
  if (device != kCpuDeviceId && !concurrent_managed_access(device)) {
    throw Unsupported("prefetch_managed_tensor: GPU " + std::to_string(device) +
                      " has no concurrent managed access (cudaDevAttrConcurrentManagedAccess is 0), "
                      "so managed memory cannot be prefetched to it");
  }
#ifdef TENSORXFER_WITH_CUDA
  auto cuda_stream = static_cast<cudaStream_t>(stream);
#if CUDART_VERSION >= 13000
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemPrefetchAsync(pointer, bytes, location_of(device), 0, cuda_stream)),
             "cudaMemPrefetchAsync");
#else
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemPrefetchAsync(pointer, bytes, device, cuda_stream)),
             "cudaMemPrefetchAsync");
#endif
#else
  (void)stream;
#endif
}

namespace {

enum class Advice { kPreferredLocation, kAccessedBy };

// The one body of both advise calls: validates like the reference (accessed-by
// needs a GPU id, preferred location also takes -1), then cudaMemAdvise in the
// CUDA 13 cudaMemLocation form or the older device-id form.
void apply_advice(const void* pointer, std::size_t bytes, int device, Advice advice, const char* api) {
  const bool preferred = advice == Advice::kPreferredLocation;
  check_device_id(device, api, preferred);
  if (bytes == 0) return;
  require_target(device, api);
  require_managed(pointer, api);
#ifdef TENSORXFER_WITH_CUDA
  const cudaMemoryAdvise cuda_advice =
      preferred ? cudaMemAdviseSetPreferredLocation : cudaMemAdviseSetAccessedBy;
  const char* call = preferred ? "cudaMemAdvise(cudaMemAdviseSetPreferredLocation)"
                               : "cudaMemAdvise(cudaMemAdviseSetAccessedBy)";
#if CUDART_VERSION >= 13000
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemAdvise(pointer, bytes, cuda_advice, location_of(device))), call);
#else
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemAdvise(pointer, bytes, cuda_advice, device)), call);
#endif
#endif
}

}  // namespace

void advise_preferred_location(const void* pointer, std::size_t bytes, int device) {
  apply_advice(pointer, bytes, device, Advice::kPreferredLocation,
               "advise_managed_tensor_preferred_location");
}

void advise_accessed_by(const void* pointer, std::size_t bytes, int device) {
  apply_advice(pointer, bytes, device, Advice::kAccessedBy, "advise_managed_tensor_accessed_by");
}

}  // namespace tensorxfer::memory::managed
