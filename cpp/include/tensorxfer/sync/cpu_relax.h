// The pause instruction for spin loops: tells the core (and a hypervisor) that
// this thread is spinning, so a sibling hyper-thread or the peer gets the cycles.
#pragma once

namespace tensorxfer::sync {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace tensorxfer::sync
