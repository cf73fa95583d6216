// Liveness that holds across PID namespaces: participant k of a shared file is
// alive while it holds an exclusive lock on the file's liveness byte k.
//
// Why locks, not pids: processes that share /dev/shm but not a PID namespace
// (two containers of one pod) cannot see each other's pids, so "is /proc/<pid>
// there" calls a live peer dead. A record lock belongs to the file (the inode),
// so every process that can open the file sees it, whatever its namespace; and
// the kernel drops it when its holder exits, however it dies (SIGKILL included).
//
// Which locks: open-file-description locks (F_OFD_SETLK, Linux >= 3.15). They
// belong to one open file description, not to the process, so
//  * one process may hold several participants of one file, and each one's
//    liveness is visible to the others (classic POSIX locks never conflict
//    within a process, so a process could not observe its own participants);
//  * closing some other descriptor of the file drops nothing (closing ANY
//    descriptor drops all of a process's classic POSIX locks on the file).
// Each LivenessLock opens its own description of the file (via
// /proc/self/fd/<fd>, so it works after the name was unlinked) and keeps it in
// a ProcessLocalFd: a fork()ed child never shares it, so a child never keeps a
// dead parent "alive" (sync/process_local_fd.h).
//
// Where: participant k locks the one byte at kLivenessByteBase + k, far past
// any data (advisory locks do not touch the data; ranges past the end of the
// file are allowed).
//
// Contract for users of a shared file (a segment, a group):
//  * a participant calls try_hold(fd, k) before it announces itself in shared
//    memory, and keeps the LivenessLock for as long as it takes part;
//  * anyone asks liveness_held(fd, k) through any descriptor of the file (a
//    LivenessLock never locks through the descriptor it is given, so the
//    answer includes the caller's own participants);
//  * "not held" means: no live process holds participant k (it exited, released,
//    or never took it). It never means "a live process in another namespace".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "tensorxfer/sync/process_local_fd.h"

namespace tensorxfer::sync {

inline constexpr off_t kLivenessByteBase = off_t{1} << 48;

// The byte participant `participant` locks.
constexpr off_t liveness_byte(uint32_t participant) noexcept { return kLivenessByteBase + participant; }

// A participant's hold on its liveness byte. Move-only RAII: released by
// release(), by destruction, or by the kernel when the process dies; a fork()ed
// child never holds it.
class LivenessLock {
 public:
  LivenessLock() = default;  // holds nothing

  // Takes participant `participant`'s lock on the file behind `fd` (any open
  // descriptor of it; `fd` itself is not locked through and may be closed
  // later). Returns nullopt when another holder has it (another process, or
  // another LivenessLock of this process). Throws Unsupported when the kernel
  // has no OFD locks, SystemError for other failures.
  [[nodiscard]] static std::optional<LivenessLock> try_hold(int fd, uint32_t participant);

  LivenessLock(LivenessLock&&) noexcept = default;
  LivenessLock& operator=(LivenessLock&&) noexcept = default;
  LivenessLock(const LivenessLock&) = delete;
  LivenessLock& operator=(const LivenessLock&) = delete;
  ~LivenessLock() = default;  // releases (closing the description drops the lock)

  // True while this object holds the lock (false after release(), when moved
  // from, and in a fork()ed child).
  bool held() const noexcept { return description_.valid(); }
  uint32_t participant() const noexcept { return participant_; }
  // Gives the lock up now. Idempotent, never throws.
  void release() noexcept { description_.reset(); }

 private:
  ProcessLocalFd description_;  // our own open file description of the file; the lock lives on it
  uint32_t participant_ = 0;
};

// True while someone holds participant `participant`'s lock on the file behind
// `fd` (any process, any PID namespace, this process included). Never blocks.
// Throws SystemError when the kernel cannot answer (e.g. EBADF): an unknown is
// never reported as "not held".
[[nodiscard]] bool liveness_held(int fd, uint32_t participant);

}  // namespace tensorxfer::sync
