// The CUDA backing of IpcMemory: one cudaMalloc allocation per rank holding
// the SignalLayout, shared through cudaIpcGetMemHandle / cudaIpcOpenMemHandle.
#include "ipc_memory_backing.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

#if defined(TENSORXFER_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_runtime_calls.h"

#include <cstring>
#include <vector>
#endif

namespace tensorxfer::collectives {

#if defined(TENSORXFER_WITH_CUDA)
namespace {

// Every call names its context; the mapping onto errors is common/cuda_check.h.
void check_cuda(cudaError_t status, const char* what) {
  ::tensorxfer::check_cuda(status, std::string("IpcMemory (cuda): ") + what);
}

class CudaBacking final : public IpcMemory::Backing {
 public:
  CudaBacking(const SignalLayout& layout, int rank) : layout_(layout), rank_(rank) {
    int device_count = 0;
    check_cuda(TENSORXFER_CUDA_CALL(cudaGetDeviceCount(&device_count)), "cudaGetDeviceCount");
    TENSORXFER_CHECK(Unsupported, device_count > 0, "IpcMemory (cuda): no CUDA device is present");
    check_cuda(TENSORXFER_CUDA_CALL(cudaMalloc(&local_, layout.total_nbytes)), "cudaMalloc");
    // Zero the barrier words (and the data) and wait for it: a peer must never
    // read a stale flag through the handle published below.
    check_cuda(TENSORXFER_CUDA_CALL(cudaMemset(local_, 0, layout.total_nbytes)), "cudaMemset");
    const SignalHeader header = make_signal_header(layout, rank);
    check_cuda(TENSORXFER_CUDA_CALL(cudaMemcpy(local_, &header, sizeof(header), cudaMemcpyHostToDevice)),
               "cudaMemcpy(header)");
    check_cuda(TENSORXFER_CUDA_CALL(cudaDeviceSynchronize()), "cudaDeviceSynchronize");
    cudaIpcMemHandle_t handle;
    check_cuda(TENSORXFER_CUDA_CALL(cudaIpcGetMemHandle(&handle, local_)), "cudaIpcGetMemHandle");
    handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    opened_.assign(static_cast<std::size_t>(layout.world_size), nullptr);
  }
  ~CudaBacking() override { close(); }

  MemoryDevice device() const noexcept override { return MemoryDevice::kCuda; }
  const std::string& local_handle() const noexcept override { return handle_; }
  std::byte* local_base() const noexcept override { return static_cast<std::byte*>(local_); }

  std::byte* map_peer(int rank, const std::string& handle) override {
    TENSORXFER_CHECK_EQ(CorruptSegment, "IpcMemory (cuda): a peer's handle size", handle.size(),
                        sizeof(cudaIpcMemHandle_t));
    cudaIpcMemHandle_t peer_handle;
    std::memcpy(&peer_handle, handle.data(), sizeof(peer_handle));
    void* pointer = nullptr;
    check_cuda(TENSORXFER_CUDA_CALL(cudaIpcOpenMemHandle(&pointer, peer_handle, cudaIpcMemLazyEnablePeerAccess)),
               "cudaIpcOpenMemHandle");
    opened_[static_cast<std::size_t>(rank)] = pointer;
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

  void close() noexcept override {
    for (void*& pointer : opened_) {
      if (pointer != nullptr) (void)TENSORXFER_CUDA_CALL(cudaIpcCloseMemHandle(pointer));
      pointer = nullptr;
    }
    if (local_ != nullptr) (void)TENSORXFER_CUDA_CALL(cudaFree(local_));
    local_ = nullptr;
  }

 private:
  SignalLayout layout_;
  int rank_;
  void* local_ = nullptr;
  std::string handle_;
  std::vector<void*> opened_;
};

}  // namespace

std::unique_ptr<IpcMemory::Backing> make_cuda_backing(const SignalLayout& layout, int rank) {
  return std::make_unique<CudaBacking>(layout, rank);
}

#else

std::unique_ptr<IpcMemory::Backing> make_cuda_backing(const SignalLayout&, int) {
  throw Unsupported("IpcMemory: device 'cuda' needs a build with CUDA (TENSORXFER_WITH_CUDA); this build has none");
}

#endif

}  // namespace tensorxfer::collectives
