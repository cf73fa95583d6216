// Threads as ranks: a local group of IpcMemory / Communicator objects made in
// one process, and a harness that runs one body per rank.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorxfer/collectives/communicator.h"
#include "tensorxfer/collectives/ipc_memory.h"
#include "support/run_ranks.h"

namespace tensorxfer::testing {

// How long a rank of these tests waits in a collective before it fails the test.
inline constexpr std::chrono::nanoseconds kTimeout = std::chrono::seconds(30);

// Every rank's IpcMemory, mapped (the handle exchange is a vector).
inline std::vector<collectives::IpcMemory> make_ipc_group(int world, std::size_t nbytes) {
  std::vector<collectives::IpcMemory> memories;
  std::vector<std::string> handles;
  for (int rank = 0; rank < world; ++rank) {
    memories.push_back(collectives::IpcMemory::create_local(rank, world, nbytes, collectives::MemoryDevice::kHost));
    handles.push_back(memories.back().local_handle());
  }
  for (auto& memory : memories) memory.map_peers(handles);
  for (auto& memory : memories) memory.release_handles();
  return memories;
}

inline std::vector<std::unique_ptr<collectives::Communicator>> make_communicators(int world, std::size_t max_bytes,
                                                                                  std::size_t buffer_bytes = 0) {
  auto memories = make_ipc_group(world, collectives::Communicator::required_data_nbytes(max_bytes, buffer_bytes, world));
  std::vector<std::unique_ptr<collectives::Communicator>> communicators;
  for (auto& memory : memories) {
    communicators.push_back(
        std::make_unique<collectives::Communicator>(std::move(memory), max_bytes, buffer_bytes));
  }
  return communicators;
}


}  // namespace tensorxfer::testing
