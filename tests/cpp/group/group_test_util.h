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

namespace tensorxfer::testing {

inline std::string unique_group_name(const std::string& what) {
  static std::atomic<int> counter{0};
  return "gtest-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

inline std::string group_path(const std::string& group_name) {
  return "/dev/shm" + group::group_segment_name(group_name);
}

// Runs body(rank) on `world_size` threads; rethrows the first exception any raised.
inline void run_ranks(int world_size, const std::function<void(int)>& body) {
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace tensorxfer::testing
