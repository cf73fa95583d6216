// A file descriptor that stays in the process that opened it: a fork()ed child
// never keeps it open.
//
// Why: some descriptors mean more than their file. An open file description
// that holds a liveness lock (sync/liveness_lock.h) says "this process is
// alive"; a child made by fork() shares that description, and while the child
// lived the lock would outlive the process that took it. Every ProcessLocalFd
// is closed in the child right after fork() (a pthread_atfork handler; the
// parent's descriptor and its locks are untouched), and get() returns -1 there.
//
// Limits: only fork() through the C library runs the handler (os.fork and
// multiprocessing's fork do); a raw clone() that never calls exec keeps the
// descriptors. The descriptor must be O_CLOEXEC, so exec() closes it as well.
//
// The registry of open ProcessLocalFds is the one process-wide table of the
// core: a fork handler takes no arguments, so it must find the descriptors
// somewhere. It holds descriptor numbers only, behind one mutex that the
// handler takes around fork() (the child never inherits it locked).
#pragma once

#include <memory>

#include "tensorxfer/common/fd.h"

namespace tensorxfer::sync {

namespace detail {
struct ProcessLocalFdEntry;  // a node of the fork handler's list (process_local_fd.cc)
}

class ProcessLocalFd {
 public:
  ProcessLocalFd() noexcept;
  // Takes ownership of `fd` (opened with O_CLOEXEC). An invalid `fd` gives an empty object.
  explicit ProcessLocalFd(FileDescriptor fd);
  ProcessLocalFd(ProcessLocalFd&& other) noexcept;
  ProcessLocalFd& operator=(ProcessLocalFd&& other) noexcept;
  ProcessLocalFd(const ProcessLocalFd&) = delete;
  ProcessLocalFd& operator=(const ProcessLocalFd&) = delete;
  ~ProcessLocalFd();  // reset()

  // The descriptor; -1 when empty, after reset(), or in a fork()ed child.
  int get() const noexcept;
  bool valid() const noexcept { return get() >= 0; }
  // Closes the descriptor (if this process still has it). Idempotent, never throws.
  void reset() noexcept;

 private:
  std::unique_ptr<detail::ProcessLocalFdEntry> entry_;
};

}  // namespace tensorxfer::sync
