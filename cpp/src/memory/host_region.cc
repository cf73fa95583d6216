#include "tensorxfer/memory/host_region.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/tensor_view.h"
#include "tensorxfer/memory/advice.h"
#include "tensorxfer/memory/numa.h"

namespace tensorxfer::memory {
namespace {

std::size_t read_huge_page_size() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  while (meminfo >> key) {
    if (key == "Hugepagesize:") {
      std::size_t kib = 0;
      if (meminfo >> kib && kib > 0) return kib * 1024;
      break;
    }
    meminfo.ignore(4096, '\n');
  }
  return std::size_t{2} << 20;
}

std::string memlock_limit_text() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(limit.rlim_cur) + " bytes";
}

void* map_anonymous(std::size_t bytes, int extra_flags) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  return data == MAP_FAILED ? nullptr : data;
}

// Maps `bytes` (a multiple of `alignment`) at an `alignment`-aligned address by
// over-mapping and trimming both ends, so THP can back it from the first byte.
void* map_aligned(std::size_t bytes, std::size_t alignment) {
  auto* raw = static_cast<char*>(
      map_anonymous(checked_add(bytes, alignment, "host region with alignment slack"), 0));
  if (raw == nullptr) return nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (address + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  const std::size_t head = aligned - address;
  const std::size_t tail = alignment - head;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(reinterpret_cast<char*>(aligned) + bytes, tail);
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

const char* huge_pages_name(HugePages kind) noexcept {
  switch (kind) {
    case HugePages::kNone: return "none";
    case HugePages::kTransparent: return "transparent";
    case HugePages::kHugeTlb: return "hugetlb";
  }
  return "unknown";
}

std::size_t huge_page_size() noexcept {
  static const std::size_t size = [] {
    try {
      return read_huge_page_size();
    } catch (...) {
      return std::size_t{2} << 20;
    }
  }();
  return size;
}

std::size_t HostRegion::mapped_size_for(std::size_t bytes, const HostRegionOptions& options) {
  if (options.huge_pages && bytes >= huge_page_size()) {
    return checked_round_up(bytes, huge_page_size(), "host region bytes (to whole huge pages)");
  }
  return checked_round_up(bytes == 0 ? 1 : bytes, page_size(), "host region bytes (to whole pages)");
}

HostRegion HostRegion::map(std::size_t bytes, const HostRegionOptions& options) {
  HostRegion region;
  region.mapped_bytes_ = mapped_size_for(bytes, options);
  const bool want_huge_pages = options.huge_pages && bytes >= huge_page_size();
  if (options.huge_pages && !want_huge_pages) {
    region.huge_pages_note_ = "request of " + std::to_string(bytes) + " bytes is smaller than one huge page (" +
                              std::to_string(huge_page_size()) + " bytes): base pages used";
  }
  if (want_huge_pages) {
    region.data_ = map_anonymous(region.mapped_bytes_, MAP_HUGETLB);
    if (region.data_ != nullptr) {
      region.huge_pages_ = HugePages::kHugeTlb;
    } else {
      region.huge_pages_note_ = std::string("mmap(MAP_HUGETLB) failed: ") + std::strerror(errno) +
                                " (reserve pages in /proc/sys/vm/nr_hugepages); ";
      region.data_ = map_aligned(region.mapped_bytes_, huge_page_size());
      if (region.data_ != nullptr) {
        if (::madvise(region.data_, region.mapped_bytes_, MADV_HUGEPAGE) == 0) {
          region.huge_pages_ = HugePages::kTransparent;
          region.huge_pages_note_ += "transparent huge pages (MADV_HUGEPAGE) used instead";
        } else {
          region.huge_pages_note_ += std::string("madvise(MADV_HUGEPAGE) failed: ") + std::strerror(errno) +
                                     "; base pages used";
        }
      }
    }
  } else {
    region.data_ = map_anonymous(region.mapped_bytes_, 0);
  }
  if (region.data_ == nullptr) {
    const int error_number = errno;
    region.mapped_bytes_ = 0;
    throw SystemError("mmap(" + std::to_string(mapped_size_for(bytes, options)) + " bytes of host memory)",
                      error_number);
  }
  if (options.numa_node != -1) {
    bind_to_numa_node(TensorView::bytes(region.data_, region.mapped_bytes_), "numa_node", options.numa_node);
  }
  if (options.lock_pages) {
    // The raw system call: sanitizer runtimes replace mlock() with a no-op that reports success.
    if (::syscall(SYS_mlock, region.data_, region.mapped_bytes_) == 0) {
      region.locked_ = true;
    } else {
      region.lock_error_ = "mlock(" + std::to_string(region.mapped_bytes_) + " bytes) failed: " +
                           std::strerror(errno) + " (RLIMIT_MEMLOCK soft limit is " + memlock_limit_text() + ")";
    }
  }
  return region;
}

HostRegion::HostRegion(HostRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      huge_pages_(other.huge_pages_),
      huge_pages_note_(std::move(other.huge_pages_note_)),
      locked_(std::exchange(other.locked_, false)),
      lock_error_(std::move(other.lock_error_)) {}

HostRegion& HostRegion::operator=(HostRegion&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    huge_pages_ = other.huge_pages_;
    huge_pages_note_ = std::move(other.huge_pages_note_);
    locked_ = std::exchange(other.locked_, false);
    lock_error_ = std::move(other.lock_error_);
  }
  return *this;
}

HostRegion::~HostRegion() { unmap(); }

void HostRegion::unmap() noexcept {
  if (data_ != nullptr) {
    ::munmap(data_, mapped_bytes_);  // also drops an mlock
    data_ = nullptr;
    mapped_bytes_ = 0;
  }
}

}  // namespace tensorxfer::memory
