// The CUDA all-reduce's kernels, as the host side (cuda_all_reduce.cc) launches
// them; compiled by nvcc (cuda_all_reduce_kernels.cu) in builds with the CUDA
// kernels (TENSORXFER_WITH_CUDA_KERNELS). Arguments travel by value: pointers of
// at most kMaxWorldSize ranks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tensorxfer::collectives::cuda_kernels {

inline constexpr int kMaxWorldSize = 16;
// A FlagLine (signal_layout.h) as the kernels see it: the epoch at byte 0, the
// announced operation at byte 8, one 64-byte line per writer rank.
inline constexpr std::size_t kLineBytes = 64;
inline constexpr std::size_t kDescriptorOffset = 8;

struct Words {
  uint64_t* epoch;                // device memory of this rank, advanced by every barrier
  volatile uint64_t* status;      // device memory: 0, or the first failure (kind << 32 | peer)
  volatile uint64_t* host_status; // pinned host memory mapped for the device: a copy the host reads
};

struct BarrierArgs {
  unsigned char* arrays[kMaxWorldSize];  // rank j's array of world_size lines (this barrier's kind)
  int rank;
  int world_size;
  uint64_t descriptor;        // written beside the epoch; compared when check_descriptor
  bool check_descriptor;
  uint64_t timeout_ns;
  Words words;
};

struct ReduceArgs {
  const void* sources[kMaxWorldSize];  // every rank's region
  void* destination;                   // one-shot, gather: the tensor's chunk; two-shot reduce: this rank's region
  std::size_t count;                   // elements of the chunk
  std::size_t begin;                   // two-shot reduce: the first element of this rank's slice
  std::size_t end;                     // ... and one past its last (one-shot: 0 and count)
  uint32_t op;
  int world_size;
  Words words;
};

// Every kernel returns at once when *status is not zero.
cudaError_t launch_barrier(const BarrierArgs& args, cudaStream_t stream);
// destination[i] = reduce(sources[*][i]) for i in [begin, end); element_type as reduce.h's ElementType.
cudaError_t launch_reduce(uint32_t element_type, const ReduceArgs& args, cudaStream_t stream);
// destination[i] = sources[slice_owner(i)][i] for i < count (the two-shot gather).
cudaError_t launch_gather(std::size_t element_size, const ReduceArgs& args, cudaStream_t stream);

}  // namespace tensorxfer::collectives::cuda_kernels
