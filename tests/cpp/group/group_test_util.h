// Helpers for LocalGroup tests: unique group names, ranks as threads.
#pragma once

#include <unistd.h>

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorxfer/group/group_layout.h"
#include "support/run_ranks.h"

namespace tensorxfer::testing {

inline std::string unique_group_name(const std::string& what) {
  static std::atomic<int> counter{0};
  return "gtest-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

inline std::string group_path(const std::string& group_name) {
  return "/dev/shm" + group::group_segment_name(group_name);
}


}  // namespace tensorxfer::testing
