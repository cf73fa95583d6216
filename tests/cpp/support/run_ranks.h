// Threads as ranks: the one harness every suite of the group, collectives and
// resharding layers uses.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tensorxfer::testing {

// Runs body(rank) on `world_size` threads; rethrows the first exception any
// raised (collected under a mutex) once every thread has finished.
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
