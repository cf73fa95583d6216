// Helpers for tests that fork real processes and look at /dev/shm.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

namespace tensorxfer::testing {

// Forks a child that runs `body` (returning its exit code) and leaves with
// _exit, so no destructor of the parent's objects runs in the child. An
// exception in the child exits 98 after printing it.
template <typename Body>
pid_t fork_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child failed: %s\n", error.what());
      code = 98;
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  return pid;
}

// The child's exit code, 128 + signal number if a signal ended it, -1 if waitpid failed.
inline int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// True while a POSIX shared-memory name ("/tensorxfer-...") exists in /dev/shm.
inline bool shm_name_exists(const std::string& name) {
  struct stat info {};
  return ::stat(("/dev/shm" + name).c_str(), &info) == 0;
}

}  // namespace tensorxfer::testing
