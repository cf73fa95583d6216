// In-process double buffers for the resharding tests: threads play the ranks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/resharding/double_buffers.h"

namespace tensorxfer::resharding::testing {

// Every rank's four slots plus a generation barrier, shared by the threads.
class ThreadFabric {
 public:
  ThreadFabric(int world_size, std::size_t slot_nbytes)
      : world_size_(world_size), slot_nbytes_(slot_nbytes),
        slots_(static_cast<std::size_t>(world_size) * 4, std::vector<std::byte>(slot_nbytes)),
        tags_(static_cast<std::size_t>(world_size) * 2 * kTagWords, sync::SharedWord64{0}) {}

  std::byte* slot(int rank, int kind, int index) {  // kind 0: send, 1: receive
    return slots_[static_cast<std::size_t>(rank * 4 + kind * 2 + index)].data();
  }
  std::size_t slot_nbytes() const { return slot_nbytes_; }
  int world_size() const { return world_size_; }
  sync::SharedWord64* tag(int rank, int parity) {
    return &tags_[static_cast<std::size_t>((rank * 2 + parity)) * kTagWords];
  }

  void barrier(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, timeout, [&] { return generation_ != generation; })) {
      throw Timeout("barrier timed out");
    }
  }

 private:
  int world_size_;
  std::size_t slot_nbytes_;
  std::vector<std::vector<std::byte>> slots_;
  std::vector<sync::SharedWord64> tags_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ThreadBuffers final : public DoubleBuffers {
 public:
  ThreadBuffers(ThreadFabric& fabric, int rank, unsigned delay_seed)
      : fabric_(fabric), rank_(rank), random_(delay_seed) {}
  // Sleep a random 0-300 us before each barrier, so ranks drift apart.
  bool delays = false;
  std::chrono::milliseconds timeout{10000};
  std::size_t slot_nbytes() const noexcept override { return fabric_.slot_nbytes(); }
  int world_size() const noexcept override { return fabric_.world_size(); }
  bool is_open() const noexcept override { return open; }
  bool open = true;
  std::byte* send_slot(int index) noexcept override { return fabric_.slot(rank_, 0, index); }
  std::byte* receive_slot(int index) noexcept override { return fabric_.slot(rank_, 1, index); }
  std::byte* peer_receive_slot(int pe, int index) noexcept override { return fabric_.slot(pe, 1, index); }
  sync::SharedWord64* operation_tag(int pe, int parity) noexcept override { return fabric_.tag(pe, parity); }
  void barrier() override {
    if (delays) std::this_thread::sleep_for(std::chrono::microseconds(random_() % 300));
    fabric_.barrier(timeout);
  }

 private:
  ThreadFabric& fabric_;
  int rank_;
  std::minstd_rand random_;
};

}  // namespace tensorxfer::resharding::testing
