// Host memory advice on the whole pages a tensor covers: populate (prefault)
// them, hint that they will be needed, and count how many are resident.
//
// Every call takes a TensorView and validates it (host memory, C-contiguous);
// an empty view is a no-op. Advice applies to whole pages, so bytes that share
// the first or last page with the tensor are affected too (never modified).
#pragma once

#include <cstddef>
#include <string>

#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::memory {

// The system page size in bytes (sysconf(_SC_PAGESIZE)).
std::size_t page_size() noexcept;

// The page-aligned span [begin, begin + length) covering [data, data + nbytes).
// For nbytes == 0 the span is empty (begin = data rounded down, length 0).
struct PageSpan {
  char* begin = nullptr;
  std::size_t length = 0;
  std::size_t page_count() const noexcept;
};
PageSpan page_span_of(const void* data, std::size_t nbytes) noexcept;

// How populate_pages prefaults pages.
enum class PopulateMethod {
  kAuto,             // madvise(MADV_POPULATE_*), else touching every page
  kMadvisePopulate,  // madvise(MADV_POPULATE_WRITE) (MADV_POPULATE_READ for read-only views)
  kTouch,            // one atomic no-op read-modify-write per page (a read for read-only views)
};
const char* populate_method_name(PopulateMethod method) noexcept;

struct PopulateResult {
  PopulateMethod method = PopulateMethod::kAuto;  // the method actually used
  std::size_t bytes = 0;                          // bytes of the view
  std::size_t pages = 0;                          // whole pages populated
  bool will_need_hinted = false;                  // madvise(MADV_WILLNEED) succeeded
};

// Makes every page `view` covers resident and mapped (writable unless the view
// is read-only), then hints MADV_WILLNEED. Contents are never changed.
// Throws InvalidArgument for a non-host or non-contiguous view, SystemError when
// the populate madvise fails for a reason other than "unsupported by this
// kernel", Unsupported when kMadvisePopulate is forced on a kernel without it.
// Thread-safe: concurrent writers to the same pages keep their values.
PopulateResult populate_pages(const TensorView& view, const char* argument,
                              PopulateMethod method = PopulateMethod::kAuto);

// How many of the pages `view` covers are resident in RAM now (mincore).
// Throws InvalidArgument for a non-host or non-contiguous view, SystemError if
// mincore fails.
std::size_t resident_page_count(const TensorView& view, const char* argument);

}  // namespace tensorxfer::memory
