// The span copy kernel (cuda_span_copy.h): block b copies spans b, b + gridDim.x, ...
// When source and destination share their address modulo the vector's size, the
// bytes up to the destination's alignment go one by one, the middle as vectors
// (16 bytes, else 4) and the tail one by one; otherwise every byte alone.
#include "cuda_span_copy_kernels.h"

#include <cstdint>

namespace tensorxfer::resharding::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

__device__ __forceinline__ void copy_bytes(unsigned char* destination, const unsigned char* source, uint64_t n) {
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) destination[i] = source[i];
}

template <typename Vector>
__device__ __forceinline__ void copy_aligned(unsigned char* destination, const unsigned char* source, uint64_t n) {
  constexpr uint64_t kSize = sizeof(Vector);
  const uint64_t misaligned = reinterpret_cast<uintptr_t>(destination) % kSize;
  const uint64_t head = misaligned == 0 ? 0 : (kSize - misaligned < n ? kSize - misaligned : n);
  copy_bytes(destination, source, head);
  const uint64_t vectors = (n - head) / kSize;
  auto* to = reinterpret_cast<Vector*>(destination + head);
  const auto* from = reinterpret_cast<const Vector*>(source + head);
  for (uint64_t i = threadIdx.x; i < vectors; i += blockDim.x) to[i] = from[i];
  const uint64_t done = head + vectors * kSize;
  copy_bytes(destination + done, source + done, n - done);
}

__global__ void copy_spans_kernel(const DeviceSpan* table, std::size_t count) {
  for (std::size_t s = blockIdx.x; s < count; s += gridDim.x) {
    const DeviceSpan span = table[s];
    auto* destination = reinterpret_cast<unsigned char*>(span.destination);
    const auto* source = reinterpret_cast<const unsigned char*>(span.source);
    const uint64_t relative = span.source ^ span.destination;
    if (relative % 16 == 0) {
      copy_aligned<uint4>(destination, source, span.nbytes);
    } else if (relative % 4 == 0) {
      copy_aligned<uint32_t>(destination, source, span.nbytes);
    } else {
      copy_bytes(destination, source, span.nbytes);
    }
  }
}

}  // namespace

cudaError_t launch_copy_spans(const DeviceSpan* table, std::size_t count, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(count < kMaxBlocks ? count : kMaxBlocks);
  copy_spans_kernel<<<blocks, kThreads, 0, stream>>>(table, count);
  return cudaGetLastError();
}

}  // namespace tensorxfer::resharding::cuda_kernels
