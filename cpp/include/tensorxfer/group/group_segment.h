// GroupSegment: one process's mapping of a group segment (group_layout.h) and
// the membership protocol on it: claiming a rank, joining, leaving, and
// removing the segment exactly once when nobody live uses it.
//
// Publication: a new segment is built complete in an unnamed file (O_TMPFILE
// in /dev/shm, or a private temporary name where that is unsupported), its
// creator already joined, then linked under the group's name; link() fails if
// the name exists, so the name only ever shows a complete, valid segment with
// at least one member.
//
// Liveness: rank r holds the liveness lock of participant r on the segment
// file (sync/liveness_lock.h) from before it claims its slot until it leaves;
// the kernel drops it when the process dies, whatever its PID namespace. A
// claimed or joined slot whose lock is not held belongs to an exited process.
//
// Removal: only the holder of the condemner lock (kCondemnerParticipant) sets
// GroupControl::state to kCondemned, and unlinks only after re-checking that
// no member is live and that the name still refers to this file; a joiner
// claims its slot first and then checks the state (both seq_cst), so either
// the condemner sees the claim (and reopens the segment) or the joiner sees
// kCondemned (and withdraws). Only this file's condemners unlink its name, one
// at a time, so the name is never removed once it names a newer segment.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorxfer/common/fd.h"
#include "tensorxfer/group/group_layout.h"
#include "tensorxfer/sync/liveness_lock.h"

namespace tensorxfer::group {

class GroupSegment {
 public:
  // The segment published under `group_name`, or nullptr when there is none.
  // Throws InvalidArgument when it belongs to another user, is readable or
  // writable by others, or holds another group (a name-hash collision);
  // CorruptSegment when it is truncated or its header fails validation.
  static std::unique_ptr<GroupSegment> open_existing(const std::string& group_name);

  // Builds a segment for `world_size` ranks with `rank` joined by the calling
  // process and publishes it; nullptr when the name was taken first. Runs
  // sweep_dead_groups() first.
  static std::unique_ptr<GroupSegment> create_with_member(const std::string& group_name, int world_size, int rank,
                                                          uint64_t mailbox_nbytes);

  // Removes this user's group segments that no live member uses (every member
  // exited or closed), with the same protocol as a leaver; leaves alone what it
  // cannot validate. Returns how many it removed. Never throws.
  static std::size_t sweep_dead_groups() noexcept;

  GroupSegment(const GroupSegment&) = delete;
  GroupSegment& operator=(const GroupSegment&) = delete;
  ~GroupSegment();  // unmaps; membership is the caller's business

  // "/dev/shm/tensorxfer-group-...".
  const std::string& path() const noexcept { return path_; }
  int world_size() const noexcept { return world_size_; }
  uint64_t mailbox_nbytes() const noexcept { return mailbox_nbytes_; }
  // The process that mapped this object (a fork()ed child is another process).
  pid_t mapped_by() const noexcept { return mapped_by_; }

  GroupControl& control() const noexcept;
  RankSlot& slot(int rank) const noexcept;
  MailboxHeader& mailbox_header(int rank, int which) const noexcept;
  std::byte* mailbox_data(int rank, int which) const noexcept;

  // The validated claim of `rank` (acquire). Throws CorruptSegment.
  Claim claim_of(int rank) const;

  enum class MemberStatus { kFree, kAlive, kExited, kLeft };
  // Where `rank` stands now. kExited: claimed or joined, but its liveness lock
  // is free (the process died). Throws CorruptSegment, or SystemError when the
  // kernel cannot answer (an unknown is never reported as kExited).
  MemberStatus status_of(int rank) const;
  // "rank 2 (pid 1234)".
  std::string describe_member(int rank) const;

  struct Survey {
    int live = 0;
    std::vector<int> dead;  // claimed or joined, process gone
    std::vector<int> left;  // closed the group
    std::vector<int> free;  // never claimed
  };
  Survey survey() const;

  // Membership of the calling process (see the protocol above).
  enum class ClaimResult { kClaimed, kTakenByLiveProcess, kRetry };
  [[nodiscard]] ClaimResult try_claim(int rank);
  bool condemned() const noexcept;
  void withdraw_claim(int rank) noexcept;
  void complete_join(int rank);
  // Marks the rank gone, then drops its liveness lock.
  void mark_left(int rank) noexcept;
  // Unlinks the name when no member is live and nobody else is condemning;
  // true when this call unlinked it. Never throws.
  bool unlink_if_unused() noexcept;

 private:
  // open_existing for a path; `group_name` (when not null) must match the header's.
  static std::unique_ptr<GroupSegment> open_path(const std::string& path, const std::string* group_name,
                                                 const std::string& context);
  GroupSegment(std::string path, FileDescriptor fd, std::byte* base, std::size_t nbytes, int world_size,
               uint64_t mailbox_nbytes);
  // True while the name at path_ refers to this segment's file.
  bool name_refers_to_this_file() const noexcept;

  std::string path_;
  FileDescriptor fd_;  // kept open: liveness locks are asked through it
  std::byte* base_;
  std::size_t nbytes_;
  int world_size_;
  uint64_t mailbox_nbytes_;
  pid_t mapped_by_;
  sync::LivenessLock member_lock_;  // this process's rank, while it is a member
};

}  // namespace tensorxfer::group
