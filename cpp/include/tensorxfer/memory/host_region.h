// One page-aligned anonymous private mapping of host memory, optionally on huge
// pages and optionally page-locked. Move-only; unmapped exactly once.
#pragma once

#include <cstddef>
#include <string>

namespace tensorxfer::memory {

// Which kind of pages back a region.
enum class HugePages {
  kNone,         // base pages
  kTransparent,  // madvise(MADV_HUGEPAGE) on a huge-page-aligned range (THP)
  kHugeTlb,      // mmap(MAP_HUGETLB) from the reserved huge page pool
};
const char* huge_pages_name(HugePages kind) noexcept;

// The size of a default huge page (Hugepagesize in /proc/meminfo, else 2 MiB).
std::size_t huge_page_size() noexcept;

struct HostRegionOptions {
  // Try MAP_HUGETLB, then THP (MADV_HUGEPAGE); only for requests of at least
  // one huge page. Falling back is not an error: huge_pages() and
  // huge_pages_note() say what happened.
  bool huge_pages = false;
  // mlock the region (which also makes it resident). Failing (for example past
  // RLIMIT_MEMLOCK) is not an error: locked() and lock_error() say what happened.
  bool lock_pages = false;
  // >= 0: bind the pages to this NUMA node (MPOL_BIND) before anything touches them.
  int numa_node = -1;
};

class HostRegion {
 public:
  // The bytes a request maps: rounded up to a whole huge page when huge pages
  // are requested and `bytes` >= one huge page, else to whole base pages
  // (one page at least). Throws InvalidArgument when the rounded size does not
  // fit in size_t (a request near SIZE_MAX), never a wrapped size.
  static std::size_t mapped_size_for(std::size_t bytes, const HostRegionOptions& options);

  // Maps mapped_size_for(bytes, options) bytes. Throws SystemError when no
  // mapping can be made, InvalidArgument / Unsupported from the NUMA bind.
  static HostRegion map(std::size_t bytes, const HostRegionOptions& options);

  HostRegion() = default;
  HostRegion(HostRegion&& other) noexcept;
  HostRegion& operator=(HostRegion&& other) noexcept;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;
  ~HostRegion();

  void* data() const noexcept { return data_; }
  std::size_t mapped_bytes() const noexcept { return mapped_bytes_; }
  bool valid() const noexcept { return data_ != nullptr; }
  HugePages huge_pages() const noexcept { return huge_pages_; }
  // Why huge pages were not used, or which fallback was taken ("" when none was needed).
  const std::string& huge_pages_note() const noexcept { return huge_pages_note_; }
  bool locked() const noexcept { return locked_; }
  // Why mlock failed ("" when the region is locked or locking was not asked for).
  const std::string& lock_error() const noexcept { return lock_error_; }

 private:
  void unmap() noexcept;

  void* data_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  HugePages huge_pages_ = HugePages::kNone;
  std::string huge_pages_note_;
  bool locked_ = false;
  std::string lock_error_;
};

}  // namespace tensorxfer::memory
