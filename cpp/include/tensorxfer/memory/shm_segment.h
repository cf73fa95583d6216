// RAII POSIX shared-memory segments with a validated header.
//
// Layout: a SegmentHeader at offset 0 (one page reserved), the payload at
// offset kSegmentHeaderBytes (page-aligned). The header holds no pointers; its
// immutable fields are covered by a checksum and validated on attach before
// anything else in the segment is trusted.
//
// Naming and permissions: "/tensorxfer-<pid>-<32 hex digits from getrandom>",
// created with O_CREAT|O_EXCL, mode 0600.
//
// Liveness (sync/liveness_lock.h): the creator holds participant 0's liveness
// lock on the segment's file from before the header is valid until it detaches
// (or dies). "The creator is gone" is read from that lock, never from its pid,
// so it holds across PID namespaces (containers sharing /dev/shm). Layers
// above register their own participants (1, 2, ...) in the same file with
// try_hold_liveness() / participant_alive(). The pid+start time in the header
// (owner) is kept for messages only.
//
// Unlinking (so /dev/shm holds nothing afterwards):
//  * the creator unlinks when its object detaches, in the creating process only
//    (a fork()ed child's copy never unlinks);
//  * any user that detaches and finds the attach count at zero, or the creator
//    gone, unlinks;
//  * create() first sweeps /dev/shm for tensorxfer segments whose creator is gone.
// Unlinking only removes the name: processes that still map the segment keep
// using it until they unmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <optional>

#include "tensorxfer/sync/liveness_lock.h"
#include "tensorxfer/sync/peer_liveness.h"
#include "tensorxfer/sync/process_local_fd.h"
#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::memory {

inline constexpr uint64_t kSegmentMagic = 0x544E454D47455358ull;  // "XSEGMENT" little-endian
// 2: the creator's liveness is a lock on participant 0 (version 1 used its pid).
inline constexpr uint32_t kSegmentLayoutVersion = 2;
// The liveness participant number the creator holds; layers above use 1 and up.
inline constexpr uint32_t kSegmentCreatorParticipant = 0;
inline constexpr std::size_t kSegmentHeaderBytes = 4096;
inline constexpr const char* kSegmentNamePrefix = "tensorxfer-";

