// Host-to-device copies issued natively on CUDA streams the caller owns (torch's
// streams, passed as their raw cudaStream_t handles): the replay CUDA backend's
// "pybind11" submitter. The implementation is compiled only in builds with
// TENSORXFER_WITH_CUDA (kCudaCopyCompiled says which); this header needs no CUDA
// headers, so streams are passed as void*.
#pragma once

#include <cstddef>

namespace tensorxfer::runtime {

#ifdef TENSORXFER_WITH_CUDA
inline constexpr bool kCudaCopyCompiled = true;
#else
inline constexpr bool kCudaCopyCompiled = false;
#endif

// Submits copies for one GPU. Owns one CUDA event, used to order a copy stream
// after another stream; move-only, the destructor releases the event.
// Not thread-safe: one submitter per backend, driven from one thread at a time.
// CUDA failures become Unsupported (no driver / no device) or InvalidArgument
// (bad pointer, handle or device), carrying the CUDA error text.
class CudaCopySubmitter {
 public:
  // A submitter for GPU `device` (>= 0). Throws Unsupported when no CUDA device
  // is usable, InvalidArgument when `device` is not one of them.
  static CudaCopySubmitter create(int device);

  CudaCopySubmitter(CudaCopySubmitter&& other) noexcept;
  CudaCopySubmitter& operator=(CudaCopySubmitter&& other) noexcept;
  CudaCopySubmitter(const CudaCopySubmitter&) = delete;
  CudaCopySubmitter& operator=(const CudaCopySubmitter&) = delete;
  ~CudaCopySubmitter();

  int device() const noexcept { return device_; }

  // Makes `stream` wait, on the device and without blocking the CPU, for all
  // work queued on `waited_stream` so far. A no-op when they are the same stream.
  void order_after(void* stream, void* waited_stream);

  // Queues cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice)
  // on `stream`. Returns once queued (from pinned memory: before the copy runs).
  // Both buffers must stay valid until the copy has finished; the caller tracks
  // that with an event recorded after it. bytes == 0 is a no-op.
  void copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes, void* stream);

 private:
  CudaCopySubmitter(int device, void* event) noexcept : device_(device), event_(event) {}
  void release() noexcept;

  int device_ = -1;
  void* event_ = nullptr;  // cudaEvent_t, created with cudaEventDisableTiming
};

// Page-locks ordinary host memory [pointer, pointer + bytes) in place for GPU
// `device` (cudaHostRegister with that device current), so copies from it are
// DMA. Returns true when it registered the range (undo with
// unregister_host_memory before the memory is freed), false when the whole range
// was already pinned by its owner (nothing to undo): both its first and its last
// byte are. A range pinned only in part, or a failed registration, throws
// (InvalidArgument, Unsupported or Error, see check_cuda) with the runtime's last
// error cleared, so the failure does not surface in an unrelated later call.
bool register_host_memory(void* pointer, std::size_t bytes, int device);

// cudaHostUnregister(pointer) with GPU `device` current; `pointer` is the start of
// a range register_host_memory registered. Safe from any thread.
void unregister_host_memory(void* pointer, int device);

}  // namespace tensorxfer::runtime
