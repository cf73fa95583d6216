// What holds an IpcMemory's regions: shared segments (host) or CUDA
// allocations. Private to cpp/src/collectives.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/collectives/signal_layout.h"

namespace tensorxfer::collectives {

struct IpcMemory::Backing {
  virtual ~Backing() = default;
  virtual MemoryDevice device() const noexcept = 0;
  // What a peer passes to map_peer to map this rank's region.
  virtual const std::string& local_handle() const noexcept = 0;
  // The start of this rank's layout (its SignalHeader).
  virtual std::byte* local_base() const noexcept = 0;
  // Maps rank `rank`'s region from its handle, validates it, returns its base.
  virtual std::byte* map_peer(int rank, const std::string& handle) = 0;
  virtual void release_handles() noexcept = 0;
  // Unmaps the peers' regions, keeping this rank's own (CUDA: cudaIpcCloseMemHandle,
  // so an exporter may free once every rank did this; host: nothing to do early).
  virtual void close_peer_mappings() noexcept {}
  // Throws PeerLost naming the lowest rank whose region's creator exited.
  virtual void check_peers_alive() const = 0;
  // False once rank `rank`'s creator exited or closed (true when it cannot tell).
  virtual bool peer_alive(int rank) const noexcept = 0;
  virtual void close() noexcept = 0;
};

// This rank's host region: one shared segment holding `layout`, header written.
std::unique_ptr<IpcMemory::Backing> make_host_backing(const SignalLayout& layout, int rank);
// The CUDA variant on GPU `cuda_device` (-1: the current one); throws Unsupported in
// builds without CUDA or without a device, InvalidArgument for a device not present.
std::unique_ptr<IpcMemory::Backing> make_cuda_backing(const SignalLayout& layout, int rank, int cuda_device);

}  // namespace tensorxfer::collectives
