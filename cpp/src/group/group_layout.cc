#include "tensorxfer/group/group_layout.h"

#include <cstring>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::group {
namespace {

constexpr std::size_t kChecksummedBytes = offsetof(GroupHeader, checksum);

uint64_t fnv1a(const unsigned char* bytes, std::size_t count, uint64_t hash = 0xcbf29ce484222325ull) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::size_t round_up_64(std::size_t value) noexcept { return (value + 63) / 64 * 64; }

}  // namespace

uint64_t encode_claim(MemberState state, int32_t pid) noexcept {
  return (static_cast<uint64_t>(state) << 32) | static_cast<uint32_t>(pid);
}

Claim decode_claim(uint64_t word, int rank, const std::string& context) {
  const auto state = static_cast<uint32_t>(word >> 32);
  const auto pid = static_cast<uint32_t>(word & 0xFFFFFFFFu);
  TENSORXFER_CHECK(CorruptSegment, state <= static_cast<uint32_t>(MemberState::kLeft), context, ": rank ", rank,
                   " has member state ", state, ", expected 0..3");
  if (state == 0) {
    TENSORXFER_CHECK(CorruptSegment, pid == 0, context, ": free rank ", rank, " names pid ", pid);
    return {};
  }
  TENSORXFER_CHECK(CorruptSegment, pid > 0 && pid <= 0x7FFFFFFFu, context, ": rank ", rank, " names pid ", pid,
                   ", expected 1..2^31-1");
  return {static_cast<MemberState>(state), static_cast<int32_t>(pid)};
}

std::size_t mailbox_offset(int world_size) noexcept {
  return kSlotsOffset + static_cast<std::size_t>(world_size) * sizeof(RankSlot);
}

std::size_t mailbox_buffer_offset(int world_size, uint64_t mailbox_nbytes, int rank, int which) noexcept {
  const std::size_t buffer_nbytes = kMailboxHeaderBytes + round_up_64(mailbox_nbytes);
  return mailbox_offset(world_size) +
         (static_cast<std::size_t>(rank) * kMailboxBuffersPerRank + static_cast<std::size_t>(which)) * buffer_nbytes;
}

std::size_t group_segment_nbytes(int world_size, uint64_t mailbox_nbytes) noexcept {
  return mailbox_buffer_offset(world_size, mailbox_nbytes, world_size, 0);
}

uint64_t group_header_checksum(const GroupHeader& header) noexcept {
  return fnv1a(reinterpret_cast<const unsigned char*>(&header), kChecksummedBytes);
}

GroupHeader make_group_header(const std::string& group_name, int world_size, uint64_t mailbox_nbytes) {
  TENSORXFER_CHECK(InvalidArgument, !group_name.empty() && group_name.size() <= kGroupNameCapacity,
                   "group name must be 1..", kGroupNameCapacity, " bytes, got ", group_name.size());
  GroupHeader header;
  std::memset(&header, 0, sizeof(header));
  header.magic = kGroupMagic;
  header.layout_version = kGroupLayoutVersion;
  header.world_size = static_cast<uint32_t>(world_size);
  header.mailbox_nbytes = mailbox_nbytes;
  header.total_nbytes = group_segment_nbytes(world_size, mailbox_nbytes);
  header.name_nbytes = static_cast<uint32_t>(group_name.size());
  std::memcpy(header.name, group_name.data(), group_name.size());
  header.checksum = group_header_checksum(header);
  return header;
}

void validate_group_header(const GroupHeader& header, std::size_t file_nbytes, const std::string& context) {
  const char* what = context.c_str();
  TENSORXFER_CHECK(CorruptSegment, header.magic == kGroupMagic, context, ": not a tensorxfer group segment (magic 0x",
                   std::hex, header.magic, ", expected 0x", kGroupMagic, ")");
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.layout_version, kGroupLayoutVersion);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.checksum, group_header_checksum(header));
  TENSORXFER_CHECK(CorruptSegment, header.world_size >= 1 && header.world_size <= kGroupMaxWorldSize, context,
                   ": world_size ", header.world_size, " is outside 1..", kGroupMaxWorldSize);
  TENSORXFER_CHECK(CorruptSegment, header.mailbox_nbytes >= 1 && header.mailbox_nbytes <= kGroupMaxMailboxBytes,
                   context, ": mailbox_nbytes ", header.mailbox_nbytes, " is outside 1..", kGroupMaxMailboxBytes);
  const std::size_t expected_total = group_segment_nbytes(static_cast<int>(header.world_size), header.mailbox_nbytes);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, static_cast<uint64_t>(expected_total));
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, static_cast<uint64_t>(file_nbytes));
  TENSORXFER_CHECK(CorruptSegment, header.name_nbytes >= 1 && header.name_nbytes <= kGroupNameCapacity, context,
                   ": name_nbytes ", header.name_nbytes, " is outside 1..", kGroupNameCapacity);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.reserved, 0u);
  for (std::size_t i = header.name_nbytes; i < kGroupNameCapacity; ++i) {
    TENSORXFER_CHECK(CorruptSegment, header.name[i] == 0, context, ": name padding byte ", i, " is not zero");
  }
}

std::string group_segment_name(const std::string& group_name) {
  std::string readable;
  for (const char c : group_name) {
    if (readable.size() == 40) break;
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    readable.push_back(safe ? c : '_');
  }
  const uint64_t hash = fnv1a(reinterpret_cast<const unsigned char*>(group_name.data()), group_name.size());
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(16, '0');
  for (int i = 0; i < 16; ++i) hex[15 - i] = kDigits[(hash >> (4 * i)) & 15];
  return "/tensorxfer-group-" + readable + "-" + hex;
}

}  // namespace tensorxfer::group
