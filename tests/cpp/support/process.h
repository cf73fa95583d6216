// Helpers for tests that fork real processes and look at /dev/shm.
#pragma once

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

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

// A pipe for short one-way notes (up to 127 characters) from a forked child.
struct NotePipe {
  NotePipe() {
    if (::pipe(fds) != 0) fds[0] = fds[1] = -1;
  }
  ~NotePipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  NotePipe(const NotePipe&) = delete;
  NotePipe& operator=(const NotePipe&) = delete;
  void send(const std::string& text) const {
    char buffer[128] = {};
    std::strncpy(buffer, text.c_str(), sizeof(buffer) - 1);
    (void)!::write(fds[1], buffer, sizeof(buffer));
  }
  // The next note; "" if the writer died first.
  std::string receive() const {
    char buffer[128] = {};
    if (::read(fds[0], buffer, sizeof(buffer)) != static_cast<ssize_t>(sizeof(buffer))) return "";
    return buffer;
  }
  int fds[2];
};

// Waits until `pid` stops (SIGSTOP) or ends; true if it stopped.
inline bool wait_until_stopped(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, WUNTRACED) != pid) return false;
  return WIFSTOPPED(status);
}

// A process running in a PID namespace of its own (as a container's processes
// do): `inner` is its pid as this process sees it (it sees itself as pid 1);
// `outer` is the helper that created the namespace and exits with inner's
// exit code. skip_reason is set (and both pids are 0) when this machine does
// not allow a new PID namespace (unshare needs CAP_SYS_ADMIN). Destruction
// kills and reaps whatever still runs, so a failed assertion leaves no orphan.
struct NamespacedChild {
  pid_t outer = 0;
  pid_t inner = 0;
  std::string skip_reason;

  NamespacedChild() = default;
  NamespacedChild(NamespacedChild&& other) noexcept
      : outer(std::exchange(other.outer, 0)), inner(std::exchange(other.inner, 0)),
        skip_reason(std::move(other.skip_reason)) {}
  NamespacedChild& operator=(NamespacedChild&&) = delete;
  ~NamespacedChild() { (void)kill_and_wait(); }

  // SIGKILLs the inner process and returns the outer's exit code (128 + SIGKILL
  // when the kill ended it); -1 if there is nothing to wait for.
  int kill_and_wait() {
    if (outer <= 0) return -1;
    ::kill(inner, SIGKILL);
    const int code = wait_exit_code(outer);
    outer = inner = 0;
    return code;
  }
};

// Runs `body` (returning its exit code) in a new PID namespace. The body sees
// getpid() == 1; it leaves with _exit, as in fork_child.
template <typename Body>
NamespacedChild fork_in_new_pid_namespace(Body body) {
  int report[2];
  NamespacedChild child;
  if (::pipe(report) != 0) {
    child.skip_reason = std::string("pipe: ") + std::strerror(errno);
    return child;
  }
  const pid_t outer = fork_child([&] {
    ::close(report[0]);
    long message = 0;
    if (::unshare(CLONE_NEWPID) != 0) {
      message = -static_cast<long>(errno);
      (void)!::write(report[1], &message, sizeof(message));
      return 0;
    }
    const pid_t inner = fork_child(body);  // the first child in the namespace: its pid 1
    message = inner;
    (void)!::write(report[1], &message, sizeof(message));
    return wait_exit_code(inner);
  });
  ::close(report[1]);
  long message = 0;
  const bool got = ::read(report[0], &message, sizeof(message)) == static_cast<ssize_t>(sizeof(message));
  ::close(report[0]);
  if (!got || message <= 0) {
    child.skip_reason = got ? std::string("unshare(CLONE_NEWPID) failed: ") + std::strerror(static_cast<int>(-message))
                            : std::string("the namespace helper died");
    (void)wait_exit_code(outer);
    return child;
  }
  child.outer = outer;
  child.inner = static_cast<pid_t>(message);
  return child;
}

}  // namespace tensorxfer::testing
