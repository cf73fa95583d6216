#include "tensorxfer/copy/process_memory.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"
#include "tensorxfer/copy/copy_engine.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY (static_cast<unsigned long>(-1))
#endif

namespace tensorxfer::copy {
namespace {

// The PAGEMAP_SCAN interface of <linux/fs.h> (Linux 6.7), declared here for
// older headers; the kernel checks `size` against the struct it knows.
struct PageRegion {
  uint64_t start;
  uint64_t end;
  uint64_t categories;
};
struct PageScanArgument {
  uint64_t size;
  uint64_t flags;
  uint64_t start;
  uint64_t end;
  uint64_t walk_end;
  uint64_t vec;
  uint64_t vec_len;
  uint64_t max_pages;
  uint64_t category_inverted;
  uint64_t category_mask;
  uint64_t category_anyof_mask;
  uint64_t return_mask;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PageScanArgument);
constexpr uint64_t kPageIsHuge = uint64_t{1} << 6;

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

// Pieces per call: the kernel's limit on iovecs (UIO_MAXIOV).
constexpr std::size_t kMaxIovecs = 1024;

// Reads pieces[0, count) (none empty) in calls of up to kMaxIovecs iovecs, as many as
// partial reads need: a partial read stops inside a piece, the next call resumes there.
void read_pieces(pid_t pid, const RemotePiece* pieces, std::size_t count) {
  std::vector<iovec> local(std::min(count, kMaxIovecs)), remote(local.size());
  std::size_t first = 0, offset = 0;  // the first piece not fully read, and its bytes read
  while (first < count) {
    std::size_t n = 0;
    for (std::size_t i = first; i < count && n < kMaxIovecs; ++i, ++n) {
      const std::size_t skip = i == first ? offset : 0;
      local[n] = {pieces[i].dst + skip, pieces[i].nbytes - skip};
      remote[n] = {reinterpret_cast<void*>(static_cast<uintptr_t>(pieces[i].remote_address + skip)),
                   pieces[i].nbytes - skip};
    }
    const ssize_t got = ::process_vm_readv(pid, local.data(), n, remote.data(), n, 0);
    const uint64_t at = pieces[first].remote_address + offset;
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_read_error(errno, pid, at, pieces[first].nbytes - offset);
    }
    if (got == 0) throw_read_error(EFAULT, pid, at, pieces[first].nbytes - offset);
    for (auto left = static_cast<std::size_t>(got); left > 0;) {
      const std::size_t rest = pieces[first].nbytes - offset;
      if (left < rest) {
        offset += left;
        break;
      }
      left -= rest;
      ++first;
      offset = 0;
    }
  }
}

}  // namespace

void read_process_pieces(CopyEngine& engine, pid_t pid, const std::vector<RemotePiece>& pieces) {
  TENSORXFER_CHECK(InvalidArgument, pid > 0, "read_process_memory: pid must be > 0, got ", pid);
  // What the calls read: no piece empty, none larger than a call's bytes.
  std::vector<RemotePiece> cut;
  cut.reserve(pieces.size());
  for (const RemotePiece& piece : pieces) {
    if (piece.nbytes == 0) continue;
    TENSORXFER_CHECK(InvalidArgument, piece.dst != nullptr && piece.remote_address != 0,
                     "read_process_memory: null address for ", piece.nbytes, " bytes");
    TENSORXFER_CHECK(InvalidArgument, piece.remote_address <= UINT64_MAX - piece.nbytes,
                     "read_process_memory: range at ", piece.remote_address, " + ", piece.nbytes, " overflows");
    for (std::size_t offset = 0; offset < piece.nbytes; offset += kChunkBytes) {
      cut.push_back({piece.remote_address + offset, piece.dst + offset, std::min(kChunkBytes, piece.nbytes - offset)});
    }
  }
  // The calls: runs of consecutive pieces, at most kMaxIovecs of them and kChunkBytes in all.
  std::vector<std::size_t> starts;
  std::size_t call_bytes = 0;
  for (std::size_t i = 0; i < cut.size(); ++i) {
    if (starts.empty() || call_bytes + cut[i].nbytes > kChunkBytes || i - starts.back() == kMaxIovecs) {
      starts.push_back(i);
      call_bytes = 0;
    }
    call_bytes += cut[i].nbytes;
  }
  if (starts.empty()) return;
  starts.push_back(cut.size());
  engine.parallel_for(starts.size() - 1, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t call = begin; call < end; ++call) {
      read_pieces(pid, cut.data() + starts[call], starts[call + 1] - starts[call]);
    }
  });
}

void read_process_memory(CopyEngine& engine, pid_t pid, uint64_t remote_address, std::byte* dst, std::size_t nbytes) {
  read_process_pieces(engine, pid, {{remote_address, dst, nbytes}});
}

bool probe_process_memory(pid_t pid, uint64_t remote_address, const std::byte* expected, std::size_t nbytes) noexcept {
  if (pid <= 0 || nbytes == 0 || nbytes > 4096 || expected == nullptr) return false;
  std::vector<std::byte> got(nbytes);
  try {
    const RemotePiece piece{remote_address, got.data(), nbytes};
    read_pieces(pid, &piece, 1);
  } catch (...) {
    return false;
  }
  return std::memcmp(got.data(), expected, nbytes) == 0;
}

int64_t huge_page_bytes(const void* address, std::size_t nbytes) noexcept {
  const FileDescriptor pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!pagemap.valid()) return -1;
  const auto begin = reinterpret_cast<uintptr_t>(address);
  const uint64_t end = begin + nbytes;
  int64_t huge = 0;
  PageRegion regions[64];
  for (uint64_t from = begin; from < end;) {
    // Only the huge pages come back, runs of them merged into one region each.
    PageScanArgument scan{};
    scan.size = sizeof(scan);
    scan.start = from & ~uint64_t{4095};
    scan.end = (end + 4095) & ~uint64_t{4095};
    scan.vec = reinterpret_cast<uintptr_t>(regions);
    scan.vec_len = std::size(regions);
    scan.category_mask = kPageIsHuge;
    scan.return_mask = kPageIsHuge;
    int found = 0;
    do {
      found = ::ioctl(pagemap.get(), kPagemapScan, &scan);
    } while (found < 0 && errno == EINTR);
    if (found < 0) return -1;  // ENOTTY / EINVAL: a kernel without PAGEMAP_SCAN
    for (int i = 0; i < found; ++i) {
      const uint64_t first = std::max<uint64_t>(regions[i].start, begin);
      const uint64_t last = std::min<uint64_t>(regions[i].end, end);
      if (last > first) huge += static_cast<int64_t>(last - first);
    }
    // A full vector may have stopped the walk early: walk_end says where.
    if (static_cast<std::size_t>(found) < std::size(regions) || scan.walk_end <= from) break;
    from = scan.walk_end;
  }
  return huge;
}

bool allow_memory_readers() noexcept {
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0) return true;
  return errno == EINVAL;  // no Yama: nothing to allow
}

}  // namespace tensorxfer::copy
