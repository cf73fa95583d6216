// LocalGroup: rendezvous (join), barrier, all_gather_bytes, liveness, close.
// The segment layout is group_layout.h; the membership protocol group_segment.h.
#include "tensorxfer/group/local_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "local_group_guards.h"
#include "tensorxfer/group/group_segment.h"

namespace tensorxfer::group {
namespace {

static_assert(LocalGroup::kMaxNameBytes == kGroupNameCapacity);
static_assert(LocalGroup::kMaxWorldSize == kGroupMaxWorldSize);

// The largest contribution one rank may pass to all_gather_bytes (a sanity bound on shared sizes).
constexpr uint64_t kMaxGatherBytes = uint64_t{1} << 40;
constexpr auto kRetryPause = std::chrono::microseconds(500);

sync::WaitTime deadline_after(const char* operation, std::chrono::nanoseconds timeout) {
  TENSORXFER_CHECK(InvalidArgument, timeout.count() >= 0, operation, ": timeout must be >= 0, got ",
                   timeout.count(), " ns");
  const auto now = sync::WaitClock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::nanoseconds>(sync::WaitTime::max() - now)) {
    return sync::WaitTime::max();
  }
  return now + std::chrono::duration_cast<sync::WaitClock::duration>(timeout);
}

std::string seconds_text(std::chrono::nanoseconds timeout) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(3);
  text << std::chrono::duration<double>(timeout).count() << " s";
  return text.str();
}

// "rank 3" or "ranks 1, 2".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

enum class Attempt { kRetryNow, kRetryLater };

// One try at entering the group: returns the segment with `rank` joined, or
// nullptr and how soon to try again (`waiting` says why, for a timeout).
std::unique_ptr<GroupSegment> try_enter(const std::string& name, int rank, int world_size, Attempt& next,
                                        std::string& waiting) {
  next = Attempt::kRetryNow;
  std::unique_ptr<GroupSegment> existing = GroupSegment::open_existing(name);
  if (!existing) {
    auto created = GroupSegment::create_with_member(name, world_size, rank, LocalGroup::kMailboxBytes);
    if (!created) waiting = "another rank was creating the group segment";
    return created;
  }
  const GroupSegment::Survey survey = existing->survey();
  if (survey.live == 0) {
    // A dead job's leftover (or one whose last member is leaving): replace it.
    if (!existing->unlink_if_unused()) {
      waiting = "the previous group segment was being removed";
      next = Attempt::kRetryLater;
    }
    return nullptr;
  }
  TENSORXFER_CHECK(InvalidArgument, existing->world_size() == world_size, "LocalGroup::join(", quoted(name),
                   "): a live group of this name has world_size ", existing->world_size(),
                   ", but this rank asked for world_size ", world_size);
  if (!survey.dead.empty() || !survey.left.empty()) {
    waiting = "members of a previous job are still attached (";
    if (!survey.dead.empty()) waiting += "exited: " + ranks_text(survey.dead);
    if (!survey.left.empty()) waiting += std::string(survey.dead.empty() ? "" : "; ") + "closed: " +
                                         ranks_text(survey.left);
    waiting += ") and have not closed the group yet";
    next = Attempt::kRetryLater;
    return nullptr;
  }
  const auto refuse_taken = [&] {
    throw InvalidArgument("LocalGroup::join(" + quoted(name) + "): rank " + std::to_string(rank) +
                          " is already taken by a live process (" + existing->describe_member(rank) + ")");
  };
  if (existing->claim_of(rank).state != MemberState::kFree) refuse_taken();
  switch (existing->try_claim(rank)) {
    case GroupSegment::ClaimResult::kTakenByLiveProcess: refuse_taken(); break;
    case GroupSegment::ClaimResult::kRetry: return nullptr;
    case GroupSegment::ClaimResult::kClaimed: break;
  }
  if (existing->condemned()) {
    existing->withdraw_claim(rank);
    waiting = "the previous group segment was being removed";
    next = Attempt::kRetryLater;
    return nullptr;
  }
  existing->complete_join(rank);
  return existing;
}

}  // namespace


LocalGroup::LocalGroup(std::unique_ptr<GroupSegment> segment, std::string name, int rank, int world_size)
    : segment_(std::move(segment)),
      spin_(std::make_unique<sync::SpinPolicy>(sync::SpinPolicy::standard(world_size))),
      name_(std::move(name)),
      rank_(rank),
      world_size_(world_size) {}

LocalGroup::LocalGroup(LocalGroup&&) noexcept = default;

LocalGroup& LocalGroup::operator=(LocalGroup&& other) noexcept {
  if (this != &other) {
    close();
    segment_ = std::move(other.segment_);
    spin_ = std::move(other.spin_);
    name_ = std::move(other.name_);
    rank_ = other.rank_;
    world_size_ = other.world_size_;
    barrier_epoch_ = other.barrier_epoch_;
    gather_rounds_ = other.gather_rounds_;
    users_ = std::move(other.users_);
    closing_ = std::move(other.closing_);
    busy_ = std::move(other.busy_);
  }
  return *this;
}

