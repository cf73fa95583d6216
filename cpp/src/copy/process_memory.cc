#include "tensorxfer/copy/process_memory.h"

#include <sys/prctl.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY (static_cast<unsigned long>(-1))
#endif

namespace tensorxfer::copy {
namespace {

// Chunks handed to one thread: large enough that the syscall cost is noise.
constexpr std::size_t kChunkBytes = std::size_t{4} << 20;

[[noreturn]] void throw_read_error(int error, pid_t pid, uint64_t address, std::size_t nbytes) {
  const std::string where = detail::concat("process_vm_readv of ", nbytes, " bytes at 0x", std::hex, address,
                                           std::dec, " in pid ", pid);
  switch (error) {
    case EPERM:
    case ENOSYS:
      throw Unsupported(where + ": cross-memory attach is not permitted (" + std::strerror(error) + ")");
    case ESRCH:
      throw PeerLost(where + ": the process has exited");
    case EFAULT:
      throw InvalidArgument(where + ": the range is not mapped in that process");
    default:
      throw SystemError(where, error);
  }
}

// Reads all of [address, address + nbytes) with as many calls as partial reads need.
void read_range(pid_t pid, uint64_t address, std::byte* dst, std::size_t nbytes) {
  std::size_t done = 0;
  while (done < nbytes) {
    iovec local{dst + done, nbytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(address + done)), nbytes - done};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_read_error(errno, pid, address + done, nbytes - done);
    }
    if (got == 0) throw_read_error(EFAULT, pid, address + done, nbytes - done);
    done += static_cast<std::size_t>(got);
  }
}

}  // namespace

void read_process_memory(CopyEngine& engine, pid_t pid, uint64_t remote_address, std::byte* dst, std::size_t nbytes) {
  TENSORXFER_CHECK(InvalidArgument, pid > 0, "read_process_memory: pid must be > 0, got ", pid);
  TENSORXFER_CHECK(InvalidArgument, nbytes == 0 || (dst != nullptr && remote_address != 0),
                   "read_process_memory: null address for ", nbytes, " bytes");
  TENSORXFER_CHECK(InvalidArgument, remote_address <= UINT64_MAX - nbytes,
                   "read_process_memory: range at ", remote_address, " + ", nbytes, " overflows");
  if (nbytes == 0) return;
  const std::size_t chunks = (nbytes + kChunkBytes - 1) / kChunkBytes;
  engine.parallel_for(chunks, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t chunk = begin; chunk < end; ++chunk) {
      const std::size_t offset = chunk * kChunkBytes;
      read_range(pid, remote_address + offset, dst + offset, std::min(kChunkBytes, nbytes - offset));
    }
  });
}

bool probe_process_memory(pid_t pid, uint64_t remote_address, const std::byte* expected, std::size_t nbytes) noexcept {
  if (pid <= 0 || nbytes == 0 || nbytes > 4096 || expected == nullptr) return false;
  std::vector<std::byte> got(nbytes);
  try {
    read_range(pid, remote_address, got.data(), nbytes);
  } catch (...) {
    return false;
  }
  return std::memcmp(got.data(), expected, nbytes) == 0;
}

bool allow_memory_readers() noexcept {
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0) return true;
  return errno == EINVAL;  // no Yama: nothing to allow
}

}  // namespace tensorxfer::copy
