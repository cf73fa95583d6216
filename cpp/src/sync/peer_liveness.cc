#include "tensorxfer/sync/peer_liveness.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"

namespace tensorxfer::sync {
namespace {

struct StatFields {
  char state = 0;
  uint64_t start_ticks = 0;
};

// Parses "pid (comm) state ppid ... starttime ..." where comm may hold spaces
// and parentheses: the fields after comm start after the LAST ')'.
bool parse_stat(const char* text, StatFields& fields) noexcept {
  const char* close_paren = std::strrchr(text, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') return false;
  const char* cursor = close_paren + 2;
  // Field 3 is the state; field 22 is starttime (fields counted from 1, pid = 1).
  fields.state = *cursor;
  int field = 3;
  while (field < 22) {
    cursor = std::strchr(cursor, ' ');
    if (cursor == nullptr) return false;
    ++cursor;
    ++field;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(cursor, &end, 10);
  if (end == cursor || errno != 0) return false;
  fields.start_ticks = value;
  return true;
}

// Reads /proc/<pid>/stat ("self" when pid == 0). Returns false if unreadable.
bool read_stat(pid_t pid, StatFields& fields) noexcept {
  char path[64];
  if (pid == 0) {
    std::strcpy(path, "/proc/self/stat");
  } else {
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  }
  FileDescriptor fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char buffer[1024];
  std::size_t filled = 0;
  while (filled < sizeof(buffer) - 1) {
    const ssize_t got = ::read(fd.get(), buffer + filled, sizeof(buffer) - 1 - filled);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    filled += static_cast<std::size_t>(got);
  }
  buffer[filled] = '\0';
  return filled > 0 && parse_stat(buffer, fields);
}

bool has_exited(char state) noexcept { return state == 'Z' || state == 'X' || state == 'x'; }

}  // namespace

std::string ProcessIdentity::describe() const {
  return "pid " + std::to_string(pid) + " (start " + std::to_string(start_ticks) + ")";
}

ProcessIdentity current_process_identity() {
  StatFields fields;
  if (!read_stat(0, fields)) throw_system_error("read /proc/self/stat");
  ProcessIdentity identity;
  identity.pid = static_cast<int32_t>(::getpid());
  identity.start_ticks = fields.start_ticks;
  return identity;
}

ProcessIdentity identity_of(pid_t pid) noexcept {
  StatFields fields;
  ProcessIdentity identity;
  if (pid <= 0 || !read_stat(pid, fields) || has_exited(fields.state)) return identity;
  identity.pid = static_cast<int32_t>(pid);
  identity.start_ticks = fields.start_ticks;
  return identity;
}

bool is_alive(const ProcessIdentity& identity) noexcept {
  if (identity.pid <= 0) return false;
  const ProcessIdentity now = identity_of(identity.pid);
  return now.pid == identity.pid && now.start_ticks == identity.start_ticks;
}

}  // namespace tensorxfer::sync
