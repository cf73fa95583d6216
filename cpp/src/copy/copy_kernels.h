// Byte-copy kernels shared by the copy engine and the row packer (internal to
// cpp/src/copy). Streaming copies write around the caches with non-temporal
// stores: for buffers far larger than what the consumer will read back soon,
// that skips the read-for-ownership of every destination line.
#pragma once

#include <cstddef>
#include <cstring>

namespace tensorxfer::copy::detail {

// Copies `nbytes` from `src` to `dst` (non-overlapping) with non-temporal
// stores where the CPU has them (x86-64), else memcpy. The stores are weakly
// ordered: call streaming_fence() before publishing the data to another thread.
void streaming_copy(void* dst, const void* src, std::size_t nbytes) noexcept;

// Orders all earlier streaming stores of this thread before its later stores.
void streaming_fence() noexcept;

// Bytes of the last-level cache this CPU shares, 0 if unknown (cpu_features():
// the kernel's figure, else sysconf; TENSORXFER_CPU_CACHE_BYTES overrides it).
std::size_t last_level_cache_bytes() noexcept;

// Hints the CPU to start loading [address, address + nbytes) into the caches.
void prefetch_bytes(const void* address, std::size_t nbytes) noexcept;

// memcpy for the common tiny row sizes, with the size known to the compiler.
inline void small_copy(void* dst, const void* src, std::size_t nbytes) noexcept {
  switch (nbytes) {
    case 1: std::memcpy(dst, src, 1); return;
    case 2: std::memcpy(dst, src, 2); return;
    case 4: std::memcpy(dst, src, 4); return;
    case 8: std::memcpy(dst, src, 8); return;
    case 16: std::memcpy(dst, src, 16); return;
    default: std::memcpy(dst, src, nbytes); return;
  }
}

}  // namespace tensorxfer::copy::detail
