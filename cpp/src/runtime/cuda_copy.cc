// Compiled only with TENSORXFER_WITH_CUDA: builds without CUDA have no submitter.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/runtime/cuda_copy.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_device_guard.h"
#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::runtime {

CudaCopySubmitter CudaCopySubmitter::create(int device) {
  if (device < 0) {
    throw InvalidArgument("CudaCopySubmitter: device must be a GPU id >= 0, got " + std::to_string(device));
  }
  int count = 0;
  check_cuda(TENSORXFER_CUDA_CALL(cudaGetDeviceCount(&count)), "CudaCopySubmitter: cudaGetDeviceCount");
  if (device >= count) {
    throw InvalidArgument("CudaCopySubmitter: device must be in [0, " + std::to_string(count) +
                          ") (the GPUs present), got " + std::to_string(device));
  }
  CudaDeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  check_cuda(TENSORXFER_CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)),
             "CudaCopySubmitter: cudaEventCreateWithFlags");
  return CudaCopySubmitter(device, event);
}

CudaCopySubmitter::CudaCopySubmitter(CudaCopySubmitter&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

CudaCopySubmitter& CudaCopySubmitter::operator=(CudaCopySubmitter&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaCopySubmitter::~CudaCopySubmitter() { release(); }

void CudaCopySubmitter::release() noexcept {
  if (event_ == nullptr) return;
  // A destroyed event that work still waits on is released once that work completes (CUDA semantics).
  if (TENSORXFER_CUDA_CALL(cudaEventDestroy(static_cast<cudaEvent_t>(event_))) != cudaSuccess) {
    (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
  }
  event_ = nullptr;
}

void CudaCopySubmitter::order_after(void* stream, void* waited_stream) {
  if (stream == waited_stream) return;
  if (event_ == nullptr) throw InvalidArgument("CudaCopySubmitter: used after being moved from");
  CudaDeviceGuard guard(device_);
  auto event = static_cast<cudaEvent_t>(event_);
  // The wait captures the event's state at this call, so reusing one event for every order_after is safe.
  check_cuda(TENSORXFER_CUDA_CALL(cudaEventRecord(event, static_cast<cudaStream_t>(waited_stream))),
             "order_after: cudaEventRecord on the waited stream");
  check_cuda(TENSORXFER_CUDA_CALL(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event, 0)),
             "order_after: cudaStreamWaitEvent");
}

void CudaCopySubmitter::copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes,
                                            void* stream) {
  if (bytes == 0) return;
  if (device_dst == nullptr || host_src == nullptr) {
    throw InvalidArgument("copy_host_to_device: dst and src must not be null for a copy of " +
                          std::to_string(bytes) + " bytes");
  }
  CudaDeviceGuard guard(device_);
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                                                  static_cast<cudaStream_t>(stream))),
             "copy_host_to_device: cudaMemcpyAsync");
}

namespace {

// Whether the byte at `pointer` is page-locked host memory (registered or cudaHostAlloc'ed).
bool is_pinned_byte(const void* pointer) {
  cudaPointerAttributes attributes{};
  check_cuda(TENSORXFER_CUDA_CALL(cudaPointerGetAttributes(&attributes, pointer)), "cudaPointerGetAttributes");
  return attributes.type == cudaMemoryTypeHost;
}

}  // namespace

bool register_host_memory(void* pointer, std::size_t bytes, int device) {
  if (pointer == nullptr || bytes == 0) {
    throw InvalidArgument("register_host_memory: need a non-null pointer and bytes > 0, got " +
                          std::to_string(bytes) + " bytes");
  }
  CudaDeviceGuard guard(device);
  const bool first = is_pinned_byte(pointer);
  const bool last = is_pinned_byte(static_cast<const char*>(pointer) + bytes - 1);
  if (first && last) return false;
  if (first || last) {
    throw InvalidArgument("register_host_memory: " + std::to_string(bytes) + " bytes are pinned only in part (" +
                          (first ? "the first" : "the last") +
                          " byte is, the other end is not); cudaHostRegister would refuse the overlap");
  }
  check_cuda(TENSORXFER_CUDA_CALL(cudaHostRegister(pointer, bytes, cudaHostRegisterDefault)),
             "cudaHostRegister(" + std::to_string(bytes) + " bytes)");
  return true;
}

void unregister_host_memory(void* pointer, int device) {
  CudaDeviceGuard guard(device);
  check_cuda(TENSORXFER_CUDA_CALL(cudaHostUnregister(pointer)), "cudaHostUnregister");
}

}  // namespace tensorxfer::runtime

#endif  // TENSORXFER_WITH_CUDA
