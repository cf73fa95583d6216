#include "tensorxfer/memory/host_pool.h"

#include <sstream>
#include <utility>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/numa.h"

namespace tensorxfer::memory {

HostBlock::HostBlock(std::shared_ptr<HostPool> pool, HostRegion region, std::size_t size) noexcept
    : pool_(std::move(pool)), region_(std::move(region)), size_(size) {}

HostBlock::~HostBlock() {
  if (pool_ && region_.valid()) pool_->give_back(std::move(region_));
}

std::shared_ptr<HostPool> HostPool::create(const HostPoolOptions& options) {
  const int node = options.region.numa_node;
  if (node != -1) {
    const std::vector<int> nodes = numa_nodes_with_memory();
    bool known = false;
    for (int candidate : nodes) known = known || candidate == node;
    if (!known) {
      std::ostringstream message;
      message << "create_host_mempool: numa_node must be -1 (no binding) or one of the NUMA nodes "
                 "this process can allocate on [";
      for (std::size_t i = 0; i < nodes.size(); ++i) message << (i ? ", " : "") << nodes[i];
      message << "], got " << node;
      throw InvalidArgument(message.str());
    }
  }
  return std::shared_ptr<HostPool>(new HostPool(options));
}

HostBlock HostPool::allocate(std::size_t bytes) {
  const std::size_t mapped = HostRegion::mapped_size_for(bytes, options_.region);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stats_.closed) throw Closed("HostPool.allocate: HostPool is closed");
    auto cached = cache_.find(mapped);
    if (cached != cache_.end()) {
      HostRegion region = std::move(cached->second);
      cache_.erase(cached);
      stats_.cached_blocks -= 1;
      stats_.cached_bytes -= mapped;
      stats_.reused_blocks += 1;
      stats_.live_blocks += 1;
      stats_.live_bytes += mapped;
      HostBlock block(shared_from_this(), std::move(region), bytes);
      block.reused_ = true;
      return block;
    }
  }
  // Mapping (and mlock, which faults every page in) can be slow: done unlocked.
  HostRegion region = HostRegion::map(bytes, options_.region);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stats_.closed) throw InvalidArgument("HostPool.allocate: the pool was closed during the allocation");
  stats_.mapped_blocks += 1;
  stats_.live_blocks += 1;
  stats_.live_bytes += region.mapped_bytes();
  if (region.huge_pages() == HugePages::kHugeTlb) stats_.hugetlb_blocks += 1;
  if (region.huge_pages() == HugePages::kTransparent) stats_.transparent_blocks += 1;
  if (!region.huge_pages_note().empty()) stats_.last_huge_pages_note = region.huge_pages_note();
  if (options_.region.lock_pages) {
    if (region.locked()) {
      stats_.locked_blocks += 1;
    } else {
      stats_.lock_failures += 1;
      stats_.last_lock_error = region.lock_error();
    }
  }
  return HostBlock(shared_from_this(), std::move(region), bytes);
}

void HostPool::give_back(HostRegion region) noexcept {
  const std::size_t mapped = region.mapped_bytes();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.live_blocks -= 1;
  stats_.live_bytes -= mapped;
  if (stats_.closed || stats_.cached_bytes + mapped > options_.max_cached_bytes) return;
  try {
    cache_.emplace(mapped, std::move(region));
    stats_.cached_blocks += 1;
    stats_.cached_bytes += mapped;
  } catch (...) {
    // No memory for the cache node: the region unmaps when `region` goes out of scope.
  }
  // Note: `region` (if not cached) is unmapped after the lock is released, at scope exit.
}

void HostPool::release_cached() noexcept {
  std::multimap<std::size_t, HostRegion> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released.swap(cache_);
    stats_.cached_blocks = 0;
    stats_.cached_bytes = 0;
  }
}

void HostPool::close() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.closed = true;
  }
  release_cached();
}

HostPoolStats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace tensorxfer::memory