// A four-character tag naming what a segment holds ("RING", "ARRY").
constexpr uint32_t make_kind_tag(const char (&text)[5]) {
  return static_cast<uint32_t>(static_cast<unsigned char>(text[0])) |
         static_cast<uint32_t>(static_cast<unsigned char>(text[1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(text[2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(text[3])) << 24;
}
// "RING", or "0x12345678" when the tag is not printable.
std::string kind_tag_name(uint32_t tag);

struct SegmentHeader {
  // Immutable after create; covered by immutable_checksum.
  uint64_t magic;
  uint32_t layout_version;
  uint32_t kind_tag;
  uint64_t header_nbytes;
  uint64_t payload_nbytes;
  uint64_t total_nbytes;  // header_nbytes + payload_nbytes == file size
  sync::ProcessIdentity owner;  // diagnostics only: liveness is the creator's lock
  uint64_t immutable_checksum;  // FNV-1a over the bytes before it
  // Mutable.
  sync::SharedWord32 attach_count;  // live attachments, creator included
  uint32_t reserved;
};
static_assert(std::is_trivially_copyable_v<SegmentHeader>);
static_assert(std::is_standard_layout_v<SegmentHeader>);
static_assert(sizeof(SegmentHeader) == 72, "no padding: every byte is part of the layout");
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderBytes);

// The checksum create() stores and attach() verifies.
uint64_t segment_header_checksum(const SegmentHeader& header) noexcept;

// Validates a header read from a segment of `file_nbytes` bytes. Throws
// CorruptSegment naming `context`, the field, what was expected and what was got.
// expected_kind == 0 accepts any kind.
void validate_segment_header(const SegmentHeader& header, std::size_t file_nbytes,
                             uint32_t expected_kind, const std::string& context);

class ShmSegment {
 public:
  // Creates a segment with `payload_nbytes` zeroed payload bytes (0 allowed).
  // Runs sweep_stale_segments() first. Throws SystemError (e.g. ENOSPC when
  // /dev/shm is full: the memory is reserved up front, so later writes cannot SIGBUS).
  static ShmSegment create(std::size_t payload_nbytes, uint32_t kind_tag);

  // Maps an existing segment by name (with or without the leading '/').
  // Throws InvalidArgument for a name that is not a tensorxfer segment name,
  // SystemError (ENOENT) when it does not exist or is being removed,
  // CorruptSegment when size or header fail validation or the kind differs,
  // PeerLost when its creator is gone (no longer holds its liveness lock; the
  // segment is then unlinked).
  static ShmSegment attach(const std::string& name, uint32_t expected_kind);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // detach(), then unmap.
  ~ShmSegment();

  // "/tensorxfer-..." (with the leading slash).
  const std::string& name() const noexcept { return name_; }
  std::byte* payload() const noexcept { return base_ == nullptr ? nullptr : base_ + kSegmentHeaderBytes; }
  std::size_t payload_nbytes() const noexcept { return payload_nbytes_; }
  uint32_t kind_tag() const noexcept { return kind_tag_; }
  // Validated copy taken at create/attach (diagnostics: the pid is the one the
  // creator saw in its own PID namespace).
  const sync::ProcessIdentity& owner() const noexcept { return owner_; }
  // True in the process that created the segment (false in a fork()ed child).
  bool is_creator() const noexcept;
  // True while the creator holds its liveness lock (it has neither detached nor
  // died), in whatever PID namespace it runs. Also true when it cannot be told
  // (in a fork()ed child's copy, or if the kernel refuses to answer): an
  // unknown is never reported as gone.
  bool owner_alive() const noexcept;

  // Liveness of the participants a layer above registers in this segment's
  // file (participant >= 1; 0 is the creator). try_hold_liveness takes
  // participant `participant`'s lock, or returns nullopt while another holder
  // (any process, or another object of this one) has it. participant_alive
  // says whether anyone holds it now. Both throw InvalidArgument for
  // participant 0 or in a fork()ed child's copy, SystemError from the kernel.
  // See sync/liveness_lock.h for the contract.
  [[nodiscard]] std::optional<sync::LivenessLock> try_hold_liveness(uint32_t participant) const;
  [[nodiscard]] bool participant_alive(uint32_t participant) const;
  bool is_mapped() const noexcept { return base_ != nullptr; }
  bool is_detached() const noexcept { return detached_; }
  // Current attach count (diagnostics and tests).
  uint32_t attach_count() const noexcept;

  // Drops this attachment: decrements the attach count and unlinks by the rules
  // above. The mapping stays valid until destruction, so views into the payload
  // never dangle. Idempotent; does nothing in a process other than the one that
  // created or attached this object (a fork()ed child). Never throws.
  void detach() noexcept;
  // Removes the name now (ENOENT ignored). Idempotent; never throws.
  void unlink() noexcept;

 private:
  ShmSegment() = default;
  void release_mapping() noexcept;
  int liveness_fd(const char* operation, uint32_t participant) const;

  std::string name_;
  sync::ProcessLocalFd file_;          // the segment's file; no lock is taken through it
  sync::LivenessLock creator_lock_;    // held by the creator until it detaches
  std::byte* base_ = nullptr;
  std::size_t mapped_nbytes_ = 0;
  std::size_t payload_nbytes_ = 0;
  uint32_t kind_tag_ = 0;
  sync::ProcessIdentity owner_;
  int32_t user_pid_ = 0;  // the process that created/attached this object
  bool created_ = false;
  bool detached_ = true;
  bool unlinked_ = false;
};

// Removes /dev/shm/tensorxfer-* segments whose header is valid and whose
// creator no longer holds its liveness lock. Leaves alone anything it cannot
// validate (other layout versions included), anything whose creator holds its
// lock (in any PID namespace), anything whose liveness the kernel will not
// report, and anything owned by another user. Returns how many it removed.
std::size_t sweep_stale_segments() noexcept;

}  // namespace tensorxfer::memory
