// The CUDA all-reduce's kernels (see cuda_all_reduce.h for the protocol).
//
// A barrier is its own one-block kernel between the copy and reduce kernels on
// the caller's stream: the kernel boundary makes every write of the kernels
// before it visible to the kernels after it, so the data needs no fences of its
// own; the flags need the release store / acquire load pair across processes.
#include "cuda_all_reduce_kernels.h"

#include "tensorxfer/collectives/element_math.h"

namespace tensorxfer::collectives::cuda_kernels {
namespace {

namespace math = element_math;

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 1024;

__device__ __forceinline__ void store_release_system(uint64_t* address, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire_system(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__device__ __forceinline__ void record_failure(const Words& words, uint64_t kind, int peer) {
  // Plain stores: any non-zero word stops every later kernel (no atomics over the bus).
  const uint64_t failure = (kind << 32) | static_cast<uint32_t>(peer);
  if (*words.status == 0) *words.status = failure;
  if (*words.host_status == 0) *words.host_status = failure;
  __threadfence_system();
}

__global__ void barrier_kernel(BarrierArgs args) {
  const int peer = static_cast<int>(threadIdx.x);
  if (*args.words.status != 0) return;
  const uint64_t epoch = *args.words.epoch + 1;  // every thread reads before thread 0 advances it
  if (peer < args.world_size) {
    unsigned char* theirs = args.arrays[peer] + static_cast<std::size_t>(args.rank) * kLineBytes;
    *reinterpret_cast<volatile uint64_t*>(theirs + kDescriptorOffset) = args.descriptor;
    store_release_system(reinterpret_cast<uint64_t*>(theirs), epoch);
    const unsigned char* mine = args.arrays[args.rank] + static_cast<std::size_t>(peer) * kLineBytes;
    const uint64_t start = global_timer_ns();
    bool arrived = false;
    for (unsigned spins = 0;; ++spins) {
      if (load_acquire_system(reinterpret_cast<const uint64_t*>(mine)) >= epoch) {
        arrived = true;
        break;
      }
      if ((spins & 63u) == 63u) {
        if (*args.words.status != 0) break;  // another wait of this barrier gave up
        if (global_timer_ns() - start > args.timeout_ns) {
          record_failure(args.words, 1, peer);
          break;
        }
      }
      __nanosleep(64);
    }
    if (arrived && args.check_descriptor &&
        *reinterpret_cast<const volatile uint64_t*>(mine + kDescriptorOffset) != args.descriptor) {
      record_failure(args.words, 2, peer);
    }
  }
  __syncthreads();
  if (peer == 0) *args.words.epoch = epoch;
}

template <typename Kind>
__global__ void reduce_kernel(ReduceArgs args) {
  if (*args.words.status != 0) return;
  using S = typename Kind::storage;
  const S* sources[kMaxWorldSize];
  for (int rank = 0; rank < args.world_size; ++rank) sources[rank] = static_cast<const S*>(args.sources[rank]);
  S* destination = static_cast<S*>(args.destination);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = args.begin + static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < args.end;
       i += stride) {
    destination[i] = math::reduce_one<Kind>(args.op, sources, args.world_size, i);
  }
}

template <typename Word>
__global__ void gather_kernel(ReduceArgs args) {
  if (*args.words.status != 0) return;
  Word* destination = static_cast<Word*>(args.destination);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < args.count; i += stride) {
    const int owner = math::slice_owner(args.count, args.world_size, i);
    destination[i] = static_cast<const Word*>(args.sources[owner])[i];
  }
}

unsigned blocks_for(std::size_t elements) {
  const std::size_t blocks = (elements + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

template <typename Kind>
cudaError_t launch_typed(const ReduceArgs& args, cudaStream_t stream) {
  reduce_kernel<Kind><<<blocks_for(args.end - args.begin), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_barrier(const BarrierArgs& args, cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_reduce(uint32_t element_type, const ReduceArgs& args, cudaStream_t stream) {
  switch (element_type) {  // reduce.h's ElementType
    case 0: return launch_typed<math::Float32>(args, stream);
    case 1: return launch_typed<math::Float64>(args, stream);
    case 2: return launch_typed<math::BFloat16>(args, stream);
    case 3: return launch_typed<math::Float16>(args, stream);
    case 4: return launch_typed<math::Int32>(args, stream);
    case 5: return launch_typed<math::Int64>(args, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_gather(std::size_t element_size, const ReduceArgs& args, cudaStream_t stream) {
  const unsigned blocks = blocks_for(args.count);
  switch (element_size) {
    case 2: gather_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(args); break;
    case 4: gather_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(args); break;
    case 8: gather_kernel<uint64_t><<<blocks, kThreads, 0, stream>>>(args); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tensorxfer::collectives::cuda_kernels
