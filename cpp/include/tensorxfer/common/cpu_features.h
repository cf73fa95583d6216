// What the CPU offers the code paths that branch on it: the vector set of the
// copy and reduction kernels, the last-level cache size, and the CPUs this
// process may use. Read once per process, then immutable.
//
// Each can be forced, so that one machine runs the branches another CPU would
// take (an AVX2-only CPU on an AVX-512 one, a smaller cache, fewer cores):
//   TENSORXFER_CPU_VECTOR_SET   baseline | avx2 | avx512: the widest set the kernels
//                               may use (a cap: a set the CPU lacks stays off)
//   TENSORXFER_CPU_CACHE_BYTES  the last-level cache size, in bytes (> 0)
//   TENSORXFER_CPU_COUNT        the CPUs this process counts as usable (> 0)
// An invalid value leaves that item at what the CPU reports and is named in
// `override_error` (the Python package raises it at import).
#pragma once

#include <cstddef>
#include <string>

namespace tensorxfer {

// Kernel instruction sets, narrowest first. kBaseline is SSE2 on x86-64 and
// the compiler's own code elsewhere.
enum class VectorSet : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

const char* vector_set_name(VectorSet set) noexcept;

struct CpuFeatures {
  std::string vendor;      // CPUID's vendor string ("GenuineIntel", "AuthenticAMD"), "" if unknown
  int family = 0;          // CPUID's display family and model (x86-64), 0 if unknown
  int model = 0;
  bool avx2 = false;       // what the CPU reports (AVX2 with FMA and F16C for `avx2`)
  bool avx512 = false;     // AVX-512 Foundation
  VectorSet vector_set = VectorSet::kBaseline;  // the widest set the kernels use
  bool vector_set_forced = false;
  std::size_t last_level_cache_bytes = 0;       // 0 if unknown
  bool cache_forced = false;
  int usable_cpus = 1;                          // sched_getaffinity, at least 1
  bool cpus_forced = false;
  std::string override_error;                   // "" unless a TENSORXFER_CPU_* value was invalid
};

// The process's features, read on first use (thread-safe), overrides applied.
const CpuFeatures& cpu_features() noexcept;

// Whether kernels of `set` may run: the CPU has it and no override caps it.
inline bool vector_set_enabled(VectorSet set) noexcept {
  return static_cast<int>(cpu_features().vector_set) >= static_cast<int>(set);
}

}  // namespace tensorxfer
