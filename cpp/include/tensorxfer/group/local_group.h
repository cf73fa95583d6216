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
// A rank whose collective fails (Timeout, PeerLost, or the hook's exception,
// e.g. Ctrl-C) marks itself as having given up: peers' waits end with
// PeerLost naming it instead of waiting for it (also with no deadline).
//
// Thread-safety: one collective at a time per LocalGroup (the calls of a rank
// are made in the same order on every rank): a second one while another
// thread runs one raises InvalidArgument at once. rank(), world_size(),
// name(), rank_alive() and check_peers() may be called from any thread;
// close() from another thread ends a running wait with Closed.
#pragma once

#include <atomic>
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
  // `max_nbytes` bounds every rank's contribution (own and announced by a
  // peer): a larger one is an InvalidArgument on every rank, naming the rank
  // and both sizes, before anything is allocated for it.
  static constexpr uint64_t kDefaultMaxGatherBytes = uint64_t{256} << 20;
  std::vector<std::string> all_gather_bytes(std::string_view mine, std::chrono::nanoseconds timeout,
                                            const sync::WaitHook& hook = {},
                                            uint64_t max_nbytes = kDefaultMaxGatherBytes);

  // Marks this rank as having given up its collectives (peers' waits end
  // with PeerLost). For a rank that fails outside a group wait (e.g. while
  // allocating) in the middle of a collective construction. Never throws.
  void abandon() noexcept;

  // True while `rank` holds its place in the group (joined, not closed, its
  // process alive). Own rank: true until close(). Out-of-range rank: false.
  bool rank_alive(int rank) const noexcept;

  // Throws PeerLost naming the first lost rank ("LocalGroup 'x': rank 2 (pid
  // 1234) exited" or "... closed the group"); cheap enough to call every
  // 20 ms from other layers' waits (one /proc read per rank).
  void check_peers() const;

  // Leaves the group: marks this rank gone (peers waiting on it get PeerLost),
  // unlinks the segment if no other member is live, unmaps. Idempotent; in a
  // fork()ed child it only unmaps (the parent still owns the membership; the
  // pid is checked before anything else). A wait running on another thread
  // ends with Closed first (within one watch slice). Never throws.
  void close() noexcept;
  bool closed() const noexcept;

 private:
  LocalGroup(std::unique_ptr<GroupSegment> segment, std::string name, int rank, int world_size);
  void require_open(const char* operation) const;
  class Use;        // RAII: a call that touches the segment (close() waits for it)
  class Operation;  // RAII: the one collective in flight

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
  std::unique_ptr<sync::SpinPolicy> spin_;  // how this rank's waits spend their time (SpinPolicy::standard)
  std::string name_;
  int rank_ = 0;
  int world_size_ = 0;
  uint64_t barrier_epoch_ = 0;   // this rank's barrier count (mirrors its shared epoch)
  uint64_t gather_rounds_ = 0;   // mailbox rounds so far; selects the buffer (double buffering)
  // close() sets closing_, then waits for users_ to drop to 0 (seq_cst both:
  // a user increments users_ before it reads closing_).
  std::unique_ptr<std::atomic<int>> users_ = std::make_unique<std::atomic<int>>(0);
  std::unique_ptr<std::atomic<bool>> closing_ = std::make_unique<std::atomic<bool>>(false);
  std::unique_ptr<std::atomic<bool>> busy_ = std::make_unique<std::atomic<bool>>(false);
};

}  // namespace tensorxfer::group