LocalGroup::~LocalGroup() { close(); }

std::unique_ptr<LocalGroup> LocalGroup::join(const std::string& name, int rank, int world_size,
                                             std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  TENSORXFER_CHECK(InvalidArgument, !name.empty() && name.size() <= kMaxNameBytes,
                   "LocalGroup::join: name must be 1..", kMaxNameBytes, " bytes, got ", name.size());
  TENSORXFER_CHECK(InvalidArgument, name.find('\0') == std::string::npos,
                   "LocalGroup::join: name must not contain NUL characters");
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1 && world_size <= kMaxWorldSize,
                   "LocalGroup::join: world_size must be in 1..", kMaxWorldSize, ", got ", world_size);
  TENSORXFER_CHECK(InvalidArgument, rank >= 0 && rank < world_size, "LocalGroup::join: rank must be in 0..",
                   world_size - 1, " (world_size ", world_size, "), got ", rank);
  const auto deadline = deadline_after("LocalGroup::join", timeout);

  std::unique_ptr<GroupSegment> segment;
  std::string waiting = "the group segment could not be entered";
  auto last_hook = sync::WaitClock::now();
  for (int attempt = 0;; ++attempt) {
    Attempt next = Attempt::kRetryNow;
    segment = try_enter(name, rank, world_size, next, waiting);
    if (segment) break;
    const auto now = sync::WaitClock::now();
    if (hook && now - last_hook >= sync::kWatchSlice) {
      hook();
      last_hook = now;
    }
    if (now >= deadline) {
      throw Timeout("LocalGroup::join(" + quoted(name) + "): could not enter the group within " +
                    seconds_text(timeout) + ": " + waiting);
    }
    // Progress was made (a segment created or removed): retry at once, but
    // never spin hot on a state that does not change.
    if (next == Attempt::kRetryLater || attempt > 16) std::this_thread::sleep_for(kRetryPause);
  }
  std::unique_ptr<LocalGroup> group(new LocalGroup(std::move(segment), name, rank, world_size));
  try {
    group->await_all_joined(timeout, deadline, hook);
  } catch (...) {
    group->close();
    throw;
  }
  return group;
}

int LocalGroup::rank() const noexcept { return rank_; }
int LocalGroup::world_size() const noexcept { return world_size_; }
const std::string& LocalGroup::name() const noexcept { return name_; }
bool LocalGroup::closed() const noexcept { return segment_ == nullptr; }

template <typename Settled>
void LocalGroup::watch_peers(Settled& settled, const sync::WaitHook& hook) const {
  TENSORXFER_CHECK(Closed, !closing_->load(std::memory_order_seq_cst), "LocalGroup ", quoted(name_),
                   " is closed (close() ran on another thread during the wait)");
  if (hook) hook();
  try {
    check_peers();
  } catch (const PeerLost&) {
    // A peer may finish its part and close (or exit) right after: what it
    // published before leaving is visible now, so the wait may be over.
    if (!settled()) throw;
  }
}

void LocalGroup::await_all_joined(std::chrono::nanoseconds timeout, sync::WaitTime deadline,
                                  const sync::WaitHook& hook) {
  GroupControl& control = segment_->control();
  auto all_joined = [&] {
    // acquire: pairs with each joiner's acq_rel increment (their claims are visible).
    const uint32_t joined = control.joined_count.load(std::memory_order_acquire);
    TENSORXFER_CHECK(CorruptSegment, joined <= static_cast<uint32_t>(world_size_), segment_->path(),
                     ": joined_count ", joined, " exceeds world_size ", world_size_);
    return joined == static_cast<uint32_t>(world_size_);
  };
  // A rank that exits during the rendezvous is reported at once; one that
  // closed (its own join timed out first) is not: the timeout below names the
  // ranks that never came, which is the cause.
  const auto status = control.membership.await(all_joined, deadline, *spin_, [&] {
    if (hook) hook();
    check_exited_peers();
  });
  if (status == sync::WaitStatus::kReady) return;
  std::vector<int> missing;
  for (int peer = 0; peer < world_size_; ++peer) {
    const Claim claim = segment_->claim_of(peer);
    if (claim.state == MemberState::kFree || claim.state == MemberState::kClaimed) missing.push_back(peer);
  }
  throw Timeout("LocalGroup::join(" + quoted(name_) + "): " + ranks_text(missing) + " of world_size " +
                std::to_string(world_size_) + " did not join within " + seconds_text(timeout));
}

