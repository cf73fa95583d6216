// The shared-memory layout of a LocalGroup segment, and its validation.
//
//   offset 0                 GroupHeader   immutable after creation, checksummed
//   kControlOffset           GroupControl  two 64-byte lines
//   kSlotsOffset             RankSlot[world_size]           128 bytes each
//   mailbox_offset(ws)       Mailbox[world_size][2]         kMailboxHeaderBytes + mailbox_nbytes each
//
// Every word says who writes it and who reads it. Nothing here holds a
// pointer; every value read from the segment is validated before use
// (validate_group_header, decode_claim) and a bad one is CorruptSegment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::group {

inline constexpr uint64_t kGroupMagic = 0x3150554F52475858ull;  // "XXGROUP1" little-endian
inline constexpr uint32_t kGroupLayoutVersion = 1;
inline constexpr std::size_t kGroupNameCapacity = 200;  // == LocalGroup::kMaxNameBytes
inline constexpr int kGroupMaxWorldSize = 1024;         // == LocalGroup::kMaxWorldSize
inline constexpr uint64_t kGroupMaxMailboxBytes = 1ull << 30;

struct GroupHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t world_size;           // 1..kGroupMaxWorldSize
  uint64_t total_nbytes;         // == file size == group_segment_nbytes(world_size, mailbox_nbytes)
  uint64_t mailbox_nbytes;       // data bytes of one mailbox buffer
  uint32_t name_nbytes;          // 1..kGroupNameCapacity
  uint32_t reserved;             // 0
  char name[kGroupNameCapacity]; // the group name, zero padded (guards against segment-name hash collisions)
  uint64_t checksum;             // FNV-1a over every byte before it
};
static_assert(std::is_trivially_copyable_v<GroupHeader> && std::is_standard_layout_v<GroupHeader>);
static_assert(sizeof(GroupHeader) == 248, "no padding: every byte is part of the layout");

// Segment-wide state. Line 1 changes on membership events, line 2 on every barrier arrival.
struct alignas(64) GroupControl {
  // kGroupOpen (0) or kGroupCondemned. Written: only by the holder of the
  // condemner liveness lock (participant kCondemnerParticipant), seq_cst, see
  // group_segment.h. Read: joiners after claiming a slot (seq_cst).
  sync::SharedWord32 state;
  // Ranks that finished joining; only grows. Written: each joiner once
  // (acq_rel fetch_add). Read: join's wait for all ranks (acquire).
  sync::SharedWord32 joined_count;
  // Notified after every join and leave; join waits on it.
  sync::EventCount membership;
  uint8_t pad_membership[48];
  // Notified after every barrier arrival; barrier waits on it.
  sync::EventCount arrivals;
  uint8_t pad_arrivals[56];
};
static_assert(std::is_trivially_copyable_v<GroupControl> && sizeof(GroupControl) == 128);
inline constexpr uint32_t kGroupOpen = 0;
inline constexpr uint32_t kGroupCondemned = 1;

// Liveness (sync/liveness_lock.h) on the segment file: rank r holds
// participant r while a member; whoever removes the segment holds this one.
inline constexpr uint32_t kCondemnerParticipant = static_cast<uint32_t>(kGroupMaxWorldSize);

// One rank's place. Line 1 is written only by that rank's process (claim,
// join, leave) and read by everyone; line 2 likewise for the barrier epoch.
struct alignas(64) RankSlot {
  // 0 = free; else (MemberState << 32) | pid (the pid for messages only:
  // liveness is the rank's lock). Written: compare-exchange 0 -> kClaimed
  // (seq_cst, with the rank's liveness lock already held), then kJoined
  // (release), then kLeft (seq_cst), or back to 0 when a claim is withdrawn.
  // Read: everyone (acquire / seq_cst).
  sync::SharedWord64 claim;
  uint8_t pad_claim[56];
  // Barriers this rank has entered; only grows by 1 per barrier, never wraps.
  // Written: the rank (release, after its mailbox writes). Read: every
  // waiter (acquire, before reading that rank's mailbox).
  sync::SharedWord64 barrier_epoch;
  // 1 once the rank gave up a collective (its wait failed or was
  // interrupted): peers waiting on it stop with PeerLost instead of waiting
  // for a rank that will not come. Written: the rank (release). Read: every
  // waiter's liveness check (acquire). Zero in a fresh segment.
  sync::SharedWord32 gave_up;
  uint8_t pad_epoch[52];
};
static_assert(std::is_trivially_copyable_v<RankSlot> && sizeof(RankSlot) == 128);

enum class MemberState : uint32_t { kFree = 0, kClaimed = 1, kJoined = 2, kLeft = 3 };

struct Claim {
  MemberState state = MemberState::kFree;
  int32_t pid = 0;  // > 0 unless kFree
};
uint64_t encode_claim(MemberState state, int32_t pid) noexcept;
// Throws CorruptSegment naming `context` and the rank for an unknown state or a bad pid.
Claim decode_claim(uint64_t word, int rank, const std::string& context);

// The header of one mailbox buffer. Written by its rank between barriers
// (plain stores, published by its barrier_epoch release); read by everyone
// after that barrier.
struct alignas(64) MailboxHeader {
  uint64_t total_nbytes;  // the whole contribution of this all_gather, not just this round
  uint64_t round;         // the gather round this buffer holds (validated by readers)
  uint8_t pad[48];
};
static_assert(std::is_trivially_copyable_v<MailboxHeader> && sizeof(MailboxHeader) == 64);

inline constexpr std::size_t kControlOffset = 256;
inline constexpr std::size_t kSlotsOffset = kControlOffset + sizeof(GroupControl);
inline constexpr std::size_t kMailboxHeaderBytes = sizeof(MailboxHeader);
inline constexpr int kMailboxBuffersPerRank = 2;  // double buffering: one barrier per round
static_assert(sizeof(GroupHeader) <= kControlOffset && kControlOffset % 64 == 0);

std::size_t mailbox_offset(int world_size) noexcept;
// Offset of rank's buffer `which` (0 or 1).
std::size_t mailbox_buffer_offset(int world_size, uint64_t mailbox_nbytes, int rank, int which) noexcept;
std::size_t group_segment_nbytes(int world_size, uint64_t mailbox_nbytes) noexcept;

uint64_t group_header_checksum(const GroupHeader& header) noexcept;

// Fills a header for a new segment (checksum included).
GroupHeader make_group_header(const std::string& group_name, int world_size, uint64_t mailbox_nbytes);

// Validates a header read from a file of `file_nbytes` bytes: magic, version,
// checksum, world_size, mailbox size, total size against the file, name.
// Throws CorruptSegment naming `context`, the field, expected vs got.
void validate_group_header(const GroupHeader& header, std::size_t file_nbytes, const std::string& context);

// The segment name of a group: "/tensorxfer-group-<up to 40 safe chars of the name>-<16 hex of its hash>".
std::string group_segment_name(const std::string& group_name);

}  // namespace tensorxfer::group
