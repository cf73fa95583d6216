#include "tensorxfer/memory/advice.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorxfer/common/error.h"

namespace tensorxfer::memory {
namespace {

// Older C libraries lack the names; the values are the kernel's (Linux 5.14+).
#ifndef MADV_POPULATE_READ
constexpr int MADV_POPULATE_READ = 22;
#endif
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;
#endif

void require_advisable(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
}

// Touches one byte of every page, always inside the tensor's own bytes (the
// first tensor byte on each page), so nothing outside the tensor is accessed.
void touch_pages(const TensorView& view, const PageSpan& span) {
  const std::size_t page = page_size();
  auto* first = static_cast<unsigned char*>(view.data);
  auto* last = first + view.nbytes();
  for (std::size_t i = 0; i < span.page_count(); ++i) {
    unsigned char* target = reinterpret_cast<unsigned char*>(span.begin) + i * page;
    if (target < first) target = first;
    if (target >= last) break;
    if (view.readonly) {
      // A volatile read maps the page without needing write access.
      (void)*static_cast<volatile unsigned char*>(target);
    } else {
      // An atomic add of zero takes a write fault but cannot lose a concurrent
      // writer's value; relaxed: no ordering with other memory is needed.
      __atomic_fetch_add(target, static_cast<unsigned char>(0), __ATOMIC_RELAXED);
    }
  }
}

// Returns false when this kernel does not know MADV_POPULATE_* (EINVAL).
bool madvise_populate(const TensorView& view, const PageSpan& span) {
  const int advice = view.readonly ? MADV_POPULATE_READ : MADV_POPULATE_WRITE;
  while (::madvise(span.begin, span.length, advice) != 0) {
    if (errno == EINTR || errno == EAGAIN) continue;
    if (errno == EINVAL) return false;
    throw_system_error(std::string("madvise(") +
                       (view.readonly ? "MADV_POPULATE_READ" : "MADV_POPULATE_WRITE") + ", " +
                       std::to_string(span.length) + " bytes)");
  }
  return true;
}

}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

std::size_t PageSpan::page_count() const noexcept { return length / page_size(); }

PageSpan page_span_of(const void* data, std::size_t nbytes) noexcept {
  const std::uintptr_t page = page_size();
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = address & ~(page - 1);
  PageSpan span;
  span.begin = reinterpret_cast<char*>(begin);
  if (nbytes == 0) return span;
  const std::uintptr_t end = (address + nbytes + page - 1) & ~(page - 1);
  span.length = end - begin;
  return span;
}

const char* populate_method_name(PopulateMethod method) noexcept {
  switch (method) {
    case PopulateMethod::kAuto: return "auto";
    case PopulateMethod::kMadvisePopulate: return "madvise_populate";
    case PopulateMethod::kTouch: return "touch";
  }
  return "unknown";
}

PopulateResult populate_pages(const TensorView& view, const char* argument, PopulateMethod method) {
  require_advisable(view, argument);
  PopulateResult result;
  result.bytes = view.nbytes();
  const PageSpan span = page_span_of(view.data, result.bytes);
  result.method = method;
  if (span.length == 0) return result;
  result.pages = span.page_count();

  if (method != PopulateMethod::kTouch) {
    if (madvise_populate(view, span)) {
      result.method = PopulateMethod::kMadvisePopulate;
    } else if (method == PopulateMethod::kMadvisePopulate) {
      throw Unsupported("madvise(MADV_POPULATE_WRITE/READ) is not supported by this kernel "
                        "(needs Linux 5.14+); use PopulateMethod::kTouch or kAuto");
    } else {
      method = PopulateMethod::kTouch;
    }
  }
  if (method == PopulateMethod::kTouch) {
    touch_pages(view, span);
    result.method = PopulateMethod::kTouch;
  }
  // WILLNEED is only a hint (it starts swap-in / readahead); its failure is reported, not raised.
  result.will_need_hinted = ::madvise(span.begin, span.length, MADV_WILLNEED) == 0;
  return result;
}

std::size_t resident_page_count(const TensorView& view, const char* argument) {
  require_advisable(view, argument);
  const PageSpan span = page_span_of(view.data, view.nbytes());
  if (span.length == 0) return 0;
  std::vector<unsigned char> residency(span.page_count());
  if (::mincore(span.begin, span.length, residency.data()) != 0) {
    throw_system_error("mincore(" + std::to_string(span.length) + " bytes)");
  }
  std::size_t resident = 0;
  for (unsigned char flags : residency) resident += flags & 1U;
  return resident;
}

}  // namespace tensorxfer::memory