void LocalGroup::await_epoch(uint64_t target, const char* operation, std::chrono::nanoseconds timeout,
                             sync::WaitTime deadline, const sync::WaitHook& hook) {
  int first_pending = 0;  // ranks before it are known to have arrived
  auto all_arrived = [&] {
    for (; first_pending < world_size_; ++first_pending) {
      // acquire: pairs with that rank's release store; its mailbox writes are visible after.
      const uint64_t epoch = segment_->slot(first_pending).barrier_epoch.load(std::memory_order_acquire);
      // A peer can be at most one barrier ahead: it cannot pass `target` before we arrive.
      TENSORXFER_CHECK(CorruptSegment, epoch <= target + 1, segment_->path(), ": rank ", first_pending,
                       " is at barrier epoch ", epoch, ", expected at most ", target + 1);
      if (epoch < target) return false;
    }
    return true;
  };
  const auto status =
      segment_->control().arrivals.await(all_arrived, deadline, *spin_, [&] { watch_peers(all_arrived, hook); });
  if (status == sync::WaitStatus::kReady) return;
  std::vector<int> missing;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (segment_->slot(peer).barrier_epoch.load(std::memory_order_acquire) < target) missing.push_back(peer);
  }
  throw Timeout("LocalGroup::" + std::string(operation) + "(" + quoted(name_) + "): " + ranks_text(missing) +
                " did not arrive within " + seconds_text(timeout));
}

void LocalGroup::barrier(std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  const Operation operation(*this, "barrier");
  const auto deadline = deadline_after("LocalGroup::barrier", timeout);
  const uint64_t target = ++barrier_epoch_;
  // release: everything this rank wrote before the barrier is visible to the
  // peers that see the new epoch.
  segment_->slot(rank_).barrier_epoch.store(target, std::memory_order_release);
  segment_->control().arrivals.notify_all();
  await_epoch(target, "barrier", timeout, deadline, hook);
}

std::vector<std::string> LocalGroup::all_gather_bytes(std::string_view mine, std::chrono::nanoseconds timeout,
                                                      const sync::WaitHook& hook, uint64_t max_nbytes) {
  Operation operation(*this, "all_gather_bytes");
  TENSORXFER_CHECK(InvalidArgument, mine.size() <= kMaxGatherBytes, "LocalGroup::all_gather_bytes: at most ",
                   kMaxGatherBytes, " bytes per rank, got ", mine.size());
  // A larger own contribution is still announced, so that every rank (with
  // the same max_nbytes) refuses it below, together.
  const auto deadline = deadline_after("LocalGroup::all_gather_bytes", timeout);
  const uint64_t chunk = segment_->mailbox_nbytes();
  std::vector<std::string> gathered(static_cast<std::size_t>(world_size_));
  std::vector<uint64_t> totals(static_cast<std::size_t>(world_size_), 0);
  uint64_t rounds = 1;
  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t round = gather_rounds_ + k;
    const int which = static_cast<int>(round % kMailboxBuffersPerRank);
    // Our buffer `which` was last read in round - 2, which every peer finished
    // before arriving at the barrier of round - 1 that we passed.
    MailboxHeader& own = segment_->mailbox_header(rank_, which);
    own.total_nbytes = mine.size();
    own.round = round;
    const uint64_t offset = k * chunk;
    if (offset < mine.size()) {
      std::memcpy(segment_->mailbox_data(rank_, which), mine.data() + offset,
                  static_cast<std::size_t>(std::min<uint64_t>(chunk, mine.size() - offset)));
    }
    const uint64_t target = ++barrier_epoch_;
    // release: our mailbox writes above are visible to peers that see the epoch.
    segment_->slot(rank_).barrier_epoch.store(target, std::memory_order_release);
    segment_->control().arrivals.notify_all();
    await_epoch(target, "all_gather_bytes", timeout, deadline, hook);

    for (int peer = 0; peer < world_size_; ++peer) {
      const MailboxHeader& theirs = segment_->mailbox_header(peer, which);
      const uint64_t total = theirs.total_nbytes;
      TENSORXFER_CHECK(CorruptSegment, theirs.round == round, segment_->path(), ": rank ", peer,
                       "'s mailbox holds gather round ", theirs.round, ", expected ", round);
      TENSORXFER_CHECK(CorruptSegment, total <= kMaxGatherBytes && (k == 0 || total == totals[peer]),
                       segment_->path(), ": rank ", peer, "'s mailbox announces ", total, " bytes",
                       (k == 0 ? "" : ", changed during the gather"));
      if (k == 0) {
        if (total > max_nbytes) {
          // Before allocating anything for it; every rank (with the same
          // max_nbytes) refuses the same contribution after the same round.
          gather_rounds_ += 1;
          operation.fail_consistently();
          throw InvalidArgument(detail::concat("LocalGroup::all_gather_bytes(", quoted(name_), "): rank ", peer,
                                               " contributes ", total, " bytes, more than max_nbytes ", max_nbytes));
        }
        totals[peer] = total;
        gathered[peer].resize(static_cast<std::size_t>(total));
        rounds = std::max(rounds, (total + chunk - 1) / chunk);
      }
      if (offset < total) {
        std::memcpy(gathered[peer].data() + offset, segment_->mailbox_data(peer, which),
                    static_cast<std::size_t>(std::min<uint64_t>(chunk, total - offset)));
      }
    }
  }
  gather_rounds_ += rounds;
  return gathered;
}

}  // namespace tensorxfer::group
