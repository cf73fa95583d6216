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
// Unlinking (so /dev/shm holds nothing afterwards):
//  * the creator unlinks when its object detaches, in the creating process only
//    (a fork()ed child's copy never unlinks);
//  * any user that detaches and finds the attach count at zero, or the creator
//    dead, unlinks;
//  * create() first sweeps /dev/shm for tensorxfer segments whose creator is dead.
// Unlinking only removes the name: processes that still map the segment keep
// using it until they unmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tensorxfer/sync/peer_liveness.h"
#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::memory {

inline constexpr uint64_t kSegmentMagic = 0x544E454D47455358ull;  // "XSEGMENT" little-endian
inline constexpr uint32_t kSegmentLayoutVersion = 1;
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
  sync::ProcessIdentity owner;
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
  // PeerLost when its creator has exited (the segment is then unlinked).
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
  // Validated copy taken at create/attach.
  const sync::ProcessIdentity& owner() const noexcept { return owner_; }
  // True in the process that created the segment (false in a fork()ed child).
  bool is_creator() const noexcept;
  bool owner_alive() const noexcept;
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

  std::string name_;
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
// creator has exited. Leaves alone anything it cannot validate, anything of a
// live process and anything owned by another user. Returns how many it removed.
std::size_t sweep_stale_segments() noexcept;

}  // namespace tensorxfer::memory
