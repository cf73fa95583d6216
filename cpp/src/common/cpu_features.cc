#include "tensorxfer/common/cpu_features.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tensorxfer {
namespace {

// Size in bytes of the highest-level cache of CPU 0 as the kernel describes it
// (/sys/devices/system/cpu/cpu0/cache/indexN/{level,size}: one instance, the
// part this CPU shares), 0 if unknown.
std::size_t kernel_reported_cache_bytes() {
  int best_level = 0;
  std::size_t best_bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string folder = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(folder + "level");
    std::ifstream size_file(folder + "size");
    int level = 0;
    std::size_t size = 0;
    char unit = 0;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;
    const std::size_t scale = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1;
    if (level > best_level) {
      best_level = level;
      best_bytes = size * scale;
    }
  }
  return best_bytes;
}

std::size_t reported_cache_bytes() {
  // The kernel's figure first: in a VM, glibc's sysconf can report the
  // host's whole L3 (384 MiB on an AMD EPYC VM whose kernel says 32 MiB).
  if (const std::size_t reported = kernel_reported_cache_bytes(); reported > 0) return reported;
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long size = ::sysconf(name);
    if (size > 0) return static_cast<std::size_t>(size);
  }
  return 0;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

void read_cpuid(CpuFeatures& features) {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    features.vendor = vendor;
  }
  bool f16c = false;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    const int base_family = static_cast<int>((eax >> 8) & 0xF);
    const int base_model = static_cast<int>((eax >> 4) & 0xF);
    features.family = base_family == 0xF ? base_family + static_cast<int>((eax >> 20) & 0xFF) : base_family;
    features.model = (base_family == 0x6 || base_family == 0xF)
                         ? base_model + (static_cast<int>((eax >> 16) & 0xF) << 4)
                         : base_model;
    // F16C is CPUID leaf 1, ECX bit 29 (clang before 15 has no "f16c" in __builtin_cpu_supports).
    f16c = (ecx >> 29) & 1U;
  }
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wider registers.
  features.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  features.avx512 = features.avx2 && __builtin_cpu_supports("avx512f");
#else
  (void)features;
#endif
}

// "name=value" for error messages.
std::string setting(const char* name, const char* value) { return std::string(name) + "=" + value; }

// A positive integer from the environment variable `name`, or 0 (unset or
// invalid; invalid also sets `error`).
unsigned long long positive_override(const char* name, std::string& error) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value == 0 || text[0] == '-') {
    error += (error.empty() ? "" : "; ") + setting(name, text) + ": expected a positive integer";
    return 0;
  }
  return value;
}

CpuFeatures read_features() {
  CpuFeatures features;
  read_cpuid(features);
  features.vector_set = features.avx512 ? VectorSet::kAvx512 : features.avx2 ? VectorSet::kAvx2 : VectorSet::kBaseline;
  features.last_level_cache_bytes = reported_cache_bytes();
  features.usable_cpus = affinity_cpus();

  if (const char* text = std::getenv("TENSORXFER_CPU_VECTOR_SET"); text != nullptr && *text != '\0') {
    bool known = false;
    for (const VectorSet set : {VectorSet::kBaseline, VectorSet::kAvx2, VectorSet::kAvx512}) {
      if (std::strcmp(text, vector_set_name(set)) != 0) continue;
      known = true;
      if (static_cast<int>(set) < static_cast<int>(features.vector_set)) {
        features.vector_set = set;
        features.vector_set_forced = true;
      }
    }
    if (!known) {
      features.override_error = setting("TENSORXFER_CPU_VECTOR_SET", text) + ": expected baseline, avx2 or avx512";
    }
  }
  if (const auto bytes = positive_override("TENSORXFER_CPU_CACHE_BYTES", features.override_error); bytes > 0) {
    features.last_level_cache_bytes = static_cast<std::size_t>(bytes);
    features.cache_forced = true;
  }
  if (const auto cpus = positive_override("TENSORXFER_CPU_COUNT", features.override_error); cpus > 0) {
    features.usable_cpus = cpus > 4096 ? 4096 : static_cast<int>(cpus);
    features.cpus_forced = true;
  }
  return features;
}

}  // namespace

const char* vector_set_name(VectorSet set) noexcept {
  switch (set) {
    case VectorSet::kAvx2: return "avx2";
    case VectorSet::kAvx512: return "avx512";
    case VectorSet::kBaseline: break;
  }
  return "baseline";
}

const CpuFeatures& cpu_features() noexcept {
  // Reading sysfs and the environment allocates; a failure there leaves the defaults.
  static const CpuFeatures features = []() noexcept {
    try {
      return read_features();
    } catch (...) {
      return CpuFeatures{};
    }
  }();
  return features;
}

}  // namespace tensorxfer
