#include "tensorxfer/common/cuda_runtime_calls.h"

#include <atomic>

namespace tensorxfer {
namespace {

// A statistic, not a state: nothing is ordered by it, so relaxed increments and loads suffice.
std::atomic<std::uint64_t> cuda_runtime_call_count{0};

}  // namespace

void count_cuda_runtime_call() noexcept { cuda_runtime_call_count.fetch_add(1, std::memory_order_relaxed); }

std::uint64_t cuda_runtime_calls() noexcept { return cuda_runtime_call_count.load(std::memory_order_relaxed); }

}  // namespace tensorxfer
