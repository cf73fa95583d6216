// LocalGroup: membership and liveness (rank_alive, check_peers, abandon, close).
#include <unistd.h>

#include <chrono>
#include <thread>

#include "local_group_guards.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/group_segment.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::group {

void LocalGroup::require_open(const char* operation) const {
  TENSORXFER_CHECK(Closed, segment_ != nullptr && !closing_->load(std::memory_order_seq_cst), "LocalGroup::",
                   operation, ": LocalGroup ", quoted(name_), " is closed");
}

void LocalGroup::abandon() noexcept {
  try {
    const Use use(*this, "abandon");
    if (::getpid() != segment_->mapped_by()) return;
    // release: pairs with the peers' acquire in check_peers.
    segment_->slot(rank_).gave_up.store(1, std::memory_order_release);
    segment_->control().arrivals.notify_all();
  } catch (...) {  // closed: peers see it as having left
  }
}

bool LocalGroup::rank_alive(int rank) const noexcept {
  if (rank < 0 || rank >= world_size_) return false;
  try {
    const Use use(*this, "rank_alive");
    if (rank == rank_) return true;
    if (segment_->slot(rank).gave_up.load(std::memory_order_acquire) != 0) return false;
    const auto status = segment_->status_of(rank);
    return status == GroupSegment::MemberStatus::kAlive;
  } catch (const Closed&) {
    return false;
  } catch (const CorruptSegment&) {
    return false;
  } catch (...) {
    return true;  // the kernel could not answer: never call a live peer dead
  }
}

void LocalGroup::check_peers() const {
  const Use use(*this, "check_peers");
  // An exit is reported before a close: peers that saw the exit close in turn.
  check_exited_peers();
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_ && segment_->status_of(peer) == GroupSegment::MemberStatus::kLeft) {
      throw PeerLost("LocalGroup " + quoted(name_) + ": " + segment_->describe_member(peer) + " closed the group");
    }
  }
  // Last: a rank that gave up usually did so over one of the losses above.
  for (int peer = 0; peer < world_size_; ++peer) {
    // acquire: pairs with the release in abandon().
    if (peer != rank_ && segment_->slot(peer).gave_up.load(std::memory_order_acquire) != 0) {
      throw PeerLost("LocalGroup " + quoted(name_) + ": " + segment_->describe_member(peer) +
                     " gave up a collective (its wait failed or was interrupted)");
    }
  }
}

void LocalGroup::check_exited_peers() const {
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer != rank_ && segment_->status_of(peer) == GroupSegment::MemberStatus::kExited) {
      throw PeerLost("LocalGroup " + quoted(name_) + ": " + segment_->describe_member(peer) + " exited");
    }
  }
}

void LocalGroup::close() noexcept {
  if (segment_ == nullptr) return;
  if (::getpid() != segment_->mapped_by()) {
    // A fork()ed child: threads of the parent (and their uses) do not exist
    // here; the parent keeps the membership.
    segment_.reset();
    return;
  }
  closing_->store(true, std::memory_order_seq_cst);
  while (users_->load(std::memory_order_seq_cst) != 0) {
    // A running wait sees closing_ within one watch slice; wake it sooner.
    segment_->control().arrivals.notify_all();
    segment_->control().membership.notify_all();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    segment_->mark_left(rank_);
    (void)segment_->unlink_if_unused();
  }
  segment_.reset();
}

}  // namespace tensorxfer::group
