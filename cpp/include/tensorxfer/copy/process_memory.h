// Reading another process's memory in one copy (cross-memory attach:
// process_vm_readv), the large-tensor path between ranks of one host.
//
// The kernel permits it when the reader may ptrace the target: same user and,
// under Yama ptrace_scope 1, an ancestor of the target or a process the target
// named with PR_SET_PTRACER (allow_memory_readers() below). Containers that
// share /dev/shm but not a PID namespace cannot name each other's pids: callers
// probe once (probe_process_memory) and fall back to shared-memory copies.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tensorxfer::copy {

class CopyEngine;

// One piece of a gathered read: `nbytes` at `remote_address` in the other process, into `dst`.
struct RemotePiece {
  uint64_t remote_address;
  std::byte* dst;
  std::size_t nbytes;
};

// Copies `nbytes` at `remote_address` in process `pid` into `dst`, split in
// chunks over the engine's threads. Throws Unsupported when the kernel refuses
// (EPERM, ENOSYS), PeerLost when the process is gone (ESRCH), InvalidArgument
// when the remote range is not mapped there (EFAULT) or arguments are bad,
// SystemError otherwise. dst is fully written when it returns.
void read_process_memory(CopyEngine& engine, pid_t pid, uint64_t remote_address, std::byte* dst, std::size_t nbytes);

// Reads every piece from process `pid`, as read_process_memory reads one (same
// errors, every dst fully written when it returns): many pieces go in one call
// (an iovec each, at most 1024 and about 4 MiB per call), the calls spread over
// the engine's threads; a piece larger than a call is cut. An invalid dst is
// refused by the kernel (InvalidArgument), never written through.
void read_process_pieces(CopyEngine& engine, pid_t pid, const std::vector<RemotePiece>& pieces);

// True if `nbytes` at `remote_address` in `pid` can be read now and equal
// `expected` (a value the caller learnt another way). Never throws.
[[nodiscard]] bool probe_process_memory(pid_t pid, uint64_t remote_address, const std::byte* expected,
                                        std::size_t nbytes) noexcept;

// Bytes of [address, address + nbytes) in this process that huge pages back
// (transparent or hugetlb), as the PAGEMAP_SCAN ioctl of /proc/self/pagemap
// reports them; -1 when the kernel cannot say (before Linux 6.7). Why it
// matters: process_vm_readv pins the source page by page, so reading 4 KiB
// pages runs at about half the speed of reading huge ones (302 MB between two
// processes on 2 cores: 40-43 ms from 4 KiB pages, 20-30 ms from huge ones, a
// memcpy 16-23 ms). Pages not yet touched count as not huge. Never throws.
[[nodiscard]] int64_t huge_page_bytes(const void* address, std::size_t nbytes) noexcept;

// Lets any process of this user read this one's memory under Yama ptrace_scope
// 1 (PR_SET_PTRACER_ANY); a no-op where Yama is absent. Returns false if the
// kernel refused. Never throws.
bool allow_memory_readers() noexcept;

}  // namespace tensorxfer::copy
