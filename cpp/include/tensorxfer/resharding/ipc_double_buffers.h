// DoubleBuffers over an IpcMemory every rank of a LocalGroup maps: rank r's
// data region holds [send slot 0 | send slot 1 | receive slot 0 | receive slot 1 |
// operation tags (64 bytes)], and barrier() is the group's barrier.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/group/local_group.h"
#include "tensorxfer/resharding/double_buffers.h"
#include "tensorxfer/resharding/transfer_task.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::resharding {

class IpcDoubleBuffers final : public DoubleBuffers {
 public:
  // Every region of `memory` must hold 4 * slot_nbytes bytes (InvalidArgument
  // otherwise); `memory` and `group` must outlive this object.
  IpcDoubleBuffers(collectives::IpcMemory& memory, group::LocalGroup& group, std::size_t slot_nbytes);

  // The bytes one rank's region needs for slots of `slot_nbytes` (overflow-checked).
  static std::size_t region_nbytes(std::size_t slot_nbytes);

  // Starts a call's wait: every barrier() until the next set_wait shares one deadline,
  // `timeout` from now (nanoseconds::max(): none), and runs `hook` while it waits. A
  // call that barriers many times (a pipeline, a persistent run) waits at most
  // `timeout` in all, not `timeout` per barrier. Default: no deadline, no hook.
  void set_wait(std::chrono::nanoseconds timeout, sync::WaitHook hook);

  std::size_t slot_nbytes() const noexcept override { return slot_nbytes_; }
  int world_size() const noexcept override { return memory_.num_workers; }
  bool is_open() const noexcept override { return memory_.is_mapped() && !group_.closed(); }
  std::byte* send_slot(int index) noexcept override { return region(memory_.worker_id) + index * slot_nbytes_; }
  std::byte* receive_slot(int index) noexcept override { return peer_receive_slot(memory_.worker_id, index); }
  std::byte* peer_receive_slot(int pe, int index) noexcept override {
    return region(pe) + (2 + index) * slot_nbytes_;
  }
  sync::SharedWord64* operation_tag(int pe, int parity) noexcept override {
    return reinterpret_cast<sync::SharedWord64*>(region(pe) + 4 * slot_nbytes_) + kTagWords * parity;
  }
  void barrier() override;

 private:
  std::byte* region(int rank) const noexcept { return static_cast<std::byte*>(memory_.remote_data[rank]); }

  collectives::IpcMemory& memory_;
  group::LocalGroup& group_;
  std::size_t slot_nbytes_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;  // none: wait forever
  sync::WaitHook hook_;
};

}  // namespace tensorxfer::resharding
