// The fake runtime's process-wide state, shared by its source files (not a public header).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fake_cuda.h"

namespace tensorxfer::cuda_fake {

// At the start of every fake device allocation's memfd: what an importing process
// reads to validate a handle and to count itself as a user of the allocation.
struct SharedHeader {
  std::uint64_t magic;
  std::uint64_t bytes;
  int imports;  // processes with the allocation open (atomic builtins only)
};
inline constexpr std::uint64_t kHeaderMagic = 0x7478666b63756461ULL;  // "txfkcuda"
inline constexpr std::size_t kHeaderBytes = 4096;

enum class MemoryKind { kDevice, kManaged, kImported };

struct Mapping {
  MemoryKind kind = MemoryKind::kDevice;
  std::size_t bytes = 0;
  int device = 0;
  int fd = -1;                    // own allocations: the memfd an importer opens
  std::uint64_t id = 0;           // own allocations: unique in this process
  void* mapping = nullptr;        // header + data
  int exporter_pid = 0;           // imports
  std::uint64_t exporter_id = 0;  // imports
  int open_count = 0;             // imports: cudaIpcOpenMemHandle calls not yet closed
  SharedHeader* header() const { return static_cast<SharedHeader*>(mapping); }
};

// The bytes of a cudaIpcMemHandle_t made by this fake.
struct HandleBytes {
  std::uint64_t magic;
  int pid;
  int fd;
  std::uint64_t id;
  std::uint64_t bytes;
};
static_assert(sizeof(HandleBytes) <= sizeof(cudaIpcMemHandle_t), "handle must fit");

struct Rule {
  int error = 0;
  int skip = 0;
  int times = 0;  // < 0: forever
};

struct State {
  std::recursive_mutex mutex;  // recursive: a body holding it may end with Entry::finish
  int device_count = 1;
  int driver_version = CUDART_VERSION;
  bool concurrent_managed_access = true;
  std::map<std::string, Rule> rules;
  std::vector<Call> log;
  std::uint64_t next_sequence = 1;
  std::uint64_t gil_violations = 0;
  std::uint64_t freed_while_imported = 0;
  std::vector<bool> contexts = std::vector<bool>(64, false);
  std::map<std::uintptr_t, Mapping> memory;               // user pointer -> mapping
  std::map<std::uintptr_t, std::size_t> registered;       // base -> bytes
  std::uint64_t next_allocation_id = 1;
  std::vector<ManagedRequest> managed_requests;
  std::map<std::uintptr_t, int> events;                   // live events -> device
  std::map<std::uintptr_t, int> streams;                  // streams created here -> device
};

State& state();

// How a call needs the machine.
enum class Needs {
  kNothing,  // error strings, versions, last error: work without a driver
  kDriver,   // device count, attributes, current device: no context
  kContext,  // everything else: creates the current device's primary context
};

// The start of every fake CUDA call: logs it and decides its result unless the
// function then returns `finish(...)`. Holds no lock when the function body runs.
class Entry {
 public:
  Entry(const char* function, std::string arguments, Needs needs, bool blocking = false);
  // The result decided at entry (an injected failure, no driver): cudaSuccess to proceed.
  cudaError_t early() const noexcept { return early_; }
  // Records `result` as the call's result (and the thread's last error), returns it.
  cudaError_t finish(cudaError_t result);

 private:
  std::size_t index_ = 0;
  cudaError_t early_ = cudaSuccess;
};

// The calling thread's last error (cudaGetLastError resets it, cudaPeekAtLastError does not).
cudaError_t take_last_error(bool reset);
// The calling thread's current device.
int& current_device();
// Formats a pointer / number for the log.
std::string hex(const void* pointer);

}  // namespace tensorxfer::cuda_fake

// Ends a fake function with the entry's early result when there is one.
#define TX_FAKE_RETURN_EARLY(entry) \
  do {                              \
    if ((entry).early() != cudaSuccess) return (entry).finish((entry).early()); \
  } while (0)
