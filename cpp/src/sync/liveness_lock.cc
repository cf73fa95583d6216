#include "tensorxfer/sync/liveness_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"

namespace tensorxfer::sync {
namespace {

struct flock byte_lock(short type, uint32_t participant) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = liveness_byte(participant);
  lock.l_len = 1;
  lock.l_pid = 0;  // must be 0 for OFD locks
  return lock;
}

[[noreturn]] void throw_lock_error(const std::string& what) {
  const int error = errno;
  if (error == EINVAL) {
    throw Unsupported(what + ": the kernel has no open-file-description locks (Linux >= 3.15 needed)");
  }
  throw SystemError(what, error);
}

// A new open file description of the file behind `fd` (same inode, checked).
FileDescriptor reopen(int fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  FileDescriptor fresh(::open(path, O_RDWR | O_CLOEXEC));
  if (!fresh.valid()) throw_system_error(std::string("open(") + path + ") for a liveness lock");
  struct stat original {};
  struct stat reopened {};
  if (::fstat(fd, &original) != 0) throw_system_error("fstat of a liveness file");
  if (::fstat(fresh.get(), &reopened) != 0) throw_system_error(std::string("fstat(") + path + ")");
  if (original.st_dev != reopened.st_dev || original.st_ino != reopened.st_ino) {
    throw SystemError(std::string(path) + " reopened another file (inode " + std::to_string(reopened.st_ino) +
                          ", expected " + std::to_string(original.st_ino) + ")",
                      ESTALE);
  }
  return fresh;
}

}  // namespace

std::optional<LivenessLock> LivenessLock::try_hold(int fd, uint32_t participant) {
  FileDescriptor description = reopen(fd);
  struct flock lock = byte_lock(F_WRLCK, participant);
  if (::fcntl(description.get(), F_OFD_SETLK, &lock) != 0) {
    if (errno == EAGAIN || errno == EACCES) return std::nullopt;  // a live holder has it
    throw_lock_error("fcntl(F_OFD_SETLK) on liveness byte of participant " + std::to_string(participant));
  }
  LivenessLock held;
  held.description_ = ProcessLocalFd(std::move(description));
  held.participant_ = participant;
  return held;
}

bool liveness_held(int fd, uint32_t participant) {
  struct flock probe = byte_lock(F_WRLCK, participant);
  if (::fcntl(fd, F_OFD_GETLK, &probe) != 0) {
    throw_lock_error("fcntl(F_OFD_GETLK) on liveness byte of participant " + std::to_string(participant));
  }
  return probe.l_type != F_UNLCK;
}

}  // namespace tensorxfer::sync
