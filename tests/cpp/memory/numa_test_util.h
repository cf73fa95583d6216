// Helpers for the NUMA tests: when the kernel may refuse NUMA system calls, and a
// seccomp filter that makes one system call fail with a chosen errno.
#pragma once

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>

#include <cstddef>
#include <fstream>
#include <string>

#include "tensorxfer/memory/numa.h"

namespace tensorxfer::testing {

// The Seccomp: field of /proc/self/status (0: no filter), -1 if absent.
inline int seccomp_mode() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Seccomp:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Why the kernel may refuse NUMA system calls here, found without relying on the
// code under test where possible: no /sys/devices/system/node (a kernel without
// NUMA), or a seccomp filter on this process that refuses them. "" where the
// calls must work.
inline std::string kernel_numa_refusal() {
  struct stat info {};
  if (::stat("/sys/devices/system/node", &info) != 0) {
    return "this kernel has no NUMA support (no /sys/devices/system/node)";
  }
  if (seccomp_mode() != 0 && !memory::numa_supported()) {
    return "a seccomp filter refuses NUMA system calls here: " + memory::numa_unsupported_reason();
  }
  return "";
}

// Installs a seccomp filter on the calling process (irreversible: call it in a
// forked child) under which `system_call` fails with `error_number` and every
// other system call runs. False when the kernel does not allow the filter.
inline bool refuse_system_call(long system_call, int error_number) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(system_call), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<unsigned>(error_number) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) == 0;
}

}  // namespace tensorxfer::testing
