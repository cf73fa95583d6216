// The CUDA backing of IpcMemory: one cudaMalloc allocation per rank holding
// the SignalLayout, shared through cudaIpcGetMemHandle / cudaIpcOpenMemHandle,
// on the device asked for or else the one current when it was made (made current
// again for every later call).
#include "ipc_memory_backing.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

#if defined(TENSORXFER_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_device_guard.h"
#include "tensorxfer/common/cuda_runtime_calls.h"

#include <cstring>
#include <new>
#include <vector>
#endif

namespace tensorxfer::collectives {

#if defined(TENSORXFER_WITH_CUDA)
namespace {

// Every call names its context; the mapping onto errors is common/cuda_check.h.
void check_cuda(cudaError_t status, const char* what) {
  ::tensorxfer::check_cuda(status, std::string("IpcMemory (cuda): ") + what);
}

// This rank's cudaMalloc allocation, freed (on its device) when the owner goes,
// also when the backing's constructor throws after allocating.
class LocalAllocation {
 public:
  LocalAllocation(std::size_t bytes, int device) : device_(device) {
    check_cuda(TENSORXFER_CUDA_CALL(cudaMalloc(&pointer_, bytes)), "cudaMalloc");
  }
  LocalAllocation(const LocalAllocation&) = delete;
  LocalAllocation& operator=(const LocalAllocation&) = delete;
  ~LocalAllocation() { free(); }
  void* get() const noexcept { return pointer_; }
  void free() noexcept {
    if (pointer_ == nullptr) return;
    CudaDeviceGuard guard(device_, std::nothrow);
    if (TENSORXFER_CUDA_CALL(cudaFree(pointer_)) != cudaSuccess) (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
    pointer_ = nullptr;
  }

 private:
  int device_;
  void* pointer_ = nullptr;
};

// The device current when the backing is made: every later call (mapping, close,
// possibly from another thread) runs with that device current.
int current_device() {
  int device = 0;
  check_cuda(TENSORXFER_CUDA_CALL(cudaGetDevice(&device)), "cudaGetDevice");
  return device;
}

class CudaBacking final : public IpcMemory::Backing {
 public:
  CudaBacking(const SignalLayout& layout, int rank, int cuda_device)
      : layout_(layout), rank_(rank), device_(require_device(cuda_device)) {
    CudaDeviceGuard guard(device_);
    local_ = std::make_unique<LocalAllocation>(layout.total_nbytes, device_);
    // Zero the barrier words (and the data) and wait for it: a peer must never
    // read a stale flag through the handle published below.
    check_cuda(TENSORXFER_CUDA_CALL(cudaMemset(local_->get(), 0, layout.total_nbytes)), "cudaMemset");
    const SignalHeader header = make_signal_header(layout, rank);
    check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpy(local_->get(), &header, sizeof(header), cudaMemcpyHostToDevice)),
               "cudaMemcpy(header)");
    check_cuda(TENSORXFER_CUDA_CALL(cudaDeviceSynchronize()), "cudaDeviceSynchronize");
    cudaIpcMemHandle_t handle;
    check_cuda(TENSORXFER_CUDA_CALL(cudaIpcGetMemHandle(&handle, local_->get())), "cudaIpcGetMemHandle");
    handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    opened_.assign(static_cast<std::size_t>(layout.world_size), nullptr);
  }
  ~CudaBacking() override { close(); }

  MemoryDevice device() const noexcept override { return MemoryDevice::kCuda; }
  const std::string& local_handle() const noexcept override { return handle_; }
  std::byte* local_base() const noexcept override {
    return local_ ? static_cast<std::byte*>(local_->get()) : nullptr;
  }

  std::byte* map_peer(int rank, const std::string& handle) override {
    TENSORXFER_CHECK_EQ(CorruptSegment, "IpcMemory (cuda): a peer's handle size", handle.size(),
                        sizeof(cudaIpcMemHandle_t));
    CudaDeviceGuard guard(device_);
    void*& pointer = opened_[static_cast<std::size_t>(rank)];
    // Mapped by an earlier map_peers that failed on a later rank: not opened twice.
    if (pointer == nullptr) {
      cudaIpcMemHandle_t peer_handle;
      std::memcpy(&peer_handle, handle.data(), sizeof(peer_handle));
      check_cuda(TENSORXFER_CUDA_CALL(cudaIpcOpenMemHandle(&pointer, peer_handle, cudaIpcMemLazyEnablePeerAccess)),
                 "cudaIpcOpenMemHandle");
    }
    SignalHeader header;
    check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpy(&header, pointer, sizeof(header), cudaMemcpyDeviceToHost)),
               "cudaMemcpy(peer header)");
    validate_signal_header(header, layout_.total_nbytes, rank, layout_.world_size,
                           detail::concat("IpcMemory (cuda): rank ", rank_, " mapping rank ", rank));
    return static_cast<std::byte*>(pointer);
  }

  void release_handles() noexcept override {}
  void check_peers_alive() const override {}  // the group's liveness covers CUDA ranks
  bool peer_alive(int) const noexcept override { return true; }

  void close_peer_mappings() noexcept override {
    CudaDeviceGuard guard(device_, std::nothrow);
    for (void*& pointer : opened_) {
      if (pointer != nullptr && TENSORXFER_CUDA_CALL(cudaIpcCloseMemHandle(pointer)) != cudaSuccess) {
        (void)TENSORXFER_CUDA_CALL(cudaGetLastError());
      }
      pointer = nullptr;
    }
  }

  // The peers' regions are closed before this rank's own is freed.
  void close() noexcept override {
    if (local_ == nullptr) return;
    close_peer_mappings();
    local_.reset();
  }

 private:
  // `requested` (-1: the current device) once it is known to exist.
  static int require_device(int requested) {
    int device_count = 0;
    check_cuda(TENSORXFER_CUDA_CALL(cudaGetDeviceCount(&device_count)), "cudaGetDeviceCount");
    TENSORXFER_CHECK(Unsupported, device_count > 0, "IpcMemory (cuda): no CUDA device is present");
    TENSORXFER_CHECK(InvalidArgument, requested >= -1 && requested < device_count,
                     "IpcMemory (cuda): the device must be -1 (the current one) or in [0, ", device_count,
                     "), got ", requested);
    return requested == -1 ? current_device() : requested;
  }

  SignalLayout layout_;
  int rank_;
  int device_;
  std::unique_ptr<LocalAllocation> local_;
  std::string handle_;
  std::vector<void*> opened_;
};

}  // namespace

std::unique_ptr<IpcMemory::Backing> make_cuda_backing(const SignalLayout& layout, int rank, int cuda_device) {
  return std::make_unique<CudaBacking>(layout, rank, cuda_device);
}

#else

std::unique_ptr<IpcMemory::Backing> make_cuda_backing(const SignalLayout&, int, int) {
  throw Unsupported("IpcMemory: device 'cuda' needs a build with CUDA (TENSORXFER_WITH_CUDA); this build has none");
}

#endif

}  // namespace tensorxfer::collectives
