// Names the CPU in every Google Benchmark report ("cpu" in the context block),
// with what tensorxfer's kernels use on it, so that two tables from different
// machines cannot be confused. Included once by each *_bench.cc.
#pragma once

#include <benchmark/benchmark.h>

#include <fstream>
#include <string>

#include "tensorxfer/common/cpu_features.h"

namespace tensorxfer::bench {

inline std::string cpu_header() {
  std::string name = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  }
  const CpuFeatures& cpu = cpu_features();
  const auto forced = [](bool is_forced) { return is_forced ? std::string(" (forced)") : std::string(); };
  return name + " (" + cpu.vendor + " family " + std::to_string(cpu.family) + " model " + std::to_string(cpu.model) +
         "; AVX2 " + (cpu.avx2 ? "yes" : "no") + ", AVX-512 " + (cpu.avx512 ? "yes" : "no") + "; kernels " +
         vector_set_name(cpu.vector_set) + forced(cpu.vector_set_forced) + "; last-level cache " +
         std::to_string(cpu.last_level_cache_bytes >> 10) + " KiB" + forced(cpu.cache_forced) + "; " +
         std::to_string(cpu.usable_cpus) + " CPUs" + forced(cpu.cpus_forced) + ")";
}

// Registered before main (benchmark_main) runs.
inline const bool kCpuContextAdded = [] {
  benchmark::AddCustomContext("cpu", cpu_header());
  return true;
}();

}  // namespace tensorxfer::bench
