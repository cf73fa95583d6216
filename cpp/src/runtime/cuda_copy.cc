// Compiled only with TENSORXFER_WITH_CUDA: builds without CUDA have no submitter.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/runtime/cuda_copy.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::runtime {
namespace {

// Makes `device` current for the scope (streams and events belong to a device),
// restoring the previous one after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(TENSORXFER_CUDA_CALL(cudaGetDevice(&previous_)), "cudaGetDevice");
    if (device != previous_) check_cuda(TENSORXFER_CUDA_CALL(cudaSetDevice(device)), "cudaSetDevice");
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() { (void)TENSORXFER_CUDA_CALL(cudaSetDevice(previous_)); }

 private:
  int previous_ = 0;
};

}  // namespace

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
  DeviceScope scope(device);
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
  DeviceScope scope(device_);
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
  DeviceScope scope(device_);
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                                                  static_cast<cudaStream_t>(stream))),
             "copy_host_to_device: cudaMemcpyAsync");
}

}  // namespace tensorxfer::runtime

#endif  // TENSORXFER_WITH_CUDA
