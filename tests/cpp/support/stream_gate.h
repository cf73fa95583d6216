// A HostStream task that blocks its stream until open() is called, or 10 s
// pass so a failing test cannot hang the suite.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "tensorxfer/runtime/stream.h"

namespace tensorxfer::testing {

class StreamGate {
 public:
  runtime::HostStream::Task task() {
    return [this] {
      entered_.store(true);
      std::unique_lock<std::mutex> lock(mutex_);
      opened_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    };
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  // True once the stream has started running the gate's task.
  bool entered() const { return entered_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
  std::atomic<bool> entered_{false};
};

}  // namespace tensorxfer::testing
