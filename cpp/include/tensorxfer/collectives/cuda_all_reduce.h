// CudaAllReduce: all-reduce of CUDA tensors among the ranks of one host, over an
// IpcMemory(device="cuda") whose regions every rank maps (builds with CUDA only).
//
// Per call, queued on the caller's stream (nothing blocks the host):
//   copy the tensor into this rank's region (cudaMemcpyAsync, device to device);
//   start barrier (every rank's input is in its region);
//   one-shot: every rank reduces all elements from every region into its tensor;
//   two-shot: rank r reduces slice r into its own region, a middle barrier, then
//             every rank gathers slice s from rank s's region into its tensor;
//   end barrier (nobody still reads a region that a fast rank's next call overwrites).
// Larger tensors go through the regions in chunks. Elements are reduced in rank
// order with the arithmetic of element_math.h, so every rank gets bitwise the same
// result, and the same as the host reduction.
//
// Barriers are vLLM's signal flags: rank j announces an epoch by a release store
// (system scope) to its flag line in every rank's barrier array, then waits with
// acquire loads until its own array holds that epoch from every rank. Plain loads
// and stores: no atomic read-modify-write crosses the bus. The epoch lives in device
// memory and the barrier kernel advances it, so a captured CUDA graph replays with
// fresh epochs. Each flag carries the caller's operation (dtype, op, algorithm,
// bytes): a rank whose peer announced another operation stops.
//
// Failures never hang the GPU: a barrier that waits longer than `timeout_ns` gives
// up. The first failure (a timeout or a mismatch, with the peer's rank) is written
// to a status word in pinned host memory, and every later kernel of this object
// returns at once without touching its tensor. status() reads it; the object is then
// unusable (throw_if_failed raises on the next call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tensorxfer::collectives {

enum class CudaAllReduceAlgorithm : uint32_t { kAuto, kOneShot, kTwoShot };

// The failure recorded on the device: kind << 32 | peer rank; 0 = none.
enum class CudaAllReduceFailure : uint32_t { kNone = 0, kTimeout = 1, kMismatch = 2 };

struct CudaAllReducePeers {
  int rank = 0;
  int world_size = 0;
  int cuda_device = 0;
  std::vector<void*> data;         // every rank's region, mapped here (IpcMemory::remote_data)
  std::vector<void*> barrier_in;   // every rank's FlagLine arrays (IpcMemory::barrier_in / barrier_out)
  std::vector<void*> barrier_out;
  std::size_t data_nbytes = 0;     // bytes of each region
};

class CudaAllReduce {
 public:
  // Allocates the epoch word (device) and the status word (pinned host). Throws
  // InvalidArgument for inconsistent peers, Unsupported in a build without the
  // CUDA kernels, and like check_cuda when CUDA refuses.
  static std::unique_ptr<CudaAllReduce> create(const CudaAllReducePeers& peers, uint64_t timeout_ns);
  ~CudaAllReduce();
  CudaAllReduce(const CudaAllReduce&) = delete;
  CudaAllReduce& operator=(const CudaAllReduce&) = delete;

  // Queues the all-reduce of `count` elements at `tensor` (device memory of this
  // rank's GPU) on `stream`. `element_type` and `op` are reduce.h's values.
  // Throws InvalidArgument for a bad argument and the recorded failure (as
  // throw_if_failed) before queuing anything.
  void all_reduce(void* tensor, std::size_t count, uint32_t element_type, uint32_t op,
                  CudaAllReduceAlgorithm algorithm, void* stream);

  // The recorded failure word (kind << 32 | peer), read from pinned memory
  // without synchronising: complete once the caller's stream has.
  uint64_t status() const noexcept;
  // Throws Timeout or InvalidArgument (mismatch) naming the peer when a failure is recorded.
  void throw_if_failed() const;

  // What "auto" picks: one-shot up to this many bytes per rank, else two-shot.
  static constexpr std::size_t kOneShotMaxBytes = 512 * 1024;

  struct Device;  // the device words (cuda_all_reduce.cc)

 private:
  explicit CudaAllReduce(const CudaAllReducePeers& peers, uint64_t timeout_ns);
  CudaAllReducePeers peers_;
  uint64_t timeout_ns_;
  std::unique_ptr<Device> device_;
};

}  // namespace tensorxfer::collectives
