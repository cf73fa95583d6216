// LocalGroup: the ranks of one host that work together, met through shared
// memory alone (no torch, no MPI, no network).
//
// join() is collective: every rank calls it with the same name and
// world_size, and it returns once all world_size ranks have joined. The first
// rank to arrive creates the group segment ("/tensorxfer-group-<name>-<hash>",
// mode 0600, published complete with O_EXCL semantics), the others attach
// (retrying while it does not exist yet). What join does with an existing
// segment of the same name:
//   * another user's segment                      -> refused (InvalidArgument)
//   * header fails validation or file truncated   -> CorruptSegment
//   * no live member (a dead job's leftover)      -> replaced by a fresh one
//   * live members, another world_size            -> refused, naming both sizes
//   * `rank` already held by a live process       -> refused, naming that pid
//   * live members of a previous job still closing-> waits for them (until timeout)
// The segment is unlinked when the last member leaves or every member is dead.
//
// Liveness: a wait on a rank that died (or closed the group) throws PeerLost
// naming the rank and its pid within one watch slice (20 ms) of noticing.
//
// Thread-safety: one collective at a time per LocalGroup (the calls of a rank
// are made in the same order on every rank); rank(), world_size(), name(),
// rank_alive() and check_peers() may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorxfer/sync/spin_policy.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::group {

class GroupSegment;  // group_segment.h: the mapping and its layout

class LocalGroup {
 public:
  // Bytes of one rank's all_gather mailbox buffer (each rank has two);
  // larger contributions are exchanged in rounds of this many bytes.
  static constexpr std::size_t kMailboxBytes = 64 * 1024;
  // Longest accepted group name, in bytes.
  static constexpr std::size_t kMaxNameBytes = 200;
  static constexpr int kMaxWorldSize = 1024;

  // Collective: every rank calls with the same name and world_size.
  // name: 1..kMaxNameBytes bytes, any characters but NUL. 0 <= rank < world_size.
  // timeout: for the whole rendezvous; nanoseconds::max() = none (still
  // watches peers and runs `hook`). Throws InvalidArgument (bad arguments, or
  // refused as listed above), CorruptSegment, Timeout (not every rank arrived;
  // the message names the missing ranks), PeerLost (a rank that had joined died).
  static std::unique_ptr<LocalGroup> join(const std::string& name, int rank, int world_size,
                                          std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});

  LocalGroup(LocalGroup&&) noexcept;
  LocalGroup& operator=(LocalGroup&&) noexcept;
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  ~LocalGroup();  // close()

  int rank() const noexcept;
  int world_size() const noexcept;
  const std::string& name() const noexcept;

  // Collective: returns once every rank has entered this barrier. Per-rank
  // 64-bit epochs (never wrap), release/acquire; spins briefly, then sleeps
  // on a futex. Throws Timeout, PeerLost (naming the rank), or what `hook`
  // throws; InvalidArgument after close().
  void barrier(std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});

  // Collective; returns every rank's bytes in rank order (own included); any
  // size per rank, sizes may differ between ranks (chunked through the bounded
  // mailboxes). Throws like barrier(). After a throw the group is unusable for
  // further collectives (other ranks may be mid-operation): close it.
  std::vector<std::string> all_gather_bytes(std::string_view mine, std::chrono::nanoseconds timeout,
                                            const sync::WaitHook& hook = {});

  // True while `rank` holds its place in the group (joined, not closed, its
  // process alive). Own rank: true until close(). Out-of-range rank: false.
  bool rank_alive(int rank) const noexcept;

  // Throws PeerLost naming the first lost rank ("LocalGroup 'x': rank 2 (pid
  // 1234) exited" or "... closed the group"); cheap enough to call every
  // 20 ms from other layers' waits (one /proc read per rank).
  void check_peers() const;

  // Leaves the group: marks this rank gone (peers waiting on it get PeerLost),
  // unlinks the segment if no other member is live, unmaps. Idempotent; in a
  // fork()ed child it only unmaps (the parent still owns the membership).
  // Never throws.
  void close() noexcept;
  bool closed() const noexcept;

 private:
  LocalGroup(std::unique_ptr<GroupSegment> segment, std::string name, int rank, int world_size);
  void require_open(const char* operation) const;

  // Waits until every rank's barrier epoch reaches `target`.
  void await_epoch(uint64_t target, const char* operation, std::chrono::nanoseconds timeout,
                   std::chrono::steady_clock::time_point deadline, const sync::WaitHook& hook);
  void await_all_joined(std::chrono::nanoseconds timeout, std::chrono::steady_clock::time_point deadline,
                        const sync::WaitHook& hook);
  // Throws PeerLost naming the first rank whose process exited without closing.
  void check_exited_peers() const;
  // Throws PeerLost for a lost peer unless `settled()` turns true on a re-check.
  template <typename Settled>
  void watch_peers(Settled& settled, const sync::WaitHook& hook) const;

  std::unique_ptr<GroupSegment> segment_;
  std::unique_ptr<sync::SpinPolicy> spin_;  // how this rank's waits spend their time (adaptive)
  std::string name_;
  int rank_ = 0;
  int world_size_ = 0;
  uint64_t barrier_epoch_ = 0;   // this rank's barrier count (mirrors its shared epoch)
  uint64_t gather_rounds_ = 0;   // mailbox rounds so far; selects the buffer (double buffering)
};

}  // namespace tensorxfer::group
