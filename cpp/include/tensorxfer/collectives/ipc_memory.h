// IpcMemory: a data region and barrier words per rank of a local group, every
// rank's mapped into every process (the shape of TVM's CUDAIPCMemoryObj).
//
// Public members, as in the reference:
//   num_workers, worker_id          the group's size and this process's rank
//   remote_data[i]                  rank i's data region in this process (own rank: the local one)
//   barrier_in[i], barrier_out[i]   rank i's barrier FlagLine arrays (signal_layout.h), same arrangement
//   barrier_flag                    the last epoch used; only increases (64-bit: no wraparound)
//
// Host memory: each rank creates one shared segment ("/tensorxfer-...", 0600,
// O_EXCL, kind "COLL") holding a SignalLayout; the names are all-gathered; each
// rank attaches to every peer's (header validated: corrupted or truncated
// segments raise CorruptSegment); after a group barrier (everyone mapped) each
// rank unlinks its own name, so /dev/shm is clean from then on, even if a rank
// is SIGKILLed later.
//
// CUDA memory (device kCuda, builds with TENSORXFER_WITH_CUDA): the same
// layout in one cudaMalloc allocation per rank; handles from
// cudaIpcGetMemHandle are all-gathered and opened with cudaIpcOpenMemHandle.
// The barrier words are zeroed and the device synchronised before the handle
// is published. Host code must not touch those pointers.
//
// Construction is collective; it can be run in steps (create_local, exchange
// local_handle() between ranks, map_peers, a barrier, release_handles) so the
// group is needed only at the edges, or in one call with an Exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorxfer/collectives/signal_layout.h"
#include "tensorxfer/sync/futex.h"

namespace tensorxfer::collectives {

enum class MemoryDevice { kHost, kCuda };

class IpcMemory {
 public:
  // The reference's fields (see the top of this file).
  int num_workers = 0;
  int worker_id = 0;
  std::vector<void*> remote_data;
  std::vector<void*> barrier_in;
  std::vector<void*> barrier_out;
  uint64_t barrier_flag = 0;

  // How ranks talk while constructing: all_gather(mine) returns every rank's
  // string in rank order; barrier() returns once every rank called it. Both
  // throw (e.g. PeerLost) on failure.
  struct Exchange {
    std::function<std::vector<std::string>(const std::string&)> all_gather;
    std::function<void()> barrier;
  };

  // Collective: all four steps below. Throws InvalidArgument for a rank
  // outside [0, world_size), world_size outside [1, kMaxWorldSize];
  // Unsupported for kCuda in a build without CUDA or without a device.
  static IpcMemory create(int rank, int world_size, std::size_t data_nbytes, MemoryDevice device,
                          const Exchange& exchange);

  // Step 1: this rank's region (zeroed), not yet mapped by anyone else. kCuda:
  // on GPU `cuda_device` (-1: the device current on this thread), which every
  // later CUDA call of this object makes current again.
  static IpcMemory create_local(int rank, int world_size, std::size_t data_nbytes, MemoryDevice device,
                                int cuda_device = -1);
  // What peers need to map this rank's region (a segment name, or CUDA handle bytes).
  const std::string& local_handle() const;
  // Step 2: map every rank's region; `handles` in rank order (own entry ignored).
  // Validates each (CorruptSegment, PeerLost when its creator has exited).
  void map_peers(const std::vector<std::string>& handles);
  // Step 3, after every rank mapped (a group barrier): removes this rank's
  // name from /dev/shm (host); nothing for CUDA. Idempotent, never throws.
  void release_handles() noexcept;

  IpcMemory(IpcMemory&& other) noexcept;
  IpcMemory& operator=(IpcMemory&& other) noexcept;
  IpcMemory(const IpcMemory&) = delete;
  IpcMemory& operator=(const IpcMemory&) = delete;
  ~IpcMemory();  // close(), then unmaps

  MemoryDevice device() const noexcept;
  std::size_t data_nbytes() const noexcept;
  bool is_mapped() const noexcept;  // map_peers has run and close() has not
  bool is_closed() const noexcept;

  // Typed access to rank `rank`'s signal words (host memory only).
  FlagLine* in_lines(int rank) const noexcept { return static_cast<FlagLine*>(barrier_in[rank]); }
  FlagLine* out_lines(int rank) const noexcept { return static_cast<FlagLine*>(barrier_out[rank]); }
  sync::EventCount& wake(int rank) const noexcept { return wake_line(rank).wake; }
  WakeLine& wake_line(int rank) const noexcept { return *wake_[static_cast<std::size_t>(rank)]; }
  std::byte* data(int rank) const noexcept { return static_cast<std::byte*>(remote_data[rank]); }

  // Throws PeerLost naming the lowest rank whose region's creator has exited
  // or closed its IpcMemory (host: the segment's liveness lock). One fcntl per peer.
  void check_peers_alive() const;
  // False once rank `rank`'s creator exited or closed; true when it cannot tell.
  bool peer_alive(int rank) const noexcept;

  // CUDA: closes this rank's imports of the peers' allocations, keeping its own,
  // so that after a group barrier every rank may free its allocation (close()).
  // Host: nothing. The peers' entries of the public vectors become null. Never throws.
  void close_peer_mappings() noexcept;

  // Ends this rank's use: host segments are detached (and unlinked) but stay
  // mapped until destruction, so views made earlier never dangle; CUDA handles
  // are closed and the allocation freed. The public vectors are cleared to
  // null pointers. Idempotent; never throws.
  void close() noexcept;

  struct Backing;  // host segments or CUDA allocations (ipc_memory.cc, ipc_memory_cuda.cc)

 private:
  IpcMemory() = default;
  void check_rank_arguments(int rank, int world_size) const;

  std::unique_ptr<Backing> backing_;
  std::unique_ptr<Backing> retired_;  // closed, still mapped until destruction
  std::vector<WakeLine*> wake_;
  std::size_t data_nbytes_ = 0;
};

}  // namespace tensorxfer::collectives
