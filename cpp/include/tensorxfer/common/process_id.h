// The calling process's id without a system call per ask. Objects that must
// not be used from a fork()ed child (rings, streams, copy engines) compare it
// with the id of the process that made them at every public entry, and
// getpid() is a system call (~0.1 us in a VM guest, on the hand-off path of
// every SlotRing publish and release).
#pragma once

#include <sys/types.h>

namespace tensorxfer {

// getpid(), cached after the first call. A pthread_atfork child handler
// forgets the cached id in a child made by fork() (os.fork, multiprocessing's
// fork start method), so the child asks the kernel again. Thread-safe.
pid_t current_process_id() noexcept;

}  // namespace tensorxfer
