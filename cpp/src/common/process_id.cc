#include "tensorxfer/common/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace tensorxfer {
namespace {

// 0 until asked, and again in a fork()ed child. relaxed: the id is the only
// thing published through it, and every thread of a process computes the same one.
std::atomic<pid_t> cached_pid{0};

void forget_in_forked_child() noexcept { cached_pid.store(0, std::memory_order_relaxed); }

}  // namespace

pid_t current_process_id() noexcept {
  pid_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  // Registered before the first id is cached, so no child can inherit one unforgotten.
  static const int registered = ::pthread_atfork(nullptr, nullptr, forget_in_forked_child);
  (void)registered;
  pid = ::getpid();
  cached_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace tensorxfer
