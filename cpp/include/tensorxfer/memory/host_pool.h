// A pool of page-aligned host memory blocks. Each block is its own mapping
// (HostRegion) with the pool's options (huge pages, page locking, NUMA node).
// A released block goes back to the pool's cache, to be handed out again for a
// request of the same mapped size, until the cache holds max_cached_bytes.
//
// Lifetime: every block keeps its pool alive; the memory of a block is freed
// when the block is gone and the pool is closed (or when the cache is full).
// close() stops caching and frees what is cached, so once the pool is closed
// and all blocks are gone, nothing stays mapped.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tensorxfer/memory/host_region.h"

namespace tensorxfer::memory {

struct HostPoolOptions {
  HostRegionOptions region;
  std::size_t max_cached_bytes = std::size_t{256} << 20;
};

struct HostPoolStats {
  std::size_t live_blocks = 0;       // blocks handed out and not yet released
  std::size_t live_bytes = 0;        // their mapped bytes
  std::size_t cached_blocks = 0;     // released blocks kept for reuse
  std::size_t cached_bytes = 0;
  std::size_t mapped_blocks = 0;     // regions ever mapped by this pool
  std::size_t reused_blocks = 0;     // allocations served from the cache
  std::size_t hugetlb_blocks = 0;    // regions ever mapped with MAP_HUGETLB
  std::size_t transparent_blocks = 0;  // ... with MADV_HUGEPAGE
  std::size_t locked_blocks = 0;     // ... successfully mlock'ed
  std::size_t lock_failures = 0;     // ... whose mlock failed
  std::string last_lock_error;       // the latest mlock failure ("" if none)
  std::string last_huge_pages_note;  // the latest huge-page fallback note ("" if none)
  bool closed = false;
};

class HostPool;

// A block on loan from a HostPool: `size()` usable bytes at a page-aligned
// `data()`. Returns its region to the pool (or unmaps it) when destroyed.
// Move-only; not thread-safe itself, but blocks of one pool may be created and
// destroyed on any threads.
class HostBlock {
 public:
  HostBlock(std::shared_ptr<HostPool> pool, HostRegion region, std::size_t size) noexcept;
  HostBlock(HostBlock&&) noexcept = default;
  HostBlock& operator=(HostBlock&&) = delete;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock();

  void* data() const noexcept { return region_.data(); }
  std::size_t size() const noexcept { return size_; }
  const HostRegion& region() const noexcept { return region_; }
  // True when this block came out of the pool's cache (its bytes are stale, not zero).
  bool reused() const noexcept { return reused_; }

 private:
  friend class HostPool;
  std::shared_ptr<HostPool> pool_;
  HostRegion region_;
  std::size_t size_ = 0;
  bool reused_ = false;
};

class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  // Validates the options (a NUMA node must exist: InvalidArgument / Unsupported).
  static std::shared_ptr<HostPool> create(const HostPoolOptions& options);

  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  ~HostPool() = default;

  // A block of at least `bytes` usable bytes (0 is allowed: one page is mapped).
  // Fresh blocks read as zero; reused blocks hold whatever was last written.
  // Throws InvalidArgument after close(), SystemError when mmap fails.
  // Thread-safe.
  HostBlock allocate(std::size_t bytes);

  // Frees every cached region. Thread-safe.
  void release_cached() noexcept;
  // Stops caching and frees the cache; allocate() then throws. Idempotent, thread-safe.
  void close() noexcept;

  HostPoolStats stats() const;
  const HostPoolOptions& options() const noexcept { return options_; }

 private:
  explicit HostPool(const HostPoolOptions& options) : options_(options) {}
  friend class HostBlock;
  // Takes back a released block's region; caches it or lets it unmap.
  void give_back(HostRegion region) noexcept;

  const HostPoolOptions options_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, HostRegion> cache_;  // by mapped size; guarded by mutex_
  HostPoolStats stats_;                            // guarded by mutex_
};

}  // namespace tensorxfer::memory
