// The CUDA pipeline executor's device steps (tensorxfer.resharding.cuda_pipeline),
// queued on a CUDA stream without blocking the host:
//   - copy_spans_async: one kernel copies a table of byte spans; packing a batch
//     (task memory -> send slot) and unpacking one (receive slot -> task memory)
//     are both such tables;
//   - put_async: cudaMemcpyAsync of a packed batch into a peer's receive slot,
//     mapped here through CUDA IPC (IpcMemory(device="cuda")).
// Builds with CUDA only; without the CUDA kernels (no nvcc at build time, or the
// fake runtime) copy_spans_async throws Unsupported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tensorxfer::resharding {

// One row of a span table, as the kernel reads it from device memory.
struct DeviceSpan {
  uint64_t source = 0;
  uint64_t destination = 0;
  uint64_t nbytes = 0;
};
static_assert(sizeof(DeviceSpan) == 24, "the Python side builds the table as (n, 3) uint64 rows");

// Each span is copied by one block of threads, so the caller splits long spans
// into pieces of at most this many bytes to spread them over the GPU.
inline constexpr uint64_t kDeviceSpanPieceBytes = uint64_t{64} << 10;

// Queues the copy of every span of `table` (`count` rows in device memory of
// `cuda_device`) on `stream`. Spans may have any alignment; they must not
// overlap each other's destinations. InvalidArgument for a null table with
// count > 0; check_cuda's errors when the launch fails.
void copy_spans_async(const DeviceSpan* table, std::size_t count, int cuda_device, void* stream);

// Queues cudaMemcpyAsync(destination, source, nbytes, device to device) on `stream`.
void put_async(void* destination, const void* source, std::size_t nbytes, int cuda_device, void* stream);

}  // namespace tensorxfer::resharding
