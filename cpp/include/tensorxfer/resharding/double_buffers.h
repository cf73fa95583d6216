// The slots a pipelined transfer moves batches through: on every rank two
// send slots (packed locally) and two receive slots (written by peers).
// Iteration i uses send slot i % 2 and receive slot i % 2, so packing the next
// iteration and unpacking the previous one overlap with sending this one.
#pragma once

#include <cstddef>

#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::resharding {

// Words of one barrier's operation tag: operation, barrier index, barrier count.
inline constexpr std::size_t kTagWords = 3;

// Implemented over memory every rank maps (collectives::IpcMemory in
// production, plain buffers shared by threads in tests). Every pointer stays
// valid and slot_nbytes() long for the object's lifetime.
class DoubleBuffers {
 public:
  virtual ~DoubleBuffers() = default;

  // Bytes in each slot; equal on every rank.
  virtual std::size_t slot_nbytes() const noexcept = 0;
  // How many ranks share the slots (peer_receive_slot takes 0..world_size()-1).
  virtual int world_size() const noexcept = 0;
  // False once the memory behind the slots is released: no pointer may be used then.
  virtual bool is_open() const noexcept = 0;
  // This rank's own slots, index 0 or 1.
  virtual std::byte* send_slot(int index) noexcept = 0;
  virtual std::byte* receive_slot(int index) noexcept = 0;
  // Receive slot `index` of rank `pe`, as mapped in this process (pe may be
  // this rank: then receive_slot(index)).
  virtual std::byte* peer_receive_slot(int pe, int index) noexcept = 0;
  // Rank `pe`'s kTagWords operation-tag words for barriers of parity 0 or 1,
  // in memory every rank sees; zero at first.
  // The executor tags its barriers with them (PipelineExecutor::execute_pipeline).
  virtual sync::SharedWord64* operation_tag(int pe, int parity) noexcept = 0;
  // Collective: returns once every rank of the group has entered the same
  // number of barriers; everything a rank wrote before entering is visible to
  // every rank after leaving. Throws Timeout or PeerLost instead of hanging.
  virtual void barrier() = 0;
};

}  // namespace tensorxfer::resharding
