// Copies that write around the caches (non-temporal stores), for layers above
// copy whose outputs are far larger than what will be read back soon.
#pragma once

#include <cstddef>

namespace tensorxfer::copy {

// Copies `nbytes` from `src` to `dst` (non-overlapping) with non-temporal
// stores where the CPU has them (x86-64), else memcpy. The stores are weakly
// ordered: call streaming_fence() before another thread may read `dst`.
void streaming_copy(void* dst, const void* src, std::size_t nbytes) noexcept;

// Orders every earlier streaming store of this thread before its later stores.
void streaming_fence() noexcept;

}  // namespace tensorxfer::copy
