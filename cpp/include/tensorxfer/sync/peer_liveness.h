// Process identities that survive pid reuse, and a check that one is still alive.
//
// A pid alone is not an identity: after a process exits the kernel may hand
// its pid to an unrelated process. ProcessIdentity adds the process start time
// (field 22 of /proc/<pid>/stat, clock ticks since boot), which a reused pid
// does not share. The struct is trivially copyable and holds no pointers so it
// can live in shared memory.
//
// Limits: a pid is only meaningful inside one PID namespace. A process in
// another namespace (a container sharing /dev/shm but not PIDs) records a pid
// that means nothing (or someone else) here, so is_alive() calls it dead. Use
// it for messages and for processes known to share our namespace (our own
// children); judge peers across processes with sync/liveness_lock.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace tensorxfer::sync {

struct ProcessIdentity {
  int32_t pid = 0;
  uint32_t reserved = 0;   // keeps start_ticks 8-byte aligned; always 0
  uint64_t start_ticks = 0;

  bool operator==(const ProcessIdentity& other) const noexcept {
    return pid == other.pid && start_ticks == other.start_ticks;
  }
  bool operator!=(const ProcessIdentity& other) const noexcept { return !(*this == other); }
  // "pid 1234 (start 5678)"
  std::string describe() const;
};
static_assert(std::is_trivially_copyable_v<ProcessIdentity>);
static_assert(sizeof(ProcessIdentity) == 16);

// The identity of the calling process. Reads /proc/self/stat on every call (a
// fork()ed child gets its own identity). Throws SystemError if /proc is unreadable.
ProcessIdentity current_process_identity();

// The identity of process `pid`, or an identity with pid 0 if no such process
// exists (or it is a zombie). Never throws.
ProcessIdentity identity_of(pid_t pid) noexcept;

// True while the process named by `identity` exists, has not exited (zombies
// count as exited) and is the same process (same start time). False for pid <= 0.
// Never throws; costs one read of /proc/<pid>/stat.
bool is_alive(const ProcessIdentity& identity) noexcept;

}  // namespace tensorxfer::sync
