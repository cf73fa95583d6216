// A process-wide count of the CUDA runtime calls tensorxfer makes, so a test can
// prove that host-only paths never touch CUDA: a forked child must not
// initialise a CUDA context its parent may hold, and a host-only job must not
// pay for one. Every cuda* call in the core is wrapped in TENSORXFER_CUDA_CALL.
#pragma once

#include <cstdint>

namespace tensorxfer {

// Adds one to the count. Never throws.
void count_cuda_runtime_call() noexcept;

// The CUDA runtime calls made through tensorxfer so far in this process
// (inherited across fork; always 0 in a build without CUDA).
std::uint64_t cuda_runtime_calls() noexcept;

}  // namespace tensorxfer

// Evaluates `call` (a cuda* runtime call) after counting it.
#define TENSORXFER_CUDA_CALL(call) (::tensorxfer::count_cuda_runtime_call(), (call))
